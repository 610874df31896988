from __future__ import annotations

import pytest

from reactor_fabric.protocol.framing import LineSplitter, LineTooLong, TruncatingLineSplitter


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


def test_one_whole_line_in_one_chunk_takes_the_short_path_with_the_same_rules() -> None:
    assert LineSplitter(max_line=10).feed(b'{"id":1}\n') == [b'{"id":1}']
    assert LineSplitter(max_line=10).feed(b"   \n") == []
    with pytest.raises(LineTooLong):
        LineSplitter(max_line=3).feed(b"abcd\n")


def test_a_long_stderr_line_is_cut_and_the_rest_counted_never_refused() -> None:
    splitter = TruncatingLineSplitter(max_line=4)
    assert splitter.feed(b"abcdefgh") == []
    assert splitter.feed(b"ij\nshort\nok\n") == [(b"abcd", 6), (b"shor", 1), (b"ok", 0)]
    assert splitter.feed(b"tail") == []
    assert splitter.flush() == (b"tail", 0)
    assert splitter.flush() is None


def test_a_stderr_flood_without_newlines_holds_only_the_line_limit() -> None:
    splitter = TruncatingLineSplitter(max_line=16)
    for _ in range(1000):
        splitter.feed(b"x" * 4096)
    assert splitter.feed(b"\n") == [(b"x" * 16, 1000 * 4096 - 16)]
