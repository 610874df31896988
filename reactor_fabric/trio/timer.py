"""Waking a pure state machine at its deadline: the one timer both session drivers run.

A machine says when it next needs time to pass (its ``deadline``, None for never); the driver
runs :meth:`DeadlineTimer.run` in its nursery and calls :meth:`DeadlineTimer.wake` after every
event it feeds the machine, since an event may move the deadline earlier. A deadline that moved
later needs no wake-up: the timer finds nothing due, and sleeps again until the new one.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import trio


class DeadlineTimer:
    """Calls ``on_due`` each time the machine's ``deadline()`` has passed."""

    def __init__(
        self, deadline: Callable[[], float | None], on_due: Callable[[], Awaitable[None]]
    ) -> None:
        self._deadline = deadline
        self._on_due = on_due
        self._scope: trio.CancelScope | None = None

    def wake(self) -> None:
        """The deadline may have moved earlier: sleep no longer than it says."""
        scope = self._scope
        deadline = self._deadline()
        if scope is not None and deadline is not None and deadline < scope.deadline:
            scope.deadline = deadline

    async def run(self) -> None:
        while True:
            deadline = self._deadline()
            with trio.CancelScope(deadline=math.inf if deadline is None else deadline) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            due = self._deadline()
            if due is not None and trio.current_time() >= due:
                await self._on_due()
