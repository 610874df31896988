"""Tool calls are recorded, and audit records go to the writer, after the answers of the same
moment have gone out.

A tool call ends on the event loop when its answer passes through the relay. The answer itself
only leaves when the connection's writer task runs, at the scheduler's next turn; whatever the
relay does before that turn delays the answer by as much: reading the answer's outcome (a
decode), making the call's audit record, counting it in the metrics and the status page,
encoding, chaining and queueing the record (tens of microseconds when caches are cold, as
they are between round trips). So the observer holds finished calls and records back and this
task has them taken one turn later — after every task the same events woke, the writers among
them — as one batch (the writer's lock taken once). Records keep their order; they wait at most
a couple of scheduler turns. With no audit trail configured the task still runs: the calls'
metrics and status page entries are made the same way.

Resource handling: what is held is bounded (``MAX_DEFERRED`` items, ``MAX_DEFERRED_BYTES`` of
answers held for their outcome: beyond, the observer takes them at once). When the task ends —
cancelled with the orchestrator's root nursery — it has what is held taken and the observer goes
back to taking each call and record as it comes.
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
    """Run until cancelled: the observer's finished tool calls and audit records, taken in
    batches one scheduler turn after they were made."""
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
