"""The warm pool's takes: a ready container claimed for a session, then handed out. Pure.

A part of :class:`~.warm_pool.WarmPoolMachine`, on its books (:class:`~.warm_pool_entries.Books`).
A session's :class:`~.warm_pool_events.Take` claims the oldest ready container that fits it
(its account's shape, mounts only through the staging area, a greeted one only for a session
that may take one, and first for it: see the machine's docstring, "Shapes", "Mounts",
"Greetings"), or misses, and a miss for a shape or a greeting the pool lacks retires the
oldest ready container of the other kind; every take is demand its service's refills follow.
Once the driver stopped watching a claimed container (:class:`~.warm_pool_events.Watched`) it
is handed out, unless its output ended or overflowed meanwhile (spoiled: removed).

Resources: none but the books'. Error handling: a Watched for a container that is not
claimed (a driver's mistake) raises ValueError.
"""

from __future__ import annotations

from collections.abc import Iterable

from .warm_pool_entries import Books, shallow_copy
from .warm_pool_events import Action, Claim, HandOut, Missed, RemovePooled, Take, TakeOutcome


class Takes:
    """Claims and hand-outs (see the module docstring); ``greets``: the services whose
    pooled containers may be greeted (fresh_per_call)."""

    def __init__(self, books: Books, *, greets: Iterable[str] = ()) -> None:
        self.books = books
        self.greets = frozenset(greets)

    def on(self, books: Books) -> Takes:
        """The same part on ``books`` (a copy of the machine's, for model checking)."""
        twin = shallow_copy(self)
        twin.books = books
        return twin

    def take(self, event: Take) -> list[Action]:
        """The oldest ready container that fits the session, claimed; or a miss (the session
        starts a fresh one) and what that miss retires."""
        name = event.service
        service = self.books.services.get(name)
        if service is None:
            return [Missed(name, "not_pooled")]
        refused = self.unfit(event)
        if refused is not None:
            return [Missed(name, refused)]
        service.note_take(self.books.now)  # demand, whether or not it is served
        shape = None if service.fixed_shape else event.account
        service.shape = shape
        if name in self.greets:
            service.greet = event.greeted  # refills follow demand (see "Greetings")
        ready = service.ready()
        # With mounts, any one fits: every container was started with the staging binds
        # while the staging area is in use (it is given up for good, never taken up later).
        # A greeted one only for a session that may take one, and first for it.
        fits = [e for e in ready if e.shape == shape and (event.greeted or not e.greet)]
        fits.sort(key=lambda e: not e.greet)  # (stable: the oldest first among alike)
        if fits:
            entry = fits[0]
            del service.entries[entry.token]
            entry.state = "claimed"
            self.books.claimed[entry.token] = entry
            service.failures = 0  # its server started and waited: it works
            return [Claim(entry.token, name)]
        if not ready:
            return [Missed(name, "empty")]
        # Only other shapes (or greeted ones, for a relay session) are ready: make room for
        # the one asked for.
        outcome: TakeOutcome = "greeted" if any(e.shape == shape for e in ready) else "shape"
        oldest = ready[0]
        del service.entries[oldest.token]
        return [Missed(name, outcome), RemovePooled(oldest.token, name, "shape_changed")]

    def unfit(self, event: Take) -> TakeOutcome | None:
        """Why no pooled container of the service can serve this session, whatever is ready."""
        if event.mounts and not (self.books.stages_mounts and event.placeable):
            return "mounts"
        if self.books.stopping:
            return "stopping"
        return None

    def watched(self, token: int) -> list[Action]:
        """The driver stopped watching claimed container ``token``: handed out, or removed if
        its output ended or overflowed meanwhile."""
        entry = self.books.claimed.pop(token, None)
        if entry is None:
            raise ValueError(f"pooled container {token} is not claimed")
        if entry.spoiled is not None:
            return [RemovePooled(token, entry.service, "not_handed_out")]
        return [HandOut(token, entry.service)]
