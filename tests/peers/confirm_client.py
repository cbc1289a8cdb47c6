"""Approval in the client, driven by the official Python MCP SDK.

Usage:
  confirm_client.py URL TOKEN MODE TOOL KEY ANSWER [GO_FILE]

URL may also be `stdio|COUNTERSIGN_BIN|GATEWAY_URL|SERVER`: the SDK then
spawns the stdio bridge (`countersign stdio`) with TOKEN, as a desktop
client would.

One `TOOL` call (fixed arguments of the example server's charge_card,
refund or close_account) with idempotency key KEY, over Streamable HTTP, in the SDK's
MODE ("legacy": the handshake era, where the gateway sends
elicitation/create; "auto": 2026-07-28, where it answers input_required and
the SDK's own driver retries with the answer).

ANSWER is what the elicitation callback says: "accept" (approve: true),
"decline", or "none" (no callback: the client declares no elicitation).
With GO_FILE, the callback waits until that file exists before answering
(the test lets a reviewer answer first).

Prints one JSON object: the negotiated version, every question the callback
was shown, and the call's result. The Rust test asserts on it.
"""

import asyncio
import json
import os
import sys

import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ARGUMENTS = {
    "charge_card": {"account": "acct_7", "amount": 3},
    "close_account": {"account": "acct_7"},
    "refund": {"charge": "ch_1", "amount": 1},
}


async def main() -> None:
    url, token, mode, tool, key, answer = sys.argv[1:7]
    go_file = sys.argv[7] if len(sys.argv) > 7 else None
    asked = []
    answered = asyncio.Event()

    async def on_elicit(ctx, params):
        asked.append({"message": params.message, "schema": params.requested_schema})
        if go_file:
            while not os.path.exists(go_file):
                await asyncio.sleep(0.05)
        answered.set()
        if answer == "accept":
            return types.ElicitResult(action="accept", content={"approve": True, "reason": "my own agent"})
        return types.ElicitResult(action="decline")

    if url.startswith("stdio|"):
        _, binary, gateway, server = url.split("|")
        transport = StdioServerParameters(
            command=binary,
            args=["stdio", "--server", server, "--gateway", gateway],
            env={**os.environ, "COUNTERSIGN_TOKEN": token, "COUNTERSIGN_LOG": "warn"},
        )
    else:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        transport = streamable_http_client(url, http_client=http)
    callback = None if answer == "none" else on_elicit
    async with Client(transport, mode=mode, elicitation_callback=callback) as client:
        result = await client.call_tool(
            tool,
            ARGUMENTS[tool],
            read_timeout_seconds=60,
            meta={"dev.countersign/idempotency-key": key},
        )
        if go_file and asked:
            # A late answer is still sent: wait for the callback, then make
            # one more request so that its response has gone out.
            await answered.wait()
            await client.list_tools()
        out = {
            "protocol_version": client.protocol_version,
            "asked": asked,
            "is_error": result.is_error,
            "text": result.content[0].text,
            "structured": result.structured_content,
        }
    print(json.dumps(out))


asyncio.run(main())
