"""The warm pool's books: each pooled container's entry, each service's record, and the
records across services that the machine's parts share (:class:`Books`). Pure.

What :class:`~.warm_pool.WarmPoolMachine` and its parts decide on, and the rules that belong to
one record alone; the decisions across records (which to start, which to hand out, which to
remove) are the parts' (:mod:`.warm_pool_refills`, :mod:`.warm_pool_health`,
:mod:`.warm_pool_takes`) and the machine's.

A pooled container (:class:`PoolEntry`) is *starting* (its start was asked for, the outcome is
not known yet), *greeting* (started; a service in ``greets`` only: the pool does the MCP
handshake with it, see :mod:`.pool_greeting`), *ready* (idle, its MCP server waiting on stdin:
with no handshake done, or, greeted, waiting for its first call) or *claimed* (a session asked
for it: the driver stops watching it, then the machine hands it out unless its output ended or
overflowed meanwhile). A container is handed to exactly one session and leaves the pool when it
is claimed: it serves that session and is then removed, never returned.

A service's record (:class:`PooledService`) holds its entries, starting and ready, oldest
first, and what its refills follow:

- its target: its ``warm``, or for a per-call service the number of its takes within the last
  ``RATE_WINDOW_SECONDS``, never below ``warm`` and never above its ceiling,
  ``max(warm, PER_CALL_CEILING)`` (the machine's docstring says why: "Refills at the rate of
  consumption"); only the newest ``ceiling`` takes are kept, more could not raise the target;
- its back-off after a failure: 1 s, doubling with each failure in a row up to 60 s;
- the shape its refills take, whether they are greeted, the generation of its image.

The books (:class:`Books`) hold every service's record, the containers claimed by a session
and not handed out yet, and what the parts share of the pool as a whole: the starts in flight
(greetings included), the next token, whether the pool stops, whether pooled containers get
the staging binds, the time of the last event.

Resources: plain data, bounded by the pool (entries by its cap, takes by the ceiling); copies
for model checking are shallow where the data is immutable (:func:`shallow_copy`). Error
handling: nothing here raises; a token the machine does not know is the machine's to refuse.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from .warm_pool_events import EndedReason

_T = TypeVar("_T")

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
# A per-call service's target counts its takes within this window (see "Refills at the rate
# of consumption"): long enough that a service called in bursts a few times a minute keeps a
# pool the size of a burst (a shorter one would start containers only to remove them unused
# before the next burst), short enough that an idle service gives the memory back soon.
RATE_WINDOW_SECONDS = 60.0
# A per-call service's target never exceeds max(warm, this): one session's calls in flight at
# once (fabric_roster.MAX_PER_CALL_CONTAINERS), so that a session's full fan-out finds a pool.
PER_CALL_CEILING = 8

EntryState = Literal["starting", "greeting", "ready", "claimed"]


@dataclass
class PoolEntry:
    """One pooled container, from the start asked for until it is handed out or removed."""

    token: int
    service: str
    shape: Hashable
    generation: int
    staged: bool
    greet: bool = False  # to be greeted once started (then ready only once greeted)
    state: EntryState = "starting"
    ready_at: float = 0.0
    early: int = 0  # stdout bytes written while it waited
    spoiled: EndedReason | None = None  # claimed, but its output ended or overflowed

    def key(self) -> tuple[object, ...]:
        return (
            self.token,
            self.shape,
            self.generation,
            self.staged,
            self.greet,
            self.state,
            self.ready_at,
            self.early,
            self.spoiled,
        )


@dataclass
class PooledService:
    """One service's pooled containers and what its refills follow."""

    warm: int  # its base target (the suite's warm)
    shape: Hashable
    fixed_shape: bool  # the suite names its user: every container of it is alike
    # The most its target may follow its takes (see "Refills at the rate of consumption");
    # warm for a service that is not per-call: its target is then its warm.
    ceiling: int = 0
    # Its takes within the window, oldest first: the newest `ceiling` of them at most.
    takes: tuple[float, ...] = ()
    # A fresh_per_call service's (see "Greetings"): whether its refills are greeted now.
    greet: bool = False
    generation: int = 0
    failures: int = 0
    retry_at: float = -math.inf
    image: str | None = None  # the image id seen at the last check
    # token → entry, starting and ready, in the order they were asked for (oldest first).
    entries: dict[int, PoolEntry] = field(default_factory=dict)

    @classmethod
    def of(cls, warm: int, shape: Hashable, *, fixed_shape: bool, per_call: bool) -> PooledService:
        """A service keeping ``warm`` pooled containers of ``shape``; ``per_call``: its target
        follows its takes."""
        ceiling = max(warm, PER_CALL_CEILING) if per_call else warm
        return cls(warm, shape, fixed_shape=fixed_shape, ceiling=ceiling)

    def count(self) -> int:
        return len(self.entries)

    @property
    def target(self) -> int:
        """How many pooled containers it should have now: its warm, or its recent takes."""
        return min(self.ceiling, max(self.warm, len(self.takes)))

    def ready(self) -> list[PoolEntry]:
        return [entry for entry in self.entries.values() if entry.state == "ready"]

    # --- its takes (the target of a per-call service) ---------------------------------------

    def note_take(self, now: float) -> None:
        """A session asked for one at ``now``, served or not: for a per-call service, demand
        the target follows (the newest ``ceiling`` takes are all that can count)."""
        if self.ceiling > self.warm:
            self.takes = (*self.takes, now)[-self.ceiling :]

    def forget_takes(self, now: float) -> None:
        """Takes that left the window by ``now`` no longer count."""
        if self.takes and self.takes[0] + RATE_WINDOW_SECONDS <= now:
            self.takes = tuple(t for t in self.takes if t + RATE_WINDOW_SECONDS > now)

    def target_falls_at(self) -> float | None:
        """When its oldest take leaves the window while its target is above warm (the target
        then falls); None while it is at warm."""
        if len(self.takes) > self.warm:
            return self.takes[0] + RATE_WINDOW_SECONDS
        return None

    # --- its back-off -----------------------------------------------------------------------

    def back_off(self, now: float) -> None:
        """A start failed (or a container ended soon after it was ready): no refill before
        the back-off, which doubles with each failure in a row."""
        self.failures += 1
        delay = BACKOFF_FIRST_SECONDS * 2 ** min(self.failures - 1, 16)
        self.retry_at = now + min(delay, BACKOFF_MAX_SECONDS)

    # --- model checking ---------------------------------------------------------------------

    def clone(self) -> PooledService:
        """An independent copy (its entries copied; the rest is immutable)."""
        twin = shallow_copy(self)
        twin.entries = {token: shallow_copy(entry) for token, entry in self.entries.items()}
        return twin

    def key(self) -> tuple[object, ...]:
        """Its part of the machine's fingerprint (hashable)."""
        return (
            self.warm,
            self.ceiling,
            self.takes,
            self.shape,
            self.generation,
            self.failures,
            self.retry_at,
            self.image,
            tuple(entry.key() for entry in self.entries.values()),
        )


