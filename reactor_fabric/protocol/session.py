"""The relay session as a state machine: events in, actions out, no I/O.

One :class:`SessionMachine` exists per client session of the per-service relay. It makes every
decision of the session — whether a client frame is written to the container now or waits,
when a container is spawned, replaying the MCP handshake to a fresh one, idle teardown, what
happens when a container dies, what each request in flight is answered with, shutdown — from
the events the one trio driver (:mod:`reactor_fabric.trio.driver`) feeds it, in the vocabulary
of :mod:`.events` (the fabric endpoint's machine speaks it too). The driver only moves bytes and
runs the actions it is given, in order.

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
import types
from typing import Any

from .._errors import (
    ContainerStartFailure,
    FabricError,
    InvalidMessage,
    InvalidRequest,
)
from .._reasons import (
    EXITED,
    IDLE,
    NOT_NEEDED,
    REFRESH_MEMORY,
    REPLAY_FAILED,
    SESSION_ENDED,
    TOO_MANY_REQUESTS_IN_FLIGHT,
)
from .agent_slots import AgentSlots
from .answers import (
    CLOSE_NORMAL,
    ENDED_BY_OPERATOR,
    OUTPUT_INVALID,
    UNRESPONSIVE,
    SessionLimits,
    client_did_not_answer,
    container_exited,
    log_notification,
    session_ending,
)
from .backend import (
    CALL_METHODS,
    FRESH_AFTER,
    Backend,
    BackendState,
    Step,
    measure_due,
    measured,
    spent,
    start_measuring,
)
from .backlog import Backlog
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
    MeasureBackend,
    Shutdown,
    StartBackend,
    StdinWritten,
    StopBackend,
    Tick,
    ToBackend,
    ToClient,
)
from .input_waits import INPUT_WAIT_SECONDS, asks_for_input
from .jsonrpc import (
    REQUEST,
    RESPONSE,
    Peek,
    RequestId,
    duplicate_request,
    error_response,
    for_stdio,
    peek,
)
from .ledger import CANCELLED, Ledger, cancelled_request_id
from .lifecycle import Lifecycle
from .relay_lock import RelayLock
from .served import Served, call_ref
from .suite_lock import Mode, SuiteLock, withheld_error
from .tool_calls import TOOLS_CALL, ArgumentsMode, ToolCallDone, ToolCalls

# --- the machine ------------------------------------------------------------------------------


class Phase(enum.Enum):
    OPEN = "open"
    ENDED = "ended"


class SessionMachine:
    """Every decision of one relay session (see the module docstring)."""

    def __init__(
        self,
        *,
        service_name: str,
        idle_timeout: float,
        limits: SessionLimits,
        now: float,
        audit_arguments: ArgumentsMode = "hash",
        client_lease: float | None = None,
        lifecycle: Lifecycle | None = None,
        lock: SuiteLock | None = None,
        lock_mode: Mode = "off",
        session_id: str = "",
        agent_slots: AgentSlots | None = None,
        redact: Redact = unredacted,
    ) -> None:
        self.service_name = service_name
        # An llm_agent service's session: its calls are agent calls, counted in the
        # orchestrator's shared slots under the session's id (None: not an agent).
        self.session_id = session_id
        self.agent_slots = agent_slots
        # The suite lock's checks of the server's lists and answers (None: no lock is on; see
        # .relay_lock).
        self.lock_check = (
            RelayLock(service_name, lock, lock_mode, redact)
            if lock is not None and lock_mode != "off"
            else None
        )
        self.lifecycle = lifecycle or Lifecycle()
        self.idle_timeout = idle_timeout
        self.limits = limits
        self.server_request_timeout = (
            limits.server_request_timeout
            if limits.server_request_timeout is not None
            else idle_timeout
        )
        self.phase = Phase.OPEN
        self.ledger = Ledger()
        # The client's tools/call requests without an outcome yet (the audit's view).
        self.calls = ToolCalls(audit_arguments)
        self._slot: Backend | None = None
        self._next_seq = 0
        self._waiting = Backlog()  # client messages waiting for the container to be ready
        self._last_activity = now
        self.lease = ClientLease(client_lease, now)  # (see .client_lease)
        self._now = now
        # Which container served which request, bounded (see .served).
        self.served = Served()
        self._handlers: dict[type[Any], Any] = {
            ClientFrame: self._client_frame,
            ClientRegistered: self._client_registered,
            ClientActivity: self._client_activity,
            ClientGone: self._client_gone,
            BackendStarted: self._backend_started,
            BackendStartFailed: self._backend_start_failed,
            BackendLine: self._backend_line,
            BackendBroken: self._backend_broken,
            StdinWritten: self._stdin_written,
            BackendExited: self._backend_exited,
            BackendMeasured: self._backend_measured,
            Tick: self._tick,
            Shutdown: self._shutdown,
            Computed: self._computed,
        }

    # --- what the driver asks ---------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event; the actions to carry out, in order."""
        if self.phase is Phase.ENDED:
            return []
        self._now = now
        actions: list[Action] = self._handlers[type(event)](event, now)
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
        sent = sum(1 for method in self.ledger.client_requests.values() if method in CALL_METHODS)
        waiting = sum(
            1
            for message, _frame in self._waiting
            if message.kind == REQUEST and message.method in CALL_METHODS
        )
        return sent + waiting

    def _note_served(self, event: Event, actions: list[Action], now: float) -> None:
        """Which container served which request (``/api/sessions``, the status page): its
        start asked, its name once started, its stop and why, read off what was decided."""
        if isinstance(event, BackendStarted):
            self.served.started(event.key, event.container, now)
        elif isinstance(event, BackendStartFailed):
            self.served.ended(event.key, event.error.reason, now)
        for action in actions:
            if isinstance(action, StartBackend):
                self.served.asked(action.key, self.lifecycle.strategy, now)
            elif isinstance(action, StopBackend):
                self.served.ended(action.key, action.reason, now)

    def abandon(self, now: float) -> list[Action]:
        """The session is over without the machine ending it: the calls never answered."""
        return [ToolCallDone(call) for call in self.calls.abandon(now)]

    @property
    def buffered_to_server(self) -> int:
        """Bytes waiting for the container, or written to its stdin and not yet reported done."""
        pending = self._slot.stdin.pending if self._slot is not None else 0
        return self._waiting.bytes + pending

    @property
    def accepting(self) -> bool:
        """Whether the driver may read the client's next frame (bytes buffered under the bound)."""
        return self.buffered_to_server < self.limits.to_server_bytes

    @property
    def deadline(self) -> float | None:
        """When the machine next needs a Tick (None: not before another event)."""
        deadline = math.inf
        slot = self._slot
        if slot is not None:
            if slot.state is BackendState.HANDSHAKING:
                deadline = slot.handshake_deadline
            elif self._idle_candidate(slot):
                deadline = self._last_activity + self.idle_timeout
            max_age = self.lifecycle.max_age
            if max_age is not None and not self.lifecycle.reuses and self._between(slot):
                assert slot.started_at is not None  # (ready)
                deadline = min(deadline, slot.started_at + max_age)
            if slot.retry_until is not None and slot.awaits_retry(self._now):
                deadline = min(deadline, slot.retry_until)
            stalls = slot.stdin.stall_deadline(self.limits.stdin_stall_timeout)
            if stalls is not None:
                deadline = min(deadline, stalls)
        for other in (self.ledger.next_expiry(), self.lease.deadline):
            if other is not None:
                deadline = min(deadline, other)
        return None if deadline == math.inf else deadline

    def clone(self) -> SessionMachine:
        """An independent copy of the machine in its current state (for model checking)."""
        twin = copy.copy(self)
        twin.ledger = self.ledger.clone()
        twin.calls = self.calls.clone()
        twin.served = self.served.clone()
        twin.lease = dataclasses.replace(self.lease)
        twin._slot = self._slot.clone() if self._slot is not None else None
        twin._waiting = self._waiting.clone()
        twin.lock_check = self.lock_check.clone() if self.lock_check is not None else None
        twin._handlers = {
            kind: types.MethodType(method.__func__, twin) for kind, method in self._handlers.items()
        }
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """A hashable summary of the whole state: equal fingerprints behave alike (used to
        explore every reachable state once when model-checking the machine)."""
        slot = self._slot
        ledger = self.ledger
        return (
            self.phase,
            None if slot is None else slot.fingerprint(),
            self._waiting.frames(),
            tuple(sorted(ledger.client_requests.items(), key=repr)),
            tuple(sorted(ledger.server_requests.items(), key=repr)),
            ledger.replay_state(),
            tuple(sorted(self.calls.open, key=repr)),
            self._next_seq,
            self._last_activity,
            self.lease.state(),
            None if self.lock_check is None else self.lock_check.fingerprint(),
        )

    @property
    def current(self) -> BackendKey | None:
        return self._slot.key if self._slot is not None else None

    @property
    def container_state(self) -> BackendState | None:
        return self._slot.state if self._slot is not None else None

    # --- client side --------------------------------------------------------------------------

    def _client_frame(self, event: ClientFrame, now: float) -> list[Action]:
        self._last_activity = now
        self.lease.touch(now)
        try:
            message = peek(event.frame)
        except InvalidMessage as exc:
            return [
                Log("info", "client_message_refused", {"code": exc.code, "reason": exc.reason}),
                ToClient(error_response(exc.request_id, exc), error=(exc.code, exc.reason)),
            ]
        done: list[Action] = []
        if message.kind == REQUEST:
            assert message.id is not None
            if message.id in self.ledger.client_requests or self._waiting.has_request(message.id):
                return self._refuse_duplicate(message, event.frame, now)
            if message.method == TOOLS_CALL:
                self.calls.begin_params(message.id, message.params, len(event.frame), now)
                why = (
                    self.lock_check.withheld_call(message) if self.lock_check is not None else None
                )
                if why is not None:
                    return self._error_to_client(message.id, withheld_error(self.service_name, why))
            if len(self.ledger.client_requests) + len(self._waiting) >= self.limits.max_in_flight:
                refusal = InvalidRequest(
                    f"this session already has {self.limits.max_in_flight} requests in flight",
                    reason=TOO_MANY_REQUESTS_IN_FLIGHT,
                )
                return self._error_to_client(message.id, refusal)
            if self.agent_slots is not None and message.method in CALL_METHODS:
                busy = self.agent_slots.refusal(
                    self.session_id, self.agent_calls, self.service_name
                )
                if busy is not None:
                    return [
                        Log(
                            "info",
                            "agent_call_refused",
                            {"limit": busy.detail["limit"], "scope": busy.detail["scope"]},
                        ),
                        *self._error_to_client(message.id, busy),
                    ]
        elif self.calls.open and message.method == CANCELLED:
            call = self.calls.cancelled(cancelled_request_id(message), now)
            if call is not None:
                done.append(ToolCallDone(call))
        return self._route(message, event.frame, done, now)

    def _route(self, message: Peek, frame: bytes, done: list[Action], now: float) -> list[Action]:
        """A client message to its container now, or to wait for it (``done``: the records
        that go with it)."""
        slot = self._slot
        if slot is not None and slot.ready and not slot.measuring and not self._waiting:
            written = self._write(slot, message, frame)
            if message.kind == REQUEST:
                return [written, *done]
            # An answer to the container's request, or a cancellation: maybe nothing is in
            # flight now.
            return [written, *done, *self._between_calls(now)]
        if slot is None and message.kind != REQUEST and not self.lifecycle.reuses:
            # No container between calls: a notification does not start one. A cancellation
            # has nothing left to cancel (nothing was in flight when the last one went);
            # anything else waits for the container the next request gets.
            if message.method != CANCELLED:
                self._waiting.append(message, frame)
            return done
        self._waiting.append(message, frame)
        if slot is None:
            return [self._spawn(), *done]
        return done

    def _refuse_duplicate(self, message: Peek, frame: bytes, now: float) -> list[Action]:
        """A client request under an id already in flight: answered with the refusal, never
        written to the container. A tools/call gets a record of its own; the call open under
        that id is not touched (its answer and its record are still to come)."""
        assert message.id is not None
        error = duplicate_request(message.id)
        answer = error_response(message.id, error)
        actions: list[Action] = [
            Log("info", "client_message_refused", {"code": error.code, "reason": error.reason}),
            ToClient(answer, error=(error.code, error.reason)),
        ]
        if message.method == TOOLS_CALL:
            actions.append(
                self.calls.refused_params(message.id, message.params, len(frame), answer, now)
            )
        return actions

    def _error_to_client(self, request_id: RequestId | None, error: FabricError) -> list[Action]:
        """The orchestrator answers a client request with ``error`` (a tool call ends)."""
        frame = error_response(request_id, error)
        send = ToClient(frame, error=(error.code, error.reason))
        done = self.calls.answer(request_id, frame, self._now) if self.calls.open else None
        return [send] if done is None else [send, done]

    def _write(self, slot: Backend, message: Peek, frame: bytes) -> ToBackend:
        self.ledger.from_client(message, frame)
        if message.kind == REQUEST:
            slot.sent_request(message.method)
            if message.method not in FRESH_AFTER:
                self.served.call(slot.key, call_ref(message))
        return self._write_line(slot, for_stdio(frame))

    def _write_line(self, slot: Backend, line: bytes, *, own: bool = False) -> ToBackend:
        data = line + b"\n"
        slot.stdin.sent(len(data), self._now, own=own)
        return ToBackend(slot.key, data)

    def _own_line(self, slot: Backend, line: bytes) -> list[Action]:
        """A message of the machine's own to the container (a refusal of its request, the
        answer to one the client left unanswered) — unless it leaves more of them unread than the
        session's bound: then it stopped reading its stdin while asking, and is replaced
        (:mod:`.backend`'s one rule), rather than grow the orchestrator's memory."""
        size = len(line) + 1
        if slot.stdin.overflows_own(size, self.limits.to_server_bytes):
            unread = f"{slot.stdin.own} bytes of the orchestrator's own messages to it unread"
            return self._backend_broken(BackendBroken(slot.key, UNRESPONSIVE, unread), self._now)
        return [self._write_line(slot, line, own=True)]

    def _flush_waiting(self, slot: Backend) -> list[Action]:
        return [self._write(slot, message, frame) for message, frame in self._waiting.drain()]

    def _fail_waiting(self, error: FabricError) -> list[Action]:
        """Answer every waiting request with ``error``; waiting notifications are dropped."""
        actions: list[Action] = []
        for message, _frame in self._waiting.drain():
            if message.kind == REQUEST:
                actions += self._error_to_client(message.id, error)
        return actions

    def _client_registered(self, _event: ClientRegistered, _now: float) -> list[Action]:
        """The bridge registered: its container starts before any message needs it."""
        if self._slot is not None or self.phase is not Phase.OPEN:
            return []
        return [self._spawn()]

    def _client_activity(self, _event: ClientActivity, now: float) -> list[Action]:
        self.lease.touch(now)
        return []

    def _computed(self, _event: Computed, _now: float) -> list[Action]:
        return []  # the relay hands out no work

    def _client_gone(self, _event: ClientGone, now: float) -> list[Action]:
        # The calls still open will never be answered to this client.
        actions: list[Action] = [ToolCallDone(call) for call in self.calls.abandon(now)]
        if self._slot is not None:
            actions.append(StopBackend(self._slot.key, SESSION_ENDED, graceful=True))
            self._let_go()
        self.phase = Phase.ENDED
        return [*actions, EndSession()]

    def answer_all(self, error: FabricError) -> list[Action]:
        """Answer every request in flight or waiting with ``error`` and forget them."""
        actions: list[Action] = []
        for request_id in self.ledger.client_requests:
            actions += self._error_to_client(request_id, error)
        actions += self._fail_waiting(error)
        self.ledger.container_gone()
        return actions

    def _shutdown(self, event: Shutdown, _now: float) -> list[Action]:
        error = session_ending(event.reason)
        actions = self.answer_all(error)
        if self._slot is not None:
            actions.append(StopBackend(self._slot.key, event.reason, graceful=False))
            self._let_go()
        if event.reason == ENDED_BY_OPERATOR:
            # Clients show log messages; a request in flight shows the error above.
            actions.append(ToClient(log_notification("warning", str(error))))
        actions += [CloseClient(CLOSE_NORMAL, event.reason.replace("_", " ")), EndSession()]
        self.phase = Phase.ENDED
        return actions

    # --- container side -----------------------------------------------------------------------

    def _spawn(self) -> StartBackend:
        seq = self._next_seq
        self._next_seq += 1
        key = BackendKey(self.service_name, seq)
        self._slot = Backend(key)
        return StartBackend(key, respawn=seq > 0)

    def _let_go(self) -> None:
        """The current container is no longer counted on (its stop, if any, is decided)."""
        assert self._slot is not None
        self._slot.advance(Step.STOPPED)
        self._slot = None

    def _is_current(self, key: BackendKey) -> Backend | None:
        slot = self._slot
        return slot if slot is not None and slot.key == key else None

    def _backend_started(self, event: BackendStarted, now: float) -> list[Action]:
        slot = self._is_current(event.key)
        if slot is None or slot.state is not BackendState.STARTING:
            # Started after the session stopped needing it.
            return [StopBackend(event.key, NOT_NEEDED, graceful=False)]
        slot.started_at = now
        replay = self.ledger.replay()
        if replay is None:
            slot.advance(Step.STARTED_GREETED)
            return self._flush_waiting(slot)
        slot.advance(Step.STARTED)
        slot.handshake_id = replay.initialize_id
        slot.after_handshake = replay.initialized
        slot.handshake_deadline = now + self.limits.replay_timeout
        return [
            Log("info", "session_replaying", {"sequence": slot.key.seq}),
            self._write_line(slot, replay.initialize),
        ]

    def _backend_start_failed(self, event: BackendStartFailed, _now: float) -> list[Action]:
        if self._is_current(event.key) is None:
            return []
        self._let_go()
        error = event.error
        fields = {"sequence": event.key.seq, "code": error.code, "reason": error.reason}
        return [
            Log("error", "container_start_failed", {**fields, "detail": str(error)}),
            *self._fail_waiting(error),
        ]

    def _backend_line(self, event: BackendLine, now: float) -> list[Action]:
        slot = self._is_current(event.key)
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
        self._last_activity = now
        self.lease.touch(now)
        if (
            slot.state is BackendState.HANDSHAKING
            and message.kind == RESPONSE
            and message.id == slot.handshake_id
        ):
            return self._replay_answered(slot, message)
        refusal = (
            self.ledger.refusal(message, self.limits.max_server_requests)
            if message.kind == REQUEST
            else None
        )
        if refusal is not None:
            fields = {"id": message.id, "reason": refusal.reason}
            return [
                Log("warning", "server_request_refused", fields),
                *self._own_line(slot, error_response(message.id, refusal)),
            ]
        relayed, checked = event.line, list[Action]()
        if self.lock_check is not None:
            passed = self.lock_check.server_message(message, relayed, self.ledger)
            if isinstance(passed, Log):
                return [passed]
            message, relayed, checked = passed.message, passed.line, passed.drift
        self.ledger.from_server(message, expires_at=now + self.server_request_timeout)
        send = ToClient(relayed, message)
        return [*checked, *self._after_answer(slot, message, relayed, now, send)]

    def _after_answer(
        self, slot: Backend, message: Peek, line: bytes, now: float, send: ToClient
    ) -> list[Action]:
        if message.kind != RESPONSE:
            return [send]
        actions: list[Action] = [send]
        if not self.lifecycle.reuses and asks_for_input(line):
            # The client retries this call with its input: in this container, which a
            # server may need (its requestState may name what only this process holds).
            slot.retry_until = now + INPUT_WAIT_SECONDS
        if self.calls.open:
            done = self.calls.answer(message.id, line, now)
            if done is not None:
                actions.append(done)
        return actions + self._between_calls(now)

    def _replay_answered(self, slot: Backend, answer: Peek) -> list[Action]:
        if answer.failed:
            return self._replay_failed(slot, "the new container refused the replayed initialize")
        slot.advance(Step.GREETED)
        actions: list[Action] = [Log("info", "session_restored", {"sequence": slot.key.seq})]
        if slot.after_handshake is not None:
            # (the client's own notification, replayed: counted as the client's bytes)
            actions.append(self._write_line(slot, for_stdio(slot.after_handshake)))
        return actions + self._flush_waiting(slot)

    def _replay_failed(self, slot: Backend, detail: str, **extra: Any) -> list[Action]:
        error = ContainerStartFailure(
            f"{detail}; the {self.service_name} session could not be restored",
            reason=REPLAY_FAILED,
            **extra,
        )
        return self._retire(slot, error, stop_reason=REPLAY_FAILED)

    def _backend_broken(self, event: BackendBroken, _now: float) -> list[Action]:
        slot = self._is_current(event.key)
        if slot is None:
            return []
        what = (
            "produced output that could not be relayed"
            if event.reason == OUTPUT_INVALID
            else "stopped reading its input"
        )
        error = ContainerStartFailure(
            f"the {self.service_name} server {what} ({event.detail}); the container was replaced",
            reason=event.reason,
        )
        return self._retire(slot, error, stop_reason=event.reason)

    def _stdin_written(self, event: StdinWritten, now: float) -> list[Action]:
        slot = self._is_current(event.key)
        if slot is not None:
            slot.stdin.written(event.nbytes, now)
        return []

    def _backend_exited(self, event: BackendExited, _now: float) -> list[Action]:
        slot = self._is_current(event.key)
        if slot is None:
            return []
        stderr = list(event.stderr)
        if slot.state is BackendState.HANDSHAKING:
            return self._replay_failed(
                slot,
                "the new container exited before answering the replayed initialize",
                exit_code=event.exit_code,
                stderr=stderr,
            )
        error = container_exited(self.service_name, event.exit_code, event.oom_killed, stderr)
        return self._retire(slot, error, stop_reason=EXITED)

    def _retire(self, slot: Backend, error: FabricError, *, stop_reason: str) -> list[Action]:
        """The current container is done for: answer what it owed, fail what waited, stop it."""
        lost = self.ledger.container_gone()
        fields: dict[str, Any] = {
            "sequence": slot.key.seq,
            "code": error.code,
            "reason": error.reason,
            "in_flight": len(lost),
            "detail": str(error),
            **error.detail,
        }
        actions: list[Action] = [
            Log("error", "container_failed", fields),
            StopBackend(slot.key, stop_reason, graceful=False),
        ]
        for request_id, _method in lost:
            actions += self._error_to_client(request_id, error)
        actions += self._fail_waiting(error)
        self._let_go()
        return actions

    # --- the lifecycle: between calls -----------------------------------------------------------

    def _between_calls(self, now: float) -> list[Action]:
        """The current container has nothing in flight (if so): what its lifecycle does now —
        retire it, ask for its memory, or nothing."""
        slot = self._slot
        if self.lifecycle.reuses or slot is None or not self._between(slot):
            return []
        reason = spent(slot, self.lifecycle, now)
        if reason is not None:
            return self._refresh(slot, reason, now)
        if measure_due(slot, self.lifecycle):
            start_measuring(slot)
            return [MeasureBackend(slot.key)]
        return []

    def _between(self, slot: Backend) -> bool:
        """Whether the container is between calls: ready, and nothing in flight or waiting
        (a call's retry included)."""
        return (
            slot.ready
            and not slot.measuring
            and not self._waiting
            and not self.ledger.busy
            and not slot.awaits_retry(self._now)
        )

    def _refresh(self, slot: Backend, reason: str, now: float) -> list[Action]:
        """Retire the current container between calls (nothing of the client is lost); a
        request already waiting gets the next one at once, any other at its arrival."""
        fields = {
            "sequence": slot.key.seq,
            "reason": reason,
            "calls": slot.calls,
            "age": round(now - (slot.started_at or now), 3),
        }
        actions: list[Action] = [
            Log("info", "container_refreshed", fields),
            StopBackend(slot.key, reason, graceful=True),
        ]
        self._let_go()
        if any(message.kind == REQUEST for message, _frame in self._waiting):
            actions.append(self._spawn())
        return actions

    def _backend_measured(self, event: BackendMeasured, now: float) -> list[Action]:
        slot = self._is_current(event.key)
        if slot is None or not slot.measuring:
            return []
        if measured(slot, self.lifecycle, event.memory_bytes) and not self.ledger.busy:
            return self._refresh(slot, REFRESH_MEMORY, now)
        # (None: the figure could not be read — no decision on it)
        return self._flush_waiting(slot) + self._between_calls(now)

    # --- time ---------------------------------------------------------------------------------

    def _idle_candidate(self, slot: Backend) -> bool:
        return (
            slot.ready
            and slot.stdin.pending == 0
            and not self._waiting
            and not self.ledger.busy
            and not slot.awaits_retry(self._now)
            and not math.isinf(self.idle_timeout)
        )

    def _tick(self, _event: Tick, now: float) -> list[Action]:
        actions: list[Action] = []
        slot = self._slot
        if slot is not None and slot.stdin.stalled(now, self.limits.stdin_stall_timeout):
            stalled = BackendBroken(
                slot.key,
                UNRESPONSIVE,
                f"its input did not move for {self.limits.stdin_stall_timeout:g} s",
            )
            return self._backend_broken(stalled, now)
        slot = self._slot
        if (
            slot is not None
            and slot.state is BackendState.HANDSHAKING
            and now >= slot.handshake_deadline
        ):
            actions += self._replay_failed(
                slot,
                f"the new container did not answer the replayed initialize within "
                f"{self.limits.replay_timeout:g} s",
            )
        for request_id in self.ledger.expire(now):
            actions.append(Log("warning", "server_request_expired", {"id": request_id}))
            slot = self._slot
            if slot is not None and slot.state is not BackendState.STARTING:
                answer = error_response(request_id, client_did_not_answer())
                actions += self._own_line(slot, answer)
        actions += self._between_calls(now)  # an answer expired, or the container aged
        slot = self._slot
        if (
            slot is not None
            and self._idle_candidate(slot)
            and now >= self._last_activity + self.idle_timeout
        ):
            actions += [
                Log("info", "container_idle", {"sequence": slot.key.seq}),
                StopBackend(slot.key, IDLE, graceful=True),
            ]
            self._let_go()
        return actions + self.lease.expire_if_due(now)
