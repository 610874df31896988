"""The suite's secret values, kept out of everything the orchestrator writes or shows.

The values are registered once, when the orchestrator resolves its services' secrets
(:mod:`reactor_fabric.config.secrets`), in the process-wide :data:`SECRET_VALUES`. The log's
formatter passes every line through it, and a container's stderr line is redacted before it is
logged or kept for an error's details: a value a server prints (a debug line with its token)
reaches no record.

What is JSON — the audit trail's records, what the operators' routes keep and answer with
(``/api/calls``, ``/api/sessions``, ``/api/stats``, the status page), the offers a server
makes (cached on disk, served by ``/mcp``) — goes through one function,
:meth:`Redactor.redacted_encoded` (and its two halves, :meth:`Redactor.redacted` and
:meth:`Redactor.redacted_json`): a page shows what the trail has. It encodes the value once and
looks for a registered value in that text; only when one is there does it replace it in the
value's strings (keys too) and numbers, so that what comes out is still JSON of the same shape.

A value is matched as it is and as it looks inside a JSON string (quotes, backslashes and
control characters escaped), since the log and the trail are JSON lines.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from typing import Any, TypeVar

from ..protocol.deep_json import DeepEncoder

REDACTED = "[REDACTED]"
# msgspec's encoding, at any depth of nesting (a server's schema is nested as deep as it likes).
_encoder = DeepEncoder()
Value = TypeVar("Value")


class Redactor:
    """Replaces registered values with :data:`REDACTED`; thread-safe (the log's writer
    thread and the audit's encoder read it, the start registers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._text: re.Pattern[str] | None = None
        self._bytes: re.Pattern[bytes] | None = None

    def register(self, values: Iterable[str]) -> None:
        with self._lock:
            for value in values:
                if value:
                    self._values |= _forms(value)
            self._compile()

    def forget(self, values: Iterable[str]) -> None:
        """Redact ``values`` no more (a Kubernetes pod's egress token, once the pod is gone:
        the set stays bounded by the live pods)."""
        with self._lock:
            for value in values:
                if value:
                    self._values -= _forms(value)
            self._compile()

    def _compile(self) -> None:
        # Longest first: a value containing another is replaced whole.
        forms = sorted(self._values, key=len, reverse=True)
        self._text = re.compile("|".join(map(re.escape, forms))) if forms else None
        self._bytes = (
            re.compile(b"|".join(re.escape(form.encode()) for form in forms)) if forms else None
        )

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._text = self._bytes = None

    def redact(self, text: str) -> str:
        pattern = self._text
        return text if pattern is None else pattern.sub(REDACTED, text)

    def redact_bytes(self, data: bytes) -> bytes:
        pattern = self._bytes
        return data if pattern is None else pattern.sub(REDACTED.encode(), data)

    def redacted_encoded(self, value: Value) -> tuple[Value, bytes]:
        """``value`` (JSON's kinds: dicts, lists, strings, numbers…; a tuple is taken for a
        list) without a registered value, and its JSON (msgspec's encoding). When it carries
        none, the usual case, it is returned itself with its one encoding; else a copy whose
        strings (keys too) have every value replaced by :data:`REDACTED`, and whose numbers
        whose JSON has one are that string."""
        data = _encoder.encode(value)
        pattern = self._bytes
        if pattern is None or pattern.search(data) is None:
            return value, data
        clean = self._replaced(value)
        return clean, _encoder.encode(clean)

    def redacted(self, value: Value) -> Value:
        """``value`` without a registered value (see :meth:`redacted_encoded`)."""
        if self._bytes is None:
            return value  # nothing registered: not even encoded
        return self.redacted_encoded(value)[0]

    def redacted_json(self, value: object) -> bytes:
        """``value``'s JSON without a registered value (see :meth:`redacted_encoded`)."""
        return self.redacted_encoded(value)[1]

    def _replaced(self, value: Value) -> Value:
        """A copy of ``value`` with every registered value replaced, walked with a stack of
        its own (as deep as it is nested)."""
        text, data = self._text, self._bytes
        if text is None or data is None:
            return value
        holder: list[Any] = [value]
        todo: list[tuple[Any, Any]] = [(holder, 0)]
        while todo:
            parent, key = todo.pop()
            item = parent[key]
            if isinstance(item, str):
                parent[key] = text.sub(REDACTED, item)
            elif isinstance(item, dict):
                copy: dict[Any, Any] = {}
                for name, inner in item.items():
                    shown = text.sub(REDACTED, name) if isinstance(name, str) else name
                    copy[shown] = inner
                    todo.append((copy, shown))
                parent[key] = copy
            elif isinstance(item, list | tuple):
                items = list(item)
                todo.extend((items, index) for index in range(len(items)))
                parent[key] = items
            elif (
                isinstance(item, int | float)
                and not isinstance(item, bool)
                and data.search(_encoder.encode(item)) is not None
            ):
                parent[key] = REDACTED
        result: Value = holder[0]
        return result


def _forms(value: str) -> set[str]:
    return {value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]}


# The process's one redactor: the secrets of the suite it serves.
SECRET_VALUES = Redactor()
