"""The warm pool's containers while they wait: whether each is fit to be handed out. Pure.

A part of :class:`~.warm_pool.WarmPoolMachine`, on its books (:class:`~.warm_pool_entries.Books`):
a start's outcome (ready, or greeting first for a service whose pooled containers are greeted;
removed when it failed, or when it is no longer wanted: the pool stops, its image changed),
the greeting's outcome (see the machine's docstring, "Greetings"), what a ready or claimed
container writes before anyone spoke to it ("Early output", up to ``EARLY_STDOUT_BYTES``) and
the end of its output. A failure soon after it was ready backs its service off; a container
that ran ``HEALTHY_SECONDS`` resets the back-off. A claimed container whose output ended or
overflowed is marked spoiled: the take hands it out only if it is not (:mod:`.warm_pool_takes`).

Resources: none but the books'. Error handling: an outcome for a container that is not in
the state it names (a driver's mistake) raises ValueError (:meth:`Books.find`).
"""

from __future__ import annotations

from .warm_pool_entries import Books, PooledService, PoolEntry, shallow_copy
from .warm_pool_events import (
    Action,
    EndedReason,
    GreetPooled,
    PooledGreeted,
    PooledGreetingFailed,
    RemovePooled,
    RetireReason,
)

# A pooled container that ran this long before it ended was not crash-looping.
HEALTHY_SECONDS = 30.0
# Output a pooled server may write to stdout before anyone spoke to it (kept, and given to
# the session first); more than that and it is not a well-behaved stdio server: removed.
EARLY_STDOUT_BYTES = 64 * 1024


class Health:
    """Pooled containers from their start until they are claimed (see the module docstring)."""

    def __init__(self, books: Books) -> None:
        self.books = books

    def on(self, books: Books) -> Health:
        """The same part on ``books`` (a copy of the machine's, for model checking)."""
        twin = shallow_copy(self)
        twin.books = books
        return twin

    def start_succeeded(self, token: int, now: float) -> list[Action]:
        entry, service = self.books.find(token, "starting")
        if entry.greet and not self.books.stale(entry, service):
            # Still a start (within parallel_starts) until its greeting is done.
            entry.state = "greeting"
            return [GreetPooled(token, entry.service)]
        return self.started(entry, service, now)

    def greeting_done(
        self, event: PooledGreeted | PooledGreetingFailed, now: float
    ) -> list[Action]:
        """Greeted: ready. Failed: it would not do for a call; removed, and its service backs
        off as after a failed start (a server that cannot be greeted is not retried in a
        storm)."""
        token = event.token
        entry, service = self.books.find(token, "greeting")
        if isinstance(event, PooledGreeted):
            return self.started(entry, service, now)
        self.books.starting -= 1
        del service.entries[token]
        service.back_off(now)
        return [RemovePooled(token, entry.service, "greeting_failed")]

    def started(self, entry: PoolEntry, service: PooledService, now: float) -> list[Action]:
        """Its start is done (greeted, for a service whose containers are): ready, unless it
        is no longer wanted."""
        self.books.starting -= 1
        if self.books.stale(entry, service):
            del service.entries[entry.token]
            return [RemovePooled(entry.token, entry.service, self.retire_reason())]
        entry.state = "ready"
        entry.ready_at = now
        return []

    def start_failed(self, token: int, created: bool, now: float) -> list[Action]:
        entry, service = self.books.find(token, "starting")
        self.books.starting -= 1
        del service.entries[token]
        service.back_off(now)
        return [RemovePooled(token, entry.service, "start_failed")] if created else []

    def early_output(self, token: int, nbytes: int, now: float) -> list[Action]:
        entry = self.books.watched(token)
        if entry is None:
            return []
        entry.early += nbytes
        if entry.early <= EARLY_STDOUT_BYTES:
            return []
        return self.ended(token, "output_before_input", now)

    def ended(self, token: int, why: EndedReason, now: float) -> list[Action]:
        """Ready container ``token`` ended on its own while nobody used it: soon after it was
        ready, that is a failure (back-off); after a while, it is not."""
        entry = self.books.watched(token)
        if entry is None:
            return []  # already removed
        if entry.state == "claimed":
            entry.spoiled = entry.spoiled or why  # not handed out (see Takes.watched)
            return []
        service = self.books.services[entry.service]
        del service.entries[token]
        if now - entry.ready_at < HEALTHY_SECONDS:
            service.back_off(now)
        else:
            service.failures = 0
        return [RemovePooled(token, entry.service, why)]

    def retire_reason(self) -> RetireReason:
        """Why a start that completed is removed at once (see :meth:`Books.stale`)."""
        return "stopping" if self.books.stopping else "image_changed"
