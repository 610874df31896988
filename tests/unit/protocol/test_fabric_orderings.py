"""Every ordering of the events a fabric-endpoint session can see, explored exhaustively.

A model world surrounds the pure machine (:class:`FabricServer`) as the driver does (it feeds
:mod:`~reactor_fabric.protocol.events` with the world's time and carries out the actions): a
client with a short script (initialize, initialized, a call to each of two services' tools) that
answers the requests it is sent, may cancel a call and may send its first call again while it is
in flight (under the same id); a model container per service, started when the machine asks,
that starts or fails to start, takes the handshake the machine drives, answers in order, refuses
the handshake, asks something of its own (roots, which the machine answers, or sampling, which
goes to the client), says its tools changed (the machine asks for its list, and the world runs
the catalog refresh it is given, or fails it), dies mid-call or breaks its output, and takes its
stdin (what the machine sent it reported written); a container the machine stopped may still
report its exit (the driver's reader racing the stop); a clock that jumps to the machine's next
deadline; the client leaving (``ClientGone``); and the orchestrator stopping (``Shutdown``),
after which events still come (they may be on their way) and the machine must start nothing.
From every reachable state every enabled event is tried (states seen before are not explored
again: they behave alike), and after every step the invariants below must hold.

Invariants:

- every request the client sent is answered at most once, and, unless it cancelled it, exactly
  once whenever nothing more is under way (no start, answer, refresh or question pending), and
  at once when the orchestrator stops; a cancelled call is not answered afterwards;
- every tool call gets one audit record, exactly once in the end, with the outcome the client
  saw: ``ok`` after a result, ``error`` after an error, ``cancelled`` when it cancelled first,
  ``no_answer`` only when it left first;
- a container is started only for a service that has none running, and never once the
  orchestrator is stopping or the client gone (``Shutdown`` closes the client and ends the
  session once, ``ClientGone`` stops every container and ends it); a respawn is announced as
  one exactly when its service had a container before; nothing is written to a container that
  has not started or is gone; it is greeted (initialize) before anything else, and gets no request
  before the handshake is done; each of its own requests is answered at most once; a container
  the machine forgets (refused handshake, unread stdin, idle) is removed, never left running,
  gracefully only when idle or at the session's end; every other stop and every exit is logged
  ``backend_failed`` exactly once; events of a container the machine stopped change nothing;
- the machine accepts the client's messages exactly while no container has more than the
  session's bound waiting for its stdin;
- a client request reaches a container only while the client waits on it (not answered, not
  cancelled), and at most once;
- a request sent again under an id in flight is refused at once (``duplicate_request_id``), never
  reaches a container, gets a record of its own, and leaves the first one's answer and record as
  they would have been;
- at most one catalog refresh runs at a time;
- a service whose containers live one call each (``fresh_per_call``, the services in
  ``PER_CALL``) starts one for every call, never a respawn, each serving exactly one call
  (concurrent calls in containers of their own at once), and none of them is left running once
  nothing is under way;
- a service whose containers are refreshed (``smart_refresh``, the services in ``REFRESH``:
  after two calls, at an age, or over a memory threshold, the world's figures over, under or
  unreadable, reported late too) has its container measured only between calls (nothing of
  it in flight), a container measured over its threshold gets no further call, one it retired
  is removed once its calls end, and a new one starts only when the running one is retired;
- a per-call service whose containers work on copies of the project (``workspace: isolated``,
  the services in ``ISOLATED``) has its container's answer go to the client only after the
  driver reported its copy recorded (a step of the world's, after the removal the machine asked
  for with ``report_workspace``; or the recording failed), naming what was recorded or why
  nothing was; only such containers are stopped for a record, only with an answer held; and an
  answer from any other container names no workspace.
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

from reactor_fabric._errors import ContainerStartFailure
from reactor_fabric._reasons import (
    CALL_DONE,
    CONTAINER_OUTPUT_INVALID,
    CONTAINER_UNRESPONSIVE,
    EXITED,
    IDLE,
    NOT_NEEDED,
    ORCHESTRATOR_STOPPING,
    REFRESH_AGE,
    REFRESH_CALLS,
    REFRESH_MEMORY,
    SESSION_ENDED,
)
from reactor_fabric.protocol.backend import BackendState, Role
from reactor_fabric.protocol.catalog import Catalog, service_catalog
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
    Compute,
    Computed,
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
    ToolsChanged,
    WorkspaceRecorded,
)
from reactor_fabric.protocol.fabric_backends import BackendTable
from reactor_fabric.protocol.fabric_refresh import Refresh, Refreshed
from reactor_fabric.protocol.fabric_roster import Roster
from reactor_fabric.protocol.fabric_router import FabricRouter
from reactor_fabric.protocol.fabric_server import FabricServer, Lifecycle
from reactor_fabric.protocol.tool_calls import ToolCall, ToolCallDone
from reactor_fabric.protocol.workspace_answers import HeldAnswers
from tests import orderings
from tests.messages import INITIALIZED, request
from tests.orderings import Violation, check
from tests.settings import fabric_server

SERVICES = ("alpha", "beta")
CATALOG = Catalog(
    {
        service: service_catalog(tools=[{"name": "echo", "description": f"{service} echoes"}])
        for service in SERVICES
    }
)
INITIALIZE = request(
    0,
    "initialize",
    {
        "protocolVersion": "2025-06-18",
        "capabilities": {"sampling": {}},
        "clientInfo": {"name": "model", "version": "0"},
    },
)


def _call(request_id: int, service: str) -> bytes:
    params = {"name": f"{service}__echo", "arguments": {"call": request_id}}
    return json.dumps(request(request_id, "tools/call", params)).encode()


# The calls carry their own id in their arguments: a container tells which call reached it.
SCRIPT = [
    json.dumps(INITIALIZE).encode(),
    json.dumps(INITIALIZED).encode(),
    _call(2, "alpha"),
    _call(3, "beta"),
]
TOOL_CALL_IDS = (2, 3)
AGAIN = 2  # the script's first tool call (id 2), which the client may send again
DUPLICATE = "duplicate_request_id"
IDLE_SECONDS = 30.0
# Bounds that keep each exploration finite (set per test): misfortunes per run (failed starts,
# refused handshakes, deaths), the client's cancellations, the containers' requests of their own
# (ASKS, of the kinds in ASK_METHODS), their list_changed notifications, and whether the client
# may send its first call again while it is in flight.
MISFORTUNES = 1
CANCELS = 0
ASKS = 0
ASK_METHODS: tuple[str, ...] = ("roots/list",)
CHANGES = 0
DUPLICATES = False
# The machine's bound on its own bytes a container leaves unread (None: one too large to reach,
# and the driver's reports of them written are not modelled); its bound on all the bytes that
# wait for a container's stdin (None: one too large to reach); whether a container may break
# its output (a line over the size limit).
OWN_BACKLOG: int | None = None
BUFFER: int | None = None
BREAKS = False
# How long a container's stdin may not move before it counts as no longer read (the one rule of
# protocol/backend.py; inf: never, as when writes are not modelled).
STALL = math.inf
# The services whose every call runs in a container of its own (fresh_per_call), and those of
# them whose containers work on a copy of the project (workspace: isolated): the driver records
# the copy once such a container is removed, and reports it (or that it failed) when the world
# says so.
PER_CALL: tuple[str, ...] = ()
ISOLATED: tuple[str, ...] = ()
RECORDED = {"mode": "isolated", "branch": "b", "base": "c0", "commit": "c1", "files_changed": 1,
            "insertions": 1, "deletions": 0}  # fmt: skip
# The services whose container is refreshed (smart_refresh, REFRESHED's bounds), and a memory
# figure over and under its threshold.
REFRESH: tuple[str, ...] = ()
REFRESHED = Lifecycle("smart_refresh", max_calls=2, max_age=20.0, memory_threshold=1000)
OVER_THRESHOLD, UNDER_THRESHOLD = 5000, 10
MAX_STATES = 1_000_000
# Each refresh's result, computed once (the same Refresh is shared by the worlds that hold it).
RESULTS: dict[Refresh, Refreshed] = {}


@dataclass
class Box:
    """A model container of one service."""

    seq: int
    service: str
    state: str = "starting"  # starting → running → gone (failed, dead) or stopped
    received: list[tuple[Any, str]] = field(default_factory=list)  # (id, method) to answer
    greeted: bool = False  # got the machine's initialize
    initialized: bool = False  # got notifications/initialized
    unreported: int = 0  # the machine's own bytes written, not yet reported
    ask: str | None = None  # its own request, once sent
    ask_answers: int = 0
    changed: bool = False  # sent its list_changed
    ran: bool = False  # it started (a later container of its service is a respawn)
    logged: int = 0  # its backend_failed log lines
    late: bool = False  # reported an exit after the machine stopped it
    calls: int = 0  # the tools/call requests it got
    measuring: bool = False  # its memory was asked for, the figure not reported yet
    over: bool = False  # it was reported over its memory threshold
    call_ids: tuple[tuple[Any, Any], ...] = ()  # (the machine's id, the client's) of its calls
    answered: tuple[Any, ...] = ()  # the client ids of the calls it answered
    owed: bool = False  # stopped with report_workspace: its recording is to be reported
    reported: str | None = None  # "recorded" or "failed", once the driver reported it

    def key(self) -> tuple[object, ...]:
        return (
            self.seq, self.service, self.state, tuple(self.received), self.greeted,
            self.initialized, self.unreported, self.ask, self.ask_answers, self.changed,
            self.ran, self.logged, self.late, self.calls, self.measuring, self.over,
            self.call_ids, self.answered, self.owed, self.reported,
        )  # fmt: skip


@dataclass
class World:
    machine: FabricServer
    now: float = 0.0
    next_frame: int = 0
    boxes: dict[int, Box] = field(default_factory=dict)
    current: dict[str, int] = field(default_factory=dict)  # the driver's running container
    sent: list[Any] = field(default_factory=list)  # request ids the client sent
    answers: dict[Any, int] = field(default_factory=dict)
    answered_with: dict[Any, str] = field(default_factory=dict)  # id → "result" or "error"
    cancelled: list[Any] = field(default_factory=list)
    reached: dict[Any, int] = field(default_factory=dict)  # client id → containers it reached
    recorded: dict[Any, str] = field(default_factory=dict)  # tool call id → its outcome
    asks: list[Any] = field(default_factory=list)  # requests the client has to answer
    refresh: Refresh | None = None  # the catalog refresh the machine asked to run
    stopping: bool = False
    left: bool = False
    misfortunes: int = 0
    asked: int = 0
    changes: int = 0
    duplicated: bool = False
    duplicate_refused: bool = False
    duplicate_recorded: bool = False
    closed: bool = False  # the machine closed the client
    ended: bool = False  # the machine ended the session

    def clone(self) -> World:
        twin = copy.copy(self)
        twin.machine = self.machine.clone()
        twin.boxes = {
            seq: Box(**{**vars(box), "received": list(box.received)})
            for seq, box in self.boxes.items()
        }
        twin.current = dict(self.current)
        twin.sent = list(self.sent)
        twin.answers = dict(self.answers)
        twin.answered_with = dict(self.answered_with)
        twin.cancelled = list(self.cancelled)
        twin.reached = dict(self.reached)
        twin.recorded = dict(self.recorded)
        twin.asks = list(self.asks)
        return twin

    def key(self) -> tuple[object, ...]:
        return (
            self.machine.fingerprint(),
            self.now,
            self.next_frame,
            tuple(box.key() for box in self.boxes.values()),
            tuple(sorted(self.current.items())),
            tuple(self.sent),
            tuple(sorted(self.answers.items(), key=repr)),
            tuple(sorted(self.answered_with.items(), key=repr)),
            tuple(self.cancelled),
            tuple(sorted(self.reached.items(), key=repr)),
            tuple(sorted(self.recorded.items(), key=repr)),
            tuple(self.asks),
            None if self.refresh is None else json.dumps(self.refresh.lists),
            self.stopping,
            self.left,
            self.misfortunes,
            self.asked,
            self.changes,
            self.duplicated,
            self.duplicate_refused,
            self.duplicate_recorded,
            self.closed,
            self.ended,
        )

    def running(self, service: str) -> Box | None:
        """The service's container as the driver knows it (started, not gone)."""
        box = self.boxes.get(self.current.get(service, -1))
        return box if box is not None and box.state == "running" else None

    def feed(self, event: Event) -> list[Action]:
        return self.machine.handle(event, self.now)


