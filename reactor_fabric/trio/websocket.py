"""The WebSocket endpoint ``ws://HOST:PORT/mcp/{service}`` on the ASGI server.

Handshake rules (spec §3): the ``Origin`` check happens before accepting (closing before accept
answers HTTP 403); subprotocol ``mcp`` is chosen only when the client offers it; then the
connection becomes a session (:func:`~reactor_fabric.trio.session.serve_session`). One JSON-RPC
message per text frame; a binary frame closes the connection with 1003; oversize messages are
closed with 1009 by the server (``max_message_size``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, unquote

import trio

from ..policy.origins import request_allowed, request_headers
from ..protocol.jsonrpc import Peek
from .fabric import Fabric
from .session import serve_session

log = logging.getLogger(__name__)

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SUBPROTOCOL = "mcp"
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_INTERNAL_ERROR = 1011
MCP_PREFIX = "/mcp/"


class AsgiWebSocketChannel:
    """A :class:`~reactor_fabric.trio.session.ClientChannel` over an accepted ASGI WebSocket."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self._send_lock = trio.Lock()  # one frame at a time, from whichever task sends
        self.closed = False

    async def receive(self) -> bytes | None:
        if self.closed:
            return None
        message = await self._receive()
        if message["type"] == "websocket.disconnect":
            self.closed = True
            return None
        text = message.get("text")
        if text is None:
            await self.close(CLOSE_UNSUPPORTED_DATA, "binary frames are not supported")
            return None
        return str(text).encode()

    async def send(self, frame: bytes, message: Peek | None = None) -> None:
        if self.closed:
            raise trio.ClosedResourceError("the client connection is closed")
        async with self._send_lock:
            await self._send({"type": "websocket.send", "text": frame.decode("utf-8", "replace")})

    async def close(self, code: int, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        async with self._send_lock:
            await self._send({"type": "websocket.close", "code": code, "reason": reason[:120]})


async def serve_websocket(
    fabric: Fabric, scope: dict[str, Any], receive: Receive, send: Send
) -> None:
    """Handle one WebSocket connection from ``websocket.connect`` to its end."""
    connect = await receive()
    if connect["type"] != "websocket.connect":
        return
    path: str = scope["path"]
    headers = request_headers(scope)
    if not request_allowed(
        headers,
        allowed_origins=fabric.allowed_origins,
        allowed_hosts=fabric.allowed_hosts,
        path=path,
    ):
        await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
        return
    if not path.startswith(MCP_PREFIX) or "/" in path[len(MCP_PREFIX) :]:
        await send({"type": "websocket.close", "code": 1008})
        return
    service = unquote(path[len(MCP_PREFIX) :])
    accept: Message = {"type": "websocket.accept"}
    if SUBPROTOCOL in scope.get("subprotocols", []):
        accept["subprotocol"] = SUBPROTOCOL
    await send(accept)
    channel = AsgiWebSocketChannel(receive, send)
    query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
    try:
        await serve_session(fabric, channel, service, query.get("mount", []))
    except Exception:
        # A bug in a session must not take the orchestrator down, nor leave the client hanging:
        # the session's own finally has removed its container; close with "internal error".
        log.exception("session_crashed", extra={"service": service})
        with trio.move_on_after(5) as cleanup:
            cleanup.shield = True
            with contextlib.suppress(Exception):
                await channel.close(CLOSE_INTERNAL_ERROR, "internal error")
    finally:
        if not channel.closed:
            with trio.move_on_after(5) as cleanup:
                cleanup.shield = True
                # The connection may already be gone; there is nobody left to tell.
                with contextlib.suppress(Exception):
                    await channel.close(1000)
