"""An MCP server built on the Python SDK (not on anything of ours), for the
interop tests: a notes store whose state is a JSON file, so a test counts
executions from the server's own state.

    py_server.py KIND TRANSPORT STATE [PORT]

KIND is `mcpserver` (the SDK's high-level `MCPServer`) or `lowlevel` (its
low-level `Server` with handlers); TRANSPORT is `stdio` or `http` (Streamable
HTTP on 127.0.0.1:PORT, path /mcp). Tools:
- `read_notes` (readOnlyHint): the notes;
- `add_note(text)`: appends one note; declares an outputSchema
  (`{"count": integer}`), which SDK clients check every result against.
"""

import json
import sys
from pathlib import Path

import anyio
from mcp_types import ToolAnnotations

KIND, TRANSPORT, STATE = sys.argv[1], sys.argv[2], Path(sys.argv[3])
PORT = int(sys.argv[4]) if len(sys.argv) > 4 else 0


def notes() -> list[str]:
    return json.loads(STATE.read_text()) if STATE.exists() else []


def add(text: str) -> int:
    current = notes() + [text]
    STATE.write_text(json.dumps(current))
    return len(current)


def mcpserver():
    from pydantic import BaseModel

    from mcp.server.mcpserver import MCPServer

    class Added(BaseModel):
        count: int

    server = MCPServer("py-notes")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def read_notes() -> str:
        """The notes kept so far."""
        return json.dumps(notes())

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
    def add_note(text: str) -> Added:
        """Append one note."""
        return Added(count=add(text))

    if TRANSPORT == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=PORT)


def lowlevel():
    import mcp_types as types

    from mcp.server.lowlevel import Server

    tools = [
        types.Tool(
            name="read_notes",
            description="The notes kept so far.",
            inputSchema={"type": "object", "properties": {}},
            annotations=ToolAnnotations(readOnlyHint=True),
        ),
        types.Tool(
            name="add_note",
            description="Append one note.",
            inputSchema={
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
            outputSchema={
                "type": "object",
                "properties": {"count": {"type": "integer"}},
                "required": ["count"],
            },
            annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False),
        ),
    ]

    async def on_list_tools(ctx, params):
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx, params):
        args = params.arguments or {}
        if params.name == "read_notes":
            text = json.dumps(notes())
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
        if params.name == "add_note":
            count = add(str(args.get("text", "")))
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=json.dumps({"count": count}))],
                structuredContent={"count": count},
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"unknown tool {params.name}")],
            isError=True,
        )

    server = Server("py-notes-lowlevel", on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    if TRANSPORT == "stdio":
        from mcp.server.stdio import stdio_server

        async def main():
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(main)
    else:
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=PORT, log_level="warning")


if __name__ == "__main__":
    {"mcpserver": mcpserver, "lowlevel": lowlevel}[KIND]()
