"""What a relay session holds of its client's requests, without I/O: the ledger of requests in
flight both ways, the tool calls without an outcome yet (the audit's view), and the client's
messages waiting for the container — and the answers it owes when they cannot be served.

One :class:`RelayRequests` belongs to one :class:`~.session.SessionMachine` (its client side)
and is shared with its :class:`~.relay_container.RelayContainer` (which writes what waits and
answers what a lost container owed). Every answer the orchestrator gives in the server's place
goes through :meth:`RelayRequests.error_to_client`, so that a tool call it ends gets its one
audit record.

Bounds: at most ``limits.max_in_flight`` requests in flight or waiting (:attr:`full`); what
waits is counted in bytes (:attr:`RelayRequests.waiting`), the session's bound on it is the
machine's (``accepting``).
"""

from __future__ import annotations

import msgspec

from .._errors import FabricError
from .answers import SessionLimits
from .backend import CALL_METHODS
from .backlog import Backlog
from .events import Action, Log, ToClient, WorkspaceRecorded
from .jsonrpc import REQUEST, Peek, RequestId, duplicate_request, error_response, peek
from .ledger import Ledger
from .tool_calls import TOOLS_CALL, ArgumentsMode, ToolCalls
from .workspace_answers import HeldAnswers

encoder = msgspec.json.Encoder()


class RelayRequests:
    """A relay session's requests in flight, its calls, what waits (see the module docs)."""

    def __init__(self, limits: SessionLimits, audit_arguments: ArgumentsMode) -> None:
        self.limits = limits
        self.ledger = Ledger()
        self.calls = ToolCalls(audit_arguments)
        # The client's messages waiting for the container (to start, its handshake to be
        # replayed, its memory figure), in order.
        self.waiting = Backlog()
        # Answers of a container working on a copy, until it is recorded (.workspace_answers).
        self.held: HeldAnswers[RequestId | None] = HeldAnswers()

    @property
    def quiet(self) -> bool:
        """Nothing waits for the container and nothing is in flight either way."""
        return not self.waiting.items and not self.ledger.busy

    def holds(self, request_id: RequestId) -> bool:
        """Whether a client request under ``request_id`` is in flight or waiting."""
        return request_id in self.ledger.client_requests or self.waiting.has_request(request_id)

    @property
    def full(self) -> bool:
        """Whether one more client request would exceed the session's requests in flight."""
        in_flight = len(self.ledger.client_requests) + len(self.waiting.items)
        return in_flight >= self.limits.max_in_flight

    def agent_calls(self) -> int:
        """The calls sent to the container and not answered yet, and the calls waiting for
        it (an agent's session counts them in the orchestrator's agent slots)."""
        sent = sum(1 for method in self.ledger.client_requests.values() if method in CALL_METHODS)
        waiting = sum(
            1
            for message, _frame in self.waiting
            if message.kind == REQUEST and message.method in CALL_METHODS
        )
        return sent + waiting

    def error_to_client(
        self, request_id: RequestId | None, error: FabricError, now: float
    ) -> list[Action]:
        """The orchestrator answers a client request with ``error`` (a tool call ends)."""
        frame = error_response(request_id, error)
        send = ToClient(frame, error=(error.code, error.reason))
        done = self.calls.answer(request_id, frame, now) if self.calls.open else None
        return [send] if done is None else [send, done]

    def refuse_duplicate(self, message: Peek, frame: bytes, now: float) -> list[Action]:
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

    def fail_waiting(self, error: FabricError, now: float) -> list[Action]:
        """Answer every waiting request with ``error``; waiting notifications are dropped."""
        actions: list[Action] = []
        for message, _frame in self.waiting.drain():
            if message.kind == REQUEST:
                actions += self.error_to_client(message.id, error, now)
        return actions

    def answer_all(self, error: FabricError, now: float) -> tuple[int, list[Action]]:
        """Answer every request in flight or waiting with ``error`` and forget them (the
        container is gone, or the session ends): how many were in flight, and the answers."""
        lost = self.ledger.container_gone()
        actions: list[Action] = []
        for request_id, _method in lost:
            actions += self.error_to_client(request_id, error, now)
        return len(lost), actions + self.fail_waiting(error, now)

    def answer_held(self, error: FabricError, now: float) -> list[Action]:
        """The session ends: the answers held for their workspace are answered ``error``."""
        actions: list[Action] = []
        for request_id in self.held.end():
            actions += self.error_to_client(request_id, error, now)
        return actions

    def release_held(self, event: WorkspaceRecorded, now: float) -> list[Action]:
        """A container's task is recorded: the answers it gave go out, naming the work."""
        actions: list[Action] = []
        for held in self.held.release(event):
            frame = encoder.encode(held.message)
            actions.append(ToClient(frame, peek(frame)))
            done = self.calls.answer(held.request, frame, now) if self.calls.open else None
            if done is not None:
                actions.append(done)
        return actions

    # --- model checking -----------------------------------------------------------------------

    def clone(self) -> RelayRequests:
        twin = RelayRequests(self.limits, self.calls.mode)
        twin.ledger = self.ledger.clone()
        twin.calls = self.calls.clone()
        twin.waiting = self.waiting.clone()
        twin.held = self.held.clone()
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        ledger = self.ledger
        return (
            self.waiting.frames(),
            tuple(sorted(ledger.client_requests.items(), key=repr)),
            tuple(sorted(ledger.server_requests.items(), key=repr)),
            ledger.replay_state(),
            tuple(sorted(self.calls.open, key=repr)),
            self.held.fingerprint(),
        )
