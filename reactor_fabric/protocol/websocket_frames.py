"""WebSocket framing (RFC 6455), server side, without I/O.

The handshake is wsproto's (once per connection); this module reads and writes the frames that
follow, on every message of every session. It exists because it is the relay's hot path: the
general-purpose parser spent a quarter of the orchestrator's CPU on a small call (a generator
per byte to unmask, an incremental decoder and several copies per message). Here a message that
arrives in one frame in one read — almost all of them — is parsed, unmasked (one big-integer
XOR) and checked as UTF-8 in a few C-level operations, and a message to the client is one
header plus the payload as given.

What the decoder enforces, each violation being a :class:`FrameError` with the close code to
send: client frames are masked (1002); no reserved bits, since no extension is negotiated
(1002); known opcodes only (1002); control frames are whole and at most 125 bytes (1002);
continuation frames only inside a fragmented message and no new message inside one (1002); a
message never exceeds ``max_message`` bytes, checked on the declared length before a byte of it
is kept (1009); text is UTF-8 (1007); close frames carry a valid code and a UTF-8 reason (1002,
1007). Binary messages are reported as such (the endpoint closes with 1003).

Pure and synchronous.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

CONTINUATION: Final = 0x0
TEXT: Final = 0x1
BINARY: Final = 0x2
CLOSE: Final = 0x8
PING: Final = 0x9
PONG: Final = 0xA

PROTOCOL_ERROR: Final = 1002
INVALID_DATA: Final = 1007
TOO_BIG: Final = 1009

_SHORT = struct.Struct("!H")
_LONG = struct.Struct("!Q")
# Close codes an endpoint may send (RFC 6455 §7.4): not 1004-1006 nor 1015, 1012-1014 are
# registered since; 3000-4999 are for libraries and applications.
_VALID_CLOSE_CODES = frozenset(
    {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014}
)


class FrameError(Exception):
    """The client broke the protocol; close with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TextMessage:
    data: bytes  # UTF-8, validated


@dataclass(frozen=True, slots=True)
class BinaryMessage:
    pass


@dataclass(frozen=True, slots=True)
class Ping:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Pong:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Close:
    code: int | None  # None: the close frame carried no code
    reason: str


Event = TextMessage | BinaryMessage | Ping | Pong | Close


