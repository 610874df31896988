"""Parsing of the human-friendly quantities used in the suite file: durations and byte sizes.

Pure functions; both raise :class:`ValueError` with a message meant for the user.
"""

from __future__ import annotations

import re

_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
# Go's time.ParseDuration shape, which the original suite format used ("1m", "5m30s").
# "ms" must be tried before "m" and "s" so that "500ms" is not read as "500m" + "s".
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|h|m|s))+")

_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"(\d+)\s*([bkmgt]?)(?:i?b)?", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``"1m"``, ``"5m30s"``, ``"1.5h"`` or ``"250ms"``.

    Units: ``h``, ``m``, ``s``, ``ms``; parts may be combined. The result must be positive.
    """
    if not isinstance(text, str) or _DURATION_WHOLE.fullmatch(text) is None:
        raise ValueError(
            f"{text!r} is not a duration; use a number and a unit (h, m, s, ms), "
            "e.g. '1m' or '5m30s'"
        )
    seconds = sum(
        float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(text)
    )
    if seconds <= 0:
        raise ValueError(f"{text!r} must be a positive duration")
    return seconds


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``"512m"``, ``"1g"``, ``"256MiB"`` or a plain integer.

    Suffixes are binary (``k`` = 1024), as Docker reads them. The result must be positive.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"{text!r} is not a size; use e.g. '512m', '1g' or a number of bytes")
        value = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{text!r} must be a positive size")
    return value
