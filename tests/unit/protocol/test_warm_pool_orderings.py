"""Every ordering of the events the warm pool can see, explored exhaustively.

A model world surrounds the pure pool machine: an engine whose starts succeed, fail before or
after the container was created; pooled servers that write before anyone spoke to them (up to
the bound, then past it) or exit, also after a session claimed them and before its watch
stopped, and once more after their removal was asked for (a watcher that had not seen the
cancellation yet); sessions that take a container for one of two accounts, with mounts the
staging area can place or cannot, or none; a staging area that stops working; an image rebuilt
and the checks that find it; a clock that jumps to the machine's next deadline; and the
orchestrator stopping. From every reachable state every enabled event is tried (states seen
before are not explored again: they behave alike), and after every step the invariants below
must hold. Modelled on the relay's checker (tests/unit/protocol/test_session_orderings.py).

Invariants:

- nothing is started after shutdown, and no session is given a container after it (one
  claimed before it may still be handed out: it is that session's);
- no container is handed to two sessions: each is claimed at most once, handed out at most
  once, only after its claim was watched, and never after it was removed;
- the global cap is never exceeded (starting + ready, all services), nor ``parallel_starts``,
  nor a service's target;
- every started container is eventually removed or handed out (when nothing else can happen,
  after shutdown), and removed at most once, only while it exists;
- accounts are respected: a session gets a container of its account (any account for a service
  whose suite names the user), and a miss for want of one ("empty", "shape") happens only when
  no ready container has it;
- a session with mounts gets a container started with the staging binds, only for mounts the
  staging area can place, and never once staging is lost;
- a container is never handed out after its output ended, was invalid or overflowed, nor after
  an image change the machine saw since its start;
- a Tick at the deadline always moves the deadline past now (the driver never spins);
- the machine's books agree with the world's: what it pools (starting + greeting + ready),
  what is claimed;
- a greeted container (a ``fresh_per_call`` service's, greeted on the fabric endpoint's
  demand) goes only to a session that may take one, a greeting is part of its start (within
  the cap and ``parallel_starts``), and one that failed it is removed, never ready;
- after a claim, no refill starts during the hold (the world keeps its own: a claim during a
  hold does not extend it), and a service below its warm during one has the machine's
  deadline at the hold's end at the latest (it is woken, never left unrefilled);
- a per-call service's refills follow its takes (the world counts them itself): it never pools
  more than its takes within the window (at least its warm, at most its ceiling), a container
  above its warm starts only while every service's warm still fits under the cap beside it, a
  ``surplus`` removal happens only above its target, and once an event is handled, a service
  above its target has no ready container left (the surplus was removed).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from reactor_fabric.protocol.settings import Pooling
from reactor_fabric.protocol.warm_pool import IMAGE_CHECK_SECONDS, WarmPoolMachine
from reactor_fabric.protocol.warm_pool_entries import (
    PER_CALL_CEILING,
    RATE_WINDOW_SECONDS,
    shallow_copy,
)
from reactor_fabric.protocol.warm_pool_events import (
    ENDED_REASONS,
    Action,
    CheckImages,
    Claim,
    EarlyOutput,
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
    Shutdown,
    StagingLost,
    StartFailed,
    StartPooled,
    StartSucceeded,
    Take,
    Tick,
    Watched,
)
from reactor_fabric.protocol.warm_pool_health import EARLY_STDOUT_BYTES, Health
from reactor_fabric.protocol.warm_pool_refills import Refills
from reactor_fabric.protocol.warm_pool_takes import Takes
from tests import orderings
from tests.orderings import Violation, check

TARGETS = {"a": 2, "b": 1}  # together more than the cap: rationing is exercised
FIXED = ("b",)  # b's suite names its user: its containers have one shape
GREETS = ("a",)  # a is fresh_per_call: its pooled containers are greeted on demand
# Services whose refills follow their takes (set for the rate world below: a's there).
PER_CALL: tuple[str, ...] = ()
MAX_CONTAINERS = 2
PARALLEL_STARTS = 2
# The pool's refill hold after a claim (0: none; set for the held world below).
HOLD = 0.0
X, Y = "account-x", "account-y"
# What sessions ask for: (service, account, mounts, placeable, greeted: a fabric per-call
# backend, which may take a greeted container).
Session = tuple[str, Any, bool, bool, bool]
SESSIONS: list[Session] = [
    ("a", X, False, False, False),
    ("a", Y, False, False, False),
    ("a", X, True, True, False),
    ("a", X, True, False, False),
    ("b", Y, False, False, False),
    ("a", X, False, False, True),
]
# Bounds that keep each exploration finite (set per test): sessions per run, misfortunes per
# run (failed starts, servers that exit, garble or flood, staging lost, the image rebuilt),
# image checks answered per run.
TAKES = 2
MISFORTUNES = 2
CHECKS = 2
MAX_STATES = 2_000_000


@dataclass
class Box:
    """A model pooled container, from the start the machine asked for."""

    token: int
    service: str
    shape: Any
    staged: bool
    generation: int  # image changes of its service the machine had seen at its start
    state: str = "starting"  # starting, greeting, ready, claimed, handed, removed, failed
    greeted: bool = False  # the pool greeted it (only a fabric per-call backend may take it)
    created: bool = False  # a container exists (its start got that far)
    early: int = 0  # bytes it wrote while it waited
    ended: bool = False  # its output ended, was invalid or overflowed (reported)
    late: bool = False  # its watcher reported once more after its removal
    session: Session | None = None  # who claimed it

    def key(self) -> tuple[object, ...]:
        return (
            self.token,
            self.service,
            self.shape,
            self.staged,
            self.generation,
            self.state,
            self.greeted,
            self.created,
            self.early,
            self.ended,
            self.late,
            self.session,
        )


@dataclass
class World:
    machine: WarmPoolMachine
    now: float = 0.0
    boxes: dict[int, Box] = field(default_factory=dict)
    generation: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0))
    image: str = "v0"  # service a's image in the engine
    issued: int = 0  # tokens below were started before (their boxes may be forgotten)
    check: tuple[str, ...] | None = None  # an image check the machine asked for
    checks: int = 0
    takes: int = 0
    demand: tuple[float, ...] = ()  # when per-call service a was taken from (in the window)
    misfortunes: int = 0
    staging_lost: bool = False
    stopping: bool = False
    step: str = ""  # what the world is doing (actions are checked against it)
    answered: bool = False  # the current take was answered (claim or miss)
    held_until: float = -math.inf  # no refill may start before (the hold of a claim)

    def clone(self) -> World:
        twin = shallow_copy(self)
        twin.machine = self.machine.clone()
        twin.boxes = {token: shallow_copy(box) for token, box in self.boxes.items()}
        twin.generation = dict(self.generation)
        return twin

    def key(self) -> tuple[object, ...]:
        return (
            self.machine.fingerprint(),
            self.now,
            tuple(box.key() for box in self.boxes.values()),
            tuple(self.generation.items()),
            self.image,
            self.check,
            self.checks,
            self.takes,
            self.demand,
            self.misfortunes,
            self.staging_lost,
            self.stopping,
            self.held_until,
        )

    def in_pool(self, *states: str) -> list[Box]:
        return [box for box in self.boxes.values() if box.state in states]


def target_of(world: World, service: str) -> int:
    """A service's target as the rule says, from the world's own count of its takes."""
    warm = TARGETS[service]
    if service not in PER_CALL:
        return warm
    recent = [t for t in world.demand if t + RATE_WINDOW_SECONDS > world.now]
    return min(max(warm, PER_CALL_CEILING), max(warm, len(recent)))


def pooled_of(world: World, service: str) -> int:
    return sum(
        1 for box in world.in_pool("starting", "greeting", "ready") if box.service == service
    )


def fits(box: Box, service: str, account: Any) -> bool:
    return box.service == service and box.shape == (None if service in FIXED else account)


def apply(world: World, event: Event, actions: list[Action], trail: list[str]) -> None:
    """What the world does with the machine's actions, checking them as it goes."""
    for action in actions:
        match action:
            case StartPooled(token=token, service=service, shape=shape, staged=staged):
                check(not world.stopping, f"{token} started after shutdown", trail)
                check(token >= world.issued, f"{token} started twice", trail)
                check(world.now >= world.held_until, f"{token} started during a hold", trail)
                world.issued = token + 1
                check(staged == (not world.staging_lost), f"{token} staged={staged}", trail)
                check(shape is None or service not in FIXED, f"{token} has a shape", trail)
                world.boxes[token] = Box(token, service, shape, staged, world.generation[service])
                pooled = world.in_pool("starting", "greeting", "ready")
                check(len(pooled) <= MAX_CONTAINERS, "the global cap exceeded", trail)
                # (the start this event completed is no longer one, though the world marks it
                # ready only after the machine answered: its slot may go to this start)
                done = finished(event, actions)
                starting = [b for b in world.in_pool("starting", "greeting") if b.token != done]
                check(len(starting) <= PARALLEL_STARTS, "too many starts at once", trail)
                mine = [box for box in pooled if box.service == service]
                check(len(mine) <= target_of(world, service), f"{service} above its target", trail)
                if len(mine) > TARGETS[service]:
                    held = sum(max(pooled_of(world, name), warm) for name, warm in TARGETS.items())
                    check(held <= MAX_CONTAINERS, f"{service} grew into another's warm", trail)
            case GreetPooled(token=token, service=service):
                box = world.boxes.get(token)
                check(event == StartSucceeded(token), f"{token} greeted unstarted", trail)
                check(service in GREETS, f"{token} of {service} greeted", trail)
                check(box is not None and box.state == "starting", f"{token} greeted", trail)
                assert box is not None
                box.state = "greeting"
            case RemovePooled(token=token, reason=reason):
                removed(world, event, token, reason, trail)
            case Claim(token=token, service=service):
                claimed(world, event, token, service, trail)
                if HOLD > 0 and world.now >= world.held_until:  # (a claim does not extend it)
                    world.held_until = world.now + HOLD
            case HandOut(token=token):
                box = world.boxes.get(token)
                check(event == Watched(token), f"{token} handed out unasked", trail)
                check(box is not None and box.state == "claimed", f"{token} handed out", trail)
                assert box is not None
                check(not box.ended, f"{token} handed out after its output ended", trail)
                box.state = "handed"
            case Missed(service=service, outcome=outcome):
                missed(world, event, service, outcome, trail)
            case CheckImages(services=services):
                check(world.check is None, "an image check while one runs", trail)
                check(not world.stopping, "an image check after shutdown", trail)
                world.check = services
            case ImageChanged(service=service):
                check(isinstance(event, ImagesChecked), "an image change unasked", trail)
                world.generation[service] += 1


