"""One client of the interop matrix: the official Python MCP SDK, through the
gateway, in the wire era MODE, calling what PLAN says.

    matrix_client.py http URL TOKEN MODE PLAN
    matrix_client.py stdio COUNTERSIGN_BIN GATEWAY_URL SERVER TOKEN MODE PLAN

MODE is the SDK's `mode`: "legacy" (initialize handshake) or "2026-07-28"
(that version, pinned: no fall-back). PLAN is JSON:
  {"list": bool, "calls": [{"tool": NAME, "arguments": {...}, "key": KEY?}, ...]}
With "list" false the client never lists tools (the gateway must learn them
itself). Prints one JSON object: the negotiated version, the tool names
listed (or null), and each call's result as the SDK parsed it (by alias, so
`_meta` and `structuredContent` are as on the wire). A result the SDK cannot
parse makes it fail, and the Rust test shows why.
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def exercise(client: Client, plan: dict) -> dict:
    listed = None
    if plan.get("list"):
        tools = await client.list_tools()
        listed = sorted(t.name for t in tools.tools)
    results = []
    for call in plan["calls"]:
        meta = {"dev.countersign/idempotency-key": call["key"]} if call.get("key") else None
        r = await client.call_tool(call["tool"], call.get("arguments") or {}, meta=meta)
        results.append(r.model_dump(by_alias=True, mode="json", exclude_none=True))
    return {"protocol_version": client.protocol_version, "listed": listed, "results": results}


async def main() -> None:
    kind = sys.argv[1]
    if kind == "http":
        url, token, mode, plan = sys.argv[2:6]
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        transport = streamable_http_client(url, http_client=http)
    else:
        bin_, gateway, server, token, mode, plan = sys.argv[2:8]
        transport = StdioServerParameters(
            command=bin_,
            args=["stdio", "--server", server, "--gateway", gateway],
            env={**os.environ, "COUNTERSIGN_TOKEN": token, "COUNTERSIGN_LOG": "warn"},
        )
    async with Client(transport, mode=mode) as client:
        out = await exercise(client, json.loads(plan))
    print(json.dumps(out))


asyncio.run(main())
