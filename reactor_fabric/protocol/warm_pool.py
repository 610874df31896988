"""The warm pool's decisions: which pooled containers to start, which to hand out, which to remove.

Pure: events in, actions out (their vocabulary: :mod:`.warm_pool_events`), the time passed in
(:meth:`WarmPoolMachine.handle`), and a :attr:`~WarmPoolMachine.deadline` at which the machine
next wants a :class:`Tick`; no trio, no engine. The trio layer
(:mod:`reactor_fabric.trio.warm_pool`) does what the actions say and reports what happened.

The machine is composed of parts on its books (:mod:`.warm_pool_entries`), each a module:
the refills (:mod:`.warm_pool_refills`: targets, starts within the bounds, surplus), the
containers' health while they wait (:mod:`.warm_pool_health`: start and greeting outcomes,
early output, ends) and the takes (:mod:`.warm_pool_takes`: claims and hand-outs); the rules
they keep are said here, once. The machine itself checks the images and stops the pool.

A pooled container is *starting*, *greeting*, *ready* or *claimed*; what each state means, and
what the pool records of each service, is in its books (:mod:`.warm_pool_entries`). A
container is handed to exactly one session and leaves the pool when it is claimed: it serves
that session and is then removed, never returned.

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

**Holds.** A container claimed by a session is about to serve that session's first calls, and
a pooled start beside it — an engine's create, a server loading — takes the CPU from them
(measured on two cores: the bundled worker's first call 35 / 76 ms at P50 / P95 with the
refill at once, 23 / 29 with it held; docs/BENCHMARKS.md). So after a claim no refill starts
for ``refill_hold_seconds`` (``orchestrator.warm_pool.refill_hold``, 500 ms by default); a
claim during a hold does not extend it, so refills wait at most that long even under a steady
stream of takes, and then start within the bounds above.

**Refills at the rate of consumption.** A ``fresh_per_call`` service (``per_call``) consumes one
pooled container per call, so a burst of calls would drain a pool kept at ``warm``. Its target
follows its demand: it is the number of its takes within the last ``RATE_WINDOW_SECONDS``
(hits and misses alike: a miss is a call that wanted one; not a take no pooled container
could serve: mounts that cannot be placed, the stop), never below ``warm`` and never above its
ceiling, ``max(warm, PER_CALL_CEILING)``. So the pool holds as many containers as the service
used in the last minute, and the refill of each take begins as soon as the bounds above and
the hold below allow (``parallel_starts`` rations the starts, so a burst of a hundred calls is
followed by a trickle of refills, never a storm). As takes age out of the window the target
falls back to ``warm``, one step per take, and the ready containers above it are removed, the
oldest first (``surplus``; starting ones count too: when one completes with the pool still
above the target, the oldest ready one goes). Containers above a service's ``warm`` never take room
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

Resources: none but its books, bounded by the cap (entries) and the ceilings (takes). Error
handling: an event about a container that is not in the state it names (a driver's mistake:
a start's outcome for one not starting, a hand-out of one not claimed) raises ValueError;
nothing else raises.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from .settings import Pooling
from .warm_pool_entries import Books, PooledService, shallow_copy
from .warm_pool_events import (
    Action,
    CheckImages,
    Claim,
    EarlyOutput,
    Event,
    ImageChanged,
    ImagesChecked,
    OutputEnded,
    PooledGreeted,
    PooledGreetingFailed,
    RemovePooled,
    Shutdown,
    StagingLost,
    StartFailed,
    StartSucceeded,
    Take,
    Tick,
    Watched,
)
from .warm_pool_health import Health
from .warm_pool_refills import Refills
from .warm_pool_takes import Takes

# How often pooled services' images are compared with what the engine has (a rebuilt image
# retires the pooled containers of the old one).
IMAGE_CHECK_SECONDS = 30.0

# --- the machine ----------------------------------------------------------------------------


class WarmPoolMachine:
    """Every pooled container of one orchestrator, all services (see the module docstring).

    Its parts, on its books (:attr:`books`): :attr:`refills` (each service's target, the
    starts its bounds allow), :attr:`health` (containers from their start until claimed: start
    and greeting outcomes, early output, ends) and :attr:`takes` (claims and hand-outs); the
    machine dispatches the events to them, checks the images and stops the pool."""

    def __init__(
        self, pooling: Pooling, *, initial_shape: Hashable, stages_mounts: bool = False
    ) -> None:
        """``pooling``: what the suite says the pool keeps (the settings'); ``initial_shape``:
        what refills take until a session asks for another; ``stages_mounts``: pooled
        containers are started with the staging binds."""
        fixed = pooling.fixed_shape
        services = {
            name: PooledService.of(
                target,
                None if name in fixed else initial_shape,
                fixed_shape=name in fixed,
                per_call=name in pooling.per_call,
            )
            for name, target in pooling.targets.items()
            if target > 0
        }
        self.books = Books(services, stages_mounts=stages_mounts)
        self.refills = Refills(
            self.books,
            max_containers=pooling.max_containers,
            parallel_starts=pooling.parallel_starts,
            hold_seconds=pooling.refill_hold_seconds,
        )
        self.health = Health(self.books)
        self.takes = Takes(self.books, greets=pooling.greets)
        self._images_at: float | None = -math.inf  # the next image check (None: one runs)

    # --- what exists ------------------------------------------------------------------------

    @property
    def services(self) -> frozenset[str]:
        """The services that keep a pool (``warm`` above 0)."""
        return frozenset(self.books.services)

    def pooled(self, service: str) -> int:
        """Pooled containers of ``service``, starting and ready."""
        found = self.books.services.get(service)
        return found.count() if found is not None else 0

    def ready(self, service: str) -> int:
        found = self.books.services.get(service)
        return len(found.ready()) if found is not None else 0

    def target(self, service: str) -> int:
        """How many pooled containers ``service`` should have now (its warm, or more for a
        per-call service recently called: see "Refills at the rate of consumption")."""
        found = self.books.services.get(service)
        return found.target if found is not None else 0

    @property
    def total(self) -> int:
        return self.books.total()

    @property
    def starting(self) -> int:
        return self.books.starting

    @property
    def claimed(self) -> int:
        """Containers claimed by a session, not yet handed out or removed."""
        return len(self.books.claimed)

    @property
    def stopping(self) -> bool:
        return self.books.stopping

    @property
    def stages_mounts(self) -> bool:
        return self.books.stages_mounts

    @property
    def deadline(self) -> float | None:
        """When the machine next needs a :class:`Tick` (None: no time-based work is due):
        the next image check, the end of a back-off that holds a service's refill, or when a
        per-call service's oldest take leaves the window while its target is above warm."""
        if self.books.stopping:
            return None
        waiting = self.refills.due()
        if self._images_at is not None:
            waiting.append(self._images_at)
        return min(waiting, default=None)

    # --- events -----------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """What to do after ``event`` at ``now``: its answer, then any image check that is
        due and the refills it allows (every event may change what is allowed)."""
        books, health = self.books, self.health
        books.now = max(books.now, now)
        self.refills.forget_takes(books.now)
        match event:
            case Tick():
                actions: list[Action] = []
            case StartSucceeded(token=token):
                actions = health.start_succeeded(token, now)
            case StartFailed(token=token, created=created):
                actions = health.start_failed(token, created, now)
            case PooledGreeted() | PooledGreetingFailed():
                actions = health.greeting_done(event, now)
            case EarlyOutput(token=token, nbytes=nbytes):
                actions = health.early_output(token, nbytes, now)
            case OutputEnded(token=token, why=why):
                actions = health.ended(token, why, now)
            case Take():
                actions = self.takes.take(event)
                if any(isinstance(action, Claim) for action in actions):
                    self.refills.hold(now)
            case Watched(token=token):
                actions = self.takes.watched(token)
            case ImagesChecked(images=images):
                actions = self._images_checked(images, now)
            case StagingLost():
                books.stages_mounts = False
                actions = []
            case Shutdown():
                actions = self._stop()
        return actions + self._due(now)

    def _due(self, now: float) -> list[Action]:
        """After every event: an image check that is due, and the refills now allowed."""
        if self.books.stopping:
            return []
        actions: list[Action] = []
        if self._images_at is not None and self._images_at <= now:
            self._images_at = None
            actions.append(CheckImages(tuple(sorted(self.books.services))))
        return actions + self.refills.trim() + self.refills.starts(now)

    # --- changes ----------------------------------------------------------------------------

    def _images_checked(
        self, images: tuple[tuple[str, str | None], ...], now: float
    ) -> list[Action]:
        """A service whose image is not the one its pooled containers run: retire them."""
        self._images_at = now + IMAGE_CHECK_SECONDS
        actions: list[Action] = []
        for name, image in images:
            service = self.books.services.get(name)
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
        self.books.stopping = True
        retired: list[Action] = []
        for name, service in self.books.services.items():
            for entry in service.ready():
                del service.entries[entry.token]
                retired.append(RemovePooled(entry.token, name, "stopping"))
        return retired

    # --- model checking ---------------------------------------------------------------------

    def clone(self) -> WarmPoolMachine:
        """An independent copy of the machine in its current state (for model checking)."""
        twin = shallow_copy(self)
        books = twin.books = self.books.clone()
        twin.refills = self.refills.on(books)
        twin.health = self.health.on(books)
        twin.takes = self.takes.on(books)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """A hashable summary of the whole state: equal fingerprints behave alike."""
        return (*self.books.key(), self._images_at)
