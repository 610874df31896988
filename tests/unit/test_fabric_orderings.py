"""Every ordering of the events a fabric-endpoint session can see, explored exhaustively.

A model world surrounds the pure machine (:class:`FabricServer`) as its driver does
(``trio/fabric_session.py``): a client with a short script (initialize, initialized, a call to
each of two services' tools) that answers the requests it is sent, may cancel a call and may
send its first call again while it is in flight (under the same id); a model container per
service, started when the machine asks, that starts or fails to start, takes the handshake the
machine drives, answers in order, refuses the handshake, asks something of its own (roots,
which the machine answers, or sampling, which goes to the client), says its tools changed (the
machine asks for its list, and the world runs the catalog refresh it is given, or fails it),
dies mid-call, and takes its stdin (the machine's own bytes reported written); a clock that
jumps to the machine's next deadline; the client leaving (the driver's last word); and the
orchestrator stopping (``answer_all`` with ``orchestrator_stopping``, as the driver does), after
which the driver still feeds what comes until it ends the session. From every reachable state
every enabled event is tried (states seen before are not explored again: they behave alike),
and after every step the invariants below must hold.

Invariants:

- every request the client sent is answered at most once, and, unless it cancelled it, exactly
  once whenever nothing more is under way (no start, answer, refresh or question pending), and
  at once when the orchestrator stops; a cancelled call is not answered afterwards;
- every tool call gets one audit record, exactly once in the end, with the outcome the client
  saw: ``ok`` after a result, ``error`` after an error, ``cancelled`` when it cancelled first,
  ``no_answer`` only when it left first;
- a container is started only for a service that has none running, and never once the
  orchestrator is stopping or the client gone; nothing is written to a container that has not
  started or is gone; it is greeted (initialize) before anything else, and gets no request
  before the handshake is done; each of its own requests is answered at most once; a container
  the machine forgets (refused handshake, unread stdin, idle) is removed, never left running;
- a client request reaches a container only while the client waits on it (not answered, not
  cancelled), and at most once;
- a request sent again under an id in flight is refused at once (``duplicate_request_id``), never
  reaches a container, gets a record of its own, and leaves the first one's answer and record as
  they would have been;
- at most one catalog refresh runs at a time.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from reactor_fabric._errors import ContainerStartFailure
from reactor_fabric._reasons import ORCHESTRATOR_STOPPING
from reactor_fabric.protocol.answers import container_exited, session_ending
from reactor_fabric.protocol.catalog import Catalog, service_catalog
from reactor_fabric.protocol.fabric_refresh import Refresh, Refreshed
from reactor_fabric.protocol.fabric_server import (
    Action,
    FabricServer,
    StartBackend,
    StopBackend,
    ToBackend,
    ToClient,
    ToolsChanged,
)
from reactor_fabric.protocol.tool_calls import ToolCall, ToolCallDone
from tests.messages import INITIALIZED, request
from tests.orderings import LazyTrail, Trail, Violation, check

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
# and the driver's reports of them written are not modelled).
OWN_BACKLOG: int | None = None
MAX_STATES = 1_000_000
# Each refresh's result, computed once (the same Refresh is shared by the worlds that hold it).
RESULTS: dict[Refresh, Refreshed] = {}


class Clock:
    """The machine's clock: the world's time."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Box:
    """A model container of one service."""

    seq: int
    service: str
    state: str = "starting"  # starting → running → gone (failed, stopped, dead)
    received: list[tuple[Any, str]] = field(default_factory=list)  # (id, method) to answer
    greeted: bool = False  # got the machine's initialize
    initialized: bool = False  # got notifications/initialized
    unreported: int = 0  # the machine's own bytes written, not yet reported
    ask: str | None = None  # its own request, once sent
    ask_answers: int = 0
    changed: bool = False  # sent its list_changed

    def key(self) -> tuple[object, ...]:
        return (
            self.seq, self.service, self.state, tuple(self.received), self.greeted,
            self.initialized, self.unreported, self.ask, self.ask_answers, self.changed,
        )  # fmt: skip


