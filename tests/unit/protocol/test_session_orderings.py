"""Every ordering of the events a relay session can see, explored exhaustively.

A model world surrounds the pure session machine: a client with a short script (initialize,
initialized, two tool calls) that answers the server's requests and may send its first call
again while it is in flight (under the same id), model containers that start or
fail to start, take their stdin, answer in order, ask the client something, die, break, or exit
late after being stopped, a clock that jumps to the machine's next deadline, the client leaving,
and the orchestrator stopping. From every reachable state every enabled event is tried (states
seen before are not explored again: they behave alike), and after every step the invariants
below must hold. This covers the races the relay has had or could have: a frame racing a spawn,
a death racing a replay, idle teardown racing a frame or a server request, a late spawn, a stale
exit, shutdown at any moment.

Invariants:

- every request the client sent is answered at most once, and exactly once in the end (when the
  session was stopped, or when nothing else can happen);
- a container receives client frames in the client's order, never one twice, and nothing of
  the client before the answer to a replayed ``initialize``;
- nothing is written to a container that has not started or was stopped;
- every container that started is stopped once the session ends;
- the machine reads no client frame while its buffer for the container is full, and its buffer
  never exceeds the bound by more than one frame;
- every tool call gets one audit record, exactly once in the end, with the outcome the client
  saw: ``ok`` after a result, ``error`` after an error answer (the server's or the
  orchestrator's), ``no_answer`` only for a call the client never got an answer to;
- a request sent again under an id in flight is refused at once (``duplicate_request_id``),
  never reaches a container, gets a record of its own, and leaves the first request's answer
  and record as they would have been;
- under a suite lock, where a container may answer under its request's id spelled as a
  string (``"2"`` for ``2``: clients take it for that request's answer) or answer an id that is
  not in flight (answered already, or never asked): the first is the request's one answer,
  the second never reaches the client;
- with a container lifecycle other than per-session reuse (``fresh_per_call``,
  ``smart_refresh``): a container is never retired for its lifecycle under a request in flight
  either way; a container that has served its calls (one per-call, ``max_calls`` with smart
  refresh) is stopped in the very step it has nothing in flight any more, and receives a
  further call only while one of the client's requests is still in flight there (requests in
  flight together share a container);
- with containers that work on copies of the project (``workspace: isolated``): each gets one
  call at most (a call waits while another is in the container: its copy is the next one's);
  a call's answer
  goes to the client only after the driver reported its container's copy recorded (or the
  recording failed), naming that; the machine asks for the record (``report_workspace``) only
  of a container that answered a call, once; answers are still answered exactly once when the
  session stops with them held.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from reactor_fabric import ContainerStartFailure
from reactor_fabric._reasons import (
    CALL_DONE,
    ORCHESTRATOR_STOPPING,
    REFRESH_AGE,
    REFRESH_CALLS,
    REFRESH_MEMORY,
)
from reactor_fabric.protocol import session as session_module
from reactor_fabric.protocol.answers import OUTPUT_INVALID, SessionLimits
from reactor_fabric.protocol.catalog import service_catalog
from reactor_fabric.protocol.events import (
    Action,
    BackendBroken,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendMeasured,
    BackendStarted,
    BackendStartFailed,
    ClientFrame,
    ClientGone,
    CloseClient,
    EndSession,
    Event,
    Log,
    MeasureBackend,
    Shutdown,
    StartBackend,
    StdinWritten,
    StopBackend,
    Tick,
    ToBackend,
    ToClient,
    WorkspaceRecorded,
)
from reactor_fabric.protocol.jsonrpc import error_response
from reactor_fabric.protocol.ledger import REPLAY_ID_PREFIX, Ledger
from reactor_fabric.protocol.lifecycle import Lifecycle
from reactor_fabric.protocol.relay_container import RelayContainer
from reactor_fabric.protocol.relay_requests import RelayRequests
from reactor_fabric.protocol.session import SessionMachine
from reactor_fabric.protocol.settings import RelaySettings
from reactor_fabric.protocol.suite_lock import SuiteLock, lock_text, parse_lock, service_lock
from reactor_fabric.protocol.tool_calls import ToolCall, ToolCallDone
from tests import orderings
from tests.messages import INITIALIZE, INITIALIZED, request
from tests.orderings import Violation, check

SCRIPT = [
    json.dumps(INITIALIZE).encode(),
    json.dumps(INITIALIZED).encode(),
    json.dumps(request(2, "tools/call", {"name": "a"})).encode(),
    json.dumps(request(3, "tools/call", {"name": "b"})).encode(),
]
TOOL_CALL_IDS = (2, 3)
AGAIN = 2  # the script's first tool call (id 2), which the client may send again
# Small enough that the initialize and a call cannot both wait: the read gate is exercised.
BUFFER_BYTES = 200
# Bounds that keep each exploration finite (set per test): misfortunes per run (deaths, broken
# output, failed starts, refused replays) and server→client requests per run. One request to
# the client multiplies the space by ~90, so the configurations below split the work.
MISFORTUNES = 2
ASKS = 1
# Whether the client may send its first tool call again while it is in flight.
DUPLICATES = False
DUPLICATE = "duplicate_request_id"
# The service's container lifecycle (None: reuse per session).
LIFECYCLE: Lifecycle | None = None
LIFECYCLE_REASONS = {CALL_DONE, REFRESH_CALLS, REFRESH_AGE, REFRESH_MEMORY}
OVER_THRESHOLD = 10_000  # a measurement over the smart_refresh threshold of the test
MAX_STATES = 1_000_000
# A suite lock the machine runs under (None: none); with one, containers may also answer under
# a request's id spelled as a string, and answer an id not in flight (each a misfortune).
LOCKED: SuiteLock | None = None
STRAY_ID = 99
# Whether the containers work on copies of the project (workspace: isolated): their calls'
# answers wait for the copy's recording, which the driver reports once the container is removed
# (a step of the world's: recorded, or failed as a misfortune).
ISOLATED = False
RECORDED = {"mode": "isolated", "branch": "b", "base": "c0", "commit": "c1", "files_changed": 1,
            "insertions": 1, "deletions": 0}  # fmt: skip


def K(seq: int) -> BackendKey:  # noqa: N802 - a key, as short as the seq it wraps
    """Backend ``seq`` of the relay session under test."""
    return BackendKey("svc", seq)


@dataclass
class Box:
    """A model container."""

    seq: int
    running: bool = False  # started and not stopped or dead
    stopped: bool = False  # the machine asked to stop it
    exit_reported: bool = False
    unreported: int = 0  # bytes written to its stdin not yet reported written
    received: list[Any] = field(default_factory=list)  # request ids to answer, in order
    last_index: int = -1  # the last client frame (script index) it received
    replay_pending: bool = False
    asked: bool = False
    ask_open: bool = False  # its request to the client has not been answered to it yet
    calls_received: int = 0  # tool calls written to it
    calls_answered: int = 0  # tool calls it answered
    answered_ids: tuple[Any, ...] = ()  # the ids of the tool calls it answered
    owed: bool = False  # stopped with report_workspace: its recording is to be reported
    reported: str | None = None  # "recorded" or "failed", once the driver reported it


def in_flight(box: Box) -> bool:
    """Whether a request of the client's script is in flight in the container."""
    return any(request_id in TOOL_CALL_IDS or request_id == 1 for request_id in box.received)


