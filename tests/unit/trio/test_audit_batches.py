"""Audit records reach the writer after the answers they describe left, in order, in batches."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.observe import observer as observer_module
from reactor_fabric.observe.audit import AuditWriter, now_iso
from reactor_fabric.observe.observer import Observer
from reactor_fabric.protocol.tool_calls import ToolCallDone, ToolCalls
from reactor_fabric.trio.audit_batches import HAND_OVER_SECONDS, hand_audit_over_later
from reactor_fabric.trio.serve import assemble
from tests.fakes import AnsweringRuntime
from tests.unit.observe.test_observer import CLIENT, call, samples


class RecordingWriter(AuditWriter):
    """An audit writer that only notes what it was handed, and in how many batches."""

    def __init__(self, seen: list[str]) -> None:
        super().__init__(Path("/nonexistent/audit.jsonl"), max_bytes=1 << 20, keep=1)
        self.seen = seen
        self.batches = 0

    def submit_encoded(self, encoded: list[bytes]) -> int:
        self.batches += 1
        records: list[dict[str, Any]] = [json.loads(line) for line in encoded]
        self.seen.extend(f"{r['event']} {r.get('request_id', '')}".strip() for r in records)
        return len(records)


class StepsOf(trio.abc.Instrument):
    """Counts the steps of the tasks whose name ends with ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith(self.name):
            self.count += 1


async def connection_writer(answer_due: trio.Event, seen: list[str]) -> None:
    """A connection's writer task: it sends an answer once woken."""
    await answer_due.wait()
    seen.append("answer sent")


def finished_call(observer: Observer, finished: int | ToolCallDone) -> None:
    """A call ends: its request id (a made-up ToolCall), or the relay's own end of it."""
    observer.tool_call(
        call(request_id=finished) if isinstance(finished, int) else finished,
        session="s", endpoint="relay", service="git",
        container="c1", client=CLIENT, trace_id="f" * 32,
    )  # fmt: skip


def tool_calls_counted(observer: Observer) -> float:
    return sum(
        value
        for (name, _), value in samples(observer.metrics).items()
        if name == "reactor_fabric_tool_calls_total"
    )


async def test_a_calls_record_reaches_the_writer_after_the_task_woken_with_its_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # trio runs a turn's tasks in either order (at random): try both many times.
    for _ in range(40):
        seen: list[str] = []
        observer = Observer(audit=RecordingWriter(seen))
        async with trio.open_nursery() as nursery:
            await nursery.start(hand_audit_over_later, observer)
            answer_due = trio.Event()

            nursery.start_soon(connection_writer, answer_due, seen)
            await trio.testing.wait_all_tasks_blocked()
            answer_due.set()  # the relay queues the answer, then the call's record is made
            finished_call(observer, 7)
            assert seen == []
            await trio.sleep(1.5 * HAND_OVER_SECONDS)
            assert seen == ["answer sent", "tool_call 7"]
            nursery.cancel_scope.cancel()


async def test_records_made_while_a_batch_gathers_go_as_one_batch_in_the_order_they_were_made(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[str] = []
    writer = RecordingWriter(seen)
    observer = Observer(audit=writer)
    async with trio.open_nursery() as nursery:
        await nursery.start(hand_audit_over_later, observer)
        observer.session_started(
            "s", endpoint="relay", service="git", client=CLIENT, mounts=[], trace_id="f" * 32
        )
        for request_id in (1, 2, 3):
            await trio.sleep(HAND_OVER_SECONDS / 4)  # calls ending one after another
            finished_call(observer, request_id)
        observer.session_ended("s", endpoint="relay", service="git", seconds=1.0, calls=3)
        assert seen == []
        await trio.sleep(HAND_OVER_SECONDS)
        assert seen == ["session_start", "tool_call 1", "tool_call 2", "tool_call 3", "session_end"]
        assert writer.batches == 1
        await trio.sleep(10 * HAND_OVER_SECONDS)  # nothing held: no empty batches
        assert writer.batches == 1
        finished_call(observer, 4)
        await trio.sleep(1.5 * HAND_OVER_SECONDS)
        assert seen[-1] == "tool_call 4"
        assert writer.batches == 2
        nursery.cancel_scope.cancel()


async def test_the_task_wakes_once_per_batch_not_once_per_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    observer = Observer(audit=RecordingWriter([]))
    steps = StepsOf("hand_audit_over_later")
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(hand_audit_over_later, observer)
            steps.count = 0
            for request_id in range(20):  # 20 calls within one batch's time
                await trio.sleep(HAND_OVER_SECONDS / 40)
                finished_call(observer, request_id)
            await trio.sleep(HAND_OVER_SECONDS)
            assert len(observer.calls) == 20
            assert steps.count == 2  # woken by the first call, then the batch's timer
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)


