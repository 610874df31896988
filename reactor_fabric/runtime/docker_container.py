"""A started Docker container as the runtime hands it out: its stdin, stdout and stderr.

Attached through the engine, all three share the attach connection, on which Docker multiplexes
stdout and stderr; they are split here (:mod:`.docker_framing` decodes the frames,
:mod:`.demux` reads one socket as two streams, with no task of its own). With socket stdio
(:mod:`.stdio_sockets`) the attach carries stderr only, and stdin and stdout are the
container's own socket (:meth:`DockerContainer.connected`, before the container is handed out).
Either way relay I/O stays on trio's thread (:class:`~reactor_fabric._sockets.LeanSocketStream`).

Bounds: a frame is at most ``max_frame`` bytes (a larger one is broken framing), and what
waits in memory for a reader at most ``max_buffered`` bytes (:data:`OUTPUT_BUFFER_BYTES`): past
it new stderr is dropped and counted (:attr:`DockerContainer.stderr_dropped`).

Resource handling: :meth:`DockerContainer.aclose` closes both sockets (the container itself is
removed by the runtime); readers waiting on the demultiplexer get EOF, not a hang.
"""

from __future__ import annotations

import trio

from .._sockets import LeanSocketStream
from .demux import Demultiplexer
from .docker_framing import DockerFrameDecoder

# Stdout bytes read on the stderr reader's behalf, and stderr bytes, that may wait in memory.
OUTPUT_BUFFER_BYTES = 256 * 1024


class _SocketStdin:
    __slots__ = ("_stream",)

    def __init__(self, stream: LeanSocketStream) -> None:
        self._stream = stream

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    def send_if_idle(self, data: bytes) -> int | None:
        """(see :func:`reactor_fabric._sockets.send_now_if_idle`)"""
        return self._stream.send_if_idle(data)

    async def send_eof(self) -> None:
        await self._stream.send_eof()


class DockerContainer:
    """A started Docker container: stdin, stdout and stderr.

    Attached through the engine, all three share the attach connection, split here. With
    ``socket_stdio`` the attach carries stderr only, and stdin and stdout are the container's
    own socket (:meth:`connected`, before the container is handed out).
    """

    def __init__(
        self,
        container_id: str,
        name: str,
        stream: LeanSocketStream,
        *,
        max_frame: int,
        max_buffered: int,
        socket_stdio: bool = False,
    ) -> None:
        self._id = container_id
        self._name = name
        self._stream = stream
        self._stdio: LeanSocketStream | None = None
        self._stdin = _SocketStdin(stream)
        decoder = DockerFrameDecoder(max_frame=max_frame)
        self._demux = Demultiplexer(
            stream, decoder.feed, max_buffered=max_buffered, stderr_only=socket_stdio
        )
        self._stdout: trio.abc.ReceiveStream = self._demux.stdout

    def connected(self, stdio: LeanSocketStream) -> None:
        """The container's stdio socket connected: it is now stdin and stdout."""
        self._stdio = stdio
        self._stdin = _SocketStdin(stdio)
        self._stdout = stdio

    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str:
        return self._name

    @property
    def socket_stdio(self) -> bool:
        """Whether stdin and stdout bypass the engine (see :mod:`.stdio_sockets`)."""
        return self._stdio is not None

    @property
    def stdin(self) -> _SocketStdin:
        return self._stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> trio.abc.ReceiveStream:
        return self._demux.stderr

    @property
    def stderr_dropped(self) -> int:
        return self._demux.stderr_dropped

    async def aclose(self) -> None:
        self._demux.close()  # readers waiting for the stdout reader get EOF, not a hang
        try:
            if self._stdio is not None:
                await self._stdio.aclose()
        finally:
            await self._stream.aclose()
