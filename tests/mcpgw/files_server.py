"""A small file-store MCP server (the gateway's tests), on the official SDK's low-level
server, over stdio: read_file, write_file, delete_file under FILES_ROOT. read_file's
description is read from FILES_DESCRIPTION_FILE at every listing, so a test can change a
definition under the gateway's feet, as a poisoned server would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

ROOT = Path(os.environ["FILES_ROOT"])
DESCRIPTION = Path(os.environ["FILES_DESCRIPTION_FILE"])
PATH_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def _file(path: str) -> Path:
    return ROOT / path.lstrip("/")


async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
    write_schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        "required": ["path", "text"],
    }
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name="read_file", description=DESCRIPTION.read_text(), input_schema=PATH_SCHEMA
            ),
            types.Tool(name="write_file", description="Write a file", input_schema=write_schema),
            types.Tool(name="delete_file", description="Delete a file", input_schema=PATH_SCHEMA),
        ]
    )


async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    path = _file(str(args.get("path", "")))
    if params.name == "read_file":
        text = path.read_text() if path.is_file() else "(no such file)"
    elif params.name == "write_file":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(args.get("text", "")))
        text = "written"
    elif params.name == "delete_file":
        path.unlink(missing_ok=True)
        text = "deleted"
    else:
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="no such tool")], is_error=True
        )
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main() -> None:
    server = Server("files", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
