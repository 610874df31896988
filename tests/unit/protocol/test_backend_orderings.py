"""Exhaustive exploration of the one backend model (reactor_fabric/protocol/backend.py).

Both endpoints' machines keep their backends as :class:`Backend` records and decide with the
model's rules; this explores the model once, on its own, so that the endpoints' explorations
(test_session_orderings.py, test_fabric_orderings.py) keep only what is theirs: requests and
ids both ways, lists, input waits, the suite lock, and how each endpoint acts on the rules.

From a fresh backend, every step a machine can take with it is tried in every reachable state —
each step of the state table (those it lacks must be refused and change nothing), lines of the
client's and of the machine's own sent to its stdin, the driver reporting some of them written,
time passing, requests sent (calls, ping, the handshake), its memory asked for and reported
(under, over, unreadable), a call's retry awaited — under a ``smart_refresh`` and a
``fresh_per_call`` lifecycle. After every step:

- the state moved only along the table, STOPPED is final, and ``ready`` is READY;
- the stdin book counts exactly the lines sent and not reported written, the machine's own
  among them; an own message is refused only when it would leave more than the bound unread
  (and then nothing is counted), accepted otherwise;
- a backend with bytes pending always has a stall deadline, one without none, and it is stalled
  exactly from that deadline on; a report of bytes written restarts its clock;
- once spent a backend stays spent (calls, age and memory only grow; ``used`` stays), memory is
  never asked twice at once nor again without a call since, and over its threshold it stays so;
- a clone is equal and independent (explored states are clones).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Self

import pytest

from reactor_fabric.protocol.backend import (
    TRANSITIONS,
    Backend,
    BackendState,
    BackendStateError,
    Step,
    measure_due,
    measured,
    spent,
    start_measuring,
)
from reactor_fabric.protocol.events import BackendKey, ToBackend
from reactor_fabric.protocol.lifecycle import Lifecycle
from tests.orderings import Violation, check, explore

KEY = BackendKey("svc", 1)
STALL = 10.0
OWN_BOUND = 50
THRESHOLD = 1000
MAX_LINES = 2  # lines pending at once (the world's bound, not the model's)
MAX_CALLS = 2
MAX_TIME = 3 * STALL / 2  # time passes in half stall timeouts, this far
SMART = Lifecycle("smart_refresh", max_calls=2, max_age=STALL, memory_threshold=THRESHOLD)
PER_CALL = Lifecycle("fresh_per_call")


@dataclass
class World:
    backend: Backend
    lifecycle: Lifecycle
    now: float = 0.0
    # The lines sent and not reported written, as the world saw them go: (size, own).
    sent: tuple[tuple[int, bool], ...] = ()
    requests: int = 0

    def clone(self) -> Self:
        return dataclasses.replace(self, backend=self.backend.clone())

    def key(self) -> tuple[object, ...]:
        return (self.backend.fingerprint(), self.now, self.sent, self.requests)


Step_ = tuple[str, object]


def steps(world: World) -> list[tuple[str, Step_]]:
    backend = world.backend
    found: list[tuple[str, Step_]] = [(f"advance {s.value}", ("advance", s)) for s in Step]
    if backend.state is BackendState.STOPPED:
        return found  # (every step refused: nothing more happens to it)
    if len(world.sent) < MAX_LINES:
        found.append(("client line 9", ("send", 9)))
        found += [("own line 29", ("own", 29)), ("own line 59", ("own", 59))]
    for count in range(1, len(world.sent) + 1):
        found.append((f"{count} written", ("written", count)))
    if world.now + STALL / 2 <= MAX_TIME:
        found.append(("time passes", ("time", STALL / 2)))
    if world.requests < MAX_CALLS:
        found += [(f"sent {m}", ("request", m)) for m in ("tools/call", "ping")]
    if measure_due(backend, world.lifecycle):
        found.append(("memory asked", ("measure", None)))
    if backend.measuring:
        found += [(f"memory {m}", ("measured", m)) for m in (None, THRESHOLD, THRESHOLD + 1)]
    if backend.retry_until is None:
        found.append(("retry awaited", ("retry", None)))
    return found


def take(world: World, step: Step_, trail: list[str]) -> None:
    backend = world.backend
    was_spent = spent(backend, world.lifecycle, world.now)
    was_over, was_used = backend.over_memory, backend.used
    kind, value = step
    if kind == "advance":
        assert isinstance(value, Step)
        before = backend.fingerprint()
        after = TRANSITIONS.get((backend.state, value))
        if after is None:
            with pytest.raises(BackendStateError):
                backend.advance(value)
            check(backend.fingerprint() == before, "a refused step changed the backend", trail)
        else:
            check(backend.advance(value) is after, "advance did not return the state", trail)
    elif kind == "send":
        assert isinstance(value, int)
        line = backend.send(b"x" * value, world.now)
        check(line == ToBackend(KEY, b"x" * value + b"\n"), "a line is the data and \\n", trail)
        world.sent += ((value + 1, False),)
    elif kind == "own":
        assert isinstance(value, int)
        own_before = sum(size for size, own in world.sent if own)
        own_line = backend.send_own(b"x" * value, world.now, OWN_BOUND)
        refused = own_before > 0 and own_before + value + 1 > OWN_BOUND
        check((own_line is None) == refused, "an own line refused other than past the bound", trail)
        if own_line is not None:
            world.sent += ((value + 1, True),)
    elif kind == "written":
        assert isinstance(value, int)
        done, world.sent = world.sent[:value], world.sent[value:]
        backend.stdin.written(sum(size for size, _own in done), world.now)
        check(backend.stdin.progress == world.now, "a report did not restart the clock", trail)
    elif kind == "time":
        assert isinstance(value, float)
        world.now += value
    elif kind == "request":
        assert isinstance(value, str)
        calls = backend.calls
        backend.sent_request(value)
        world.requests += 1
        check(backend.calls == calls + (value == "tools/call"), "calls miscounted", trail)
        check(backend.retry_until is None, "a request left a retry awaited", trail)
    elif kind == "measure":
        start_measuring(backend)
        check(not measure_due(backend, world.lifecycle), "memory asked twice at once", trail)
    elif kind == "measured":
        assert value is None or isinstance(value, int)
        over = measured(backend, world.lifecycle, value)
        verdict = was_over or (value is not None and value > THRESHOLD)
        check(over == verdict, "a memory figure changed the threshold's verdict", trail)
    elif kind == "retry":
        backend.retry_until = world.now + STALL
    invariants(world, trail, was_spent=was_spent, was_over=was_over, was_used=was_used)


def invariants(
    world: World, trail: list[str], *, was_spent: str | None, was_over: bool, was_used: bool
) -> None:
    backend, book, now = world.backend, world.backend.stdin, world.now
    check(backend.ready == (backend.state is BackendState.READY), "ready is not READY", trail)
    check(book.pending == sum(size for size, _own in world.sent), "pending miscounted", trail)
    check(book.own == sum(size for size, own in world.sent if own), "own miscounted", trail)
    check(list(book.lines) == list(world.sent), "the lines pending are not those sent", trail)
    deadline = book.stall_deadline(STALL)
    check((deadline is None) == (book.pending == 0), "pending bytes without a deadline", trail)
    check(
        book.stalled(now, STALL) == (deadline is not None and now >= deadline),
        "stalled other than from its deadline on",
        trail,
    )
    if was_spent is not None:
        check(spent(backend, world.lifecycle, now) is not None, "a spent backend revived", trail)
    check(not was_over or backend.over_memory, "over its threshold, then not", trail)
    check(not was_used or backend.used, "used, then not", trail)
    check(backend.measured_calls <= backend.calls, "measured more calls than it had", trail)
    twin = backend.clone()
    check(twin.fingerprint() == backend.fingerprint(), "a clone differs", trail)
    twin.stdin.sent(1, now)
    check(book.pending == sum(size for size, _own in world.sent), "a clone shares", trail)


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("lifecycle", "at_least"),
    [(SMART, 16_000), (PER_CALL, 8_000)],
    ids=["smart_refresh", "fresh_per_call"],
)
def test_every_reachable_state_of_a_backend_keeps_the_models_invariants(
    lifecycle: Lifecycle, at_least: int
) -> None:
    started = World(Backend(KEY, started_at=0.0), lifecycle)
    states = explore(started, steps, take, max_states=200_000)
    assert states >= at_least


def test_the_checker_catches_a_book_that_forgets_the_machines_own_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The invariants must be able to fail: break the model, and exploring finds it.
    def forgetful(self: Backend, data: bytes, now: float, own_bound: int) -> ToBackend | None:
        line = data + b"\n"
        if self.stdin.overflows_own(len(line), own_bound):
            return None
        self.stdin.sent(len(line), now)  # (not counted as its own)
        return ToBackend(self.key, line)

    monkeypatch.setattr(Backend, "send_own", forgetful)
    with pytest.raises(Violation, match="own miscounted"):
        explore(World(Backend(KEY, started_at=0.0), SMART), steps, take)


def test_the_checker_catches_a_memory_figure_that_clears_an_over_threshold_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def amnesic(backend: Backend, lifecycle: Lifecycle, memory_bytes: int | None) -> bool:
        backend.measuring = False
        backend.over_memory = memory_bytes is not None and memory_bytes > THRESHOLD
        return backend.over_memory

    monkeypatch.setattr(f"{__name__}.measured", amnesic)
    with pytest.raises(Violation, match="the threshold's verdict"):
        explore(World(Backend(KEY, started_at=0.0), SMART), steps, take)
