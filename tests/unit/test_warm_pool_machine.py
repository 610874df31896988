"""The warm pool's decisions (pure): refills within bounds, takes, back-off, shapes, stop."""

from __future__ import annotations

import random

import pytest

from reactor_fabric.protocol.warm_pool import (
    BACKOFF_MAX_SECONDS,
    HEALTHY_SECONDS,
    RemovePooled,
    StartPooled,
    WarmPoolMachine,
)

NOBODY = "65534:65534"
USER = "1000:1000"


def machine(
    targets: dict[str, int] | None = None, *, max_containers: int = 16, parallel: int = 2
) -> WarmPoolMachine:
    return WarmPoolMachine(
        targets if targets is not None else {"time": 2},
        max_containers=max_containers,
        parallel_starts=parallel,
        initial_shape=NOBODY,
    )


def fill(pool: WarmPoolMachine, now: float = 0.0) -> list[StartPooled]:
    """Start and complete starts until the pool asks for no more."""
    started: list[StartPooled] = []
    while actions := pool.starts(now):
        for action in actions:
            assert pool.start_succeeded(action.token, now) is None
        started += actions
    return started


def test_a_service_without_warm_keeps_no_pool_and_its_sessions_are_not_pooled() -> None:
    pool = machine({"time": 0, "git": 1})
    assert pool.services == {"git"}
    assert pool.take("time", NOBODY).outcome == "not_pooled"


def test_refills_start_at_most_parallel_starts_at_once() -> None:
    pool = machine({"time": 5}, parallel=2)
    first = pool.starts(0.0)
    assert [a.service for a in first] == ["time", "time"]
    assert pool.starts(0.0) == []  # two in flight: no more until one ends
    pool.start_succeeded(first[0].token, 0.0)
    assert len(pool.starts(0.0)) == 1


def test_the_global_cap_bounds_starting_and_ready_containers_together() -> None:
    pool = machine({"time": 3, "git": 3}, max_containers=4, parallel=8)
    actions = pool.starts(0.0)
    assert len(actions) == 4
    assert pool.total == 4
    for action in actions:
        pool.start_succeeded(action.token, 0.0)
    assert pool.starts(0.0) == []


def test_rationed_starts_go_to_the_service_with_fewest_pooled_first() -> None:
    pool = machine({"time": 2, "git": 2, "filesystem": 2}, parallel=3)
    assert sorted(a.service for a in pool.starts(0.0)) == ["filesystem", "git", "time"]


def test_a_take_hands_out_the_oldest_ready_container_once_and_the_pool_refills() -> None:
    pool = machine({"time": 2})
    started = fill(pool)
    taken = pool.take("time", NOBODY)
    assert (taken.token, taken.outcome) == (started[0].token, "hit")
    assert pool.ready("time") == 1
    (refill,) = pool.starts(0.0)
    assert refill.token not in {a.token for a in started}  # never reused
    second = pool.take("time", NOBODY)
    assert second.token == started[1].token


def test_a_container_still_starting_is_not_handed_out() -> None:
    pool = machine({"time": 1})
    pool.starts(0.0)
    assert pool.take("time", NOBODY).outcome == "empty"


def test_a_miss_for_another_shape_retires_the_oldest_ready_one_and_refills_in_that_shape() -> None:
    pool = machine({"git": 2})
    started = fill(pool)
    taken = pool.take("git", USER)
    assert taken.token is None
    assert taken.outcome == "shape"
    assert taken.retire == (RemovePooled(started[0].token, "git", "shape_changed"),)
    (refill,) = pool.starts(0.0)
    assert refill.shape == USER
    pool.start_succeeded(refill.token, 0.0)
    assert pool.take("git", USER).token == refill.token
    # The container of the old shape is still there for a session that wants it.
    assert pool.take("git", NOBODY).token == started[1].token


def test_a_failed_start_backs_off_doubling_up_to_a_minute_and_success_resets_it() -> None:
    pool = machine({"time": 1})
    now = 100.0
    delays = []
    for _ in range(9):
        (action,) = pool.starts(now)
        pool.start_failed(action.token, now)
        assert pool.starts(now) == []  # held back
        retry = pool.next_start_at(now)
        assert retry is not None
        delays.append(retry - now)
        now = retry
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert delays[-1] == BACKOFF_MAX_SECONDS
    (action,) = pool.starts(now)
    pool.start_succeeded(action.token, 0.0)
    pool.take("time", NOBODY)
    (action,) = pool.starts(now)  # no back-off after a success
    pool.start_failed(action.token, now)
    assert pool.next_start_at(now) == now + 1.0


def test_back_off_of_one_service_does_not_hold_back_another() -> None:
    pool = machine({"time": 1, "git": 1}, parallel=1)
    (first,) = pool.starts(0.0)
    pool.start_failed(first.token, 0.0)
    (second,) = pool.starts(0.0)
    assert second.service != first.service


def test_a_ready_container_that_dies_soon_is_forgotten_and_counts_as_a_failure() -> None:
    pool = machine({"time": 1})
    (started,) = fill(pool)
    pool.exited(started.token, 5.0)
    assert pool.pooled("time") == 0
    assert pool.starts(5.0) == []
    assert pool.next_start_at(5.0) == 6.0
    pool.exited(started.token, 6.0)  # a second report of the same end changes nothing
    assert len(pool.starts(6.0)) == 1


def test_a_server_that_exits_right_after_every_start_backs_off_though_each_start_succeeds() -> None:
    pool = machine({"time": 1})
    now = 0.0
    for expected in (1.0, 2.0, 4.0, 8.0):
        (action,) = pool.starts(now)
        assert pool.start_succeeded(action.token, now) is None
        pool.exited(action.token, now + 0.1)
        retry = pool.next_start_at(now + 0.1)
        assert retry == now + 0.1 + expected
        now = retry


