"""The warm pool's refills: each service's target, and which starts its bounds allow now. Pure.

A part of :class:`~.warm_pool.WarmPoolMachine`, on its books (:class:`~.warm_pool_entries.Books`);
the rules are the machine's module docstring's "How many" and "Refills at the rate of
consumption": ready + starting kept at each service's target, within the cap on pooled
containers of all services together (``max_containers``), at most ``parallel_starts`` starts at
once, and each service's back-off; the service with the fewest pooled containers first; a
per-call service's takes forgotten as they leave the window, and what it pools above its
falling target removed, the oldest ready first (``surplus``); no start during a hold after a
hand-out (the machine's "Holds").

Resources: none but the books' (the starts it asks for are counted there). Error handling:
nothing here raises.
"""

from __future__ import annotations

from .warm_pool_entries import Books, PoolEntry, shallow_copy
from .warm_pool_events import Action, RemovePooled, StartPooled


class Refills:
    """Targets and refill scheduling (see the module docstring)."""

    def __init__(
        self,
        books: Books,
        *,
        max_containers: int,
        parallel_starts: int,
        hold_seconds: float = 0.0,
    ) -> None:
        self.books = books
        self.max_containers = max_containers
        self.parallel_starts = parallel_starts
        self.hold_seconds = hold_seconds

    def hold(self, now: float) -> None:
        """A container was just claimed by a session: no refill starts for ``hold_seconds``,
        unless a hold runs already (it is not extended: refills wait at most that long)."""
        if self.hold_seconds > 0 and now >= self.books.held_until:
            self.books.held_until = now + self.hold_seconds

    def on(self, books: Books) -> Refills:
        """The same refills on ``books`` (a copy of the machine's, for model checking)."""
        twin = shallow_copy(self)
        twin.books = books
        return twin

    def forget_takes(self, now: float) -> None:
        """Takes that left the window no longer count (see "Refills at the rate of
        consumption")."""
        for service in self.books.services.values():
            service.forget_takes(now)

    def trim(self) -> list[Action]:
        """A per-call service's target fell below what it pools: its oldest ready containers
        above the target are removed (starting ones are, when ready, if still above it)."""
        actions: list[Action] = []
        for name, service in self.books.services.items():
            surplus = service.count() - service.target
            for entry in service.ready()[: max(0, surplus)]:
                del service.entries[entry.token]
                actions.append(RemovePooled(entry.token, name, "surplus"))
        return actions

    def room_beyond_warm(self) -> bool:
        """Whether a container above its service's warm may start: every service's warm
        still fits under the cap beside it (growth never takes another service's room)."""
        held = sum(max(s.count(), s.warm) for s in self.books.services.values())
        return held < self.max_containers

    def starts(self, now: float) -> list[Action]:
        """The starts the bounds allow now, the service with the fewest pooled first."""
        books = self.books
        actions: list[Action] = []
        if now < books.held_until:
            return actions
        total = books.total()
        while books.starting < self.parallel_starts and total < self.max_containers:
            beyond = self.room_beyond_warm()
            wanting = [
                (service.count(), name)
                for name, service in books.services.items()
                if service.count() < service.target
                and service.retry_at <= now
                and (service.count() < service.warm or beyond)
            ]
            if not wanting:
                break
            _, name = min(wanting)
            service = books.services[name]
            token = books.next_token
            books.next_token += 1
            staged = books.stages_mounts
            service.entries[token] = PoolEntry(
                token, name, service.shape, service.generation, staged=staged, greet=service.greet
            )
            books.starting += 1
            total += 1
            actions.append(StartPooled(token, name, service.shape, staged))
        return actions

    def due(self) -> list[float]:
        """When a refill next waits for time: the end of a hold or of a back-off that holds a
        service's refill, and when a per-call service's oldest take leaves the window while its
        target is above warm (the target then falls)."""
        services = self.books.services.values()
        now = self.books.now
        waiting = [
            service.retry_at
            for service in services
            if service.count() < service.target and service.retry_at > now
        ]
        if self.books.held_until > now and any(s.count() < s.target for s in services):
            waiting.append(self.books.held_until)
        waiting += [
            falls for service in services if (falls := service.target_falls_at()) is not None
        ]
        return waiting
