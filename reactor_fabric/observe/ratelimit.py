"""A token bucket: at most ``rate`` events a second, in bursts of at most ``burst``. Pure."""

from __future__ import annotations


class TokenBucket:
    """Allows events while tokens remain; tokens come back at ``rate`` per second.

    ``suppressed`` counts the events refused since the last allowed one, so the caller can say
    how many were dropped when it next speaks.
    """

    def __init__(self, *, rate: float, burst: int, now: float) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last = now
        self.suppressed = 0

    def allow(self, now: float) -> bool:
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        count, self.suppressed = self.suppressed, 0
        return count
