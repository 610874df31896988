"""Drive the official MCP Python SDK 1.x WebSocket client from a test, one command per line.

Runs in its own environment (``mcp[ws]<2``, asyncio), made by ``tests/clients/envs.py``, because
the 1.x and 2.x SDKs are the same distribution and cannot share one environment.

Usage::

    python mcp1_ws_client.py URL [--register MOUNTS_JSON] [--roots URI ...]

With ``--register`` the client's first message is ``fabric/registerClient`` (sent through the
SDK's own WebSocket transport, before its ClientSession starts), as a fabric-aware client does.

Commands on stdin (JSON lines), each answered by one JSON line on stdout:

    {"op": "initialize"}                      -> {"ok": true, "server": name, "protocol": v}
    {"op": "list_tools"}                      -> {"ok": true, "tools": [names]}
    {"op": "call", "name": N, "arguments": A, "progress": false}
                                              -> {"ok": true, "content": [...], "structured": ...,
                                                  "progress": [[p, total], ...]}
    {"op": "roots_requests"}                  -> {"ok": true, "count": n}
    {"op": "exit"}

A JSON-RPC error becomes ``{"ok": false, "error": {"code", "message", "data"}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import anyio
from mcp import ClientSession, types
from mcp.client.websocket import websocket_client
from mcp.shared.context import RequestContext
from mcp.shared.exceptions import McpError
from mcp.shared.message import SessionMessage


def emit(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, default=str), flush=True)


async def register(read: Any, write: Any, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    request = types.JSONRPCRequest(
        jsonrpc="2.0", id="register", method="fabric/registerClient", params={"mounts": mounts}
    )
    await write.send(SessionMessage(types.JSONRPCMessage(request)))
    answer = await read.receive()
    if isinstance(answer, Exception):
        raise answer
    root = answer.message.root
    if isinstance(root, types.JSONRPCError):
        return {"ok": False, "error": root.error.model_dump()}
    return {"ok": True, "result": root.result}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--register", help="JSON list of mounts for fabric/registerClient")
    parser.add_argument("--roots", nargs="*", default=None, help="root URIs to offer the server")
    args = parser.parse_args()

    roots_requests = 0

    async def list_roots(context: RequestContext[ClientSession, Any]) -> types.ListRootsResult:
        nonlocal roots_requests
        roots_requests += 1
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in args.roots or []])

    async with websocket_client(args.url) as (read, write):
        if args.register is not None:
            registered = await register(read, write, json.loads(args.register))
            emit({"op": "register", **registered})
            if not registered["ok"]:
                return
        async with ClientSession(
            read, write, list_roots_callback=list_roots if args.roots is not None else None
        ) as session:
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline)
                if not line:
                    return
                command = json.loads(line)
                op = command["op"]
                if op == "exit":
                    return
                try:
                    emit(await run(session, command, lambda: roots_requests))
                except McpError as exc:
                    emit({"ok": False, "error": exc.error.model_dump()})


async def run(session: ClientSession, command: dict[str, Any], roots: Any) -> dict[str, Any]:
    op = command["op"]
    if op == "initialize":
        result = await session.initialize()
        return {"ok": True, "server": result.serverInfo.name, "protocol": result.protocolVersion}
    if op == "list_tools":
        tools = await session.list_tools()
        return {"ok": True, "tools": [tool.name for tool in tools.tools]}
    if op == "call":
        progress: list[list[float | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append([value, total])

        result = await session.call_tool(
            command["name"],
            command.get("arguments", {}),
            progress_callback=on_progress if command.get("progress") else None,
        )
        return {
            "ok": not result.isError,
            "content": [item.model_dump() for item in result.content],
            "structured": result.structuredContent,
            "progress": progress,
        }
    if op == "roots_requests":
        return {"ok": True, "count": roots()}
    raise ValueError(f"unknown op {op!r}")


if __name__ == "__main__":
    asyncio.run(main())