def used_up(box: Box) -> bool:
    """Whether the container has served what its lifecycle allows (None: no such bound)."""
    if LIFECYCLE is None or LIFECYCLE.reuses:
        return False
    if LIFECYCLE.strategy == "fresh_per_call":
        return box.calls_answered >= 1
    return LIFECYCLE.max_calls is not None and box.calls_received >= LIFECYCLE.max_calls


@dataclass
class World:
    machine: SessionMachine
    now: float = 0.0
    next_frame: int = 0
    boxes: dict[int, Box] = field(default_factory=dict)
    spawning: set[int] = field(default_factory=set)
    measuring: set[int] = field(default_factory=set)  # containers whose memory was asked
    sent: list[Any] = field(default_factory=list)  # request ids the client sent
    answers: dict[Any, int] = field(default_factory=dict)
    answered_with: dict[Any, str] = field(default_factory=dict)  # id → "result" or "error"
    recorded: dict[Any, str] = field(default_factory=dict)  # tool call id → its outcome
    asks: list[Any] = field(default_factory=list)  # server requests the client has to answer
    ended: str | None = None
    stopping: bool = False
    left: bool = False
    misfortunes: int = 0
    asked: int = 0
    # The first tool call sent again under its id; that one refused; its record.
    duplicated: bool = False
    duplicate_refused: bool = False
    duplicate_recorded: bool = False

    def clone(self) -> World:
        twin = copy.copy(self)
        twin.machine = self.machine.clone()
        twin.boxes = {
            seq: dataclasses.replace(box, received=list(box.received))
            for seq, box in self.boxes.items()
        }
        twin.spawning = set(self.spawning)
        twin.measuring = set(self.measuring)
        twin.sent = list(self.sent)
        twin.answers = dict(self.answers)
        twin.answered_with = dict(self.answered_with)
        twin.recorded = dict(self.recorded)
        twin.asks = list(self.asks)
        return twin

    def key(self) -> tuple[object, ...]:
        boxes = tuple(
            (b.seq, b.running, b.stopped, b.exit_reported, b.unreported, tuple(b.received),
             b.last_index, b.replay_pending, b.asked, b.ask_open, b.calls_received,
             b.calls_answered, b.answered_ids, b.owed, b.reported)
            for b in self.boxes.values()
        )  # fmt: skip
        return (
            self.machine.fingerprint(),
            self.now,
            self.next_frame,
            boxes,
            tuple(sorted(self.spawning)),
            tuple(sorted(self.measuring)),
            tuple(sorted(self.answers.items(), key=repr)),
            tuple(sorted(self.answered_with.items(), key=repr)),
            tuple(sorted(self.recorded.items(), key=repr)),
            tuple(self.asks),
            self.ended,
            self.stopping,
            self.left,
            self.misfortunes,
            self.asked,
            self.duplicated,
            self.duplicate_refused,
            self.duplicate_recorded,
        )