def apply(world: World, actions: list[Action], trail: list[str]) -> None:
    """What the driver does with the machine's actions, checking them as it goes."""
    logged: list[str] = []  # backend_failed lines of these actions, not yet matched by a stop
    for action in actions:
        # (what still comes after the end may be answered, never acted on)
        moves = isinstance(action, StartBackend | ToBackend | CloseClient | EndSession)
        check(not (world.ended and moves), f"{action!r} after the session ended", trail)
        match action:
            case StartBackend(key=key, respawn=respawn):
                start(world, key, respawn=respawn, trail=trail)
            case ToBackend(key=key, data=data):
                box = world.boxes.get(key.seq)
                running = box is not None and box.state == "running"
                check(running, f"a write to {key}, which is not running", trail)
                assert box is not None
                check(data.endswith(b"\n") and data.count(b"\n") == 1, "not one line", trail)
                box.unreported += len(data)
                receive_line(world, box, json.loads(data), trail)
            case StopBackend():
                stop(world, action, logged, trail)
            case Log(event="backend_failed", fields=fields):
                logged.append(fields["backend"])
            case ToClient(frame=frame):
                client_receives(world, json.loads(frame), trail)
            case ToolCallDone(call=call):
                recorded(world, call, trail)
            case MeasureBackend(key=key):
                measure(world, key, trail)
            case Compute(job=job):
                check(world.refresh is None, "a refresh while one runs", trail)
                assert isinstance(job, Refresh)
                world.refresh = job
            case CloseClient(code=code):
                check(world.stopping and not world.closed, f"the client closed ({code})", trail)
                world.closed = True
            case EndSession():
                check(world.stopping or world.left, "the session ended on its own", trail)
                world.ended = True
            case Log() | ToolsChanged():
                pass
    check(not logged, f"backend_failed logged without a stop: {logged}", trail)


