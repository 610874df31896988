"""What a test can ask about resources this process still holds, and the instruments that
cancel a program at a given step and count the tasks it leaves."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio


def descriptors_of(path: Path) -> list[str]:
    """This process's open descriptors that refer to ``path`` (wherever it was moved since)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
        except OSError:
            continue
    return found


class CancelAfterSteps(trio.abc.Instrument):
    """Cancels a scope after the program has taken a given number of task steps."""

    def __init__(self, steps: int, scope: trio.CancelScope) -> None:
        self.remaining = steps
        self.scope = scope

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.scope.cancel()


class TaskCensus(trio.abc.Instrument):
    """The tasks spawned and not yet exited."""

    def __init__(self) -> None:
        self.live: set[trio.lowlevel.Task] = set()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.live.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.live.discard(task)


async def cancelled_after(steps: int, work: Callable[[], Awaitable[None]]) -> int:
    """Run ``work`` in a scope cancelled after ``steps`` task steps; the steps left unused."""
    with trio.CancelScope() as scope:
        cancel = CancelAfterSteps(steps, scope)
        trio.lowlevel.add_instrument(cancel)
        try:
            await work()
        finally:
            trio.lowlevel.remove_instrument(cancel)
    return cancel.remaining


async def cancel_at_every_step(run: Callable[[int], Awaitable[int]]) -> int:
    """Run ``run`` whole once, to learn how many task steps its work takes, then once cancelled
    after each of them — every step, not a sample; no task may outlive any run.

    ``run(steps)`` sets up, does its work through :func:`cancelled_after` (whose result it
    returns), then checks what it left behind. Returns the number of steps.
    """
    whole = 10**9
    total = whole - await run(whole)
    for steps in range(1, total + 1):
        census = TaskCensus()
        trio.lowlevel.add_instrument(census)
        try:
            await run(steps)
        finally:
            trio.lowlevel.remove_instrument(census)
        assert not census.live, f"tasks leaked after cancelling at step {steps}: {census.live}"
    return total