def apply(world: World, actions: list[Action], trail: list[str]) -> None:
    """What the world does with the machine's actions, checking them as it goes."""
    for action in actions:
        match action:
            case StartBackend(key=BackendKey(seq=seq)):
                check(seq not in world.boxes, f"container {seq} spawned twice", trail)
                check(not world.ended, "a spawn after the session ended", trail)
                world.boxes[seq] = Box(seq)
                world.spawning.add(seq)
            case ToBackend(key=BackendKey(seq=seq), data=data):
                box = world.boxes.get(seq)
                check(box is not None and box.running, f"a write to container {seq}", trail)
                assert box is not None
                box.unreported += len(data)
                for line in data.splitlines():
                    receive_line(box, line, trail)
            case ToClient(frame=frame):
                client_receives(world, json.loads(frame), trail)
            case ToolCallDone(call=call):
                recorded(world, call, trail)
            case StopBackend(key=BackendKey(seq=seq), reason=reason):
                box = world.boxes.get(seq)
                check(box is not None, f"stop of unknown container {seq}", trail)
                assert box is not None
                if reason in LIFECYCLE_REASONS:
                    busy = in_flight(box) or box.ask_open
                    check(not busy, f"container {seq} retired ({reason}) under a request", trail)
                if action.report_workspace:
                    check(ISOLATED, f"container {seq} stopped for a workspace", trail)
                    check(box.answered_ids != (), f"container {seq}: no answer held", trail)
                    check(not box.owed, f"container {seq} stopped for its workspace twice", trail)
                    box.owed = True
                box.running = False
                box.stopped = True
            case EndSession():
                world.ended = "shutdown" if world.stopping else "gone"
            case MeasureBackend(key=BackendKey(seq=seq)):
                box = world.boxes.get(seq)
                check(box is not None and box.running, f"container {seq} measured", trail)
                assert box is not None
                check(not in_flight(box), f"container {seq} measured under a call", trail)
                world.measuring.add(seq)
            case CloseClient() | Log():
                pass


def client_receives(world: World, message: dict[str, Any], trail: list[str]) -> None:
    if message.get("error", {}).get("data", {}).get("reason") == DUPLICATE:
        refused = world.duplicated and not world.duplicate_refused
        check(refused, f"{message['id']} refused as a duplicate it was not", trail)
        world.duplicate_refused = True
    elif "method" in message and "id" in message:
        world.asks.append(message["id"])
    elif "id" in message and "method" not in message:
        answer_id = message["id"]
        if isinstance(answer_id, str) and answer_id.isdigit():
            answer_id = int(answer_id)  # (as the TypeScript SDK reads it: Number(id))
        check(answer_id in world.sent, f"an answer to unknown id {answer_id}", trail)
        world.answers[answer_id] = world.answers.get(answer_id, 0) + 1
        check(world.answers[answer_id] == 1, f"{answer_id} answered twice", trail)
        world.answered_with[answer_id] = "error" if "error" in message else "result"
        if answer_id in TOOL_CALL_IDS:
            workspace_checks(world, answer_id, message, trail)