def finished(event: Event, actions: list[Action]) -> int | None:
    """The pooled start ``event`` completed (succeeded, greeted, failed), if it did."""
    if isinstance(event, StartSucceeded):
        greeting = (
            GreetPooled(event.token, "a") in actions or GreetPooled(event.token, "b") in actions
        )
        return None if greeting else event.token
    if isinstance(event, PooledGreeted | PooledGreetingFailed | StartFailed):
        return event.token
    return None


def removed(world: World, event: Event, token: int, reason: str, trail: list[str]) -> None:
    box = world.boxes.get(token)
    check(box is not None, f"removal of unknown {token}", trail)
    assert box is not None
    if box.state == "starting":
        done = event in (StartSucceeded(token), StartFailed(token, created=True))
        check(done, f"{token} removed while starting", trail)
    elif box.state == "greeting":
        done = isinstance(event, PooledGreeted | PooledGreetingFailed) and event.token == token
        check(done, f"{token} removed while greeting", trail)
        failed_greeting = isinstance(event, PooledGreetingFailed)
        check(failed_greeting == (reason == "greeting_failed"), f"{token}: {reason}", trail)
    elif box.state == "claimed":
        check(event == Watched(token), f"{token} removed while claimed", trail)
        check(box.ended and reason == "not_handed_out", f"{token} not handed out ({reason})", trail)
    else:
        check(box.state == "ready", f"{token} removed when {box.state}", trail)
    if reason == "stopping":
        check(world.stopping, f"{token} removed for a stop before it", trail)
    if reason == "surplus":
        above = pooled_of(world, box.service) > target_of(world, box.service)
        check(above, f"{token} removed as surplus within its target", trail)
    if reason == "image_changed":
        stale = box.generation != world.generation[box.service]
        check(stale, f"{token} removed for an image change it predates", trail)
    if reason in ENDED_REASONS:
        check(box.ended, f"{token} removed as {reason} before it ended", trail)
    if reason == "output_before_input":
        check(box.early > EARLY_STDOUT_BYTES, f"{token} removed for {box.early} bytes", trail)
    box.state = "removed"


