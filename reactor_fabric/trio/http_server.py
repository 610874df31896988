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
        ├── requests in turn (keep-alive): app.http(exchange), the one writer — or,
        │   for a deferred answer, the task that has it, while this one waits
        └── or, after an Upgrade (the reader stopped): app.websocket(request, stream, trailing)
            owns the stream

Why a reader task of its own: the connection is read all the time, also while a request is
answered, which is how a client that leaves is noticed (its POST's call is then abandoned). A
handler that watched the socket itself while it waited set up and cancelled a wait per request,
a good part of a small POST's cost; here a handler waits for one event that either its answer
or the reader sets.

A handler whose answer comes from another task may return before it comes
(:meth:`~.http_exchange.HttpExchange.defer`): a POST's response is then written by the task
that delivers it, and the request ended there (:class:`_RequestLoop`), without the handler
task waking for it — one trip through trio's scheduler fewer per request. Meanwhile the
handler task waits for the next request head, which the parser gives only once the answer is
written (pipelining keeps its order); anything but a whole answer the kernel takes at once
goes back to it, and it runs the handler's continuation.

Resource handling: every connection's stream is closed in a ``finally``, bounded in time; the
number of open connections is capped (beyond it a connection gets a 503 and is closed); what a
client sends ahead of its answer is read only up to ``HttpLimits.read_ahead_bytes``.

Error handling: a malformed request is answered 400 and the connection closed; a handler that
fails is logged with its traceback and answered 500 if it had not answered yet. Nothing a client
sends reaches the listener task.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from .._reasons import TOO_MANY_CONNECTIONS
from .._sockets import LeanSocketStream
from ..protocol.http1 import (
    CLOSED,
    NEED_DATA,
    HttpError,
    RequestHead,
    ServerConnection,
)
from .http_exchange import (
    BodyTooLarge,
    ClientGone,
    ConnectionReader,
    HttpExchange,
    HttpLimits,
    Request,
)

__all__ = [
    "BodyTooLarge",
    "ClientGone",
    "ConnectionCounts",
    "HttpApp",
    "HttpExchange",
    "HttpLimits",
    "Request",
    "serve_connection",
    "serve_http",
]

log = logging.getLogger(__name__)


class HttpApp(Protocol):
    async def http(self, exchange: HttpExchange) -> None: ...

    def answers_at_once(self, head: RequestHead) -> bool:
        """Whether :meth:`http` answers this request (whole, with its body) without waiting
        for anything from its client — at once, or deferred (HttpExchange.defer): it may then
        run in the task reading the connection, which saves waking the connection's handler
        task. (It must not wait long: the connection is not read meanwhile.)"""

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
            upgrade = await _RequestLoop(app, stream, connection, reader, limits, counts).serve()
            nursery.cancel_scope.cancel()  # (after an Upgrade the reader has stopped already)
        if upgrade is not None:
            try:
                await app.websocket(upgrade, stream, connection.trailing)
            finally:
                counts.busy -= 1  # (counted busy by _RequestLoop)
                counts._notify()
    finally:
        if upgrade is None:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()


class _RequestLoop:
    """One connection's requests, in turn, in its handler task — and the end of a request
    whose answer another task wrote (:meth:`HttpExchange.defer`), which that task completes
    here without waking the handler task (:meth:`_answered`)."""

    def __init__(  # noqa: PLR0917 (the connection's parts, each used)
        self,
        app: HttpApp,
        stream: trio.abc.Stream,
        connection: ServerConnection,
        reader: ConnectionReader,
        limits: HttpLimits,
        counts: ConnectionCounts,
    ) -> None:
        self.app = app
        self.stream = stream
        self.connection = connection
        self.reader = reader
        self.limits = limits
        self.counts = counts
        # The wait for each request head is bounded by one scope for the connection, its
        # deadline moved per request (a scope entered and left per request costs several times
        # as much).
        self.waiting = trio.CancelScope()
        self.deferred: HttpExchange | None = None  # a request whose answer is still to come
        self.closing = False  # a request answered outside this task was the connection's last
        self.peer = peer_of(stream)

    async def serve(self) -> Request | None:
        """Requests in turn until the connection ends; a WebSocket upgrade request when one
        comes (the reader has stopped at it; the connection is counted busy for the
        WebSocket)."""
        self.reader.serve_here = self.serve_here
        try:
            return await self._run()
        finally:
            self.reader.serve_here = None
            self.drop_deferred()

    async def _run(self) -> Request | None:
        waiting, connection, counts = self.waiting, self.connection, self.counts
        waiting.deadline = trio.current_time() + self.limits.header_timeout
        try:
            with waiting:
                while True:
                    head = await self._next_request()
                    if waiting.cancel_called:  # (the deadline passed as the head came: too late)
                        return None
                    if head is None:
                        return None
                    waiting.deadline = math.inf
                    request = Request.from_head(head, self.peer)
                    counts.busy += 1
                    if head.upgrade and self._upgrades(request):
                        return request
                    if not await self._serve(request):
                        return None
        except HttpError as exc:
            await _bad_request(connection, self.stream, exc)
        return None

    async def serve_here(self) -> bool:
        """Serve the request the reader has just parsed whole in the reader's own task, when
        the app answers it without waiting for its client (HttpApp.answers_at_once) and no
        request is current: whether it did. The handler task, waiting for a request head,
        is then not woken at all (one trip through trio's scheduler fewer per request); it
        still takes over whatever this leaves to it (a deferred answer handed back, the end
        of the connection)."""
        if self.deferred is not None or self.closing:
            return False
        head = self.connection.whole_request()
        if head is None or not self.app.answers_at_once(head):
            return False
        taken = self.reader.next_event()
        assert taken is head
        self.waiting.deadline = math.inf
        self.counts.busy += 1
        if not await self._serve(Request.from_head(head, self.peer)):
            self.closing = True
            self.reader.wake()
        return True

    async def _serve(self, request: Request) -> bool:
        """One request (counted busy already), in whichever task took it; whether the
        connection carries another (or waits for this one's deferred answer)."""
        exchange = HttpExchange(self.connection, self.stream, request, self.limits, self.reader)
        try:
            reusable = await _run_handler(exchange, functools.partial(self.app.http, exchange))
        except BaseException:
            self._end_request()
            raise
        if reusable is None:  # deferred: its answer ends the request
            self._defer(exchange)
            return True
        return self._finish(reusable)

    def _upgrades(self, request: Request) -> bool:
        """Whether a request asking to switch protocols switches to a WebSocket.

        Another protocol than WebSocket (h2c, CONNECT) is not switched to; the request is
        answered as HTTP/1.1 when it has no body (which the parser, stopped at the Upgrade, has
        not read), refused (HttpError) when it has.
        """
        if request.is_websocket_upgrade:
            return True
        if _has_body(request):
            self._end_request()
            raise HttpError("an Upgrade other than WebSocket, with a body")
        return False

    def _end_request(self) -> None:
        self.counts.busy -= 1
        self.counts._notify()

    def _finish(self, reusable: bool) -> bool:
        """The request is over: whether the connection carries another (then its head is
        waited for from now, up to the keep-alive deadline)."""
        self._end_request()
        if not reusable:
            return False
        self.connection.start_next_cycle()
        self.waiting.deadline = trio.current_time() + self.limits.keepalive_timeout
        return True

    def _defer(self, exchange: HttpExchange) -> None:
        if exchange.answered_now:  # (written before its handler returned)
            self._answered(exchange)
            return
        self.deferred = exchange
        exchange.on_answered = self._answered

    def _answered(self, exchange: HttpExchange) -> None:
        """A deferred answer was written whole by the task that had it: the request is over
        (called in that task; the handler task is woken only if it has something to do)."""
        if self.deferred is exchange:
            self.deferred = None
        if not self._finish(exchange.reusable):
            self.closing = True
            self.reader.wake()
        elif self.connection.has_events:  # (a pipelined request is waiting)
            self.reader.wake()

    def drop_deferred(self) -> None:
        """The connection ends with an answer still to come: nobody writes it any more."""
        deferred, self.deferred = self.deferred, None
        if deferred is not None:
            deferred.on_answered = None
            if deferred.drop is not None:
                deferred.drop()
            self._end_request()

    async def _next_request(self) -> RequestHead | None:
        """The next request head, or None when the client is done (the caller bounds the
        wait); a deferred answer handed back meanwhile is completed first.

        Raises HttpError for what is not HTTP/1.1.
        """
        reader = self.reader
        while True:
            if self.closing:
                return None
            deferred = self.deferred
            if deferred is not None:
                if not (deferred.resume_wanted or reader.stopped):
                    # (the parser gives no next head before this answer is written)
                    await reader.changed()
                    continue
                self.deferred = None
                deferred.on_answered = None
                try:
                    reusable = await _complete_deferred(deferred)
                except BaseException:
                    self._end_request()
                    raise
                if not self._finish(reusable):
                    return None
                continue
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
            # A body (or its end) left unread by the previous request cannot be here: a
            # connection is reused only once its request was read whole.
            raise HttpError(f"unexpected {event!r} before a request head")


async def _complete_deferred(exchange: HttpExchange) -> bool:
    """The handler task's end of a deferred answer (see :meth:`HttpExchange.defer`): the rest
    of an answer the kernel did not take at once, or the handler's continuation. Whether the
    connection can carry another request."""
    if exchange.started:  # written from the other task, not whole (or the write failed)
        if exchange.drop is not None:
            exchange.drop()
        try:
            await exchange.send_unsent()
        except ClientGone:
            return False
        return exchange.reusable
    assert exchange.resume is not None
    return bool(await _run_handler(exchange, exchange.resume, deferring=False))


async def _run_handler(
    exchange: HttpExchange, handler: Callable[[], Awaitable[None]], *, deferring: bool = True
) -> bool | None:
    """Run a handler for one request (or, not ``deferring``, a deferred one's continuation);
    whether the connection can carry another; None when the handler deferred its answer."""
    request = exchange.request
    failed: tuple[int, bytes] | None = None
    gone = False
    try:
        await handler()
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
    if deferring and exchange.resume is not None:
        return None  # (answered already, perhaps: the request loop looks)
    if not exchange.started:
        await _answer_if_unanswered(exchange, 500, b'{"error": "no answer"}')
        return False
    return exchange.reusable


async def _answer_if_unanswered(exchange: HttpExchange, status: int, body: bytes) -> None:
    if not exchange.started:
        with contextlib.suppress(ClientGone):
            await exchange.respond(status, body, headers=[(b"connection", b"close")])


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