def workspace_checks(world: World, call_id: Any, message: dict[str, Any], trail: list[str]) -> None:
    """An isolated container's answer to a call goes out only once its copy's recording is
    reported, naming it (or why nothing was recorded); other answers name no workspace."""
    if "result" in message:
        workspace = message["result"].get("structuredContent", {}).get("workspace")
    else:
        workspace = (message["error"].get("data") or {}).get("workspace")
    served = [box for box in world.boxes.values() if call_id in box.answered_ids]
    if not ISOLATED or not served:
        check(workspace is None, f"{call_id} answered naming a workspace it has none of", trail)
        return
    [box] = served
    if "error" in message and workspace is None:
        # (the session's own error, for an answer held when it ended)
        check(world.stopping, f"{call_id}'s held answer replaced by an error", trail)
        return
    check(box.reported is not None, f"{call_id} answered before its copy was recorded", trail)
    check(workspace is not None, f"{call_id} answered without its workspace", trail)
    assert workspace is not None
    named = "failed" if workspace.get("error") else "recorded"
    check(named == box.reported, f"{call_id} answered {named}, {box.reported}", trail)


def recorded(world: World, call: ToolCall, trail: list[str]) -> None:
    if call.error_reason == DUPLICATE:
        check(world.duplicate_refused, "a duplicate recorded before its refusal", trail)
        check(not world.duplicate_recorded, "a duplicate recorded twice", trail)
        world.duplicate_recorded = True
        return
    call_id = call.request_id
    check(call_id in TOOL_CALL_IDS, f"a tool call record for {call_id}", trail)
    check(call_id not in world.recorded, f"tool call {call_id} recorded twice", trail)
    world.recorded[call_id] = call.outcome
    got = world.answered_with.get(call_id)
    expected = {"result": "ok", "error": "error", None: "no_answer"}[got]
    check(call.outcome == expected, f"{call_id} recorded {call.outcome} ({got})", trail)


def receive_line(box: Box, line: bytes, trail: list[str]) -> None:
    message = json.loads(line)
    message_id = message.get("id")
    if isinstance(message_id, str) and message_id.startswith(REPLAY_ID_PREFIX):
        check(box.last_index == -1 and not box.received, "a replay after other frames", trail)
        box.replay_pending = True
        box.received.append(message_id)
        return
    if "error" in message or "result" in message:
        if message_id == f"ask-{box.seq}":
            box.ask_open = False
        return  # an answer to the server's own request
    if message.get("method") == "tools/call":
        check(
            not used_up(box) or in_flight(box),
            f"a call to used container {box.seq} with nothing in flight there",
            trail,
        )
        box.calls_received += 1
        # (each call of an isolated service its own copy: never two calls in one container)
        check(not ISOLATED or box.calls_received == 1, f"container {box.seq} got two calls", trail)
    index = SCRIPT.index(line)
    check(not box.replay_pending, f"frame {index} before the replay was answered", trail)
    check(index > box.last_index, f"frame {index} out of order (after {box.last_index})", trail)
    box.last_index = index
    if "id" in message:
        box.received.append(message_id)


Step = tuple[str, Callable[[World], Event]]


def enabled(world: World) -> list[Step]:
    """The events that can happen next in this world (each returns the event to feed)."""
    if world.ended:
        return []
    machine = world.machine
    steps: list[Step] = []
    if world.next_frame < len(SCRIPT) and machine.accepting:
        steps.append(("send", send_next))
    if world.asks and machine.accepting:
        steps.append(("answer-server", answer_server))
    again = json.loads(SCRIPT[AGAIN])["id"] if len(SCRIPT) > AGAIN else None
    if (
        DUPLICATES
        and not world.duplicated
        and again in world.sent
        and again not in world.answers
        and machine.accepting
    ):
        steps.append(("send-again", send_again))
    unlucky = world.misfortunes < MISFORTUNES
    for seq in sorted(world.spawning):
        steps.append((f"spawned-{seq}", partial(started, seq=seq)))
        if unlucky:
            steps.append((f"spawn-failed-{seq}", partial(failed, seq=seq)))
    for box in world.boxes.values():
        steps += container_steps(world, box, unlucky=unlucky)
    for seq in sorted(world.measuring):
        steps.append((f"measured-over-{seq}", partial(measured, seq=seq, memory=OVER_THRESHOLD)))
        steps.append((f"unmeasurable-{seq}", partial(measured, seq=seq, memory=None)))
    if machine.deadline is not None:
        steps.append(("tick", tick))
    if not world.left:
        steps.append(("client-leaves", leave))
    if not world.stopping:
        steps.append(("shutdown", shutdown))
    return steps


