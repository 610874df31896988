"""The WebSocket endpoint ``ws://HOST:PORT/mcp/{service}``: wsproto on a trio stream.

Handshake (spec §3): ``Origin`` and ``Host`` are checked before accepting (refused with HTTP
403); subprotocol ``mcp`` is chosen only when the client offers it; permessage-deflate is not
negotiated (loopback gains nothing from compressing every frame). Then the connection becomes a
session (:func:`~reactor_fabric.trio.session.serve_session`).

Frames (read and written by :mod:`reactor_fabric.protocol.websocket_frames`; wsproto does the
handshake): one JSON-RPC message per text frame; a binary frame closes with 1003, a message
over ``max_message_size`` with 1009 (refused from its header), a protocol violation with its
code (1002, 1007). The server pings every 20 s.

One writer per connection: :meth:`WebSocketChannel.run_writer` is the task that writes the
socket. Data frames, pongs, pings and the close frame are queued for it; it writes whatever is
queued in one ``send_all``. While it is idle (nothing queued, no write under way), a data frame
is written by the sending task itself, as far as the kernel takes it at once, and only the rest
is queued: two tasks never write at the same time, and a message costs no hand-off. The queue
of data is bounded in bytes (``buffer_to_client``): a
session sending to a client that does not read waits, and a write that does not progress within
``client_write_timeout`` ends the connection.

Closing: when the session ends, :meth:`WebSocketChannel.finish` sends a close frame (if none was
sent) *and waits for the client's*, bounded in time, before TCP is closed — a client must be able
to read the last frames (a refusal's error) instead of seeing the connection reset under the
close handshake. The connection's state and these decisions are
:class:`~reactor_fabric.protocol.websocket_connection.WebSocketConnection`'s; this module moves
the bytes.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
from dataclasses import dataclass
from http import HTTPStatus

import trio
import wsproto
from wsproto.events import AcceptConnection, RejectConnection, RejectData

from .._errors import SecurityViolation
from .._reasons import TOO_MANY_PENDING_CONNECTIONS
from .._sockets import send_now_if_idle, send_what_fits
from ..config.suite import FABRIC_ENDPOINT
from ..observe.observer import Observer
from ..policy.admission import requested_options
from ..policy.auth import Refusal
from ..policy.principal import Principal
from ..protocol.events import Tick
from ..protocol.jsonrpc import Peek
from ..protocol.websocket_connection import (
    CLOSE_NORMAL,
    CloseRequested,
    Deliver,
    Drained,
    Finish,
    Lost,
    PingDue,
    SendClose,
    SendPing,
    SendPong,
    Violation,
    WebSocketConnection,
)
from ..protocol.websocket_connection import Event as ConnectionEvent
from ..protocol.websocket_frames import (
    PING,
    PONG,
    FrameDecoder,
    FrameError,
    TextMessage,
    close_frame,
    control_frame,
    text_frame,
)
from .authentication import Authenticator
from .channel import ChannelClosed, channel_boundary
from .http_server import Request
from .session import SessionParts, client_of, serve_session

log = logging.getLogger(__name__)

SUBPROTOCOL = "mcp"
MCP_PREFIX = "/mcp/"
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
READ_CHUNK = 65536
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


@dataclass(frozen=True)
class WebSocketSettings:
    max_message_bytes: int
    buffer_bytes: int
    write_timeout: float
    ping_interval: float = 20.0
    close_timeout: float = 5.0  # how long the close handshake may take


class WebSocketChannel:
    """One accepted WebSocket as a session's :class:`~reactor_fabric.trio.session.ClientChannel`.

    Frames are read and written with :mod:`reactor_fabric.protocol.websocket_frames`; the
    connection's state and every close-handshake decision are
    :class:`~reactor_fabric.protocol.websocket_connection.WebSocketConnection`'s: this class
    feeds it what happens and moves the bytes it asks for.
    """

    def __init__(self, stream: trio.abc.Stream, settings: WebSocketSettings) -> None:
        self._stream = stream
        self._settings = settings
        self._decoder = FrameDecoder(max_message=settings.max_message_bytes)
        self._connection = WebSocketConnection(close_timeout=settings.close_timeout)
        self._messages: collections.deque[bytes] = collections.deque()
        self._control: collections.deque[bytes] = collections.deque()
        self._outbox: collections.deque[bytes] = collections.deque()
        self._outbox_bytes = 0
        self._wake_writer = trio.Event()
        self._room = trio.Event()
        self._written = trio.Event()  # set whenever the writer has nothing left to write
        self._written.set()

    @property
    def close_code(self) -> int | None:
        """The code of our close frame, once there is one."""
        return self._connection.close_code

    def _handle(self, event: ConnectionEvent) -> bool:
        """Feed the connection one event and do what it answers; whether it answered at all."""
        actions = self._connection.handle(event, trio.current_time())
        for action in actions:
            if isinstance(action, Deliver):
                self._messages.append(action.message)
            elif isinstance(action, SendPong):
                self._queue_control(control_frame(PONG, action.payload))
            elif isinstance(action, SendPing):
                self._queue_control(control_frame(PING, action.payload))
            elif isinstance(action, SendClose):
                self._queue_close(action.code, action.reason)
            else:
                log.log(_LEVELS[action.level], action.event, extra=action.fields)
        return bool(actions)

    # --- reading ------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take bytes the client sent (the connection's reads, or what followed the upgrade)."""
        try:
            events = self._decoder.feed(data)
        except FrameError as exc:
            self._handle(Violation(exc.code, exc.reason))
            return
        for event in events:
            # The hot path, without a call into the machine: a text message is delivered
            # exactly while the connection is receiving (handle() answers the same).
            if type(event) is TextMessage and self._connection.receiving:
                self._messages.append(event.data)
            else:
                self._handle(event)

    @property
    def more_received(self) -> bool:
        return bool(self._messages)

    async def receive(self) -> bytes | None:
        """The next message, or None once the client closed (or must be closed)."""
        while True:
            if self._messages:
                return self._messages.popleft()
            if not self._connection.receiving:
                return None
            if not await self._read():
                return None

    async def _read(self) -> bool:
        """Read once and feed what came; False once the connection is lost."""
        try:
            data = await self._stream.receive_some(READ_CHUNK)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self._lost()
            return False
        self.feed(bytes(data))
        return True

    def _lost(self) -> None:
        self._handle(Lost())
        self._wake_writer.set()
        self._room.set()

    # --- writing ------------------------------------------------------------------------------

    def _queue_control(self, frame: bytes) -> None:
        """Pings and pongs: written before queued data (they carry no order)."""
        self._control.append(frame)
        self._written = trio.Event()
        self._wake_writer.set()

    def _queue_close(self, code: int, reason: str) -> None:
        """The close frame: written after everything queued before it."""
        frame = close_frame(code, reason)
        self._outbox.append(frame)
        self._outbox_bytes += len(frame)
        self._written = trio.Event()
        self._wake_writer.set()

    @channel_boundary
    async def send(self, frame: bytes, message: Peek | None = None, *, more: bool = False) -> None:
        """Queue one message for the client; waits while ``buffer_bytes`` are queued already.
        The writer task owns the stream: its failure reaches here as the connection lost."""
        while True:
            if not self._connection.sending:
                raise ChannelClosed("the WebSocket is closed")
            if self._outbox_bytes < self._settings.buffer_bytes:
                break
            self._room = trio.Event()
            await self._room.wait()
        try:
            frame.decode("utf-8")
        except UnicodeDecodeError:
            # A text frame must be UTF-8; a server that wrote otherwise gets replacements.
            frame = frame.decode("utf-8", "replace").encode()
        data = text_frame(frame)
        if not more and not self._outbox and not self._control and self._connection.receiving:
            # The writer is idle: this task writes what the kernel takes now (no hand-off
            # per message), the writer only the rest (see send_now_if_idle). Frames of a
            # burst are queued, and the writer writes them in one go.
            sent = send_now_if_idle(self._stream, data)
            if sent == len(data):
                await trio.lowlevel.checkpoint_if_cancelled()
                return
            if sent:
                data = data[sent:]
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        self._written = trio.Event()
        self._wake_writer.set()
        await trio.lowlevel.checkpoint_if_cancelled()

    @channel_boundary
    async def close(self, code: int, reason: str = "") -> None:
        """Queue a close frame; the handshake completes in :meth:`finish`."""
        if self._handle(CloseRequested(code, reason)):
            await trio.lowlevel.checkpoint()  # (a second close is nothing, not even that)

    async def run_writer(self) -> None:
        """The one task that writes this connection (see the module docstring)."""
        while self._connection.connected:
            if not self._control and not self._outbox:
                self._handle(Drained())
                self._written.set()
                await self._wake_writer.wait()
                self._wake_writer = trio.Event()
                continue
            data_bytes = self._outbox_bytes
            parts = [*self._control, *self._outbox]
            self._control.clear()
            self._outbox.clear()
            batch = parts[0] if len(parts) == 1 else b"".join(parts)
            failure = ""
            try:
                # Usually the kernel takes it all at once: no deadline to arm then.
                sent = send_what_fits(self._stream, batch)
                if sent < len(batch):
                    with trio.move_on_after(self._settings.write_timeout) as stall:
                        await self._stream.send_all(memoryview(batch)[sent:])
                    if stall.cancelled_caught:
                        failure = "the client stopped reading"
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                failure = type(exc).__name__
            if failure:
                log.info("websocket_write_failed", extra={"detail": failure})
                self._lost()
                self._written.set()
                return
            self._outbox_bytes -= data_bytes
            self._room.set()

    async def run_pinger(self) -> None:
        """WebSocket pings, for keepalive (JSON-RPC ping is gone in MCP 2026-07-28)."""
        while True:
            await trio.sleep(self._settings.ping_interval)
            self._handle(PingDue())

    async def finish(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        """End the connection cleanly: our close frame written, the client's awaited (bounded
        by the connection's deadline), before the caller closes TCP."""
        self._handle(Finish(code, reason))
        deadline = self._connection.deadline
        with trio.move_on_at(math.inf if deadline is None else deadline) as bound:
            await self._written.wait()
            while not self._connection.done:
                if self._connection.awaiting_close and self._written.is_set():
                    await self._read()
                else:
                    await self._written.wait()
        if bound.cancelled_caught:
            self._handle(Tick())


async def serve_websocket(
    parts: SessionParts,
    authenticator: Authenticator,
    request: Request,
    stream: trio.abc.Stream,
    trailing: bytes,
) -> None:
    """One WebSocket connection, from its upgrade request to its end (the stream is ours):
    ``authenticator`` admits its request, ``parts`` serve its session."""
    registry, limits = parts.registry, parts.settings.limits
    ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    ws.initiate_upgrade_connection(request.raw_headers, request.target)
    handshake = next(ws.events(), None)
    if not isinstance(handshake, wsproto.events.Request):
        return
    principal = await _admitted(authenticator, parts.observer, request)
    if isinstance(principal, Refusal):
        await _reject(stream, ws, principal.status, principal.body, principal.headers)
        return
    if not registry.reserve_pending():
        log.warning("websocket_refused", extra={"reason": TOO_MANY_PENDING_CONNECTIONS})
        await _reject(stream, ws, 503, b'{"error": "too many connections waiting; try again"}')
        return
    settings = WebSocketSettings(
        max_message_bytes=limits.max_message_bytes,
        buffer_bytes=limits.buffer_to_client_bytes,
        write_timeout=limits.client_write_seconds,
    )
    subprotocol = SUBPROTOCOL if SUBPROTOCOL in handshake.subprotocols else None
    service = _websocket_service(request.path) or ""  # refused above when None
    query = requested_options(request.query, request.headers)
    mounts = query.get("mount", [])
    pending = True  # counted among the connections that have not sent a first message
    try:
        with trio.move_on_after(settings.write_timeout):
            await stream.send_all(ws.send(AcceptConnection(subprotocol=subprotocol)))
        channel = WebSocketChannel(stream, settings)
        if trailing:
            channel.feed(trailing)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run_writer)
            nursery.start_soon(channel.run_pinger)
            first: bytes | None = None
            with trio.move_on_after(limits.first_message_seconds) as waited:
                first = await _first_message(registry.stopping, channel)
            if waited.cancelled_caught:
                log.info("websocket_first_message_timeout", extra={"service": service})
            registry.release_pending()
            pending = False
            if first is not None:
                await serve_session(
                    parts,
                    channel,
                    service,
                    mounts,
                    first_frame=first,
                    query=query,
                    client=client_of(parts.settings.token_id, request, "websocket", principal),
                    traceparent=request.header(b"traceparent") or None,
                )
                await channel.finish()
            else:
                await channel.finish(CLOSE_POLICY, "no message received in time")
            nursery.cancel_scope.cancel()
    finally:
        if pending:
            registry.release_pending()
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await stream.aclose()


