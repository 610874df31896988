"""The client channel's contract: once the client is gone, every implementation raises
ChannelClosed from send (and close), never the transport's own exceptions."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from reactor_fabric._sockets import LeanSocketStream
from reactor_fabric.trio.channel import ChannelClosed, channel_boundary
from reactor_fabric.trio.http_channel import HttpChannel
from reactor_fabric.trio.websocket import WebSocketChannel, WebSocketSettings
from tests.fakes import MemoryClient

FRAME = b'{"jsonrpc": "2.0", "id": 1, "result": {}}'


class _Transport:
    """What a channel sends through: raises what it is told to."""

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure

    @channel_boundary
    async def send(self, frame: bytes) -> None:
        await trio.lowlevel.checkpoint()
        raise self.failure


@pytest.mark.parametrize(
    "failure",
    [trio.BrokenResourceError("reset by peer"), trio.ClosedResourceError("closed")],
    ids=["broken", "closed"],
)
async def test_the_boundary_turns_trios_stream_errors_into_channel_closed(
    failure: BaseException,
) -> None:
    with pytest.raises(ChannelClosed) as raised:
        await _Transport(failure).send(FRAME)
    assert raised.value.__cause__ is failure


async def test_the_boundary_lets_anything_else_through_unchanged() -> None:
    bug = LookupError("a bug")
    with pytest.raises(LookupError, match="a bug") as raised:
        await _Transport(bug).send(FRAME)
    assert raised.value is bug


class _BreakingStream(trio.abc.Stream):
    """A client connection whose writes wait until it breaks, then fail as a reset would."""

    def __init__(self) -> None:
        self.broken = trio.Event()
        self.writing = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writing.set()
        await self.broken.wait()
        raise trio.BrokenResourceError("connection reset by peer")

    async def wait_send_all_might_not_block(self) -> None:
        await self.broken.wait()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.sleep_forever()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _settings(buffer_bytes: int) -> WebSocketSettings:
    return WebSocketSettings(
        max_message_bytes=1 << 20, buffer_bytes=buffer_bytes, write_timeout=3600.0
    )


async def test_a_websocket_whose_connection_broke_raises_channel_closed_from_send() -> None:
    stream = _BreakingStream()
    channel = WebSocketChannel(stream, _settings(1 << 20))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.run_writer)
        await channel.send(FRAME)  # queued: the writer owns the connection
        await stream.writing.wait()
        stream.broken.set()
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(ChannelClosed):
            await channel.send(FRAME)
        await channel.close(1000)  # nothing left to close: not an error


async def test_a_websocket_send_waiting_for_room_raises_channel_closed_once_the_link_breaks() -> (
    None
):
    stream = _BreakingStream()
    channel = WebSocketChannel(stream, _settings(1))  # one frame fills the buffer
    outcome: list[str] = []

    async def send_second() -> None:
        try:
            await channel.send(FRAME)
        except ChannelClosed:
            outcome.append("ChannelClosed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.run_writer)
        await channel.send(FRAME)
        await stream.writing.wait()
        nursery.start_soon(send_second)
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == []  # waiting for room
        stream.broken.set()
    assert outcome == ["ChannelClosed"]


async def test_an_http_channel_of_an_ended_session_raises_channel_closed() -> None:
    channel = HttpChannel()
    await channel.close(1000, "expired")
    with pytest.raises(ChannelClosed):
        await channel.send(FRAME)
    with pytest.raises(ChannelClosed):
        await channel.submit(FRAME)  # the HTTP side: a POST for a session that has ended
    await channel.close(1000, "again")  # closing twice is no error


async def test_the_test_clients_channel_raises_channel_closed_once_the_test_stopped_reading() -> (
    None
):
    client = MemoryClient()
    await client.from_relay.aclose()  # the client's connection is gone
    with pytest.raises(ChannelClosed):
        await client.send(FRAME)
    await client.close(1000)
    with pytest.raises(ChannelClosed):
        await client.send(FRAME)


def _socket_pair() -> tuple[LeanSocketStream, socket.socket]:
    ours, client = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.setblocking(False)
    return LeanSocketStream(ours), client


def _read_frames(client: socket.socket, count: int, data: bytes = b"") -> list[bytes]:
    """``count`` server text frames (unmasked, unfragmented) read from the client's socket
    (after ``data``, read from it before)."""
    client.setblocking(True)
    client.settimeout(5)
    frames: list[bytes] = []
    while len(frames) < count:
        if len(data) >= 2:
            assert data[0] == 0x81  # FIN, text
            size, start = data[1] & 0x7F, 2
            if size == 126:
                size, start = int.from_bytes(data[2:4], "big"), 4
            elif size == 127:
                size, start = int.from_bytes(data[2:10], "big"), 10
            if len(data) >= start + size:
                frames.append(data[start : start + size])
                data = data[start + size :]
                continue
        data += client.recv(1 << 20)
    return frames


async def test_a_frame_for_an_idle_websocket_is_written_by_the_sending_task_itself() -> None:
    stream, client = _socket_pair()
    channel = WebSocketChannel(stream, _settings(1 << 20))
    # No writer task runs: the frame is on the wire when send returns.
    await channel.send(FRAME)
    assert _read_frames(client, 1) == [FRAME]
    client.close()
    await stream.aclose()


async def test_what_the_kernel_does_not_take_at_once_goes_to_the_writer_and_keeps_its_order() -> (
    None
):
    stream, client = _socket_pair()
    channel = WebSocketChannel(stream, _settings(1 << 24))
    big = b'{"x": "' + b"y" * 3_000_000 + b'"}'
    async with trio.open_nursery() as nursery:
        await channel.send(big)  # part at once, the rest queued for the writer
        early = client.recv(1 << 20)  # the client reads: the kernel has room again
        await channel.send(FRAME)  # behind the rest of the first: queued, not written at once
        nursery.start_soon(channel.run_writer)
        frames = await trio.to_thread.run_sync(_read_frames, client, 2, early)
        assert frames == [big, FRAME]
        nursery.cancel_scope.cancel()
    client.close()
    await stream.aclose()


async def test_frames_of_a_burst_are_left_to_the_writer_which_writes_them_together() -> None:
    stream, client = _socket_pair()
    channel = WebSocketChannel(stream, _settings(1 << 20))
    await channel.send(FRAME, more=True)  # more follow: held for the writer
    await channel.send(FRAME)  # the last of the burst: behind the first
    with pytest.raises(BlockingIOError):
        client.recv(1024)  # nothing written yet: no writer runs
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.run_writer)
        frames = await trio.to_thread.run_sync(_read_frames, client, 2)
        assert frames == [FRAME, FRAME]
        nursery.cancel_scope.cancel()
    client.close()
    await stream.aclose()
