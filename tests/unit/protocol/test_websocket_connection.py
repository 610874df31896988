"""A WebSocket connection's state machine (protocol/websocket_connection.py): what it answers to
every event in every state, the close handshake's stories, and every ordering of events up to
the end of the connection checked against its invariants."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from reactor_fabric.protocol.events import Log, Tick
from reactor_fabric.protocol.websocket_connection import (
    PING_PAYLOAD,
    Action,
    CloseRequested,
    Deliver,
    Drained,
    Event,
    Finish,
    Lost,
    PingDue,
    SendClose,
    SendPing,
    SendPong,
    Violation,
    WebSocketConnection,
    WebSocketState,
)
from reactor_fabric.protocol.websocket_frames import BinaryMessage, Close, Ping, Pong, TextMessage
from tests import orderings
from tests.orderings import check

OPEN = WebSocketState.OPEN
BY_US = WebSocketState.CLOSING_BY_US
BY_PEER = WebSocketState.CLOSING_BY_PEER
CLOSED = WebSocketState.CLOSED
GONE = WebSocketState.GONE
TIMEOUT = 5.0


def connection() -> WebSocketConnection:
    return WebSocketConnection(close_timeout=TIMEOUT)


def run(machine: WebSocketConnection, *events: Event, now: float = 0.0) -> list[Action]:
    actions: list[Action] = []
    for event in events:
        actions += machine.handle(event, now)
    return actions


# How each state is reached from a new connection (ours: 4001, theirs: 4002).
REACHED: dict[str, tuple[Event, ...]] = {
    "open": (),
    "closing by us, ours queued": (CloseRequested(4001, "ours"),),
    "closing by us, ours written": (CloseRequested(4001, "ours"), Drained()),
    "closing by peer": (Close(4002, "theirs"),),
    "closed": (Close(4002, "theirs"), Drained()),
    "gone": (Lost(),),
}

EVENTS: dict[str, Event] = {
    "text": TextMessage(b'{"id":1}'),
    "binary": BinaryMessage(),
    "ping": Ping(b"p"),
    "pong": Pong(b"p"),
    "close": Close(4003, "bye"),
    "close without a code": Close(None, ""),
    "violation": Violation(1002, "client frames must be masked"),
    "close requested": CloseRequested(1011, "internal error"),
    "finish": Finish(),
    "ping due": PingDue(),
    "drained": Drained(),
    "lost": Lost(),
    "tick": Tick(),
}

MASKED = Log("info", "websocket_closing", {"code": 1002, "detail": "client frames must be masked"})
BINARY = Log(
    "info", "websocket_closing", {"code": 1003, "detail": "binary frames are not supported"}
)
SAME: WebSocketState | None = None  # the state does not change

# Every state by every event: (actions, the state after; _ when unchanged).
TABLE: dict[str, dict[str, tuple[list[Action], WebSocketState | None]]] = {
    "open": {
        "text": ([Deliver(b'{"id":1}')], SAME),
        "binary": ([BINARY, SendClose(1003, "binary frames are not supported")], BY_US),
        "ping": ([SendPong(b"p")], SAME),
        "pong": ([], SAME),
        "close": ([SendClose(4003, "")], BY_PEER),
        "close without a code": ([SendClose(1000, "")], BY_PEER),
        "violation": ([MASKED, SendClose(1002, "client frames must be masked")], BY_US),
        "close requested": ([SendClose(1011, "internal error")], BY_US),
        "finish": ([SendClose(1000, "")], BY_US),
        "ping due": ([SendPing(PING_PAYLOAD)], SAME),
        "drained": ([], SAME),
        "lost": ([], GONE),
        "tick": ([], SAME),
    },
    "closing by us, ours queued": {
        "text": ([], SAME),
        "binary": ([BINARY], SAME),
        "ping": ([SendPong(b"p")], SAME),
        "pong": ([], SAME),
        "close": ([], BY_PEER),
        "close without a code": ([], BY_PEER),
        "violation": ([MASKED], SAME),
        "close requested": ([], SAME),
        "finish": ([], SAME),
        "ping due": ([], SAME),
        "drained": ([], SAME),  # ours is out now: see the next row
        "lost": ([], GONE),
        "tick": ([], SAME),
    },
    "closing by us, ours written": {
        "text": ([], SAME),
        "binary": ([BINARY], SAME),
        "ping": ([SendPong(b"p")], SAME),
        "pong": ([], SAME),
        "close": ([], CLOSED),
        "close without a code": ([], CLOSED),
        "violation": ([MASKED], SAME),
        "close requested": ([], SAME),
        "finish": ([], SAME),
        "ping due": ([], SAME),
        "drained": ([], SAME),
        "lost": ([], GONE),
        "tick": ([], SAME),
    },
    "closing by peer": {
        **{name: ([], SAME) for name in EVENTS},
        "drained": ([], CLOSED),
        "lost": ([], GONE),
    },
    "closed": {name: ([], SAME) for name in EVENTS},
    "gone": {name: ([], SAME) for name in EVENTS},
}

# What the trio layer may do in each state: receive() reads, send() queues, finish() reads for
# the client's Close, the writer writes, TCP may close.
MAY: dict[WebSocketState, tuple[bool, bool, bool, bool, bool]] = {
    OPEN: (True, True, False, True, False),
    BY_US: (False, False, True, True, False),
    BY_PEER: (False, False, False, True, False),
    CLOSED: (False, False, False, True, True),
    GONE: (False, False, False, False, True),
}


def test_the_table_names_every_state_and_every_kind_of_event() -> None:
    kinds = set(typing.get_args(Event))
    assert {type(event) for event in EVENTS.values()} == kinds
    reached = set()
    for events in REACHED.values():
        machine = connection()
        run(machine, *events)
        reached.add(machine.state)
    assert reached == set(WebSocketState)
    assert set(TABLE) == set(REACHED)
    assert all(set(row) == set(EVENTS) for row in TABLE.values())
    assert set(MAY) == set(WebSocketState)


@pytest.mark.parametrize(
    ("start", "event"), [(start, event) for start in TABLE for event in EVENTS]
)
def test_every_event_in_every_state_is_answered_as_the_table_says(start: str, event: str) -> None:
    machine = connection()
    run(machine, *REACHED[start])
    before = machine.state
    expected_actions, expected_state = TABLE[start][event]
    assert machine.handle(EVENTS[event], 1.0) == expected_actions
    assert machine.state is (before if expected_state is None else expected_state)


@pytest.mark.parametrize("start", list(REACHED))
def test_what_the_trio_layer_may_do_follows_the_state_alone(start: str) -> None:
    machine = connection()
    run(machine, *REACHED[start])
    assert (
        machine.receiving,
        machine.sending,
        machine.awaiting_close,
        machine.connected,
        machine.done,
    ) == MAY[machine.state]


def test_the_clients_close_is_answered_with_its_code_and_nothing_it_sends_after_is_read() -> None:
    machine = connection()
    assert run(machine, Close(4000, "done"), TextMessage(b"late"), Ping(b"p")) == [
        SendClose(4000, "")
    ]
    assert machine.close_code == 4000
    assert not machine.receiving
    assert not machine.sending
    assert not machine.awaiting_close
    assert not machine.done  # our answer is still to be written
    run(machine, Drained())
    assert machine.done


def test_the_clients_close_while_ours_is_queued_ends_the_handshake_once_ours_is_out() -> None:
    machine = connection()
    assert run(machine, CloseRequested(1001, "orchestrator stopping")) == [
        SendClose(1001, "orchestrator stopping")
    ]
    assert run(machine, Close(1001, "")) == []  # no second Close: ours answers theirs
    assert machine.state is BY_PEER
    assert not machine.done
    run(machine, Drained())
    assert machine.state is CLOSED
    assert machine.close_code == 1001


def test_a_close_from_the_client_after_ours_was_written_ends_the_handshake_at_once() -> None:
    machine = connection()
    run(machine, Finish(), Drained())
    assert machine.awaiting_close
    assert not machine.done
    run(machine, Close(1000, ""))
    assert machine.state is CLOSED


def test_messages_after_any_close_reach_nobody() -> None:
    for first in (CloseRequested(1000), Close(1000, ""), BinaryMessage(), Lost()):
        machine = connection()
        run(machine, first)
        assert run(machine, TextMessage(b"late")) == []


def test_messages_before_a_binary_frame_are_delivered_and_those_after_are_not() -> None:
    machine = connection()
    actions = run(machine, TextMessage(b"1"), BinaryMessage(), TextMessage(b"2"))
    assert [a for a in actions if isinstance(a, Deliver)] == [Deliver(b"1")]


def test_a_second_close_is_nothing_and_the_first_code_stays() -> None:
    machine = connection()
    assert run(machine, CloseRequested(1008, "policy")) == [SendClose(1008, "policy")]
    assert run(machine, CloseRequested(1000, "again"), Finish(1011, "finish")) == []
    assert machine.close_code == 1008


def test_a_protocol_violation_while_closing_is_logged_and_sends_no_second_close() -> None:
    machine = connection()
    run(machine, CloseRequested(1000))
    assert run(machine, Violation(1007, "invalid UTF-8")) == [
        Log("info", "websocket_closing", {"code": 1007, "detail": "invalid UTF-8"})
    ]
    assert machine.close_code == 1000


def test_a_client_that_never_answers_our_close_is_cut_at_the_bound() -> None:
    machine = connection()
    run(machine, Finish(1000, ""), Drained(), now=10.0)
    assert machine.deadline == 10.0 + TIMEOUT
    run(machine, Tick(), now=10.0 + TIMEOUT - 0.001)
    assert machine.state is BY_US  # not yet
    run(machine, Tick(), now=10.0 + TIMEOUT)
    assert machine.state is GONE
    assert machine.done


def test_the_bound_runs_from_the_finish_not_from_an_earlier_close() -> None:
    machine = connection()
    run(machine, CloseRequested(1000), now=0.0)
    assert machine.deadline is None  # the session may still be tearing down
    run(machine, Tick(), now=100.0)
    assert machine.state is BY_US
    run(machine, Finish(), now=100.0)
    assert machine.deadline == 100.0 + TIMEOUT


def test_a_finish_after_the_handshake_or_the_connection_ended_arms_nothing() -> None:
    for events in ((Close(1000, ""), Drained()), (Lost(),)):
        machine = connection()
        run(machine, *events)
        assert run(machine, Finish()) == []
        assert machine.deadline is None
        assert machine.done


def test_pings_are_sent_only_while_open_and_pongs_until_the_clients_close() -> None:
    machine = connection()
    assert run(machine, PingDue()) == [SendPing(PING_PAYLOAD)]
    run(machine, CloseRequested(1000))
    assert run(machine, PingDue()) == []
    assert run(machine, Ping(b"x")) == [SendPong(b"x")]
    run(machine, Close(1000, ""))
    assert run(machine, Ping(b"y")) == []


# --- every ordering -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What happened on the way to a state (part of what the invariants judge)."""

    closes_sent: int = 0
    client_closed: bool = False
    written_since_our_close: bool = False


