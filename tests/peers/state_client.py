"""The 2026-07-28 requestState by hand, through the official Python MCP SDK's
session API (`allow_input_required=True`), to send it back altered, with
another call, expired and twice.

Usage:
  state_client.py URL TOKEN

1. charge_card {account acct_7, amount 5} with key s-1: the gateway answers
   input_required; prints {"state": STATE}.
2. Reads one line from stdin: an expired state for the same call (the test
   signs it with the gateway's key).
3. Sends, each with an accepting answer: STATE with one byte changed; STATE
   with another call (amount 50, key s-2); the expired state; STATE as given;
   STATE again. Prints {"results": [...]}: each result's countersign code,
   or "ran" with its text.
"""

import asyncio
import json
import sys

import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

KEY = "dev.countersign/confirm"


async def main() -> None:
    url, token = sys.argv[1:3]

    async def never(ctx, params):
        raise RuntimeError("this script answers by hand")

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with Client(streamable_http_client(url, http_client=http), mode="auto", elicitation_callback=never) as client:

        async def send(args, key, state=None):
            responses = None
            if state is not None:
                responses = {KEY: types.ElicitResult(action="accept", content={"approve": True})}
            return await client.session.call_tool(
                "charge_card",
                args,
                input_responses=responses,
                request_state=state,
                meta={"dev.countersign/idempotency-key": key},
                allow_input_required=True,
            )

        call = {"account": "acct_7", "amount": 5}
        first = await send(call, "s-1")
        assert isinstance(first, types.InputRequiredResult), first
        state = first.request_state
        print(json.dumps({"protocol_version": client.protocol_version, "state": state}), flush=True)
        expired = sys.stdin.readline().strip()
        i = len(state) // 2
        altered = state[:i] + ("B" if state[i] == "A" else "A") + state[i + 1 :]
        results = []
        for args, key, s in [
            (call, "s-1", altered),
            ({"account": "acct_7", "amount": 50}, "s-2", state),
            (call, "s-1", expired),
            (call, "s-1", state),
            (call, "s-1", state),
        ]:
            r = await send(args, key, s)
            if isinstance(r, types.InputRequiredResult):
                results.append("input_required")
            elif r.is_error:
                results.append((r.structured_content or {}).get("countersign", {}).get("code", "error"))
            else:
                results.append("ran: " + r.content[0].text)
        print(json.dumps({"results": results}), flush=True)


asyncio.run(main())