def container_steps(world: World, box: Box, *, unlucky: bool) -> list[Step]:
    seq = box.seq
    steps: list[Step] = []
    if box.owed and box.reported is None:
        # (the driver removed it, recorded its copy and reports that, or that it failed)
        steps.append((f"recorded-{seq}", partial(workspace_recorded, seq=seq, failed=False)))
        if unlucky:
            steps.append((f"record-fails-{seq}", partial(workspace_recorded, seq=seq, failed=True)))
    return steps + running_steps(world, box, unlucky=unlucky)


def running_steps(world: World, box: Box, *, unlucky: bool) -> list[Step]:
    seq = box.seq
    if not box.running:
        if box.stopped and not box.exit_reported:
            return [(f"late-exit-{seq}", partial(late_exit, seq=seq))]
        return []
    steps: list[Step] = []
    if box.unreported:
        steps.append((f"written-{seq}", partial(written, seq=seq)))
    if box.received:
        steps.append((f"answers-{seq}", partial(answers, seq=seq, error=False)))
        if box.replay_pending and unlucky:
            steps.append((f"refuses-{seq}", partial(answers, seq=seq, error=True)))
        if LOCKED is not None and unlucky and isinstance(box.received[0], int):
            steps.append((f"answers-respelled-{seq}", partial(answers, seq=seq, respelled=True)))
    if LOCKED is not None and unlucky:
        steps.append((f"answers-stray-{seq}", partial(stray, seq=seq)))
    if not box.asked and world.asked < ASKS:
        steps.append((f"asks-{seq}", partial(asks, seq=seq)))
    if unlucky:
        steps.append((f"dies-{seq}", partial(dies, seq=seq)))
        steps.append((f"breaks-{seq}", partial(breaks, seq=seq)))
    return steps


def send_next(world: World) -> Event:
    frame = SCRIPT[world.next_frame]
    world.next_frame += 1
    message = json.loads(frame)
    if "id" in message:
        world.sent.append(message["id"])
    return ClientFrame(frame)


def send_again(world: World) -> Event:
    """The client sends its first tool call again, under the same id, while it is in flight."""
    world.duplicated = True
    return ClientFrame(SCRIPT[AGAIN])


def answer_server(world: World) -> Event:
    ask_id = world.asks.pop(0)
    return ClientFrame(json.dumps({"jsonrpc": "2.0", "id": ask_id, "result": {}}).encode())


def started(world: World, seq: int) -> Event:
    world.spawning.discard(seq)
    world.boxes[seq].running = True
    return BackendStarted(K(seq), workspace=ISOLATED)


def failed(world: World, seq: int) -> Event:
    world.misfortunes += 1
    world.spawning.discard(seq)
    return BackendStartFailed(K(seq), ContainerStartFailure("no", reason="image_not_found"))


def written(world: World, seq: int) -> Event:
    box = world.boxes[seq]
    nbytes, box.unreported = box.unreported, 0
    return StdinWritten(K(seq), nbytes)


def answers(world: World, seq: int, *, error: bool = False, respelled: bool = False) -> Event:
    box = world.boxes[seq]
    answer_id = box.received.pop(0)
    if isinstance(answer_id, str) and answer_id.startswith(REPLAY_ID_PREFIX):
        box.replay_pending = False
    if answer_id in TOOL_CALL_IDS:
        box.calls_answered += 1
        box.answered_ids = (*box.answered_ids, answer_id)
    if error or respelled:
        world.misfortunes += 1
    body: dict[str, Any] = {"error": {"code": -32602, "message": "no"}} if error else {"result": {}}
    said = str(answer_id) if respelled else answer_id
    return BackendLine(K(seq), json.dumps({"jsonrpc": "2.0", "id": said, **body}).encode())


def workspace_recorded(world: World, seq: int, *, failed: bool) -> Event:
    """The driver removed an isolated container and recorded its copy (or could not)."""
    box = world.boxes[seq]
    if failed:
        world.misfortunes += 1
        box.reported = "failed"
        return WorkspaceRecorded(K(seq), None, "git fast-import: no")
    box.reported = "recorded"
    return WorkspaceRecorded(K(seq), dict(RECORDED))


