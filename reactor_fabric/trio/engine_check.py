"""The container engine's answer to a ping, as ``/healthz`` reports it: shared, and at most one
ping per ``fresh_for`` seconds whatever the request rate.

``/healthz`` answers without the token ("up or not"), so anyone who can reach the port can ask
for it, as often as they like. Each ask pinged the engine (a worker thread and an API call to
``dockerd``, or to the Kubernetes API server): a loop of requests put the engine, and with it
every session's container starts and I/O, under load. Now requests that come while a ping is
in flight wait for its answer, and an answer is reused while it is fresh (one second: monitors
poll every few seconds, and an engine that just went away is reported a second later at most).

Error handling: a ping that fails (:class:`DockerUnavailable`) is an answer like any other,
kept as long; a ping whose caller was cancelled is no answer, and the next caller (one of those
waiting, if any) pings again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import trio

from .._errors import DockerUnavailable

__all__ = ["ENGINE_CHECK_FRESH_SECONDS", "EngineCheck", "EngineState"]

ENGINE_CHECK_FRESH_SECONDS: Final = 1.0


@dataclass(frozen=True)
class EngineState:
    """The engine's version, or why it could not be reached."""

    version: str | None
    error: str | None


class EngineCheck:
    def __init__(
        self,
        ping: Callable[[], Awaitable[str]],
        *,
        fresh_for: float = ENGINE_CHECK_FRESH_SECONDS,
    ) -> None:
        self._ping = ping
        self._fresh_for = fresh_for
        self._last: EngineState | None = None
        self._last_at = 0.0
        self._in_flight: trio.Event | None = None

    def _fresh(self) -> EngineState | None:
        if self._last is not None and trio.current_time() - self._last_at < self._fresh_for:
            return self._last
        return None

    async def state(self) -> EngineState:
        """The engine's state: fresh, or from the ping in flight, or from a new ping."""
        while True:
            fresh = self._fresh()
            if fresh is not None:
                await trio.lowlevel.checkpoint()
                return fresh
            if self._in_flight is None:
                break
            await self._in_flight.wait()
        done = self._in_flight = trio.Event()
        try:
            try:
                state = EngineState(await self._ping(), None)
            except DockerUnavailable as exc:
                state = EngineState(None, str(exc))
            self._last, self._last_at = state, trio.current_time()
            return state
        finally:
            self._in_flight = None
            done.set()
