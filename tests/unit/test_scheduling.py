"""The orchestrator's short CPU slice (reactor_fabric/_scheduling.py), on the real kernel.

Each test works in threads of its own, which first go back to the kernel's slice: serving
in-process (test_cli) shortens the test runner's own thread, and threads inherit it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from reactor_fabric import _scheduling
from reactor_fabric._scheduling import SHORT_SLICE_NS, Slice, shorten_slice, thread_slice

T = TypeVar("T")


needs_custom_slices = pytest.mark.skipif(
    thread_slice() is None,
    reason="the kernel reports no slice for a thread: custom slices need Linux 6.12 or later",
)


def in_a_thread(work: Callable[[], T]) -> T:
    """``work()`` in a new thread that starts from the kernel's own slice."""
    results: list[T] = []

    def run() -> None:
        kernels_slice()
        results.append(work())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert results, "the thread did not finish"
    return results[0]


def kernels_slice() -> int:
    """Give the calling thread the kernel's default slice back (a runtime of 0); return it."""
    return _scheduling._Kernel.here().set(0)


@needs_custom_slices
def test_the_calling_thread_gets_the_short_slice_and_keeps_its_nice_value() -> None:
    def work() -> tuple[int | None, Slice, int | None, int]:
        before = thread_slice()
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 1)
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        outcome = shorten_slice()
        assert os.getpriority(os.PRIO_PROCESS, 0) == nice
        return before, outcome, thread_slice(), nice

    before, outcome, after, _ = in_a_thread(work)
    assert before is not None
    assert before > SHORT_SLICE_NS  # the kernel's own: 0.7 ms times 1 + log2(CPUs)
    assert outcome == Slice(SHORT_SLICE_NS, True, threads=1)
    assert after == SHORT_SLICE_NS


@needs_custom_slices
def test_the_whole_process_gives_threads_made_before_the_short_slice_with_their_own_nice() -> None:
    ready = threading.Event()
    leave = threading.Event()
    seen: dict[str, int] = {}

    def earlier() -> None:  # like a library's worker, started before the orchestrator asks
        seen["kernel's"] = kernels_slice()
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 2)
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
        seen["tid"] = threading.get_native_id()
        ready.set()
        leave.wait(30)
        seen["nice after"] = os.getpriority(os.PRIO_PROCESS, 0)

    worker = threading.Thread(target=earlier)
    worker.start()
    try:
        assert ready.wait(30)
        assert thread_slice(seen["tid"]) == seen["kernel's"] > SHORT_SLICE_NS
        outcome = in_a_thread(lambda: shorten_slice(whole_process=True))
        assert outcome.shortened
        assert outcome.threads >= 3  # the caller, the worker, this test's thread at least
        assert thread_slice(seen["tid"]) == SHORT_SLICE_NS
    finally:
        leave.set()
        worker.join(30)
    assert seen["nice after"] == seen["nice"]


@needs_custom_slices
def test_threads_made_after_inherit_the_short_slice() -> None:
    def work() -> int | None:
        shorten_slice()
        inherited: list[int | None] = []
        child = threading.Thread(target=lambda: inherited.append(thread_slice()))
        child.start()
        child.join(30)
        return inherited[0]

    assert in_a_thread(work) == SHORT_SLICE_NS


@needs_custom_slices
def test_another_threads_slice_is_read_by_its_id() -> None:
    leave = threading.Event()
    seen: dict[str, int] = {}
    both = threading.Barrier(3)

    def hold(name: str, shorten: bool) -> None:
        kernels_slice()
        if shorten:
            shorten_slice()
        seen[name] = threading.get_native_id()
        both.wait(30)
        leave.wait(30)

    holders = [
        threading.Thread(target=hold, args=("short", True)),
        threading.Thread(target=hold, args=("kernel's", False)),
    ]
    for holder in holders:
        holder.start()
    try:
        both.wait(30)
        assert thread_slice(seen["short"]) == SHORT_SLICE_NS
        kernels = thread_slice(seen["kernel's"])
        assert kernels is not None
        assert kernels > SHORT_SLICE_NS
    finally:
        leave.set()
        for holder in holders:
            holder.join(30)


@needs_custom_slices
def test_a_thread_under_another_policy_is_left_alone_and_told_why() -> None:
    def work() -> tuple[Slice, int]:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        return shorten_slice(), os.sched_getscheduler(0)

    outcome, policy = in_a_thread(work)
    assert policy == os.SCHED_BATCH
    assert not outcome.shortened
    assert "policy is 3" in outcome.reason


def test_an_unknown_machine_keeps_the_kernels_slice_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("platform.machine", lambda: "riscv64")
    outcome = shorten_slice()
    assert outcome == Slice(None, False, f"not supported on {sys.platform} riscv64")
    assert thread_slice() is None


def test_a_kernel_that_ignores_the_slice_is_reported_as_before_6_12(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What Linux before 6.12 does: sched_setattr succeeds, sched_getattr's runtime stays 0.
    monkeypatch.setattr(_scheduling._Kernel, "set", lambda self, slice_ns, tid=0: 0)
    outcome = shorten_slice()
    assert outcome == Slice(0, False, "the kernel keeps its own slice (Linux before 6.12)")
