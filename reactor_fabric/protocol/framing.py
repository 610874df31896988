"""MCP's stdio framing, without I/O: one message per line, in both directions.

A container's output arrives in chunks that follow the process's writes, not lines.
:class:`LineSplitter` reassembles stdout lines (JSON-RPC messages) and refuses a line over the
message size limit — a server that never writes a newline cannot grow memory without bound, and
its session learns why. :class:`TruncatingLineSplitter` does the same for stderr, where a long
line is only a log line: it is cut, never fatal.

Both are push parsers (``feed`` bytes, get complete lines back), so the trio layer only moves
bytes and every edge case is unit-tested.
"""

from __future__ import annotations


class FramingError(ValueError):
    """The byte stream broke the framing rules; the connection cannot be trusted further."""


class LineTooLong(FramingError):
    pass


class LineSplitter:
    """Reassembles ``\\n``-terminated lines from arbitrary chunks, each at most ``max_line``.

    A trailing ``\\r`` is kept (JSON parsers ignore it as whitespace); blank lines are dropped,
    since they carry no message.
    """

    def __init__(self, *, max_line: int) -> None:
        self._partial = bytearray()
        self._max_line = max_line

    def feed(self, data: bytes) -> list[bytes]:
        if not self._partial and data.endswith(b"\n") and data.count(b"\n") == 1:
            # The common case: one write, one whole message.
            line = data[:-1]
            if len(line) > self._max_line:
                raise LineTooLong(f"a line of {len(line)} bytes exceeds {self._max_line}")
            return [line] if line.strip() else []
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

    @property
    def pending(self) -> int:
        """Bytes of a line received without its newline yet."""
        return len(self._partial)

    def flush(self) -> bytes | None:
        """What is left after the stream ended without a final newline."""
        if not self._partial.strip():
            self._partial.clear()
            return None
        line = bytes(self._partial)
        self._partial.clear()
        return line


class TruncatingLineSplitter:
    """Lines of at most ``max_line`` bytes; the rest of a longer line is counted and dropped.

    ``feed`` returns ``(line, dropped)`` pairs, ``dropped`` being how many bytes of that line
    were cut off (0 for a whole line). Memory stays within ``max_line`` whatever the input.
    """

    def __init__(self, *, max_line: int) -> None:
        self._partial = bytearray()
        self._dropped = 0
        self._max_line = max_line

    def feed(self, data: bytes) -> list[tuple[bytes, int]]:
        lines: list[tuple[bytes, int]] = []
        start = 0
        while (newline := data.find(b"\n", start)) != -1:
            self._take(data[start:newline])
            line, dropped = bytes(self._partial), self._dropped
            self._partial.clear()
            self._dropped = 0
            if line.strip() or dropped:
                lines.append((line, dropped))
            start = newline + 1
        self._take(data[start:])
        return lines

    def _take(self, piece: bytes) -> None:
        room = self._max_line - len(self._partial)
        if len(piece) <= room:
            self._partial += piece
        else:
            self._partial += piece[: max(room, 0)]
            self._dropped += len(piece) - max(room, 0)

    def flush(self) -> tuple[bytes, int] | None:
        line, dropped = bytes(self._partial), self._dropped
        self._partial.clear()
        self._dropped = 0
        return (line, dropped) if line.strip() or dropped else None
