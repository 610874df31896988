"""The warm pool's greeting of a pooled container of a ``fresh_per_call`` service. Pure.

On the fabric endpoint (``/mcp``) the orchestrator is its backends' MCP client, and a
per-call service's container serves one call: its handshake would be paid at every call. So
the pool greets such a container while it waits (:class:`Greeting`): the same ``initialize``
the fabric endpoint greets its backends with (:mod:`.fabric_backends`), offering roots,
sampling and elicitation always — the router answers a backend's request for a capability the
session's client lacks with an error, as it does for any backend — then
``notifications/initialized``. A session of the fabric endpoint that takes it skips its own
handshake (``BackendStarted.greeting``).

The answer is read within :data:`GREETING_SECONDS` and :data:`MAX_GREETING_BYTES` (everything
the server wrote until its answer ended, the answer included: the InitializeResult kept with
the pooled container is bounded by it). Notifications before the answer (a server's log lines)
are the pool's, never a session's; what follows the answer's line is the session's, as any
early output is. A container that refuses, answers anything else, asks something first, writes
more, ends its output or does not answer in time failed its greeting: it is removed and
replaced at the pool's refill rate (see :mod:`.warm_pool`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from .fabric_messages import SERVER_NAME, encoder, notification_bytes
from .mcp import CLIENT_VERSION

# How long a pooled server may take to answer its greeting.
GREETING_SECONDS: Final = 10.0
# Bytes a pooled server may write until its answer to the greeting ended (the answer included).
MAX_GREETING_BYTES: Final = 64 * 1024
# The greeting's request id (the router numbers its own from 1: a late line never matches).
GREETING_ID: Final = 0
# What the pool offers as a client: everything the router may pass on to a session's client.
CAPABILITIES: Final = {"roots": {"listChanged": False}, "sampling": {}, "elicitation": {}}

# Why a greeting failed (the pool's log, and its reason for removing the container).
GreetingFailure = Literal[
    "greeting_refused",  # an error answer
    "greeting_invalid",  # not JSON-RPC, another id, a result that is no object, a request
    "greeting_too_large",  # more than MAX_GREETING_BYTES before the answer ended
    "greeting_timeout",  # no answer within GREETING_SECONDS
    "greeting_exited",  # its output ended first
]


@dataclass(frozen=True)
class Greeted:
    """The server answered: its InitializeResult (JSON), and the bytes it wrote after the
    answer's line (the session's)."""

    result: bytes
    rest: bytes


@dataclass(frozen=True)
class GreetingFailed:
    reason: GreetingFailure
    detail: str


Outcome = Greeted | GreetingFailed


def initialize_request(version: str) -> bytes:
    """The greeting's line: the router's ``initialize``, with every capability offered."""
    request = {
        "jsonrpc": "2.0",
        "id": GREETING_ID,
        "method": "initialize",
        "params": {
            "protocolVersion": CLIENT_VERSION,
            "capabilities": CAPABILITIES,
            "clientInfo": {"name": SERVER_NAME, "version": version},
        },
    }
    return encoder.encode(request) + b"\n"


INITIALIZED: Final = notification_bytes("notifications/initialized", None) + b"\n"


class Greeting:
    """One greeting's reading: fed the server's stdout as it comes (:meth:`feed`), it says
    when the answer is there, or why the greeting failed (then, and after an outcome, it is
    not fed any more)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._read = 0

    def feed(self, data: bytes) -> Outcome | None:
        """More of the server's stdout; None while the answer is still to come."""
        self._read += len(data)
        self._buffer += data
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end])
            consumed = self._read - (len(self._buffer) - end - 1)
            if consumed > MAX_GREETING_BYTES:
                return self._too_large()
            del self._buffer[: end + 1]
            outcome = _line(line)
            if isinstance(outcome, Greeted):
                return Greeted(outcome.result, bytes(self._buffer))
            if outcome is not None:
                return outcome
        # The answer's line cannot end within the bound any more.
        return self._too_large() if self._read > MAX_GREETING_BYTES else None

    @staticmethod
    def ended() -> GreetingFailed:
        """The server's output ended before its answer."""
        return GreetingFailed("greeting_exited", "its output ended before it answered initialize")

    @staticmethod
    def expired() -> GreetingFailed:
        return GreetingFailed(
            "greeting_timeout", f"no answer to initialize within {GREETING_SECONDS:g} s"
        )

    @staticmethod
    def _too_large() -> GreetingFailed:
        return GreetingFailed(
            "greeting_too_large",
            f"more than {MAX_GREETING_BYTES} bytes before its answer to initialize ended",
        )


def _line(line: bytes) -> Outcome | None:
    """One line before the answer: the answer (its result), a failure, or None (a
    notification, a blank line: read on)."""
    if not line.strip():
        return None
    try:
        message: Any = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return GreetingFailed("greeting_invalid", "a line that is not JSON")
    if not isinstance(message, dict):
        return GreetingFailed("greeting_invalid", "a line that is no JSON-RPC message")
    return _message(message)


def _message(message: dict[str, Any]) -> Outcome | None:
    if "method" in message:
        if "id" not in message:
            return None  # a notification (a log line): the pool's, not a session's
        return GreetingFailed(
            "greeting_invalid", f"it asked {str(message['method'])[:80]!r} before answering"
        )
    if message.get("id") != GREETING_ID:
        return GreetingFailed("greeting_invalid", "an answer to a request it was not sent")
    if "error" in message:
        error = message["error"]
        detail = error.get("message") if isinstance(error, dict) else None
        return GreetingFailed("greeting_refused", f"it refused initialize: {str(detail)[:200]}")
    result = message.get("result")
    if not isinstance(result, dict):
        return GreetingFailed("greeting_invalid", "its answer to initialize has no result object")
    return Greeted(encoder.encode(result), b"")
