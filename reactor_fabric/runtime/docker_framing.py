"""Docker's multiplexed stdio framing (attach without a TTY), without I/O.

Each frame is an 8-byte header ``>BxxxL`` — stream (0 stdin, 1 stdout, 2 stderr) and payload
length — then the payload. Frame boundaries follow the process's writes, not lines; lines are
the session's business (:mod:`reactor_fabric.protocol.framing`). Only the Docker runtime uses
this module: above it, a container's stdout and stderr are plain byte streams.
"""

from __future__ import annotations

import struct

from ..protocol.framing import FramingError

STDIN = 0
STDOUT = 1
STDERR = 2
HEADER = struct.Struct(">BxxxL")
_HEADER_SIZE = HEADER.size


def docker_frame(stream_id: int, payload: bytes) -> bytes:
    """One frame of Docker's multiplexed stream (what the engine sends)."""
    return HEADER.pack(stream_id, len(payload)) + payload


class DockerFrameDecoder:
    """Push parser: ``feed(bytes)`` → ``[(stream_id, payload), ...]``, each ≤ ``max_frame``."""

    def __init__(self, *, max_frame: int) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if not self._buffer and len(data) >= _HEADER_SIZE:
            # The common case: one read, one whole frame.
            stream_id, length = HEADER.unpack_from(data)
            if len(data) == _HEADER_SIZE + length:
                self._check(stream_id, length)
                return [(stream_id, data[_HEADER_SIZE:])]
        self._buffer += data
        frames: list[tuple[int, bytes]] = []
        buffer = self._buffer
        start = 0
        while len(buffer) - start >= _HEADER_SIZE:
            stream_id, length = HEADER.unpack_from(buffer, start)
            self._check(stream_id, length)
            end = start + _HEADER_SIZE + length
            if len(buffer) < end:
                break
            frames.append((stream_id, bytes(buffer[start + _HEADER_SIZE : end])))
            start = end
        del buffer[:start]
        return frames

    def _check(self, stream_id: int, length: int) -> None:
        if stream_id not in (STDIN, STDOUT, STDERR):
            raise FramingError(f"unknown Docker stream id {stream_id}")
        if length > self._max_frame:
            raise FramingError(f"Docker frame of {length} bytes exceeds {self._max_frame}")

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buffer)
