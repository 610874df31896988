"""What the fabric endpoint's messages look like, without I/O: its answers to the client (and the
tool calls they end: :class:`Answers`, the base of its machine), the encoder every message goes
out through, its initialize and discover results, notifications, the audit's view of a call,
and the 2026-07-28 envelope a result gains and a backend's request loses."""

from __future__ import annotations

from typing import Any

from .._errors import FabricError, titled
from .._reasons import INVALID_PARAMS as INVALID_PARAMS_REASON
from .._reasons import METHOD_NOT_FOUND as METHOD_NOT_FOUND_REASON
from .._reasons import NONE
from .deep_json import DeepEncoder
from .events import Action, ToClient
from .jsonrpc import RequestId, duplicate_request
from .mcp import HANDSHAKE_VERSIONS, INVALID_PARAMS, METHOD_NOT_FOUND, STATELESS_VERSION, TITLES
from .tool_calls import ArgumentsMode, ToolCall, ToolCallDone, ToolCalls

Json = dict[str, Any]

ENVELOPE = "io.modelcontextprotocol/"
CACHE_PRIVATE = {"ttlMs": 0, "cacheScope": "private"}
SERVER_NAME = "reactor-fabric"
CAPABILITIES: Json = {
    "tools": {"listChanged": True},
    "prompts": {"listChanged": False},
    "resources": {"listChanged": False, "subscribe": False},
}
# The service the audit names for the endpoint's own meta-tools.
FABRIC_SERVICE = "fabric"
# The reason the metrics give errors of the endpoint's own that carry none.
_REASONS = {METHOD_NOT_FOUND: METHOD_NOT_FOUND_REASON, INVALID_PARAMS: INVALID_PARAMS_REASON}

# What the client sent was decoded near the top of the stack; it may be encoded further down
# it (a call queued until its backend is ready goes out from the backend's reader), where
# msgspec alone would fail on what it decoded (see .deep_json).
encoder = DeepEncoder()


def complete(result: Json) -> Json:
    """A result as 2026-07-28 requires it: ``resultType`` says it is the whole answer."""
    return result if "resultType" in result else {"resultType": "complete", **result}


def for_backend(params: Json) -> Json:
    """A client's request parameters as a handshake-era server may see them: without the
    2026-07-28 envelope in ``_meta`` (protocol version, client info and capabilities, which
    such servers refuse), with everything else — the ``progressToken`` above all."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or not any(key.startswith(ENVELOPE) for key in meta):
        return params
    kept = {key: value for key, value in meta.items() if not key.startswith(ENVELOPE)}
    trimmed = {key: value for key, value in params.items() if key != "_meta"}
    if kept:
        trimmed["_meta"] = kept
    return trimmed


def notification(method: str) -> ToClient:
    return ToClient(notification_bytes(method, None))


def notification_bytes(method: str, params: Json | None) -> bytes:
    message: Json = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return encoder.encode(message)


def audited(params: Json) -> tuple[object, object, object]:
    """What the audit keeps of a tools/call's params: the tool it names (call_tool: the one it
    calls), its arguments and the client's traceparent."""
    name = params.get("name")
    arguments = params.get("arguments")
    if name == "call_tool" and isinstance(arguments, dict):
        name = arguments.get("name")
        arguments = arguments.get("arguments", arguments.get("parameters"))
    meta = params.get("_meta")
    return name, arguments, meta.get("traceparent") if isinstance(meta, dict) else None


def negotiated(requested: object) -> str:
    """The protocol version of a handshake-era client's ``initialize``."""
    return (
        requested
        if isinstance(requested, str) and requested in HANDSHAKE_VERSIONS
        else (HANDSHAKE_VERSIONS[-1])
    )


def initialize_result(protocol_version: str, version: str) -> Json:
    return {
        "protocolVersion": protocol_version,
        "capabilities": CAPABILITIES,
        "serverInfo": {"name": SERVER_NAME, "version": version},
        "instructions": "Tools are named server__tool. Use find_tools to find one for a "
        "task among every server of the suite, and call_tool to call it.",
    }


def discover_result(version: str) -> Json:
    return {
        **CACHE_PRIVATE,
        "supportedVersions": [STATELESS_VERSION],
        "capabilities": CAPABILITIES,
        "resultType": "complete",
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": SERVER_NAME, "version": version}},
    }


class Answers:
    """The machine's answers to the client, each ending the tool call it answers (the audit's
    view, :class:`~.tool_calls.ToolCalls`), and its ids of its own."""

    def __init__(self, *, now: float, audit_arguments: ArgumentsMode) -> None:
        self.now = now  # the time of the event being handled
        self.protocol_version: str | None = None
        self._next_id = 0
        # The client's tools/call requests without an outcome yet, and those that got one
        # while handling the current event (returned as ToolCallDone after its actions).
        self.calls = ToolCalls(audit_arguments)
        self._done: list[ToolCall] = []
        self._message_bytes = 0  # the size of the client message being handled

    @property
    def _stateless(self) -> bool:
        # A 2026-07-28 client never sent initialize: its lists never change within a
        # connection, so activation shows only after it reconnects.
        return self.protocol_version is None

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _with_done(self, actions: list[Action]) -> list[Action]:
        """``actions``, then the tool calls that got their outcome meanwhile."""
        if not self._done:
            return actions
        done: list[Action] = [ToolCallDone(call) for call in self._done]
        self._done.clear()
        return actions + done

    def _ended(self, request_id: object, data: bytes) -> None:
        """An answer to the client's ``request_id`` is sent: a tool call may end with it."""
        if self.calls.open and isinstance(request_id, str | int):
            call = self.calls.answered(request_id, data, self.now)
            if call is not None:
                self._done.append(call)

    def _result(self, request_id: object, result: Json) -> ToClient:
        if self._stateless:
            result = complete(result)
        return self._answer(request_id, {"jsonrpc": "2.0", "id": request_id, "result": result})

    def _fail(self, request_id: object, code: int, message: str) -> ToClient:
        error = {"code": code, "message": titled(TITLES[code], message)}
        body = {"jsonrpc": "2.0", "id": request_id, "error": error}
        return self._answer(request_id, body, (code, _REASONS.get(code, NONE)))

    def _error(self, request_id: object, error: FabricError) -> ToClient:
        body = {"jsonrpc": "2.0", "id": request_id, "error": error.to_jsonrpc_error()}
        return self._answer(request_id, body, (error.code, error.reason))

    def _answer(
        self, request_id: object, body: Json, error: tuple[int, str] | None = None
    ) -> ToClient:
        data = encoder.encode(body)
        self._ended(request_id, data)
        return ToClient(data, error=error)

    def _begin_call(self, request_id: RequestId, params: Json) -> None:
        """The audit's view of a call (see :func:`audited`)."""
        tool, arguments, traceparent = audited(params)
        self.calls.begin(
            request_id,
            tool=tool,
            # The endpoint's own until routed to a service's tool (see _call_entry).
            service=FABRIC_SERVICE,
            arguments=arguments,
            traceparent=traceparent,
            nbytes=self._message_bytes,
            now=self.now,
        )

    def _refuse_duplicate(self, request_id: RequestId, method: str, params: Json) -> list[Action]:
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
                nbytes=self._message_bytes,
                answer=data,
                now=self.now,
            )
            self._done.append(refused)
        return [ToClient(data, error=(error.code, error.reason))]