def start(world: World, key: BackendKey, *, respawn: bool, trail: list[str]) -> None:
    service = key.service
    check(not world.stopping, f"{service} started after shutdown", trail)
    check(not world.left, f"{service} started after the client left", trail)
    alive = [
        b
        for b in world.boxes.values()
        if b.service == service and b.state in ("starting", "running")
    ]
    if service in PER_CALL:
        # One per call: never more starts than calls (a call does not get a second one).
        starts = sum(1 for b in world.boxes.values() if b.service == service)
        calls = sum(1 for c in TOOL_CALL_IDS if c in world.sent)
        check(starts < calls, f"{service} started more containers than its calls", trail)
    elif service in REFRESH:
        # Beside a retired one only, still finishing its calls (the machine's current is new).
        counted = world.machine.all_backends
        serving = [
            b.seq
            for b in alive
            if (backend := counted.get(BackendKey(service, b.seq))) is not None
            and backend.role is Role.CURRENT
        ]
        check(not serving, f"{service} started while its container {serving} serves", trail)
    else:
        check(not alive, f"{service} started while it has a container", trail)
    check(key.seq not in world.boxes, f"{key} started twice", trail)
    had = service not in PER_CALL and any(
        b.service == service and b.ran for b in world.boxes.values()
    )
    check(respawn == had, f"{service} started, respawn={respawn}, had={had}", trail)
    world.boxes[key.seq] = Box(key.seq, service)


def stop(world: World, action: StopBackend, logged: list[str], trail: list[str]) -> None:
    key, reason = action.key, action.reason
    box = world.boxes.get(key.seq)
    check(box is not None, f"a stop of {key}, which never started", trail)
    assert box is not None
    if reason == EXITED:
        check(box.state == "gone", f"{key} stopped as exited, still running", trail)
    else:
        check(box.state in ("starting", "running"), f"a stop of {key}, {box.state}", trail)
    # (removed at once when it stopped reading or exited; else given a moment to exit)
    graceful = reason not in (CONTAINER_UNRESPONSIVE, EXITED)
    check(action.graceful == graceful, f"{key} {reason}, graceful={action.graceful}", trail)
    if reason not in (
        IDLE, SESSION_ENDED, CALL_DONE, NOT_NEEDED, REFRESH_CALLS, REFRESH_AGE, REFRESH_MEMORY
    ):  # fmt: skip
        check(key.service in logged, f"{key} stopped ({reason}), not logged", trail)
        logged.remove(key.service)
        box.logged += 1
        check(box.logged == 1, f"{key} logged backend_failed twice", trail)
    if action.report_workspace:
        # (its recording is reported once it is removed: a step of the world's)
        check(key.service in ISOLATED, f"{key} stopped for a workspace, not isolated", trail)
        check(box.answered != (), f"{key} stopped for a workspace, no answer held", trail)
        box.owed = True
    if box.state != "gone":
        box.state = "stopped"
    if world.current.get(key.service) == key.seq:
        del world.current[key.service]


def client_receives(world: World, message: dict[str, Any], trail: list[str]) -> None:
    if message.get("error", {}).get("data", {}).get("reason") == DUPLICATE:
        refused = world.duplicated and not world.duplicate_refused
        check(refused, f"{message['id']} refused as a duplicate it was not", trail)
        world.duplicate_refused = True
    elif "method" in message and "id" in message:
        world.asks.append(message["id"])
    elif message.get("method") == "notifications/cancelled":
        # The machine withdrew a question of a container's (unanswered in time).
        withdrawn = message["params"]["requestId"]
        if withdrawn in world.asks:
            world.asks.remove(withdrawn)
    elif "id" in message and "method" not in message:
        answer_id = message["id"]
        check(answer_id in world.sent, f"an answer to unknown id {answer_id}", trail)
        check(answer_id not in world.cancelled, f"{answer_id} answered after its cancel", trail)
        world.answers[answer_id] = world.answers.get(answer_id, 0) + 1
        check(world.answers[answer_id] == 1, f"{answer_id} answered twice", trail)
        world.answered_with[answer_id] = "error" if "error" in message else "result"
        if "result" in message:
            workspace_checks(world, answer_id, message["result"], trail)


def workspace_checks(world: World, call_id: Any, result: Any, trail: list[str]) -> None:
    """A container's answer to a call of an isolated service goes out only once its copy's
    recording is reported, naming it (or why nothing was recorded); any other answer names
    no workspace."""
    served = [box for box in world.boxes.values() if call_id in box.answered]
    workspace = result.get("structuredContent", {}).get("workspace")
    if not served or served[0].service not in ISOLATED:
        check(workspace is None, f"{call_id} answered naming a workspace it has none of", trail)
        return
    [box] = served
    check(box.reported is not None, f"{call_id} answered before its copy was recorded", trail)
    check(workspace is not None, f"{call_id} answered without its workspace", trail)
    assert workspace is not None
    named = "failed" if workspace.get("error") else "recorded"
    check(named == box.reported, f"{call_id} answered {named}, {box.reported}", trail)
    check(workspace.get("branch") == (RECORDED["branch"] if named == "recorded" else None),
          f"{call_id} answered naming another branch", trail)  # fmt: skip


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
    if got is None and call_id in world.cancelled:
        expected = "cancelled"
    else:
        expected = {"result": "ok", "error": "error", None: "no_answer"}[got]
    check(call.outcome == expected, f"{call_id} recorded {call.outcome} ({got})", trail)
    if expected == "no_answer":
        check(world.left, f"{call_id} recorded without an answer, its client still there", trail)