def test_a_container_that_ran_a_while_before_it_ended_resets_the_back_off() -> None:
    pool = machine({"time": 1})
    (action,) = pool.starts(0.0)
    pool.start_failed(action.token, 0.0)
    (action,) = pool.starts(1.0)
    pool.start_succeeded(action.token, 1.0)
    pool.exited(action.token, 1.0 + HEALTHY_SECONDS)
    assert len(pool.starts(1.0 + HEALTHY_SECONDS)) == 1


def test_an_exit_reported_after_the_container_was_handed_out_changes_nothing() -> None:
    pool = machine({"time": 1})
    (started,) = fill(pool)
    assert pool.take("time", NOBODY).token == started.token
    pool.exited(started.token, 1.0)
    assert len(pool.starts(1.0)) == 1  # no back-off


def test_an_image_change_retires_ready_containers_now_and_starting_ones_when_they_start() -> None:
    pool = machine({"time": 2}, parallel=1)
    (ready,) = pool.starts(0.0)
    pool.start_succeeded(ready.token, 0.0)
    (starting,) = pool.starts(0.0)
    assert pool.image_changed("time") == [RemovePooled(ready.token, "time", "image_changed")]
    assert pool.start_succeeded(starting.token, 0.0) == RemovePooled(
        starting.token, "time", "image_changed"
    )
    fresh = fill(pool)
    assert len(fresh) == 2
    assert pool.image_changed("unknown") == []


def test_stop_retires_every_ready_container_takes_nothing_and_starts_nothing() -> None:
    pool = machine({"time": 2, "git": 1}, parallel=3)
    actions = pool.starts(0.0)
    pool.start_succeeded(actions[0].token, 0.0)
    pool.start_succeeded(actions[1].token, 0.0)
    retired = pool.stop()
    assert {r.token for r in retired} == {actions[0].token, actions[1].token}
    assert {r.reason for r in retired} == {"stopping"}
    assert pool.take("time", NOBODY).outcome == "stopping"
    assert pool.starts(0.0) == []
    assert pool.next_start_at(0.0) is None
    assert pool.start_succeeded(actions[2].token, 0.0) == RemovePooled(
        actions[2].token, actions[2].service, "stopping"
    )
    assert pool.total == 0


def test_reporting_the_end_of_a_start_that_is_not_running_is_a_bug() -> None:
    pool = machine({"time": 1})
    (action,) = fill(pool)
    with pytest.raises(ValueError, match="not starting"):
        pool.start_succeeded(action.token, 0.0)
    with pytest.raises(ValueError, match="not starting"):
        pool.start_failed(99, 0.0)


class _Walk:
    """A model of what the pool should hold, checked against it after every event."""

    def __init__(self, pool: WarmPoolMachine) -> None:
        self.pool = pool
        self.starting: dict[int, StartPooled] = {}
        self.ready: dict[int, StartPooled] = {}
        self.gone: set[int] = set()  # handed out or removed: never seen again

    def begin_starts(self, now: float) -> None:
        for action in self.pool.starts(now):
            assert action.token not in self.starting | self.ready
            assert action.token not in self.gone
            self.starting[action.token] = action

    def retire(self, actions: list[RemovePooled] | tuple[RemovePooled, ...]) -> None:
        for action in actions:
            assert action.token in self.ready
            del self.ready[action.token]
            self.gone.add(action.token)

    def end_start(self, token: int, *, succeeded: bool, now: float) -> None:
        action = self.starting.pop(token)
        if not succeeded:
            self.pool.start_failed(token, now)
        elif self.pool.start_succeeded(token, now) is None:
            self.ready[token] = action
        else:
            self.gone.add(token)

    def take(self, name: str, shape: str) -> None:
        taken = self.pool.take(name, shape)
        self.retire(taken.retire)
        if taken.token is not None:
            assert self.ready.pop(taken.token).service == name
            self.gone.add(taken.token)


@pytest.mark.parametrize("seed", range(40))
def test_random_event_orders_keep_every_bound_and_hand_out_each_container_once(seed: int) -> None:
    """Any order of starts ending, takes, deaths, image changes and a stop keeps the bounds."""
    rng = random.Random(seed)
    targets = {"time": rng.randint(0, 4), "git": rng.randint(1, 4), "fs": rng.randint(0, 3)}
    max_containers = rng.randint(1, 8)
    parallel = rng.randint(1, 3)
    walk = _Walk(machine(targets, max_containers=max_containers, parallel=parallel))
    pool = walk.pool
    now = 0.0
    for _ in range(300):
        walk.begin_starts(now)
        assert len(walk.starting) == pool.starting <= parallel
        assert pool.total == len(walk.starting) + len(walk.ready) <= max_containers
        assert all(pool.pooled(name) <= target for name, target in targets.items())
        event = rng.choice(["succeed", "fail", "take", "die", "time", "image"])
        if event in ("succeed", "fail") and walk.starting:
            token = rng.choice(sorted(walk.starting))
            walk.end_start(token, succeeded=event == "succeed", now=now)
        elif event == "take":
            walk.take(rng.choice(sorted(targets)), rng.choice([NOBODY, USER]))
        elif event == "die" and walk.ready:
            token = rng.choice(sorted(walk.ready))
            del walk.ready[token]
            pool.exited(token, now)
        elif event == "time":
            now += rng.choice([0.5, 2.0, 30.0])
        elif event == "image":
            walk.retire(pool.image_changed(rng.choice(sorted(targets))))
    walk.retire(pool.stop())
    assert not walk.ready
    for token in list(walk.starting):
        assert pool.start_succeeded(token, 0.0) is not None
    assert pool.total == 0
