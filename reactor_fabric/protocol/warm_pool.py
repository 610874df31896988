"""The warm pool's decisions: which pooled containers to start, which to hand out, which to remove.

Pure: events in, actions out, the time passed in; no trio, no engine. The trio layer
(:mod:`reactor_fabric.trio.warm_pool`) does what the actions say and reports what happened.

A pooled container is *starting* (its start was asked for, the outcome is not known yet) or
*ready* (started, idle, its MCP server waiting on stdin with no handshake done). A ready one
is handed to exactly one session (:meth:`WarmPoolMachine.take`) and leaves the pool: it serves
that session and is then removed, never returned.

How many: each service has a target (its ``warm``); the pool keeps ready + starting at it,
within three bounds that keep refills from hurting anyone:

- a cap on pooled containers of all services together (``max_containers``);
- at most ``parallel_starts`` starts at once, all services together, so a slow engine sees a
  trickle of refills, never a storm;
- a back-off per service after a start failed or a pooled container died soon after it was
  ready (1 s, doubling up to 60 s), so a server that crashes at start does not crash-loop. A
  container that served a session, or ran a while (``HEALTHY_SECONDS``), resets it: a start
  that succeeds does not, since a server may exit right after.

When starts must be rationed, the service with the fewest pooled containers goes first.

**Shapes.** Some of a container is fixed when it is created and differs between sessions: the
account its server runs as (see :mod:`reactor_fabric.policy.accounts`). The pool follows demand:
refills take the shape a service was last asked for, and a miss for a shape the pool lacks
retires the oldest ready container of another shape, so a pool never sits on containers that
nobody can take.

**Generations.** When a service's image changes, its pooled containers run the old one:
:meth:`WarmPoolMachine.image_changed` retires the ready ones at once and the starting ones as
their start completes.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Literal

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
# A pooled container that ran this long before it ended was not crash-looping.
HEALTHY_SECONDS = 30.0

# Why a session did not get a pooled container (metrics and logs; "hit" when it did).
TakeOutcome = Literal["hit", "empty", "shape", "stopping", "not_pooled"]
# Why a pooled container is removed without serving anyone.
RetireReason = Literal["shape_changed", "image_changed", "stopping"]


@dataclass(frozen=True)
class StartPooled:
    """Start pooled container ``token`` of ``service`` in ``shape``."""

    token: int
    service: str
    shape: Hashable


@dataclass(frozen=True)
class RemovePooled:
    """Remove pooled container ``token`` (started, never handed out)."""

    token: int
    service: str
    reason: RetireReason


@dataclass(frozen=True)
class Taken:
    """The answer to a session asking for a container: ``token`` or None, and what to remove."""

    token: int | None
    outcome: TakeOutcome
    retire: tuple[RemovePooled, ...] = ()


@dataclass
class _Entry:
    token: int
    service: str
    shape: Hashable
    generation: int
    ready: bool = False
    ready_at: float = 0.0


@dataclass
class _Service:
    target: int
    shape: Hashable
    generation: int = 0
    failures: int = 0
    retry_at: float = 0.0
    # token → entry, in the order they were asked for (oldest first).
    entries: dict[int, _Entry] = field(default_factory=dict)

    def count(self) -> int:
        return len(self.entries)

    def ready(self) -> list[_Entry]:
        return [entry for entry in self.entries.values() if entry.ready]


class WarmPoolMachine:
    """Every pooled container of one orchestrator, all services (see the module docstring)."""

    def __init__(
        self,
        targets: Mapping[str, int],
        *,
        max_containers: int,
        parallel_starts: int,
        initial_shape: Hashable,
    ) -> None:
        self._services = {
            name: _Service(target, initial_shape) for name, target in targets.items() if target > 0
        }
        self._max_containers = max_containers
        self._parallel_starts = parallel_starts
        self._next_token = 0
        self._starting = 0
        self._stopping = False

    # --- what exists ------------------------------------------------------------------------

    @property
    def services(self) -> frozenset[str]:
        """The services that keep a pool (``warm`` above 0)."""
        return frozenset(self._services)

    def pooled(self, service: str) -> int:
        """Pooled containers of ``service``, starting and ready."""
        found = self._services.get(service)
        return found.count() if found is not None else 0

    def ready(self, service: str) -> int:
        found = self._services.get(service)
        return len(found.ready()) if found is not None else 0

    @property
    def total(self) -> int:
        return sum(service.count() for service in self._services.values())

    @property
    def starting(self) -> int:
        return self._starting

    @property
    def stopping(self) -> bool:
        return self._stopping

    # --- refills ----------------------------------------------------------------------------

    def starts(self, now: float) -> list[StartPooled]:
        """The starts to begin now (ask after every event: they change what is allowed)."""
        if self._stopping:
            return []
        actions: list[StartPooled] = []
        total = self.total
        while self._starting < self._parallel_starts and total < self._max_containers:
            wanting = [
                (service.count(), name)
                for name, service in self._services.items()
                if service.count() < service.target and service.retry_at <= now
            ]
            if not wanting:
                break
            _, name = min(wanting)
            service = self._services[name]
            token = self._next_token
            self._next_token += 1
            service.entries[token] = _Entry(token, name, service.shape, service.generation)
            self._starting += 1
            total += 1
            actions.append(StartPooled(token, name, service.shape))
        return actions

    def next_start_at(self, now: float) -> float | None:
        """When a service now held back by its back-off may start again (None: nobody is)."""
        if self._stopping:
            return None
        waiting = [
            service.retry_at
            for service in self._services.values()
            if service.count() < service.target and service.retry_at > now
        ]
        return min(waiting, default=None)

    def start_succeeded(self, token: int, now: float) -> RemovePooled | None:
        """Pooled container ``token`` is ready; or, if it is no longer wanted, what to remove."""
        entry, service = self._find(token)
        self._starting -= 1
        if self._stopping or entry.generation != service.generation:
            del service.entries[token]
            return RemovePooled(token, entry.service, self._retire_reason())
        entry.ready = True
        entry.ready_at = now
        return None

    def start_failed(self, token: int, now: float) -> None:
        """The start of ``token`` failed (the runtime left nothing behind)."""
        entry, service = self._find(token)
        self._starting -= 1
        del service.entries[entry.token]
        self._back_off(service, now)

    def exited(self, token: int, now: float) -> None:
        """Ready container ``token`` ended on its own while nobody used it (it is gone): soon
        after it was ready, that is a failure (back-off); after a while, it is not."""
        found = self._lookup(token)
        if found is None:
            return  # already handed out or removed
        entry, service = found
        del service.entries[entry.token]
        if now - entry.ready_at < HEALTHY_SECONDS:
            self._back_off(service, now)
        else:
            service.failures = 0

    # --- sessions ---------------------------------------------------------------------------

    def take(self, service_name: str, shape: Hashable) -> Taken:
        """A session wants a container of ``service_name`` in ``shape``: the oldest ready one
        that fits, or None (the session starts a fresh one) and what that miss retires."""
        service = self._services.get(service_name)
        if service is None:
            return Taken(None, "not_pooled")
        if self._stopping:
            return Taken(None, "stopping")
        service.shape = shape
        ready = service.ready()
        for entry in ready:
            if entry.shape == shape:
                del service.entries[entry.token]
                service.failures = 0  # its server started and waited: it works
                return Taken(entry.token, "hit")
        if not ready:
            return Taken(None, "empty")
        # Only other shapes are ready: make room for the one asked for.
        oldest = ready[0]
        del service.entries[oldest.token]
        return Taken(None, "shape", (RemovePooled(oldest.token, service_name, "shape_changed"),))

    # --- changes ----------------------------------------------------------------------------

    def image_changed(self, service_name: str) -> list[RemovePooled]:
        """``service_name``'s image is not the one its pooled containers run: retire them."""
        service = self._services.get(service_name)
        if service is None:
            return []
        service.generation += 1
        retired = service.ready()
        for entry in retired:
            del service.entries[entry.token]
        return [RemovePooled(entry.token, service_name, "image_changed") for entry in retired]

    def stop(self) -> list[RemovePooled]:
        """No more starts or takes; every ready container is to be removed (starting ones are
        removed as their start completes, see :meth:`start_succeeded`)."""
        self._stopping = True
        retired: list[RemovePooled] = []
        for name, service in self._services.items():
            for entry in service.ready():
                del service.entries[entry.token]
                retired.append(RemovePooled(entry.token, name, "stopping"))
        return retired

    # --- helpers ----------------------------------------------------------------------------

    def _retire_reason(self) -> RetireReason:
        return "stopping" if self._stopping else "image_changed"

    def _lookup(self, token: int) -> tuple[_Entry, _Service] | None:
        for service in self._services.values():
            entry = service.entries.get(token)
            if entry is not None:
                return entry, service
        return None

    def _find(self, token: int) -> tuple[_Entry, _Service]:
        found = self._lookup(token)
        if found is None or found[0].ready:
            raise ValueError(f"pooled container {token} is not starting")
        return found

    @staticmethod
    def _back_off(service: _Service, now: float) -> None:
        service.failures += 1
        delay = BACKOFF_FIRST_SECONDS * 2 ** min(service.failures - 1, 16)
        service.retry_at = now + min(delay, BACKOFF_MAX_SECONDS)
