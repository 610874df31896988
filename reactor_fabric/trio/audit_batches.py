"""Audit records go to the writer after the answers of the same moment have gone out.

A tool call's audit record is made on the event loop when its answer passes through the
relay. The answer itself only leaves when the connection's writer task runs, at the
scheduler's next turn; encoding, chaining and queueing the record before that turn (tens of
microseconds when caches are cold, as they are between round trips) would delay the answer by
as much. So the observer holds records back and this task hands them over one turn later —
after every task the same events woke, the writers among them — as one batch (the writer's
lock taken once). Records keep their order; they wait at most a couple of scheduler turns.

Resource handling: the records held are bounded (``MAX_DEFERRED``: beyond it the observer hands
them over at once). When the task ends — cancelled with the orchestrator's root nursery — it
hands over what is held and the observer goes back to handing each record over as it comes.
"""

from __future__ import annotations

import trio

from ..observe.observer import Observer


class _Due:
    """Set by the observer (on the event loop) when it starts holding records."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def set(self) -> None:
        self.event.set()


async def hand_audit_over_later(
    observer: Observer, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run until cancelled: the observer's audit records, handed to the writer in batches one
    scheduler turn after they were made."""
    if observer.audit is None:
        task_status.started()
        return
    due = _Due()
    observer.defer_audit(due.set)
    task_status.started()
    try:
        while True:
            await due.event.wait()
            due.event = trio.Event()
            # One more turn: the tasks woken with these records (the writers of the answers
            # they describe) run first.
            await trio.lowlevel.cancel_shielded_checkpoint()
            observer.flush()
    finally:
        observer.defer_audit(None)