def unmask(payload: bytes | bytearray | memoryview, mask: bytes) -> bytes:
    """XOR with the 4-byte mask, as one big-integer operation."""
    size = len(payload)
    if not size:
        return b""
    key = (mask * (size // 4 + 1))[:size]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(
        size, "little"
    )


class FrameDecoder:
    """Push parser of client frames: ``feed(bytes)`` → events; raises :class:`FrameError`."""

    def __init__(self, *, max_message: int) -> None:
        self._buffer = bytearray()
        self._max_message = max_message
        self._fragments: list[bytes] | None = None  # a fragmented message in progress
        self._fragment_opcode = TEXT
        self._fragment_bytes = 0

    def feed(self, data: bytes) -> list[Event]:
        if not self._buffer:
            whole = self._one_whole_text_frame(data)
            if whole is not None:
                return [whole]
        self._buffer += data
        events: list[Event] = []
        while True:
            event = self._next()
            if event is None:
                return events
            if event is not _NOTHING:
                events.append(event)  # type: ignore[arg-type]

    def _one_whole_text_frame(self, data: bytes) -> TextMessage | None:
        """The common case, without buffering: one masked, unfragmented text frame of less
        than 64 KiB that is exactly what was read."""
        if len(data) < 6 or data[0] != 0x81 or not data[1] & 0x80 or self._fragments is not None:
            return None
        length = data[1] & 0x7F
        if length < 126:
            start = 6
        elif length == 126 and len(data) >= 8:
            (length,) = _SHORT.unpack_from(data, 2)
            start = 8
        else:
            return None
        if len(data) != start + length:
            return None
        if length > self._max_message:
            raise FrameError(TOO_BIG, f"message over {self._max_message} bytes")
        return TextMessage(_utf8(unmask(data[start:], data[start - 4 : start])))

    def _next(self) -> Event | object | None:
        """Parse one frame from the buffer; None when more bytes are needed."""
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        first, second = buffer[0], buffer[1]
        fin, opcode = first & 0x80, first & 0x0F
        if first & 0x70:
            raise FrameError(PROTOCOL_ERROR, "reserved bits set without an extension")
        if not second & 0x80:
            raise FrameError(PROTOCOL_ERROR, "client frames must be masked")
        length = second & 0x7F
        offset = 2
        if length == 126:
            if len(buffer) < 4:
                return None
            (length,) = _SHORT.unpack_from(buffer, 2)
            offset = 4
        elif length == 127:
            if len(buffer) < 10:
                return None
            (length,) = _LONG.unpack_from(buffer, 2)
            offset = 10
        self._check_frame(opcode, fin, length)
        end = offset + 4 + length
        if len(buffer) < end:
            return None
        mask = bytes(buffer[offset : offset + 4])
        payload = unmask(buffer[offset + 4 : end], mask)
        del buffer[:end]
        return self._frame(opcode, bool(fin), payload)

    def _check_frame(self, opcode: int, fin: int, length: int) -> None:
        """Everything that can be refused from the header alone, before keeping the payload."""
        if opcode >= CLOSE:
            if opcode not in (CLOSE, PING, PONG):
                raise FrameError(PROTOCOL_ERROR, f"unknown control opcode {opcode:#x}")
            if not fin or length > 125:
                raise FrameError(PROTOCOL_ERROR, "control frames must be whole and <= 125 bytes")
            return
        if opcode not in (CONTINUATION, TEXT, BINARY):
            raise FrameError(PROTOCOL_ERROR, f"unknown data opcode {opcode:#x}")
        if opcode == CONTINUATION and self._fragments is None:
            raise FrameError(PROTOCOL_ERROR, "a continuation frame outside a message")
        if opcode != CONTINUATION and self._fragments is not None:
            raise FrameError(PROTOCOL_ERROR, "a new message inside a fragmented one")
        if self._fragment_bytes + length > self._max_message:
            raise FrameError(TOO_BIG, f"message over {self._max_message} bytes")

    def _frame(self, opcode: int, fin: bool, payload: bytes) -> Event | object:
        if opcode >= CLOSE:
            return _control(opcode, payload)
        if opcode != CONTINUATION:
            self._fragment_opcode = opcode
            if fin:
                return _message(opcode, payload)
            self._fragments = [payload]
            self._fragment_bytes = len(payload)
            return _NOTHING
        assert self._fragments is not None
        self._fragments.append(payload)
        self._fragment_bytes += len(payload)
        if not fin:
            return _NOTHING
        whole = b"".join(self._fragments)
        self._fragments, self._fragment_bytes = None, 0
        return _message(self._fragment_opcode, whole)


_NOTHING = object()


def _control(opcode: int, payload: bytes) -> Event:
    if opcode == PING:
        return Ping(payload)
    if opcode == PONG:
        return Pong(payload)
    return _close(payload)


def _message(opcode: int, payload: bytes) -> Event:
    if opcode == BINARY:
        return BinaryMessage()
    return TextMessage(_utf8(payload))


def _utf8(payload: bytes) -> bytes:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(INVALID_DATA, "a text message that is not UTF-8") from exc
    return payload


def _close(payload: bytes) -> Close:
    if not payload:
        return Close(None, "")
    if len(payload) == 1:
        raise FrameError(PROTOCOL_ERROR, "a close frame with a one-byte payload")
    (code,) = _SHORT.unpack_from(payload)
    if code not in _VALID_CLOSE_CODES and not 3000 <= code <= 4999:
        raise FrameError(PROTOCOL_ERROR, f"invalid close code {code}")
    try:
        reason = payload[2:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(INVALID_DATA, "a close reason that is not UTF-8") from exc
    return Close(code, reason)


def _header(opcode: int, length: int) -> bytes:
    first = 0x80 | opcode
    if length < 126:
        return bytes((first, length))
    if length < 65536:
        return bytes((first, 126)) + _SHORT.pack(length)
    return bytes((first, 127)) + _LONG.pack(length)


def text_frame(payload: bytes) -> bytes:
    """One unmasked (server) text frame carrying ``payload`` (UTF-8: the caller checks)."""
    return _header(TEXT, len(payload)) + payload


def control_frame(opcode: int, payload: bytes = b"") -> bytes:
    return _header(opcode, len(payload)) + payload


def close_frame(code: int, reason: str = "") -> bytes:
    """A close frame; the reason is cut so that the payload fits a control frame (125)."""
    encoded = reason.encode("utf-8")[:123]
    while True:
        try:
            encoded.decode("utf-8")
            break
        except UnicodeDecodeError:
            encoded = encoded[:-1]  # do not cut a character in two
    return control_frame(CLOSE, _SHORT.pack(code) + encoded)
