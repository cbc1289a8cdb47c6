"""An MCP server on the Python SDK's `MCPServer` (stdio) for the trace
tests, exporting its own spans when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

    trace_server.py STATE

Tools: `get_balance(account)` (readOnlyHint) and `charge_card(account,
amount)`, which appends what it received (its arguments, and the
`traceparent` in the request's `_meta`) to the JSON-lines file STATE, so a
test counts executions and reads what reached the server.
"""

import json
import sys

from mcp_types import ToolAnnotations

import otel_peer

from mcp.server.mcpserver import Context, MCPServer

STATE = sys.argv[1]
provider = otel_peer.setup("pay-server")
server = MCPServer("trace-pay")


def traceparent(ctx: Context):
    meta = ctx.request_context.meta
    if meta is None:
        return None
    if isinstance(meta, dict):
        return meta.get("traceparent")
    return getattr(meta, "traceparent", None) or (meta.model_extra or {}).get("traceparent")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def get_balance(account: str) -> str:
    """An account's balance."""
    return json.dumps({"account_balance": 100})


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def charge_card(account: str, amount: float, ctx: Context) -> str:
    """Charge a card."""
    with open(STATE, "a") as f:
        f.write(json.dumps({"account": account, "amount": amount, "traceparent": traceparent(ctx)}) + "\n")
    return json.dumps({"charged": amount})


try:
    server.run("stdio")
finally:
    if provider is not None:
        provider.shutdown()
