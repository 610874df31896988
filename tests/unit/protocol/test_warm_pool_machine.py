"""The warm pool's decisions (pure): refills within bounds, takes, back-off, shapes, early
output, mounts, image checks, stop — one event at a time."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from typing import Any

import pytest

from reactor_fabric.protocol.settings import Pooling
from reactor_fabric.protocol.warm_pool import IMAGE_CHECK_SECONDS, WarmPoolMachine
from reactor_fabric.protocol.warm_pool_entries import (
    BACKOFF_MAX_SECONDS,
    PER_CALL_CEILING,
    RATE_WINDOW_SECONDS,
)
from reactor_fabric.protocol.warm_pool_events import (
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
from reactor_fabric.protocol.warm_pool_health import EARLY_STDOUT_BYTES, HEALTHY_SECONDS

NOBODY = "65534:65534"
USER = "1000:1000"


def machine(
    targets: dict[str, int] | None = None,
    *,
    max_containers: int = 16,
    parallel: int = 2,
    fixed_shape: tuple[str, ...] = (),
    stages_mounts: bool = False,
    greets: tuple[str, ...] = (),
    per_call: tuple[str, ...] = (),
    hold: float = 0.0,
) -> WarmPoolMachine:
    pooling = Pooling(
        targets if targets is not None else {"time": 2},
        max_containers=max_containers,
        parallel_starts=parallel,
        fixed_shape=frozenset(fixed_shape),
        greets=frozenset(greets),
        per_call=frozenset(per_call),
        refill_hold_seconds=hold,
    )
    return WarmPoolMachine(pooling, initial_shape=NOBODY, stages_mounts=stages_mounts)


def feed(pool: WarmPoolMachine, event: Event, now: float = 0.0) -> list[Action]:
    """``event`` at ``now``, an image check it asks for answered at once (image not known)."""
    actions = pool.handle(event, now)
    if any(isinstance(a, CheckImages) for a in actions):
        actions = [a for a in actions if not isinstance(a, CheckImages)]
        actions += pool.handle(ImagesChecked(), now)
    return actions


def started(actions: list[Action]) -> list[int]:
    return [a.token for a in actions if isinstance(a, StartPooled)]


def starts(pool: WarmPoolMachine, now: float) -> list[StartPooled]:
    return [a for a in feed(pool, Tick(), now) if isinstance(a, StartPooled)]


def next_start(pool: WarmPoolMachine) -> tuple[float, StartPooled]:
    """Ticks at the machine's deadlines until it starts one: when, and which."""
    while True:
        deadline = pool.deadline
        assert deadline is not None
        actions = starts(pool, deadline)
        if actions:
            (action,) = actions
            return deadline, action


def removals(actions: list[Action]) -> list[RemovePooled]:
    return [a for a in actions if isinstance(a, RemovePooled)]


def fill(pool: WarmPoolMachine, now: float = 0.0) -> list[StartPooled]:
    """Start and complete starts until the pool asks for no more."""
    done: list[StartPooled] = []
    pending = starts(pool, now)
    while pending:
        action = pending.pop(0)
        actions = feed(pool, StartSucceeded(action.token), now)
        assert removals(actions) == []
        done.append(action)
        pending += [a for a in actions if isinstance(a, StartPooled)]
    return done


def take(
    pool: WarmPoolMachine, service: str, shape: Hashable, now: float = 0.0, **mounts: bool
) -> tuple[int | None, str, list[RemovePooled]]:
    """A session's take, its claim watched at once: (token handed out, outcome, removals)."""
    actions = feed(pool, Take(service, shape, **mounts), now)
    claims = [a for a in actions if isinstance(a, Claim)]
    if not claims:
        (missed,) = [a for a in actions if isinstance(a, Missed)]
        return None, missed.outcome, removals(actions)
    (claim,) = claims
    handed = feed(pool, Watched(claim.token), now)
    if any(isinstance(a, HandOut) for a in handed):
        return claim.token, "hit", removals(actions)
    return None, "hit", removals(actions + handed)