def claimed(world: World, event: Event, token: int, service: str, trail: list[str]) -> None:
    box = world.boxes.get(token)
    check(isinstance(event, Take) and not world.answered, f"{token} claimed unasked", trail)
    assert isinstance(event, Take)
    world.answered = True
    check(not world.stopping, f"{token} claimed after shutdown", trail)
    check(box is not None and box.state == "ready", f"{token} claimed twice or unready", trail)
    assert box is not None
    check(service == event.service == box.service, f"{token} for another service", trail)
    check(fits(box, service, event.account), f"{token} of another account", trail)
    check(event.greeted or not box.greeted, f"{token} greeted, to a relay session", trail)
    if event.mounts:
        check(event.placeable, f"{token} given for mounts it cannot place", trail)
        check(box.staged and not world.staging_lost, f"{token} given for mounts", trail)
    check(not box.ended, f"{token} claimed after its output ended", trail)
    current = box.generation == world.generation[service]
    check(current, f"{token} claimed after an image change", trail)
    box.state = "claimed"
    box.session = (event.service, event.account, event.mounts, event.placeable, event.greeted)


def missed(world: World, event: Event, service: str, outcome: str, trail: list[str]) -> None:
    check(isinstance(event, Take) and not world.answered, f"a miss unasked ({outcome})", trail)
    assert isinstance(event, Take)
    world.answered = True
    if outcome in ("empty", "shape", "greeted"):
        fitting = [
            box.token
            for box in world.in_pool("ready")
            if fits(box, service, event.account) and (event.greeted or not box.greeted)
        ]
        check(not fitting, f"a miss ({outcome}) with {fitting} ready", trail)
    if outcome == "stopping":
        check(world.stopping, "a miss for a stop before it", trail)
    if outcome == "mounts":
        check(event.mounts, "a miss for mounts without mounts", trail)


