"""The fabric endpoint's replies ledger for one session, without I/O: the client as it
introduced itself and what it is owed.

:class:`Replies` is a field of :class:`~.fabric_server.FabricServer`, handed to its router
(:mod:`.fabric_router`) when it is made: both answer the client through it. It keeps the
client's protocol version (None: a 2026-07-28 client, which never sends ``initialize``) and
capabilities, makes every answer to the client's requests (results, errors, the refusal of an
id in flight), and ends with each answer the tool call it answers: the audit's view of the
calls (:class:`~.tool_calls.ToolCalls`) is here, and the calls that got their outcome while an
event was handled are returned after that event's actions (:meth:`Replies.with_done`).
"""

from __future__ import annotations

import copy
from typing import Any

from .._errors import FabricError, titled
from .._reasons import INVALID_PARAMS as INVALID_PARAMS_REASON
from .._reasons import METHOD_NOT_FOUND as METHOD_NOT_FOUND_REASON
from .._reasons import NONE
from .events import Action, ToClient
from .fabric_messages import (
    FABRIC_SERVICE,
    audited,
    complete,
    encoder,
    initialize_result,
    negotiated,
)
from .jsonrpc import RequestId, duplicate_request
from .mcp import INVALID_PARAMS, METHOD_NOT_FOUND, TITLES
from .tool_calls import ArgumentsMode, ToolCall, ToolCallDone, ToolCalls

Json = dict[str, Any]

# The reason the metrics give errors of the endpoint's own that carry none.
REASONS = {METHOD_NOT_FOUND: METHOD_NOT_FOUND_REASON, INVALID_PARAMS: INVALID_PARAMS_REASON}


class Replies:
    """The client of one session and the answers it gets, each ending the tool call it answers
    (see the module's docs)."""

    def __init__(self, *, now: float, audit_arguments: ArgumentsMode) -> None:
        self.now = now  # the time of the event being handled (the server's, set per event)
        self.protocol_version: str | None = None
        self.client_capabilities: Json = {}
        # The client's tools/call requests without an outcome yet, and those that got one
        # while handling the current event (returned as ToolCallDone after its actions).
        self.calls = ToolCalls(audit_arguments)
        self.done: list[ToolCall] = []

    @property
    def stateless(self) -> bool:
        """A 2026-07-28 client: it never sent initialize, its lists never change within a
        connection (so activation shows only after it reconnects), its results say they are
        whole, and its backends' questions come back to it as results."""
        return self.protocol_version is None

    def introduce(self, request_id: object, params: Json, version: str) -> ToClient:
        """A handshake-era client's ``initialize``: who it is, and the answer."""
        self.protocol_version = negotiated(params.get("protocolVersion"))
        capabilities = params.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        return self.result(request_id, initialize_result(self.protocol_version, version))

    def with_done(self, actions: list[Action]) -> list[Action]:
        """``actions``, then the tool calls that got their outcome meanwhile."""
        if not self.done:
            return actions
        done: list[Action] = [ToolCallDone(call) for call in self.done]
        self.done.clear()
        return actions + done

    def ended(self, request_id: object, data: bytes) -> None:
        """An answer to the client's ``request_id`` is sent: a tool call may end with it."""
        if self.calls.open and isinstance(request_id, str | int):
            call = self.calls.answered(request_id, data, self.now)
            if call is not None:
                self.done.append(call)

    def cancelled(self, request_id: object) -> None:
        """The client cancelled its request: a tool call ends so."""
        if self.calls.open and isinstance(request_id, str | int):
            call = self.calls.cancelled(request_id, self.now)
            if call is not None:
                self.done.append(call)

    def result(self, request_id: object, result: Json) -> ToClient:
        if self.stateless:
            result = complete(result)
        return self.answer(request_id, {"jsonrpc": "2.0", "id": request_id, "result": result})

    def fail(self, request_id: object, code: int, message: str) -> ToClient:
        error = {"code": code, "message": titled(TITLES[code], message)}
        body = {"jsonrpc": "2.0", "id": request_id, "error": error}
        return self.answer(request_id, body, (code, REASONS.get(code, NONE)))

    def error(self, request_id: object, error: FabricError) -> ToClient:
        body = {"jsonrpc": "2.0", "id": request_id, "error": error.to_jsonrpc_error()}
        return self.answer(request_id, body, (error.code, error.reason))

    def answer(
        self, request_id: object, body: Json, error: tuple[int, str] | None = None
    ) -> ToClient:
        data = encoder.encode(body)
        self.ended(request_id, data)
        return ToClient(data, error=error)

    def begin_call(self, request_id: RequestId, params: Json, nbytes: int) -> None:
        """The audit's view of a call (see :func:`~.fabric_messages.audited`) of ``nbytes``."""
        tool, arguments, traceparent = audited(params)
        self.calls.begin(
            request_id,
            tool=tool,
            # The endpoint's own until routed to a service's tool (see the server's calls).
            service=FABRIC_SERVICE,
            arguments=arguments,
            traceparent=traceparent,
            nbytes=nbytes,
            now=self.now,
        )

    def refuse_duplicate(
        self, request_id: RequestId, method: str, params: Json, nbytes: int
    ) -> list[Action]:
        """Answer a request under an id in flight without touching what is in flight: the
        first request keeps its answer to come, and a tools/call its one record (the refused
        one gets its own)."""
        error = duplicate_request(request_id)
        body = {"jsonrpc": "2.0", "id": request_id, "error": error.to_jsonrpc_error()}
        data = encoder.encode(body)
        if method == "tools/call":
            tool, arguments, traceparent = audited(params)
            refused = self.calls.refused(
                request_id,
                tool=tool,
                service=FABRIC_SERVICE,
                arguments=arguments,
                traceparent=traceparent,
                nbytes=nbytes,
                answer=data,
                now=self.now,
            )
            self.done.append(refused)
        return [ToClient(data, error=(error.code, error.reason))]

    # --- model checking -----------------------------------------------------------------------

    def clone(self) -> Replies:
        twin = copy.copy(self)  # (client_capabilities is replaced whole, never changed)
        twin.calls = self.calls.clone()
        twin.done = list(self.done)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return (
            encoder.encode(self.client_capabilities),
            self.protocol_version,
            tuple(sorted((repr(i), repr(c)) for i, c in self.calls.open.items())),
            len(self.done),
        )
