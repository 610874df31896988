"""A session's client side when the client speaks Streamable HTTP instead of WebSocket.

A WebSocket is one bidirectional pipe; Streamable HTTP spreads a session over many requests:
each client message arrives in its own POST, a request's response (and the messages related to
it) go back on that POST's response, and server-initiated messages go on a GET stream. The
:class:`HttpChannel` gives the session the same ``ClientChannel`` it has over WebSocket, and
routes each server frame to the right HTTP exchange:

1. a response goes to the POST waiting for that request id — or nowhere, if that POST's client
   hung up: nobody can read it any more;
2. anything else (progress, logging, server→client requests) goes on the oldest POST that is
   streaming (SSE), since it most likely relates to it;
3. failing that, to the session's GET stream — through a backlog bounded in bytes, so a message
   sent while no stream is open waits for the next GET; when the backlog is full, new messages
   are dropped and counted (a client that never opens the stream must not grow memory, nor stall
   the answers to its own POSTs behind notifications).

Bounds: every queue here is bounded in bytes. Client messages wait for the session in an inbox
of ``inbox_bytes``; frames for a POST wait for its handler to write them up to ``buffer_bytes``
(beyond it the session waits: backpressure reaches the container).

Resource handling: :meth:`HttpChannel.close` ends every waiting POST and GET at once.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

from .._errors import InvalidMessage
from ..protocol.jsonrpc import RESPONSE, Peek, RequestId, peek
from .channel import ChannelClosed, Handover, channel_boundary

log = logging.getLogger(__name__)


_Frame = TypeVar("_Frame", bound=Sized)


class FrameQueue(Generic[_Frame]):
    """Frames for one reader, bounded in bytes: ``put`` waits (or drops) when full."""

    def __init__(self, limit: int) -> None:
        self.frames: collections.deque[_Frame] = collections.deque()
        self.bytes = 0
        self.limit = limit
        self.closed = False
        # Set on the next change; made only when a task waits for one (most changes — a POST's
        # one response — happen with nobody waiting on it: see streamable_http.next_frame).
        self._changed: trio.Event | None = None
        # Called on every change, for the queue's one reader when it waits for something else too
        # (see streamable_http.next_frame).
        self.wake: Callable[[], None] | None = None

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()
        if self.wake is not None:
            self.wake()

    async def _wait_for_change(self) -> None:
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    @property
    def full(self) -> bool:
        return self.bytes >= self.limit

    async def put(self, frame: _Frame) -> bool:
        """Queue ``frame`` once there is room; False if the queue was closed meanwhile."""
        while self.full and not self.closed:
            await self._wait_for_change()
        if self.closed:
            return False
        self.put_nowait(frame)
        await trio.lowlevel.checkpoint_if_cancelled()
        return True

    def put_nowait(self, frame: _Frame) -> None:
        self.frames.append(frame)
        self.bytes += len(frame)
        self._notify()

    def put_last_nowait(self, frame: _Frame) -> None:
        """Queue ``frame`` and close the queue after it, as one change (a POST's response)."""
        self.frames.append(frame)
        self.bytes += len(frame)
        self.closed = True
        self._notify()

    async def get(self) -> _Frame | None:
        """The next frame, or None once the queue is closed and empty."""
        while not self.frames:
            if self.closed:
                await trio.lowlevel.checkpoint()
                return None
            await self._wait_for_change()
        frame = self.frames.popleft()
        self.bytes -= len(frame)
        if not self.closed:  # (once closed, no put waits for room any more)
            self._notify()
        await trio.lowlevel.checkpoint_if_cancelled()
        return frame

    def close(self) -> None:
        self.closed = True
        self._notify()


@dataclass
class Waiter:
    """One POST waiting for its response (and, when streaming, for related messages)."""

    request_id: RequestId
    streaming: bool
    queue: FrameQueue[bytes]
    gone: bool = False
    # The frame that answers the request, once delivered (compared by identity by the POST).
    response: bytes | None = None


@dataclass
class HttpChannel:
    """The session-facing channel of one Streamable HTTP session."""

    inbox_bytes: int = 1024 * 1024
    buffer_bytes: int = 1024 * 1024
    backlog_bytes: int = 1024 * 1024
    close_code: int | None = None
    close_reason: str = ""
    closed: trio.Event = field(default_factory=trio.Event)
    # How long the client may stay away with nothing open before its session ends (the
    # session's machine keeps that clock: see protocol/client_lease.py).
    lease_seconds: float | None = None
    open_streams: int = 0
    dropped: int = 0  # server messages dropped because no stream could take them
    _waiters: collections.OrderedDict[RequestId, Waiter] = field(
        default_factory=collections.OrderedDict
    )

    def __post_init__(self) -> None:
        self._inbox: FrameQueue[bytes | Handover] = FrameQueue(self.inbox_bytes)
        self.backlog: FrameQueue[bytes] = FrameQueue(self.backlog_bytes)
        self._streams_changed = trio.Event()
        # Set by the session while its reader waits with nothing queued (DeliversDirectly).
        self.direct: Callable[[bytes, Peek, bool], bool] | None = None

    # --- the session's side (ClientChannel, DeliversDirectly) -------------------------------

    async def receive(self) -> bytes | Handover | None:
        return await self._inbox.get()

    def hand_over(self, handover: Handover) -> None:
        self._inbox.put_nowait(handover)

    @property
    def more_received(self) -> bool:
        return bool(self._inbox.frames)

    @channel_boundary
    async def send(self, frame: bytes, message: Peek | None = None, *, more: bool = False) -> None:
        if self.closed.is_set():
            raise ChannelClosed("the HTTP session is closed")
        if message is None:
            try:
                message = peek(frame)
            except InvalidMessage:
                message = None
        if message is not None and message.kind == RESPONSE and message.id is not None:
            waiter = self._waiters.pop(message.id, None)
            if waiter is not None:
                if not waiter.gone:  # else its client hung up: nobody can read this answer
                    waiter.response = frame
                    queue = waiter.queue
                    if queue.full:  # (a streaming POST whose client reads slowly)
                        await queue.put(frame)
                        queue.close()
                    else:
                        queue.put_last_nowait(frame)
                await trio.lowlevel.checkpoint_if_cancelled()
                return
        for waiter in self._waiters.values():
            if waiter.streaming and not waiter.gone:
                await waiter.queue.put(frame)
                return
        if self.backlog.full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("http_backlog_full", extra={"dropped": self.dropped})
            await trio.lowlevel.checkpoint()
            return
        self.backlog.put_nowait(frame)
        await trio.lowlevel.checkpoint()

    @channel_boundary
    async def close(self, code: int, reason: str = "") -> None:
        if self.closed.is_set():
            return
        self.close_code, self.close_reason = code, reason
        self.closed.set()
        self._inbox.close()
        for waiter in self._waiters.values():
            waiter.queue.close()
        self._waiters.clear()
        self.backlog.close()
        await trio.lowlevel.checkpoint()

    # --- the HTTP side ------------------------------------------------------------------------

    def in_flight(self, request_id: RequestId) -> bool:
        """Whether a request with this id still awaits its answer (ids must be unique)."""
        waiter = self._waiters.get(request_id)
        return waiter is not None and not waiter.gone

    def expect(self, request_id: RequestId, *, streaming: bool) -> Waiter:
        """Register a POST that waits for the response to ``request_id`` (before submitting).

        A waiter whose client left is replaced (its answer will go nowhere anyway); the caller
        refuses an id that a live POST still waits on (:meth:`in_flight`).
        """
        waiter = Waiter(request_id, streaming, FrameQueue(self.buffer_bytes))
        previous = self._waiters.pop(request_id, None)
        if previous is not None:
            previous.queue.close()
        self._waiters[request_id] = waiter
        return waiter

    def abandon(self, waiter: Waiter) -> None:
        """The POST is over (answered, or its client went away): nothing more goes to it.

        An unanswered waiter stays registered, marked gone, until its answer comes, so that the
        answer is recognised and dropped instead of being parked for nobody (there are at most
        as many as the session has requests in flight).
        """
        waiter.gone = True
        waiter.queue.close()

    async def submit(self, frame: bytes, message: Peek | None = None) -> None:
        """Hand a client message to the session (waits while the session's inbox is full);
        :class:`ChannelClosed` once the session has ended. With its envelope (``message``),
        the session takes it at once from this task when its reader waits with nothing queued
        (see :class:`~.channel.DeliversDirectly`)."""
        direct = self.direct
        if (
            direct is not None
            and message is not None
            and not self._inbox.frames
            and not self._inbox.closed
            # (other requests of the client's in flight: a burst, see DeliversDirectly)
            and direct(frame, message, len(self._waiters) > 1)
        ):
            await trio.lowlevel.checkpoint_if_cancelled()
            return
        if not await self._inbox.put(frame):
            raise ChannelClosed("the HTTP session is closed")

    @property
    def busy(self) -> bool:
        """Whether a POST or GET is still being served (the session must not expire). Asked
        only when the client's lease comes due: a scan of the POSTs waiting is cheaper then
        than a count kept on every POST."""
        return self.open_streams > 0 or any(not w.gone for w in self._waiters.values())

    def stream_opened(self) -> None:
        self.open_streams += 1
        self._streams_changed.set()

    def stream_closed(self) -> None:
        self.open_streams -= 1
        self._streams_changed.set()

    async def streams_changed(self) -> None:
        """Wait until a stream opened or closed (several changes are told as one). Requests
        are not told: the session sees their messages, and asks :attr:`busy` when the
        client's lease comes due."""
        await self._streams_changed.wait()
        self._streams_changed = trio.Event()