def receive_line(world: World, box: Box, message: dict[str, Any], trail: list[str]) -> None:
    """A line the machine wrote to ``box``'s stdin."""
    method = message.get("method")
    name = f"{box.service} ({box.seq})"
    if method is None:
        check(message.get("id") == box.ask, f"{name} got an answer it did not ask", trail)
        box.ask_answers += 1
        check(box.ask_answers == 1, f"{name}'s request answered twice", trail)
        return
    if method == "initialize":
        check(not box.greeted, f"{name} greeted twice", trail)
        box.greeted = True
    else:
        check(box.greeted, f"{name} got {method} before the machine's initialize", trail)
    if method == "notifications/initialized":
        check(not box.initialized, f"{name} told initialized twice", trail)
        box.initialized = True
    elif "id" in message and method != "initialize":
        check(box.initialized, f"{name} got {method} before the handshake was done", trail)
    if method == "tools/call":
        client_id = message["params"]["arguments"]["call"]
        waiting = client_id not in world.answers and client_id not in world.cancelled
        check(waiting, f"call {client_id} reached {name} after the client's wait ended", trail)
        world.reached[client_id] = world.reached.get(client_id, 0) + 1
        check(world.reached[client_id] == 1, f"call {client_id} reached a container twice", trail)
        box.calls += 1
        box.call_ids = (*box.call_ids, (message["id"], client_id))
        if box.service in PER_CALL:
            check(box.calls == 1, f"{name} got a second call", trail)
        check(not box.over, f"{name} got a call after it was measured over its threshold", trail)
    if "id" in message:
        box.received.append((message["id"], method))


Step = tuple[str, Callable[[World], list[Action]]]


def enabled(world: World) -> list[Step]:
    """The events that can happen next in this world (each feeds the machine, returns what it
    did)."""
    if world.left:
        return []
    steps: list[Step] = []
    # The driver reads the client only while the machine accepts (no stdin over the bound).
    reading = world.machine.accepting
    if world.next_frame < len(SCRIPT) and reading:
        steps.append(("send", send_next))
    if world.asks and reading:
        steps.append(("answer-server", answer_server))
    if DUPLICATES and not world.duplicated and in_flight(world, AGAIN) and reading:
        steps.append(("send-again", send_again))
    if len(world.cancelled) < CANCELS and reading:
        steps += [
            (f"cancel-{call_id}", partial(cancel, call_id=call_id))
            for call_id in TOOL_CALL_IDS
            if in_flight(world, call_id)
        ]
    unlucky = world.misfortunes < MISFORTUNES
    for box in world.boxes.values():
        steps += box_steps(world, box, unlucky=unlucky)
    if world.refresh is not None:
        steps.append(("refresh-runs", partial(refreshed, ran=True)))
        steps.append(("refresh-fails", partial(refreshed, ran=False)))
    if world.machine.deadline is not None:
        steps.append(("tick", tick))
    steps.append(("client-leaves", leave))
    if not world.stopping:
        steps.append(("shutdown", shutdown))
    return steps


def in_flight(world: World, call_id: int) -> bool:
    return call_id in world.sent and call_id not in world.answers and call_id not in world.cancelled


def box_steps(world: World, box: Box, *, unlucky: bool) -> list[Step]:
    seq = box.seq
    measured_steps: list[Step] = []
    if box.measuring:
        # (the driver reports a figure whatever became of the container meanwhile)
        for name, memory in (("over", OVER_THRESHOLD), ("under", UNDER_THRESHOLD), ("none", None)):
            measured_steps.append(
                (f"measured-{name}-{seq}", partial(measured, seq=seq, memory=memory))
            )
    return measured_steps + _box_steps(world, box, unlucky=unlucky)


def _box_steps(world: World, box: Box, *, unlucky: bool) -> list[Step]:
    seq = box.seq
    steps: list[Step] = []
    if box.owed and box.reported is None:
        # (the driver removed it, recorded its copy and reports that, or that it failed)
        steps.append((f"recorded-{seq}", partial(workspace_recorded, seq=seq, failed=False)))
        if unlucky:
            steps.append((f"record-fails-{seq}", partial(workspace_recorded, seq=seq, failed=True)))
    return steps + _container_steps(world, box, unlucky=unlucky)


def _container_steps(world: World, box: Box, *, unlucky: bool) -> list[Step]:
    seq = box.seq
    if box.state == "starting":
        steps: list[Step] = [(f"started-{seq}", partial(started, seq=seq))]
        if unlucky:
            steps.append((f"start-fails-{seq}", partial(start_fails, seq=seq)))
        return steps
    if box.state == "stopped" and not box.late:
        # Its reader saw it end before the driver's stop took effect: the machine ignores it.
        return [(f"late-exit-{seq}", partial(late_exit, seq=seq))]
    if box.state != "running":
        return []  # gone: the driver feeds nothing more of it
    steps = []
    if box.unreported and OWN_BACKLOG is not None:
        steps.append((f"written-{seq}", partial(written, seq=seq)))
    if box.received:
        if box.received[0][1] == "initialize" and unlucky:
            steps.append((f"refuses-handshake-{seq}", partial(answers, seq=seq, error=True)))
        steps.append((f"answers-{seq}", partial(answers, seq=seq, error=False)))
    if box.initialized and box.ask is None and world.asked < ASKS:
        for method in ASK_METHODS:
            steps.append((f"asks-{method}-{seq}", partial(asks, seq=seq, method=method)))
    if box.initialized and not box.changed and world.changes < CHANGES:
        steps.append((f"tools-changed-{seq}", partial(tools_changed, seq=seq)))
    if unlucky:
        steps.append((f"dies-{seq}", partial(dies, seq=seq)))
        if BREAKS:
            steps.append((f"breaks-{seq}", partial(dies, seq=seq, broken=True)))
    return steps


# --- the client -------------------------------------------------------------------------------