def test_a_service_without_warm_keeps_no_pool_and_its_sessions_are_not_pooled() -> None:
    pool = machine({"time": 0, "git": 1})
    assert pool.services == {"git"}
    assert take(pool, "time", NOBODY)[1] == "not_pooled"


def test_refills_start_at_most_parallel_starts_at_once() -> None:
    pool = machine({"time": 5}, parallel=2)
    first = starts(pool, 0.0)
    assert [a.service for a in first] == ["time", "time"]
    assert starts(pool, 0.0) == []  # two in flight: no more until one ends
    assert len(started(feed(pool, StartSucceeded(first[0].token)))) == 1


def test_the_global_cap_bounds_starting_and_ready_containers_together() -> None:
    pool = machine({"time": 3, "git": 3}, max_containers=4, parallel=8)
    actions = starts(pool, 0.0)
    assert len(actions) == 4
    assert pool.total == 4
    for action in actions:
        assert started(feed(pool, StartSucceeded(action.token))) == []
    assert starts(pool, 0.0) == []


def test_rationed_starts_go_to_the_service_with_fewest_pooled_first() -> None:
    pool = machine({"time": 2, "git": 2, "filesystem": 2}, parallel=3)
    assert sorted(a.service for a in starts(pool, 0.0)) == ["filesystem", "git", "time"]


def test_a_take_hands_out_the_oldest_ready_container_once_and_the_pool_refills() -> None:
    pool = machine({"time": 2})
    done = fill(pool)
    actions = feed(pool, Take("time", NOBODY))
    assert actions[0] == Claim(done[0].token, "time")
    (refill,) = [a for a in actions if isinstance(a, StartPooled)]  # at once
    assert refill.token not in {a.token for a in done}  # never reused
    assert pool.ready("time") == 1
    assert feed(pool, Watched(done[0].token)) == [HandOut(done[0].token, "time")]
    assert take(pool, "time", NOBODY)[0] == done[1].token
    with pytest.raises(ValueError, match="not claimed"):
        feed(pool, Watched(done[0].token))


def test_after_a_hand_out_refills_wait_the_hold_then_start_at_its_end() -> None:
    pool = machine({"time": 2, "git": 1}, hold=0.5, parallel=4)
    fill(pool)
    actions = feed(pool, Take("time", NOBODY), now=10.0)
    assert [a for a in actions if isinstance(a, Claim)]
    assert started(actions) == []  # held: the session's first calls have the CPU
    assert pool.deadline == 10.5
    assert starts(pool, 10.2) == []
    (refill,) = starts(pool, 10.5)
    assert refill.service == "time"
    assert pool.deadline is None or pool.deadline > 10.5


def test_a_hold_holds_every_services_refills_and_a_take_during_it_does_not_extend_it() -> None:
    pool = machine({"time": 1, "git": 1}, hold=0.5, parallel=4)
    fill(pool)
    take(pool, "time", NOBODY, now=1.0)
    assert started(feed(pool, Take("git", NOBODY), now=1.4)) == []  # (claimed during the hold)
    assert pool.deadline == 1.5  # not 1.9: refills wait at most the hold
    assert sorted(a.service for a in starts(pool, 1.5)) == ["git", "time"]


def test_a_miss_holds_nothing() -> None:
    pool = machine({"time": 1}, hold=0.5)
    (first,) = starts(pool, 0.0)
    # (Still starting: the take misses, and the session starts its own container.)
    assert take(pool, "time", NOBODY, now=0.1)[1] == "empty"
    feed(pool, StartSucceeded(first.token), now=0.2)
    take(pool, "time", NOBODY, now=0.3)
    assert pool.deadline == 0.8
    assert take(pool, "other", NOBODY, now=0.4)[1] == "not_pooled"
    assert pool.deadline == 0.8


def test_without_a_hold_the_refill_of_a_hand_out_starts_at_once() -> None:
    pool = machine({"time": 1}, hold=0.0)
    fill(pool)
    assert len(started(feed(pool, Take("time", NOBODY), now=5.0))) == 1


def test_a_container_still_starting_is_not_handed_out() -> None:
    pool = machine({"time": 1})
    starts(pool, 0.0)
    assert take(pool, "time", NOBODY)[1] == "empty"


