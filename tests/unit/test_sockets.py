"""The lean socket stream: trio's stream contract over a real socketpair, minus one yield."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from reactor_fabric._sockets import LeanSocketStream, send_now_if_idle


def pair() -> tuple[LeanSocketStream, LeanSocketStream]:
    a, b = socket.socketpair()
    return LeanSocketStream(a), LeanSocketStream(b)


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def test_bytes_sent_arrive_in_order_and_eof_is_an_empty_read() -> None:
    left, right = pair()
    await left.send_all(b"hello ")
    await left.send_all(memoryview(b"world"))
    await left.send_eof()
    received = b""
    while chunk := await right.receive_some(3):
        received += chunk
    assert received == b"hello world"
    await left.aclose()
    await right.aclose()


async def test_a_write_larger_than_the_socket_buffers_waits_for_the_reader() -> None:
    left, right = pair()
    left.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    payload = bytes(range(256)) * 8192  # 2 MiB
    received = bytearray()
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            while len(received) < len(payload):
                received.extend(await right.receive_some(65536))

        nursery.start_soon(read)
        await left.send_all(payload)
    assert bytes(received) == payload
    await left.aclose()
    await right.aclose()


async def test_a_write_the_kernel_takes_at_once_does_not_yield_but_a_read_does() -> None:
    left, right = pair()
    steps = _Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        before = steps.steps
        await left.send_all(b"x")  # the writer yields at its queue instead (see the module)
        assert steps.steps == before
        await right.receive_some(1)  # data was there: still a fairness yield, as trio does
        assert steps.steps == before + 1
    finally:
        trio.lowlevel.remove_instrument(steps)
    await left.aclose()
    await right.aclose()


async def test_send_nowait_writes_what_fits_and_never_waits() -> None:
    left, right = pair()
    left.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sent = left.send_nowait(b"x" * 10_000_000)
    assert 0 < sent < 10_000_000
    assert left.send_nowait(b"more") == 0  # full: nothing taken, no waiting
    await left.aclose()
    await right.aclose()


async def test_a_task_writes_at_once_only_while_no_task_is_writing() -> None:
    left, right = pair()
    left.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    assert send_now_if_idle(left, b"first ") == len(b"first ")
    payload = b"y" * 2_000_000  # more than the buffers: its writer waits for the reader
    received = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_all, payload)
        await trio.testing.wait_all_tasks_blocked()
        # The writer is mid-write: a second writer would interleave bytes, so none is taken.
        assert send_now_if_idle(left, b"never") is None
        while len(received) < len(b"first ") + len(payload):
            received.extend(await right.receive_some(65536))
    assert bytes(received) == b"first " + payload
    assert send_now_if_idle(left, b"!") == 1  # idle again
    assert await right.receive_some(10) == b"!"
    await left.aclose()
    assert send_now_if_idle(left, b"closed") is None  # the writer task meets it
    await right.aclose()


async def test_a_stream_that_cannot_write_without_waiting_is_left_to_its_writer() -> None:
    memory_stream, _ = trio.testing.memory_stream_pair()
    assert send_now_if_idle(memory_stream, b"x") is None
    left, right = pair()
    await right.aclose()
    # A failed write is the writer task's to meet (and report), not the hot path's.
    assert send_now_if_idle(left, b"x") is None
    await left.aclose()


async def test_a_cancelled_task_does_not_start_a_write() -> None:
    left, right = pair()
    with trio.CancelScope() as scope:
        scope.cancel()
        await left.send_all(b"never")
    right.socket.setblocking(False)
    with pytest.raises(BlockingIOError):
        right.socket.recv(10)
    await left.aclose()
    await right.aclose()


async def test_closing_wakes_a_reader_with_closed_resource_error() -> None:
    left, right = pair()
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await right.receive_some()

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        await right.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await right.send_all(b"x")
    await left.aclose()


async def test_two_concurrent_readers_are_a_busy_error() -> None:
    left, right = pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(right.receive_some)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await right.receive_some()
        await left.send_all(b"x")
    await left.aclose()
    await right.aclose()


async def test_writing_to_a_peer_that_is_gone_is_a_broken_resource() -> None:
    left, right = pair()
    await right.aclose()

    async def write_until_it_fails() -> None:
        for _ in range(100):  # the first writes may still land in the buffer
            await left.send_all(b"x" * 65536)

    with pytest.raises(trio.BrokenResourceError):
        await write_until_it_fails()
    await left.aclose()


class _CountingSocket(socket.socket):
    """A socket that counts the reads that found nothing (EAGAIN)."""

    failed_reads = 0

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        try:
            return super().recv(bufsize, flags)
        except BlockingIOError:
            self.failed_reads += 1
            raise


def counted_pair() -> tuple[LeanSocketStream, LeanSocketStream, _CountingSocket]:
    a, b = socket.socketpair()
    counted = _CountingSocket(fileno=b.detach())
    return LeanSocketStream(a), LeanSocketStream(counted), counted


async def test_after_a_read_that_emptied_the_socket_the_next_one_waits_instead_of_failing() -> None:
    left, right, counted = counted_pair()
    await left.send_all(b"request")
    assert await right.receive_some(1024) == b"request"  # less than asked: nothing more there
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            assert await right.receive_some(1024) == b"answer"

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        await left.send_all(b"answer")
    assert counted.failed_reads == 0
    await left.aclose()
    await right.aclose()


async def test_a_read_that_filled_its_buffer_leaves_the_rest_for_the_next_read() -> None:
    left, right, counted = counted_pair()
    await left.send_all(b"0123456789")
    assert await right.receive_some(4) == b"0123"
    assert await right.receive_some(4) == b"4567"
    assert await right.receive_some(4) == b"89"
    await left.send_all(b"late")  # arrived after a read that emptied the socket: still read
    assert await right.receive_some(4) == b"late"
    assert counted.failed_reads == 0
    await left.aclose()
    await right.aclose()


async def test_a_cancelled_read_after_an_emptying_one_takes_nothing_from_the_socket() -> None:
    left, right, _ = counted_pair()
    await left.send_all(b"first")
    assert await right.receive_some(1024) == b"first"
    await left.send_all(b"second")
    with trio.CancelScope() as scope:
        scope.cancel()
        await right.receive_some(1024)
    assert scope.cancelled_caught
    assert await right.receive_some(1024) == b"second"
    await left.aclose()
    await right.aclose()
