"""JSON-RPC 2.0 envelopes: peeking at a frame without re-encoding it, and building errors.

The relay forwards frames byte-for-byte; it only *peeks* at the envelope (``id``, ``method``,
whether it is a result or error) to know which requests are in flight. msgspec decodes a struct
with just these fields and skips everything else, so a peek costs one pass over the bytes and no
allocation for the payload.

Pure and synchronous.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from .._errors import FabricError, InvalidRequest, ParseError

RequestId = str | int


class _Envelope(msgspec.Struct):
    id: Any = msgspec.UNSET
    method: Any = msgspec.UNSET
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_envelope_decoder = msgspec.json.Decoder(_Envelope)


@dataclass(frozen=True)
class Peek:
    """What the relay needs to know about one message."""

    kind: str  # "request", "notification" or "response"
    id: RequestId | None
    method: str | None
    params: msgspec.Raw | None

    @property
    def is_request(self) -> bool:
        return self.kind == "request"

    @property
    def is_response(self) -> bool:
        return self.kind == "response"


def peek(frame: bytes | str) -> Peek:
    """Classify one JSON-RPC message; raise ParseError / InvalidRequest if it is not one.

    A batch (a JSON array) is an :class:`InvalidRequest`: batches were removed from MCP in
    2025-06-18 and real stdio servers mishandle them.
    """
    data = frame.encode() if isinstance(frame, str) else frame
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.ValidationError as exc:
        stripped = data.lstrip()
        if stripped.startswith(b"["):
            raise InvalidRequest(
                "JSON-RPC batches are not supported (they were removed from MCP in 2025-06-18)",
                reason="batch_not_supported",
            ) from exc
        raise InvalidRequest(
            f"a JSON-RPC message must be a JSON object: {exc}", reason="not_an_object"
        ) from exc
    except msgspec.DecodeError as exc:
        raise ParseError(f"not valid JSON: {exc}", reason="invalid_json") from exc

    message_id = envelope.id
    has_id = message_id is not msgspec.UNSET
    is_error = envelope.error is not msgspec.UNSET
    if message_id is None and is_error and envelope.method is msgspec.UNSET:
        # An error answering a message the peer could not parse has a null id.
        return Peek("response", None, None, None)
    if has_id and not _valid_id(message_id):
        raise InvalidRequest("a request id must be a string or an integer", reason="invalid_id")
    method = envelope.method
    params = envelope.params if isinstance(envelope.params, msgspec.Raw) else None
    if method is not msgspec.UNSET:
        if not isinstance(method, str) or not method:
            raise InvalidRequest("method must be a non-empty string", reason="invalid_method")
        if has_id:
            return Peek("request", message_id, method, params)
        return Peek("notification", None, method, params)
    if has_id and (envelope.result is not msgspec.UNSET or is_error):
        return Peek("response", message_id, None, None)
    raise InvalidRequest("not a JSON-RPC request, notification or response", reason="not_jsonrpc")


def _valid_id(value: object) -> bool:
    # JSON-RPC allows null ids only in error responses to unparseable requests; MCP forbids null.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


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


def error_response(request_id: RequestId | None, error: FabricError) -> bytes:
    """A JSON-RPC error response answering ``request_id`` with the product's error."""
    return msgspec.json.encode(
        {"jsonrpc": "2.0", "id": request_id, "error": error.to_jsonrpc_error()}
    )


def result_response(request_id: RequestId, result: Any) -> bytes:
    return msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "result": result})


def with_id(frame: bytes, new_id: RequestId) -> bytes:
    """The same request with another id (used only for the orchestrator's own replays)."""
    message = msgspec.json.decode(frame)
    message["id"] = new_id
    return msgspec.json.encode(message)