def test_a_miss_for_another_shape_retires_the_oldest_ready_one_and_refills_in_that_shape() -> None:
    pool = machine({"git": 2})
    done = fill(pool)
    actions = feed(pool, Take("git", USER))
    assert actions[:2] == [
        Missed("git", "shape"),
        RemovePooled(done[0].token, "git", "shape_changed"),
    ]
    (refill,) = [a for a in actions if isinstance(a, StartPooled)]
    assert refill.shape == USER
    feed(pool, StartSucceeded(refill.token))
    assert take(pool, "git", USER)[0] == refill.token
    # The container of the old shape is still there for a session that wants it.
    assert take(pool, "git", NOBODY)[0] == done[1].token


def test_a_service_whose_suite_names_the_user_has_one_shape_whatever_the_sessions_account() -> None:
    pool = machine({"git": 2}, fixed_shape=("git",))
    done = fill(pool)
    assert {a.shape for a in done} == {None}
    assert take(pool, "git", USER)[0] == done[0].token
    assert take(pool, "git", NOBODY)[0] == done[1].token


def test_a_failed_start_backs_off_doubling_up_to_a_minute_and_success_resets_it() -> None:
    pool = machine({"time": 1})
    now = 100.0
    (action,) = starts(pool, now)
    delays = []
    for _ in range(9):
        assert started(feed(pool, StartFailed(action.token), now)) == []  # held back
        retry, action = next_start(pool)
        delays.append(retry - now)
        now = retry
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert delays[-1] == BACKOFF_MAX_SECONDS
    feed(pool, StartSucceeded(action.token), now)
    (refill,) = started(feed(pool, Take("time", NOBODY), now))  # no back-off after a success
    feed(pool, StartFailed(refill), now)
    assert next_start(pool)[0] == now + 1.0


def test_a_start_that_failed_after_its_container_was_created_has_it_removed() -> None:
    pool = machine({"time": 1})
    (action,) = starts(pool, 0.0)
    assert feed(pool, StartFailed(action.token, created=True)) == [
        RemovePooled(action.token, "time", "start_failed")
    ]


def test_back_off_of_one_service_does_not_hold_back_another() -> None:
    pool = machine({"time": 1, "git": 1}, parallel=1)
    (first,) = starts(pool, 0.0)
    (second,) = started(feed(pool, StartFailed(first.token)))
    assert pool.starting == 1
    assert second != first.token


def test_a_ready_container_that_ends_soon_is_removed_and_counts_as_a_failure() -> None:
    pool = machine({"time": 1})
    (action,) = fill(pool)
    assert feed(pool, OutputEnded(action.token, "exited"), 5.0) == [
        RemovePooled(action.token, "time", "exited")
    ]
    assert pool.pooled("time") == 0
    assert pool.deadline == 6.0
    assert feed(pool, OutputEnded(action.token, "exited"), 5.5) == []  # reported twice
    assert len(starts(pool, 6.0)) == 1


def test_a_server_that_exits_right_after_every_start_backs_off_though_each_start_succeeds() -> None:
    pool = machine({"time": 1})
    now = 0.0
    (action,) = starts(pool, now)
    for expected in (1.0, 2.0, 4.0, 8.0):
        assert feed(pool, StartSucceeded(action.token), now) == []
        feed(pool, OutputEnded(action.token, "exited"), now + 0.1)
        retry, action = next_start(pool)
        assert retry == now + 0.1 + expected
        now = retry


def test_a_container_that_ran_a_while_before_it_ended_resets_the_back_off() -> None:
    pool = machine({"time": 1})
    (action,) = starts(pool, 0.0)
    feed(pool, StartFailed(action.token), 0.0)
    (action,) = starts(pool, 1.0)
    feed(pool, StartSucceeded(action.token), 1.0)
    assert len(started(feed(pool, OutputEnded(action.token, "exited"), 1.0 + HEALTHY_SECONDS))) == 1