def send_next(world: World) -> list[Action]:
    frame = SCRIPT[world.next_frame]
    world.next_frame += 1
    message = json.loads(frame)
    if "id" in message:
        world.sent.append(message["id"])
    return world.feed(ClientFrame(frame))


def send_again(world: World) -> list[Action]:
    """The client sends its first tool call again, under the same id, while it is in flight."""
    world.duplicated = True
    return world.feed(ClientFrame(SCRIPT[AGAIN]))


def cancel(world: World, call_id: int) -> list[Action]:
    world.cancelled.append(call_id)
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": call_id}}
    return world.feed(ClientFrame(json.dumps(note).encode()))


def answer_server(world: World) -> list[Action]:
    ask_id = world.asks.pop(0)
    answer = {"role": "assistant", "content": {"type": "text", "text": "yes"}, "model": "m"}
    frame = json.dumps({"jsonrpc": "2.0", "id": ask_id, "result": answer}).encode()
    return world.feed(ClientFrame(frame))


def leave(world: World) -> list[Action]:
    world.left = True
    return world.feed(ClientGone())


def shutdown(world: World) -> list[Action]:
    world.stopping = True
    return world.feed(Shutdown(ORCHESTRATOR_STOPPING))


# --- the containers ---------------------------------------------------------------------------


def started(world: World, seq: int) -> list[Action]:
    box = world.boxes[seq]
    box.state = "running"
    box.ran = True
    if box.service not in PER_CALL:
        world.current[box.service] = seq
    key = BackendKey(box.service, seq)
    return world.feed(BackendStarted(key, workspace=box.service in ISOLATED))


def start_fails(world: World, seq: int) -> list[Action]:
    world.misfortunes += 1
    box = world.boxes[seq]
    box.state = "gone"
    error = ContainerStartFailure("no", reason="image_not_found")
    return world.feed(BackendStartFailed(BackendKey(box.service, seq), error))


def written(world: World, seq: int) -> list[Action]:
    box = world.boxes[seq]
    nbytes, box.unreported = box.unreported, 0
    return world.feed(StdinWritten(BackendKey(box.service, seq), nbytes))


def answers(world: World, seq: int, *, error: bool) -> list[Action]:
    box = world.boxes[seq]
    answer_id, method = box.received.pop(0)
    body: dict[str, Any]
    if error:
        world.misfortunes += 1
        body = {"error": {"code": -32603, "message": "no"}}
    elif method == "initialize":
        capabilities = {"tools": {"listChanged": True}}
        info = {"name": box.service, "version": "0"}
        body = {"result": {"protocolVersion": "2025-06-18", "capabilities": capabilities,
                           "serverInfo": info}}  # fmt: skip
    elif method == "tools/list":
        tools = [{"name": "echo", "description": "echoes"}, {"name": "more", "description": "+"}]
        body = {"result": {"tools": tools}}
    else:
        body = {"result": {"content": [{"type": "text", "text": "echo"}]}}
        box.answered = (*box.answered, dict(box.call_ids).get(answer_id))
    line = json.dumps({"jsonrpc": "2.0", "id": answer_id, **body}).encode()
    return world.feed(BackendLine(BackendKey(box.service, seq), line))


def measure(world: World, key: BackendKey, trail: list[str]) -> None:
    """The machine asks for a container's memory: only between calls."""
    box = world.boxes.get(key.seq)
    check(box is not None and box.state == "running", f"{key} measured, not running", trail)
    assert box is not None
    check(key.service in REFRESH, f"{key} measured, not smart_refresh", trail)
    check(not box.measuring, f"{key} measured twice at once", trail)
    asking = box.ask is not None and box.ask_answers == 0  # its own request unanswered
    # (a call the client cancelled is over for the machine, whatever the server still does)
    calls = dict(box.call_ids)
    busy = [i for i, _method in box.received if calls.get(i) not in world.cancelled]
    check(not busy and not asking, f"{key} measured under a call in flight", trail)
    box.measuring = True


def measured(world: World, seq: int, memory: int | None) -> list[Action]:
    box = world.boxes[seq]
    box.measuring = False
    if memory is not None and memory > (REFRESHED.memory_threshold or 0):
        box.over = True
    return world.feed(BackendMeasured(BackendKey(box.service, seq), memory))


def asks(world: World, seq: int, method: str) -> list[Action]:
    box = world.boxes[seq]
    box.ask = f"ask-{seq}"
    world.asked += 1
    params = {"messages": [], "maxTokens": 1} if method.startswith("sampling") else None
    line = json.dumps(request(box.ask, method, params)).encode()
    return world.feed(BackendLine(BackendKey(box.service, seq), line))


def tools_changed(world: World, seq: int) -> list[Action]:
    box = world.boxes[seq]
    box.changed = True
    world.changes += 1
    line = json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}).encode()
    return world.feed(BackendLine(BackendKey(box.service, seq), line))


def dies(world: World, seq: int, *, broken: bool = False) -> list[Action]:
    """The container exits (or writes a line too long to relay: the driver's reader ends)."""
    world.misfortunes += 1
    box = world.boxes[seq]
    box.state = "gone"
    world.current.pop(box.service, None)
    key = BackendKey(box.service, seq)
    if broken:
        return world.feed(BackendBroken(key, CONTAINER_OUTPUT_INVALID, "a line over the limit"))
    return world.feed(BackendExited(key, 1))


def late_exit(world: World, seq: int) -> list[Action]:
    """A container the machine stopped reports its end: nothing is owed to it, nothing done."""
    box = world.boxes[seq]
    box.late = True
    return world.feed(BackendExited(BackendKey(box.service, seq), 137))


def workspace_recorded(world: World, seq: int, *, failed: bool) -> list[Action]:
    """The driver removed an isolated container and recorded its copy (or could not)."""
    box = world.boxes[seq]
    key = BackendKey(box.service, seq)
    if failed:
        world.misfortunes += 1
        box.reported = "failed"
        return world.feed(WorkspaceRecorded(key, None, "git fast-import: no"))
    box.reported = "recorded"
    return world.feed(WorkspaceRecorded(key, dict(RECORDED)))


def refreshed(world: World, *, ran: bool) -> list[Action]:
    """The driver ran the refresh in a worker thread (or it failed, or was given up)."""
    refresh = world.refresh
    assert refresh is not None
    world.refresh = None
    result: Refreshed | None = None
    if ran:
        result = RESULTS.get(refresh)
        if result is None:
            result = RESULTS[refresh] = refresh.run()
    return world.feed(Computed(refresh, result))


