"""A lenient MCP server over stdio, as many are built: a generic JSON-RPC
dispatcher (PyPI's `json-rpc`, which nobody here wrote) with MCP's methods
registered on it. Like most such dispatchers it runs a method whether or
not the message has an `id`: a `tools/call` notification runs the tool and
answers nothing.

It speaks the handshake era (initialize, tools/list, tools/call) and
answers 2026-07-28's `server/discover`, so the gateway can reach it by
every path. Every execution of `wire_money` is appended to the record file
given as the first argument, with whether the message carried an id.

With --handshake-only it does not answer `server/discover`, so the
gateway carries 2026-07-28 clients over a handshake-era session.

usage: lenient_server.py RECORD [--handshake-only]
"""

import json
import sys

from jsonrpc import JSONRPCResponseManager, dispatcher

RECORD = sys.argv[1]
HANDSHAKE_ONLY = "--handshake-only" in sys.argv[2:]
# Set per message before dispatch: the dispatcher hides whether it has an id.
CURRENT = {"id": None}

TOOLS = [
    {
        "name": "wire_money",
        "description": "Send money to an account.",
        "inputSchema": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "amount": {"type": "number"}},
        },
        "annotations": {"readOnlyHint": False, "destructiveHint": True},
    },
    {
        "name": "statement",
        "description": "A statement, written as Python's json writes it: shortest float reprs, ASCII escapes.",
        "inputSchema": {"type": "object", "properties": {"account": {"type": "string"}}},
        "annotations": {"readOnlyHint": False, "destructiveHint": False},
    },
    {
        "name": "statement_read",
        "description": "The same statement, as a read.",
        "inputSchema": {"type": "object", "properties": {"account": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "get_balance",
        "description": "Read a balance.",
        "inputSchema": {"type": "object", "properties": {"account": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    },
]


def initialize(**params):
    return {
        "protocolVersion": params.get("protocolVersion", "2025-06-18"),
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "lenient", "version": "1.0.0"},
    }


def discover(**_params):
    return {
        "supportedVersions": ["2026-07-28"],
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "lenient", "version": "1.0.0"},
    }


def tools_list(**_params):
    return {"tools": TOOLS}


def tools_call(name=None, arguments=None, **_rest):
    if name == "wire_money":
        with open(RECORD, "a") as f:
            f.write(json.dumps({"tool": name, "arguments": arguments, "id": CURRENT["id"]}) + "\n")
        return {"content": [{"type": "text", "text": "sent"}], "isError": False}
    if name in ("statement", "statement_read"):
        note = "Caf\u00e9 \"quoted\" \\ back\nslash\ttab \U0001F600 " * 40
        with open(RECORD + ".statements", "a") as f:
            f.write(name + "\n")
        return {
            "content": [{"type": "text", "text": note}],
            "structuredContent": {
                "balance": 1944.4099999999999,
                "previous": 1825.4299999999998,
                "tiny": 5e-324,
                "big": 1e21,
                "note": note,
            },
            "isError": False,
        }
    if name == "get_balance":
        return {"content": [{"type": "text", "text": "100"}], "isError": False}
    raise ValueError("unknown tool")


def ping(**_params):
    return {}


for method, fn in {
    "initialize": initialize,
    "tools/list": tools_list,
    "tools/call": tools_call,
    "ping": ping,
}.items():
    dispatcher[method] = fn
if not HANDSHAKE_ONLY:
    dispatcher["server/discover"] = discover

# Forgiving, as some dispatchers are: a method in another case or with
# stray whitespace still finds its handler.
for method, fn in list(dispatcher.method_map.items()):
    dispatcher[method.upper()] = fn
    dispatcher[method + " "] = fn

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    try:
        msg = json.loads(line)
        CURRENT["id"] = msg.get("id") if isinstance(msg, dict) else None
    except ValueError:
        CURRENT["id"] = None
    response = JSONRPCResponseManager.handle(line, dispatcher)
    if response is not None:
        sys.stdout.write(response.json + "\n")
        sys.stdout.flush()