def test_output_before_any_input_is_kept_up_to_its_bound_and_past_it_the_container_goes() -> None:
    pool = machine({"time": 1})
    (action,) = fill(pool)
    assert feed(pool, EarlyOutput(action.token, EARLY_STDOUT_BYTES)) == []
    assert feed(pool, EarlyOutput(action.token, 1))[0] == RemovePooled(
        action.token, "time", "output_before_input"
    )
    (action,) = starts(pool, 10.0)
    feed(pool, StartSucceeded(action.token), 10.0)
    assert feed(pool, OutputEnded(action.token, "output_invalid"), 10.0)[0] == RemovePooled(
        action.token, "time", "output_invalid"
    )


@pytest.mark.parametrize(
    "late",
    [
        lambda token: OutputEnded(token, "exited"),
        lambda token: OutputEnded(token, "output_invalid"),
        lambda token: EarlyOutput(token, EARLY_STDOUT_BYTES + 1),
    ],
    ids=["exited", "invalid", "too-much"],
)
def test_a_claimed_container_whose_output_ended_before_its_watch_stopped_is_not_handed_out(
    late: Callable[[int], Event],
) -> None:
    pool = machine({"time": 1})
    fill(pool)
    (claim,) = [a for a in feed(pool, Take("time", NOBODY)) if isinstance(a, Claim)]
    assert removals(feed(pool, late(claim.token), 1.0)) == []  # not the pool's any more
    assert feed(pool, Watched(claim.token), 1.0) == [
        RemovePooled(claim.token, "time", "not_handed_out")
    ]
    assert pool.deadline == IMAGE_CHECK_SECONDS  # no back-off: only the next image check


def test_mounts_get_a_pooled_container_only_through_the_staging_area_and_where_it_places_them() -> (
    None
):
    pool = machine({"git": 3}, stages_mounts=True)
    done = fill(pool)
    assert all(a.staged for a in done)
    assert take(pool, "git", NOBODY, mounts=True, placeable=False)[1] == "mounts"
    assert take(pool, "git", NOBODY, mounts=True, placeable=True)[0] == done[0].token
    feed(pool, StagingLost())
    assert take(pool, "git", NOBODY, mounts=True, placeable=True)[1] == "mounts"
    assert take(pool, "git", NOBODY)[0] == done[1].token  # without mounts: as before
    assert not any(a.staged for a in starts(pool, 0.0))
    unstaged = machine({"git": 1})
    fill(unstaged)
    assert take(unstaged, "git", NOBODY, mounts=True, placeable=True)[1] == "mounts"


def test_images_are_checked_at_a_deadline_of_their_own_a_rebuilt_one_retires_old_ones() -> None:
    pool = machine({"time": 2}, parallel=1)
    first = pool.handle(Tick(), 0.0)
    assert first[0] == CheckImages(("time",))  # at once, beside the first start
    (ready,) = [a for a in first if isinstance(a, StartPooled)]
    checking = pool.deadline
    assert checking is None  # the check runs: the next one is due after its answer
    assert pool.handle(ImagesChecked((("time", "sha256:a"),)), 1.0) == []
    assert pool.deadline == 1.0 + IMAGE_CHECK_SECONDS
    (starting,) = started(pool.handle(StartSucceeded(ready.token), 1.0))
    assert pool.handle(Tick(), 20.0) == []  # nothing due yet
    assert pool.handle(Tick(), 31.0) == [CheckImages(("time",))]
    assert pool.handle(ImagesChecked((("time", "sha256:a"),)), 32.0) == []  # unchanged
    assert pool.handle(Tick(), 62.0) == [CheckImages(("time",))]
    changed = pool.handle(ImagesChecked((("time", "sha256:b"), ("gone", "x"))), 63.0)
    assert changed == [ImageChanged("time"), RemovePooled(ready.token, "time", "image_changed")]
    # The one starting meanwhile runs the old image too: removed as it starts, replaced.
    actions = pool.handle(StartSucceeded(starting), 63.0)
    assert removals(actions) == [RemovePooled(starting, "time", "image_changed")]
    assert len(started(actions)) == 1
    pool.handle(Tick(), 93.0)
    assert pool.handle(ImagesChecked((("time", None),)), 93.0) == []  # not known: kept


