"""The Docker runtime's worker-thread calls: when ``release`` runs, whatever trio does.

``release`` frees what the engine may still use while a call runs (the descriptors of pinned
mounts, which the engine resolves during start). Closing them while an abandoned thread still
runs the call would let the number be reused by another session's pin, so: after the call ended
in its thread, or at once if the thread never began it — never before, and exactly once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio

from reactor_fabric import ContainerStartFailure, DockerUnavailable, SecurityViolation
from reactor_fabric.policy.pinning import Pin, PinSet
from reactor_fabric.runtime.docker_calls import DockerCalls, _Operation
from reactor_fabric.runtime.docker_operations import memory_in_use
from reactor_fabric.runtime.docker_pin_check import (
    VERIFY_ATTEMPTS,
    VERIFY_RETRY_SECONDS,
    verify_mounts,
)


def runtime_without_engine(**kwargs: Any) -> DockerCalls:
    engine = DockerCalls(**kwargs)
    engine._connect = object  # type: ignore[method-assign,assignment]
    return engine


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()

    def note(self, event: str) -> None:
        with self.lock:
            self.events.append(event)


async def test_release_runs_once_after_the_call_returns() -> None:
    engine = runtime_without_engine()
    seen = Recorder()

    def call(_client: object) -> str:
        seen.note("call")
        return "done"

    assert await engine.call("start", call, release=lambda: seen.note("release")) == "done"
    assert seen.events == ["call", "release"]


async def test_release_runs_once_after_a_call_that_failed() -> None:
    engine = runtime_without_engine()
    seen = Recorder()

    def call(_client: object) -> str:
        seen.note("call")
        raise RuntimeError("engine said no")

    with pytest.raises(ContainerStartFailure, match="engine said no"):
        await engine.call("start", call, release=lambda: seen.note("release"))
    assert seen.events == ["call", "release"]


async def test_a_cancelled_call_releases_only_when_its_abandoned_thread_ends() -> None:
    engine = runtime_without_engine()
    seen = Recorder()
    running = threading.Event()
    go_on = threading.Event()

    def call(_client: object) -> None:
        running.set()
        go_on.wait(30)
        seen.note("call ended")

    async with trio.open_nursery() as nursery:
        cancel_scope = trio.CancelScope()

        async def caller() -> None:
            with cancel_scope:
                await engine.call("start", call, release=lambda: seen.note("release"))

        nursery.start_soon(caller)
        await trio.to_thread.run_sync(running.wait)
        cancel_scope.cancel()
    assert engine.abandoned_calls == 1
    assert seen.events == []  # the thread still runs the call: nothing may be released
    go_on.set()
    assert await engine.settle()
    assert seen.events == ["call ended", "release"]


async def test_a_call_cancelled_before_its_thread_began_releases_at_once() -> None:
    engine = runtime_without_engine(max_parallel_calls=1)
    seen = Recorder()
    blocking = threading.Event()
    occupied = threading.Event()

    def hold_the_only_slot(_client: object) -> None:
        occupied.set()
        blocking.wait(30)

    def never(_client: object) -> None:
        seen.note("call")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.call, "list", hold_the_only_slot)
        await trio.to_thread.run_sync(occupied.wait)
        with trio.CancelScope() as waiting:
            waiting.cancel()  # while it waits for the only slot
            await engine.call("start", never, release=lambda: seen.note("release"))
        assert seen.events == ["release"]
        blocking.set()
    assert await engine.settle()
    assert seen.events == ["release"]  # and the call itself never ran


async def test_a_call_whose_answer_lost_the_race_with_its_cancellation_is_undone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The thread ends (the container exists, the socket is open) just as trio cancels the
    # wait: trio never takes the result, so the undo must run on it all the same, once.
    engine = runtime_without_engine()
    seen = Recorder()
    thread_done = threading.Event()
    finish = _Operation.finish

    def finish_and_tell(operation: _Operation, *args: Any) -> bool:
        abandoned = finish(operation, *args)
        thread_done.set()
        return abandoned

    monkeypatch.setattr(_Operation, "finish", finish_and_tell)
    abandon = engine._abandon

    def abandon_after_the_thread_ended(*args: Any) -> None:
        assert thread_done.wait(30)  # the losing order, made certain
        abandon(*args)

    monkeypatch.setattr(engine, "_abandon", abandon_after_the_thread_ended)
    with trio.CancelScope() as scope:

        def create(_client: object) -> str:
            trio.from_thread.run_sync(scope.cancel)  # delivered while trio waits for us
            seen.note("created")
            return "container-1"

        await engine.call("create", create, if_abandoned=lambda _c, made: seen.note(f"undo {made}"))
    assert scope.cancelled_caught
    assert await engine.settle()
    assert seen.events == ["created", "undo container-1"]
    assert engine.abandoned_calls == 0


async def test_a_call_that_timed_out_counts_as_abandoned_once() -> None:
    engine = runtime_without_engine(call_timeout=0.05)
    seen = Recorder()
    go_on = threading.Event()

    def slow(_client: object) -> str:
        go_on.wait(30)
        return "late"

    with pytest.raises(DockerUnavailable, match="did not answer"):
        await engine.call("list", slow, if_abandoned=lambda _c, late: seen.note(f"undo {late}"))
    assert engine.abandoned_calls == 1
    go_on.set()
    assert await engine.settle(bound=30)
    assert engine.abandoned_calls == 0
    assert seen.events == ["undo late"]


# --- verifying pinned mounts through /proc/PID/root -----------------------------------------------


class InspectOnly:
    """The engine as verify_mounts sees it: a running container with a first process."""

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        return {"State": {"Running": True, "Pid": 4242}}


def pinned(device: int = 7, inode: int = 99) -> PinSet:
    return PinSet([Pin("/workspace", "/home/u/project", -1, device, inode, (1000, 1000))])


def stat_result(device: int, inode: int) -> os.stat_result:
    return os.stat_result((0o40755, inode, device, 1, 1000, 1000, 0, 0, 0, 0))


def test_a_first_process_not_yet_inspectable_is_checked_again_until_it_is() -> None:
    answers: list[Exception | os.stat_result] = [
        PermissionError(13, "Permission denied"),
        PermissionError(13, "Permission denied"),
        stat_result(7, 99),
    ]
    looked: list[str] = []
    slept: list[float] = []

    def stat(path: str) -> os.stat_result:
        looked.append(path)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    verify_mounts(InspectOnly(), "c1", pinned(), stat=stat, sleep=slept.append)  # type: ignore[arg-type]
    assert looked == ["/proc/4242/root/workspace"] * 3
    assert slept == [VERIFY_RETRY_SECONDS] * 2


def test_a_process_never_inspectable_is_refused_as_unverifiable_after_bounded_tries() -> None:
    def stat(path: str) -> os.stat_result:
        raise PermissionError(13, "Permission denied")

    slept: list[float] = []
    with pytest.raises(SecurityViolation) as refused:
        verify_mounts(InspectOnly(), "c1", pinned(), stat=stat, sleep=slept.append)  # type: ignore[arg-type]
    assert refused.value.reason == "mount_unverifiable"
    assert len(slept) == VERIFY_ATTEMPTS - 1


def test_another_directory_in_the_container_is_refused_at_once_not_retried() -> None:
    slept: list[float] = []
    with pytest.raises(SecurityViolation) as refused:
        verify_mounts(
            InspectOnly(),  # type: ignore[arg-type]
            "c1",
            pinned(),
            stat=lambda path: stat_result(7, 100),
            sleep=slept.append,
        )
    assert refused.value.reason == "mount_changed"
    assert slept == []


@pytest.mark.parametrize(
    ("memory_stats", "expected"),
    [
        ({"usage": 50_000, "stats": {"inactive_file": 8_000}}, 42_000),  # cgroup v2
        ({"usage": 50_000, "stats": {"total_inactive_file": 9_000, "cache": 20_000}}, 41_000),
        ({"usage": 50_000, "stats": {"cache": 20_000}}, 30_000),  # cgroup v1, older engines
        ({"usage": 50_000}, 50_000),  # Podman's compat API may give no details
        ({}, None),  # a stopped container's report
        ({"usage": "lots"}, None),
    ],
)
def test_a_containers_memory_in_use_is_its_usage_less_the_page_cache(
    memory_stats: dict[str, Any], expected: int | None
) -> None:
    assert memory_in_use({"memory_stats": memory_stats}) == expected


def held_call() -> tuple[threading.Event, Callable[[object], str], threading.Event]:
    """A call that holds its slot until the event is set (then answers "late"), and an event
    set once it runs (it has its slot)."""
    go_on = threading.Event()
    started = threading.Event()

    def slow(_client: object) -> str:
        started.set()
        go_on.wait(30)
        return "late"

    return go_on, slow, started


async def running(started: threading.Event) -> None:
    """Once the held call runs (in its worker thread)."""
    assert await trio.to_thread.run_sync(started.wait, 30)


async def test_a_call_waiting_for_a_slot_is_judged_from_when_it_begins_not_on_the_queue() -> None:
    # One slot, taken by a slow call: the next waits in the queue longer than the call bound,
    # and still succeeds (a burst of sessions queues behind a busy engine, which is no fault of
    # the engine's); the slow call itself times out on its own bound.
    engine = runtime_without_engine(call_timeout=0.2, queue_timeout=30, max_parallel_calls=1)
    go_on, slow, started = held_call()
    outcomes: list[str] = []

    async def first() -> None:
        try:
            await engine.call("start", slow)
        except DockerUnavailable as exc:
            outcomes.append(f"first: {exc}")

    async def second() -> None:
        outcomes.append(f"second: {await engine.call('start', lambda _c: 'answered')}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await running(started)
        nursery.start_soon(second)
        await trio.sleep(0.5)  # past the call bound: the second still waits for the slot
        assert outcomes == ["first: the Docker engine did not answer start within 0.2 s"]
        go_on.set()  # the abandoned thread ends: its slot is free
    assert outcomes[1] == "second: answered"


async def occupy(engine: DockerCalls, call: Any) -> None:
    """Run ``call`` through the engine's slots, whatever its outcome."""
    with contextlib.suppress(DockerUnavailable):
        await engine.call("start", call)


async def test_a_call_that_never_got_a_slot_says_the_engine_is_busy() -> None:
    engine = runtime_without_engine(call_timeout=0.05, queue_timeout=0.2, max_parallel_calls=1)
    go_on, slow, started = held_call()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(occupy, engine, slow)
        await running(started)
        with pytest.raises(DockerUnavailable, match=r"busy: start waited 0\.2 s for one of the 1"):
            await engine.call("start", lambda _c: "never")
        go_on.set()
        nursery.cancel_scope.cancel()
    assert await engine.settle(bound=30)


async def test_an_explicit_bound_counts_the_wait_for_a_slot_too() -> None:
    # (A health check must answer within its bound, however busy the engine.)
    engine = runtime_without_engine(call_timeout=30, queue_timeout=300, max_parallel_calls=1)
    go_on, slow, started = held_call()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(occupy, engine, slow)
        await running(started)
        with trio.fail_after(5), pytest.raises(DockerUnavailable, match=r"within 0\.1 s"):
            await engine.call("ping", lambda _c: "pong", time_bound=0.1)
        go_on.set()
    assert await engine.settle(bound=30)
