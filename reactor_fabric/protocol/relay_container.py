"""The container side of a relay session, without I/O: its one service's current container as a
:class:`~.backend.Backend` of the one backend model, its start and the replay of the client's
handshake to it, the lines written to it, its failures, and its lifecycle between calls and in
time (refresh, memory, idle, a stdin that stopped moving).

Containers are numbered (``BackendKey.seq``, from 0: it names the container and the log's
``sequence``) in the order they are asked for; at most one is *current*, and events about any
other are ignored (it is being stopped). A fresh container of a session that already spoke to
one gets the client's ``initialize`` replayed first (HANDSHAKING, bounded by
``limits.replay_timeout``) and its ``initialized`` after the answer; what waited is written
once it is READY.

The lifecycle (:class:`~.lifecycle.Lifecycle`) acts *between calls* — the container ready, not
measured, nothing in flight either way, nothing waiting, no call's retry expected
(:meth:`RelayContainer.between`): ``fresh_per_call`` retires it once it served a request other
than the handshake, ``smart_refresh`` at its call, age or memory bound (its memory read with
:class:`~.events.MeasureBackend`, what the client sends meanwhile waiting for the figure). It is
stopped when idle for the service's timeout since the session's last activity, and replaced
when it stopped reading its stdin (the one rule of :mod:`.backend`).

What the container owed when it is lost is answered through the session's
:class:`~.relay_requests.RelayRequests`, shared with the machine's client side.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from .._errors import ContainerStartFailure, FabricError
from .._reasons import EXITED, IDLE, NOT_NEEDED, REFRESH_MEMORY, REPLAY_FAILED
from .answers import (
    OUTPUT_INVALID,
    UNRESPONSIVE,
    client_did_not_answer,
    container_exited,
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
from .events import (
    Action,
    BackendBroken,
    BackendExited,
    BackendKey,
    BackendMeasured,
    BackendStarted,
    BackendStartFailed,
    Log,
    MeasureBackend,
    StartBackend,
    StdinWritten,
    StopBackend,
)
from .jsonrpc import REQUEST, Peek, error_response, for_stdio
from .relay_requests import RelayRequests
from .served import Served
from .settings import RelaySettings


class RelayContainer:
    """A relay session's current container and its lifecycle (see the module docs)."""

    def __init__(
        self,
        settings: RelaySettings,
        *,
        service_name: str,
        requests: RelayRequests,
        served: Served,
        now: float,
    ) -> None:
        self.service_name = service_name
        self.lifecycle = settings.lifecycle
        self.idle_timeout = settings.idle_timeout
        self.limits = settings.limits
        self.requests = requests  # (the session's: shared with its client side)
        self.served = served
        self.slot: Backend | None = None
        self.next_seq = 0
        # The session's last activity, either way (the idle deadline counts from it).
        self.last_activity = now
        self.now = now  # (the time of the event being handled)

    # --- which container ----------------------------------------------------------------------

    def spawn(self) -> StartBackend:
        """A fresh container becomes the current one (to be started)."""
        seq = self.next_seq
        self.next_seq += 1
        key = BackendKey(self.service_name, seq)
        self.slot = Backend(key)
        return StartBackend(key, respawn=seq > 0)

    def let_go(self) -> None:
        """The current container is no longer counted on (its stop, if any, is decided)."""
        assert self.slot is not None
        self.slot.advance(Step.STOPPED)
        self.slot = None

    def current(self, key: BackendKey) -> Backend | None:
        """The current container, if ``key`` names it (else: one being stopped, or none)."""
        slot = self.slot
        return slot if slot is not None and slot.key == key else None

    # --- writes -------------------------------------------------------------------------------

    def write(self, slot: Backend, message: Peek, frame: bytes) -> Action:
        """A client message to the container, noted in the ledger (and the call it is)."""
        self.requests.ledger.from_client(message, frame)
        if message.kind == REQUEST:
            slot.sent_request(message.method)
            if message.method not in FRESH_AFTER:
                self.served.relayed(slot.key, message)
        return slot.send(for_stdio(frame), self.now)

    def own_line(self, slot: Backend, line: bytes) -> list[Action]:
        """A message of the machine's own to the container (a refusal of its request, the
        answer to one the client left unanswered) — unless it leaves more of them unread than
        the session's bound: then it stopped reading its stdin while asking, and is replaced
        (:mod:`.backend`'s one rule), rather than grow the orchestrator's memory."""
        sent = slot.send_own(line, self.now, self.limits.to_server_bytes)
        if sent is None:
            unread = f"{slot.stdin.own} bytes of the orchestrator's own messages to it unread"
            return self.broken(BackendBroken(slot.key, UNRESPONSIVE, unread), self.now)
        return [sent]

    def flush_waiting(self, slot: Backend) -> list[Action]:
        """What waited for the container, to it; to one that works on a copy, up to its second
        call (that one waits for the next container: a copy each; what follows the first, a
        cancellation of it say, goes with it)."""
        waiting = self.requests.waiting
        if slot.workspace:
            flushed = waiting.drain_to_second(
                lambda m: m.kind == REQUEST and m.method in CALL_METHODS
            )
        else:
            flushed = waiting.drain()
        return [self.write(slot, message, frame) for message, frame in flushed]

    def stdin_written(self, event: StdinWritten, now: float) -> list[Action]:
        slot = self.current(event.key)
        if slot is not None:
            slot.stdin.written(event.nbytes, now)
        return []

    # --- start and handshake ------------------------------------------------------------------

    def started(self, event: BackendStarted, now: float) -> list[Action]:
        slot = self.current(event.key)
        if slot is None or slot.state is not BackendState.STARTING:
            # Started after the session stopped needing it.
            return [StopBackend(event.key, NOT_NEEDED, graceful=False)]
        slot.started_at = now
        slot.workspace = event.workspace
        replay = self.requests.ledger.replay()
        if replay is None:
            slot.advance(Step.STARTED_GREETED)
            return self.flush_waiting(slot)
        slot.advance(Step.STARTED)
        slot.handshake_id = replay.initialize_id
        slot.after_handshake = replay.initialized
        slot.handshake_deadline = now + self.limits.replay_timeout
        return [
            Log("info", "session_replaying", {"sequence": slot.key.seq}),
            slot.send(replay.initialize, now),
        ]

    def replay_answered(self, slot: Backend, answer: Peek) -> list[Action]:
        if answer.failed:
            return self.replay_failed(slot, "the new container refused the replayed initialize")
        slot.advance(Step.GREETED)
        actions: list[Action] = [Log("info", "session_restored", {"sequence": slot.key.seq})]
        if slot.after_handshake is not None:
            # (the client's own notification, replayed: counted as the client's bytes)
            actions.append(slot.send(for_stdio(slot.after_handshake), self.now))
        return actions + self.flush_waiting(slot)

    def replay_failed(self, slot: Backend, detail: str, **extra: Any) -> list[Action]:
        error = ContainerStartFailure(
            f"{detail}; the {self.service_name} session could not be restored",
            reason=REPLAY_FAILED,
            **extra,
        )
        return self.retire(slot, error, stop_reason=REPLAY_FAILED)

    # --- failures -----------------------------------------------------------------------------

    def start_failed(self, event: BackendStartFailed, now: float) -> list[Action]:
        if self.current(event.key) is None:
            return []
        self.let_go()
        error = event.error
        fields = {"sequence": event.key.seq, "code": error.code, "reason": error.reason}
        return [
            Log("error", "container_start_failed", {**fields, "detail": str(error)}),
            *self.requests.fail_waiting(error, now),
        ]

    def broken(self, event: BackendBroken, _now: float) -> list[Action]:
        slot = self.current(event.key)
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
        return self.retire(slot, error, stop_reason=event.reason)

    def exited(self, event: BackendExited, _now: float) -> list[Action]:
        slot = self.current(event.key)
        if slot is None:
            return []
        stderr = list(event.stderr)
        if slot.state is BackendState.HANDSHAKING:
            return self.replay_failed(
                slot,
                "the new container exited before answering the replayed initialize",
                exit_code=event.exit_code,
                stderr=stderr,
            )
        error = container_exited(self.service_name, event.exit_code, event.oom_killed, stderr)
        return self.retire(slot, error, stop_reason=EXITED)

    def retire(self, slot: Backend, error: FabricError, *, stop_reason: str) -> list[Action]:
        """The current container is done for: answer what it owed, fail what waited, stop it."""
        in_flight, answers = self.requests.answer_all(error, self.now)
        fields: dict[str, Any] = {
            "sequence": slot.key.seq,
            "code": error.code,
            "reason": error.reason,
            "in_flight": in_flight,
            "detail": str(error),
            **error.detail,
        }
        # (answers it gave earlier wait for its copy to be recorded: see .workspace_answers)
        held = slot.key in self.requests.held
        stop = StopBackend(slot.key, stop_reason, graceful=False, report_workspace=held)
        self.let_go()
        return [Log("error", "container_failed", fields), stop, *answers]

    # --- the lifecycle: between calls -----------------------------------------------------------

    def between(self, slot: Backend) -> bool:
        """Whether the container is between calls: ready, and nothing in flight or waiting
        (a call's retry included). One that works on a copy is between calls with calls
        waiting: they wait for the next one (see .session.waits_for_a_copy)."""
        requests = self.requests
        return (
            slot.ready
            and not slot.measuring
            and (requests.quiet or (slot.workspace and not requests.ledger.busy))
            and not slot.awaits_retry(self.now)
        )

    def between_calls(self, now: float) -> list[Action]:
        """The current container has nothing in flight (if so): what its lifecycle does now —
        retire it, ask for its memory, or nothing."""
        slot = self.slot
        if self.lifecycle.reuses or slot is None or not self.between(slot):
            return []
        reason = spent(slot, self.lifecycle, now)
        if reason is not None:
            return self.refresh(slot, reason, now)
        if measure_due(slot, self.lifecycle):
            start_measuring(slot)
            return [MeasureBackend(slot.key)]
        return []

    def refresh(self, slot: Backend, reason: str, now: float) -> list[Action]:
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
            StopBackend(
                slot.key, reason, graceful=True, report_workspace=slot.key in self.requests.held
            ),
        ]
        self.let_go()
        if any(message.kind == REQUEST for message, _frame in self.requests.waiting):
            actions.append(self.spawn())
        return actions

    def measured(self, event: BackendMeasured, now: float) -> list[Action]:
        slot = self.current(event.key)
        if slot is None or not slot.measuring:
            return []
        if measured(slot, self.lifecycle, event.memory_bytes) and not self.requests.ledger.busy:
            return self.refresh(slot, REFRESH_MEMORY, now)
        # (None: the figure could not be read — no decision on it)
        return self.flush_waiting(slot) + self.between_calls(now)

    # --- time ---------------------------------------------------------------------------------

    def idle_candidate(self, slot: Backend) -> bool:
        return (
            slot.ready
            and slot.stdin.pending == 0
            and self.requests.quiet
            and not slot.awaits_retry(self.now)
            and not math.isinf(self.idle_timeout)
        )

    def deadline(self) -> float:
        """When the container next needs a Tick (inf: not before another event).

        (Asked after every event: the checks of :meth:`idle_candidate` and the stdin's stall
        are written out here, cheapest first, rather than called.)"""
        slot = self.slot
        if slot is None:
            return math.inf
        deadline = math.inf
        pending = slot.stdin.pending
        retry_until = slot.retry_until
        awaits_retry = retry_until is not None and self.now < retry_until
        if slot.state is BackendState.HANDSHAKING:
            deadline = slot.handshake_deadline
        elif (
            pending == 0
            and slot.state is BackendState.READY
            and not awaits_retry
            and self.idle_timeout != math.inf
            and self.requests.quiet
        ):
            deadline = self.last_activity + self.idle_timeout
        max_age = self.lifecycle.max_age
        if max_age is not None and not self.lifecycle.reuses and self.between(slot):
            assert slot.started_at is not None  # (ready)
            deadline = min(deadline, slot.started_at + max_age)
        if awaits_retry:
            assert retry_until is not None
            deadline = min(deadline, retry_until)
        if pending:
            deadline = min(deadline, slot.stdin.progress + self.limits.stdin_stall_timeout)
        return deadline

    def tick(self, now: float) -> list[Action]:
        """What is due now: a stdin that stopped moving, a replay not answered in time, the
        server's requests the client left unanswered, the lifecycle between calls, idleness."""
        slot = self.slot
        if slot is not None and slot.stdin.stalled(now, self.limits.stdin_stall_timeout):
            still = f"its input did not move for {self.limits.stdin_stall_timeout:g} s"
            stalled = BackendBroken(slot.key, UNRESPONSIVE, still)
            return self.broken(stalled, now)
        actions: list[Action] = []
        if (
            slot is not None
            and slot.state is BackendState.HANDSHAKING
            and now >= slot.handshake_deadline
        ):
            actions += self.replay_failed(
                slot,
                f"the new container did not answer the replayed initialize within "
                f"{self.limits.replay_timeout:g} s",
            )
        for request_id in self.requests.ledger.expire(now):
            actions.append(Log("warning", "server_request_expired", {"id": request_id}))
            slot = self.slot
            if slot is not None and slot.state is not BackendState.STARTING:
                answer = error_response(request_id, client_did_not_answer())
                actions += self.own_line(slot, answer)
        actions += self.between_calls(now)  # an answer expired, or the container aged
        slot = self.slot
        if (
            slot is not None
            and self.idle_candidate(slot)
            and now >= self.last_activity + self.idle_timeout
        ):
            actions += [
                Log("info", "container_idle", {"sequence": slot.key.seq}),
                StopBackend(slot.key, IDLE, graceful=True),
            ]
            self.let_go()
        return actions

    # --- model checking -----------------------------------------------------------------------

    def clone(self, requests: RelayRequests, served: Served) -> RelayContainer:
        """An independent copy, on the twin session's requests and records."""
        twin = copy.copy(self)
        twin.requests, twin.served = requests, served
        twin.slot = self.slot.clone() if self.slot is not None else None
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        slot = self.slot
        return (
            None if slot is None else slot.fingerprint(),
            self.next_seq,
            self.last_activity,
        )
