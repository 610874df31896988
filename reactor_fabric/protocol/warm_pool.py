"""The warm pool's decisions: which pooled containers to start, which to hand out, which to remove.

Pure: events in, actions out (their vocabulary: :mod:`.warm_pool_events`), the time passed in
(:meth:`WarmPoolMachine.handle`), and a :attr:`~WarmPoolMachine.deadline` at which the machine
next wants a :class:`Tick`; no trio, no engine. The trio layer
(:mod:`reactor_fabric.trio.warm_pool`) does what the actions say and reports what happened.

A pooled container is *starting* (its start was asked for, the outcome is not known yet),
*greeting* (started; a service in ``greets`` only: the pool does the MCP handshake with it, see
:mod:`.pool_greeting`), *ready* (idle, its MCP server waiting on stdin: with no handshake done,
or, greeted, waiting for its first call) or *claimed*
(a session asked for it: the driver stops watching it, then the machine hands it out unless
its output ended or overflowed meanwhile). A container is handed to exactly one session and
leaves the pool when it is claimed: it serves that session and is then removed, never returned.

How many: each service has a target (its ``warm``, or more for a per-call service: see
"Refills at the rate of consumption"); the pool keeps ready + starting at it, within three
bounds that keep refills from hurting anyone:

- a cap on pooled containers of all services together (``max_containers``);
- at most ``parallel_starts`` starts at once, all services together, so a slow engine sees a
  trickle of refills, never a storm;
- a back-off per service after a start failed or a pooled container ended soon after it was
  ready (1 s, doubling up to 60 s), so a server that crashes at start does not crash-loop. A
  container that served a session, or ran a while (``HEALTHY_SECONDS``), resets it: a start
  that succeeds does not, since a server may exit right after.

When starts must be rationed, the service with the fewest pooled containers goes first.

**Refills at the rate of consumption.** A ``fresh_per_call`` service (``per_call``) consumes one
pooled container per call, so a burst of calls would drain a pool kept at ``warm``. Its target
follows its demand: it is the number of its takes within the last ``RATE_WINDOW_SECONDS``
(hits and misses alike: a miss is a call that wanted one; not a take no pooled container
could serve: mounts that cannot be placed, the stop), never below ``warm`` and never above its
ceiling, ``max(warm, PER_CALL_CEILING)``. So the pool holds as many containers as the service
used in the last minute, and the refill of each take begins at once (within the bounds above:
``parallel_starts`` still rations the starts, so a burst of a hundred calls is followed by a
trickle of refills, never a storm). As takes age out of the window the target falls back to
``warm``, one step per take, and the ready containers above it are removed, the oldest first
(``surplus``; starting ones count too: when one completes with the pool still above the
target, the oldest ready one goes). Containers above a service's ``warm`` never take room
another service's ``warm`` needs: one is started only while every service's
``max(pooled, warm)`` together stay below ``max_containers``. The takes kept are the newest
``ceiling`` (more could not raise the target), so the record is bounded.

**Greetings.** A ``fresh_per_call`` service's (``greets``) pooled containers may be greeted as
soon as they started, so that a call of the fabric endpoint costs the take and the call only.
Only a session that may take a greeted container (:attr:`Take.greeted`: the fabric endpoint's
per-call backends) gets one, and gets one first; it may take one not greeted too (it then does
the handshake itself). A relay session replays its client's ``initialize``: it never gets a
greeted one. Like shapes, greeting follows demand: refills are greeted when the service's last
take was the fabric endpoint's, not when it was the relay's (at first: not), and a relay
session that finds only greeted containers misses (``greeted``) and retires the oldest. A
greeting is part of the start: it counts among the ``parallel_starts``, and a container that
fails it is removed (``greeting_failed``) and backed off like a failed start.

**Early output.** A stdio server speaks when spoken to. What a pooled one writes before any
session spoke to it is kept for the session (up to ``EARLY_STDOUT_BYTES``); more than that, an
output that is not JSON-RPC lines, or an end of its output, and it is removed (a failure, for
the back-off, if it came soon after it was ready).

**Shapes.** Some of a container is fixed when it is created and differs between sessions: the
account its server runs as (see :mod:`reactor_fabric.policy.accounts`), unless the suite names
the service's user (then every container of it is alike). The pool follows demand: refills
take the shape a service was last asked for, and a miss for a shape the pool lacks retires the
oldest ready container of another shape, so a pool never sits on containers nobody can take.

**Mounts.** A session with mounts gets a pooled container only through the staging area
(pooled containers started with its binds), and only for mounts it can place; once the
driver reports that mounts do not reach containers (:class:`StagingLost`), never again.

**Generations.** When a service's image changes, its pooled containers run the old one. The
machine asks for the images every ``IMAGE_CHECK_SECONDS`` (:class:`CheckImages`); a changed one
retires the ready containers at once and the starting ones as their start completes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from .warm_pool_events import (
    Action,
    CheckImages,
    Claim,
    EarlyOutput,
    EndedReason,
    Event,
    GreetPooled,
    HandOut,
    ImageChanged,
    ImagesChecked,
    Missed,
    OutputEnded,
    PooledGreeted,
    PooledGreetingFailed,
    RemovePooled,
    RetireReason,
    Shutdown,
    StagingLost,
    StartFailed,
    StartPooled,
    StartSucceeded,
    Take,
    TakeOutcome,
    Tick,
    Watched,
)

_T = TypeVar("_T")

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
# A pooled container that ran this long before it ended was not crash-looping.
HEALTHY_SECONDS = 30.0
# How often pooled services' images are compared with what the engine has (a rebuilt image
# retires the pooled containers of the old one).
IMAGE_CHECK_SECONDS = 30.0
# Output a pooled server may write to stdout before anyone spoke to it (kept, and given to
# the session first); more than that and it is not a well-behaved stdio server: removed.
EARLY_STDOUT_BYTES = 64 * 1024
# A per-call service's target counts its takes within this window (see "Refills at the rate
# of consumption"): long enough that a service called in bursts a few times a minute keeps a
# pool the size of a burst (a shorter one would start containers only to remove them unused
# before the next burst), short enough that an idle service gives the memory back soon.
RATE_WINDOW_SECONDS = 60.0
# A per-call service's target never exceeds max(warm, this): one session's calls in flight at
# once (fabric_router.MAX_PER_CALL_CONTAINERS), so that a session's full fan-out finds a pool.
PER_CALL_CEILING = 8

# --- the machine ----------------------------------------------------------------------------


@dataclass
class _Entry:
    token: int
    service: str
    shape: Hashable
    generation: int
    staged: bool
    greet: bool = False  # to be greeted once started (then ready only once greeted)
    state: Literal["starting", "greeting", "ready", "claimed"] = "starting"
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
class _Service:
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
    entries: dict[int, _Entry] = field(default_factory=dict)

    def count(self) -> int:
        return len(self.entries)

    @property
    def target(self) -> int:
        """How many pooled containers it should have now: its warm, or its recent takes."""
        return min(self.ceiling, max(self.warm, len(self.takes)))

    def ready(self) -> list[_Entry]:
        return [entry for entry in self.entries.values() if entry.state == "ready"]


class WarmPoolMachine:
    """Every pooled container of one orchestrator, all services (see the module docstring)."""

    def __init__(
        self,
        targets: Mapping[str, int],
        *,
        max_containers: int,
        parallel_starts: int,
        initial_shape: Hashable,
        fixed_shape: Iterable[str] = (),
        stages_mounts: bool = False,
        greets: Iterable[str] = (),
        per_call: Iterable[str] = (),
    ) -> None:
        """``fixed_shape``: services whose suite names the user (their containers have no
        shape); ``stages_mounts``: pooled containers are started with the staging binds;
        ``greets``: services whose pooled containers are greeted (fresh_per_call);
        ``per_call``: services whose target follows their takes (fresh_per_call)."""
        fixed = frozenset(fixed_shape)
        rated = frozenset(per_call)
        self._greets = frozenset(greets)
        self._services = {
            name: _Service(
                target,
                None if name in fixed else initial_shape,
                fixed_shape=name in fixed,
                ceiling=max(target, PER_CALL_CEILING) if name in rated else target,
            )
            for name, target in targets.items()
            if target > 0
        }
        self._max_containers = max_containers
        self._parallel_starts = parallel_starts
        self._stages_mounts = stages_mounts
        self._next_token = 0
        self._starting = 0
        self._stopping = False
        self._claimed: dict[int, _Entry] = {}
        self._now = -math.inf  # the time of the last event
        self._images_at: float | None = -math.inf  # the next image check (None: one runs)

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

    def target(self, service: str) -> int:
        """How many pooled containers ``service`` should have now (its warm, or more for a
        per-call service recently called: see "Refills at the rate of consumption")."""
        found = self._services.get(service)
        return found.target if found is not None else 0

    @property
    def total(self) -> int:
        return sum(service.count() for service in self._services.values())

    @property
    def starting(self) -> int:
        return self._starting

    @property
    def claimed(self) -> int:
        """Containers claimed by a session, not yet handed out or removed."""
        return len(self._claimed)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def stages_mounts(self) -> bool:
        return self._stages_mounts

    @property
    def deadline(self) -> float | None:
        """When the machine next needs a :class:`Tick` (None: no time-based work is due):
        the next image check, the end of a back-off that holds a service's refill, or when a
        per-call service's oldest take leaves the window while its target is above warm."""
        if self._stopping:
            return None
        waiting = [
            service.retry_at
            for service in self._services.values()
            if service.count() < service.target and service.retry_at > self._now
        ]
        waiting += [
            service.takes[0] + RATE_WINDOW_SECONDS
            for service in self._services.values()
            if len(service.takes) > service.warm
        ]
        if self._images_at is not None:
            waiting.append(self._images_at)
        return min(waiting, default=None)

    # --- events -----------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """What to do after ``event`` at ``now``: its answer, then any image check that is
        due and the refills it allows (every event may change what is allowed)."""
        self._now = max(self._now, now)
        self._forget_takes(self._now)
        match event:
            case Tick():
                actions: list[Action] = []
            case StartSucceeded(token=token):
                actions = self._start_succeeded(token, now)
            case StartFailed(token=token, created=created):
                actions = self._start_failed(token, created, now)
            case PooledGreeted() | PooledGreetingFailed():
                actions = self._greeting_done(event, now)
            case EarlyOutput(token=token, nbytes=nbytes):
                actions = self._early_output(token, nbytes, now)
            case OutputEnded(token=token, why=why):
                actions = self._ended(token, why, now)
            case Take():
                actions = self._take(event)
            case Watched(token=token):
                actions = self._watched(token)
            case ImagesChecked(images=images):
                actions = self._images_checked(images, now)
            case StagingLost():
                self._stages_mounts = False
                actions = []
            case Shutdown():
                actions = self._stop()
        return actions + self._due(now)

    def _due(self, now: float) -> list[Action]:
        """After every event: an image check that is due, and the refills now allowed."""
        if self._stopping:
            return []
        actions: list[Action] = []
        if self._images_at is not None and self._images_at <= now:
            self._images_at = None
            actions.append(CheckImages(tuple(sorted(self._services))))
        return actions + self._trim() + self._starts(now)

    # --- refills ----------------------------------------------------------------------------

    def _forget_takes(self, now: float) -> None:
        """Takes that left the window no longer count (see "Refills at the rate of
        consumption")."""
        for service in self._services.values():
            if service.takes and service.takes[0] + RATE_WINDOW_SECONDS <= now:
                service.takes = tuple(t for t in service.takes if t + RATE_WINDOW_SECONDS > now)

    def _trim(self) -> list[Action]:
        """A per-call service's target fell below what it pools: its oldest ready containers
        above the target are removed (starting ones are, when ready, if still above it)."""
        actions: list[Action] = []
        for name, service in self._services.items():
            surplus = service.count() - service.target
            for entry in service.ready()[: max(0, surplus)]:
                del service.entries[entry.token]
                actions.append(RemovePooled(entry.token, name, "surplus"))
        return actions

    def _room_beyond_warm(self) -> bool:
        """Whether a container above its service's warm may start: every service's warm
        still fits under the cap beside it (growth never takes another service's room)."""
        held = sum(max(s.count(), s.warm) for s in self._services.values())
        return held < self._max_containers

    def _starts(self, now: float) -> list[Action]:
        actions: list[Action] = []
        total = self.total
        while self._starting < self._parallel_starts and total < self._max_containers:
            beyond = self._room_beyond_warm()
            wanting = [
                (service.count(), name)
                for name, service in self._services.items()
                if service.count() < service.target
                and service.retry_at <= now
                and (service.count() < service.warm or beyond)
            ]
            if not wanting:
                break
            _, name = min(wanting)
            service = self._services[name]
            token = self._next_token
            self._next_token += 1
            staged = self._stages_mounts
            service.entries[token] = _Entry(
                token, name, service.shape, service.generation, staged=staged, greet=service.greet
            )
            self._starting += 1
            total += 1
            actions.append(StartPooled(token, name, service.shape, staged))
        return actions

    def _start_succeeded(self, token: int, now: float) -> list[Action]:
        entry, service = self._find(token, "starting")
        if entry.greet and not self._stale(entry, service):
            # Still a start (within parallel_starts) until its greeting is done.
            entry.state = "greeting"
            return [GreetPooled(token, entry.service)]
        return self._started(entry, service, now)

    def _greeting_done(
        self, event: PooledGreeted | PooledGreetingFailed, now: float
    ) -> list[Action]:
        """Greeted: ready. Failed: it would not do for a call; removed, and its service backs
        off as after a failed start (a server that cannot be greeted is not retried in a
        storm)."""
        token = event.token
        entry, service = self._find(token, "greeting")
        if isinstance(event, PooledGreeted):
            return self._started(entry, service, now)
        self._starting -= 1
        del service.entries[token]
        self._back_off(service, now)
        return [RemovePooled(token, entry.service, "greeting_failed")]

    def _started(self, entry: _Entry, service: _Service, now: float) -> list[Action]:
        self._starting -= 1
        if self._stale(entry, service):
            del service.entries[entry.token]
            return [RemovePooled(entry.token, entry.service, self._retire_reason())]
        entry.state = "ready"
        entry.ready_at = now
        return []

    def _stale(self, entry: _Entry, service: _Service) -> bool:
        """No longer wanted: the pool stops, or its image changed since it was started."""
        return self._stopping or entry.generation != service.generation

    def _start_failed(self, token: int, created: bool, now: float) -> list[Action]:
        entry, service = self._find(token, "starting")
        self._starting -= 1
        del service.entries[token]
        self._back_off(service, now)
        return [RemovePooled(token, entry.service, "start_failed")] if created else []

    def _early_output(self, token: int, nbytes: int, now: float) -> list[Action]:
        entry = self._watched_entry(token)
        if entry is None:
            return []
        entry.early += nbytes
        if entry.early <= EARLY_STDOUT_BYTES:
            return []
        return self._ended(token, "output_before_input", now)

    def _ended(self, token: int, why: EndedReason, now: float) -> list[Action]:
        """Ready container ``token`` ended on its own while nobody used it: soon after it was
        ready, that is a failure (back-off); after a while, it is not."""
        entry = self._watched_entry(token)
        if entry is None:
            return []  # already removed
        if entry.state == "claimed":
            entry.spoiled = entry.spoiled or why  # not handed out (see _watched)
            return []
        service = self._services[entry.service]
        del service.entries[token]
        if now - entry.ready_at < HEALTHY_SECONDS:
            self._back_off(service, now)
        else:
            service.failures = 0
        return [RemovePooled(token, entry.service, why)]

    # --- sessions ---------------------------------------------------------------------------

    def _take(self, event: Take) -> list[Action]:
        """The oldest ready container that fits the session, claimed; or a miss (the session
        starts a fresh one) and what that miss retires."""
        name = event.service
        service = self._services.get(name)
        if service is None:
            return [Missed(name, "not_pooled")]
        refused = self._unfit(event)
        if refused is not None:
            return [Missed(name, refused)]
        if service.ceiling > service.warm:
            # Demand, whether or not it is served: the target follows it (the newest `ceiling`
            # takes are all that can count).
            service.takes = (*service.takes, self._now)[-service.ceiling :]
        shape = None if service.fixed_shape else event.account
        service.shape = shape
        if name in self._greets:
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
            self._claimed[entry.token] = entry
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

    def _unfit(self, event: Take) -> TakeOutcome | None:
        """Why no pooled container of the service can serve this session, whatever is ready."""
        if event.mounts and not (self._stages_mounts and event.placeable):
            return "mounts"
        if self._stopping:
            return "stopping"
        return None

    def _watched(self, token: int) -> list[Action]:
        entry = self._claimed.pop(token, None)
        if entry is None:
            raise ValueError(f"pooled container {token} is not claimed")
        if entry.spoiled is not None:
            return [RemovePooled(token, entry.service, "not_handed_out")]
        return [HandOut(token, entry.service)]

    # --- changes ----------------------------------------------------------------------------

    def _images_checked(
        self, images: tuple[tuple[str, str | None], ...], now: float
    ) -> list[Action]:
        """A service whose image is not the one its pooled containers run: retire them."""
        self._images_at = now + IMAGE_CHECK_SECONDS
        actions: list[Action] = []
        for name, image in images:
            service = self._services.get(name)
            if service is None or image is None:
                continue
            known, service.image = service.image, image
            if known is None or known == image:
                continue
            actions.append(ImageChanged(name))
            service.generation += 1
            for entry in service.ready():
                del service.entries[entry.token]
                actions.append(RemovePooled(entry.token, name, "image_changed"))
        return actions

    def _stop(self) -> list[Action]:
        """No more starts or takes; every ready container is to be removed (starting and
        greeting ones are removed as their start completes; claimed ones are their sessions')."""
        self._stopping = True
        retired: list[Action] = []
        for name, service in self._services.items():
            for entry in service.ready():
                del service.entries[entry.token]
                retired.append(RemovePooled(entry.token, name, "stopping"))
        return retired

    # --- model checking ---------------------------------------------------------------------

    def clone(self) -> WarmPoolMachine:
        """An independent copy of the machine in its current state (for model checking)."""
        twin = _shallow(self)
        twin._services = {}
        for name, service in self._services.items():
            twin._services[name] = _shallow(service)
            twin._services[name].entries = {t: _shallow(e) for t, e in service.entries.items()}
        twin._claimed = {t: _shallow(e) for t, e in self._claimed.items()}
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """A hashable summary of the whole state: equal fingerprints behave alike."""
        services = tuple(
            (
                name,
                s.warm,
                s.ceiling,
                s.takes,
                s.shape,
                s.generation,
                s.failures,
                s.retry_at,
                s.image,
                tuple(entry.key() for entry in s.entries.values()),
            )
            for name, s in self._services.items()
        )
        claimed = tuple(entry.key() for entry in self._claimed.values())
        return (
            services,
            claimed,
            self._next_token,
            self._starting,
            self._stopping,
            self._stages_mounts,
            self._now,
            self._images_at,
        )

    # --- helpers ----------------------------------------------------------------------------

    def _retire_reason(self) -> RetireReason:
        return "stopping" if self._stopping else "image_changed"

    def _watched_entry(self, token: int) -> _Entry | None:
        """Ready or claimed entry ``token`` (its output is watched), None once it is gone."""
        claimed = self._claimed.get(token)
        if claimed is not None:
            return claimed
        for service in self._services.values():
            entry = service.entries.get(token)
            if entry is not None and entry.state == "ready":
                return entry
        return None

    def _find_starting(self, token: int) -> tuple[_Entry, _Service]:
        return self._find(token, "starting")

    def _find(self, token: int, state: str) -> tuple[_Entry, _Service]:
        for service in self._services.values():
            entry = service.entries.get(token)
            if entry is not None and entry.state == state:
                return entry, service
        raise ValueError(f"pooled container {token} is not {state}")

    @staticmethod
    def _back_off(service: _Service, now: float) -> None:
        service.failures += 1
        delay = BACKOFF_FIRST_SECONDS * 2 ** min(service.failures - 1, 16)
        service.retry_at = now + min(delay, BACKOFF_MAX_SECONDS)


def _shallow(obj: _T) -> _T:
    """A shallow copy of a plain object (copy.copy's general path is most of a model check)."""
    twin = object.__new__(type(obj))
    twin.__dict__.update(obj.__dict__)
    return twin
