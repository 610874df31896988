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


class Scheduled(trio.abc.Instrument):
    """Counts how often each task is woken, by name."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self.counts[task.name] = self.counts.get(task.name, 0) + 1


async def test_the_stdout_reader_reads_the_source_and_files_stderr_for_the_stderr_reader() -> None:
    send, demux = demux_over()
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def read_err() -> None:
            got.append(await demux.stderr.receive_some())

        nursery.start_soon(read_err)
        await send.send_all(docker_frame(STDERR, b"err"))
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # the stderr reader does not read the source itself...
        await send.send_all(docker_frame(STDOUT, b"out"))
        assert await demux.stdout.receive_some() == b"out"  # ...the stdout reader does
    assert got == [b"err"]


async def test_stdout_traffic_never_wakes_the_stderr_reader() -> None:
    send, demux = demux_over()
    scheduled = Scheduled()
    got: list[bytes] = []

    async def read_err() -> None:
        got.append(await demux.stderr.receive_some())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_err, name="stderr reader")
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(scheduled)
        try:
            for n in range(20):
                await send.send_all(docker_frame(STDOUT, b"line %d\n" % n))
                assert await demux.stdout.receive_some() == b"line %d\n" % n
        finally:
            trio.lowlevel.remove_instrument(scheduled)
        assert "stderr reader" not in scheduled.counts
        await send.send_all(docker_frame(STDERR, b"now"))
        await send.aclose()
        assert await demux.stdout.receive_some() == b""
    assert got == [b"now"]


async def test_once_stdout_is_closed_the_stderr_reader_reads_the_source_and_stdout_is_dropped() -> (
    None
):
    send, demux = demux_over()
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def read_err() -> None:
            while chunk := await demux.stderr.receive_some():
                got.append(chunk)

        nursery.start_soon(read_err)
        await send.send_all(docker_frame(STDOUT, b"unread") + docker_frame(STDERR, b"last words"))
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        await demux.stdout.aclose()  # its reader is done: the stderr reader takes the source
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"last words"]
        assert demux.stdout.buffered == 0
        await send.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await demux.stdout.receive_some()


async def test_closing_the_source_ends_a_waiting_stderr_reader() -> None:
    _send, demux = demux_over()
    async with trio.open_nursery() as nursery:

        async def read_err() -> None:
            assert await demux.stderr.receive_some() == b""

        nursery.start_soon(read_err)
        await trio.testing.wait_all_tasks_blocked()
        demux.close()


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
