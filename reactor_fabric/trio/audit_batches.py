"""Tool calls are recorded, and audit records go to the writer, after the answers of the same
moment have gone out.

A tool call ends on the event loop when its answer passes through the relay. The answer itself
only leaves when the connection's writer task runs, at the scheduler's next turn; whatever the
relay does before that turn delays the answer by as much: reading the answer's outcome (a
decode), making the call's audit record, counting it in the metrics and the status page,
encoding, chaining and queueing the record (tens of microseconds when caches are cold, as
they are between round trips). So the observer holds finished calls and records back and this
task has them taken later, as one batch (the writer's lock taken once), after the writers of
those answers ran. Records keep their order, and their times are those of the events.

A batch gathers for ``HAND_OVER_SECONDS`` from its first item. Why not the very next turn: a
task woken for every call costs two task switches and a scheduler pass per relayed call (a
third of a call's task switches; a busy session made its calls wait for them); woken once per
batch, under load it is once per several calls, and an idle orchestrator is not woken at all.
The cost is that metrics, the status page and the audit trail lag the calls by as much (the
audit file's writer lingers longer still): the operator endpoints take what is held before they
answer, so what they show includes every call whose answer went out.

Resource handling: what is held is bounded (``MAX_DEFERRED`` items, ``MAX_DEFERRED_BYTES`` of
answers held for their outcome: beyond, the observer takes them at once). When the task ends —
cancelled with the orchestrator's root nursery — it has what is held taken and the observer goes
back to taking each call and record as it comes.
"""

from __future__ import annotations

from typing import Final

import trio

from ..observe.observer import Observer

# How long a batch gathers before it is taken (see the module docstring).
HAND_OVER_SECONDS: Final = 0.02


class _Due:
    """Set by the observer (on the event loop) when it starts holding records."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def set(self) -> None:
        self.event.set()


async def hand_audit_over_later(
    observer: Observer, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run until cancelled: the observer's finished tool calls and audit records, taken in
    batches ``HAND_OVER_SECONDS`` after the first of a batch was made."""
    due = _Due()
    observer.defer_audit(due.set)
    task_status.started()
    try:
        while True:
            await due.event.wait()
            # Only the first item of a batch calls wake: the next batch's sets a new event.
            due.event = trio.Event()
            # At least one turn later: the tasks woken with these records (the writers of the
            # answers they describe) have run.
            await trio.sleep(HAND_OVER_SECONDS)
            observer.flush()
    finally:
        observer.defer_audit(None)