Step = tuple[str, Callable[[World], Event]]


def enabled(world: World) -> list[Step]:
    """The events that can happen next in this world (each returns the event to feed)."""
    steps: list[Step] = []
    for box in world.boxes.values():
        steps += box_steps(world, box)
    if world.takes < TAKES:
        for index, session in enumerate(SESSIONS):
            steps.append((f"take-{index}", partial(take, session=session)))
    if world.check is not None and world.checks < CHECKS:
        steps.append(("images", answer_check))
    if world.image == "v0" and world.misfortunes < MISFORTUNES:
        steps.append(("rebuild", rebuild))
    if not world.staging_lost and world.misfortunes < MISFORTUNES:
        steps.append(("staging-lost", lose_staging))
    if world.machine.deadline is not None:
        steps.append(("tick", tick))
    if not world.stopping:
        steps.append(("shutdown", shutdown))
    return steps


def box_steps(world: World, box: Box) -> list[Step]:
    token = box.token
    unlucky = world.misfortunes < MISFORTUNES
    steps: list[Step] = []
    if box.state == "starting":
        steps.append((f"started-{token}", partial(started, token=token)))
        if unlucky:
            steps.append((f"start-failed-{token}", partial(failed, token=token)))
            steps.append((f"failed-created-{token}", partial(failed, token=token, made=True)))
    elif box.state == "greeting":
        steps.append((f"greeted-{token}", partial(greeted, token=token)))
        if unlucky:
            steps.append((f"greeting-failed-{token}", partial(greeting_failed, token=token)))
    elif box.state in ("ready", "claimed"):
        if unlucky and not box.ended:
            # Its bound in one write (kept), and once more (over it): removed.
            big = EARLY_STDOUT_BYTES
            steps.append((f"writes-{token}", partial(output, token=token, nbytes=big)))
            steps.append((f"exits-{token}", partial(ends, token=token, why="exited")))
        if box.state == "claimed":
            steps.append((f"watched-{token}", partial(watched, token=token)))
    elif steps_of(box):
        steps.append((f"late-exit-{token}", partial(late, token=token)))
    return steps