def stray(world: World, seq: int) -> Event:
    """An answer to no request in flight: one answered already (or not sent yet), or none."""
    world.misfortunes += 1
    sent = [request_id for request_id in world.sent if request_id not in world.boxes[seq].received]
    answer_id = sent[-1] if sent else STRAY_ID
    stray = {"jsonrpc": "2.0", "id": answer_id, "result": {"tools": [{"name": "x"}]}}
    return BackendLine(K(seq), json.dumps(stray).encode())


def measured(world: World, seq: int, memory: int | None) -> Event:
    world.measuring.discard(seq)
    return BackendMeasured(K(seq), memory)


def asks(world: World, seq: int) -> Event:
    world.boxes[seq].ask_open = True
    world.boxes[seq].asked = True
    world.asked += 1
    return BackendLine(K(seq), json.dumps(request(f"ask-{seq}", "roots/list")).encode())


def dies(world: World, seq: int) -> Event:
    world.misfortunes += 1
    box = world.boxes[seq]
    box.running = False
    box.exit_reported = True
    box.stopped = True  # nothing more comes from it; its removal is asked for by the machine
    return BackendExited(K(seq), exit_code=1)


def breaks(world: World, seq: int) -> Event:
    world.misfortunes += 1
    return BackendBroken(K(seq), OUTPUT_INVALID, "a line too long")


def late_exit(world: World, seq: int) -> Event:
    world.boxes[seq].exit_reported = True
    return BackendExited(K(seq), exit_code=137)


def tick(world: World) -> Event:
    deadline = world.machine.deadline
    assert deadline is not None
    world.now = max(world.now, deadline)
    return Tick()


def leave(world: World) -> Event:
    world.left = True
    return ClientGone()


def shutdown(world: World) -> Event:
    world.stopping = True
    return Shutdown(ORCHESTRATOR_STOPPING)


def final_checks(world: World, trail: list[str]) -> None:
    """Once nothing more can happen."""
    for call_id in TOOL_CALL_IDS:
        if call_id in world.sent:
            check(call_id in world.recorded, f"tool call {call_id} never recorded", trail)
    if world.ended == "gone":
        pass  # a client that left cannot be answered
    else:
        for request_id in world.sent:
            check(world.answers.get(request_id) == 1, f"{request_id} never answered", trail)
    if world.ended:
        for box in world.boxes.values():
            started = box.running or box.stopped
            check(not started or box.stopped, f"container {box.seq} left running", trail)
    check(not world.spawning or bool(world.ended), "a spawn never resolved", trail)


def allowed_bytes() -> int:
    """What may wait for a container or in its stdin: what the client was let send (the bound
    plus one frame), and the machine's own lines (a replayed initialize and initialized, an
    answer to each server request that expired)."""
    allowed = BUFFER_BYTES + max(len(f) for f in SCRIPT) + len(SCRIPT[0]) + len(SCRIPT[1])
    return allowed + 64 + ASKS * 256


def advance(
    world: World, make_event: Callable[[World], Event], trail: list[str], *, allowed: int
) -> None:
    """One step: the event fed to the machine, the world playing its part, the checks."""
    event = make_event(world)
    assert event is not None
    actions = world.machine.handle(event, world.now)
    apply(world, actions, trail)
    buffered = world.machine.buffered_to_server
    check(buffered <= allowed, f"{buffered} bytes buffered", trail)
    for box in world.boxes.values():
        idle = not in_flight(box) and not box.ask_open
        check(
            not (box.running and used_up(box) and idle),
            f"used container {box.seq} kept with nothing in flight",
            trail,
        )
    refused = world.duplicate_refused and world.duplicate_recorded
    check(world.duplicated == refused, "a duplicate not refused at once", trail)


