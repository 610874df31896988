"""Framing of a container's stdio, without I/O.

Two layers stand between a container's stdout and a JSON-RPC message:

1. Docker multiplexes stdout and stderr over one connection when there is no TTY: each frame is
   an 8-byte header ``>BxxxL`` (stream: 1 stdout, 2 stderr; payload length) and the payload.
   :class:`DockerStreamDemuxer` turns received bytes into ``(stream, payload)`` pairs.
2. MCP's stdio transport puts one message per line. Frame boundaries follow the process's writes,
   not lines, so :class:`LineSplitter` reassembles lines across frames, bounded in length so a
   server that never writes a newline cannot grow memory without limit.

Both are push parsers (``feed`` bytes, get complete items back), so the trio layer only moves
bytes and every edge case is unit-tested.
"""

from __future__ import annotations

import struct

STDOUT = 1
STDERR = 2
_HEADER = struct.Struct(">BxxxL")


def docker_frame(stream_id: int, payload: bytes) -> bytes:
    """One frame of Docker's multiplexed stream (what the engine sends; the in-memory backend
    and tests produce it too)."""
    return _HEADER.pack(stream_id, len(payload)) + payload


class FramingError(ValueError):
    """The byte stream broke the framing rules; the connection cannot be trusted further."""


class DockerStreamDemuxer:
    """Splits Docker's multiplexed attach stream into ``(stream_id, payload)`` frames."""

    def __init__(self, *, max_frame: int) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        frames: list[tuple[int, bytes]] = []
        while len(self._buffer) >= _HEADER.size:
            stream_id, length = _HEADER.unpack_from(self._buffer)
            if stream_id not in (0, STDOUT, STDERR):
                raise FramingError(f"unknown Docker stream id {stream_id}")
            if length > self._max_frame:
                raise FramingError(f"Docker frame of {length} bytes exceeds {self._max_frame}")
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append((stream_id, bytes(self._buffer[_HEADER.size : end])))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buffer)


class LineTooLong(FramingError):
    pass


class LineSplitter:
    """Reassembles ``\\n``-terminated lines from arbitrary chunks.

    A trailing ``\\r`` is kept (JSON parsers ignore it as whitespace); empty lines are dropped,
    since they carry no message.
    """

    def __init__(self, *, max_line: int) -> None:
        self._partial = bytearray()
        self._max_line = max_line

    def feed(self, data: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while (newline := data.find(b"\n", start)) != -1:
            piece = data[start:newline]
            if self._partial:
                self._partial += piece
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = piece
            if len(line) > self._max_line:
                raise LineTooLong(f"a line of {len(line)} bytes exceeds {self._max_line}")
            if line.strip():
                lines.append(line)
            start = newline + 1
        rest = data[start:]
        if len(self._partial) + len(rest) > self._max_line:
            raise LineTooLong(f"a line longer than {self._max_line} bytes")
        self._partial += rest
        return lines

    def flush(self) -> bytes | None:
        """What is left after the stream ended without a final newline."""
        if not self._partial.strip():
            self._partial.clear()
            return None
        line = bytes(self._partial)
        self._partial.clear()
        return line