STEPS: dict[str, Event] = {name: event for name, event in EVENTS.items() if name != "tick"}


@dataclass
class Point:
    """A connection at a moment, and what happened on the way there."""

    machine: WebSocketConnection
    now: float
    facts: Seen

    def clone(self) -> Point:
        return Point(self.machine.clone(), self.now, self.facts)

    def key(self) -> tuple[object, ...]:
        return (self.machine.fingerprint(self.now), self.facts)


Step = tuple[Event, float]


def enabled(point: Point) -> list[tuple[str, Step]]:
    """Every event, now; time jumping to the handshake's deadline; a tick."""
    steps = [(name, (event, point.now)) for name, event in STEPS.items()]
    deadline = point.machine.deadline
    if deadline is not None and point.now < deadline:
        steps.append(("the bound passes", (Tick(), deadline)))
    steps.append(("tick", (Tick(), point.now)))
    return steps


def advance(point: Point, step: Step, trail: list[str]) -> None:
    event, point.now = step
    before = point.machine.state
    actions = point.machine.handle(event, point.now)
    point.facts = _judge(point.machine, before, event, actions, point.facts, point.now, trail)


def explore(make: Callable[[], WebSocketConnection]) -> int:
    """Every state reachable from a new connection by any ordering of events (time jumping to
    the handshake's deadline being one of them), each step checked; the number of states."""
    return orderings.explore(Point(make(), 0.0, Seen()), enabled, advance)


