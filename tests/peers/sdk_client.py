"""Drive countersign with the official Python MCP SDK (a client no one here wrote).

Usage:
  sdk_client.py http URL TOKEN MODE
  sdk_client.py https URL TOKEN MODE CA_FILE
    (the gateway's listener speaks TLS; its certificate must chain to CA_FILE)
  sdk_client.py stdio COUNTERSIGN_BIN GATEWAY_URL SERVER TOKEN MODE
  sdk_client.py held URL TOKEN MODE KEY
    (one charge_card with a progress callback and idempotency key KEY: the
    gateway holds it until a reviewer decides)

MODE is the SDK's `mode`: "legacy" (initialize handshake) or "auto" (probe
server/discover, fall back to initialize). Prints one JSON object with what
the session saw; the Rust test asserts on it.
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def exercise(client: Client) -> dict:
    tools = await client.list_tools()
    by_name = {t.name: t for t in tools.tools}
    read = await client.call_tool("get_balance", {"account": "acct_42"})
    write = await client.call_tool("charge_card", {"account": "acct_42", "amount": 12.5})
    return {
        "protocol_version": client.protocol_version,
        "tools": sorted(by_name),
        "get_balance_read_only": bool(by_name["get_balance"].annotations and by_name["get_balance"].annotations.read_only_hint),
        "read_text": read.content[0].text,
        "read_is_error": read.is_error,
        "write_text": write.content[0].text,
        "write_is_error": write.is_error,
    }


async def main() -> None:
    kind = sys.argv[1]
    if kind == "http":
        url, token, mode = sys.argv[2:5]
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode) as client:
            out = await exercise(client)
    elif kind == "https":
        import ssl

        import httpx2  # the SDK's HTTP client

        url, token, mode, ca = sys.argv[2:7]
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=ca),
            timeout=httpx2.Timeout(30.0, read=300.0),
        )
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode) as client:
            out = await exercise(client)
    elif kind == "stdio":
        binary, gateway, server, token, mode = sys.argv[2:7]
        params = StdioServerParameters(
            command=binary,
            args=["stdio", "--server", server, "--gateway", gateway],
            env={**os.environ, "COUNTERSIGN_TOKEN": token, "COUNTERSIGN_LOG": "warn"},
        )
        async with Client(params, mode=mode) as client:
            out = await exercise(client)
    elif kind == "held":
        url, token, mode, key = sys.argv[2:6]
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        transport = streamable_http_client(url, http_client=http)
        progress = []

        async def on_progress(done, total, message):
            progress.append({"progress": done, "message": message})

        async with Client(transport, mode=mode) as client:
            await client.list_tools()
            result = await client.call_tool(
                "charge_card",
                {"account": "acct_42", "amount": 7},
                read_timeout_seconds=60,
                progress_callback=on_progress,
                meta={"dev.countersign/idempotency-key": key},
            )
            out = {
                "protocol_version": client.protocol_version,
                "progress": progress,
                "is_error": result.is_error,
                "text": result.content[0].text,
                "structured": result.structured_content,
            }
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    print(json.dumps(out))


asyncio.run(main())
