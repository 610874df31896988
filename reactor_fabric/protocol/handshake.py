"""The first message of a connection: ``fabric/registerClient`` or anything else.

Only the first message is handled by the orchestrator itself (spec §4):

- ``fabric/registerClient``, as a method or as a ``tools/call`` of a tool with that name, carries
  the client's mounts; the orchestrator answers it (``{sessionId, mounts}`` as the result, or as
  a CallToolResult's ``structuredContent``) and the message is not forwarded.
- Anything else (``initialize``, ``server/discover``, …) is forwarded unchanged; mounts then come
  from the URL query.

Pure: bytes in, a decision out; the answers are bytes ready to send.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .._errors import InvalidRequest
from .._reasons import REGISTER_WITHOUT_ID, REGISTER_WITHOUT_MOUNTS, UNEXPECTED_RESPONSE
from .jsonrpc import Peek, RequestId, decode_params, peek, result_response

REGISTER_METHOD = "fabric/registerClient"


@dataclass(frozen=True)
class RegisterClient:
    """The client registered itself; answer it, do not forward it."""

    id: RequestId
    form: Literal["method", "tool"]
    mounts: object  # as sent; validated by the MountPolicy


@dataclass(frozen=True)
class ForwardFirst:
    """A standard MCP message: forward it as is."""

    peek: Peek


FirstMessage = RegisterClient | ForwardFirst


def classify_first_message(frame: bytes) -> FirstMessage:
    """Decide what the first frame is; ParseError / InvalidRequest if it is unusable."""
    message = peek(frame)
    if message.kind == "response":
        raise InvalidRequest(
            "the first message must be a request or notification, not a response",
            reason=UNEXPECTED_RESPONSE,
        )
    params = decode_params(message.params) if message.method in _REGISTER_CARRIERS else None
    if message.method == REGISTER_METHOD:
        return RegisterClient(_require_id(message), "method", _mounts_of(params, message))
    if (
        message.method == "tools/call"
        and isinstance(params, dict)
        and params.get("name") == REGISTER_METHOD
    ):
        arguments = params.get("arguments")
        return RegisterClient(_require_id(message), "tool", _mounts_of(arguments, message))
    return ForwardFirst(message)


_REGISTER_CARRIERS = (REGISTER_METHOD, "tools/call")


def _require_id(message: Peek) -> RequestId:
    if message.id is None:
        raise InvalidRequest(
            f"{REGISTER_METHOD} must be a request (with an id), not a notification",
            reason=REGISTER_WITHOUT_ID,
        )
    return message.id


def _mounts_of(params: Any, message: Peek) -> object:
    if not isinstance(params, dict) or "mounts" not in params:
        raise InvalidRequest(
            f'{REGISTER_METHOD} needs params {{"mounts": [...]}}',
            reason=REGISTER_WITHOUT_MOUNTS,
            request_id=message.id,
        )
    return params["mounts"]


class Mount(Protocol):
    """A validated mount as the answer reports it (policy's MountSpec is one)."""

    @property
    def source(self) -> str: ...

    @property
    def target(self) -> str: ...

    @property
    def read_only(self) -> bool: ...


def register_answer(request: RegisterClient, session_id: str, mounts: Sequence[Mount]) -> bytes:
    """The orchestrator's response to a registerClient request, in the request's form."""
    registered: dict[str, Any] = {
        "sessionId": session_id,
        "mounts": [
            {"source": m.source, "target": m.target, "readOnly": m.read_only} for m in mounts
        ],
    }
    if request.form == "method":
        return result_response(request.id, registered)
    text = f"Registered session {session_id} with {len(mounts)} mount(s): " + json.dumps(
        registered["mounts"]
    )
    return result_response(
        request.id,
        {
            "content": [{"type": "text", "text": text}],
            "structuredContent": registered,
            "isError": False,
        },
    )
