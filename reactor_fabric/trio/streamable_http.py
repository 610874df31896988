"""The MCP Streamable HTTP endpoint: ``http://HOST:PORT/mcp/{service}[/{key}]``.

Every HTTP session is a session exactly like a WebSocket connection (same handshake rules, mounts,
container, idle teardown and errors); only the transport differs (see :mod:`._http_channel`).

How requests find their session (and container):

- **Handshake-era clients** (MCP ≤ 2025-11-25) POST ``initialize`` — or ``fabric/registerClient``
  — to ``/mcp/{service}`` without a session id. That starts a session; its id comes back in the
  ``Mcp-Session-Id`` response header, and the client sends it with every later request. An
  unknown or expired id gets HTTP 404, after which the client starts a new session.
- **Stateless clients** (MCP 2026-07-28) send no session id at all, so the session is named by
  the URL instead: ``/mcp/{service}/{key}``, where ``key`` is any string the client picks
  (``[A-Za-z0-9._~-]``, ≤ 128). All requests to one keyed URL share one session and one
  container; the first one creates it. On the bare URL a stateless request (including a dual
  client's ``server/discover`` probe) is answered with a JSON-RPC error explaining this, which
  makes dual clients fall back to the ``initialize`` handshake — so ``mode="auto"`` clients work
  on either URL, one container per session, never one per request.

POST carries one message: a notification or response is accepted with 202; a request is
answered with its response, as ``application/json`` for the first message of a session (so that
a refused session gets a meaningful HTTP status) and as an SSE stream (``text/event-stream``,
which can carry progress and server→client requests first) afterwards, when the client accepts
it. GET opens the session's stream of server-initiated messages. DELETE ends the session.
Sessions without any HTTP activity for their expiry time end by themselves, with their container.

Checks on every request: ``Origin`` (403), ``Host`` (403), ``Accept`` (406), ``Content-Type``
(415), body size (413), ``MCP-Protocol-Version`` (400 when present and unknown).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import msgspec
import trio

from .._errors import FabricError, InvalidMessage, InvalidRequest, ServiceNotFound
from ..policy.origins import request_allowed, request_headers
from ..protocol.handshake import REGISTER_METHOD
from ..protocol.jsonrpc import Peek, decode_params, error_response, peek
from .fabric import Fabric
from .http_channel import HttpChannel, Waiter
from .session import new_session_id, serve_session

log = logging.getLogger(__name__)

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SESSION_HEADER = b"mcp-session-id"
PROTOCOL_HEADER = b"mcp-protocol-version"
KNOWN_PROTOCOL_VERSIONS = frozenset(
    {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"}
)
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~-]{1,128}")
# An HTTP session with no request and no open stream for this long ends (HTTP 404 afterwards).
MIN_SESSION_EXPIRY_SECONDS = 600.0
SSE_KEEPALIVE_SECONDS = 15.0

# The HTTP status of a session refused before it started, by JSON-RPC error code.
REFUSAL_STATUS = {-32700: 400, -32600: 400, -32004: 403, -32005: 404, -32002: 503, -32001: 503}


@dataclass
class HttpSession:
    id: str
    service: str
    key: str | None
    channel: HttpChannel = field(default_factory=HttpChannel)
    started: bool = False  # the first message has been submitted
    ended: trio.Event = field(default_factory=trio.Event)


class HttpSessions:
    """The live Streamable HTTP sessions, and the nursery that owns them.

    Ownership: :meth:`run` (started in the orchestrator's root nursery) owns one task per HTTP
    session, which runs :func:`~reactor_fabric.trio.session.serve_session` and the session's expiry
    watch; request handlers only look sessions up and talk to their channels.
    """

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.by_id: dict[str, HttpSession] = {}
        self.by_key: dict[tuple[str, str], HttpSession] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def create(self, service: str, key: str | None, query_mounts: list[str]) -> HttpSession:
        assert self._nursery is not None, "HttpSessions.run must be started first"
        session = HttpSession(new_session_id(), service, key)
        self.by_id[session.id] = session
        if key is not None:
            self.by_key[(service, key)] = session
        self._nursery.start_soon(self._run_session, session, query_mounts)
        return session

    async def _run_session(self, session: HttpSession, query_mounts: list[str]) -> None:
        expiry = self._expiry(session.service)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._expire, session, expiry, nursery.cancel_scope)
                await serve_session(
                    self.fabric,
                    session.channel,
                    session.service,
                    query_mounts,
                    session_id=session.id,
                )
                nursery.cancel_scope.cancel()
        finally:
            self.by_id.pop(session.id, None)
            if (
                session.key is not None
                and self.by_key.get((session.service, session.key)) is session
            ):
                del self.by_key[(session.service, session.key)]
            with trio.CancelScope(shield=True):
                await session.channel.close(1000, "session ended")
            session.ended.set()

    def _expiry(self, service: str) -> float:
        definition = self.fabric.service(service)
        idle = definition.idle_timeout_seconds if definition is not None else 0.0
        return max(MIN_SESSION_EXPIRY_SECONDS, 2 * idle)

    async def _expire(
        self, session: HttpSession, expiry: float, session_scope: trio.CancelScope
    ) -> None:
        channel = session.channel
        while True:
            deadline = channel.last_activity + expiry
            if trio.current_time() < deadline:
                await trio.sleep_until(deadline)
                continue
            if channel.busy:
                channel.touch()
                continue
            log.info(
                "http_session_expired", extra={"session": session.id, "service": session.service}
            )
            await channel.close(1000, "expired")
            return

    async def terminate(self, session: HttpSession) -> None:
        await session.channel.close(1000, "deleted by the client")
        with trio.move_on_after(20):
            await session.ended.wait()


async def respond(
    send: Send,
    status: int,
    body: bytes = b"",
    *,
    content_type: bytes = b"application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def respond_error(
    send: Send,
    status: int,
    error: FabricError,
    request_id: Any = None,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await respond(send, status, error_response(request_id, error), extra=extra)


@dataclass
class Exchange:
    """One HTTP request to the endpoint, with what every step needs."""

    sessions: HttpSessions
    scope: dict[str, Any]
    receive: Receive
    send: Send
    service: str
    key: str | None
    headers: dict[bytes, str] = field(init=False)

    def __post_init__(self) -> None:
        self.headers = request_headers(self.scope)

    @property
    def fabric(self) -> Fabric:
        return self.sessions.fabric

    def lookup(self) -> HttpSession | None:
        session_id = self.headers.get(SESSION_HEADER)
        if session_id is not None:
            session = self.sessions.by_id.get(session_id)
            return session if session is not None and session.service == self.service else None
        if self.key is not None:
            return self.sessions.by_key.get((self.service, self.key))
        return None


async def serve_streamable_http(
    sessions: HttpSessions,
    scope: dict[str, Any],
    receive: Receive,
    send: Send,
    *,
    service: str,
    key: str | None,
) -> None:
    """Handle one HTTP request to ``/mcp/{service}[/{key}]``."""
    exchange = Exchange(sessions, scope, receive, send, service, key)
    if not await _admissible(exchange):
        return
    method = scope["method"]
    if method == "POST":
        await _post(exchange)
    elif method == "GET":
        await _get(exchange)
    elif method == "DELETE":
        session = exchange.lookup()
        if session is None:
            await respond(send, 404, b'{"error": "unknown or expired session"}')
            return
        await sessions.terminate(session)
        await respond(send, 204)
    else:
        await respond(
            send, 405, b'{"error": "method not allowed"}', extra=[(b"allow", b"GET, POST, DELETE")]
        )


async def _admissible(exchange: Exchange) -> bool:
    """The checks every request passes; answers and returns False when one fails."""
    fabric, headers, send = exchange.fabric, exchange.headers, exchange.send
    if not request_allowed(
        headers,
        allowed_origins=fabric.allowed_origins,
        allowed_hosts=fabric.allowed_hosts,
        path=exchange.scope["path"],
    ):
        await respond(send, 403, b'{"error": "origin or host not allowed"}')
        return False
    version = headers.get(PROTOCOL_HEADER)
    if version is not None and version not in KNOWN_PROTOCOL_VERSIONS:
        error = InvalidRequest(
            f"unsupported MCP-Protocol-Version {version!r}",
            reason="unsupported_protocol_version",
            supported=sorted(KNOWN_PROTOCOL_VERSIONS),
        )
        await respond_error(send, 400, error)
        return False
    if exchange.key is not None and KEY_PATTERN.fullmatch(exchange.key) is None:
        await respond(send, 404, b'{"error": "not found"}')
        return False
    if fabric.service(exchange.service) is None:
        missing = ServiceNotFound(
            f"no service named {exchange.service!r} in the suite",
            reason="service_not_found",
            service=exchange.service,
        )
        await respond_error(send, 404, missing)
        return False
    return True


def _starts_session(message: Peek) -> bool:
    if message.method in ("initialize", REGISTER_METHOD):
        return True
    if message.method == "tools/call":
        params = decode_params(message.params)
        return isinstance(params, dict) and params.get("name") == REGISTER_METHOD
    return False


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body; None if the client left, b"" if it is over ``limit``."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            return b""
        if not message.get("more_body"):
            return bytes(body)


async def _read_message(exchange: Exchange) -> tuple[bytes, Peek] | None:
    """Check the POST's headers and read its one JSON-RPC message; None once answered."""
    send, headers = exchange.send, exchange.headers
    accept = headers.get(b"accept", "")
    if not any(kind in accept for kind in ("application/json", "text/event-stream", "*/*")):
        await respond(send, 406, b'{"error": "Accept must allow application/json or SSE"}')
        return None
    if not headers.get(b"content-type", "").lower().startswith("application/json"):
        await respond(send, 415, b'{"error": "Content-Type must be application/json"}')
        return None
    body = await _read_body(exchange.receive, exchange.fabric.max_message_bytes)
    if body is None:
        return None  # the client went away
    if not body:
        await respond(send, 413, b'{"error": "message too large"}')
        return None
    try:
        return body, peek(body)
    except InvalidMessage as exc:
        await respond_error(send, 400, exc)
        return None


async def _session_for(exchange: Exchange, message: Peek) -> HttpSession | None:
    """The message's session, created when the message may start one; None once answered."""
    session = exchange.lookup()
    if session is not None:
        return session
    if exchange.headers.get(SESSION_HEADER) is not None:
        await respond(exchange.send, 404, b'{"error": "unknown or expired session"}')
        return None
    if exchange.key is None and not _starts_session(message):
        stateless_probe = message.method == "server/discover"
        error = InvalidRequest(
            "no Mcp-Session-Id: start a session with initialize (or fabric/registerClient), "
            f"or, for a stateless client, use a session URL: /mcp/{exchange.service}/<your-key>",
            reason="stateless_needs_session_url" if stateless_probe else "session_required",
        )
        request_id = message.id if message.kind == "request" else None
        await respond_error(exchange.send, 400, error, request_id)
        return None
    query = parse_qs(bytes(exchange.scope.get("query_string", b"")).decode("latin-1"))
    return exchange.sessions.create(exchange.service, exchange.key, query.get("mount", []))


async def _post(exchange: Exchange) -> None:
    read = await _read_message(exchange)
    if read is None:
        return
    body, message = read
    session = await _session_for(exchange, message)
    if session is None:
        return
    send = exchange.send
    session_header = [(b"mcp-session-id", session.id.encode())]
    first = not session.started
    session.started = True
    channel = session.channel
    if message.kind != "request":
        try:
            await channel.submit(body)
        except trio.ClosedResourceError:
            await respond(send, 404, b'{"error": "session ended"}')
            return
        await respond(send, 202, extra=session_header)
        return

    assert message.id is not None
    # The first answer of a session is plain JSON, so that a refused session gets a meaningful
    # HTTP status; later ones stream, so that progress and server requests can come first.
    streaming = "text/event-stream" in exchange.headers.get(b"accept", "") and not first
    waiter = channel.expect(message.id, streaming=streaming)
    try:
        await channel.submit(body)
    except trio.ClosedResourceError:
        channel.abandon(waiter)
        await respond(send, 404, b'{"error": "session ended"}')
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_disconnect, exchange.receive, nursery.cancel_scope)
        try:
            if streaming:
                await _stream_answer(send, waiter, session.id, channel)
            else:
                await _json_answer(
                    send, waiter, session_header, channel, first=first, request_id=message.id
                )
        finally:
            channel.abandon(waiter)
            nursery.cancel_scope.cancel()


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _json_answer(
    send: Send,
    waiter: Waiter,
    session_header: list[tuple[bytes, bytes]],
    channel: HttpChannel,
    *,
    first: bool,
    request_id: Any,
) -> None:
    frame: bytes | None = None
    async for item in waiter.receive:
        frame = item  # a JSON answer carries only the response; others went to the GET stream
    if frame is None:
        error = InvalidRequest("the session ended before answering", reason="session_ended")
        await respond_error(send, 404 if channel.closed.is_set() else 500, error, request_id)
        return
    status = 200
    if first and channel.closed.is_set():
        # The session was refused before it started: say so in the HTTP status as well.
        code = _error_code(frame)
        status = REFUSAL_STATUS.get(code, 200) if code is not None else 200
    channel.touch()
    await respond(send, status, frame, extra=session_header)


