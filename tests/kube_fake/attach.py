"""``pods/attach`` over a WebSocket (``v5.channel.k8s.io`` / ``v4.channel.k8s.io``), bridged to
Docker's attach stream of the pod's container.

What the client sees is what the API server sends: one empty message on the lowest output
channel it asked for (stdout, else stderr, else the status channel), then each Docker frame as
one binary message ``[channel] + payload`` (1 stdout, 2 stderr). Messages from the client are
``[0] + bytes`` for stdin and, with v5, ``[255, 0]`` to close stdin (the fake then shuts down
the write side of Docker's attach socket: with ``stdinOnce`` the container reads EOF while its
output goes on). When the container's output ends (it exited, or was stopped by a deletion),
the status channel (3) carries ``{"metadata":{},"status":"Success"}`` — attach reports Success
whatever the exit code, as the kubelet's ServeAttach does (only exec reports NonZeroExitCode);
the exit code is in the pod's status — then a close frame (1000), and the fake waits a bounded
time for the client's close. A client that closes first (v4's only way to end stdin) ends the
attach: the container's stdin closes with it.

Backpressure both ways: the container's output is read from Docker only as fast as the client
takes it, and the client's input only as fast as the container reads its stdin.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Final

import trio
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Event, Ping, TextMessage

from reactor_fabric.runtime.docker_framing import DockerFrameDecoder

V5: Final = "v5.channel.k8s.io"
V4: Final = "v4.channel.k8s.io"
PROTOCOLS: Final = (V5, V4)
STDIN: Final = 0
STDOUT: Final = 1
STDERR: Final = 2
ERROR: Final = 3
CLOSE: Final = 255
SUCCESS: Final = {"metadata": {}, "status": "Success"}
RECEIVE_SIZE: Final = 65536
MAX_DOCKER_FRAME: Final = 1 << 20
CLOSE_WAIT_SECONDS: Final = 5.0


def internal_error(message: str) -> dict[str, Any]:
    """The status an attach that failed behind the API server ends with (v5)."""
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"Internal error occurred: {message}",
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    }


class ChannelWebSocket:
    """The server end of a channel.k8s.io WebSocket: wsproto over a trio stream."""

    def __init__(
        self, stream: trio.abc.Stream, protocol: str, received: bytes, *, write_timeout: float
    ) -> None:
        self.stream = stream
        self.protocol = protocol
        self.write_timeout = write_timeout
        self.ws = Connection(ConnectionType.SERVER)
        if received:
            self.ws.receive_data(received)
        self._send_lock = trio.Lock()
        self._message_channel: int | None = None  # the channel of a message still arriving
        self._signal = bytearray()  # a v5 close signal's payload, as it arrives
        self.stdin_closed = False

    async def _send(self, event: Event) -> None:
        async with self._send_lock:
            allowed: tuple[ConnectionState, ...] = (ConnectionState.OPEN,)
            if isinstance(event, CloseConnection):
                allowed = (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING)
            if self.ws.state not in allowed:
                return
            data = self.ws.send(event)
            with trio.fail_after(self.write_timeout):
                await self.stream.send_all(data)

    async def send_channel(self, channel: int, payload: bytes) -> None:
        await self._send(BytesMessage(data=bytes([channel]) + payload))

    async def send_status(self, status: dict[str, Any]) -> None:
        await self.send_channel(ERROR, json.dumps(status, separators=(",", ":")).encode())

    async def close(self, code: int = 1000) -> None:
        if self.ws.state is ConnectionState.OPEN:
            await self._send(CloseConnection(code=code))

    async def receive(self, docker: trio.abc.HalfCloseableStream | None) -> str:
        """Read the client until it closes or goes away ("closed", "gone"); stdin goes to
        ``docker`` (None: dropped), a v5 close signal for stdin half-closes it. A malformed
        close signal ends the connection ("protocol"), as the API server's reader does."""
        while True:
            for event in self.ws.events():
                if isinstance(event, Ping):
                    await self._send(event.response())
                elif isinstance(event, CloseConnection):
                    if self.ws.state is ConnectionState.REMOTE_CLOSING:
                        await self._send(event.response())
                    return "closed"
                elif isinstance(event, BytesMessage | TextMessage):
                    part = event.data.encode() if isinstance(event.data, str) else bytes(event.data)
                    if not await self._message_part(part, event.message_finished, docker):
                        return "protocol"
            received = await self.stream.receive_some(RECEIVE_SIZE)
            if not received:
                return "gone"
            self.ws.receive_data(bytes(received))

    async def _message_part(
        self, data: bytes, finished: bool, docker: trio.abc.HalfCloseableStream | None
    ) -> bool:
        if self._message_channel is None:
            if not data:
                return True  # an empty message: nothing, not even a channel
            self._message_channel, data = data[0], data[1:]
        channel = self._message_channel
        if channel == CLOSE and self.protocol == V5:
            self._signal += data[:2]
        elif channel == STDIN and docker is not None and not self.stdin_closed and data:
            await docker.send_all(data)
        if finished:
            self._message_channel = None
            if channel == CLOSE and self.protocol == V5:
                signal, self._signal = bytes(self._signal), bytearray()
                if len(signal) != 1:
                    return False
                if signal[0] == STDIN and docker is not None and not self.stdin_closed:
                    self.stdin_closed = True
                    await docker.send_eof()
        return True

    async def wait_closed(self) -> None:
        """After our close frame: read until the client's close (or its hang-up)."""
        await self.receive(None)


