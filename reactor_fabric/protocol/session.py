"""The relay session as a state machine: events in, actions out, no I/O.

One :class:`SessionMachine` exists per client session of the per-service relay. It makes every
decision of the session — whether a client frame is written to the container now or waits,
when a container is spawned, replaying the MCP handshake to a fresh one, idle teardown, what
happens when a container dies, what each request in flight is answered with, shutdown — from
the events the one trio driver (:mod:`reactor_fabric.trio.driver`) feeds it, in the vocabulary
of :mod:`.events` (the fabric endpoint's machine speaks it too). The driver only moves bytes and
runs the actions it is given, in order.

The machine is composed of two parts, each a module: the session's requests
(:class:`~.relay_requests.RelayRequests`: the ledger both ways, the tool calls, what waits, the
answers owed) and its container (:class:`~.relay_container.RelayContainer`: the container
events, writes, the handshake replay, the lifecycle and the deadlines). The machine itself keeps
the client's side, the server's lines relayed to it, shutdown, and which part each event is
for.

Its backends are containers of its one service, numbered (``BackendKey.seq``) in the order the
machine asks for them, each a :class:`~.backend.Backend` moving along the one state table of
:mod:`.backend` (the fabric endpoint's too): STARTING, HANDSHAKING while the client's
``initialize`` is replayed to it (straight to READY with no handshake to replay), READY, and
STOPPED when it died, broke, went idle or is no longer needed. At most one is *current*; events
about any other are ignored.

Client frames go straight to stdin only when a container is READY and nothing waits before
them; otherwise they wait, in order, bounded in bytes (:attr:`SessionMachine.accepting`). A
container that stopped reading its stdin is replaced (``container_unresponsive``) by the one rule
of :mod:`.backend` (:meth:`~.backend.StdinBook.stalled` and the bound on the machine's own
messages it leaves unread).

The container's lifecycle (:class:`Lifecycle`, the service's ``container_strategy``) decides
what happens *between calls* — the moments the container has nothing in flight (no client
request awaiting its answer, no request of its own awaiting the client): ``reuse_per_session``
keeps it (until idle); ``fresh_per_call`` retires it once it has served a request other than
the handshake (``call_done``); ``smart_refresh`` retires it once it served
``max_calls_per_container`` calls, is older than ``max_container_age``, or uses more memory than
``memory_threshold`` (measured between calls: :class:`MeasureBackend`, the client's next frames
wait for the figure). Never under a request in flight: requests sent while one is in flight
share its container. The next client request gets a fresh container, the client's
``initialize`` replayed first, as after idle teardown.

A request id stands for one request in flight per direction: a client request under an id still
waiting or owed an answer, or a server request under an id still awaiting the client, is refused
(-32600 ``duplicate_request_id``) and goes no further (the call in flight keeps its own answer
and its one audit record).

Under a suite lock (``orchestrator.lock`` warn or enforce) the server's lists are checked and its
responses matched to the client's requests before they go on (:mod:`.relay_lock`). Without
one, the relay decodes no list and forwards every message byte for byte.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
from typing import Any

import msgspec

from .._errors import FabricError, InvalidMessage, InvalidRequest
from .._reasons import SESSION_ENDED, TOO_MANY_REQUESTS_IN_FLIGHT
from .agent_slots import AgentSlots
from .answers import (
    CLOSE_NORMAL,
    ENDED_BY_OPERATOR,
    log_notification,
    session_ending,
)
from .backend import CALL_METHODS, Backend, BackendState
from .call_rates import UserCallRate
from .catalog import Redact, unredacted
from .client_lease import ClientLease
from .events import (
    Action,
    BackendBroken,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendMeasured,
    BackendStarted,
    BackendStartFailed,
    ClientActivity,
    ClientFrame,
    ClientGone,
    ClientRegistered,
    CloseClient,
    Computed,
    EndSession,
    Event,
    Log,
    Shutdown,
    StartBackend,
    StdinWritten,
    StopBackend,
    Tick,
    ToClient,
    WorkspaceRecorded,
)
from .input_waits import INPUT_WAIT_SECONDS, asks_for_input
from .jsonrpc import REQUEST, RESPONSE, Peek, error_response, peek
from .ledger import CANCELLED, Ledger, cancelled_request_id
from .relay_container import RelayContainer
from .relay_lock import RelayLock
from .relay_requests import RelayRequests
from .served import Served
from .settings import RelaySettings
from .suite_lock import withheld_error
from .tool_calls import TOOLS_CALL, ToolCallDone
from .workspace_answers import BASE_NEEDS_ISOLATED, BASE_ON_RELAY, names_base


class Phase(enum.Enum):
    OPEN = "open"
    ENDED = "ended"


class SessionMachine:
    """Every decision of one relay session (see the module docstring): its client side, and
    the session's :class:`~.relay_requests.RelayRequests` and
    :class:`~.relay_container.RelayContainer` as parts."""

    def __init__(
        self,
        settings: RelaySettings,
        *,
        service_name: str,
        now: float,
        session_id: str = "",
        client_lease: float | None = None,
        agent_slots: AgentSlots | None = None,
        redact: Redact = unredacted,
        call_rate: UserCallRate | None = None,
    ) -> None:
        self.service_name = service_name
        # Its signed-in user's tool calls a minute (None: no limit; see .call_rates).
        self.call_rate = call_rate
        # An llm_agent service's session: its calls are agent calls, counted in the
        # orchestrator's shared slots under the session's id (None: not an agent).
        self.session_id = session_id
        self.agent_slots = agent_slots
        # The suite lock's checks of the server's lists and answers (None: no lock is on; see
        # .relay_lock).
        lock, lock_mode = settings.lock, settings.lock_mode
        self.lock_check = (
            RelayLock(service_name, lock, lock_mode, redact)
            if lock is not None and lock_mode != "off"
            else None
        )
        self.lifecycle = settings.lifecycle
        self.isolated = settings.isolated
        self.agent = settings.agent
        self.limits = limits = settings.limits
        self.server_request_timeout = (
            limits.server_request_timeout
            if limits.server_request_timeout is not None
            else settings.idle_timeout
        )
        self.phase = Phase.OPEN
        self.requests = RelayRequests(limits, settings.audit_arguments)
        # Which container served which request, bounded (see .served).
        self.served = Served()
        self.container = RelayContainer(
            settings, service_name=service_name, requests=self.requests, served=self.served, now=now
        )
        self.lease = ClientLease(client_lease, now)  # (see .client_lease)

    # --- what the driver asks ---------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event; the actions to carry out, in order."""
        if self.phase is Phase.ENDED:
            return []
        self.container.now = now
        # (looked up by name: a method replaced on the class, as the model checker's tests
        # break the machine, is the one called)
        kind = type(event)
        name = _CLIENT_SIDE.get(kind)
        target: object = self
        if name is None:
            name, target = _CONTAINER_SIDE[kind], self.container
        actions: list[Action] = getattr(target, name)(event, now)
        # (checked here, a set lookup each: a call of _note_served per event was a good part of
        # a relayed call's bookkeeping, and it is usually about none of these)
        served = kind in _SERVED_EVENTS
        for action in actions:
            if type(action) in _SERVED_ACTIONS:
                served = True
                break
        if served:
            self._note_served(event, actions, now)
        if self.agent_slots is not None:
            # Counted from the state after every event: every way a call ends frees its slot.
            self.agent_slots.hold(self.session_id, self.agent_calls)
        return actions

    @property
    def agent_calls(self) -> int:
        """The session's agent calls in flight: calls sent to the container and not answered
        yet, and calls waiting for it (none once the session ended)."""
        if self.agent_slots is None or self.phase is Phase.ENDED:
            return 0
        return self.requests.agent_calls()

    def _note_served(self, event: Event, actions: list[Action], now: float) -> None:
        """Which container served which request (``/api/sessions``, the status page): its
        start asked, its name once started, its stop and why, read off what was decided
        (called when the event or an action is one of these)."""
        if type(event) in _SERVED_EVENTS:
            if isinstance(event, BackendStarted):
                self.served.started(event.key, event.container, now)
            elif isinstance(event, BackendStartFailed):
                self.served.ended(event.key, event.error.reason, now)
        for action in actions:
            if type(action) in _SERVED_ACTIONS:
                if isinstance(action, StartBackend):
                    self.served.asked(action.key, self.lifecycle.strategy, now)
                elif isinstance(action, StopBackend):
                    self.served.ended(action.key, action.reason, now)

    def abandon(self, now: float) -> list[Action]:
        """The session is over without the machine ending it: the calls never answered."""
        return [ToolCallDone(call) for call in self.requests.calls.abandon(now)]

    @property
    def buffered_to_server(self) -> int:
        """Bytes waiting for the container, or written to its stdin and not yet reported done."""
        slot = self.container.slot
        pending = slot.stdin.pending if slot is not None else 0
        return self.requests.waiting.bytes + pending

    @property
    def accepting(self) -> bool:
        """Whether the driver may read the client's next frame (bytes buffered under the bound)."""
        return self.buffered_to_server < self.limits.to_server_bytes

    @property
    def deadline(self) -> float | None:
        """When the machine next needs a Tick (None: not before another event)."""
        deadline = self.container.deadline()
        expiry = self.requests.ledger.next_expiry()
        if expiry is not None and expiry < deadline:
            deadline = expiry
        lease = self.lease.deadline
        if lease is not None and lease < deadline:
            deadline = lease
        return None if deadline == math.inf else deadline

    def clone(self) -> SessionMachine:
        """An independent copy of the machine in its current state (for model checking)."""
        twin = copy.copy(self)
        twin.requests = self.requests.clone()
        twin.served = self.served.clone()
        twin.container = self.container.clone(twin.requests, twin.served)
        twin.lease = dataclasses.replace(self.lease)
        twin.lock_check = self.lock_check.clone() if self.lock_check is not None else None
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """A hashable summary of the whole state: equal fingerprints behave alike (used to
        explore every reachable state once when model-checking the machine)."""
        return (
            self.phase,
            self.requests.fingerprint(),
            self.container.fingerprint(),
            self.lease.state(),
            None if self.lock_check is None else self.lock_check.fingerprint(),
        )

    @property
    def current(self) -> BackendKey | None:
        slot = self.container.slot
        return slot.key if slot is not None else None

    @property
    def container_state(self) -> BackendState | None:
        slot = self.container.slot
        return slot.state if slot is not None else None

    # --- client side --------------------------------------------------------------------------

    def _client_frame(self, event: ClientFrame, now: float) -> list[Action]:
        self.container.last_activity = now
        self.lease.touch(now)
        try:
            message = event.message or peek(event.frame)
        except InvalidMessage as exc:
            return [
                Log("info", "client_message_refused", {"code": exc.code, "reason": exc.reason}),
                ToClient(error_response(exc.request_id, exc), error=(exc.code, exc.reason)),
            ]
        done: list[Action] = []
        if message.kind == REQUEST:
            refused = self._admit(message, event.frame, now)
            if refused is not None:
                return refused
        elif message.method == CANCELLED:
            cancelled = cancelled_request_id(message)
            # An answer held for its workspace is not sent any more (the relay is transparent
            # otherwise: what a container answers after a cancellation goes on).
            self.requests.held.withdraw(lambda request_id: request_id == cancelled)
            call = (
                self.requests.calls.cancelled(cancelled, now) if self.requests.calls.open else None
            )
            if call is not None:
                done.append(ToolCallDone(call))
        return self._route(message, event.frame, done, now)

    def _admit(self, message: Peek, frame: bytes, now: float) -> list[Action] | None:
        """A client request's refusal, if it is refused: an id already in flight, a call the
        suite lock withholds, one request too many, no agent slot free (None: it goes on)."""
        assert message.id is not None
        requests = self.requests
        if requests.holds(message.id):
            return requests.refuse_duplicate(message, frame, now)
        if message.method == TOOLS_CALL:
            requests.calls.begin_params(message.id, message.params, len(frame), now)
            refused = _call_refusal(self, message, now)
            if refused is not None:
                return requests.error_to_client(message.id, refused, now)
        if requests.full:
            refusal = InvalidRequest(
                f"this session already has {self.limits.max_in_flight} requests in flight",
                reason=TOO_MANY_REQUESTS_IN_FLIGHT,
            )
            return requests.error_to_client(message.id, refusal, now)
        if self.agent_slots is not None and message.method in CALL_METHODS:
            busy = self.agent_slots.refusal(self.session_id, self.agent_calls, self.service_name)
            if busy is not None:
                limits = {"limit": busy.detail["limit"], "scope": busy.detail["scope"]}
                return [
                    Log("info", "agent_call_refused", limits),
                    *requests.error_to_client(message.id, busy, now),
                ]
        return None

    def _route(self, message: Peek, frame: bytes, done: list[Action], now: float) -> list[Action]:
        """A client message to its container now, or to wait for it (``done``: the records
        that go with it)."""
        container, waiting = self.container, self.requests.waiting
        slot = container.slot
        if (
            slot is not None
            and slot.ready
            and not slot.measuring
            and (not waiting.items or cancels_its_call(slot, message, self.requests.ledger))
            and not waits_for_a_copy(slot, message, self.requests.ledger)
        ):
            written = container.write(slot, message, frame)
            if message.kind == REQUEST:
                return [written, *done]
            # An answer to the container's request, or a cancellation: maybe nothing is in
            # flight now.
            return [written, *done, *container.between_calls(now)]
        if slot is None and message.kind != REQUEST and not self.lifecycle.reuses:
            # No container between calls: a notification does not start one. A cancellation
            # has nothing left to cancel (nothing was in flight when the last one went);
            # anything else waits for the container the next request gets.
            if message.method != CANCELLED:
                waiting.append(message, frame)
            return done
        waiting.append(message, frame)
        if slot is None:
            return [container.spawn(), *done]
        return done

    def _client_registered(self, _event: ClientRegistered, _now: float) -> list[Action]:
        """The bridge registered: its container starts before any message needs it."""
        if self.container.slot is not None or self.phase is not Phase.OPEN:
            return []
        return [self.container.spawn()]

    def _client_activity(self, _event: ClientActivity, now: float) -> list[Action]:
        self.lease.touch(now)
        return []

    def _client_gone(self, _event: ClientGone, now: float) -> list[Action]:
        # The calls still open will never be answered to this client.
        actions: list[Action] = [ToolCallDone(call) for call in self.requests.calls.abandon(now)]
        slot = self.container.slot
        if slot is not None:
            actions.append(StopBackend(slot.key, SESSION_ENDED, graceful=True))
            self.container.let_go()
        self.phase = Phase.ENDED
        return [*actions, EndSession()]

    def answer_all(self, error: FabricError) -> list[Action]:
        """Answer every request in flight or waiting, or whose answer waits for its
        container's copy to be recorded, with ``error`` and forget them."""
        now = self.container.now
        return self.requests.answer_all(error, now)[1] + self.requests.answer_held(error, now)

    def _shutdown(self, event: Shutdown, now: float) -> list[Action]:
        error = session_ending(event.reason)
        actions = self.answer_all(error)
        slot = self.container.slot
        if slot is not None:
            actions.append(StopBackend(slot.key, event.reason, graceful=False))
            self.container.let_go()
        if event.reason == ENDED_BY_OPERATOR:
            # Clients show log messages; a request in flight shows the error above.
            actions.append(ToClient(log_notification("warning", str(error))))
        actions += [CloseClient(CLOSE_NORMAL, event.reason.replace("_", " ")), EndSession()]
        self.phase = Phase.ENDED
        return actions

    def _workspace_recorded(self, event: WorkspaceRecorded, now: float) -> list[Action]:
        """A container's copy is recorded: the answers it gave go out, naming the work."""
        if event.workspace is not None:
            self.served.recorded(event.key, event.workspace.get("branch"))
        return self.requests.release_held(event, now)

    def _computed(self, _event: Computed, _now: float) -> list[Action]:
        return []  # the relay hands out no work

    def _tick(self, _event: Tick, now: float) -> list[Action]:
        return self.container.tick(now) + self.lease.expire_if_due(now)

    # --- the server's side, relayed -------------------------------------------------------------

    def _backend_line(self, event: BackendLine, now: float) -> list[Action]:
        container = self.container
        slot = container.current(event.key)
        if slot is None:
            return []  # output of a container that is being stopped
        try:
            message = peek(event.line)
        except InvalidMessage as exc:
            # Not JSON-RPC on stdout (a server printing logs there): it would break the
            # client's parser, so it is dropped, and kept in the log.
            line = event.line[:500].decode("utf-8", "replace")
            return [
                Log("warning", "server_stdout_not_jsonrpc", {"reason": exc.reason, "line": line})
            ]
        container.last_activity = now
        self.lease.touch(now)
        if (
            slot.state is BackendState.HANDSHAKING
            and message.kind == RESPONSE
            and message.id == slot.handshake_id
        ):
            return container.replay_answered(slot, message)
        ledger = self.requests.ledger
        refusal = (
            ledger.refusal(message, self.limits.max_server_requests)
            if message.kind == REQUEST
            else None
        )
        if refusal is not None:
            fields = {"id": message.id, "reason": refusal.reason}
            return [
                Log("warning", "server_request_refused", fields),
                *container.own_line(slot, error_response(message.id, refusal)),
            ]
        relayed, checked = event.line, list[Action]()
        if self.lock_check is not None:
            passed = self.lock_check.server_message(message, relayed, ledger)
            if isinstance(passed, Log):
                return [passed]
            message, relayed, checked = passed.message, passed.line, passed.drift
        # A call's answer from a container working on a copy waits for the copy's record.
        held = (
            slot.workspace
            and message.kind == RESPONSE
            and message.id is not None
            and ledger.client_requests.get(message.id, "") in CALL_METHODS
        )
        ledger.from_server(message, expires_at=now + self.server_request_timeout)
        send = ToClient(relayed, message)
        return [*checked, *self._after_answer(slot, message, relayed, now, send, held=held)]

    def _after_answer(
        self, slot: Backend, message: Peek, line: bytes, now: float, send: ToClient, *, held: bool
    ) -> list[Action]:
        if message.kind != RESPONSE:
            return [send]
        actions: list[Action] = [send]
        if not self.lifecycle.reuses and asks_for_input(line):
            # The client retries this call with its input: in this container, which a
            # server may need (its requestState may name what only this process holds).
            slot.retry_until = now + INPUT_WAIT_SECONDS
        elif held:
            # It works on a copy: the answer goes out once the copy is recorded, naming the
            # work (see .workspace_answers); the container is replaced between calls.
            decoded = msgspec.json.decode(line)
            self.requests.held.hold(slot.key, message.id, decoded)
            return self.container.between_calls(now)
        calls = self.requests.calls
        if calls.open:
            done = calls.answer(message.id, line, now)
            if done is not None:
                actions.append(done)
        return actions + self.container.between_calls(now)