def tick(world: World) -> list[Action]:
    deadline = world.machine.deadline
    assert deadline is not None
    world.now = max(world.now, deadline)
    return world.feed(Tick())


# --- exploring --------------------------------------------------------------------------------


def settled(world: World) -> bool:
    """Nothing is under way: no start, no request at a container, no refresh, no question."""
    return (
        world.refresh is None
        and not world.asks
        and not any(box.owed and box.reported is None for box in world.boxes.values())
        and not any(box.measuring for box in world.boxes.values())
        and all(
            box.state in ("gone", "stopped") or (box.state == "running" and not box.received)
            for box in world.boxes.values()
        )
    )


def per_call_checks(world: World, trail: list[str]) -> None:
    """Before shutdown and the client's leaving: every per-call container runs as one the
    machine counts on, and none is left once nothing is under way (its call is over)."""
    running = [b for b in world.boxes.values() if b.service in PER_CALL and b.state == "running"]
    for box in running:
        counted = BackendKey(box.service, box.seq) in world.machine.all_backends
        check(counted, f"{box.service} ({box.seq}) left running, forgotten", trail)
    spent = [box.seq for box in running]
    check(not (spent and settled(world)), f"per-call {spent} left running, calls over", trail)


def refresh_checks(world: World, trail: list[str]) -> None:
    """Before shutdown and the client's leaving: a refreshed service's running containers are
    all counted on, and once nothing is under way only its current one runs (a retired one
    went when its calls ended)."""
    for box in world.boxes.values():
        if box.service not in REFRESH or box.state != "running":
            continue
        key = BackendKey(box.service, box.seq)
        check(key in world.machine.all_backends, f"{key} left running, forgotten", trail)
        current = world.machine.backends.get(box.service)
        retired = current is None or current.key != key
        check(not (retired and settled(world)), f"{key} retired, left running", trail)


def state_checks(world: World, trail: list[str]) -> None:
    """In every state reached."""
    refused = world.duplicate_refused and world.duplicate_recorded
    check(world.duplicated == refused, "a duplicate not refused at once", trail)
    if not world.stopping and not world.left:
        per_call_checks(world, trail)
        for service in SERVICES:
            box = world.running(service)
            backend = world.machine.backends.get(service)
            forgotten = box is not None and (backend is None or backend.key.seq != box.seq)
            if service in REFRESH and box is not None:
                # A retired one runs until its calls end: counted on, not current.
                forgotten = BackendKey(service, box.seq) not in world.machine.all_backends
            check(not forgotten, f"{service}'s container left running, forgotten", trail)
        refresh_checks(world, trail)
        # The client is read exactly while no container has more than the bound waiting:
        # written and not reported (the model's count), or waiting for its start (the
        # machine's queue: which calls wait is checked by their answers, not modelled).
        bound = BUFFER if BUFFER is not None else 1 << 40
        waiting = {
            backend.key.seq: sum(len(w.line) for w in backend.queue)
            for backend in world.machine.all_backends.values()
        }
        unreported = {
            box.seq: box.unreported for box in world.boxes.values() if box.state == "running"
        }
        room = all(
            unreported.get(seq, 0) + waiting.get(seq, 0) <= bound
            for seq in unreported.keys() | waiting.keys()
        )
        check(world.machine.accepting == room, f"accepting={not room} wrongly", trail)
    if world.stopping:
        check(world.closed and world.ended, "a shutdown that did not end the session", trail)
    if world.left:
        for call_id in TOOL_CALL_IDS:
            if call_id in world.sent:
                check(call_id in world.recorded, f"tool call {call_id} never recorded", trail)
        return
    if world.stopping or settled(world):
        for request_id in world.sent:
            if request_id not in world.cancelled:
                check(request_id in world.answers, f"{request_id} never answered", trail)
        for call_id in TOOL_CALL_IDS:
            if call_id in world.sent:
                check(call_id in world.recorded, f"tool call {call_id} not recorded", trail)


def advance(world: World, step: Callable[[World], list[Action]], trail: list[str]) -> None:
    """One step: the event fed to the machine (``step``), the world playing its part, the
    checks."""
    apply(world, step(world), trail)
    state_checks(world, trail)


def explore() -> int:
    """Visit every reachable state once; the number visited."""
    own_backlog = OWN_BACKLOG if OWN_BACKLOG is not None else 1 << 40
    machine = fabric_server(
        CATALOG,
        session_id="s",
        version="0",
        exposure="all",
        idle_timeouts=dict.fromkeys(SERVICES, IDLE_SECONDS),
        count_tokens=lambda _definition: 1,
        own_backlog_bytes=own_backlog,
        buffer_to_server_bytes=BUFFER if BUFFER is not None else 1 << 40,
        stall_timeout=STALL,
        lifecycles={
            **{service: Lifecycle("fresh_per_call") for service in PER_CALL},
            **dict.fromkeys(REFRESH, REFRESHED),
        },
        isolated=frozenset(ISOLATED),
    )
    return orderings.explore(World(machine), enabled, advance, max_states=MAX_STATES)


def configure(monkeypatch: pytest.MonkeyPatch, **settings: object) -> None:
    module = sys.modules[__name__]
    for name, value in settings.items():
        assert hasattr(module, name), name
        monkeypatch.setattr(module, name, value)


