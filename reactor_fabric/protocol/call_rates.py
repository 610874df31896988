"""Tool calls a minute per signed-in user, across all their sessions
(``orchestrator.users``' ``calls_per_minute``). Pure.

A token bucket per user: up to ``per_minute`` calls at once, refilled at ``per_minute`` a
minute. A ``tools/call`` over it is answered at once (-32002 ``rate_limited``; ``data``: the
``limit`` and ``retry_after_seconds``, when the next call would be taken), never queued or
sent to a container; it is audited as every call. One :class:`CallRates` is shared by the
orchestrator's sessions (held by the registry, as :class:`~.agent_slots.AgentSlots` is); each
session machine of a limited user is given a :class:`UserCallRate` and asks it before a call.

Bounded: at most :data:`MAX_TRACKED_USERS` buckets; past that, full ones (users idle for a
minute or more, whose bucket would refill to the top anyway) are forgotten first, then the
oldest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._errors import RateLimited
from .._reasons import RATE_LIMITED

MAX_TRACKED_USERS = 10_000


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class CallRates:
    """Every limited user's bucket (see the module's docs)."""

    buckets: dict[str, _Bucket] = field(default_factory=dict)

    def take(self, user: str, per_minute: int, now: float) -> float | None:
        """Take one call of ``user``'s: None when taken, else the seconds until one could be."""
        rate = per_minute / 60.0
        bucket = self.buckets.get(user)
        if bucket is None:
            self._make_room(now, rate)
            bucket = self.buckets[user] = _Bucket(float(per_minute), now)
        bucket.tokens = min(float(per_minute), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / rate

    def _make_room(self, now: float, rate: float) -> None:
        if len(self.buckets) < MAX_TRACKED_USERS:
            return
        idle = [user for user, b in self.buckets.items() if now - b.at >= 60.0]
        for user in idle:
            del self.buckets[user]
        while len(self.buckets) >= MAX_TRACKED_USERS:
            del self.buckets[next(iter(self.buckets))]


@dataclass(frozen=True)
class UserCallRate:
    """One user's limit, as a session machine asks it."""

    rates: CallRates
    user: str
    per_minute: int

    def refusal(self, now: float) -> RateLimited | None:
        """Why this user may not make one more call now (None: taken, they may)."""
        wait = self.rates.take(self.user, self.per_minute, now)
        if wait is None:
            return None
        seconds = round(wait, 3)
        return RateLimited(
            f"you have made {self.per_minute} tool calls in the last minute, as many as "
            f"orchestrator.users allows you; try again in {seconds:g} s",
            reason=RATE_LIMITED,
            limit=self.per_minute,
            retry_after_seconds=seconds,
        )