def test_stop_retires_every_ready_container_takes_nothing_and_starts_nothing() -> None:
    pool = machine({"time": 2, "git": 1}, parallel=3)
    actions = starts(pool, 0.0)
    feed(pool, StartSucceeded(actions[0].token))
    feed(pool, StartSucceeded(actions[1].token))
    retired = feed(pool, Shutdown())
    assert all(isinstance(r, RemovePooled) for r in retired)
    assert {r.token for r in removals(retired)} == {actions[0].token, actions[1].token}
    assert {r.reason for r in removals(retired)} == {"stopping"}
    assert take(pool, "time", NOBODY)[1] == "stopping"
    assert starts(pool, 100.0) == []
    assert pool.deadline is None
    assert feed(pool, StartSucceeded(actions[2].token)) == [
        RemovePooled(actions[2].token, actions[2].service, "stopping")
    ]
    assert pool.total == 0


def test_reporting_the_end_of_a_start_that_is_not_running_is_a_bug() -> None:
    pool = machine({"time": 1})
    (action,) = fill(pool)
    with pytest.raises(ValueError, match="not starting"):
        feed(pool, StartSucceeded(action.token))
    with pytest.raises(ValueError, match="not starting"):
        feed(pool, StartFailed(99))


def greeting_pool(
    targets: dict[str, int], now: float = 0.0, **options: Any
) -> tuple[WarmPoolMachine, list[StartPooled]]:
    """A pool whose ``time`` greets, after a fabric endpoint's take asked for greeted ones
    (before any start): the starts that take made."""
    pool = machine(targets, greets=("time",), **options)
    actions = feed(pool, Take("time", NOBODY, greeted=True), now)
    assert Missed("time", "empty") in actions
    return pool, [a for a in actions if isinstance(a, StartPooled)]


def test_a_per_call_services_pooled_container_is_greeted_before_it_is_ready() -> None:
    pool, (first,) = greeting_pool({"time": 2}, parallel=1)
    assert feed(pool, StartSucceeded(first.token)) == [GreetPooled(first.token, "time")]
    # Greeting is part of its start: not ready, and no other start meanwhile.
    assert pool.ready("time") == 0
    assert pool.starting == 1
    assert take(pool, "time", NOBODY, greeted=True)[1] == "empty"
    (second,) = started(feed(pool, PooledGreeted(first.token)))
    assert pool.ready("time") == 1
    assert second != first.token


def test_greeting_follows_demand_and_a_greeted_container_never_goes_to_a_relay_session() -> None:
    pool = machine({"time": 1, "git": 1}, parallel=4, greets=("time",))
    # At first (and after a relay session's take) refills are not greeted: either endpoint
    # may take them; a fabric session's take does the handshake itself.
    for action in starts(pool, 0.0):
        assert feed(pool, StartSucceeded(action.token)) == []
    actions = feed(pool, Take("time", NOBODY, greeted=True))
    (claim,) = [a for a in actions if isinstance(a, Claim)]
    assert feed(pool, Watched(claim.token)) == [HandOut(claim.token, "time")]
    # Its refill is greeted: the fabric endpoint took the last one.
    (refill,) = started(actions)
    assert feed(pool, StartSucceeded(refill)) == [GreetPooled(refill, "time")]
    feed(pool, PooledGreeted(refill))
    # A relay session replays its client's initialize: it misses, and the greeted one goes.
    actions = feed(pool, Take("time", NOBODY))
    assert actions[:2] == [
        Missed("time", "greeted"),
        RemovePooled(refill, "time", "shape_changed"),
    ]
    (plain,) = started(actions)
    assert feed(pool, StartSucceeded(plain)) == []  # refills follow the relay now
    assert take(pool, "time", NOBODY)[0] == plain
    # A service that does not greet never does.
    actions = feed(pool, Take("git", NOBODY, greeted=True))
    (claim,) = [a for a in actions if isinstance(a, Claim)]
    (git,) = started(actions)
    assert feed(pool, StartSucceeded(git)) == []


