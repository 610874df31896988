"""The one backend model (reactor_fabric/protocol/backend.py): its state table, its stdin
accounting and the rule for a backend that stopped reading, and the lifecycle rules both
endpoints' machines decide with."""

from __future__ import annotations

import itertools

import pytest

from reactor_fabric.protocol.backend import (
    TRANSITIONS,
    Backend,
    BackendState,
    BackendStateError,
    Role,
    StdinBook,
    Step,
    age_deadline,
    measure_due,
    measured,
    spent,
    start_measuring,
)
from reactor_fabric.protocol.events import BackendKey
from reactor_fabric.protocol.lifecycle import Lifecycle

KEY = BackendKey("time", 1)
SMART = Lifecycle("smart_refresh", max_calls=3, max_age=60.0, memory_threshold=1000)


def reachable() -> dict[BackendState, list[tuple[Step, ...]]]:
    """Every state a backend reaches from STARTING, with the paths that reach it."""
    paths: dict[BackendState, list[tuple[Step, ...]]] = {}
    frontier: list[tuple[Step, ...]] = [()]
    while frontier:
        path = frontier.pop()
        backend = Backend(KEY)
        for step in path:
            backend.advance(step)
        paths.setdefault(backend.state, []).append(path)
        frontier += [(*path, step) for step in Step if (backend.state, step) in TRANSITIONS]
    return paths


def test_every_state_is_reachable_and_every_path_ends_stopped() -> None:
    paths = reachable()
    assert set(paths) == set(BackendState)
    # STOPPED is the only end: from every other state some step leads on.
    for state in BackendState:
        leads_on = any((state, step) in TRANSITIONS for step in Step)
        assert leads_on == (state is not BackendState.STOPPED)


def test_a_backend_is_ready_only_after_its_handshake_or_a_start_with_nothing_to_greet() -> None:
    for path in reachable()[BackendState.READY]:
        assert path in ((Step.STARTED, Step.GREETED), (Step.STARTED_GREETED,))


@pytest.mark.parametrize(("state", "step"), list(itertools.product(BackendState, Step)))
def test_a_step_the_table_lacks_is_refused_and_changes_nothing(
    state: BackendState, step: Step
) -> None:
    backend = Backend(KEY, state=state)
    if (state, step) in TRANSITIONS:
        assert backend.advance(step) is TRANSITIONS[(state, step)]
        return
    with pytest.raises(BackendStateError, match=step.value):
        backend.advance(step)
    assert backend.state is state


def test_a_stopped_backend_cannot_be_stopped_again() -> None:
    backend = Backend(KEY)
    backend.advance(Step.STOPPED)
    with pytest.raises(BackendStateError):
        backend.advance(Step.STOPPED)


# --- stdin ----------------------------------------------------------------------------------


def test_lines_are_counted_until_their_bytes_are_reported_written_oldest_first() -> None:
    book = StdinBook()
    book.sent(10, now=1.0)
    book.sent(20, now=2.0, own=True)
    book.sent(30, now=3.0)
    assert (book.pending, book.own) == (60, 20)
    book.written(30, now=4.0)  # the first two lines (the driver joins queued lines)
    assert (book.pending, book.own) == (30, 0)
    book.written(30, now=5.0)
    assert (book.pending, book.own, list(book.lines)) == (0, 0, [])


def test_a_line_reported_written_in_parts_stays_pending_until_its_last_byte() -> None:
    # The driver writes what the kernel takes at once and leaves the rest to its writer task.
    book = StdinBook()
    book.sent(100, now=1.0, own=True)
    book.sent(50, now=1.0)
    book.written(40, now=2.0)
    assert (book.pending, book.own, list(book.lines)) == (110, 60, [(60, True), (50, False)])
    book.written(60, now=3.0)  # the rest of the first line: the second one is untouched
    assert (book.pending, book.own, list(book.lines)) == (50, 0, [(50, False)])
    book.written(10, now=4.0)
    book.written(40, now=5.0)
    assert (book.pending, book.own, list(book.lines)) == (0, 0, [])
    assert book.stall_deadline(120.0) is None


