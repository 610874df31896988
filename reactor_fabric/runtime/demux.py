"""One multiplexed output stream, read as two streams (stdout and stderr), with no task of its own.

Docker's attach socket (and Kubernetes' attach channels) carry a container's stdout and stderr
interleaved. :class:`Demultiplexer` gives each its own :class:`trio.abc.ReceiveStream`.

**The stdout reader leads.** Whoever reads stdout reads the source, and files what it got under
both streams; the stderr reader only waits for what is filed for it (and for the end). So a
message on stdout costs its reader one read and no task switch, and the stderr reader is woken
only when there is stderr — which is almost never on the hot path. Once stdout is closed (its
reader is done with it), the stderr reader reads the source itself, and stdout data is
discarded.

Bounds: stderr is logs: beyond ``max_buffered`` bytes waiting for its reader, new stderr bytes
are dropped and counted (:attr:`Demultiplexer.stderr_dropped`), so a flood of logs never stalls
the relay. Stdout is never buffered beyond what one read returned: its reader is the one reading.

Resource handling: :meth:`Demultiplexer.close` (the owner closed the source) ends both streams:
readers waiting get EOF.
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
        self,
        source: trio.abc.ReceiveStream,
        decode: Decoder,
        *,
        max_buffered: int,
        stderr_only: bool = False,
    ) -> None:
        self._source = source
        self._decode = decode
        self._max_buffered = max_buffered
        self._reading = False
        self.eof = False
        self.error: Exception | None = None
        self.stderr_dropped = 0
        self.stdout = _Output(self, STDOUT)
        self.stderr = _Output(self, STDERR)
        # The source carries only stderr (stdout goes elsewhere): the stderr reader leads.
        self.stdout.closed = stderr_only

    def close(self) -> None:
        """The source was closed by its owner: both streams end (waiting readers get EOF)."""
        self.eof = True
        self.stdout.wake()
        self.stderr.wake()

    def _may_read(self, output: _Output) -> bool:
        return not self._reading and (output is self.stdout or self.stdout.closed)

    async def _read_for(self, output: _Output) -> None:
        """Read the source once, or wait until something changes for ``output``."""
        if not self._may_read(output):
            await output.wait()
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
            self._file(data)
        except FramingError as exc:
            # Broken framing: neither stream can be trusted any more.
            self.error = exc
            self.eof = True
        finally:
            other = self.stderr if output is self.stdout else self.stdout
            if other.chunks or self.eof or self._may_read(other):
                other.wake()

    def _file(self, data: bytes | bytearray) -> None:
        for stream_id, payload in self._decode(bytes(data)):
            if stream_id == STDOUT:
                if not self.stdout.closed:
                    self.stdout.file(payload)
            elif stream_id == STDERR:
                if self.stderr.buffered >= self._max_buffered:
                    self.stderr_dropped += len(payload)
                else:
                    self.stderr.file(payload)


class _Output(trio.abc.ReceiveStream):
    def __init__(self, demux: Demultiplexer, stream_id: int) -> None:
        self._demux = demux
        self._stream_id = stream_id
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.closed = False
        self._wakeup: trio.Event | None = None

    def file(self, payload: bytes) -> None:
        self.chunks.append(payload)
        self.buffered += len(payload)

    def wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    async def wait(self) -> None:
        if self._wakeup is None:
            self._wakeup = trio.Event()
        await self._wakeup.wait()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        demux = self._demux
        # Every call is a checkpoint (trio's stream contract); a call that waited or read the
        # source has been one already, so the hot path does not yield twice.
        waited = False
        while True:
            if self.closed:
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
        """Done with this stream. Closing stdout hands the source to the stderr reader."""
        self.closed = True
        self.chunks.clear()
        self.buffered = 0
        self.wake()
        if self is self._demux.stdout:
            self._demux.stderr.wake()
        await trio.lowlevel.checkpoint()