def test_a_fabric_session_takes_a_greeted_container_before_an_older_plain_one() -> None:
    pool = machine({"time": 2}, greets=("time",))
    first, _second = fill(pool)  # not greeted (no fabric take yet)
    actions = feed(pool, Take("time", NOBODY, greeted=True))
    assert Claim(first.token, "time") in actions
    feed(pool, Watched(first.token))
    (greeted,) = started(actions)
    feed(pool, StartSucceeded(greeted))
    feed(pool, PooledGreeted(greeted))
    # The greeted one, younger than the plain one left: no handshake at the call.
    assert take(pool, "time", NOBODY, greeted=True)[0] == greeted


def test_a_container_that_fails_its_greeting_is_removed_and_replaced_after_a_back_off() -> None:
    pool, (action,) = greeting_pool({"time": 1}, 10.0)
    feed(pool, StartSucceeded(action.token), 10.0)
    actions = feed(pool, PooledGreetingFailed(action.token, "greeting_invalid"), 10.0)
    assert removals(actions) == [RemovePooled(action.token, "time", "greeting_failed")]
    assert removals(actions)[0].ended  # logged with its last stderr lines
    assert started(actions) == []  # not at once: at the pool's refill rate
    assert pool.starting == 0
    assert pool.pooled("time") == 0
    when, replacement = next_start(pool)
    assert when == 11.0
    assert replacement.token != action.token


def test_a_container_greeted_after_the_stop_is_removed_not_ready() -> None:
    pool, (action,) = greeting_pool({"time": 1})
    feed(pool, StartSucceeded(action.token))
    assert feed(pool, Shutdown()) == []  # greeting: removed when it ends
    actions = feed(pool, PooledGreeted(action.token))
    assert removals(actions) == [RemovePooled(action.token, "time", "stopping")]
    assert pool.total == 0
    assert pool.starting == 0


# --- refills at the rate of consumption (per-call services) ---------------------------------


def drain(pool: WarmPoolMachine, pending: list[StartPooled], now: float) -> tuple[int, int]:
    """Complete starts one at a time, oldest first, until none is left: how many completed,
    and the most that were starting at once meanwhile."""
    done, most = 0, pool.starting
    while pending:
        action = pending.pop(0)
        actions = feed(pool, StartSucceeded(action.token), now)
        pending += [a for a in actions if isinstance(a, StartPooled)]
        done += 1
        most = max(most, pool.starting)
    return done, most


def burst(pool: WarmPoolMachine, service: str, calls: int, now: float) -> list[StartPooled]:
    """``calls`` takes at ``now`` (a session each, greeted or not alike): the starts asked."""
    starts: list[StartPooled] = []
    for _ in range(calls):
        actions = feed(pool, Take(service, NOBODY), now)
        for claim in [a for a in actions if isinstance(a, Claim)]:
            actions += feed(pool, Watched(claim.token), now)
        starts += [a for a in actions if isinstance(a, StartPooled)]
        assert pool.starting <= pool.refills.parallel_starts  # the refill bound, at every take
    return starts


def test_a_per_call_services_pool_grows_to_its_calls_in_the_window_within_parallel_starts() -> None:
    pool = machine({"agent": 2}, parallel=2, per_call=("agent",))
    fill(pool)
    assert pool.pooled("agent") == 2
    pending = burst(pool, "agent", 6, now=1.0)
    # Six calls took (two hits, four misses): six are wanted now, two starting at a time.
    assert pool.target("agent") == 6
    assert len(pending) == 2
    done, most = drain(pool, pending, now=2.0)
    assert (done, most) == (6, 2)  # a trickle of refills, never a storm
    assert pool.ready("agent") == 6
    # The next burst of the same size is served from the pool entirely.
    hits = [take(pool, "agent", NOBODY, now=3.0)[1] for _ in range(6)]
    assert hits == ["hit"] * 6


