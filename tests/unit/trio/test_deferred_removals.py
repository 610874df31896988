"""The sweeper removes containers whose removal a teardown's bound cut short: at once, not at
its next round, a few at a time, bounded in what it keeps."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from reactor_fabric._errors import DockerUnavailable
from reactor_fabric.runtime.base import ManagedContainer
from reactor_fabric.trio.sweeper import DEFERRED_AT_ONCE, DeferredRemovals, run_sweeper

INTERVAL = 60.0


class SlowEngine:
    """Removes each container after ``removal_seconds``; its listing may fail; counts how many
    removals run at once and when each ended."""

    def __init__(self, *, removal_seconds: float = 1.0, listing_fails: bool = False) -> None:
        self.removal_seconds = removal_seconds
        self.listing_fails = listing_fails
        self.listing_seconds = 0.0
        self.removed: dict[str, float] = {}
        self.listings = 0
        self.running = 0
        self.most_at_once = 0

    async def list_managed(self, extra_labels: Any = None) -> list[ManagedContainer]:
        self.listings += 1
        await trio.sleep(self.listing_seconds)
        if self.listing_fails:
            raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")
        return []

    async def remove(self, container: str, *, grace: float | None = None) -> None:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await trio.sleep(self.removal_seconds)
            self.removed[container] = trio.current_time()
        finally:
            self.running -= 1


async def sweeping(nursery: trio.Nursery, engine: SlowEngine, deferred: DeferredRemovals) -> float:
    await nursery.start(
        lambda task_status: run_sweeper(
            engine,  # type: ignore[arg-type]
            instance_id="me",
            this_host="h",
            live_sessions=set,
            interval=INTERVAL,
            deferred=deferred,
            task_status=task_status,
        )
    )
    return trio.current_time()


async def test_a_deferred_container_is_removed_at_once_not_at_the_next_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SlowEngine()
    deferred = DeferredRemovals()
    async with trio.open_nursery() as nursery:
        started = await sweeping(nursery, engine, deferred)
        await trio.sleep(5)
        deferred.defer("c1")
        await trio.sleep(2)
        assert engine.removed == {"c1": pytest.approx(started + 6)}
        assert engine.listings == 1  # the round did not come early
        await trio.sleep(INTERVAL)
        assert engine.listings == 2  # and still comes on time
        nursery.cancel_scope.cancel()
    assert len(deferred) == 0


async def test_a_burst_of_deferred_removals_runs_a_few_at_a_time_and_takes_latecomers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SlowEngine(removal_seconds=3.0)
    deferred = DeferredRemovals()
    async with trio.open_nursery() as nursery:
        await sweeping(nursery, engine, deferred)
        for n in range(20):
            deferred.defer(f"c{n}")
        await trio.sleep(1)
        deferred.defer("late")  # while the first batch is being removed
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert set(engine.removed) == {*(f"c{n}" for n in range(20)), "late"}
    assert engine.most_at_once == DEFERRED_AT_ONCE


async def test_deferred_removals_do_not_wait_for_a_round_held_up_by_a_busy_engine(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SlowEngine()
    deferred = DeferredRemovals()
    async with trio.open_nursery() as nursery:
        started = await sweeping(nursery, engine, deferred)
        engine.listing_seconds = 50.0  # the next round waits that long for the engine's list
        await trio.sleep(INTERVAL + 5)
        assert engine.listings == 2  # in the round
        deferred.defer("c1")
        await trio.sleep(2)
        assert engine.removed == {"c1": pytest.approx(started + INTERVAL + 6)}
        nursery.cancel_scope.cancel()


async def test_deferred_removals_go_on_while_the_engine_cannot_list(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SlowEngine(listing_fails=True)
    deferred = DeferredRemovals()
    async with trio.open_nursery() as nursery:
        await sweeping(nursery, engine, deferred)  # (its first round postponed, not failed)
        deferred.defer("c1")
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert set(engine.removed) == {"c1"}


def test_deferred_removals_are_bounded_and_each_container_waits_once() -> None:
    deferred = DeferredRemovals(limit=2)
    assert deferred.defer("a")
    assert deferred.defer("a")  # already waiting: no second entry
    assert deferred.defer("b")
    assert not deferred.defer("c")  # full: left to the sweeper's next round
    assert deferred.take() == ["a", "b"]
    assert deferred.take() == []
    assert deferred.defer("c")
