from __future__ import annotations

import struct

import pytest

from reactor_fabric.protocol.framing import (
    STDERR,
    STDOUT,
    DockerStreamDemuxer,
    FramingError,
    LineSplitter,
    LineTooLong,
    docker_frame,
)


def test_frames_are_split_by_stream_whatever_the_chunking() -> None:
    wire = (
        docker_frame(STDOUT, b'{"a":1}\n')
        + docker_frame(STDERR, b"log line\n")
        + docker_frame(STDOUT, b"x")
    )
    for size in (1, 3, 8, 9, len(wire)):
        demuxer = DockerStreamDemuxer(max_frame=1024)
        got = []
        for start in range(0, len(wire), size):
            got += demuxer.feed(wire[start : start + size])
        assert got == [(STDOUT, b'{"a":1}\n'), (STDERR, b"log line\n"), (STDOUT, b"x")]
        assert demuxer.pending == 0


def test_an_unknown_stream_id_is_a_framing_error() -> None:
    with pytest.raises(FramingError, match="stream id 7"):
        DockerStreamDemuxer(max_frame=10).feed(docker_frame(7, b"x"))


def test_an_oversized_frame_is_refused_before_it_is_buffered() -> None:
    demuxer = DockerStreamDemuxer(max_frame=4)
    with pytest.raises(FramingError, match="exceeds 4"):
        demuxer.feed(struct.pack(">BxxxL", STDOUT, 5))


def test_lines_are_reassembled_across_chunks_and_empty_lines_dropped() -> None:
    splitter = LineSplitter(max_line=100)
    assert splitter.feed(b'{"id":1') == []
    assert splitter.feed(b'}\n\n{"id":2}\n{"id"') == [b'{"id":1}', b'{"id":2}']
    assert splitter.feed(b":3}\r\n") == [b'{"id":3}\r']
    assert splitter.flush() is None


def test_a_line_without_a_final_newline_is_returned_by_flush() -> None:
    splitter = LineSplitter(max_line=100)
    splitter.feed(b'{"id":9}')
    assert splitter.flush() == b'{"id":9}'
    assert splitter.flush() is None


def test_a_line_longer_than_the_limit_is_refused_even_before_its_newline() -> None:
    splitter = LineSplitter(max_line=8)
    splitter.feed(b"12345")
    with pytest.raises(LineTooLong):
        splitter.feed(b"6789")
    with pytest.raises(LineTooLong):
        LineSplitter(max_line=3).feed(b"abcd\n")


def test_a_line_exactly_at_the_limit_passes() -> None:
    assert LineSplitter(max_line=4).feed(b"abcd\n") == [b"abcd"]
