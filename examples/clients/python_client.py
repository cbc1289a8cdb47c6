"""A real MCP client in front of countersign: the official Python SDK, version 2
(`pip install 'mcp>=2.3,<3'`: it imports `httpx2` and `from mcp import Client`,
which 1.x does not have).

It sends the gateway's bearer token with the SDK's public API (its HTTP client,
`httpx2.AsyncClient`, given to `streamable_http_client`), lists the tools, reads a
balance and makes one charge with an idempotency key, then sends the same charge
again: the second answer is the first one, replayed, and the card is charged once.

    COUNTERSIGN_TOKEN=dev-token-agent7 python3 examples/clients/python_client.py \
        http://127.0.0.1:7373/mcp/payments

Under the shipped policies the charge waits for a reviewer (`approval_pending`,
with the proposal id); approve it with `countersign approve` and run this again
with the same key (`--key`) to see it run once.
"""

import argparse
import asyncio
import json
import os
import sys
import uuid

import httpx2  # the HTTP client the mcp SDK is built on
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def text(result) -> str:
    return " ".join(c.text for c in result.content if getattr(c, "text", None))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the gateway's endpoint for one server, e.g. http://127.0.0.1:7373/mcp/payments")
    parser.add_argument("--key", default=f"example-{uuid.uuid4()}", help="idempotency key of the charge")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = parser.parse_args()
    token = os.environ.get("COUNTERSIGN_TOKEN")
    if not token:
        raise SystemExit("set COUNTERSIGN_TOKEN to the bearer token the gateway knows you by")

    # The token goes in a header of every request the SDK sends.
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30.0, read=300.0),
    )
    async with Client(streamable_http_client(args.url, http_client=http)) as client:
        tools = await client.list_tools()
        read = await client.call_tool("get_balance", {"account": "acct_42"})
        charge = {"account": "acct_42", "amount": 12.5, "currency": "EUR"}
        # The key travels in _meta, where countersign reads it (and removes it
        # before the server sees the call).
        meta = {"dev.countersign/idempotency-key": args.key}
        # A write may wait for a reviewer for up to the gateway's
        # approvals.hold: say so rather than sit in silence.
        waiting = "charge_card: sent; if it needs an approval, the gateway holds it until a reviewer decides or its hold ends"
        print(waiting, file=sys.stderr, flush=True)
        first = await client.call_tool("charge_card", charge, meta=meta)
        print(
            "charge_card again with the same key: a retry, never a second charge "
            "(if the first still waits for a reviewer, this one waits again, up to approvals.hold)",
            file=sys.stderr,
            flush=True,
        )
        again = await client.call_tool("charge_card", charge, meta=meta)
        protocol = client.protocol_version

    seen = {
        "protocol_version": protocol,
        "tools": sorted(t.name for t in tools.tools),
        "balance": text(read),
        "charge": {"is_error": first.is_error, "text": text(first), "structured": first.structured_content},
        "again": {"is_error": again.is_error, "text": text(again), "meta": again.meta},
    }
    if args.json:
        print(json.dumps(seen))
        return
    print(f"protocol {seen['protocol_version']}; tools: {', '.join(seen['tools'])}")
    print(f"get_balance: {seen['balance']}")
    print(f"charge_card (key {args.key}): {seen['charge']['text']}")
    print(f"the same charge again: {seen['again']['text']}")


asyncio.run(main())
