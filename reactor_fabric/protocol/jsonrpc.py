"""JSON-RPC 2.0 envelopes: peeking at a frame without re-encoding it, and building answers.

The relay forwards frames byte-for-byte; it only *peeks* at the envelope (``id``, ``method``,
whether it is a result or an error) to know which requests are in flight. msgspec decodes a
struct with just these fields and skips everything else, so a peek costs one pass over the bytes
and no allocation for the payload.

Hostile input is refused with the documented error, never with an escaping exception: JSON
nested deeper than the decoder allows and invalid UTF-8 are parse errors (-32700), like any other
frame that is not JSON. The depth bound is msgspec's: it stops at Python's recursion limit
(about 1,000 levels less the caller's stack), after a few microseconds of work, so a
100,000-deep message costs no more than a 1,000-deep one. No MCP message comes near it.

Pure and synchronous.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
from typing import Any, Final

import msgspec

from .._errors import FabricError, InvalidRequest, ParseError
from .._reasons import (
    BATCH_NOT_SUPPORTED,
    DUPLICATE_REQUEST_ID,
    INVALID_ID,
    INVALID_JSON,
    INVALID_METHOD,
    INVALID_UTF8,
    JSON_TOO_DEEP,
    NOT_AN_OBJECT,
    NOT_JSONRPC,
)

RequestId = str | int

REQUEST: Final = "request"
NOTIFICATION: Final = "notification"
RESPONSE: Final = "response"


class _Envelope(msgspec.Struct):
    id: Any = msgspec.UNSET
    method: Any = msgspec.UNSET
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_envelope_decoder = msgspec.json.Decoder(_Envelope)


class Peek:
    """What the relay needs to know about one message."""

    __slots__ = ("failed", "id", "kind", "method", "params", "result")

    def __init__(
        self,
        kind: str,
        id: RequestId | None,
        method: str | None,
        params: msgspec.Raw | None,
        *,
        failed: bool = False,
        result: msgspec.Raw | None = None,
    ) -> None:
        self.kind = kind  # REQUEST, NOTIFICATION or RESPONSE
        self.id = id
        self.method = method
        self.params = params
        self.failed = failed  # a response carrying an error
        # The message's "result", undecoded, whatever its kind (a request or notification
        # should have none: the suite lock checks what one carries all the same).
        self.result = result

    @property
    def is_request(self) -> bool:
        return self.kind == REQUEST

    @property
    def is_response(self) -> bool:
        return self.kind == RESPONSE

    def __repr__(self) -> str:
        return f"Peek({self.kind}, id={self.id!r}, method={self.method!r})"


def peek(frame: bytes | str) -> Peek:
    """Classify one JSON-RPC message; raise ParseError / InvalidRequest if it is not one.

    A batch (a JSON array) is an :class:`InvalidRequest`: batches were removed from MCP in
    2025-06-18 and real stdio servers mishandle them. When the frame is a usable object with a
    valid id but is refused for another reason, the error carries that id (``request_id``) so
    that the answer reaches the request that caused it.
    """
    data = frame.encode() if isinstance(frame, str) else frame
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.ValidationError as exc:
        if data.lstrip().startswith(b"["):
            raise InvalidRequest(
                "JSON-RPC batches are not supported (they were removed from MCP in 2025-06-18)",
                reason=BATCH_NOT_SUPPORTED,
            ) from exc
        raise InvalidRequest(
            f"a JSON-RPC message must be a JSON object: {exc}", reason=NOT_AN_OBJECT
        ) from exc
    except msgspec.DecodeError as exc:
        raise _not_utf8(data) or ParseError(f"not valid JSON: {exc}", reason=INVALID_JSON) from exc
    except UnicodeDecodeError as exc:
        raise ParseError(f"not valid UTF-8: {exc.reason}", reason=INVALID_UTF8) from exc
    except RecursionError as exc:
        raise _too_deep() from exc

    message_id = envelope.id
    has_id = message_id is not msgspec.UNSET
    is_error = envelope.error is not msgspec.UNSET
    result = envelope.result if isinstance(envelope.result, msgspec.Raw) else None
    if message_id is None and is_error and envelope.method is msgspec.UNSET:
        # An error answering a message the peer could not parse has a null id.
        return Peek(RESPONSE, None, None, None, failed=True, result=result)
    if has_id and not _valid_id(message_id):
        raise InvalidRequest("a request id must be a string or an integer", reason=INVALID_ID)
    method = envelope.method
    params = envelope.params if isinstance(envelope.params, msgspec.Raw) else None
    if method is not msgspec.UNSET:
        if not isinstance(method, str) or not method:
            raise InvalidRequest(
                "method must be a non-empty string",
                reason=INVALID_METHOD,
                request_id=message_id if has_id else None,
            )
        if has_id:
            return Peek(REQUEST, message_id, method, params, result=result)
        return Peek(NOTIFICATION, None, method, params, result=result)
    if has_id and (result is not None or is_error):
        return Peek(RESPONSE, message_id, None, None, failed=is_error, result=result)
    raise InvalidRequest(
        "not a JSON-RPC request, notification or response",
        reason=NOT_JSONRPC,
        request_id=message_id if has_id else None,
    )


def _not_utf8(data: bytes) -> ParseError | None:
    """invalid_utf8 for a frame msgspec refused that is not UTF-8, else None.

    Why on the error path: msgspec up to 0.22 let Python's UnicodeDecodeError out of a string
    that was not UTF-8, 0.23 raises its own DecodeError ("Invalid UTF-8 encoded string"); which
    one is an implementation detail, so the reason is decided here from the bytes themselves.
    """
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ParseError(f"not valid UTF-8: {exc.reason}", reason=INVALID_UTF8)
    return None


def _too_deep() -> ParseError:
    return ParseError(
        f"JSON nested deeper than the decoder's limit (about {sys.getrecursionlimit()} levels)",
        reason=JSON_TOO_DEEP,
    )


def _valid_id(value: object) -> bool:
    # JSON-RPC allows null ids only in error responses to unparseable requests; MCP forbids null.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


# What JavaScript's Number() trims from a string (WhiteSpace and LineTerminator: the Zs
# category, BOM, tab, vertical tab, form feed, the line ends) and the numbers it reads there
# (decimal, Infinity, and 0x/0o/0b integers; no separators, ASCII digits only).
_JS_SPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_JS_DECIMAL = re.compile(r"[+-]?(?:Infinity|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)")
_JS_PREFIXED = re.compile(r"0(?:[xX][0-9a-fA-F]+|[oO][0-7]+|[bB][01]+)")


def id_readings(request_id: RequestId) -> frozenset[int | float]:
    """The numbers clients read ``request_id`` as when they match a response with the request
    it answers: the TypeScript SDK looks its requests up by ``Number(response.id)`` (a double:
    ``"41"``, ``" 41 "``, ``"0x29"``, ``"4.1e1"`` and ``41`` are one request), the Python SDK
    by ``int(response.id)`` for a string (``"+41"``, ``"4_1"``, ``"٤١"`` too). Two ids with a
    reading in common may be taken for one another by some client (empty: none is a number)."""
    if isinstance(request_id, int):
        return frozenset((request_id, _double(request_id)))
    readings: set[int | float] = set()
    text = request_id.strip(_JS_SPACE)
    if not text:
        readings.add(0)  # (Number("") is 0)
    elif _JS_DECIMAL.fullmatch(text):
        readings.add(float(text))
    elif _JS_PREFIXED.fullmatch(text):
        readings.add(_double(int(text, 0)))
    with contextlib.suppress(ValueError):  # (not an integer to Python either)
        readings.add(int(request_id))
    return frozenset(readings)


def _double(value: int) -> float:
    """An integer as a double holds it (JavaScript's numbers): rounded, or infinite."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def duplicate_request(request_id: RequestId) -> InvalidRequest:
    """The answer to a request whose id is already in flight in the same direction.

    JSON-RPC ids must be unique among a peer's requests in flight: a second request under one
    id would leave its answer ambiguous, and the books kept per id (what the container owes,
    the audit's open calls) would lose the first. Refused before it goes anywhere, on every
    transport.
    """
    return InvalidRequest(
        f"request id {request_id!r} is already in flight in this session",
        reason=DUPLICATE_REQUEST_ID,
        request_id=request_id,
    )


class IdInFlight(AssertionError):
    """A second request under an id already in flight reached the books kept per id (the
    ledger, the open tool calls). The machines refuse such a request first
    (:func:`duplicate_request`); this is the books' own guard, kept under ``python -O`` too,
    so that one id can never stand for two requests there."""


def decode_params(params: msgspec.Raw | None) -> Any:
    """The params of a peeked message as Python data (only for the few messages we handle)."""
    if params is None:
        return None
    return msgspec.json.decode(params)


def for_stdio(frame: bytes) -> bytes:
    """The frame as one stdio line (without the newline).

    JSON strings cannot contain raw line breaks, so any CR/LF in a frame is whitespace between
    tokens; only then is the frame rewritten (compacted). Otherwise it passes untouched.
    """
    if b"\n" in frame or b"\r" in frame:
        return msgspec.json.format(frame, indent=-1)
    return frame


_encoder = msgspec.json.Encoder()


def error_response(request_id: object, error: FabricError) -> bytes:
    """A JSON-RPC error response answering ``request_id`` with the product's error.

    An id that is not a valid JSON-RPC id (the request could not be read) becomes ``null``.
    """
    answer_id = request_id if _valid_id(request_id) else None
    return _encoder.encode({"jsonrpc": "2.0", "id": answer_id, "error": error.to_jsonrpc_error()})


def result_response(request_id: RequestId, result: Any) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "id": request_id, "result": result})


def with_id(frame: bytes, new_id: RequestId) -> bytes:
    """The same request with another id (used only for the orchestrator's own replays)."""
    message = msgspec.json.decode(frame)
    message["id"] = new_id
    return _encoder.encode(message)
