"""A WebSocket connection's state and its close handshake (RFC 6455 §7), without I/O.

The trio layer (:mod:`reactor_fabric.trio.websocket`) reads frames, decodes them with
:mod:`.websocket_frames`, feeds them here and does what :meth:`WebSocketConnection.handle`
answers; it asks :attr:`~WebSocketConnection.receiving`, :attr:`~WebSocketConnection.sending`,
:attr:`~WebSocketConnection.awaiting_close` and :attr:`~WebSocketConnection.done` before it
reads, queues a message, or closes TCP. Every decision of the close handshake is here: when our
Close frame is sent and with which code, that the client's Close is answered with its own code,
that nothing the client sends after a Close reaches the session, that a second close is nothing,
and how long the client may take to answer ours (:attr:`~WebSocketConnection.deadline`).

The states (:class:`WebSocketState`)::

    OPEN ──our close, a protocol violation, a binary frame──▶ CLOSING_BY_US
      │                                                          │ the client's Close
      │ the client's Close (answered with its code)              ▼
      └─────────────────────────────────────────────────▶ CLOSING_BY_PEER ──ours written──▶ CLOSED
    CLOSING_BY_US ──the client's Close, ours written already──────────────────────────────▶ CLOSED
    any state but CLOSED ──EOF, failed or stalled write, the handshake's bound passed──▶ GONE

Why the server waits for the client's Close before closing TCP: a client must be able to read
the last frames (a refusal's error) instead of seeing the connection reset under the handshake
(Node reports 1006 and drops the last message otherwise). Why the wait is bounded: a client
that never answers must not hold a connection.

Pure and synchronous: ``handle(event, now) -> list[action]`` and :attr:`deadline`, as the
session machines (:mod:`.events`).
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from typing import Any, Final

from .events import Log, Tick
from .websocket_frames import BinaryMessage, Close, Ping, Pong, TextMessage

__all__ = [
    "CLOSE_NORMAL",
    "CLOSE_UNSUPPORTED_DATA",
    "PING_PAYLOAD",
    "Action",
    "CloseRequested",
    "Deliver",
    "Drained",
    "Event",
    "Finish",
    "Lost",
    "PingDue",
    "SendClose",
    "SendPing",
    "SendPong",
    "Violation",
    "WebSocketConnection",
    "WebSocketState",
]

CLOSE_NORMAL: Final = 1000
CLOSE_UNSUPPORTED_DATA: Final = 1003
PING_PAYLOAD: Final = b"reactor-fabric"


class WebSocketState(enum.Enum):
    OPEN = "open"
    """Messages flow both ways."""
    CLOSING_BY_US = "closing_by_us"
    """Our Close frame is queued (perhaps written): the client's is awaited, nothing it sends
    but its Close matters any more, nothing more is sent but pongs."""
    CLOSING_BY_PEER = "closing_by_peer"
    """The client's Close arrived; ours (its answer, or one queued before it came) is still to
    be written. Nothing more is read."""
    CLOSED = "closed"
    """Both Close frames went through: TCP may close."""
    GONE = "gone"
    """TCP is over without a finished handshake: the client hung up, a write failed or stalled,
    or the client did not answer our Close within the bound."""


# --- events (besides the decoder's frames: TextMessage, BinaryMessage, Ping, Pong, Close) ----


@dataclass(frozen=True, slots=True)
class Violation:
    """The client broke the protocol (the decoder's :class:`~.websocket_frames.FrameError`)."""

    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class CloseRequested:
    """The session closes the connection with ``code`` (its :meth:`close`)."""

    code: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    """The session is over: close with ``code`` if nothing closed yet, and give the handshake
    until the deadline this arms."""

    code: int = CLOSE_NORMAL
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PingDue:
    """The keepalive interval passed."""


@dataclass(frozen=True, slots=True)
class Drained:
    """Everything queued for the client so far is written (the writer has nothing left)."""


@dataclass(frozen=True, slots=True)
class Lost:
    """TCP broke: EOF or a failed read, a failed or stalled write."""


Event = (
    TextMessage
    | BinaryMessage
    | Ping
    | Pong
    | Close
    | Violation
    | CloseRequested
    | Finish
    | PingDue
    | Drained
    | Lost
    | Tick
)


# --- actions -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """A message for the session's :meth:`receive`."""

    message: bytes


@dataclass(frozen=True, slots=True)
class SendPong:
    """Answer a ping (a control frame: written ahead of queued messages, it carries no order)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class SendPing:
    """A keepalive ping (a control frame, like a pong)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class SendClose:
    """Our Close frame: written *after* every message queued before it (the last frames a
    client reads before the close, e.g. a refusal's error, must reach it)."""

    code: int
    reason: str


Action = Deliver | SendPong | SendPing | SendClose | Log


class WebSocketConnection:
    """One accepted WebSocket's connection state (see the module docstring)."""

    def __init__(self, *, close_timeout: float) -> None:
        self.state = WebSocketState.OPEN
        self.close_code: int | None = None  # the code of our Close frame, once there is one
        self.deadline: float | None = None  # when the close handshake is given up (Tick then)
        self._close_timeout = close_timeout
        self._close_written = False  # a Drained came since our Close was queued

    # --- what the trio layer may do in this state -----------------------------------------------

    @property
    def receiving(self) -> bool:
        """The session's receive() may read the socket (else it ends, once what was delivered
        before is taken)."""
        return self.state is WebSocketState.OPEN

    @property
    def sending(self) -> bool:
        """The session may queue messages (else send() raises: the connection is closing)."""
        return self.state is WebSocketState.OPEN

    @property
    def awaiting_close(self) -> bool:
        """The socket is read for the client's Close (our own is out or queued)."""
        return self.state is WebSocketState.CLOSING_BY_US

    @property
    def connected(self) -> bool:
        """TCP is still worth writing to."""
        return self.state is not WebSocketState.GONE

    @property
    def done(self) -> bool:
        """Nothing more to wait for: TCP may close."""
        return self.state in (WebSocketState.CLOSED, WebSocketState.GONE)

    def clone(self) -> WebSocketConnection:
        """An independent copy in the current state (for model checking)."""
        return copy.copy(self)

    def fingerprint(self, now: float) -> tuple[object, ...]:
        """Everything that decides what comes next (the deadline as time left at ``now``)."""
        left = None if self.deadline is None else self.deadline - now
        return (self.state, self.close_code, self._close_written, left)

    # --- events ------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event at ``now``; the actions to carry out, in order."""
        # A text message first: it is almost every event (the relay's hot path).
        if type(event) is TextMessage:
            # After any Close, what the client still sends reaches nobody.
            return [Deliver(event.data)] if self.state is WebSocketState.OPEN else []
        if self.state is WebSocketState.CLOSED or self.state is WebSocketState.GONE:
            return []  # nothing left to decide
        actions: list[Action] = _HANDLERS[type(event)](self, event, now)
        return actions

    def _ping(self, event: Ping, now: float) -> list[Action]:
        # Answered until the client's Close (RFC 6455 §5.5.2), ours queued or not.
        if self.state is WebSocketState.CLOSING_BY_PEER:
            return []
        return [SendPong(event.payload)]

    def _pong(self, event: Pong, now: float) -> list[Action]:
        return []  # keepalive needs no answer

    def _client_closed(self, event: Close, now: float) -> list[Action]:
        if self.state is WebSocketState.CLOSING_BY_US:
            # The client answered ours: done once ours is out.
            self.state = (
                WebSocketState.CLOSED if self._close_written else WebSocketState.CLOSING_BY_PEER
            )
            return []
        if self.state is WebSocketState.CLOSING_BY_PEER:
            return []  # a second Close from the client: nothing is read after the first
        # The client closes first: answer with its code (the handshake completes).
        code = event.code if event.code is not None else CLOSE_NORMAL
        self.close_code = code
        self.state = WebSocketState.CLOSING_BY_PEER
        return [SendClose(code, "")]

    def _binary(self, event: BinaryMessage, now: float) -> list[Action]:
        return self._failed(CLOSE_UNSUPPORTED_DATA, "binary frames are not supported")

    def _violation(self, event: Violation, now: float) -> list[Action]:
        return self._failed(event.code, event.reason)

    def _failed(self, code: int, reason: str) -> list[Action]:
        """The client broke the protocol: close with ``code`` (logged while ours is out too)."""
        if self.state is WebSocketState.CLOSING_BY_PEER:
            return []  # nothing is read after the client's Close
        log = Log("info", "websocket_closing", {"code": code, "detail": reason})
        return [log, *self._close(code, reason)]

    def _close_requested(self, event: CloseRequested, now: float) -> list[Action]:
        return self._close(event.code, event.reason)

    def _finish(self, event: Finish, now: float) -> list[Action]:
        if self.deadline is None:
            self.deadline = now + self._close_timeout
        return self._close(event.code, event.reason)

    def _close(self, code: int, reason: str) -> list[Action]:
        if self.state is not WebSocketState.OPEN:
            return []  # closing already: a second close is nothing
        self.close_code = code
        self.state = WebSocketState.CLOSING_BY_US
        return [SendClose(code, reason)]

    def _ping_due(self, event: PingDue, now: float) -> list[Action]:
        return [SendPing(PING_PAYLOAD)] if self.state is WebSocketState.OPEN else []

    def _drained(self, event: Drained, now: float) -> list[Action]:
        if self.state is not WebSocketState.OPEN:
            self._close_written = True  # our Close was queued before: it is out
            if self.state is WebSocketState.CLOSING_BY_PEER:
                self.state = WebSocketState.CLOSED
        return []

    def _lost(self, event: Lost, now: float) -> list[Action]:
        self.state = WebSocketState.GONE
        return []

    def _tick(self, event: Tick, now: float) -> list[Action]:
        if self.deadline is not None and now >= self.deadline:
            self.state = WebSocketState.GONE  # the client did not answer in time: cut
        return []


# Each event's handler (a TextMessage is handled before the lookup).
_HANDLERS: dict[type, Any] = {
    Ping: WebSocketConnection._ping,
    Pong: WebSocketConnection._pong,
    Close: WebSocketConnection._client_closed,
    BinaryMessage: WebSocketConnection._binary,
    Violation: WebSocketConnection._violation,
    CloseRequested: WebSocketConnection._close_requested,
    Finish: WebSocketConnection._finish,
    PingDue: WebSocketConnection._ping_due,
    Drained: WebSocketConnection._drained,
    Lost: WebSocketConnection._lost,
    Tick: WebSocketConnection._tick,
}
