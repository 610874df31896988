"""The MCP Streamable HTTP endpoint: ``http://HOST:PORT/mcp/{service}[/{key}]``.

Every HTTP session is a session exactly like a WebSocket connection (same handshake rules, mounts,
container, idle teardown and errors); only the transport differs (see :mod:`.http_channel`).

How requests find their session (and container):

- **Handshake-era clients** (MCP ≤ 2025-11-25) POST ``initialize`` — or ``fabric/registerClient``
  — to ``/mcp/{service}`` without a session id. That starts a session; its id comes back in the
  ``Mcp-Session-Id`` response header, and the client sends it with every later request. An
  unknown or expired id gets HTTP 404, after which the client starts a new session.
- **Stateless clients** (MCP 2026-07-28) send no session id at all, so the session is named by
  the URL instead: ``/mcp/{service}/{key}``, where ``key`` is any string the client picks
  (``[A-Za-z0-9._~-]``, ≤ 128). All requests to one keyed URL share one session and one
  container; the first one creates it, and the key belongs to that client: a later request
  without the session id must present the same ``?mount=``, ``?tools=`` and ``?profile=``, and a
  session registered with mounts in a ``fabric/registerClient`` body is reached only with its
  session id (see :func:`_same_owner`). On the bare URL a stateless request (including a dual
  client's ``server/discover`` probe) is answered with a JSON-RPC error explaining this, which
  makes dual clients fall back to the ``initialize`` handshake.

Errors the way clients show them: a refusal (unknown service, refused mount, too many sessions, a
stateless request on the bare URL) is the JSON-RPC error with HTTP **200** — clients start OAuth
on 401/403 and read 404 as "session terminated". HTTP errors are kept for what is wrong at the
HTTP level: 400 a body that is not one JSON-RPC message, 404 an unknown or expired session id,
405, 406 ``Accept``, 409 a GET or DELETE on someone else's keyed URL, 413 size, 415
``Content-Type``; and, in front of every route, 403 ``Origin``/``Host`` and 401 a missing or
wrong token (:mod:`reactor_fabric.policy.auth`).

POST carries one message: a notification or response is accepted with 202; a request is
answered with its response as ``application/json`` when the response is the first thing to
come, or as an SSE stream when something (progress, a server→client request) comes first.
GET opens the session's stream of server-initiated messages. DELETE ends the session. A session
with no request and no open stream for its service's idle timeout ends, with its container: the
session's machine keeps that clock (the client's lease, protocol/client_lease.py): messages
renew it, the channel tells when a stream opens or closes, and whether anything is still open
is asked when the lease comes due.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from .._errors import (
    InvalidMessage,
    InvalidRequest,
    ParseError,
    SecurityViolation,
)
from .._reasons import (
    INVALID_UTF8,
    SESSION_ENDED,
    SESSION_KEY_IN_USE,
    SESSION_REQUIRED,
    STATELESS_NEEDS_SESSION_URL,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from ..config.suite import FABRIC_ENDPOINT
from ..observe.observer import Client
from ..policy.admission import requested_options, service_not_found
from ..policy.principal import TOKEN_HOLDER, Principal
from ..protocol.handshake import REGISTER_METHOD
from ..protocol.jsonrpc import (
    REQUEST,
    Peek,
    RequestId,
    decode_params,
    duplicate_request,
    error_response,
    peek,
)
from ..protocol.mcp import KNOWN_VERSIONS
from .channel import ChannelClosed
from .http_channel import FrameQueue, HttpChannel, Waiter
from .http_server import HttpExchange
from .identity import new_session_id
from .session import SessionParts, client_of, serve_session

log = logging.getLogger(__name__)

SESSION_HEADER = b"mcp-session-id"
PROTOCOL_HEADER = b"mcp-protocol-version"
KNOWN_PROTOCOL_VERSIONS = KNOWN_VERSIONS
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~-]{1,128}")
SSE_KEEPALIVE_SECONDS = 15.0
SESSION_END_BOUND_SECONDS = 20.0
# The query parameters that shape a session (its mounts, the fabric endpoint's options): a
# request on a keyed URL presenting other values is another client.
OWNER_PARAMETERS = ("mount", "tools", "profile")


@dataclass
class HttpSession:
    id: str
    service: str
    key: str | None
    channel: HttpChannel
    # The query of the request that created it: its mounts, the fabric endpoint's options.
    query: dict[str, list[str]] = field(default_factory=dict)
    # Created by a fabric/registerClient body (its mounts are in no URL): only its id reaches it.
    registered: bool = False
    # Who created it, and the W3C traceparent of that request (for the audit trail).
    client: Client | None = None
    traceparent: str | None = None
    started: bool = False  # the first message has been submitted
    ended: trio.Event = field(default_factory=trio.Event)
    # The signed-in user it belongs to (None: the orchestrator's token's holder's).
    owner: str | None = None

    @property
    def query_mounts(self) -> list[str]:
        """The ``?mount=`` values the session was created with."""
        return self.query.get("mount", [])


class HttpSessions:
    """The live Streamable HTTP sessions, and the nursery that owns them.

    Ownership: :meth:`run` (started in the orchestrator's root nursery) owns one task per HTTP
    session, which runs :func:`~reactor_fabric.trio.session.serve_session` and the session's
    expiry watch; request handlers only look sessions up and talk to their channels.
    """

    def __init__(self, parts: SessionParts) -> None:
        self.parts = parts
        self.by_id: dict[str, HttpSession] = {}
        # Keyed URLs by (owner, service, key): one user's key never names another's session.
        self.by_key: dict[tuple[str | None, str, str], HttpSession] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def create(
        self,
        service: str,
        key: str | None,
        query: dict[str, list[str]],
        *,
        registered: bool = False,
        client: Client | None = None,
        traceparent: str | None = None,
        owner: str | None = None,
    ) -> HttpSession:
        assert self._nursery is not None, "HttpSessions.run must be started first"
        settings = self.parts.settings
        limits = settings.limits
        channel = HttpChannel(
            inbox_bytes=limits.buffer_to_server_bytes,
            buffer_bytes=limits.buffer_to_client_bytes,
            backlog_bytes=limits.buffer_to_client_bytes,
            lease_seconds=settings.session_idle_seconds(service),
        )
        session = HttpSession(
            new_session_id(settings.replica),
            service,
            key,
            channel,
            query=query,
            registered=registered,
            client=client,
            traceparent=traceparent,
            owner=owner,
        )
        self.by_id[session.id] = session
        if key is not None:
            self.by_key[(owner, service, key)] = session
        self._nursery.start_soon(self._run_session, session)
        return session

    async def _run_session(self, session: HttpSession) -> None:
        try:
            # The session's machine ends it when its client stays away too long (its lease:
            # protocol/client_lease.py; see the module docs).
            await serve_session(
                self.parts,
                session.channel,
                session.service,
                session.query_mounts,
                session_id=session.id,
                transport="streamable-http",
                query=session.query,
                client=session.client,
                traceparent=session.traceparent,
                lease=session.channel,
            )
        finally:
            self.by_id.pop(session.id, None)
            keyed = (session.owner, session.service, session.key or "")
            if session.key is not None and self.by_key.get(keyed) is session:
                del self.by_key[keyed]
            with trio.CancelScope(shield=True):
                await session.channel.close(1000, "session ended")
            session.ended.set()

    async def terminate(self, session: HttpSession) -> None:
        await session.channel.close(1000, "deleted by the client")
        with trio.move_on_after(SESSION_END_BOUND_SECONDS):
            await session.ended.wait()

    def lookup(
        self,
        service: str,
        key: str | None,
        session_id: str | None,
        principal: Principal = TOKEN_HOLDER,
    ) -> HttpSession | None:
        """The session a request names: by its id, else by its URL key. Another user's is not
        found (its id is answered as an unknown one: nothing says it exists)."""
        if session_id is not None:
            session = self.by_id.get(session_id)
            if session is None or session.service != service:
                return None
            return session if principal.may_use(session.owner) else None
        if key is not None:
            return self.by_key.get((principal.user, service, key))
        return None


async def serve_streamable_http(
    sessions: HttpSessions,
    exchange: HttpExchange,
    *,
    service: str,
    key: str | None,
    principal: Principal = TOKEN_HOLDER,
) -> None:
    """Handle one HTTP request to ``/mcp/{service}[/{key}]`` from ``principal``."""
    if not await _admissible(exchange, key):
        return
    method = exchange.request.method
    if method == "POST":
        await _post(sessions, exchange, service, key, principal)
    elif method == "GET":
        await _get(sessions, exchange, service, key, principal)
    elif method == "DELETE":
        session_id = exchange.request.headers.get(SESSION_HEADER)
        session = sessions.lookup(service, key, session_id, principal)
        if session is None:
            await exchange.respond(404, b'{"error": "unknown or expired session"}')
            return
        if not await _owned(exchange, session, None):
            return
        await sessions.terminate(session)
        await exchange.respond(204)
    else:
        await exchange.respond(
            405, b'{"error": "method not allowed"}', headers=[(b"allow", b"GET, POST, DELETE")]
        )


async def _admissible(exchange: HttpExchange, key: str | None) -> bool:
    """The HTTP-level checks every request passes; answers and returns False when one fails."""
    # Origin, Host and the token were checked in front of every route (FabricApp, policy.auth).
    request = exchange.request
    version = request.headers.get(PROTOCOL_HEADER)
    if version is not None and version not in KNOWN_PROTOCOL_VERSIONS:
        error = InvalidRequest(
            f"unsupported MCP-Protocol-Version {version!r}",
            reason=UNSUPPORTED_PROTOCOL_VERSION,
            supported=sorted(KNOWN_PROTOCOL_VERSIONS),
        )
        await exchange.respond(400, error_response(None, error))
        return False
    if key is not None and KEY_PATTERN.fullmatch(key) is None:
        await exchange.respond(404, b'{"error": "not found"}')
        return False
    return True


def _starts_session(message: Peek) -> bool:
    return message.method == "initialize" or _registers(message)


def _registers(message: Peek) -> bool:
    """Whether the message is a ``fabric/registerClient`` (as a method or a tool call)."""
    if message.method == REGISTER_METHOD:
        return True
    if message.method == "tools/call":
        params = decode_params(message.params)
        return isinstance(params, dict) and params.get("name") == REGISTER_METHOD
    return False


async def _read_message(
    max_message_bytes: int, exchange: HttpExchange
) -> tuple[bytes, Peek] | None:
    """Check the POST's headers and read its one JSON-RPC message; None once answered."""
    headers = exchange.request.headers
    accept = headers.get(b"accept", "")
    if not any(kind in accept for kind in ("application/json", "text/event-stream", "*/*")):
        await exchange.respond(406, b'{"error": "Accept must allow application/json or SSE"}')
        return None
    if not headers.get(b"content-type", "").lower().startswith("application/json"):
        await exchange.respond(415, b'{"error": "Content-Type must be application/json"}')
        return None
    body = await exchange.read_body(max_message_bytes)  # BodyTooLarge → 413
    try:
        body.decode("utf-8")  # the relay forwards bytes: they must be text for the server
        return body, peek(body)
    except UnicodeDecodeError as exc:
        refusal: InvalidMessage = ParseError(f"not valid UTF-8: {exc.reason}", reason=INVALID_UTF8)
    except InvalidMessage as exc:
        refusal = exc
    await exchange.respond(400, error_response(refusal.request_id, refusal))
    return None


async def _session_for(  # noqa: PLR0917 (the request, what it asks for, and from whom)
    sessions: HttpSessions,
    exchange: HttpExchange,
    message: Peek,
    service: str,
    key: str | None,
    principal: Principal,
) -> HttpSession | None:
    """The message's session, created when the message may start one; None once answered."""
    headers = exchange.request.headers
    session = sessions.lookup(service, key, headers.get(SESSION_HEADER), principal)
    if session is not None:
        return session if await _owned(exchange, session, message) else None
    if headers.get(SESSION_HEADER) is not None:
        await exchange.respond(404, b'{"error": "unknown or expired session"}')
        return None
    request_id = message.id if message.kind == REQUEST else None
    if service not in sessions.parts.suite.mcp_services and service != FABRIC_ENDPOINT:
        await exchange.respond(200, error_response(request_id, service_not_found(service)))
        return None
    if key is None and not _starts_session(message):
        stateless_probe = message.method == "server/discover"
        error = InvalidRequest(
            "no Mcp-Session-Id: start a session with initialize (or fabric/registerClient), "
            f"or, for a stateless client, use a session URL: /mcp/{service}/<your-key>",
            reason=STATELESS_NEEDS_SESSION_URL if stateless_probe else SESSION_REQUIRED,
        )
        await exchange.respond(200, error_response(request_id, error))
        return None
    request = exchange.request
    return sessions.create(
        service,
        key,
        requested_options(request.query, request.headers),
        registered=_registers(message),
        client=client_of(sessions.parts.settings.token_id, request, "streamable-http", principal),
        traceparent=request.header(b"traceparent") or None,
        owner=principal.user,
    )


async def _owned(exchange: HttpExchange, session: HttpSession, message: Peek | None) -> bool:
    """Whether the request may use the session it found; answers and returns False if not.

    A request with the session's id is its client's (the id is a secret only the client that
    created the session was told). One without it reached the session by its URL key, and is
    checked by :func:`_same_owner`: another client is refused with -32004
    ``session_key_in_use`` — HTTP 200 for a POST, as every refusal; 409 for a GET or DELETE,
    which carry no JSON-RPC request to answer.
    """
    request = exchange.request
    if request.headers.get(SESSION_HEADER) is not None:
        return True
    if _same_owner(session, message, requested_options(request.query, request.headers)):
        return True
    request_id = message.id if message is not None and message.kind == REQUEST else None
    taken = SecurityViolation(
        f"the session URL key {session.key!r} is in use by another client (other mounts, tools "
        "or profile in the URL, a new registration, or a session registered with mounts in its "
        "body, which only its Mcp-Session-Id reaches); pick another key",
        reason=SESSION_KEY_IN_USE,
        key=session.key,
    )
    await exchange.respond(200 if message is not None else 409, error_response(request_id, taken))
    return False


def _same_owner(session: HttpSession, message: Peek | None, query: dict[str, list[str]]) -> bool:
    """Whether a request on a keyed URL, without the session's id, comes from the client that
    created the session, as far as it shows: the same mounts, tools and profile in the URL as
    the creating request; a session whose mounts came in a registration body is no one else's
    to reach by its key alone (a request with no ``?mount=`` would look the same as its owner);
    and no second registration (which would declare other mounts the session would silently
    ignore)."""
    if any(query.get(name, []) != session.query.get(name, []) for name in OWNER_PARAMETERS):
        return False
    if session.registered:
        return False
    return not (message is not None and session.started and _registers(message))


async def _post(
    sessions: HttpSessions,
    exchange: HttpExchange,
    service: str,
    key: str | None,
    principal: Principal,
) -> None:
    read = await _read_message(sessions.parts.settings.limits.max_message_bytes, exchange)
    if read is None:
        return
    body, message = read
    session = await _session_for(sessions, exchange, message, service, key, principal)
    if session is None:
        return
    session_header = [(SESSION_HEADER, session.id.encode())]
    first = not session.started
    session.started = True
    channel = session.channel
    if message.kind != REQUEST:
        try:
            await channel.submit(body, message)
        except ChannelClosed:
            await exchange.respond(404, b'{"error": "session ended"}')
            return
        await exchange.respond(202, headers=session_header)
        return
    assert message.id is not None
    if channel.in_flight(message.id):
        # The first line: a live POST waits on this id. (One whose client left is no longer
        # waited on here, but the session's machine still has the request in flight, and
        # refuses the duplicate itself, with the same error.)
        duplicate = duplicate_request(message.id)
        await exchange.respond(400, error_response(message.id, duplicate), headers=session_header)
        return
    accept = exchange.request.headers.get(b"accept", "")
    waiter = channel.expect(message.id, streaming="text/event-stream" in accept and not first)
    try:
        await channel.submit(body, message)
    except ChannelClosed:
        channel.abandon(waiter)
        await exchange.respond(404, b'{"error": "session ended"}')
        return
    except BaseException:
        channel.abandon(waiter)
        raise
    _defer_answer(exchange, channel, waiter, session, message.id)


def _defer_answer(
    exchange: HttpExchange,
    channel: HttpChannel,
    waiter: Waiter,
    session: HttpSession,
    request_id: RequestId,
) -> None:
    """Leave the POST's answer to the task that delivers its response (HttpExchange.defer):
    a response that comes alone is written by that task at once; anything else — a message
    before it (an SSE stream), the session ending, a client that left or reads slowly — is
    answered by :func:`_answer` in the connection's handler task, as if it had waited."""
    queue = waiter.queue

    def delivered() -> None:  # (the queue's wake: called on each change, in the deliverer)
        queue.wake = None
        frames = queue.frames
        if len(frames) == 1 and frames[0] is waiter.response:
            channel.abandon(waiter)
            exchange.answer_now(200, waiter.response, [(SESSION_HEADER, session.id.encode())])
        else:
            exchange.wake()

    async def resume() -> None:
        try:
            await _answer(exchange, waiter, session, request_id=request_id)
        finally:
            channel.abandon(waiter)

    def drop() -> None:
        queue.wake = None
        channel.abandon(waiter)

    exchange.defer(resume, drop)
    if queue.frames or queue.closed:  # (answered already, in this task)
        delivered()
    else:
        queue.wake = delivered


async def _answer(
    exchange: HttpExchange, waiter: Waiter, session: HttpSession, *, request_id: object
) -> None:
    """The POST's answer: plain JSON when the response comes first, else an SSE stream.

    Most requests get nothing but their response; answering those with one JSON body saves
    the stream's extra writes (the client accepts both; the choice is the server's, per
    request).
    """
    session_header = [(SESSION_HEADER, session.id.encode())]
    first = await next_frame(exchange, waiter.queue)
    if first is None:
        # The session ended before answering (the machine answers what it can first; this is
        # a session closed under the request: DELETE, expiry).
        error = InvalidRequest("the session ended before answering", reason=SESSION_ENDED)
        await exchange.respond(404, error_response(request_id, error), headers=session_header)
        return
    if first is waiter.response:
        await exchange.respond(200, first, headers=session_header)
        return
    await exchange.start(200, _event_stream_headers(session.id))
    await exchange.send(sse_event(first))
    while (frame := await next_frame(exchange, waiter.queue)) is not None:
        await exchange.send(sse_event(frame))
    await exchange.end()


async def next_frame(exchange: HttpExchange, queue: FrameQueue[bytes]) -> bytes | None:
    """The next frame for a POST (None once its queue is closed and empty), or ClientGone if
    the client hangs up first.

    One event wakes the POST for both: a change of its queue, or of its connection (which the
    connection's reader watches all the time). (A task per POST to watch the connection — a
    nursery, a spawn and a cancellation per call — and then a watch set up and cancelled per
    call were each a good part of a small call's cost.)
    """

    def wake(callback: Callable[[], None]) -> None:
        queue.wake = callback

    try:
        while not queue.frames and not queue.closed:
            await exchange.wait_for(wake)
    finally:
        queue.wake = None
    return await queue.get()


def _event_stream_headers(session_id: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-store"),
        (SESSION_HEADER, session_id.encode()),
    ]


def sse_event(frame: bytes) -> bytes:
    return b"event: message\ndata: " + frame + b"\n\n"


async def _get(
    sessions: HttpSessions,
    exchange: HttpExchange,
    service: str,
    key: str | None,
    principal: Principal,
) -> None:
    headers = exchange.request.headers
    if "text/event-stream" not in headers.get(b"accept", ""):
        await exchange.respond(406, b'{"error": "Accept must allow text/event-stream"}')
        return
    session = sessions.lookup(service, key, headers.get(SESSION_HEADER), principal)
    if session is None:
        status = 404 if headers.get(SESSION_HEADER) or key else 400
        await exchange.respond(status, b'{"error": "unknown or missing session"}')
        return
    if not await _owned(exchange, session, None):
        return
    channel = session.channel
    await exchange.start(200, _event_stream_headers(session.id))
    channel.stream_opened()
    try:
        async with trio.open_nursery() as nursery:

            async def watch_disconnect() -> None:
                await exchange.wait_disconnect()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_disconnect)
            await _pump_backlog(exchange, channel)
            nursery.cancel_scope.cancel()
    finally:
        channel.stream_closed()
    if not exchange.disconnected.is_set():
        await exchange.end()


async def _pump_backlog(exchange: HttpExchange, channel: HttpChannel) -> None:
    """Server-initiated messages onto the GET stream until the session ends."""
    while True:
        frame: bytes | None = None
        with trio.move_on_after(SSE_KEEPALIVE_SECONDS) as idle:
            frame = await channel.backlog.get()
            if frame is None:
                return  # the session ended
        if idle.cancelled_caught:
            # Nothing to say for a while: an SSE comment keeps proxies from closing the stream.
            await exchange.send(b": keepalive\n\n")
            continue
        assert frame is not None
        await exchange.send(sse_event(frame))
