"""Drive the official MCP Python SDK 1.x client from a test, one command per line.

Runs in its own environment (``mcp[ws]<2``, asyncio), made by ``tests/clients/envs.py``, because
the 1.x and 2.x SDKs are the same distribution and cannot share one environment.

Usage::

    python mcp1_client.py URL [--register MOUNTS_JSON] [--roots URI ...] [--sampling]

A ``ws://`` URL uses the SDK's WebSocket client, an ``http://`` URL its Streamable HTTP client.

With ``--register`` the client's first message is ``fabric/registerClient`` (sent through the
SDK's own WebSocket transport, before its ClientSession starts), as a fabric-aware client does.

Commands on stdin (JSON lines), each answered by one JSON line on stdout:

    {"op": "initialize"}                      -> {"ok": true, "server": name, "protocol": v}
    {"op": "list_tools"}                      -> {"ok": true, "tools": [names]}
    {"op": "call", "name": N, "arguments": A, "progress": false, "report_progress": false}
                                              -> {"ok": true, "content": [...], "structured": ...,
                                                  "progress": [[p, total], ...]}
       (with report_progress, each progress notification is also printed as it comes:
        {"op": "progress", "progress": p})
    {"op": "roots_requests"}                  -> {"ok": true, "count": n}
    {"op": "list_prompts"} / {"op": "get_prompt", "name", "arguments"}
    {"op": "list_resources"} / {"op": "read_resource", "uri"}
    {"op": "heard"}   -> {"ok": true, "sampling": n, "prompts": [texts], "notifications": [...]}
    {"op": "start", "tag": T, <a call>}       -> {"ok": true, "started": T} (the call runs on)
    {"op": "result", "tag": T}                -> what the started call answered, as "call" does
    {"op": "exit"}

With ``--sampling`` the client declares sampling and answers each request with the text
"sampled by the test client" (``--sampling-reply TEXT``: with TEXT instead, as a model would).

A JSON-RPC error becomes ``{"ok": false, "error": {"code", "message", "data"}}``; anything
else the SDK raises becomes ``{"ok": false, "exception": TYPE, "message": TEXT}`` (what the
client would show), and the driver exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any
from urllib.parse import urlencode

import anyio
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client
from mcp.client.websocket import websocket_client
from mcp.shared.context import RequestContext
from mcp.shared.exceptions import McpError
from mcp.shared.message import SessionMessage
from pydantic import AnyUrl


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
    parser.add_argument("--sampling", action="store_true", help="declare and answer sampling")
    parser.add_argument("--sampling-reply", default="sampled by the test client")
    args = parser.parse_args()

    roots_requests = 0

    async def list_roots(context: RequestContext[ClientSession, Any]) -> types.ListRootsResult:
        nonlocal roots_requests
        roots_requests += 1
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in args.roots or []])

    try:
        await session_loop(args, list_roots, lambda: roots_requests, Heard(args.sampling_reply))
    except BaseException as exc:
        emit(described(exc))


def described(exc: BaseException) -> dict[str, Any]:
    """What the SDK raised, unwrapping the exception groups its task groups make."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, McpError):
        # "message" is what the user is shown: str(exc), all that many programs print.
        return {"ok": False, "error": {**exc.error.model_dump(), "message": str(exc)}}
    return {"ok": False, "exception": type(exc).__name__, "message": str(exc)}


def transport(url: str) -> Any:
    """The SDK's transport for ``url``, with the orchestrator's token from REACTOR_FABRIC_TOKEN
    as a user would give it: a header over HTTP; in the URL over WebSocket, whose SDK client
    takes no headers."""
    token = os.environ.get("REACTOR_FABRIC_TOKEN")
    if url.startswith("http"):
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return streamablehttp_client(url, headers=headers)
    if token:
        url += ("&" if "?" in url else "?") + urlencode({"token": token})
    return websocket_client(url)