async def test_a_calls_record_has_the_time_it_ended_not_the_time_its_batch_was_taken(
    autojump_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    wall = [1_700_000_000.25]
    monkeypatch.setattr(time, "time", lambda: wall[0])
    observer = Observer(audit=RecordingWriter([]))
    async with trio.open_nursery() as nursery:
        await nursery.start(hand_audit_over_later, observer)
        finished_call(observer, 1)
        wall[0] += 5.0  # the batch is taken much later, say
        await trio.sleep(1.5 * HAND_OVER_SECONDS)
        (event,) = observer.calls
        assert event.at == 1_700_000_000.25
        started = 1_700_000_000.25 - event.duration
        assert event.record["ts"] == now_iso(started)
        nursery.cancel_scope.cancel()


async def test_records_held_when_the_task_is_cancelled_are_handed_over_and_later_ones_at_once() -> (
    None
):
    seen: list[str] = []
    observer = Observer(audit=RecordingWriter(seen))
    async with trio.open_nursery() as nursery:
        await nursery.start(hand_audit_over_later, observer)
        finished_call(observer, 1)
        nursery.cancel_scope.cancel()  # before the task's turn came
    assert seen == ["tool_call 1"]
    finished_call(observer, 2)  # nobody batches any more: straight to the writer
    assert seen == ["tool_call 1", "tool_call 2"]


def test_the_records_held_are_bounded_and_handed_over_when_the_bound_is_reached(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(observer_module, "MAX_DEFERRED", 3)
    seen: list[str] = []
    wakes: list[bool] = []
    observer = Observer(audit=RecordingWriter(seen))
    observer.defer_audit(lambda: wakes.append(True))
    for request_id in (1, 2):
        finished_call(observer, request_id)
    assert (seen, wakes) == ([], [True])
    finished_call(observer, 3)
    assert seen == ["tool_call 1", "tool_call 2", "tool_call 3"]


async def test_without_an_audit_trail_a_calls_metrics_are_counted_after_its_answer_went(
    autojump_clock: trio.testing.MockClock,
) -> None:
    observer = Observer(services=["git"])
    observer.metrics.know_tools({"git": ["git_log"]})
    async with trio.open_nursery() as nursery:
        await nursery.start(hand_audit_over_later, observer)
        finished_call(observer, 1)
        assert tool_calls_counted(observer) == 0.0
        assert list(observer.calls) == []
        await trio.sleep(1.5 * HAND_OVER_SECONDS)
        assert tool_calls_counted(observer) == 1.0
        assert [event.record["request_id"] for event in observer.calls] == [1]
        nursery.cancel_scope.cancel()


def test_an_answer_held_for_its_outcome_is_read_only_when_the_batch_is_taken() -> None:
    seen: list[str] = []
    observer = Observer(audit=RecordingWriter(seen))
    observer.defer_audit(lambda: None)
    calls = ToolCalls()
    calls.begin_params(5, None, 100, now=0.0)
    done = calls.answer(5, b'{"jsonrpc":"2.0","id":5,"error":{"code":-32001}}', now=1.0)
    assert done is not None
    finished_call(observer, done)
    assert done.held_bytes > 0  # not read yet: the answer is on its way out
    observer.flush()
    assert done.held_bytes == 0
    assert seen == ["tool_call 5"]
    assert observer.calls[-1].outcome == "error"


def test_the_answers_held_are_bounded_in_bytes(monkeypatch: Any) -> None:
    monkeypatch.setattr(observer_module, "MAX_DEFERRED_BYTES", 1000)
    seen: list[str] = []
    observer = Observer(audit=RecordingWriter(seen))
    observer.defer_audit(lambda: None)
    calls = ToolCalls()
    for request_id in (1, 2):
        calls.begin_params(request_id, None, 100, now=0.0)
    small = calls.answer(1, b'{"jsonrpc":"2.0","id":1,"result":{}}', now=1.0)
    large = calls.answer(2, b'{"jsonrpc":"2.0","id":2,"result":{"x":"%s"}}' % (b"y" * 1000), 1.0)
    assert small is not None
    assert large is not None
    finished_call(observer, small)
    assert seen == []
    finished_call(observer, large)
    assert seen == ["tool_call 1", "tool_call 2"]


def test_a_call_that_cannot_be_recorded_is_logged_and_the_others_are_recorded(
    monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []
    observer = Observer(audit=RecordingWriter(seen))
    observer.defer_audit(lambda: None)
    counted = observer.metrics.tool_call

    def failing_for_two(service: str, tool: str, outcome: str, seconds: float) -> None:
        if tool == "broken":
            raise RuntimeError("an exporter failed")
        counted(service, tool, outcome, seconds)

    monkeypatch.setattr(observer.metrics, "tool_call", failing_for_two)
    finished_call(observer, 1)
    observer.tool_call(
        call(tool="broken", request_id=2), session="s", endpoint="relay", service="git",
        container="c1", client=CLIENT, trace_id="f" * 32,
    )  # fmt: skip
    finished_call(observer, 3)
    observer.flush()  # in the orchestrator's own task: it must not raise
    assert seen == ["tool_call 1", "tool_call 3"]
    assert [r.message for r in caplog.records] == ["tool_call_not_recorded"]


def test_closing_the_observer_hands_over_what_it_holds() -> None:
    seen: list[str] = []
    observer = Observer(audit=RecordingWriter(seen))
    observer.defer_audit(lambda: None)
    finished_call(observer, 1)
    observer.close()
    assert seen == ["tool_call 1"]


def test_arguments_are_hashed_only_when_a_trail_is_written(tmp_path: Path) -> None:
    suite = Suite(
        version="1.0",
        orchestrator=Orchestrator(allowed_mount_roots=["/tmp"]),
        mcp_services={"time": Service(image="reactor-fabric/mcp-server-time:x")},
    )
    untrailed = assemble(suite=suite, runtime=AnsweringRuntime(), network="none")
    assert untrailed.settings.audit_arguments == "none"
    audit = AuditWriter(tmp_path / "audit.jsonl", max_bytes=1 << 20, keep=1)
    trailed = assemble(
        suite=suite, runtime=AnsweringRuntime(), network="none", observer=Observer(audit=audit)
    )
    assert trailed.settings.audit_arguments == suite.orchestrator.audit.arguments == "hash"