def waits_for_a_copy(slot: Backend, message: Peek, ledger: Ledger) -> bool:
    """A call to a container that works on a copy waits while another call is in it: each call
    gets a copy of its own (the next container, started when this one is replaced), as on
    /mcp — two tasks in one copy could trample each other's files."""
    return (
        slot.workspace
        and message.kind == REQUEST
        and message.method in CALL_METHODS
        and any(method in CALL_METHODS for method in ledger.client_requests.values())
    )


def cancels_its_call(slot: Backend, message: Peek, ledger: Ledger) -> bool:
    """A cancellation of the call in a container that works on a copy goes to it at once,
    ahead of the calls waiting for the next container (it is not theirs)."""
    return (
        slot.workspace
        and message.method == CANCELLED
        and cancelled_request_id(message) in ledger.client_requests
    )


# What the record of which container served which request is made from (see _note_served).
_SERVED_EVENTS: frozenset[type[Any]] = frozenset({BackendStarted, BackendStartFailed})
_SERVED_ACTIONS: frozenset[type[Any]] = frozenset({StartBackend, StopBackend})

# Who decides about each event: the machine's client side (and the server's lines, relayed)...
_CLIENT_SIDE: dict[type[Any], str] = {
    ClientFrame: "_client_frame",
    ClientRegistered: "_client_registered",
    ClientActivity: "_client_activity",
    ClientGone: "_client_gone",
    BackendLine: "_backend_line",
    Tick: "_tick",
    Shutdown: "_shutdown",
    Computed: "_computed",
    WorkspaceRecorded: "_workspace_recorded",
}
# ... or the container's.
_CONTAINER_SIDE: dict[type[Any], str] = {
    BackendStarted: "started",
    BackendStartFailed: "start_failed",
    BackendBroken: "broken",
    StdinWritten: "stdin_written",
    BackendExited: "exited",
    BackendMeasured: "measured",
}


def _call_refusal(machine: SessionMachine, message: Peek, now: float) -> FabricError | None:
    """Why a tools/call is answered at once, if it is: over its user's rate, a ``base`` the
    relay cannot honour, a tool the suite lock withholds."""
    limited = machine.call_rate.refusal(now) if machine.call_rate is not None else None
    if limited is not None:
        return limited
    if machine.agent and names_base(message.params):
        return BASE_ON_RELAY if machine.isolated else BASE_NEEDS_ISOLATED
    lock = machine.lock_check
    why = lock.withheld_call(message) if lock is not None else None
    return withheld_error(machine.service_name, why) if why is not None else None
