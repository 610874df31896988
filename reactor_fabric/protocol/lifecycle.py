"""A service's container lifecycle, as both session machines read it. Pure.

The suite's ``container_strategy`` and smart_refresh's bounds (see docs/USAGE.md, "Container
lifecycles"): ``reuse_per_session`` — one container serves every call of the session;
``fresh_per_call`` — a container serves one call and goes; ``smart_refresh`` — reused, but
replaced between calls once it served ``max_calls`` calls, is ``max_age`` seconds old (from its
start), or uses more than ``memory_threshold`` bytes (read between calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._reasons import REFRESH_AGE, REFRESH_CALLS

Strategy = Literal["reuse_per_session", "fresh_per_call", "smart_refresh"]


@dataclass(frozen=True, slots=True)
class Lifecycle:
    strategy: Strategy = "reuse_per_session"
    max_calls: int | None = None
    max_age: float | None = None
    memory_threshold: int | None = None

    @property
    def reuses(self) -> bool:
        return self.strategy == "reuse_per_session"

    def bound_reached(self, calls: int, started_at: float | None, now: float) -> str | None:
        """Which of smart_refresh's call and age bounds a container has reached, as its stop
        reason (``refresh_calls``, ``refresh_age``); None while it may serve on, or under
        another strategy. ``started_at``: when it started (None: not yet). The age is compared
        as ``now >= started_at + max_age``, the very sum a machine's deadline is set to, so
        that the check is true when that deadline comes."""
        if self.strategy != "smart_refresh":
            return None
        if self.max_calls is not None and calls >= self.max_calls:
            return REFRESH_CALLS
        if self.max_age is not None and started_at is not None and now >= started_at + self.max_age:
            return REFRESH_AGE
        return None


REUSE = Lifecycle()
