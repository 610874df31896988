"""Docker's multiplexed stdio framing, decoded inside the Docker runtime."""

from __future__ import annotations

import struct

import pytest

from reactor_fabric.protocol.framing import FramingError
from reactor_fabric.runtime.docker_framing import (
    STDERR,
    STDOUT,
    DockerFrameDecoder,
    docker_frame,
)


def test_frames_are_split_by_stream_whatever_the_chunking() -> None:
    wire = (
        docker_frame(STDOUT, b'{"a":1}\n')
        + docker_frame(STDERR, b"log line\n")
        + docker_frame(STDOUT, b"x")
    )
    for size in (1, 3, 8, 9, len(wire)):
        decoder = DockerFrameDecoder(max_frame=1024)
        got = []
        for start in range(0, len(wire), size):
            got += decoder.feed(wire[start : start + size])
        assert got == [(STDOUT, b'{"a":1}\n'), (STDERR, b"log line\n"), (STDOUT, b"x")]
        assert decoder.pending == 0


def test_one_whole_frame_in_one_read_is_decoded_on_the_short_path() -> None:
    decoder = DockerFrameDecoder(max_frame=1024)
    assert decoder.feed(docker_frame(STDOUT, b"hello\n")) == [(STDOUT, b"hello\n")]
    with pytest.raises(FramingError, match="stream id 9"):
        decoder.feed(docker_frame(9, b"x"))


def test_an_unknown_stream_id_is_a_framing_error() -> None:
    with pytest.raises(FramingError, match="stream id 7"):
        DockerFrameDecoder(max_frame=10).feed(docker_frame(7, b"x") + b"more")


def test_an_oversized_frame_is_refused_before_it_is_buffered() -> None:
    decoder = DockerFrameDecoder(max_frame=4)
    with pytest.raises(FramingError, match="exceeds 4"):
        decoder.feed(struct.pack(">BxxxL", STDOUT, 5))