def test_a_burst_larger_than_the_ceiling_grows_the_pool_to_the_ceiling_only() -> None:
    pool = machine({"agent": 1}, parallel=2, max_containers=64, per_call=("agent",))
    fill(pool)
    pending = burst(pool, "agent", 100, now=1.0)
    assert pool.target("agent") == PER_CALL_CEILING
    _, most = drain(pool, pending, now=2.0)
    assert most <= 2
    assert pool.pooled("agent") == PER_CALL_CEILING
    # What is kept of the takes is bounded by the ceiling, however many there were.
    assert len(pool.books.services["agent"].takes) == PER_CALL_CEILING


def test_a_per_call_service_whose_warm_is_above_the_ceiling_keeps_its_warm() -> None:
    pool = machine(
        {"agent": PER_CALL_CEILING + 2}, parallel=4, max_containers=64, per_call=("agent",)
    )
    fill(pool)
    drain(pool, burst(pool, "agent", 30, now=1.0), now=1.0)
    assert pool.pooled("agent") == PER_CALL_CEILING + 2


def test_an_idle_per_call_service_decays_back_to_warm_one_take_at_a_time_oldest_first() -> None:
    pool = machine({"agent": 1}, parallel=2, per_call=("agent",))
    fill(pool)
    # Four calls, at 10, 11, 12 and 13 s: the pool grows to four.
    pending: list[StartPooled] = []
    for second in (10.0, 11.0, 12.0, 13.0):
        pending += burst(pool, "agent", 1, now=second)
    drain(pool, pending, now=14.0)
    assert pool.ready("agent") == 4
    oldest_first = sorted(e.token for e in pool.books.services["agent"].entries.values())
    # Idle: each take leaves the window at its own deadline, and one surplus container goes.
    steps: list[tuple[float, list[RemovePooled]]] = []
    while pool.pooled("agent") > 1:
        deadline = pool.deadline
        assert deadline is not None
        actions = feed(pool, Tick(), deadline)
        assert started(actions) == []  # nothing is started while the target falls
        if removals(actions):
            steps.append((deadline, removals(actions)))
    window = RATE_WINDOW_SECONDS
    assert [(at, [(r.token, r.reason) for r in gone]) for at, gone in steps] == [
        (10.0 + window, [(oldest_first[0], "surplus")]),
        (11.0 + window, [(oldest_first[1], "surplus")]),
        (12.0 + window, [(oldest_first[2], "surplus")]),
    ]
    assert pool.target("agent") == 1
    # Back at warm; the last take leaves the window too, and nothing more goes.
    assert feed(pool, Tick(), 13.0 + window) == []
    assert pool.books.services["agent"].takes == ()
    assert pool.pooled("agent") == 1


def test_a_start_completing_after_the_target_fell_leaves_the_pool_at_its_target() -> None:
    pool = machine({"agent": 1}, parallel=2, per_call=("agent",))
    fill(pool)
    first, second = burst(pool, "agent", 3, now=0.0)  # target 3; two starts at a time
    # The window ends while both start: the target is 1 again, but nothing is ready to go.
    assert removals(feed(pool, Tick(), RATE_WINDOW_SECONDS + 1.0)) == []
    assert pool.target("agent") == 1
    actions = feed(pool, StartSucceeded(first.token), RATE_WINDOW_SECONDS + 2.0)
    assert [(r.token, r.reason) for r in removals(actions)] == [(first.token, "surplus")]
    actions = feed(pool, StartSucceeded(second.token), RATE_WINDOW_SECONDS + 3.0)
    assert removals(actions) == []
    assert started(actions) == []
    assert pool.ready("agent") == 1


def test_a_per_call_service_grows_only_into_room_no_other_services_warm_needs() -> None:
    pool = machine({"agent": 1, "git": 2}, parallel=4, max_containers=4, per_call=("agent",))
    fill(pool)
    drain(pool, burst(pool, "agent", 5, now=1.0), now=1.0)
    # 4 in all, 2 of them git's warm: the agent has the other 2, though it wants 5.
    assert (pool.pooled("agent"), pool.pooled("git")) == (2, 2)
    # git's take is refilled for git, never given to the agent's growth.
    assert take(pool, "git", NOBODY, now=2.0)[1] == "hit"
    fill(pool, now=2.0)
    assert (pool.pooled("agent"), pool.pooled("git")) == (2, 2)