ONE_SERVICE = [*SCRIPT[:3], _call(3, "alpha")]  # both calls to one service: queued, respawned
ISOLATED_STATES, MIXED_STATES = 45_000, 6_000


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("settings", "at_least"),
    [
        # starts that fail, refused handshakes, deaths, cancels, idle, racing the calls and stop
        ({"MISFORTUNES": 2, "CANCELS": 1}, 5_000),
        # the first call sent again at any moment it is in flight (or cancelled meanwhile)
        ({"MISFORTUNES": 1, "CANCELS": 1, "DUPLICATES": True}, 7_000),
        # a container's sampling request through the client: answers, expiry, deaths, cancels
        ({"MISFORTUNES": 1, "CANCELS": 1, "ASKS": 1, "ASK_METHODS": ("sampling/createMessage",)},
         22_000),
        # roots answered by the machine, to a container that may leave its stdin unread
        ({"MISFORTUNES": 1, "ASKS": 1, "OWN_BACKLOG": 300}, 15_000),
        # the same with a bound on all that waits for a stdin (the client not read past it),
        # and containers that break their output
        ({"MISFORTUNES": 1, "ASKS": 1, "OWN_BACKLOG": 300, "BUFFER": 300, "BREAKS": True},
         15_000),
        # containers whose stdin stops moving (writes reported, or not, at any moment) while
        # calls, roots answers and idle deadlines race the stall deadline
        ({"MISFORTUNES": 1, "ASKS": 1, "OWN_BACKLOG": 300, "STALL": 45.0}, 15_000),
        # tools/list_changed: the list asked, the refresh run or failed, racing everything
        ({"MISFORTUNES": 1, "CANCELS": 1, "CHANGES": 1}, 19_000),
        ({"CHANGES": 2}, 3_000),  # both services' refreshes, one at a time
        # both calls to one service: queued behind one start, respawned after idle or death
        ({"SCRIPT": ONE_SERVICE, "MISFORTUNES": 2, "CANCELS": 1, "DUPLICATES": True, "ASKS": 1},
         5_000),
        # both calls to a fresh_per_call service: a container each, at once; sampling through
        # the client keeping one alive; cancels, deaths, refused handshakes, shutdown
        ({"SCRIPT": ONE_SERVICE, "PER_CALL": ("alpha",), "MISFORTUNES": 1, "CANCELS": 1,
          "ASKS": 1, "ASK_METHODS": ("sampling/createMessage",), "CHANGES": 1}, 35_000),
        # both calls to a smart_refresh service: measured between calls (over, under, no
        # figure, late), retired for its memory, its calls or its age, racing the second call,
        # cancels, deaths, sampling, idle, shutdown
        ({"SCRIPT": ONE_SERVICE, "REFRESH": ("alpha",), "MISFORTUNES": 1, "CANCELS": 1,
          "ASKS": 1, "ASK_METHODS": ("sampling/createMessage",)}, 50_000),
        # both calls to an isolated per-call service: each answer held until its container's
        # copy is recorded (or the recording fails), racing cancels, deaths, sampling through
        # the client, shutdown and the client's leaving
        ({"SCRIPT": ONE_SERVICE, "PER_CALL": ("alpha",), "ISOLATED": ("alpha",),
          "MISFORTUNES": 1, "CANCELS": 1, "ASKS": 1, "ASK_METHODS": ("sampling/createMessage",)},
         ISOLATED_STATES),
        # an isolated per-call service beside a shared one: only the first's answers wait
        ({"PER_CALL": ("alpha",), "ISOLATED": ("alpha",), "MISFORTUNES": 1, "CANCELS": 1},
         MIXED_STATES),
    ],
    ids=["misfortunes", "repeated-id", "sampling", "roots-unread", "stdin-bound", "stdin-stalls",
         "tools-changed", "two-refreshes", "one-service", "per-call", "smart-refresh", "isolated",
         "isolated-beside-shared"],
)  # fmt: skip
def test_every_reachable_state_of_a_fabric_session_keeps_the_invariants(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, object], at_least: int
) -> None:
    configure(monkeypatch, **settings)
    # The whole space was visited (it is this large because every event is tried everywhere).
    assert explore() >= at_least


def plant(monkeypatch: pytest.MonkeyPatch, method: str, planted: Callable[..., Any]) -> None:
    """Break the machine's ``method``, in the outermost of its parts that has it."""
    parts = (FabricServer, FabricRouter, BackendTable, Roster)
    part = next(c for c in parts if method in vars(c))
    monkeypatch.setattr(part, method, planted(getattr(part, method)))