def started(world: World, token: int) -> Event:
    world.boxes[token].created = True  # ready, unless the machine removes it at once
    return StartSucceeded(token)


def failed(world: World, token: int, made: bool = False) -> Event:
    world.misfortunes += 1
    box = world.boxes[token]
    box.created = made
    if not made:
        box.state = "failed"
    return StartFailed(token, created=made)


def greeted(world: World, token: int) -> Event:
    return PooledGreeted(token)


def greeting_failed(world: World, token: int) -> Event:
    world.misfortunes += 1
    world.boxes[token].ended = True  # it is done for (its removal is logged as an end)
    return PooledGreetingFailed(token, "greeting_invalid")


def output(world: World, token: int, nbytes: int) -> Event:
    world.misfortunes += 1
    box = world.boxes[token]
    box.early += nbytes
    box.ended = box.early > EARLY_STDOUT_BYTES
    return EarlyOutput(token, nbytes)


def ends(world: World, token: int, why: Any) -> Event:
    world.misfortunes += 1
    world.boxes[token].ended = True
    return OutputEnded(token, why)


def late(world: World, token: int) -> Event:
    world.boxes[token].late = True
    return OutputEnded(token, "exited")


def watched(world: World, token: int) -> Event:
    return Watched(token)


def take(world: World, session: Session) -> Event:
    world.takes += 1
    world.answered = False
    service, account, mounts, placeable, greeted = session
    unfit = world.stopping or (mounts and (world.staging_lost or not placeable))
    if service in PER_CALL and not unfit:
        world.demand = (*world.demand, world.now)
    return Take(service, account, mounts, placeable, greeted)


def answer_check(world: World) -> Event:
    services, world.check = world.check, None
    assert services is not None
    world.checks += 1
    return ImagesChecked(tuple((name, world.image if name == "a" else "v0") for name in services))


def rebuild(world: World) -> Event:
    world.misfortunes += 1
    world.image = "v1"
    return Tick()  # the engine's change: the machine learns it at its next check


def lose_staging(world: World) -> Event:
    world.misfortunes += 1
    world.staging_lost = True
    return StagingLost()


def tick(world: World) -> Event:
    deadline = world.machine.deadline
    assert deadline is not None
    world.now = max(world.now, deadline)
    return Tick()


def shutdown(world: World) -> Event:
    world.stopping = True
    return Shutdown()