def _error_code(frame: bytes) -> int | None:
    decoded = msgspec.json.decode(frame)
    error = decoded.get("error") if isinstance(decoded, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) else None


async def _start_event_stream(send: Send, session_id: str) -> None:
    headers = [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-store"),
        (b"mcp-session-id", session_id.encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})


async def _stream_answer(send: Send, waiter: Waiter, session_id: str, channel: HttpChannel) -> None:
    """An SSE stream — unless the response is the first thing to come, then plain JSON.

    Most requests get nothing but their response; answering those with one JSON body saves the
    stream's extra writes (the client accepts both, and the choice is the server's per request).
    """
    try:
        first = await waiter.receive.receive()
    except trio.EndOfChannel:
        error = InvalidRequest("the session ended before answering", reason="session_ended")
        await respond_error(send, 404, error, waiter.request_id)
        return
    channel.touch()
    if first is waiter.response:
        await respond(send, 200, first, extra=[(b"mcp-session-id", session_id.encode())])
        return
    await _start_event_stream(send, session_id)
    await send({"type": "http.response.body", "body": sse_event(first), "more_body": True})
    async for frame in waiter.receive:
        channel.touch()
        await send({"type": "http.response.body", "body": sse_event(frame), "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse_event(frame: bytes) -> bytes:
    return b"event: message\ndata: " + frame + b"\n\n"


async def _get(exchange: Exchange) -> None:
    send, headers = exchange.send, exchange.headers
    if "text/event-stream" not in headers.get(b"accept", ""):
        await respond(send, 406, b'{"error": "Accept must allow text/event-stream"}')
        return
    session = exchange.lookup()
    if session is None:
        status = 404 if headers.get(SESSION_HEADER) or exchange.key else 400
        await respond(send, status, b'{"error": "unknown or missing session"}')
        return
    channel = session.channel
    await _start_event_stream(send, session.id)
    channel.open_streams += 1
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_disconnect, exchange.receive, nursery.cancel_scope)
            await _pump_backlog(send, channel)
            nursery.cancel_scope.cancel()
    finally:
        channel.open_streams -= 1
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _pump_backlog(send: Send, channel: HttpChannel) -> None:
    """Server-initiated messages onto the GET stream until the session ends."""
    while True:
        frame: bytes | None = None
        with trio.move_on_after(SSE_KEEPALIVE_SECONDS):
            try:
                frame = await channel.backlog.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
        if frame is None:
            # Nothing to say for a while: an SSE comment keeps proxies from closing the stream.
            body = b": keepalive\n\n"
        else:
            channel.touch()
            body = sse_event(frame)
        await send({"type": "http.response.body", "body": body, "more_body": True})