def answering_twice(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """A machine that answers again what a dead container owed."""

    def answer_twice(
        self: BackendTable, key: BackendKey, error: ContainerStartFailure
    ) -> list[Action]:
        owed = [f.client_id for f in self.exchanges.forwarded.values() if f.key == key]
        actions = original(self, key, error)
        return actions + [self.replies.error(client_id, error) for client_id in owed if client_id]

    return answer_twice


def ending_as_before(_original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """The machine before the fix: answer_all answered and forgot the calls, and went on."""

    def answer_all(self: FabricServer, error: ContainerStartFailure) -> list[Action]:
        actions = self.router.exchanges.end(error)
        actions += [self.replies.result(id_, ended) for id_, ended in self.lists.end()]
        return self.replies.with_done(actions)

    return answer_all


def keeping_a_refused_backend(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """The machine before the fix: a backend that refused the handshake was forgotten only."""

    def handshake_done(
        self: BackendTable, key: BackendKey, message: dict[str, Any]
    ) -> list[Action]:
        actions = original(self, key, message)
        return [a for a in actions if not isinstance(a, StopBackend | Log)]

    return handshake_done


def heeding_stale_backends(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """The driver's check moved into the machine, left out: an event of any container of a
    service is taken as one of its current container."""

    def backend_event(self: FabricRouter, event: Any) -> list[Action]:
        backend = self.table.roster.current.get(event.key.service)
        if backend is not None:
            event = dataclasses.replace(event, key=backend.key)
        return original(self, event)

    return backend_event


def counting_no_writes(_original: Callable[..., Any]) -> Callable[..., Any]:
    """What the driver wrote is never taken off the machine's count."""

    def written(self: Roster, backend: Any, nbytes: int, now: float) -> None:
        pass

    return written


def logging_twice(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """The driver logged an unresponsive backend's stop a second time (fixed in 1e92e1c): here,
    the machine logs each failure twice."""

    def stop(self: BackendTable, key: BackendKey, reason: str, logged: str | None = None) -> Any:
        actions = original(self, key, reason, logged)
        return [*[a for a in actions if isinstance(a, Log)], *actions]

    return stop


def starting_after_shutdown(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """A shutdown that closes the client but leaves the machine serving."""

    def shutdown(self: FabricServer, reason: str) -> list[Action]:
        actions = original(self, reason)
        self.router.table.ending = None
        return actions

    return shutdown


@pytest.mark.parametrize(
    ("method", "planted", "caught"),
    [
        ("_backend_failed", answering_twice, "answered twice"),
        ("answer_all", ending_as_before, "after shutdown|after the client.s wait ended|ended"),
        ("handshake_done", keeping_a_refused_backend, "left running, forgotten"),
        ("_stop", logging_twice, "logged backend_failed twice|logged without a stop"),
        ("_shutdown", starting_after_shutdown, "started after shutdown|after the session ended"),
    ],
    ids=[
        "answers-twice",
        "goes-on-after-shutdown",
        "keeps-a-refused-backend",
        "logs-twice",
        "starts-after-shutdown",
    ],
)
def test_the_checker_catches_a_broken_fabric_machine(
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    planted: Callable[[Callable[..., list[Action]]], Callable[..., list[Action]]],
    caught: str,
) -> None:
    # The invariants must be able to fail: break the machine, and exploring finds it.
    plant(monkeypatch, method, planted)
    configure(monkeypatch, MISFORTUNES=1)
    with pytest.raises(Violation, match=caught):
        explore()


def test_the_checker_catches_a_machine_that_heeds_a_stopped_containers_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (both calls to one service: a container stopped, and the next one started meanwhile)
    plant(monkeypatch, "backend_event", heeding_stale_backends)
    configure(monkeypatch, SCRIPT=ONE_SERVICE, MISFORTUNES=1)
    with pytest.raises(Violation, match=r"stop of|stopped as exited|not running"):
        explore()


def test_the_checker_catches_a_machine_that_never_takes_written_bytes_off_its_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plant(monkeypatch, "written", counting_no_writes)
    configure(monkeypatch, MISFORTUNES=0, ASKS=1, OWN_BACKLOG=300, BUFFER=300)
    with pytest.raises(Violation, match="accepting"):
        explore()


def test_a_clone_of_the_machine_is_independent_and_fingerprinted_alike() -> None:
    machine = fabric_server(CATALOG, session_id="s", count_tokens=lambda _d: 1)
    for frame in SCRIPT:
        machine.handle(ClientFrame(frame), 0.0)
    twin = machine.clone()
    assert twin.fingerprint() == machine.fingerprint()
    alpha = machine.backends["alpha"].key
    [handshake] = [a for a in twin.handle(BackendStarted(alpha), 1.0) if isinstance(a, ToBackend)]
    assert twin.fingerprint() != machine.fingerprint()
    assert machine.backends["alpha"].state is BackendState.STARTING
    assert len(machine.backends["alpha"].queue) == 1
    assert machine.backends["alpha"].stdin.pending == 0
    assert twin.backends["alpha"].state is BackendState.HANDSHAKING
    assert twin.backends["alpha"].stdin.pending == len(handshake.data)
    assert json.loads(handshake.data)["method"] == "initialize"


@pytest.mark.parametrize(
    ("method", "planted", "caught"),
    [
        ("settle", lambda _original: lambda _self: [], "left running, calls over"),
        ("lifecycle", lambda _original: lambda _self, _service: Lifecycle(), "got a second call"),
    ],
    ids=["keeps-spent-containers", "shares-one-container"],
)
def test_the_checker_catches_a_per_call_service_kept_or_shared(
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    planted: Callable[[Callable[..., list[Action]]], Callable[..., Any]],
    caught: str,
) -> None:
    # A machine that leaves a per-call container running after its call, or that gives both
    # calls one container: exploring finds it.
    plant(monkeypatch, method, planted)
    configure(monkeypatch, SCRIPT=ONE_SERVICE, PER_CALL=("alpha",), MISFORTUNES=0)
    with pytest.raises(Violation, match=caught):
        explore()


def measuring_under_calls(_original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """A machine that measures a smart_refresh container whenever it is ready, calls or not."""

    def measure(self: BackendTable) -> list[Action]:
        actions: list[Action] = []
        for backend in self.roster.current.values():
            if backend.ready and not backend.measuring:
                backend.measuring = True
                actions.append(MeasureBackend(backend.key))
        return actions

    return measure


def heeding_no_figure(_original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """A machine that sends the calls that waited for the figure, whatever it is."""

    def backend_measured(self: FabricRouter, event: BackendMeasured) -> list[Action]:
        backend = self.table.roster.all.get(event.key)
        if backend is None or not backend.measuring:
            return []
        backend.measuring = False
        return self.table.send_queue(event.key, backend)

    return backend_measured


@pytest.mark.parametrize(
    ("method", "planted", "caught"),
    [
        ("measure_between_calls", measuring_under_calls, "measured under a call in flight"),
        ("backend_measured", heeding_no_figure, "got a call after it was measured over"),
    ],
    ids=["measures-under-a-call", "ignores-the-figure"],
)
def test_the_checker_catches_a_smart_refresh_service_measured_under_a_call_or_kept_over(
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    planted: Callable[[Callable[..., list[Action]]], Callable[..., Any]],
    caught: str,
) -> None:
    plant(monkeypatch, method, planted)
    configure(monkeypatch, SCRIPT=ONE_SERVICE, REFRESH=("alpha",), MISFORTUNES=0)
    with pytest.raises(Violation, match=caught):
        explore()


def answering_at_once(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """A machine that passes an isolated container's answer on as it comes (none held)."""

    def backend_answer(self: FabricRouter, key: BackendKey, message: Any) -> list[Action]:
        backend = self.table.roster.all.get(key)
        if backend is not None:
            backend.workspace = False
        return original(self, key, message)

    return backend_answer


def recording_unasked(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """A machine that holds the answer but never asks for its container's copy to be
    recorded (the driver reports nothing)."""

    def stop(self: BackendTable, key: BackendKey, reason: str, logged: str | None = None) -> Any:
        return [
            dataclasses.replace(a, report_workspace=False) if isinstance(a, StopBackend) else a
            for a in original(self, key, reason, logged)
        ]

    return stop


def forgetting_held_answers(_original: Callable[..., Any]) -> Callable[..., Any]:
    """A session end that leaves the held answers unanswered."""

    def end(self: Any) -> list[Any]:
        self._held.clear()
        return []

    return end


@pytest.mark.parametrize(
    ("part", "method", "planted", "caught"),
    [
        (FabricRouter, "_backend_answer", answering_at_once, "before its copy was recorded"),
        (BackendTable, "_stop", recording_unasked, "never answered"),
        (HeldAnswers, "end", forgetting_held_answers, "never answered"),
    ],
    ids=["answers-at-once", "never-asks-for-the-record", "forgets-held-answers"],
)
def test_the_checker_catches_an_isolated_answer_sent_early_or_never(
    monkeypatch: pytest.MonkeyPatch,
    part: type,
    method: str,
    planted: Callable[[Callable[..., Any]], Callable[..., Any]],
    caught: str,
) -> None:
    monkeypatch.setattr(part, method, planted(getattr(part, method)))
    configure(
        monkeypatch, SCRIPT=ONE_SERVICE, PER_CALL=("alpha",), ISOLATED=("alpha",), MISFORTUNES=0
    )
    with pytest.raises(Violation, match=caught):
        explore()