async def _first_message(stopping: trio.Event, channel: WebSocketChannel) -> bytes | None:
    """The connection's first message; None if the client leaves or the orchestrator stops.

    The caller bounds the wait (``first_message_timeout``).
    """
    result: bytes | None = None
    async with trio.open_nursery() as nursery:

        async def receive() -> None:
            nonlocal result
            result = await channel.receive()
            nursery.cancel_scope.cancel()

        async def stopped() -> None:
            await stopping.wait()
            await channel.close(CLOSE_GOING_AWAY, "orchestrator stopping")
            nursery.cancel_scope.cancel()

        nursery.start_soon(receive)
        nursery.start_soon(stopped)
    return result


async def _admitted(
    authenticator: Authenticator, observer: Observer, request: Request
) -> Principal | Refusal:
    admitted = await authenticator.admit(request.headers, request.query, request.path)
    if isinstance(admitted, Refusal):
        observer.error_sent(SecurityViolation.code, admitted.reason)
        return admitted
    if _websocket_service(request.path) is None:
        return Refusal(404, "not_found", b'{"error": "not found"}')
    return admitted


def _websocket_service(path: str) -> str | None:
    """``/mcp/{service}`` → the service; ``/mcp`` → the fabric endpoint; else None."""
    if path == "/mcp":
        return FABRIC_ENDPOINT
    service = path[len(MCP_PREFIX) :]
    if not path.startswith(MCP_PREFIX) or not service or "/" in service:
        return None
    return service


def _with_reason_phrase(head: bytes, status: int) -> bytes:
    """``head`` with the standard reason phrase of ``status`` in its status line, when the
    line has none."""
    bare = f"HTTP/1.1 {status} \r\n".encode()
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return head
    if not head.startswith(bare):
        return head
    return f"HTTP/1.1 {status} {phrase}\r\n".encode() + head[len(bare) :]


async def _reject(
    stream: trio.abc.Stream,
    ws: wsproto.WSConnection,
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    data = ws.send(
        RejectConnection(
            status_code=status,
            headers=[
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
            has_body=True,
        )
    )
    # wsproto leaves the reason phrase out ("HTTP/1.1 401 "); clients print the status line
    # they got (trio-websocket, Node's ws), and "401 Unauthorized" is what users search for.
    data = _with_reason_phrase(data, status)
    data += ws.send(RejectData(data=body, body_finished=True))
    with (
        trio.move_on_after(1),
        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
    ):
        await stream.send_all(data)