class Heard:
    """What the server sent the client on its own: sampling requests and notifications."""

    def __init__(self, reply: str) -> None:
        self.sampling = 0
        self.reply = reply
        self.prompts: list[str] = []
        self.notifications: list[str] = []

    async def sample(
        self, context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.sampling += 1
        self.prompts += [
            m.content.text for m in params.messages if isinstance(m.content, types.TextContent)
        ]
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=self.reply),
            model="test-model",
        )

    async def message(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            self.notifications.append(message.root.method)


async def session_loop(args: Any, list_roots: Any, roots: Any, heard: Heard) -> None:
    async with transport(args.url) as streams:
        read, write = streams[0], streams[1]
        if args.register is not None:
            registered = await register(read, write, json.loads(args.register))
            emit({"op": "register", **registered})
            if not registered["ok"]:
                return
        async with ClientSession(
            read,
            write,
            list_roots_callback=list_roots if args.roots is not None else None,
            sampling_callback=heard.sample if args.sampling else None,
            message_handler=heard.message,
        ) as session:
            running: dict[str, asyncio.Future[dict[str, Any]]] = {}
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline)
                if not line:
                    return
                command = json.loads(line)
                op = command["op"]
                if op == "exit":
                    return
                if op == "start":
                    call = {**command, "op": "call"}
                    running[command["tag"]] = asyncio.ensure_future(outcome(session, call, roots))
                    emit({"ok": True, "started": command["tag"]})
                    continue
                if op == "result":
                    emit(await running.pop(command["tag"]))
                    continue
                if op == "heard":
                    emit(
                        {
                            "ok": True,
                            "sampling": heard.sampling,
                            "prompts": heard.prompts,
                            "notifications": heard.notifications,
                        }
                    )
                    continue
                try:
                    emit(await run(session, command, roots))
                except McpError as exc:
                    emit({"ok": False, "error": exc.error.model_dump()})


async def list_prompts(session: ClientSession, _command: dict[str, Any]) -> dict[str, Any]:
    prompts = await session.list_prompts()
    return {"ok": True, "prompts": [prompt.name for prompt in prompts.prompts]}


async def get_prompt(session: ClientSession, command: dict[str, Any]) -> dict[str, Any]:
    prompt = await session.get_prompt(command["name"], command.get("arguments"))
    return {"ok": True, "messages": [m.model_dump() for m in prompt.messages]}


async def list_resources(session: ClientSession, _command: dict[str, Any]) -> dict[str, Any]:
    resources = await session.list_resources()
    return {"ok": True, "resources": [str(r.uri) for r in resources.resources]}


async def read_resource(session: ClientSession, command: dict[str, Any]) -> dict[str, Any]:
    read = await session.read_resource(AnyUrl(command["uri"]))
    return {"ok": True, "contents": [c.model_dump(mode="json") for c in read.contents]}


OFFERS = {
    "list_prompts": list_prompts,
    "get_prompt": get_prompt,
    "list_resources": list_resources,
    "read_resource": read_resource,
}


async def outcome(session: ClientSession, command: dict[str, Any], roots: Any) -> dict[str, Any]:
    try:
        return await run(session, command, roots)
    except McpError as exc:
        return {"ok": False, "error": exc.error.model_dump()}


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
            if command.get("report_progress"):
                emit({"op": "progress", "progress": value})

        result = await session.call_tool(
            command["name"],
            command.get("arguments", {}),
            progress_callback=on_progress
            if command.get("progress") or command.get("report_progress")
            else None,
        )
        return {
            "ok": not result.isError,
            "content": [item.model_dump() for item in result.content],
            "structured": result.structuredContent,
            "progress": progress,
        }
    if op in OFFERS:
        return await OFFERS[op](session, command)
    if op == "roots_requests":
        return {"ok": True, "count": roots()}
    raise ValueError(f"unknown op {op!r}")


if __name__ == "__main__":
    asyncio.run(main())