@dataclass
class World:
    machine: FabricServer
    clock: Clock
    next_frame: int = 0
    next_seq: int = 0
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

    def clone(self) -> World:
        twin = copy.copy(self)
        twin.clock = Clock(self.clock.now)
        twin.machine = self.machine.clone()
        twin.machine.clock = twin.clock
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
            self.clock.now,
            self.next_frame,
            self.next_seq,
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
        )

    def running(self, service: str) -> Box | None:
        """The service's container as the driver knows it (started, not gone)."""
        box = self.boxes.get(self.current.get(service, -1))
        return box if box is not None and box.state == "running" else None


def apply(world: World, actions: list[Action], trail: list[str]) -> None:
    """What the driver does with the machine's actions, checking them as it goes."""
    for action in actions:
        match action:
            case StartBackend(service=service):
                check(not world.stopping, f"{service} started after shutdown", trail)
                check(not world.left, f"{service} started after the client left", trail)
                alive = [
                    b for b in world.boxes.values() if b.service == service and b.state != "gone"
                ]
                check(not alive, f"{service} started while it has a container", trail)
                world.boxes[world.next_seq] = Box(world.next_seq, service)
                world.next_seq += 1
            case ToBackend(service=service, data=data, own=own):
                box = world.running(service)
                check(box is not None, f"a write to {service}, which has no container", trail)
                assert box is not None
                if own:
                    box.unreported += len(data) + 1
                receive_line(world, box, json.loads(data), trail)
            case StopBackend(service=service):
                box = world.running(service)
                check(box is not None, f"a stop of {service}, which has no container", trail)
                assert box is not None
                box.state = "gone"
                del world.current[service]
            case ToClient(data=data):
                client_receives(world, json.loads(data), trail)
            case ToolCallDone(call=call):
                recorded(world, call, trail)
            case Refresh() as refresh:
                check(world.refresh is None, "a refresh while one runs", trail)
                world.refresh = refresh
            case ToolsChanged():
                pass


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
    if "id" in message:
        box.received.append((message["id"], method))


Step = tuple[str, Callable[[World], list[Action]]]


def enabled(world: World) -> list[Step]:
    """The events that can happen next in this world (each feeds the machine, returns what it
    did)."""
    if world.left:
        return []
    steps: list[Step] = []
    if world.next_frame < len(SCRIPT):
        steps.append(("send", send_next))
    if world.asks:
        steps.append(("answer-server", answer_server))
    if DUPLICATES and not world.duplicated and in_flight(world, AGAIN):
        steps.append(("send-again", send_again))
    if len(world.cancelled) < CANCELS:
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
    if box.state == "starting":
        steps: list[Step] = [(f"started-{seq}", partial(started, seq=seq))]
        if unlucky:
            steps.append((f"start-fails-{seq}", partial(start_fails, seq=seq)))
        return steps
    if box.state != "running" or world.current.get(box.service) != seq:
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
    return steps


# --- the client -------------------------------------------------------------------------------


def send_next(world: World) -> list[Action]:
    frame = SCRIPT[world.next_frame]
    world.next_frame += 1
    message = json.loads(frame)
    if "id" in message:
        world.sent.append(message["id"])
    return world.machine.client_message(frame)


def send_again(world: World) -> list[Action]:
    """The client sends its first tool call again, under the same id, while it is in flight."""
    world.duplicated = True
    return world.machine.client_message(SCRIPT[AGAIN])


def cancel(world: World, call_id: int) -> list[Action]:
    world.cancelled.append(call_id)
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": call_id}}
    return world.machine.client_message(json.dumps(note).encode())


def answer_server(world: World) -> list[Action]:
    ask_id = world.asks.pop(0)
    answer = {"role": "assistant", "content": {"type": "text", "text": "yes"}, "model": "m"}
    return world.machine.client_message(
        json.dumps({"jsonrpc": "2.0", "id": ask_id, "result": answer}).encode()
    )


def leave(world: World) -> list[Action]:
    world.left = True
    return world.machine.client_gone()


