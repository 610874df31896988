"""What a test can ask about resources this process still holds, and the instruments that
cancel a program at a given step and count the tasks it leaves."""

from __future__ import annotations

import os
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
