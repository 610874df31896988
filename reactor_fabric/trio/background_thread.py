"""Blocking work that runs in a thread of its own beside the task that started it, instead of
in the task's place (:func:`trio.to_thread.run_sync` makes the task wait for it).

What it is for: an isolated call's copy is filled while its container is created and started
(see :mod:`.workspaces`); the start waits for the copy only where the server would first see
it.

Resource handling: the work is given ``stopped()``, which it polls, and cleans up what it made
and raises ``InterruptedError`` once it says True. Its owner either awaits :meth:`result`
(cancellable: the work goes on) or calls :meth:`stop` — shielded and bounded, in the owner's
``finally`` — so that no work outlives what it works for. The thread is not one of trio's
limited worker threads: its owners bound how many exist (one per container start).

Error handling: :meth:`result` raises what the work raised, as often as it is awaited.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import outcome
import trio

T = TypeVar("T")

# Beyond its work's own deadline (a copy's git steps and files), how long an owner's stop waits
# for the thread to end before it gives up on it (and leaves what it made to a later cleanup).
STOP_MARGIN_SECONDS = 10.0


class BackgroundThread(Generic[T]):
    """``work(stopped)`` in a thread of its own, started at once."""

    def __init__(self, work: Callable[[Callable[[], bool]], T], *, name: str) -> None:
        self._stop = threading.Event()
        self._done = trio.Event()
        self._outcome: outcome.Outcome[T] | None = None
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome[T]) -> None:
            # In the work's thread: hand the outcome to trio's.
            self._outcome = result
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._done.set)

        trio.lowlevel.start_thread_soon(lambda: work(self._stop.is_set), deliver, name=name)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def outcome(self) -> outcome.Outcome[T] | None:
        """What the work returned or raised, once it is done (None before): for an owner that
        must take a finished result without a checkpoint, where a cancellation would lose it."""
        return self._outcome if self.done else None

    async def wait(self) -> None:
        """Until the work is done (cancellable; the work goes on)."""
        await self._done.wait()

    def request_stop(self) -> None:
        """Tell the work to stop, without waiting for it (its owner calls :meth:`stop` later,
        and removes what it made)."""
        self._stop.set()

    async def result(self) -> T:
        """The work's result once it is done (cancellable; the work goes on), or its error."""
        await self._done.wait()
        result = self._outcome
        if isinstance(result, outcome.Error):
            raise result.error
        assert isinstance(result, outcome.Value)
        value: T = result.value
        return value

    async def stop(self, bound: float) -> bool:
        """Tell the work to stop and wait, shielded, up to ``bound`` seconds for its thread to
        end (whatever it made, it removed); whether it ended."""
        self._stop.set()
        with trio.CancelScope(shield=True), trio.move_on_after(bound):
            await self._done.wait()
        return self._done.is_set()
