"""One request on a connection and the means to answer it; the task that reads the connection.

:class:`ConnectionReader` is the one task reading a connection and feeding its parser;
:class:`HttpExchange` is what a handler gets: the request, its body, its answer (whole, streamed,
or deferred to the task that has it), and the client's leaving. The connection's request loop
(:mod:`.http_server`) makes one per request.

Resource handling: nothing here owns the stream (the connection does); every read of a body and
every write that has to wait is bounded in time (``HttpLimits``).

Error handling: a client that leaves or stops reading is :class:`ClientGone`; a body over its
bound :class:`BodyTooLarge`; the request loop answers both.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import trio

from .._sockets import send_what_fits
from ..protocol.http1 import (
    MESSAGE_END,
    NEED_DATA,
    BodyData,
    Event,
    HttpError,
    RequestHead,
    ServerConnection,
)

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
        # Serves, in this task, a request parsed whole that can be answered without waiting
        # for the client (set by the request loop): whether it did; if not, the handler task
        # is told of the change, as for any other.
        self.serve_here: Callable[[], Awaitable[bool]] | None = None
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
                if self.serve_here is not None and await self.serve_here():
                    continue
                self._notify()
        finally:
            self.stopped = True
            self._notify()

    def wake(self) -> None:
        """Wake the task waiting in :meth:`changed` (a deferred answer wants its handler task:
        see :meth:`HttpExchange.defer`)."""
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

    A handler whose answer comes from another task may instead return with it still to come
    (:meth:`defer`): the task that has the answer writes it (:meth:`answer_now`), so the
    connection's handler task is not woken for it — one trip through trio's scheduler fewer per
    request. Anything but a whole answer that the kernel takes at once goes back to the handler
    task (:meth:`wake`), which then runs the handler's continuation as it would have.
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
        # A deferred answer (see defer): the handler's continuation, and the state between the
        # task that has the answer and the connection's handler task.
        self.resume: Callable[[], Awaitable[None]] | None = None
        self.drop: Callable[[], None] | None = None
        self.resume_wanted = False  # the handler task takes the answer over
        self.unsent = b""  # what the kernel did not take of an answer written now
        # Called once an answer written now is whole (set by the connection's request loop).
        self.on_answered: Callable[[HttpExchange], None] | None = None
        self.answered_now = False

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
        await self._write(self._answer(status, body, content_type, headers))

    def _answer(
        self,
        status: int,
        body: bytes,
        content_type: bytes,
        headers: list[tuple[bytes, bytes]] | None,
    ) -> bytes:
        all_headers = [
            (b"content-type", content_type),
            (b"cache-control", b"no-store"),
            *(headers or []),
        ]
        data = self._connection.respond(status, all_headers, body)
        self.started = self.ended = True
        return data

    def defer(self, resume: Callable[[], Awaitable[None]], drop: Callable[[], None]) -> None:
        """Leave the answer to whoever has it, and return from the handler.

        The answer then comes in one of two ways. The task that has it writes it, whole, with
        :meth:`answer_now`, without the handler task waking. Or, when that cannot be (the
        answer is not one whole body, the kernel does not take it at once, the client left),
        the handler task runs ``resume`` — the rest of the handler, as if it had waited —
        once :meth:`wake` asks it to, or on its own when the connection stops being read.

        ``drop`` is called, in the handler task, if the connection ends with the answer still
        to come (cancelled: a shutdown, a deadline): it must make sure nobody calls
        :meth:`answer_now` or :meth:`wake` afterwards.
        """
        self.resume = resume
        self.drop = drop

    def answer_now(
        self, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        """Write a deferred request's whole answer from the calling task, without yielding.

        One writer per stream still: the handler task writes nothing while its request's
        answer is deferred, and the answer is written only before :meth:`wake`. What the
        kernel does not take at once is left to the handler task (:attr:`unsent`); a write
        that fails marks the client gone and wakes it too (its continuation meets that).
        """
        if self.resume is None or self.resume_wanted:
            raise RuntimeError("answer_now is for a deferred answer its handler has not taken")
        data = self._answer(status, body, b"application/json", headers)
        try:
            sent = send_what_fits(self._stream, data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.disconnected.set()
            self.wake()
            return
        except trio.BusyResourceError:
            sent = 0
        if sent < len(data):
            self.unsent = data[sent:]
            self.wake()
            return
        self.answered_now = True
        if self.on_answered is not None:
            self.on_answered(self)

    async def send_unsent(self) -> None:
        """Write what the kernel did not take of an answer written now (:meth:`answer_now`),
        under the write deadline; ClientGone if that write failed, or this one does."""
        if self.disconnected.is_set():
            raise ClientGone("the client closed the connection before its answer was written")
        unsent, self.unsent = self.unsent, b""
        await self._write(unsent)

    def wake(self) -> None:
        """Hand a deferred answer back to the connection's handler task (see :meth:`defer`)."""
        self.resume_wanted = True
        self._reader.wake()

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
