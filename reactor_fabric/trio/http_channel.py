"""A session's client side when the client speaks Streamable HTTP instead of WebSocket.

A WebSocket is one bidirectional pipe; Streamable HTTP spreads a session over many requests:
each client message arrives in its own POST, a request's response (and the messages related to
it) go back on that POST's response, and server-initiated messages go on a GET stream. The
:class:`HttpChannel` gives the session the same :class:`~reactor_fabric.trio.session.ClientChannel`
it has over WebSocket, and routes each server frame to the right HTTP exchange:

1. a response goes to the POST waiting for that request id;
2. anything else (progress, logging, server→client requests) goes on the oldest POST that is
   streaming (SSE), since it most likely relates to it;
3. failing that, to the session's GET stream — through a bounded backlog, so a message sent
   while no stream is open waits for the next GET, and a client that never reads stalls only
   its own session.

Resource handling: everything is bounded (inbox, per-POST channels, backlog); :meth:`close`
wakes every waiting POST and GET.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import trio

from .._errors import InvalidMessage
from ..protocol.jsonrpc import Peek, RequestId, peek

INBOX_DEPTH = 64
WAITER_DEPTH = 32
BACKLOG_DEPTH = 256


@dataclass
class Waiter:
    """One POST waiting for its response (and, when streaming, for related messages)."""

    request_id: RequestId
    streaming: bool
    send: trio.MemorySendChannel[bytes]
    receive: trio.MemoryReceiveChannel[bytes]
    gone: bool = False
    # The frame that answers the request, once delivered (compared by identity by the POST).
    response: bytes | None = None


@dataclass
class HttpChannel:
    """The session-facing channel of one Streamable HTTP session."""

    close_code: int | None = None
    close_reason: str = ""
    closed: trio.Event = field(default_factory=trio.Event)
    last_activity: float = field(default_factory=trio.current_time)
    open_streams: int = 0
    _waiters: collections.OrderedDict[RequestId, Waiter] = field(
        default_factory=collections.OrderedDict
    )

    def __post_init__(self) -> None:
        self._inbox_send, self._inbox_receive = trio.open_memory_channel[bytes](INBOX_DEPTH)
        self._backlog_send, self.backlog = trio.open_memory_channel[bytes](BACKLOG_DEPTH)

    # --- the session's side (ClientChannel) -------------------------------------------------

    async def receive(self) -> bytes | None:
        try:
            return await self._inbox_receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return None

    async def send(self, frame: bytes, message: Peek | None = None) -> None:
        if self.closed.is_set():
            raise trio.ClosedResourceError("the HTTP session is closed")
        if message is None:
            try:
                message = peek(frame)
            except InvalidMessage:
                message = None
        if message is not None and message.kind == "response" and message.id is not None:
            waiter = self._waiters.pop(message.id, None)
            if waiter is not None and not waiter.gone:
                await _deliver_final(waiter, frame)
                return
        for waiter in self._waiters.values():
            if waiter.streaming and not waiter.gone:
                await waiter.send.send(frame)
                return
        await self._backlog_send.send(frame)

    async def close(self, code: int, reason: str = "") -> None:
        if self.closed.is_set():
            return
        self.close_code, self.close_reason = code, reason
        self.closed.set()
        self._inbox_send.close()
        for waiter in self._waiters.values():
            waiter.send.close()
        self._waiters.clear()
        self._backlog_send.close()
        await trio.lowlevel.checkpoint()

    # --- the HTTP side ------------------------------------------------------------------------

    def expect(self, request_id: RequestId, *, streaming: bool) -> Waiter:
        """Register a POST that waits for the response to ``request_id`` (before submitting)."""
        send, receive = trio.open_memory_channel[bytes](WAITER_DEPTH)
        waiter = Waiter(request_id, streaming, send, receive)
        previous = self._waiters.pop(request_id, None)
        if previous is not None:
            previous.send.close()  # a reused id: the older POST can no longer be answered
        self._waiters[request_id] = waiter
        return waiter

    def abandon(self, waiter: Waiter) -> None:
        """The POST's client went away: route its messages elsewhere from now on."""
        waiter.gone = True
        if self._waiters.get(waiter.request_id) is waiter:
            # Its response, when it comes, goes to the GET stream instead of being lost.
            del self._waiters[waiter.request_id]
        waiter.send.close()

    async def submit(self, frame: bytes) -> None:
        """Hand a client message to the session (waits while the session's queue is full)."""
        self.touch()
        try:
            await self._inbox_send.send(frame)
        except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            raise trio.ClosedResourceError("the HTTP session is closed") from exc

    def touch(self) -> None:
        self.last_activity = trio.current_time()

    @property
    def busy(self) -> bool:
        """Whether a POST or GET is still being served (the session must not expire)."""
        return bool(self._waiters) or self.open_streams > 0


async def _deliver_final(waiter: Waiter, frame: bytes) -> None:
    waiter.response = frame
    try:
        await waiter.send.send(frame)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        return
    waiter.send.close()
