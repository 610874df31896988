"""JSON at any depth of nesting: decoded and encoded with a stack of their own, not Python's.

msgspec's decoder and encoder recurse, and stop at Python's recursion limit less the stack the
caller already uses (about 1,000 levels at the top of the stack). So a message the session's
decoder took near the top of the stack may be too deep for msgspec further down it: where a
relayed call's params are read when it ends, or where the fabric endpoint encodes a queued
request once its backend is ready. Those places use what is here, which gives the same value
and the same bytes as msgspec at any depth: msgspec still decodes and encodes every string and
number, and does all of the work for a value it can take (the usual case, at its speed).

Pure and synchronous.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

import msgspec


class DeepEncoder:
    """msgspec's JSON encoder (no spaces; ``order="sorted"``: keys sorted), which falls back to
    its own stack for a value nested too deep for msgspec at this point of the stack."""

    __slots__ = ("_encoder", "_sort")

    def __init__(self, *, order: Literal["sorted"] | None = None) -> None:
        self._encoder = msgspec.json.Encoder(order=order)
        self._sort = order == "sorted"

    def encode(self, value: object) -> bytes:
        """``value`` as JSON; raises TypeError for a value JSON cannot hold."""
        try:
            return self._encoder.encode(value)
        except RecursionError:
            return self._encode_deep(value)

    def _encode_deep(self, value: object) -> bytes:
        out: list[bytes] = []
        pending: list[object] = [value]  # what is left to emit, the next last
        while pending:
            item = pending.pop()
            if isinstance(item, _Text):
                out.append(item)
            elif isinstance(item, dict):
                parts: list[object] = [_OPEN_OBJECT]
                keys = sorted(item) if self._sort else list(item)
                for index, key in enumerate(keys):
                    if not isinstance(key, str):
                        raise TypeError("only strings are JSON object keys here")
                    if index:
                        parts.append(_COMMA)
                    parts += [_Text(self._encoder.encode(key) + b":"), item[key]]
                parts.append(_CLOSE_OBJECT)
                pending += reversed(parts)
            elif isinstance(item, list | tuple):
                parts = [_OPEN_ARRAY]
                for index, element in enumerate(item):
                    if index:
                        parts.append(_COMMA)
                    parts.append(element)
                parts.append(_CLOSE_ARRAY)
                pending += reversed(parts)
            else:
                out.append(self._encoder.encode(item))
        return b"".join(out)


class _Text(bytes):
    """Bytes to emit as they are (see :meth:`DeepEncoder._encode_deep`), told apart from
    values."""

    __slots__ = ()


_OPEN_OBJECT: Final = _Text(b"{")
_CLOSE_OBJECT: Final = _Text(b"}")
_OPEN_ARRAY: Final = _Text(b"[")
_CLOSE_ARRAY: Final = _Text(b"]")
_COMMA: Final = _Text(b",")


# A JSON text's tokens: punctuation, strings, and the other scalars (numbers, true, false,
# null), with the whitespace before each.
_TOKEN = re.compile(
    rb'[ \t\n\r]*(?:([\[\]{}:,])|("(?:[^"\\]|\\.)*")|([-+.0-9A-Za-z]+))',
    re.DOTALL,
)
_WHITESPACE: Final = b" \t\n\r"


def decode_deep(data: bytes) -> object:
    """JSON decoded with a stack of its own, for a value nested too deep for msgspec at this
    point of the stack: containers here, every string and scalar by msgspec itself, so the
    value is the one msgspec would make. Raises msgspec.DecodeError if it is not JSON."""
    decoder = _DeepDecoder()
    position = 0
    while not decoder.done:
        match = _TOKEN.match(data, position)
        if match is None:
            raise msgspec.DecodeError(f"not JSON at byte {position}")
        mark, string, scalar = match.groups()
        decoder.take(mark, string, scalar, match.start())
        position = match.end()
    if data[position:].strip(_WHITESPACE):
        raise msgspec.DecodeError(f"trailing data at byte {position}")
    return decoder.result


class _DeepDecoder:
    """The state of :func:`decode_deep`: the open containers and what may come next."""

    def __init__(self) -> None:
        self.containers: list[Any] = []  # open arrays and objects, innermost last
        self.keys: list[Any] = []  # per open container: an object's key awaiting its value
        # value | value-or-end (of an array) | key (or the end of an object) | colon | after
        # (a value: a comma or the end)
        self.expecting = "value"
        self.done = False
        self.result: object = None

    def take(self, mark: bytes | None, string: bytes | None, scalar: bytes | None, at: int) -> None:
        """One token: punctuation, a string, or another scalar."""
        if mark is not None:
            self._mark(mark, at)
        elif string is not None and self.expecting == "key":
            self.keys[-1] = msgspec.json.decode(string)
            self.expecting = "colon"
        elif self.expecting in ("value", "value-or-end"):
            self._value(msgspec.json.decode(string or scalar or b""))
        else:
            raise msgspec.DecodeError(f"unexpected {(string or scalar)!r} at byte {at}")

    def _mark(self, mark: bytes, at: int) -> None:
        expecting = self.expecting
        if mark in b"{[" and expecting in ("value", "value-or-end"):
            self.containers.append({} if mark == b"{" else [])
            self.keys.append(None)
            self.expecting = "key" if mark == b"{" else "value-or-end"
        elif mark in b"}]" and expecting in ("key", "value-or-end", "after"):
            container = self.containers[-1]
            # The right bracket, and no comma just before it (the container then has items).
            if (mark == b"}") != isinstance(container, dict) or (
                expecting != "after" and container
            ):
                raise msgspec.DecodeError(f"unexpected {mark.decode()} at byte {at}")
            self.containers.pop()
            self.keys.pop()
            self._value(container)
        elif mark == b"," and expecting == "after":
            self.expecting = "key" if isinstance(self.containers[-1], dict) else "value-or-end"
        elif mark == b":" and expecting == "colon":
            self.expecting = "value"
        else:
            raise msgspec.DecodeError(f"unexpected {mark.decode()} at byte {at}")

    def _value(self, value: object) -> None:
        """A complete value: into its container, or the whole text."""
        if not self.containers:
            self.result, self.done = value, True
            return
        container = self.containers[-1]
        if isinstance(container, dict):
            container[self.keys[-1]] = value
            self.keys[-1] = None
        else:
            container.append(value)
        self.expecting = "after"
