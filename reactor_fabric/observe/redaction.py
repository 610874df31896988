"""The suite's secret values, kept out of everything the orchestrator writes or shows.

The values are registered once, when the orchestrator resolves its services' secrets
(:mod:`reactor_fabric.config.secrets`), in the process-wide :data:`SECRET_VALUES`. The log's
formatter and the audit trail's encoder pass every line through it, and a container's stderr
line is redacted before it is logged or kept for an error's details: a value a server prints
(a debug line with its token) reaches no record.

A value is matched as it is and as it looks inside a JSON string (quotes, backslashes and
control characters escaped), since the log and the trail are JSON lines.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable

REDACTED = "[REDACTED]"


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


def _forms(value: str) -> set[str]:
    return {value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]}


# The process's one redactor: the secrets of the suite it serves.
SECRET_VALUES = Redactor()
