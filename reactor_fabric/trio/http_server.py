"""The orchestrator's HTTP/1.1 server: protocol/http1.py for the protocol, trio for the bytes.

Why not an ASGI server: the relay needs what the ASGI layer hides — a write to a client that can
be cancelled and is bounded in time (a client that stops reading must not hold a shutdown), a
WebSocket close handshake that completes before TCP is closed, a cap on connections, deadlines on
every read, and no task switch or dict-shaped message per frame. The sans-I/O connection
(llhttp's parser, through httptools) and wsproto do the protocols; this module only moves bytes.

Ownership tree::

    serve_http (listener task)
    └── one task per connection: serve_connection
        ├── its reader (ConnectionReader.run): the one task reading the socket, feeding the parser
        ├── requests in turn (keep-alive): app.http(exchange), the one writer
        └── or, after an Upgrade (the reader stopped): app.websocket(request, stream, trailing)
            owns the stream

Why a reader task of its own: the connection is read all the time, also while a request is
answered, which is how a client that leaves is noticed (its POST's call is then abandoned). A
handler that watched the socket itself while it waited set up and cancelled a wait per request,
a good part of a small POST's cost; here a handler waits for one event that either its answer
or the reader sets.

Resource handling: every connection's stream is closed in a ``finally``, bounded in time; the
number of open connections is capped (beyond it a connection gets a 503 and is closed); what a
client sends ahead of its answer is read only up to ``HttpLimits.read_ahead_bytes``.

Error handling: a malformed request is answered 400 and the connection closed; a handler that
fails is logged with its traceback and answered 500 if it had not answered yet. Nothing a client
sends reaches the listener task.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

import trio

from .._reasons import TOO_MANY_CONNECTIONS
from .._sockets import LeanSocketStream, send_what_fits
from ..protocol.http1 import (
    CLOSED,
    MESSAGE_END,
    NEED_DATA,
    BodyData,
    Event,
    HttpError,
    RequestHead,
    ServerConnection,
)

log = logging.getLogger(__name__)

READ_CHUNK = 65536


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 512
    max_header_bytes: int = 16 * 1024
    # A new connection must send its request head within this; later requests on a kept-alive
    # connection may come this long after the previous answer.
    header_timeout: float = 10.0
    keepalive_timeout: float = 5.0
    body_timeout: float = 30.0
    write_timeout: float = 30.0
    # While a request is answered, the connection is read to notice the client leaving; what
    # the client sends meanwhile (a pipelined request) is kept up to this, then no longer read.
    read_ahead_bytes: int = 256 * 1024


class ClientGone(Exception):
    """The client closed the connection, or stopped reading it for longer than allowed."""


class BodyTooLarge(Exception):
    pass


@dataclass(frozen=True)
class Request:
    method: str
    target: str  # as sent (path and query)
    path: str  # percent-decoded
    query: str
    headers: dict[bytes, str]  # lower-case names; the last of repeated headers wins
    raw_headers: list[tuple[bytes, bytes]]
    peer: str = ""  # the client's address:port

    @classmethod
    def from_head(cls, head: RequestHead, peer: str = "") -> Request:
        target = head.target.decode("latin-1")
        raw_path, _, query = target.partition("?")
        raw_headers = head.headers
        return cls(
            method=head.method,
            target=target,
            path=unquote(raw_path),
            query=query,
            headers={name: value.decode("latin-1") for name, value in raw_headers},
            raw_headers=raw_headers,
            peer=peer,
        )

    def header(self, name: bytes, default: str = "") -> str:
        return self.headers.get(name, default)

    @property
    def is_websocket_upgrade(self) -> bool:
        return (
            self.method == "GET"
            and self.header(b"upgrade").lower() == "websocket"
            and "upgrade" in self.header(b"connection").lower()
        )


class ConnectionReader:
    """The one task that reads a connection and feeds its parser, for the connection's life.

    It stops reading when what the client sent ahead (parsed, not yet taken by the handler)
    exceeds ``read_ahead_bytes`` until the handler takes some; for good once the client closes
    its side (:attr:`gone` is set), sends what is not HTTP (:attr:`error`), or switches
    protocols (the Upgrade's bytes stay in the parser's ``trailing``).

    Waiting: :meth:`changed` returns after the next change (bytes parsed, the end); a handler
    waiting for something else too sets :attr:`on_change`, called on every change.
    """

    def __init__(
        self, stream: trio.abc.Stream, connection: ServerConnection, limits: HttpLimits
    ) -> None:
        self._stream = stream
        self._connection = connection
        self._limits = limits
        self.gone = trio.Event()  # the client closed the connection (or it broke)
        self.error: HttpError | None = None  # what it sent was not HTTP/1.1
        self.stopped = False  # no more reads: gone, error, upgrade, or cancelled
        self.on_change: Callable[[], None] | None = None
        self._changed: trio.Event | None = None  # made only when a task waits for a change
        self._room: trio.Event | None = None  # set when the handler took what was ahead

    async def run(self) -> None:
        connection = self._connection
        try:
            while True:
                while connection.buffered_bytes > self._limits.read_ahead_bytes:
                    self._room = trio.Event()
                    await self._room.wait()
                data = await _receive(self._stream)
                if not data:
                    self.gone.set()
                    return
                try:
                    connection.receive(data)
                except HttpError as exc:
                    self.error = exc
                    return
                if connection.upgraded:
                    return
                self._notify()
        finally:
            self.stopped = True
            self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()
        if self.on_change is not None:
            self.on_change()

    async def changed(self) -> None:
        """Wait for the next change (at once when there will be none)."""
        if self.stopped:
            await trio.lowlevel.checkpoint()
            return
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def next_event(self) -> Event:
        """The connection's next event (see ServerConnection.next_event), letting the reader
        go on once the handler has taken what was ahead."""
        event = self._connection.next_event()
        room = self._room
        if room is not None and self._connection.buffered_bytes <= self._limits.read_ahead_bytes:
            self._room = None
            room.set()
        return event


class HttpExchange:
    """One request on a connection, and the means to answer it.

    A handler answers either at once (:meth:`respond`) or as a stream (:meth:`start`,
    :meth:`send`, :meth:`end`; HTTP/1.1 chunked). :meth:`wait_disconnect` returns when the client
    goes away, so a handler can stop waiting for something the client no longer wants.
    """

    def __init__(
        self,
        connection: ServerConnection,
        stream: trio.abc.Stream,
        request: Request,
        limits: HttpLimits,
        reader: ConnectionReader,
    ) -> None:
        self._connection = connection
        self._stream = stream
        self.request = request
        self._limits = limits
        self._reader = reader
        self.started = False
        self.ended = False
        self._body_done = False
        self.disconnected = reader.gone

    async def _write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()  # as send_all would
        try:
            # Usually the kernel takes a whole answer at once: no deadline to arm then (a
            # cancel scope per answer is a good part of a small call's cost). A stream that
            # cannot write without waiting (not a socket) takes the bounded path.
            sent = send_what_fits(self._stream, data)
            if sent < len(data):
                with trio.fail_after(self._limits.write_timeout):
                    await self._stream.send_all(memoryview(data)[sent:])
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.disconnected.set()
            raise ClientGone(str(exc) or type(exc).__name__) from exc

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; BodyTooLarge beyond ``limit``; ClientGone if it stops."""
        connection = self._connection
        if connection.waiting_for_continue:
            await self._write(connection.continue_())
        reader = self._reader
        body = bytearray()
        # A small body usually came with the head: no deadline to arm until a read must wait.
        deadline = None
        while True:
            event = reader.next_event()
            if event is NEED_DATA:
                if reader.error is not None:
                    raise ClientGone(f"a malformed request body: {reader.error}")
                if reader.stopped:
                    raise ClientGone("the client closed the connection mid-request")
                if deadline is None:
                    deadline = trio.current_time() + self._limits.body_timeout
                with trio.move_on_at(deadline) as waited:
                    await reader.changed()
                if waited.cancelled_caught:
                    raise ClientGone(
                        f"the body did not arrive within {self._limits.body_timeout:g} s"
                    )
                continue
            if isinstance(event, BodyData):
                body += event.data
                if len(body) > limit:
                    raise BodyTooLarge(f"the body exceeds {limit} bytes")
            elif event is MESSAGE_END:
                self._body_done = True
                return bytes(body)
            else:
                raise ClientGone(f"unexpected {event!r} in a request body")

    async def discard_body(self, limit: int, seconds: float) -> None:
        """Read what the client sends of its body and drop it, at most ``limit`` bytes for at
        most ``seconds``, before a refusal is answered (a client waiting for ``100 Continue``
        sends nothing: nothing to read). A connection closed with its request unread is
        *reset*, and the client may then lose the answer itself: Node's fetch (Claude Code)
        reported ECONNRESET instead of the 401 it was sent. Read, the request is whole, and the
        connection may even carry the next one."""
        if self._body_done or self._connection.waiting_for_continue:
            return
        with trio.move_on_after(seconds):
            with contextlib.suppress(BodyTooLarge, ClientGone):
                await self.read_body(limit)

    async def respond(
        self,
        status: int,
        body: bytes = b"",
        *,
        content_type: bytes = b"application/json",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """The whole answer in one write."""
        all_headers = [
            (b"content-type", content_type),
            (b"cache-control", b"no-store"),
            *(headers or []),
        ]
        data = self._connection.respond(status, all_headers, body)
        self.started = self.ended = True
        await self._write(data)

    async def respond_json(
        self, status: int, body: dict[str, Any], *, allow: str | None = None
    ) -> None:
        """A JSON answer (``allow``: the ``Allow`` header of a 405)."""
        headers = [(b"allow", allow.encode())] if allow is not None else []
        await self.respond(status, json.dumps(body).encode(), headers=headers)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Start a streamed answer (chunked): then :meth:`send` pieces and :meth:`end`."""
        data = self._connection.start(status, headers)
        self.started = True
        await self._write(data)

    async def send(self, data: bytes) -> None:
        await self._write(self._connection.send(data))

    async def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        await self._write(self._connection.end())

    async def wait_disconnect(self) -> None:
        """Return once the client has closed the connection.

        What it sends meanwhile is kept for the next request (pipelining), up to
        ``read_ahead_bytes``; beyond that, or after something that is not HTTP, the connection
        is no longer read (the client waits on TCP's flow control) and this waits until
        cancelled: the answer still goes out, and the connection is closed after it if broken.
        """
        reader = self._reader
        while not reader.gone.is_set():
            if reader.stopped:
                await trio.sleep_forever()
            await reader.changed()

    async def wait_for(self, wake: Callable[[Callable[[], None]], None]) -> None:
        """Wait until something else calls the function handed to ``wake`` (which registers it
        where the change will come from), or the connection changes; ClientGone once the
        client has left. (One event for both, no watch set up and cancelled per wait.)"""
        if self.disconnected.is_set():
            raise ClientGone("the client closed the connection while its request was in flight")
        event = trio.Event()
        reader = self._reader
        wake(event.set)
        reader.on_change = event.set
        try:
            await event.wait()
        finally:
            reader.on_change = None
        if self.disconnected.is_set():
            raise ClientGone("the client closed the connection while its request was in flight")

    @property
    def reusable(self) -> bool:
        """Whether the connection can carry another request after this one."""
        return self._connection.reusable


async def _receive(stream: trio.abc.Stream) -> bytes:
    try:
        data = await stream.receive_some(READ_CHUNK)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""
    return data if isinstance(data, bytes) else bytes(data)


class HttpApp(Protocol):
    async def http(self, exchange: HttpExchange) -> None: ...

    async def websocket(self, request: Request, stream: trio.abc.Stream, trailing: bytes) -> None:
        """Own ``stream`` after an Upgrade request (its head is read; ``trailing`` follows it)."""


class ConnectionCounts:
    """Open connections, and how many of them are busy (in a request or a WebSocket).

    ``on_change`` is called whenever a count changes (a shutdown waits for them to go down).
    """

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self.open = 0
        self.busy = 0
        self._on_change = on_change

    def _notify(self) -> None:
        if self._on_change is not None:
            self._on_change()


async def serve_http(
    listener: socket.socket,
    app: HttpApp,
    limits: HttpLimits,
    connections: trio.Nursery,
    counts: ConnectionCounts,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on the (listening, non-blocking) ``listener`` until cancelled; each
    connection runs in ``connections``, not here, as a :class:`~.._sockets.LeanSocketStream`.

    Cancelling this task stops accepting and leaves the open connections alone, so that a
    shutdown can let them finish their answers first. Reports started once accepting.
    """

    async def connection_task(stream: LeanSocketStream) -> None:
        try:
            await serve_connection(stream, app, limits, counts)
        finally:
            counts.open -= 1
            counts._notify()

    task_status.started()
    while True:
        try:
            accepted, _address = listener.accept()
        except BlockingIOError:
            await trio.lowlevel.wait_readable(listener)
            continue
        except OSError as exc:
            # Out of file descriptors and the like: wait a little rather than spin.
            log.error("accept_failed", extra={"detail": str(exc)})
            await trio.sleep(0.1)
            continue
        stream = LeanSocketStream(accepted)
        if counts.open >= limits.max_connections:
            connections.start_soon(_refuse_connection, stream)
            continue
        counts.open += 1
        counts._notify()
        connections.start_soon(connection_task, stream)


def peer_of(stream: trio.abc.Stream) -> str:
    """``address:port`` of the other end of a socket stream ("" when it has no socket)."""
    sock = getattr(stream, "socket", None)
    try:
        address = sock.getpeername() if sock is not None else None
    except OSError:
        return ""
    if isinstance(address, tuple) and len(address) >= 2:
        host = f"[{address[0]}]" if ":" in str(address[0]) else str(address[0])
        return f"{host}:{address[1]}"
    return str(address or "")


async def _refuse_connection(stream: trio.abc.Stream) -> None:
    body = b'{"error": "too many connections; try again later"}'
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"connection: close\r\nretry-after: 1\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    with trio.move_on_after(1):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(head + body)
    with trio.move_on_after(1) as scope:
        scope.shield = True
        await stream.aclose()
    log.warning("connection_refused", extra={"reason": TOO_MANY_CONNECTIONS})


async def serve_connection(
    stream: trio.abc.Stream,
    app: HttpApp,
    limits: HttpLimits,
    counts: ConnectionCounts | None = None,
) -> None:
    """One client connection: requests in turn, until it closes, fails, or upgrades."""
    counts = counts or ConnectionCounts()
    connection = ServerConnection(max_head_bytes=limits.max_header_bytes)
    upgrade: Request | None = None
    try:
        async with trio.open_nursery() as nursery:
            reader = ConnectionReader(stream, connection, limits)
            nursery.start_soon(reader.run)
            upgrade = await _serve_requests(
                app, stream, connection, reader, limits=limits, counts=counts
            )
            nursery.cancel_scope.cancel()  # (after an Upgrade the reader has stopped already)
        if upgrade is not None:
            try:
                await app.websocket(upgrade, stream, connection.trailing)
            finally:
                counts.busy -= 1  # (counted busy by _serve_requests)
                counts._notify()
    finally:
        if upgrade is None:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()


async def _serve_requests(
    app: HttpApp,
    stream: trio.abc.Stream,
    connection: ServerConnection,
    reader: ConnectionReader,
    *,
    limits: HttpLimits,
    counts: ConnectionCounts,
) -> Request | None:
    """Requests in turn until the connection ends; a WebSocket upgrade request when one comes
    (the reader has stopped at it; the connection is counted busy for the WebSocket)."""
    peer = peer_of(stream)
    deadline = limits.header_timeout
    # The wait for each request head is bounded by one scope for the connection, its deadline
    # moved per request (a scope entered and left per request costs several times as much).
    waiting = trio.CancelScope()
    try:
        with waiting:
            while True:
                waiting.deadline = trio.current_time() + deadline
                head = await _next_request(reader)
                if waiting.cancel_called:  # (the deadline passed as the head came: too late)
                    return None
                waiting.deadline = math.inf
                if head is None:
                    return None
                deadline = limits.keepalive_timeout
                request = Request.from_head(head, peer)
                counts.busy += 1
                if head.upgrade and request.is_websocket_upgrade:
                    return request
                try:
                    if head.upgrade and _has_body(request):
                        # Another protocol than WebSocket (h2c, CONNECT) is not switched to;
                        # the request is answered as HTTP/1.1 when it has no body (which the
                        # parser, stopped at the Upgrade, has not read), refused when it has.
                        raise HttpError("an Upgrade other than WebSocket, with a body")
                    exchange = HttpExchange(connection, stream, request, limits, reader)
                    if not await _serve_request(app, exchange):
                        return None
                finally:
                    counts.busy -= 1
                    counts._notify()
                connection.start_next_cycle()
    except HttpError as exc:
        await _bad_request(connection, stream, exc)
    return None


async def _serve_request(app: HttpApp, exchange: HttpExchange) -> bool:
    """Run the handler for one request; whether the connection can carry another."""
    request = exchange.request
    failed: tuple[int, bytes] | None = None
    gone = False
    try:
        await app.http(exchange)
    except* ClientGone:
        gone = True
    except* BodyTooLarge:
        failed = 413, b'{"error": "request body too large"}'
    except* Exception as failure:
        log.error(
            "http_handler_crashed",
            extra={"path": request.path, "method": request.method},
            exc_info=failure,
        )
        failed = 500, b'{"error": "internal error"}'
    if gone:
        return False
    if failed is not None:
        await _answer_if_unanswered(exchange, *failed)
        return False
    if not exchange.started:
        await _answer_if_unanswered(exchange, 500, b'{"error": "no answer"}')
        return False
    return exchange.reusable


async def _answer_if_unanswered(exchange: HttpExchange, status: int, body: bytes) -> None:
    if not exchange.started:
        with contextlib.suppress(ClientGone):
            await exchange.respond(status, body, headers=[(b"connection", b"close")])


async def _next_request(reader: ConnectionReader) -> RequestHead | None:
    """The next request head, or None when the client is done (the caller bounds the wait).

    Raises HttpError for what is not HTTP/1.1.
    """
    while True:
        event = reader.next_event()
        if event is NEED_DATA:
            if reader.error is not None:
                raise reader.error
            if reader.stopped:
                return None
            await reader.changed()
            continue
        if isinstance(event, RequestHead):
            return event
        if event is CLOSED:
            return None
        # A body (or its end) left unread by the previous request cannot be here: a connection
        # is reused only once its request was read whole.
        raise HttpError(f"unexpected {event!r} before a request head")


def _has_body(request: Request) -> bool:
    headers = request.headers
    return b"transfer-encoding" in headers or headers.get(b"content-length", "0").strip() != "0"


async def _bad_request(
    connection: ServerConnection, stream: trio.abc.Stream, exc: HttpError
) -> None:
    """Answer a request that is not HTTP/1.1 (when nothing was answered yet), then close."""
    if connection.answer_started:
        return
    body = b'{"error": "malformed HTTP request"}'
    data = connection.respond(
        exc.status,
        [(b"content-type", b"application/json"), (b"connection", b"close")],
        body,
    )
    with trio.move_on_after(1):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(data)


Handler = Callable[[HttpExchange], Awaitable[None]]
