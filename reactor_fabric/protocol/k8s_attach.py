"""The channels of a Kubernetes ``pods/attach`` WebSocket, as bytes in and events out. Pure.

The API server carries a container's stdio over one WebSocket (subprotocol
``v5.channel.k8s.io``; ``v4.channel.k8s.io`` on servers before 1.30). Every binary message
starts with a channel byte:

====  =====================================================================================
0     stdin (client → server)
1     stdout (server → client)
2     stderr (server → client)
3     status (server → client): one JSON ``metav1.Status`` when the attach ends — ``Success``,
      or ``Failure`` with a reason. A kubelet's attach says ``Success`` whatever the exit code
      (its streams ended); exec, and servers that do more, put a non-zero one in
      ``details.causes`` as ``{"reason": "ExitCode", "message": "<code>"}``, which is read
4     terminal resize (never used here: no TTY)
255   v5 only: a stream's end, ``[255, channel]``. Sent by the client for stdin, it is the
      half-close that tells a stdio server its input ended (how MCP asks it to stop); sent by
      the server, that stream has no more data. v4 has no half-close: closing stdin means
      closing the WebSocket.
====  =====================================================================================

A message with nothing after its channel byte carries no data (servers send one per stream as
it opens); it is not an end of stream.

Bounds: the status is a small JSON document, refused over ``max_status_bytes`` before it is
decoded; a message on a channel the protocol does not have, a malformed close, or data on a
stream already closed is an :class:`AttachProtocolError` (the runtime ends the attach).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

V5: Final = "v5.channel.k8s.io"
V4: Final = "v4.channel.k8s.io"
SUBPROTOCOLS: Final = (V5, V4)  # in order of preference, as the client offers them

STDIN: Final = 0
STDOUT: Final = 1
STDERR: Final = 2
STATUS: Final = 3
RESIZE: Final = 4
CLOSE: Final = 255
MAX_STATUS_BYTES: Final = 64 * 1024


class AttachProtocolError(Exception):
    """The server sent something the channel protocol does not allow."""


@dataclass(frozen=True, slots=True)
class Output:
    """Bytes of the container's stdout (``channel`` 1) or stderr (2)."""

    channel: int
    data: bytes


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The server will send nothing more on ``channel`` (v5)."""

    channel: int


@dataclass(frozen=True, slots=True)
class AttachStatus:
    """How the attach ended, as the status channel said it."""

    success: bool
    exit_code: int | None  # when the status names one (a non-zero exit)
    reason: str
    message: str


AttachEvent = Output | StreamEnded | AttachStatus


class _Cause(msgspec.Struct):
    reason: str = ""
    message: str = ""


class _Details(msgspec.Struct):
    causes: list[_Cause] = msgspec.field(default_factory=list)


class _Status(msgspec.Struct):
    status: str = ""
    reason: str = ""
    message: str = ""
    details: _Details | None = None


_status_decoder = msgspec.json.Decoder(_Status)


class AttachChannels:
    """One attach's framing: what to send for stdin, what the server's messages mean."""

    def __init__(self, subprotocol: str, *, max_status_bytes: int = MAX_STATUS_BYTES) -> None:
        if subprotocol not in SUBPROTOCOLS:
            raise ValueError(f"not a channel subprotocol this client speaks: {subprotocol!r}")
        self.subprotocol = subprotocol
        self._max_status = max_status_bytes
        self._ended: set[int] = set()
        self._stdin_closed = False
        self.status: AttachStatus | None = None

    @property
    def can_half_close(self) -> bool:
        """Whether stdin can end while stdout goes on (v5); otherwise the WebSocket must close."""
        return self.subprotocol == V5

    def stdin(self, data: bytes) -> bytes:
        """The message that carries ``data`` to the container's stdin."""
        if self._stdin_closed:
            raise AttachProtocolError("stdin was closed already")
        return bytes((STDIN,)) + data

    def close_stdin(self) -> bytes | None:
        """The message that ends the container's stdin (v5); None: close the WebSocket (v4)."""
        self._stdin_closed = True
        return bytes((CLOSE, STDIN)) if self.can_half_close else None

    def receive(self, message: bytes) -> AttachEvent | None:
        """What one binary message from the server means (None: nothing, e.g. a stream's
        opening). Raises :class:`AttachProtocolError` for what the protocol does not allow."""
        if not message:
            raise AttachProtocolError("an empty message (not even a channel byte)")
        channel, payload = message[0], message[1:]
        if channel == CLOSE and self.can_half_close:
            if len(payload) != 1 or payload[0] not in (STDOUT, STDERR, STATUS):
                raise AttachProtocolError(f"a malformed stream end: {message[:8]!r}")
            self._ended.add(payload[0])
            return StreamEnded(payload[0])
        if channel not in (STDOUT, STDERR, STATUS):
            raise AttachProtocolError(
                f"a message on channel {channel}, which the server never sends"
            )
        if channel in self._ended and payload:
            raise AttachProtocolError(f"data on channel {channel} after it ended")
        if not payload:
            return None
        if channel == STATUS:
            return self._status(payload)
        return Output(channel, payload)

    def _status(self, payload: bytes) -> AttachStatus:
        if self.status is not None:
            raise AttachProtocolError("a second status")
        if len(payload) > self._max_status:
            raise AttachProtocolError(
                f"a status of {len(payload)} bytes (at most {self._max_status})"
            )
        try:
            decoded = _status_decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise AttachProtocolError(f"a status that is not a Status object: {exc}") from None
        exit_code: int | None = None
        for cause in decoded.details.causes if decoded.details is not None else ():
            if cause.reason == "ExitCode" and cause.message.lstrip("-").isdigit():
                exit_code = int(cause.message)
        self.status = AttachStatus(
            success=decoded.status == "Success",
            # Only what the status names: for an attach, the exit code to trust is the one in
            # the pod's container state (the runtime reads it there).
            exit_code=exit_code,
            reason=decoded.reason,
            message=decoded.message[:1000],
        )
        return self.status