def shutdown(world: World) -> list[Action]:
    world.stopping = True
    return world.machine.answer_all(session_ending(ORCHESTRATOR_STOPPING))


# --- the containers ---------------------------------------------------------------------------


def started(world: World, seq: int) -> list[Action]:
    box = world.boxes[seq]
    box.state = "running"
    world.current[box.service] = seq
    return world.machine.backend_started(box.service)


def start_fails(world: World, seq: int) -> list[Action]:
    world.misfortunes += 1
    box = world.boxes[seq]
    box.state = "gone"
    error = ContainerStartFailure("no", reason="image_not_found")
    return world.machine.backend_failed(box.service, error)


def written(world: World, seq: int) -> list[Action]:
    box = world.boxes[seq]
    nbytes, box.unreported = box.unreported, 0
    world.machine.backend_read(box.service, nbytes)
    return []


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
    line = json.dumps({"jsonrpc": "2.0", "id": answer_id, **body}).encode()
    return world.machine.backend_message(box.service, line)


def asks(world: World, seq: int, method: str) -> list[Action]:
    box = world.boxes[seq]
    box.ask = f"ask-{seq}"
    world.asked += 1
    params = {"messages": [], "maxTokens": 1} if method.startswith("sampling") else None
    line = json.dumps(request(box.ask, method, params)).encode()
    return world.machine.backend_message(box.service, line)


def tools_changed(world: World, seq: int) -> list[Action]:
    box = world.boxes[seq]
    box.changed = True
    world.changes += 1
    line = json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}).encode()
    return world.machine.backend_message(box.service, line)


def dies(world: World, seq: int) -> list[Action]:
    world.misfortunes += 1
    box = world.boxes[seq]
    box.state = "gone"
    del world.current[box.service]
    error = container_exited(box.service, 1, False, [], service=box.service)
    return world.machine.backend_failed(box.service, error)


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
    return world.machine.refreshed(refresh, result)


def tick(world: World) -> list[Action]:
    deadline = world.machine.deadline
    assert deadline is not None
    world.clock.now = max(world.clock.now, deadline)
    return world.machine.tick()


# --- exploring --------------------------------------------------------------------------------


def settled(world: World) -> bool:
    """Nothing is under way: no start, no request at a container, no refresh, no question."""
    return (
        world.refresh is None
        and not world.asks
        and all(
            box.state == "gone" or (box.state == "running" and not box.received)
            for box in world.boxes.values()
        )
    )


def state_checks(world: World, trail: list[str]) -> None:
    """In every state reached."""
    refused = world.duplicate_refused and world.duplicate_recorded
    check(world.duplicated == refused, "a duplicate not refused at once", trail)
    if not world.stopping and not world.left:
        for service in SERVICES:
            forgotten = world.running(service) is not None and service not in world.machine.backends
            check(not forgotten, f"{service}'s container left running, forgotten", trail)
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


def explore() -> int:
    """Visit every reachable state once; the number visited."""
    clock = Clock()
    own_backlog = OWN_BACKLOG if OWN_BACKLOG is not None else 1 << 40
    machine = FabricServer(
        CATALOG,
        session_id="s",
        version="0",
        exposure="all",
        idle_timeouts=dict.fromkeys(SERVICES, IDLE_SECONDS),
        clock=clock,
        count_tokens=lambda _definition: 1,
        own_backlog_bytes=own_backlog,
    )
    start = World(machine, clock)
    stack: list[tuple[World, Trail]] = [(start, None)]
    seen: set[tuple[object, ...]] = {start.key()}
    while stack:
        world, trail_node = stack.pop()
        for name, step in enabled(world):
            successor = world.clone()
            successor_trail: Trail = (name, trail_node)
            step_trail = LazyTrail(successor_trail)
            apply(successor, step(successor), step_trail)
            state_checks(successor, step_trail)
            key = successor.key()
            if key not in seen:
                seen.add(key)
                assert len(seen) < MAX_STATES, "the state space is larger than expected"
                stack.append((successor, successor_trail))
    return len(seen)


