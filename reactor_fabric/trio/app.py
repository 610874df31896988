"""The ASGI application: routes HTTP and WebSocket requests to the orchestrator.

Only moves bytes and maps outcomes to status codes; the decisions live in pure modules
(:mod:`._health`, and the session and handshake modules for ``/mcp/{service}``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .._errors import DockerUnavailable
from .._version import __version__
from ..observe.health import health_report
from .fabric import Fabric
from .streamable_http import HttpSessions, serve_streamable_http
from .websocket import serve_websocket

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

HEALTH_PING_TIMEOUT = 3.0


class FabricApp:
    """ASGI 3 application over a :class:`~reactor_fabric.trio.fabric.Fabric`."""

    def __init__(self, fabric: Fabric, http_sessions: HttpSessions) -> None:
        self.fabric = fabric
        self.http_sessions = http_sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await serve_websocket(self.fabric, scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/healthz":
            if method not in ("GET", "HEAD"):
                await _json(send, 405, {"error": "method not allowed"}, allow="GET, HEAD")
                return
            await self._healthz(send, head=method == "HEAD")
            return
        route = mcp_route(path)
        if route is not None:
            service, key = route
            await serve_streamable_http(
                self.http_sessions, scope, receive, send, service=service, key=key
            )
            return
        await _json(send, 404, {"error": "not found", "path": path})

    async def _healthz(self, send: Send, *, head: bool) -> None:
        docker_version: str | None = None
        docker_error: str | None = None
        try:
            docker_version = await self.fabric.engine.ping(time_bound=HEALTH_PING_TIMEOUT)
        except DockerUnavailable as exc:
            docker_error = str(exc)
        report = health_report(
            docker_version=docker_version,
            docker_error=docker_error,
            sessions=self.fabric.session_count,
            containers=self.fabric.container_count,
            version=__version__,
        )
        await _json(send, report.status_code, report.body, head=head)


def mcp_route(path: str) -> tuple[str, str | None] | None:
    """``/mcp/{service}`` or ``/mcp/{service}/{key}`` → (service, key); anything else → None."""
    if not path.startswith("/mcp/"):
        return None
    parts = path[len("/mcp/") :].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 2 and parts[0] and parts[1]:
        return parts[0], parts[1]
    return None


async def _json(
    send: Send, status: int, body: dict[str, Any], *, head: bool = False, allow: str | None = None
) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"cache-control", b"no-store"),
    ]
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else payload})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
