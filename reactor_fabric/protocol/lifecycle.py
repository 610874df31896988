"""A service's container lifecycle, as both session machines read it. Pure.

The suite's ``container_strategy`` and smart_refresh's bounds (see docs/USAGE.md, "Container
lifecycles"): ``reuse_per_session`` — one container serves every call of the session;
``fresh_per_call`` — a container serves one call and goes; ``smart_refresh`` — reused, but
replaced between calls once it served ``max_calls`` calls, is ``max_age`` seconds old (from its
start), or uses more than ``memory_threshold`` bytes (read between calls; the relay only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


REUSE = Lifecycle()