def _judge(
    machine: WebSocketConnection,
    before: WebSocketState,
    event: Event,
    actions: list[Action],
    facts: Seen,
    now: float,
    trail: list[str],
) -> Seen:
    closes = [a for a in actions if isinstance(a, SendClose)]
    sends = [a for a in actions if isinstance(a, SendClose | SendPing | SendPong)]
    facts = Seen(
        closes_sent=facts.closes_sent + len(closes),
        client_closed=facts.client_closed or (isinstance(event, Close) and before is not GONE),
        written_since_our_close=facts.written_since_our_close
        or (facts.closes_sent > 0 and isinstance(event, Drained)),
    )
    check(facts.closes_sent <= 1, "our Close is sent once at most", trail)
    for close in closes:
        check(close.code == machine.close_code, "close_code is the code sent", trail)
    if before is not OPEN:
        check(
            not any(isinstance(a, Deliver | SendPing) for a in actions),
            "nothing is delivered nor pinged after a close",
            trail,
        )
    if before in (BY_PEER, CLOSED, GONE):
        check(sends == [], "nothing is sent after the client's Close or once gone", trail)
    if before in (CLOSED, GONE):
        check(actions == [] and machine.state is before, "an ended connection stays so", trail)
    if machine.state is CLOSED:
        check(
            facts.closes_sent == 1 and facts.client_closed and facts.written_since_our_close,
            "closed only once both Close frames went through",
            trail,
        )
    if machine.deadline is not None and now >= machine.deadline and isinstance(event, Tick):
        check(machine.done, "nothing is awaited past the bound", trail)
    check(
        machine.sending == machine.receiving == (machine.state is OPEN),
        "messages flow both ways while open, and only then",
        trail,
    )
    return facts


@pytest.mark.exhaustive
def test_every_ordering_of_events_keeps_the_close_handshakes_invariants() -> None:
    assert explore(connection) > len(WebSocketState)


def test_the_ordering_checker_catches_a_connection_that_closes_twice() -> None:
    class ClosesTwice(WebSocketConnection):
        def handle(self, event: Event, now: float) -> list[Action]:
            if isinstance(event, CloseRequested) and self.state is BY_US:
                return [SendClose(event.code, event.reason)]
            return super().handle(event, now)

    with pytest.raises(AssertionError, match="our Close is sent once at most"):
        explore(lambda: ClosesTwice(close_timeout=TIMEOUT))


def test_the_ordering_checker_catches_a_connection_that_waits_past_its_bound() -> None:
    class Patient(WebSocketConnection):
        def handle(self, event: Event, now: float) -> list[Action]:
            if isinstance(event, Tick):
                return []
            return super().handle(event, now)

    with pytest.raises(AssertionError, match="nothing is awaited past the bound"):
        explore(lambda: Patient(close_timeout=TIMEOUT))
