"""Tool calls in flight, from request to outcome: what the audit trail records of each.

Both endpoints own a :class:`ToolCalls`: the per-service relay's session machine and the fabric
endpoint's server. They tell it when a ``tools/call`` request arrives from the client and how it
ends; it hands back one :class:`ToolCall` per request, exactly once, whichever way it ended:

``ok``         the server answered with a result;
``error``      a JSON-RPC error (the server's, or the orchestrator's on its behalf: a container
               that died, a refusal, a shutdown), or a result the tool itself marked
               ``isError``;
``cancelled``  the client cancelled it (``notifications/cancelled``) before any answer;
``no_answer``  the session ended before any answer (the client left mid-call);
``input_required``  (``/mcp``, a 2026-07-28 client) the answer asks the client for input: the
               call waits for the client's retry, which is a call (and a record) of its own.

Only what the audit needs is read from a frame, and only for ``tools/call``: the tool's name,
its arguments (hashed, kept with secrets redacted, or ignored, as the suite says) and the W3C
``traceparent`` a client may put in ``params._meta``. On the relay nothing else about a frame
changes: it is still forwarded byte for byte.

Arguments nested as deep as the decoder accepts never make a call go unrecorded: hashing and
redaction walk them with a stack of their own, not Python's (msgspec's decoder and encoder
stop at Python's recursion limit less the caller's stack, so a value the session's decoder
took may be too deep for them further down the stack), and arguments nested deeper than
:data:`FULL_ARGUMENTS_DEPTH` keep only their hash, flagged, in mode ``full``.

Pure and synchronous; time is given by the caller.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from .deep_json import DeepEncoder, decode_deep
from .jsonrpc import IdInFlight, RequestId

ArgumentsMode = Literal["none", "hash", "full"]
Outcome = Literal["ok", "error", "cancelled", "no_answer", "input_required"]

TOOLS_CALL: Final = "tools/call"
# Arguments kept in full (mode "full") up to this size as JSON; beyond it only their hash.
FULL_ARGUMENTS_BYTES: Final = 16 * 1024
# Arguments kept in full (mode "full") up to this depth of nesting; deeper, only their hash
# (Arguments.too_deep). Why a bound: what reads the record after it (the audit writer's
# encoder, the status page's JSON) recurses per level, further down the stack; MCP arguments
# are a few levels deep.
FULL_ARGUMENTS_DEPTH: Final = 64
# A relayed call's params up to this size are read when the call ends, not as it passes.
LAZY_PARAMS_BYTES: Final = 4 * 1024
# A tool name longer than this is cut (the audit and the metrics' labels stay bounded).
MAX_TOOL_NAME: Final = 256
REDACTED: Final = "[redacted]"
# Keys whose values look like credentials: redacted when arguments are kept in full.
SECRET_KEY = re.compile(
    r"pass(word|wd|phrase)?|secret|token|api[-_]?key|apikey|auth|credential|private[-_]?key"
    r"|cookie|session[-_]?id|bearer|signature|cert",
    re.IGNORECASE,
)


class _Meta(msgspec.Struct):
    traceparent: Any = None


class _CallParams(msgspec.Struct):
    """A call's params as the audit reads them: the arguments decoded in the same pass (to
    be hashed or kept), or skipped (``_CallParamsWithoutArguments``) when they are not
    recorded."""

    name: Any = None
    arguments: Any = msgspec.UNSET
    meta: _Meta | None = msgspec.field(default=None, name="_meta")


class _CallParamsWithoutArguments(msgspec.Struct):
    name: Any = None
    meta: _Meta | None = msgspec.field(default=None, name="_meta")


class _ErrorBody(msgspec.Struct):
    code: Any = None
    data: Any = None


class _Result(msgspec.Struct):
    isError: Any = False  # noqa: N815 (the MCP field's name)
    resultType: Any = None  # noqa: N815 (the MCP field's name)


class _Answer(msgspec.Struct):
    result: _Result | None = None
    error: _ErrorBody | None = None


_params_decoder = msgspec.json.Decoder(_CallParams)
_params_without_arguments_decoder = msgspec.json.Decoder(_CallParamsWithoutArguments)
_answer_decoder = msgspec.json.Decoder(_Answer)
_canonical = DeepEncoder(order="sorted")


@dataclass(frozen=True, slots=True)
class Arguments:
    """What the audit keeps of a call's arguments (see ``orchestrator.audit.arguments``)."""

    sha256: str | None = None  # of their canonical JSON (sorted keys, no spaces)
    full: Any = None  # mode "full": the arguments, secret-looking values redacted
    truncated: bool = False  # mode "full", but too large: only the hash is kept
    too_deep: bool = False  # mode "full", but nested too deep: only the hash is kept


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One finished ``tools/call``, as the audit records it (the driver adds who and where)."""

    request_id: RequestId | None
    tool: str
    service: str | None  # the fabric endpoint's backend ("fabric" for its meta-tools)
    arguments: Arguments
    outcome: Outcome
    error_code: int | None
    error_reason: str | None
    duration: float  # seconds, from the request's arrival to its outcome
    bytes_in: int
    bytes_out: int
    traceparent: str | None  # the client's, from params._meta, when valid
    # The fabric endpoint's backend that served it (its BackendKey's seq; None: none, or the
    # relay's one): which container the record names, when a service runs several at once.
    seq: int | None = None


class ToolCallDone:
    """The action: a ``tools/call`` has its outcome (for the audit trail and the metrics).

    When the outcome is an answer, what it says (a result, an error and its reason) is read
    from the answer only when :attr:`call` is first asked for. Why: the action goes out with
    the answer, and the driver records the call after the answer has left; decoding it here
    would delay every answer by that decode.
    """

    __slots__ = ("_answer", "_call")
    __match_args__ = ("call",)

    def __init__(self, call: ToolCall | None = None, *, answer: _Answered | None = None) -> None:
        assert (call is None) != (answer is None)
        self._call = call
        self._answer = answer

    @property
    def call(self) -> ToolCall:
        if self._call is None:
            assert self._answer is not None
            self._call, self._answer = self._answer.outcome(), None
        return self._call

    @property
    def service(self) -> str | None:
        """The call's service on the fabric endpoint (None on the relay), without reading
        its outcome."""
        if self._call is not None:
            return self._call.service
        assert self._answer is not None
        return self._answer.call.service

    @property
    def seq(self) -> int | None:
        """The backend that served the call on the fabric endpoint (see :attr:`ToolCall.seq`),
        without reading its outcome."""
        if self._call is not None:
            return self._call.seq
        assert self._answer is not None
        return self._answer.call.seq

    @property
    def held_bytes(self) -> int:
        """The bytes of an answer still held for reading its outcome (0 once read)."""
        return len(self._answer.frame) if self._answer is not None else 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolCallDone) and self.call == other.call

    __hash__ = None  # type: ignore[assignment]  # (mutable: the outcome is read once)

    def __repr__(self) -> str:
        return f"ToolCallDone({self.call!r})"


@dataclass(slots=True)
class _Open:
    tool: str
    service: str | None
    arguments: Arguments
    started: float
    bytes_in: int
    traceparent: str | None
    # The relay's request params not read yet (see ToolCalls.begin_params): read when the call
    # ends, which then fills in tool, arguments and traceparent.
    unread: bytes | None = None
    seq: int | None = None  # the backend serving it (see ToolCalls.serve)


@dataclass(frozen=True, slots=True)
class _Answered:
    """A call and the answer that ended it, its outcome not read yet."""

    request_id: RequestId
    call: _Open
    frame: bytes
    now: float
    read: Callable[[_Open], _Open]  # reads the call's own params, if not yet

    def outcome(self) -> ToolCall:
        try:
            answer = _answer_decoder.decode(self.frame)
        except (msgspec.DecodeError, RecursionError):
            answer = _Answer()
        request_id, now, size = self.request_id, self.now, len(self.frame)
        call = self.read(self.call)
        if answer.error is not None:
            code = answer.error.code if isinstance(answer.error.code, int) else None
            data = answer.error.data
            reason = data.get("reason") if isinstance(data, dict) else None
            reason = reason if isinstance(reason, str) else None
            return _done(request_id, call, now, "error", code, reason, bytes_out=size)
        if answer.result is not None and answer.result.isError is True:
            return _done(request_id, call, now, "error", None, "tool_error", bytes_out=size)
        if answer.result is not None and answer.result.resultType == "input_required":
            return _done(request_id, call, now, "input_required", bytes_out=size)
        return _done(request_id, call, now, "ok", bytes_out=size)


class ToolCalls:
    """The ``tools/call`` requests of one session that have no outcome yet."""

    __slots__ = ("mode", "open")

    def __init__(self, mode: ArgumentsMode = "hash") -> None:
        self.mode: ArgumentsMode = mode
        self.open: dict[RequestId, _Open] = {}

    def clone(self) -> ToolCalls:
        twin = ToolCalls(self.mode)
        twin.open = dict(self.open)
        return twin

    # --- beginnings ---------------------------------------------------------------------------

    def begin_params(
        self, request_id: RequestId, params: msgspec.Raw | None, nbytes: int, now: float
    ) -> None:
        """A ``tools/call`` request as the client sent it (the relay): its ``params`` as they
        are in the frame, the frame's size.

        Small params (the usual case) are kept as bytes and read only when the call ends —
        after the request went on to the server, off its path; larger ones are read now, so
        that what is kept per call in flight stays small.
        """
        self._begin(request_id, self._opened(params, nbytes, now))

    def _opened(self, params: msgspec.Raw | None, nbytes: int, now: float) -> _Open:
        if params is not None and len(params) <= LAZY_PARAMS_BYTES:
            return _Open("", None, Arguments(), now, nbytes, None, bytes(params))
        tool, arguments, traceparent = self._read_params(params)
        return _Open(tool, None, arguments, now, nbytes, traceparent)

    def _begin(self, request_id: RequestId, call: _Open) -> None:
        # One id, one call: a second call under an id in flight would replace the first, which
        # would then never be recorded. The machines refuse it before (duplicate_request_id,
        # recorded on its own: see refused_params); this guard holds even if one did not.
        if request_id in self.open:
            raise IdInFlight(f"tool call id {request_id!r} is already in flight")
        self.open[request_id] = call

    def _read_params(self, params: msgspec.Raw | bytes | None) -> tuple[str, Arguments, str | None]:
        """What the audit keeps of a call's params: its tool, arguments and traceparent (one
        decode of the params, the arguments included when they are recorded)."""
        decoded: _CallParams | _CallParamsWithoutArguments | None = None
        if params is not None:
            try:
                if self.mode == "none":
                    decoded = _params_without_arguments_decoder.decode(params)
                else:
                    decoded = _params_decoder.decode(params)
            except RecursionError:
                return self._read_deep_params(params)
            except msgspec.DecodeError:
                decoded = None
        if decoded is None:
            decoded = _CallParamsWithoutArguments()
        arguments = getattr(decoded, "arguments", msgspec.UNSET)
        return (
            _tool_name(decoded.name),
            Arguments() if arguments is msgspec.UNSET else self._arguments(arguments),
            _trace(decoded.meta.traceparent if decoded.meta is not None else None),
        )

    def _read_deep_params(self, params: msgspec.Raw | bytes) -> tuple[str, Arguments, str | None]:
        """:meth:`_read_params` for params too deep for msgspec at this point of the stack (the
        session's decoder took them higher up): decoded with a stack of their own."""
        try:
            value = decode_deep(bytes(params))
        except msgspec.DecodeError:
            value = None
        if not isinstance(value, dict):
            return "", Arguments(), None
        meta = value.get("_meta")
        return (
            _tool_name(value.get("name")),
            self._arguments(value["arguments"]) if "arguments" in value else Arguments(),
            _trace(meta.get("traceparent") if isinstance(meta, dict) else None),
        )

    def _read(self, call: _Open) -> _Open:
        """``call`` with its params read (once: the call is then complete)."""
        if call.unread is not None:
            call.tool, call.arguments, call.traceparent = self._read_params(call.unread)
            call.unread = None
        return call

    def begin(
        self,
        request_id: RequestId,
        *,
        tool: object,
        service: str | None,
        arguments: object,
        traceparent: object,
        nbytes: int,
        now: float,
    ) -> None:
        """A ``tools/call`` request already decoded (the fabric endpoint)."""
        call = self._decoded(
            tool=tool,
            service=service,
            arguments=arguments,
            traceparent=traceparent,
            nbytes=nbytes,
            now=now,
        )
        self._begin(request_id, call)

    def _decoded(
        self,
        *,
        tool: object,
        service: str | None,
        arguments: object,
        traceparent: object,
        nbytes: int,
        now: float,
    ) -> _Open:
        """A call's open entry from params already decoded (see :meth:`_opened` for raw ones)."""
        return _Open(
            _tool_name(tool), service, self._arguments(arguments), now, nbytes, _trace(traceparent)
        )

    def refused_params(
        self,
        request_id: RequestId,
        params: msgspec.Raw | None,
        nbytes: int,
        answer: bytes,
        now: float,
    ) -> ToolCallDone:
        """A ``tools/call`` the orchestrator refused before it began, because its id is already
        in flight (as :meth:`begin_params`, and ``answer``: the refusal sent to the client).

        It gets a record of its own, as every call does; the call open under that id is left
        as it is, to be recorded once when it ends.
        """
        return ToolCallDone(
            answer=_Answered(request_id, self._opened(params, nbytes, now), answer, now, self._read)
        )

    def refused(
        self,
        request_id: RequestId,
        *,
        tool: object,
        service: str | None,
        arguments: object,
        traceparent: object,
        nbytes: int,
        answer: bytes,
        now: float,
    ) -> ToolCall:
        """As :meth:`refused_params`, for a request already decoded (the fabric endpoint)."""
        call = self._decoded(
            tool=tool,
            service=service,
            arguments=arguments,
            traceparent=traceparent,
            nbytes=nbytes,
            now=now,
        )
        return _Answered(request_id, call, answer, now, self._read).outcome()

    def route(self, request_id: RequestId, service: str, tool: str) -> None:
        """The fabric endpoint resolved the call to ``service``'s own ``tool``."""
        call = self.open.get(request_id)
        if call is not None:
            call.service, call.tool = service, tool[:MAX_TOOL_NAME]

    def serve(self, request_id: RequestId, seq: int) -> None:
        """The fabric endpoint sent the call to its backend ``seq`` (its record names it)."""
        call = self.open.get(request_id)
        if call is not None:
            call.seq = seq

    # --- outcomes -----------------------------------------------------------------------------

    def answer(self, request_id: RequestId | None, frame: bytes, now: float) -> ToolCallDone | None:
        """The answer (as sent to the client) to ``request_id``, if it is a call in flight: the
        call's end, its outcome read from ``frame`` when first asked for."""
        call = self.open.pop(request_id, None) if request_id is not None else None
        if call is None:
            return None
        assert request_id is not None
        return ToolCallDone(answer=_Answered(request_id, call, frame, now, self._read))

    def answered(self, request_id: RequestId | None, frame: bytes, now: float) -> ToolCall | None:
        """As :meth:`answer`, the outcome read at once."""
        done = self.answer(request_id, frame, now)
        return None if done is None else done.call

    def cancelled(self, request_id: RequestId | None, now: float) -> ToolCall | None:
        call = self.open.pop(request_id, None) if request_id is not None else None
        if call is None:
            return None
        return _done(request_id, self._read(call), now, "cancelled")

    def abandon(self, now: float) -> list[ToolCall]:
        """The session ends: every call still open had no answer."""
        done = [
            _done(request_id, self._read(call), now, "no_answer")
            for request_id, call in self.open.items()
        ]
        self.open.clear()
        return done

    # --- arguments ----------------------------------------------------------------------------

    def _arguments(self, value: object) -> Arguments:
        if self.mode == "none" or value is None:
            return Arguments()
        try:
            canonical = canonical_json(value)
        except TypeError:
            return Arguments()
        digest = hashlib.sha256(canonical).hexdigest()
        if self.mode == "hash":
            return Arguments(sha256=digest)
        if len(canonical) > FULL_ARGUMENTS_BYTES:
            return Arguments(sha256=digest, truncated=True)
        if nested_deeper_than(value, FULL_ARGUMENTS_DEPTH):
            return Arguments(sha256=digest, too_deep=True)
        return Arguments(sha256=digest, full=redact(value))


def _done(  # noqa: PLR0917 (the outcome's parts, in the order a reader expects)
    request_id: RequestId | None,
    call: _Open,
    now: float,
    outcome: Outcome,
    code: int | None = None,
    reason: str | None = None,
    *,
    bytes_out: int = 0,
) -> ToolCall:
    return ToolCall(
        request_id=request_id,
        tool=call.tool,
        service=call.service,
        arguments=call.arguments,
        outcome=outcome,
        error_code=code,
        error_reason=reason,
        duration=max(0.0, now - call.started),
        bytes_in=call.bytes_in,
        bytes_out=bytes_out,
        traceparent=call.traceparent,
        seq=call.seq,
    )


def _tool_name(tool: object) -> str:
    return tool[:MAX_TOOL_NAME] if isinstance(tool, str) else ""


def _trace(traceparent: object) -> str | None:
    if isinstance(traceparent, str) and valid_traceparent(traceparent):
        return traceparent
    return None


def redact(value: object) -> object:
    """``value`` with the values of secret-looking keys replaced, at any depth.

    A copy made with a stack of its own (a list), not Python's: no depth of nesting makes it
    fail (a recursive copy failed at about 500 levels, half the decoder's limit).
    """
    copy = _shell(value)
    pending: list[tuple[Any, Any]] = [(value, copy)] if copy is not value else []
    while pending:
        original, shell = pending.pop()
        if isinstance(original, dict):
            for key, item in original.items():
                if isinstance(key, str) and SECRET_KEY.search(key):
                    shell[key] = REDACTED
                    continue
                shell[key] = child = _shell(item)
                if child is not item:
                    pending.append((item, child))
        else:
            for item in original:
                child = _shell(item)
                shell.append(child)
                if child is not item:
                    pending.append((item, child))
    return copy


def _shell(value: object) -> Any:
    """An empty container of ``value``'s kind, to be filled; any other value itself."""
    if isinstance(value, dict):
        return {}
    if isinstance(value, list):
        return []
    return value


def nested_deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` has objects or arrays nested more than ``limit`` levels (walked with
    a stack of its own)."""
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children)
    return False


def canonical_json(value: object) -> bytes:
    """``value`` as canonical JSON (keys sorted, no spaces), what the audit hashes; made at
    any depth of nesting (see :mod:`.deep_json`). Raises TypeError for a value JSON cannot
    hold."""
    return _canonical.encode(value)


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


def valid_traceparent(text: str) -> bool:
    """A W3C ``traceparent`` we can use: version 00 form, trace and parent ids not all zero."""
    match = _TRACEPARENT.fullmatch(text)
    if match is None or text.startswith("ff"):
        return False
    trace_id, parent_id = match.groups()
    return trace_id != "0" * 32 and parent_id != "0" * 16


def result_type(frame: bytes) -> object:
    """The ``resultType`` of an answer's result (None: it has none, or is not an answer): the
    one decoding of an answer's envelope, shared with the outcome's (see :class:`_Answered`)."""
    try:
        answer = _answer_decoder.decode(frame)
    except (msgspec.DecodeError, RecursionError):
        return None
    return None if answer.result is None else answer.result.resultType
