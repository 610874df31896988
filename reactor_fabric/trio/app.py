"""The orchestrator's routes: which handler a request goes to. Only moves bytes.

============================  =========================================================
(every route)                 Origin/Host, then the token (:mod:`reactor_fabric.policy.auth`)
``GET /healthz``              the health report (:mod:`reactor_fabric.observe.health`);
                              without the token only its status; the engine pinged at
                              most once a second (:mod:`.engine_check`)
``/mcp/{service}[/{key}]``    Streamable HTTP (:mod:`.streamable_http`): the per-service relay
``/mcp``, ``/mcp/fabric/{key}`` the fabric endpoint (:mod:`.session`, FabricServer on the driver)
``ws://…/mcp[/{service}]``    WebSocket (:mod:`.websocket`)
``/``, ``/metrics``, ``/api/…`` operators: the status page, Prometheus, sessions and calls
                              (:mod:`.operator`)
============================  =========================================================
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import urlsplit

import trio

from .._errors import SecurityViolation
from .._version import __version__
from ..config.suite import FABRIC_ENDPOINT
from ..observe.health import health_report
from ..observe.page import STATUS_PAGE, page_headers
from ..policy.auth import Refusal, admit_origin
from ..policy.principal import TOKEN_HOLDER, Principal
from ..policy.resource_metadata import WELL_KNOWN, ProtectedResource
from ..protocol.http1 import RequestHead
from ..runtime.base import Runtime
from .authentication import Authenticator
from .engine_check import EngineCheck
from .http_server import HttpExchange, Request
from .operator import is_operator_route, serve_operator
from .session import SessionParts
from .streamable_http import HttpSessions, serve_streamable_http
from .websocket import serve_websocket

HEALTH_PING_TIMEOUT = 3.0
# When users sign in: which client the status page signs in as (open, like the metadata).
PAGE_SIGN_IN = "/api/sign-in"
# What of a refused request's body is read (and dropped) before the refusal is sent.
REFUSED_BODY_BYTES = 64 * 1024
REFUSED_BODY_SECONDS = 1.0


class AppParts(SessionParts, Protocol):
    """What the routes use of the orchestrator: what its sessions use, the gate in front of
    every route (with the issuer's keys when users sign in), and the runtime (``/healthz``
    pings its engine)."""

    @property
    def authenticator(self) -> Authenticator: ...

    @property
    def runtime(self) -> Runtime: ...


class FabricApp:
    """The :class:`~reactor_fabric.trio.http_server.HttpApp` of one orchestrator."""

    def __init__(self, parts: AppParts, http_sessions: HttpSessions) -> None:
        self.parts = parts
        self.http_sessions = http_sessions
        runtime = parts.runtime
        self.engine = EngineCheck(lambda: runtime.ping(time_bound=HEALTH_PING_TIMEOUT))

    async def http(self, exchange: HttpExchange) -> None:
        request = exchange.request
        if await self._open_route(exchange):
            return
        admitted = await self.parts.authenticator.admit(
            request.headers, request.query, request.path
        )
        refusal = admitted if isinstance(admitted, Refusal) else None
        principal = admitted if isinstance(admitted, Principal) else TOKEN_HOLDER
        if request.path == "/healthz":
            if request.method not in ("GET", "HEAD"):
                await exchange.respond_json(405, {"error": "method not allowed"}, allow="GET, HEAD")
                return
            if refusal is None:
                await self._healthz(exchange, details=True)
            elif refusal.status == 401:
                # Open to monitoring without the token, but only "up or not": the engine's
                # version and the session counts are for the token's holder.
                await self._healthz(exchange, details=False)
            else:
                await self._refuse(exchange, refusal)
            return
        if refusal is not None:
            await self._refuse(exchange, refusal)
            return
        if is_operator_route(request.path):
            parts = self.parts
            await serve_operator(
                exchange,
                registry=parts.registry,
                catalog=parts.catalog,
                settings=parts.settings,
                observer=parts.observer,
                principal=principal,
            )
            return
        route = mcp_route(request.path)
        if route is not None:
            service, key = route
            await serve_streamable_http(
                self.http_sessions, exchange, service=service, key=key, principal=principal
            )
            return
        await exchange.respond_json(404, {"error": "not found", "path": request.path})

    def answers_at_once(self, head: RequestHead) -> bool:
        """A POST to an MCP endpoint (its one message handed to its session, its answer left
        to the task that delivers it: streamable_http) waits for nothing from its client:
        the connection's reader may serve it (http_server.HttpApp)."""
        return head.method == "POST" and head.target.startswith(b"/mcp")

    async def websocket(self, request: Request, stream: trio.abc.Stream, trailing: bytes) -> None:
        await serve_websocket(self.parts, self.parts.authenticator, request, stream, trailing)

    async def _resource_metadata(
        self, exchange: HttpExchange, protected: ProtectedResource
    ) -> None:
        """RFC 9728's metadata: open (a client reads it before it has a token), the same
        document at every path form of the resource."""
        request = exchange.request
        resource = protected.resource_for(request.headers.get(b"host"))
        if not protected.serves_metadata_at(request.path, resource):
            await exchange.respond_json(404, {"error": "not found", "path": request.path})
            return
        if request.method not in ("GET", "HEAD"):
            await exchange.respond_json(405, {"error": "method not allowed"}, allow="GET, HEAD")
            return
        await exchange.respond(200, protected.metadata(resource))

    async def _open_route(self, exchange: HttpExchange) -> bool:
        """When users sign in, what anyone may read (Origin/Host still checked): the resource
        metadata, and the status page, which holds no data and signs its user in itself
        (observe/page.py). Whether the request was one (and is answered)."""
        gate = self.parts.authenticator.gate
        sign_in, request = gate.sign_in, exchange.request
        path, method = request.path, request.method
        is_page = path == "/" and method in ("GET", "HEAD")
        if sign_in is None or not (
            path.startswith(WELL_KNOWN) or is_page or (path == PAGE_SIGN_IN and method == "GET")
        ):
            return False
        refusal = admit_origin(gate, request.headers, path)
        if refusal is not None:
            await self._refuse(exchange, refusal)
        elif is_page:
            await self._status_page(exchange, sign_in.rules.issuer)
        elif path == PAGE_SIGN_IN:
            page = {"client_id": sign_in.page_client_id, "user_claim": sign_in.rules.user_claim}
            await exchange.respond_json(200, page)
        else:
            await self._resource_metadata(exchange, sign_in.resource)
        return True

    async def _status_page(self, exchange: HttpExchange, issuer: str) -> None:
        parts = urlsplit(issuer)
        await exchange.respond(
            200,
            STATUS_PAGE,
            content_type=b"text/html; charset=utf-8",
            headers=page_headers(f"{parts.scheme}://{parts.netloc}"),
        )

    async def _refuse(self, exchange: HttpExchange, refusal: Refusal) -> None:
        self.parts.observer.error_sent(SecurityViolation.code, refusal.reason)
        # A little of the body is read first, so that the refusal reaches the client rather
        # than a reset connection; never much, never long (the client is not admitted).
        await exchange.discard_body(REFUSED_BODY_BYTES, REFUSED_BODY_SECONDS)
        await exchange.respond(refusal.status, refusal.body, headers=list(refusal.headers))

    async def _healthz(self, exchange: HttpExchange, *, details: bool) -> None:
        engine = await self.engine.state()
        parts = self.parts
        report = health_report(
            engine=parts.runtime.name,
            docker_version=engine.version,
            docker_error=engine.error,
            sessions=parts.registry.session_count,
            containers=parts.registry.container_count,
            pooled_containers=sum(parts.starter.pooled().values()),
            version=__version__,
            replica=parts.settings.replica,
            stdio=parts.runtime.capabilities.stdio,
        )
        body = report.body if details else {"status": report.body["status"]}
        await exchange.respond_json(report.status_code, body)


def mcp_route(path: str) -> tuple[str, str | None] | None:
    """``/mcp/{service}`` or ``/mcp/{service}/{key}`` → (service, key); ``/mcp`` → the fabric
    endpoint (which ``/mcp/fabric[/{key}]`` names too); anything else → None."""
    if path == "/mcp":
        return FABRIC_ENDPOINT, None
    if not path.startswith("/mcp/"):
        return None
    parts = path[len("/mcp/") :].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 2 and parts[0] and parts[1]:
        return parts[0], parts[1]
    return None