def after(world: World, event: Event, trail: list[str]) -> None:
    """Checks once the machine answered an event."""
    machine = world.machine
    if isinstance(event, Take):
        check(world.answered, f"{event} not answered", trail)
    if isinstance(event, StartSucceeded) and world.boxes[event.token].state == "starting":
        world.boxes[event.token].state = "ready"
    if isinstance(event, PooledGreeted) and world.boxes[event.token].state == "greeting":
        world.boxes[event.token].state = "ready"
        world.boxes[event.token].greeted = True
    if isinstance(event, PooledGreetingFailed):
        kept = world.boxes[event.token].state == "greeting"
        check(not kept, f"{event.token} failed its greeting and was kept", trail)
    if isinstance(event, StartFailed) and event.created:
        kept = world.boxes[event.token].state == "starting"
        check(not kept, f"{event.token} failed to start and was kept", trail)
    if isinstance(event, Tick):
        deadline = machine.deadline
        check(deadline is None or deadline > world.now, f"a Tick left {deadline} due", trail)
    pooled = world.in_pool("starting", "greeting", "ready")
    check(machine.total == len(pooled), f"{machine.total} pooled, the world has {pooled}", trail)
    world.demand = tuple(t for t in world.demand if t + RATE_WINDOW_SECONDS > world.now)
    if not world.stopping:
        for service in TARGETS:
            ready = [b for b in world.in_pool("ready") if b.service == service]
            above = pooled_of(world, service) > target_of(world, service)
            check(not (above and ready), f"{service} keeps a surplus ready", trail)
    check(machine.claimed == len(world.in_pool("claimed")), "claims out of step", trail)
    if not world.stopping and world.now < world.held_until:
        below = [name for name, warm in TARGETS.items() if pooled_of(world, name) < warm]
        deadline = machine.deadline
        woken = deadline is not None and deadline <= world.held_until
        check(not below or woken, f"{below} held with no deadline at the hold's end", trail)
    # Settled for good (nothing more can happen to it): forgotten, so that histories that
    # differ only in those merge. Anything the machine still says about it is then a violation.
    for token in [
        token for token, box in world.boxes.items() if settled(box) and not steps_of(box)
    ]:
        del world.boxes[token]


def settled(box: Box) -> bool:
    return box.state in ("handed", "removed") or (box.state == "failed" and not box.created)


def steps_of(box: Box) -> bool:
    """Whether something may still happen to a settled box (a late report of its watcher)."""
    return box.state == "removed" and box.created and not box.late and not box.ended


def final_checks(world: World, trail: list[str]) -> None:
    """Once nothing more can happen (always after shutdown: until then, it is possible)."""
    check(world.stopping, "an end before shutdown", trail)
    for box in world.boxes.values():
        check(settled(box), f"{box.token} left {box.state}", trail)
    check(world.machine.total == 0, "the machine still pools containers", trail)


def advance(world: World, make_event: Callable[[World], Event], trail: list[str]) -> None:
    """One step: the event fed to the machine, the world playing its part, the checks."""
    event = make_event(world)
    actions = world.machine.handle(event, world.now)
    apply(world, event, actions, trail)
    after(world, event, trail)


def explore() -> int:
    """Visit every reachable state once; the number visited."""
    pooling = Pooling(
        TARGETS,
        max_containers=MAX_CONTAINERS,
        parallel_starts=PARALLEL_STARTS,
        fixed_shape=frozenset(FIXED),
        greets=frozenset(GREETS),
        per_call=frozenset(PER_CALL),
        refill_hold_seconds=HOLD,
    )
    machine = WarmPoolMachine(pooling, initial_shape=X, stages_mounts=True)
    start = World(machine)
    first: list[str] = ["begin"]
    apply(start, Tick(), machine.handle(Tick(), 0.0), first)  # the driver's first Tick
    return orderings.explore(
        start,
        enabled,
        advance,
        at_end=final_checks,
        trail=("begin", None),
        max_states=MAX_STATES,
    )


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("takes", "misfortunes", "checks", "at_least"),
    [
        (3, 0, 1, 25_000),  # sessions racing refills and each other: shapes, mounts, the cap
        (0, 2, 2, 35_000),  # two misfortunes anywhere: failed starts, ends, staging, a rebuild
        (1, 1, 2, 45_000),  # a session and a misfortune, a rebuild found by the second check
    ],
    ids=["sessions", "misfortunes", "both"],
)
def test_every_reachable_state_of_the_warm_pool_keeps_the_invariants(
    monkeypatch: pytest.MonkeyPatch, takes: int, misfortunes: int, checks: int, at_least: int
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "TAKES", takes)
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", misfortunes)
    monkeypatch.setattr(sys.modules[__name__], "CHECKS", checks)
    states = explore()
    # The whole space was visited (it is this large because every event is tried everywhere).
    assert states >= at_least