def test_a_service_that_is_not_per_call_keeps_its_warm_whatever_its_takes() -> None:
    pool = machine({"time": 2}, parallel=2)
    fill(pool)
    drain(pool, burst(pool, "time", 6, now=1.0), now=1.0)
    assert pool.target("time") == 2
    assert pool.pooled("time") == 2


def test_the_per_call_ceiling_is_the_calls_one_session_may_have_in_flight() -> None:
    # (kept apart so that the pool's machine does not import the router's)
    from reactor_fabric.protocol.fabric_roster import MAX_PER_CALL_CONTAINERS  # noqa: PLC0415

    assert PER_CALL_CEILING == MAX_PER_CALL_CONTAINERS


def test_takes_no_pooled_container_could_serve_do_not_raise_the_target() -> None:
    pool = machine({"agent": 1}, parallel=2, per_call=("agent",))
    fill(pool)
    for _ in range(3):  # mounts the pool cannot place (no staging area)
        assert take(pool, "agent", NOBODY, mounts=True, placeable=True)[1] == "mounts"
    assert pool.target("agent") == 1
    feed(pool, Shutdown(), 1.0)
    assert take(pool, "agent", NOBODY, now=1.0)[1] == "stopping"
    assert pool.target("agent") == 1


@pytest.mark.parametrize("seed", range(40))
def test_random_event_orders_keep_every_bound_and_hand_out_each_container_once(seed: int) -> None:
    """Any order of starts ending, takes, deaths, image changes and a stop keeps the bounds
    (tests/unit/protocol/test_warm_pool_orderings.py explores every order of a smaller world)."""
    rng = random.Random(seed)
    targets = {"time": rng.randint(0, 4), "git": rng.randint(1, 4), "fs": rng.randint(0, 3)}
    max_containers = rng.randint(1, 8)
    parallel = rng.randint(1, 3)
    pool = machine(targets, max_containers=max_containers, parallel=parallel)
    starting: set[int] = set()
    ready: set[int] = set()
    gone: set[int] = set()  # handed out or removed: never seen again
    now = 0.0

    def apply(actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, StartPooled):
                assert action.token not in starting | ready | gone
                starting.add(action.token)
            elif isinstance(action, RemovePooled):
                assert action.token in ready | starting
                ready.discard(action.token)
                gone.add(action.token)
            elif isinstance(action, Claim):
                ready.remove(action.token)
                gone.add(action.token)
                apply(pool.handle(Watched(action.token), now))
            elif isinstance(action, CheckImages):
                images = tuple((name, rng.choice(["a", "b"])) for name in action.services)
                apply(pool.handle(ImagesChecked(images), now))

    for _ in range(300):
        apply(pool.handle(Tick(), now))
        assert len(starting) == pool.starting <= parallel
        assert pool.total == len(starting) + len(ready) <= max_containers
        assert all(pool.pooled(name) <= target for name, target in targets.items())
        event = rng.choice(["succeed", "fail", "take", "die", "time"])
        if event in ("succeed", "fail") and starting:
            token = rng.choice(sorted(starting))
            starting.remove(token)
            done = StartSucceeded(token) if event == "succeed" else StartFailed(token)
            actions = pool.handle(done, now)
            if event == "succeed" and token not in {
                a.token for a in actions if isinstance(a, RemovePooled)
            }:
                ready.add(token)
            else:
                gone.add(token)
            apply([a for a in actions if not (isinstance(a, RemovePooled) and a.token == token)])
        elif event == "take":
            apply(pool.handle(Take(rng.choice(sorted(targets)), rng.choice([NOBODY, USER])), now))
        elif event == "die" and ready:
            apply(pool.handle(OutputEnded(rng.choice(sorted(ready)), "exited"), now))
        elif event == "time":
            now += rng.choice([0.5, 2.0, 30.0])
    apply(pool.handle(Shutdown(), now))
    assert not ready
    for token in list(starting):
        assert removals(pool.handle(StartSucceeded(token), now))[0].token == token
    assert pool.total == 0
