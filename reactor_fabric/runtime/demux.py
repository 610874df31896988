"""One multiplexed output stream, read as two streams (stdout and stderr), with no task of its own.

Docker's attach socket (and Kubernetes' attach channels) carry a container's stdout and stderr
interleaved. :class:`Demultiplexer` gives each its own :class:`trio.abc.ReceiveStream`. Whichever
reader finds nothing buffered for itself and no other reader on the socket reads the socket, and
files what it got under both streams: the stdout path costs no task switch when stderr is quiet,
which is almost always.

Bounds: stdout data read on behalf of the stderr reader waits, at most ``max_buffered`` bytes of
it, for the stdout reader (beyond that the stderr reader waits too: backpressure reaches the
container). Stderr is logs: beyond ``max_buffered`` bytes waiting, new stderr bytes are dropped
and counted (:attr:`Demultiplexer.stderr_dropped`), so a flood of logs never stalls the relay.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import trio

from ..protocol.framing import FramingError

STDOUT = 1
STDERR = 2
READ_CHUNK = 65536

# Turns received bytes into (stream id, payload) pairs; raises FramingError on broken framing.
Decoder = Callable[[bytes], list[tuple[int, bytes]]]


class Demultiplexer:
    def __init__(
        self, source: trio.abc.ReceiveStream, decode: Decoder, *, max_buffered: int
    ) -> None:
        self._source = source
        self._decode = decode
        self._max_buffered = max_buffered
        self._reading = False
        self._changed = trio.Event()
        self.eof = False
        self.error: Exception | None = None
        self.stderr_dropped = 0
        self.stdout = _Output(self, STDOUT)
        self.stderr = _Output(self, STDERR)

    def _other(self, output: _Output) -> _Output:
        return self.stderr if output is self.stdout else self.stdout

    async def _read_for(self, output: _Output) -> None:
        """Read the source once, or wait for whoever is reading it."""
        if self._reading or (output is self.stderr and self.stdout.buffered >= self._max_buffered):
            await self._changed.wait()
            return
        self._reading = True
        try:
            data = await self._source.receive_some(READ_CHUNK)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        finally:
            self._reading = False
        try:
            if not data:
                self.eof = True
                return
            for stream_id, payload in self._decode(bytes(data)):
                if stream_id == STDOUT:
                    self.stdout.chunks.append(payload)
                    self.stdout.buffered += len(payload)
                elif stream_id == STDERR:
                    if self.stderr.buffered >= self._max_buffered:
                        self.stderr_dropped += len(payload)
                    else:
                        self.stderr.chunks.append(payload)
                        self.stderr.buffered += len(payload)
        except FramingError as exc:
            # Broken framing: neither stream can be trusted any more.
            self.error = exc
            self.eof = True
        finally:
            changed, self._changed = self._changed, trio.Event()
            changed.set()


class _Output(trio.abc.ReceiveStream):
    def __init__(self, demux: Demultiplexer, stream_id: int) -> None:
        self._demux = demux
        self._stream_id = stream_id
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self._closed = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        demux = self._demux
        # Every call is a checkpoint (trio's stream contract); a call that waited or read the
        # source has been one already, so the hot path does not yield twice.
        waited = False
        while True:
            if self._closed:
                raise trio.ClosedResourceError("this stream was closed")
            if self.chunks:
                if not waited:
                    await trio.lowlevel.checkpoint()
                chunk = self.chunks.popleft()
                if max_bytes is not None and len(chunk) > max_bytes:
                    self.chunks.appendleft(chunk[max_bytes:])
                    chunk = chunk[:max_bytes]
                self.buffered -= len(chunk)
                return chunk
            if demux.eof:
                if not waited:
                    await trio.lowlevel.checkpoint()
                if demux.error is not None:
                    raise demux.error
                return b""
            await demux._read_for(self)
            waited = True

    async def aclose(self) -> None:
        self._closed = True
        self.chunks.clear()
        await trio.lowlevel.checkpoint()