# A pool where the per-call service a may grow: the cap leaves room beyond every warm; sessions
# of a (fabric per-call backends) and of b only (the other kinds are explored above).
RATE_TARGETS = {"a": 1, "b": 1}
RATE_MAX_CONTAINERS = 3
RATE_SESSIONS: list[Session] = [("a", X, False, False, True), ("b", Y, False, False, False)]


def rate_world(monkeypatch: pytest.MonkeyPatch) -> None:
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "TARGETS", RATE_TARGETS)
    monkeypatch.setattr(module, "MAX_CONTAINERS", RATE_MAX_CONTAINERS)
    monkeypatch.setattr(module, "SESSIONS", RATE_SESSIONS)
    monkeypatch.setattr(module, "PER_CALL", ("a",))
    monkeypatch.setattr(module, "TAKES", 2)
    monkeypatch.setattr(module, "MISFORTUNES", 0)
    monkeypatch.setattr(module, "CHECKS", 1)


@pytest.mark.exhaustive
def test_every_reachable_state_of_a_pool_that_follows_its_takes_keeps_the_invariants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two calls racing refills, the pool growing beyond a's warm and the window's end
    # shrinking it back, in every order.
    rate_world(monkeypatch)
    assert explore() >= 10_000


@pytest.mark.exhaustive
def test_every_reachable_state_of_a_pool_that_holds_its_refills_keeps_the_invariants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Refills held after each claim (never during a hold, always woken at its end), sessions
    # racing them and the clock, with the per-call world's growth.
    rate_world(monkeypatch)
    monkeypatch.setattr(sys.modules[__name__], "HOLD", 0.5)
    assert explore() >= 25_000


ORIGINAL_REFILL_STARTS = Refills.starts
ORIGINAL_DUE = Refills.due


def _starts_through_holds(self: Refills, now: float) -> list[Action]:
    # Forgets the hold when it starts refills.
    held, self.books.held_until = self.books.held_until, -math.inf
    try:
        return ORIGINAL_REFILL_STARTS(self, now)
    finally:
        self.books.held_until = held


def _hold_without_deadline(self: Refills) -> list[float]:
    # Holds refills but never asks to be woken at the hold's end.
    return [t for t in ORIGINAL_DUE(self) if t != self.books.held_until]


@pytest.mark.parametrize(
    ("method", "bug", "caught"),
    [
        ("starts", _starts_through_holds, "started during a hold"),
        ("due", _hold_without_deadline, "held with no deadline at the hold's end"),
    ],
    ids=["ignored", "never-woken"],
)
def test_the_checker_catches_a_pool_that_gets_its_holds_wrong(
    monkeypatch: pytest.MonkeyPatch, method: str, bug: Callable[..., Any], caught: str
) -> None:
    monkeypatch.setattr(Refills, method, bug)
    rate_world(monkeypatch)
    monkeypatch.setattr(sys.modules[__name__], "HOLD", 0.5)
    with pytest.raises(Violation, match=caught):
        explore()


def _no_trim(self: Refills) -> list[Action]:
    # Forgets to give back what the target no longer asks for.
    return []


def _no_window(self: Refills, now: float) -> None:
    # Counts every take ever made (the target never falls back).
    return


@pytest.mark.parametrize(
    ("method", "bug", "caught"),
    [
        ("trim", _no_trim, "keeps a surplus ready"),
        # (the takes' deadline comes, and the Tick at it changes nothing: a spin)
        ("forget_takes", _no_window, "a Tick left .* due"),
    ],
    ids=["trim", "window"],
)
def test_the_checker_catches_a_pool_that_does_not_shrink_back(
    monkeypatch: pytest.MonkeyPatch, method: str, bug: Callable[..., Any], caught: str
) -> None:
    monkeypatch.setattr(Refills, method, bug)
    rate_world(monkeypatch)
    with pytest.raises(Violation, match=caught):
        explore()


def _starts_after_shutdown(self: WarmPoolMachine) -> list[Action]:
    # Retires the ready ones but forgets that the pool stops: refills go on.
    retired: list[Action] = []
    for name, service in self.books.services.items():
        for entry in service.ready():
            del service.entries[entry.token]
            retired.append(RemovePooled(entry.token, name, "stopping"))
    return retired