@dataclass
class Books:
    """The pool's records across services (see the module docstring); the machine's parts
    read and write them, each by its own rules."""

    # name → record, for every service that keeps a pool (its warm above 0).
    services: dict[str, PooledService]
    stages_mounts: bool = False  # pooled containers are started with the staging binds
    # Claimed by a session, not yet handed out or removed (no longer in its service's record).
    claimed: dict[int, PoolEntry] = field(default_factory=dict)
    starting: int = 0  # starts in flight, greetings included (within parallel_starts)
    next_token: int = 0
    stopping: bool = False
    now: float = -math.inf  # the time of the last event
    # No refill starts before this (a hold after a hand-out: see Refills.hold).
    held_until: float = -math.inf

    def total(self) -> int:
        """Pooled containers of every service, starting and ready."""
        return sum(service.count() for service in self.services.values())

    def find(self, token: int, state: EntryState) -> tuple[PoolEntry, PooledService]:
        """Entry ``token`` in ``state`` and its service's record; ValueError if there is none
        (a driver's mistake: an outcome for a container that is not in that state)."""
        for service in self.services.values():
            entry = service.entries.get(token)
            if entry is not None and entry.state == state:
                return entry, service
        raise ValueError(f"pooled container {token} is not {state}")

    def watched(self, token: int) -> PoolEntry | None:
        """Ready or claimed entry ``token`` (its output is watched), None once it is gone."""
        claimed = self.claimed.get(token)
        if claimed is not None:
            return claimed
        for service in self.services.values():
            entry = service.entries.get(token)
            if entry is not None and entry.state == "ready":
                return entry
        return None

    def stale(self, entry: PoolEntry, service: PooledService) -> bool:
        """No longer wanted: the pool stops, or its image changed since it was started."""
        return self.stopping or entry.generation != service.generation

    # --- model checking ---------------------------------------------------------------------

    def clone(self) -> Books:
        """An independent copy (the records and claimed entries copied)."""
        twin = shallow_copy(self)
        twin.services = {name: service.clone() for name, service in self.services.items()}
        twin.claimed = {token: shallow_copy(entry) for token, entry in self.claimed.items()}
        return twin

    def key(self) -> tuple[object, ...]:
        """Their part of the machine's fingerprint (hashable)."""
        return (
            tuple((name, *service.key()) for name, service in self.services.items()),
            tuple(entry.key() for entry in self.claimed.values()),
            self.next_token,
            self.starting,
            self.stopping,
            self.stages_mounts,
            self.now,
            self.held_until,
        )


def shallow_copy(obj: _T) -> _T:
    """A shallow copy of a plain object (copy.copy's general path is most of a model check)."""
    twin = object.__new__(type(obj))
    twin.__dict__.update(obj.__dict__)
    return twin