async def forward_output(docker: trio.abc.ReceiveStream, ws: ChannelWebSocket) -> None:
    """Docker's frames to the client, each as one message, until Docker's stream ends."""
    decoder = DockerFrameDecoder(max_frame=MAX_DOCKER_FRAME)
    while True:
        data = await docker.receive_some(RECEIVE_SIZE)
        if not data:
            return
        for stream_id, payload in decoder.feed(bytes(data)):
            if stream_id in (STDOUT, STDERR) and payload:
                await ws.send_channel(stream_id, payload)


GONE: Final = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


def opening_channel(*, stdout: bool, stderr: bool) -> int:
    """Where the API server's first (empty) message goes: the lowest output channel."""
    return STDOUT if stdout else STDERR if stderr else ERROR


async def bridge(
    ws: ChannelWebSocket,
    docker: trio.SocketStream,
    *,
    stdin: bool,
    stdout: bool,
    stderr: bool,
) -> None:
    """One attach, from the opening message to the close (see the module's description).

    Error handling: a client that breaks the connection, or stops reading for longer than the
    write timeout, ends the attach (the errors of :data:`GONE` propagate from the last steps).
    """
    ended = False
    await ws.send_channel(opening_channel(stdout=stdout, stderr=stderr), b"")
    async with trio.open_nursery() as nursery:

        async def output() -> None:
            nonlocal ended
            try:
                await forward_output(docker, ws)
                ended = True
            except GONE:
                pass
            nursery.cancel_scope.cancel()

        async def client() -> None:
            with contextlib.suppress(*GONE):
                await ws.receive(docker if stdin else None)
            nursery.cancel_scope.cancel()

        nursery.start_soon(output)
        nursery.start_soon(client)
    await docker.aclose()
    if ended:
        await ws.send_status(SUCCESS)
        await ws.close(1000)
        with trio.move_on_after(CLOSE_WAIT_SECONDS):
            await ws.wait_closed()


async def refuse_after_upgrade(ws: ChannelWebSocket, message: str, *, opening: int) -> None:
    """v5: the upgrade was made before the kubelet was asked; its refusal is a status."""
    await ws.send_channel(opening, b"")
    await ws.send_status(internal_error(message))
    await ws.close(1000)
    with trio.move_on_after(CLOSE_WAIT_SECONDS):
        await ws.wait_closed()