def explore(*, stall_timeout: float = math.inf) -> int:
    """Visit every reachable state once; the number visited."""
    settings = RelaySettings(
        limits=SessionLimits(
            to_server_bytes=BUFFER_BYTES, replay_timeout=10.0, stdin_stall_timeout=stall_timeout
        ),
        idle_timeout=30.0,
        lifecycle=LIFECYCLE or Lifecycle(),
        lock=LOCKED,
        lock_mode="enforce" if LOCKED is not None else "off",
        isolated=ISOLATED,
    )
    machine = SessionMachine(settings, service_name="svc", now=0.0)
    step = partial(advance, allowed=allowed_bytes())
    return orderings.explore(
        World(machine), enabled, step, at_end=final_checks, max_states=MAX_STATES
    )


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("frames", "misfortunes", "asks", "at_least"),
    [
        (3, 2, 0, 15_000),  # starts, deaths, broken output, replays, idle, racing the frames
        (3, 0, 1, 30_000),  # a request to the client: answers, expiry, idle, stop, leaving
        (2, 2, 1, 60_000),  # both at once, on the handshake
    ],
    ids=["misfortunes", "server-request", "both"],
)
def test_every_reachable_state_of_a_session_keeps_the_invariants(
    monkeypatch: pytest.MonkeyPatch, frames: int, misfortunes: int, asks: int, at_least: int
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:frames])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", misfortunes)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", asks)
    states = explore()  # stdin never stalls here: that has its own exploration below
    # The whole space was visited (it is this large because every event is tried everywhere).
    assert states >= at_least


@pytest.mark.exhaustive
def test_every_reachable_state_keeps_the_invariants_when_a_container_stops_taking_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A write never reported done lets the stall deadline fire (a container that stopped
    # reading its stdin is replaced), racing idle teardown, replays, deaths, stop, leaving.
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:3])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", 1)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", 0)
    assert explore(stall_timeout=45.0) >= 5_000


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("frames", "misfortunes", "asks", "at_least"),
    [
        (3, 2, 0, 35_000),  # starts, deaths, broken output, replays, idle, racing the repeat
        (4, 0, 0, 12_000),  # both calls in flight, answered in any order around the repeat
    ],
    ids=["misfortunes", "both-calls"],
)
def test_every_reachable_state_keeps_the_invariants_when_the_client_repeats_an_id_in_flight(
    monkeypatch: pytest.MonkeyPatch, frames: int, misfortunes: int, asks: int, at_least: int
) -> None:
    # The first call sent again at any moment it is in flight: waiting for a container that
    # starts, is replayed to or dies, written, racing its answer, idle teardown, stop, leaving.
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:frames])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", misfortunes)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", asks)
    monkeypatch.setattr(sys.modules[__name__], "DUPLICATES", True)
    assert explore() >= at_least


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("lifecycle", "frames", "misfortunes", "asks", "at_least"),
    [
        (Lifecycle("fresh_per_call"), 4, 1, 0, 20_000),  # both calls, replays, a death
        (Lifecycle("fresh_per_call"), 3, 1, 1, 20_000),  # a request to the client holds it
        (
            Lifecycle("smart_refresh", max_calls=2, max_age=20.0, memory_threshold=1000),
            4,
            0,
            0,
            20_000,
        ),  # calls, age (before idle), memory figures over or unreadable, racing the frames
    ],
    ids=["per-call", "per-call-server-request", "smart-refresh"],
)
def test_every_reachable_state_keeps_the_invariants_with_a_container_lifecycle(
    monkeypatch: pytest.MonkeyPatch,
    lifecycle: Lifecycle,
    frames: int,
    misfortunes: int,
    asks: int,
    at_least: int,
) -> None:
    # Containers retired between calls (per call, after calls, after their age, over their
    # memory) racing the client's next frames, replays, deaths, expiry, stop, leaving.
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:frames])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", misfortunes)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", asks)
    monkeypatch.setattr(sys.modules[__name__], "LIFECYCLE", lifecycle)
    assert explore() >= at_least


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("frames", "misfortunes", "asks", "at_least"),
    [
        (4, 1, 0, 60_000),  # both calls: one answered respelled or a stray, in any order
        (3, 2, 0, 20_000),  # two of them, racing deaths, replays, idle, stop, leaving
    ],
    ids=["both-calls", "misfortunes"],
)
def test_every_reachable_state_keeps_the_invariants_under_a_suite_lock(
    monkeypatch: pytest.MonkeyPatch, frames: int, misfortunes: int, asks: int, at_least: int
) -> None:
    # Under a lock the relay matches answers to requests in flight by any spelling of their
    # id, and drops the answers that match none: no request may lose its one answer for it,
    # nor get two, and no stray may reach the client.
    lock = parse_lock(lock_text({"svc": service_lock("img", None, service_catalog())}))
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:frames])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", misfortunes)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", asks)
    monkeypatch.setattr(sys.modules[__name__], "LOCKED", lock)
    assert explore() >= at_least