def configure(monkeypatch: pytest.MonkeyPatch, **settings: object) -> None:
    module = sys.modules[__name__]
    for name, value in settings.items():
        assert hasattr(module, name), name
        monkeypatch.setattr(module, name, value)


ONE_SERVICE = [*SCRIPT[:3], _call(3, "alpha")]  # both calls to one service: queued, respawned


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
        # tools/list_changed: the list asked, the refresh run or failed, racing everything
        ({"MISFORTUNES": 1, "CANCELS": 1, "CHANGES": 1}, 19_000),
        ({"CHANGES": 2}, 3_000),  # both services' refreshes, one at a time
        # both calls to one service: queued behind one start, respawned after idle or death
        ({"SCRIPT": ONE_SERVICE, "MISFORTUNES": 2, "CANCELS": 1, "DUPLICATES": True, "ASKS": 1},
         5_000),
    ],
    ids=["misfortunes", "repeated-id", "sampling", "roots-unread", "tools-changed",
         "two-refreshes", "one-service"],
)  # fmt: skip
def test_every_reachable_state_of_a_fabric_session_keeps_the_invariants(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, object], at_least: int
) -> None:
    configure(monkeypatch, **settings)
    # The whole space was visited (it is this large because every event is tried everywhere).
    assert explore() >= at_least


def answering_twice(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """A machine that answers again what a dead container owed."""

    def answer_twice(
        self: FabricServer, service: str, error: ContainerStartFailure
    ) -> list[Action]:
        owed = [f.client_id for f in self._forwarded.values() if f.service == service]
        actions = original(self, service, error)
        return actions + [self._error(client_id, error) for client_id in owed if client_id]

    return answer_twice


def ending_as_before(_original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """The machine before the fix: answer_all answered and forgot the calls, and went on."""

    def answer_all(self: FabricServer, error: ContainerStartFailure) -> list[Action]:
        return self._with_done(self._answer_all(error))

    return answer_all


def keeping_a_refused_backend(original: Callable[..., list[Action]]) -> Callable[..., list[Action]]:
    """The machine before the fix: a backend that refused the handshake was forgotten only."""

    def handshake_done(self: FabricServer, service: str, message: dict[str, Any]) -> list[Action]:
        return [a for a in original(self, service, message) if not isinstance(a, StopBackend)]

    return handshake_done


@pytest.mark.parametrize(
    ("method", "planted", "caught"),
    [
        ("_backend_failed", answering_twice, "answered twice"),
        ("answer_all", ending_as_before, "after shutdown|after the client's wait ended"),
        ("_handshake_done", keeping_a_refused_backend, "left running, forgotten"),
    ],
    ids=["answers-twice", "goes-on-after-shutdown", "keeps-a-refused-backend"],
)
def test_the_checker_catches_a_broken_fabric_machine(
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    planted: Callable[[Callable[..., list[Action]]], Callable[..., list[Action]]],
    caught: str,
) -> None:
    # The invariants must be able to fail: break the machine, and exploring finds it.
    monkeypatch.setattr(FabricServer, method, planted(getattr(FabricServer, method)))
    configure(monkeypatch, MISFORTUNES=1)
    with pytest.raises(Violation, match=caught):
        explore()


def test_a_clone_of_the_machine_is_independent_and_fingerprinted_alike() -> None:
    clock = Clock()
    machine = FabricServer(CATALOG, session_id="s", clock=clock, count_tokens=lambda _d: 1)
    for frame in SCRIPT:
        machine.client_message(frame)
    twin = machine.clone()
    assert twin.fingerprint() == machine.fingerprint()
    [handshake] = [a for a in twin.backend_started("alpha") if isinstance(a, ToBackend)]
    assert twin.fingerprint() != machine.fingerprint()
    assert machine.backends["alpha"].state == "starting"
    assert len(machine.backends["alpha"].queue) == 1
    assert twin.backends["alpha"].state == "handshaking"
    assert json.loads(handshake.data)["method"] == "initialize"
