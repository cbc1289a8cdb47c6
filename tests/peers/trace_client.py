"""The trace tests' MCP client: the Python SDK with OpenTelemetry set up
(`otel_peer`), so each request goes out in a CLIENT span of the SDK's own
whose context it injects into `params._meta`.

    trace_client.py URL TOKEN MODE STEP KEY ACCOUNT

MODE is the SDK's `mode` ("legacy" or "2026-07-28"). STEP is `read`
(`get_balance(ACCOUNT)`) or `write` (`charge_card(ACCOUNT, 12.5)` with
idempotency key KEY). Prints one JSON object: the result's text, `isError`,
its `_meta`, and the trace id of the SDK's CLIENT span.
"""

import asyncio
import json
import sys

import otel_peer

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

URL, TOKEN, MODE, STEP, KEY, ACCOUNT = sys.argv[1:7]
provider = otel_peer.setup("agent")


async def main() -> dict:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
    async with Client(streamable_http_client(URL, http_client=http), mode=MODE) as client:
        if STEP == "read":
            result = await client.call_tool("get_balance", {"account": ACCOUNT})
        else:
            result = await client.call_tool(
                "charge_card",
                {"account": ACCOUNT, "amount": 12.5},
                meta={"dev.countersign/idempotency-key": KEY},
            )
        return {
            "protocol_version": client.protocol_version,
            "is_error": result.is_error,
            "text": result.content[0].text if result.content else None,
            "meta": result.model_dump(by_alias=True, mode="json", exclude_none=True).get("_meta"),
        }


out = asyncio.run(main())
if provider is not None:
    provider.shutdown()
print(json.dumps(out))
