"""What both endpoints answer with when a session, a backend or a request cannot go on: the
errors and notices of their own, and the session's bounds. Pure (no I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from .._errors import ClientDidNotAnswer, ContainerStartFailure, SessionEnding
from .._reasons import (
    CLIENT_DID_NOT_ANSWER,
    CONTAINER_EXITED,
    CONTAINER_OUTPUT_INVALID,
    CONTAINER_UNRESPONSIVE,
    ORCHESTRATOR_STOPPING,
    SESSION_ENDED_BY_OPERATOR,
    TOO_MANY_REQUESTS_TO_CLIENT,
)

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_NORMAL",
    "ENDED_BY_OPERATOR",
    "MAX_SERVER_REQUESTS",
    "ORCHESTRATOR_STOPPING",
    "OUTPUT_INVALID",
    "UNRESPONSIVE",
    "SessionLimits",
    "client_did_not_answer",
    "container_exited",
    "log_notification",
    "session_ending",
    "too_many_requests_to_client",
]

CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001

# Server→client requests (sampling, roots, elicitation) awaiting the client at once, per client
# session — the relay's and the fabric endpoint's: beyond it the server is answered at once
# (:func:`too_many_requests_to_client`), never the client asked.
MAX_SERVER_REQUESTS: Final = 256

# Why a backend is broken: its output broke the framing, or it stopped reading its stdin.
OUTPUT_INVALID: Final = CONTAINER_OUTPUT_INVALID
UNRESPONSIVE: Final = CONTAINER_UNRESPONSIVE

# The reasons of a Shutdown (ORCHESTRATOR_STOPPING is the _reasons constant itself).
ENDED_BY_OPERATOR: Final = SESSION_ENDED_BY_OPERATOR


@dataclass(frozen=True)
class SessionLimits:
    """Bounds of one session (see ``orchestrator.limits`` in the suite)."""

    # Client bytes waiting for the container or not yet written to its stdin: beyond this the
    # client is not read from (a fast client stalls only itself).
    to_server_bytes: int = 1024 * 1024
    # How long a fresh container may take to answer the replayed `initialize`.
    replay_timeout: float = 30.0
    # How long a server→client request (sampling, roots, elicitation) may wait for the client.
    # Defaults to the service's idle timeout, so it never holds a container past it.
    server_request_timeout: float | None = None
    # Client requests awaiting an answer at once; beyond it a request is refused at once.
    max_in_flight: int = 1024
    # Server→client requests awaiting the client at once; beyond it the server is answered at
    # once (they are tracked, and each may have to be answered when it expires).
    max_server_requests: int = MAX_SERVER_REQUESTS
    # A container that takes none of the bytes written to its stdin for this long is replaced.
    stdin_stall_timeout: float = 120.0


def session_ending(reason: str) -> SessionEnding:
    """What requests in flight get when their session must end (see :class:`~.events.Shutdown`)."""
    if reason == ENDED_BY_OPERATOR:
        return SessionEnding(
            "an operator of the orchestrator ended this session; its containers were removed "
            "(reconnect to start again)",
            reason=ENDED_BY_OPERATOR,
        )
    return SessionEnding(
        "the orchestrator is stopping; this request will not be answered", reason=reason
    )


def log_notification(level: str, text: str) -> bytes:
    """An MCP ``notifications/message`` from the orchestrator itself."""
    message = {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {"level": level, "logger": "reactor-fabric", "data": text},
    }
    return json.dumps(message).encode()


def client_did_not_answer() -> ClientDidNotAnswer:
    """What a server gets for a request to the client that expired unanswered (-32006)."""
    return ClientDidNotAnswer(
        "the client did not answer this request in time", reason=CLIENT_DID_NOT_ANSWER
    )


def too_many_requests_to_client(limit: int) -> ClientDidNotAnswer:
    """What a server gets for one request to the client too many (-32006, to the server only):
    ``limit`` of its session's already wait for the client."""
    return ClientDidNotAnswer(
        f"{limit} requests to the client are already waiting",
        reason=TOO_MANY_REQUESTS_TO_CLIENT,
    )


def container_exited(
    service_name: str,
    exit_code: int | None,
    oom_killed: bool,
    stderr: list[str],
    **data: object,
) -> ContainerStartFailure:
    """What the requests a container owed get when it exited on its own (-32002)."""
    how = (f" with code {exit_code}" if exit_code is not None else "") + (
        " (out of memory)" if oom_killed else ""
    )
    return ContainerStartFailure(
        f"the {service_name} server exited{how} before answering",
        reason=CONTAINER_EXITED,
        **data,
        exit_code=exit_code,
        oom_killed=oom_killed,
        stderr=stderr,
    )
