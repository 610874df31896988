"""A started session pod as a container: its attach split into stdin, stdout and stderr.

The Kubernetes runtime hands this out once the pod's server runs and its attach was accepted.
The attach's messages carry a channel byte each (:class:`~reactor_fabric.protocol.k8s_attach.
AttachChannels`, pure, says what they mean): stdout and stderr are demultiplexed by
:class:`~.demux.Demultiplexer` (as Docker's multiplexed attach is), stdin is written as stdin
messages, and closing stdin is a half-close where the protocol has one (v5) and the whole
attach's end where it has not (v4). The attach's closing status (how the server ended, as far
as the API server says) is handed to the runtime, which asks it when the kubelet is slow to
report the exit.

Bounds: stderr not read is buffered up to ``max_buffered`` bytes, then dropped (counted in
:attr:`KubernetesContainer.stderr_dropped`); a message's size is bounded by the socket.

Error handling: a message that breaks the channel protocol ends stdout as broken framing
(:class:`~reactor_fabric.protocol.framing.FramingError`), as a Docker stream's broken frame
does.

Resource handling: :meth:`KubernetesContainer.aclose` stops the demultiplexer and closes the
attach (the pod itself is the runtime's to remove).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import trio

from ..protocol.framing import FramingError
from ..protocol.k8s_attach import AttachChannels, AttachProtocolError, AttachStatus, Output
from .demux import Demultiplexer
from .kubernetes_attach import AttachSocket

OUTPUT_BUFFER_BYTES: Final = 256 * 1024


class _AttachStdin:
    __slots__ = ("_channels", "_socket")

    def __init__(self, socket: AttachSocket, channels: AttachChannels) -> None:
        self._socket = socket
        self._channels = channels

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._socket.send_message(self._channels.stdin(bytes(data)))

    async def send_eof(self) -> None:
        message = self._channels.close_stdin()
        if message is None:
            await self._socket.close()  # v4: no half-close, the whole attach ends
        else:
            await self._socket.send_message(message)


class _Messages(trio.abc.ReceiveStream):
    """The attach's messages as a stream for the demultiplexer: each read returns one whole
    message (channel byte first), whatever ``max_bytes`` asks, since the channel byte only
    begins a message; the message bound is the socket's."""

    def __init__(self, socket: AttachSocket) -> None:
        self._socket = socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        message = await self._socket.receive_message()
        return b"" if message is None else message

    async def aclose(self) -> None:
        await self._socket.aclose()


class KubernetesContainer:
    """A running session pod: its attach, split into stdin, stdout and stderr."""

    def __init__(
        self,
        name: str,
        socket: AttachSocket,
        *,
        max_buffered: int,
        on_status: Callable[[AttachStatus], object],
    ) -> None:
        self._name = name
        self._socket = socket
        self._channels = AttachChannels(socket.subprotocol)
        self._stdin = _AttachStdin(socket, self._channels)
        self._on_status = on_status
        self._demux = Demultiplexer(_Messages(socket), self._decode, max_buffered=max_buffered)

    def _decode(self, message: bytes) -> list[tuple[int, bytes]]:
        try:
            event = self._channels.receive(message)
        except AttachProtocolError as exc:
            raise FramingError(f"attach: {exc}") from None
        if isinstance(event, Output):
            return [(event.channel, event.data)]
        if isinstance(event, AttachStatus):
            self._on_status(event)
        return []

    @property
    def id(self) -> str:
        return self._name

    @property
    def name(self) -> str:
        return self._name

    @property
    def stdin(self) -> _AttachStdin:
        return self._stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._demux.stdout

    @property
    def stderr(self) -> trio.abc.ReceiveStream:
        return self._demux.stderr

    @property
    def stderr_dropped(self) -> int:
        return self._demux.stderr_dropped

    @property
    def subprotocol(self) -> str:
        return self._socket.subprotocol

    async def aclose(self) -> None:
        self._demux.close()
        await self._socket.aclose()
