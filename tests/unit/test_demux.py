"""One multiplexed stream read as stdout and stderr, with no task of its own."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from reactor_fabric.protocol.framing import FramingError
from reactor_fabric.runtime.demux import Demultiplexer
from reactor_fabric.runtime.docker_framing import STDERR, STDOUT, DockerFrameDecoder, docker_frame


def demux_over(
    max_buffered: int = 1 << 20,
) -> tuple[trio.testing.MemorySendStream, Demultiplexer]:
    send, receive = trio.testing.memory_stream_one_way_pair()
    decoder = DockerFrameDecoder(max_frame=1 << 20)
    return send, Demultiplexer(receive, decoder.feed, max_buffered=max_buffered)


async def test_each_reader_gets_only_its_own_stream_in_order() -> None:
    send, demux = demux_over()
    await send.send_all(
        docker_frame(STDERR, b"e1\n")
        + docker_frame(STDOUT, b"o1\n")
        + docker_frame(STDERR, b"e2\n")
        + docker_frame(STDOUT, b"o2\n")
    )
    await send.aclose()
    out, err = b"", b""
    async with trio.open_nursery() as nursery:

        async def read_err() -> None:
            nonlocal err
            while chunk := await demux.stderr.receive_some():
                err += chunk

        nursery.start_soon(read_err)
        while chunk := await demux.stdout.receive_some():
            out += chunk
    assert (out, err) == (b"o1\no2\n", b"e1\ne2\n")


async def test_a_reader_waits_while_the_other_reads_the_source() -> None:
    send, demux = demux_over()
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def read_err() -> None:
            got.append(await demux.stderr.receive_some())

        nursery.start_soon(read_err)
        await trio.testing.wait_all_tasks_blocked()
        # stderr's reader is the one reading the source; stdout's waits for it.
        nursery.start_soon(demux.stdout.receive_some)
        await trio.testing.wait_all_tasks_blocked()
        await send.send_all(docker_frame(STDOUT, b"out") + docker_frame(STDERR, b"err"))
    assert got == [b"err"]


async def test_stdout_read_for_the_stderr_reader_is_bounded_then_the_stderr_reader_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, demux = demux_over(max_buffered=8)
    await send.send_all(docker_frame(STDOUT, b"0123456789"))
    with trio.move_on_after(1) as waited:
        await demux.stderr.receive_some()  # reads the stdout frame for the stdout reader...
    await send.send_all(docker_frame(STDERR, b"late"))
    with trio.move_on_after(1) as waited:
        await demux.stderr.receive_some()  # ...and, with 10 bytes of it waiting, reads no more
    assert waited.cancelled_caught
    assert demux.stdout.buffered == 10
    assert await demux.stdout.receive_some() == b"0123456789"
    assert await demux.stderr.receive_some() == b"late"


async def test_stderr_beyond_its_bound_is_dropped_and_counted_never_blocking_stdout() -> None:
    send, demux = demux_over(max_buffered=4)
    await send.send_all(
        docker_frame(STDERR, b"abcd") + docker_frame(STDERR, b"efgh") + docker_frame(STDOUT, b"x")
    )
    assert await demux.stdout.receive_some() == b"x"
    assert demux.stderr_dropped == 4
    assert await demux.stderr.receive_some() == b"abcd"


async def test_broken_framing_fails_both_streams() -> None:
    send, demux = demux_over()
    await send.send_all(docker_frame(7, b"?"))
    with pytest.raises(FramingError):
        await demux.stdout.receive_some()
    with pytest.raises(FramingError):
        await demux.stderr.receive_some()


async def test_a_read_larger_than_asked_is_kept_for_the_next_call() -> None:
    send, demux = demux_over()
    await send.send_all(docker_frame(STDOUT, b"abcdef"))
    await send.aclose()
    assert await demux.stdout.receive_some(4) == b"abcd"
    assert await demux.stdout.receive_some(4) == b"ef"
    assert await demux.stdout.receive_some() == b""
    assert await demux.stderr.receive_some() == b""