def test_the_stall_clock_starts_at_the_first_byte_pending_and_restarts_when_bytes_move() -> None:
    book = StdinBook()
    assert book.stall_deadline(120.0) is None  # nothing pending: nothing can stall
    book.sent(10, now=5.0)
    book.sent(10, now=50.0)  # more pending: the clock runs from the first
    assert book.stall_deadline(120.0) == 125.0
    assert not book.stalled(124.9, 120.0)
    assert book.stalled(125.0, 120.0)
    book.written(10, now=100.0)  # moved: from now
    assert book.stall_deadline(120.0) == 220.0
    book.written(10, now=110.0)
    assert book.stall_deadline(120.0) is None
    assert not book.stalled(10_000.0, 120.0)


def test_own_messages_past_the_bound_mean_the_backend_stopped_reading() -> None:
    book = StdinBook()
    book.sent(5000, now=0.0)  # a client's large message: not the machine's own
    assert not book.overflows_own(600, own_bound=1000)
    book.sent(600, now=0.0, own=True)
    assert not book.overflows_own(400, own_bound=1000)  # exactly the bound: still within
    assert book.overflows_own(401, own_bound=1000)
    # One own message alone may exceed the bound (as a client's may).
    assert not StdinBook().overflows_own(5000, own_bound=1000)


def test_a_clone_shares_nothing_and_the_fingerprint_ignores_when_an_empty_book_last_moved() -> None:
    backend = Backend(KEY)
    backend.stdin.sent(10, now=1.0)
    twin = backend.clone()
    twin.stdin.written(10, now=2.0)
    assert (backend.stdin.pending, twin.stdin.pending) == (10, 0)
    assert backend.fingerprint() != twin.fingerprint()
    other = Backend(KEY)
    other.stdin.sent(10, now=7.0)
    other.stdin.written(10, now=8.0)
    assert other.fingerprint() == twin.fingerprint()


# --- lifecycle rules --------------------------------------------------------------------------


def test_a_per_call_backend_is_spent_once_it_served_a_request_beyond_the_handshake() -> None:
    per_call = Lifecycle("fresh_per_call")
    backend = Backend(KEY, state=BackendState.READY, started_at=0.0)
    assert spent(backend, per_call, now=1e9) is None
    backend.used = True
    assert spent(backend, per_call, now=0.0) == "call_done"


def test_a_smart_refresh_backend_is_spent_at_its_calls_its_age_or_over_its_memory() -> None:
    backend = Backend(KEY, state=BackendState.READY, started_at=10.0)
    assert spent(backend, SMART, now=69.9) is None
    assert spent(backend, SMART, now=70.0) == "refresh_age"
    backend.calls = 3
    assert spent(backend, SMART, now=0.0) == "refresh_calls"
    backend.calls = 0
    backend.over_memory = True
    assert spent(backend, SMART, now=0.0) == "refresh_memory"
    assert spent(backend, Lifecycle(), now=1e9) is None  # reuse_per_session: never


def test_memory_is_read_once_after_each_call_and_over_the_threshold_for_good() -> None:
    backend = Backend(KEY, state=BackendState.READY, started_at=0.0)
    assert not measure_due(backend, SMART)  # no call yet
    backend.calls = 1
    assert measure_due(backend, SMART)
    assert not measure_due(backend, Lifecycle("smart_refresh", max_calls=3))  # no threshold
    start_measuring(backend)
    assert not measure_due(backend, SMART)  # asked already
    assert measured(backend, SMART, None) is False  # unknown: nothing decided on it
    assert not measure_due(backend, SMART)  # once per call
    backend.calls = 2
    start_measuring(backend)
    assert measured(backend, SMART, 1001) is True
    backend.calls = 3
    start_measuring(backend)
    assert measured(backend, SMART, 10) is True


def test_only_a_started_smart_refresh_backend_with_a_max_age_has_an_age_deadline() -> None:
    backend = Backend(KEY, role=Role.CURRENT)
    assert age_deadline(backend, SMART) is None  # not started
    backend.started_at = 5.0
    assert age_deadline(backend, SMART) == 65.0
    assert age_deadline(backend, Lifecycle("smart_refresh", max_calls=2)) is None
    assert age_deadline(backend, Lifecycle("fresh_per_call")) is None