def _any_account(self: Takes, event: Take) -> list[Action]:
    # Hands out the oldest ready container whatever its account.
    service = self.books.services.get(event.service)
    if service is None or self.books.stopping or event.mounts:
        return [Missed(event.service, "not_pooled")]
    for entry in service.ready():
        del service.entries[entry.token]
        entry.state = "claimed"
        self.books.claimed[entry.token] = entry
        return [Claim(entry.token, event.service)]
    return [Missed(event.service, "empty")]


def _claimed_again(self: Takes, event: Take) -> list[Action]:
    # With none ready, hands out one already claimed by another session (still in the books).
    actions = ORIGINAL_TAKE(self, event)
    if Missed(event.service, "empty") in actions:
        for token, entry in self.books.claimed.items():
            if entry.service == event.service:
                return [Claim(token, event.service)]
    return actions


def _stale_kept(
    self: WarmPoolMachine, images: tuple[tuple[str, str | None], ...], now: float
) -> list[Action]:
    # Sees a rebuilt image but keeps the ready containers of the old one.
    self._images_at = now + IMAGE_CHECK_SECONDS
    actions: list[Action] = []
    for name, image in images:
        service = self.books.services[name]
        known, service.image = service.image, image
        if known is not None and known != image:
            actions.append(ImageChanged(name))
            service.generation += 1
    return actions


def _over_the_cap(self: Refills, now: float) -> list[Action]:
    # Counts the cap one too high.
    self.max_containers += 1
    try:
        return ORIGINAL_STARTS(self, now)
    finally:
        self.max_containers -= 1


def _kept_after_start(self: Health, token: int, now: float) -> list[Action]:
    # A start that completes after shutdown is forgotten instead of removed.
    if self.books.stopping:
        _, service = self.books.find(token, "starting")
        self.books.starting -= 1
        del service.entries[token]
        return []
    return ORIGINAL_SUCCEEDED(self, token, now)


def _greeted_to_anyone(self: Takes, event: Take) -> list[Action]:
    # Takes every session for a fabric per-call backend: a relay session gets greeted ones.
    return ORIGINAL_TAKE(
        self, Take(event.service, event.account, event.mounts, event.placeable, greeted=True)
    )


ORIGINAL_TAKE = Takes.take
ORIGINAL_STARTS = Refills.starts
ORIGINAL_SUCCEEDED = Health.start_succeeded


@pytest.mark.parametrize(
    ("part", "method", "bug", "caught", "takes", "checks"),
    [
        (WarmPoolMachine, "_stop", _starts_after_shutdown, "started after shutdown", 2, 1),
        (Takes, "take", _any_account, "of another account", 2, 1),
        (Takes, "take", _claimed_again, "claimed twice", 2, 1),
        (Refills, "starts", _over_the_cap, "the global cap exceeded", 2, 1),
        (Health, "start_succeeded", _kept_after_start, "pooled, the world has", 2, 1),
        (WarmPoolMachine, "_images_checked", _stale_kept, "claimed after an image change", 1, 2),
        (Takes, "take", _greeted_to_anyone, "greeted, to a relay session", 3, 1),
    ],
    ids=[
        "start-after-shutdown",
        "wrong-account",
        "two-sessions",
        "over-cap",
        "never-removed",
        "stale-image",
        "greeted-to-relay",
    ],
)
def test_the_checker_catches_a_machine_that_breaks_an_invariant(
    monkeypatch: pytest.MonkeyPatch,
    part: type,
    method: str,
    bug: Callable[..., list[Action]],
    caught: str,
    takes: int,
    checks: int,
) -> None:
    # The invariants must be able to fail: break the machine (the part that has the method),
    # and exploring finds it.
    monkeypatch.setattr(part, method, bug)
    monkeypatch.setattr(sys.modules[__name__], "TAKES", takes)
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", 1)
    monkeypatch.setattr(sys.modules[__name__], "CHECKS", checks)
    with pytest.raises(Violation, match=caught):
        explore()