def test_the_checker_catches_a_lock_that_lets_a_stray_answer_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As the relay was: only the ledger's exact ids were told apart, and anything else passed.
    monkeypatch.setattr(Ledger, "answering", lambda _self, response_id: response_id)
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:3])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", 1)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", 0)
    monkeypatch.setattr(
        sys.modules[__name__],
        "LOCKED",
        parse_lock(lock_text({"svc": service_lock("img", None, service_catalog())})),
    )
    with pytest.raises(Violation, match=r"answered twice|an answer to unknown id"):
        explore()


def test_the_checker_catches_a_machine_that_answers_a_request_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The invariants must be able to fail: break the machine, and exploring finds it.
    original = RelayContainer.exited

    def answer_twice(self: RelayContainer, event: BackendExited, now: float) -> list[Action]:
        in_flight = list(self.requests.ledger.client_requests)
        actions = original(self, event, now)
        error = ContainerStartFailure("again", reason="container_exited")
        return actions + [ToClient(error_response(rid, error)) for rid in in_flight]

    monkeypatch.setattr(RelayContainer, "exited", answer_twice)
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:3])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", 1)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", 0)
    with pytest.raises(Violation, match="answered twice"):
        explore()


def test_the_checker_catches_a_machine_that_retires_a_per_call_container_under_a_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Retiring while the container's own request awaits the client must be found.
    def between(self: RelayContainer, slot: Any) -> bool:
        return slot.state.value == "ready" and not self.requests.waiting

    monkeypatch.setattr(RelayContainer, "between", between)
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:3])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", 0)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", 1)
    monkeypatch.setattr(sys.modules[__name__], "LIFECYCLE", Lifecycle("fresh_per_call"))
    with pytest.raises(Violation, match="under a request"):
        explore()


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("frames", "misfortunes", "asks", "at_least"),
    [
        (4, 1, 0, 40_000),  # both calls: answers held, the container replaced, recordings racing
        (3, 1, 1, 27_000),  # a request to the client holds the container; a failed recording
    ],
    ids=["both-calls", "server-request"],
)
def test_every_reachable_state_keeps_the_invariants_with_isolated_containers(
    monkeypatch: pytest.MonkeyPatch, frames: int, misfortunes: int, asks: int, at_least: int
) -> None:
    # A per-call container working on a copy: its answers wait until the driver reports the
    # copy recorded (or failed) after the container's removal, racing the next call's
    # container, replays, deaths, expiry, stop, leaving.
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:frames])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", misfortunes)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", asks)
    monkeypatch.setattr(sys.modules[__name__], "LIFECYCLE", Lifecycle("fresh_per_call"))
    monkeypatch.setattr(sys.modules[__name__], "ISOLATED", True)
    assert explore() >= at_least


def _passing_answers_on(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """A machine that takes no container for one working on a copy: nothing held."""

    def started(self: RelayContainer, event: BackendStarted, now: float) -> list[Action]:
        return original(self, dataclasses.replace(event, workspace=False), now)

    return started


def _forgetting_held_answers(_original: Callable[..., Any]) -> Callable[..., Any]:
    """A session end that leaves the held answers unanswered."""

    def answer_held(self: Any, error: Any, now: float) -> list[Action]:
        self.held.end()
        return []

    return answer_held


@pytest.mark.parametrize(
    ("part", "method", "planted", "caught"),
    [
        (RelayContainer, "started", _passing_answers_on, "before its copy was recorded"),
        (RelayRequests, "answer_held", _forgetting_held_answers, "never (answered|recorded)"),
        (session_module, "waits_for_a_copy", lambda _o: lambda *_a: False, "got two calls"),
    ],
    ids=["answers-at-once", "forgets-held-answers", "shares-a-copy"],
)
def test_the_checker_catches_an_isolated_answer_sent_early_or_never(
    monkeypatch: pytest.MonkeyPatch,
    part: object,
    method: str,
    planted: Callable[[Callable[..., Any]], Callable[..., Any]],
    caught: str,
) -> None:
    monkeypatch.setattr(part, method, planted(getattr(part, method)))
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT", SCRIPT[:4])
    monkeypatch.setattr(sys.modules[__name__], "MISFORTUNES", 0)
    monkeypatch.setattr(sys.modules[__name__], "ASKS", 0)
    monkeypatch.setattr(sys.modules[__name__], "LIFECYCLE", Lifecycle("fresh_per_call"))
    monkeypatch.setattr(sys.modules[__name__], "ISOLATED", True)
    with pytest.raises(Violation, match=caught):
        explore()
