from __future__ import annotations

import pytest

from reactor_fabric.config.units import parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1m", 60),
        ("5m30s", 330),
        ("1h", 3600),
        ("250ms", 0.25),
        ("1.5h", 5400),
        ("1m500ms", 60.5),
        ("90s", 90),
    ],
)
def test_durations_in_the_go_style_are_read_as_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "1d", "m", "-1m", "1 m", "1m ", "1M", "1.m", "s1"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0s", "0m0s", "0ms"])
def test_zero_durations_are_refused_as_not_positive(text: str) -> None:
    with pytest.raises(ValueError, match="positive"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512m", 512 * 1024**2),
        ("1g", 1024**3),
        ("256MiB", 256 * 1024**2),
        ("64k", 65536),
        ("100", 100),
        (4096, 4096),
        ("2GB", 2 * 1024**3),
        ("7b", 7),
    ],
)
def test_sizes_use_docker_binary_units(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "1.5g", "-1m", "m", "", True])
def test_malformed_sizes_are_refused(text: object) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["0", 0, "0m"])
def test_zero_sizes_are_refused_as_not_positive(text: str | int) -> None:
    with pytest.raises(ValueError, match="positive"):
        parse_size(text)
