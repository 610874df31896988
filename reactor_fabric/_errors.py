"""The exception tree, and how each exception becomes a JSON-RPC error.

Every error the orchestrator raises on purpose derives from :class:`FabricError`::

    FabricError
    ├── DockerUnavailable          -32001  the engine cannot be reached or timed out
    ├── ContainerStartFailure      -32002  image missing, create/start failed, the server died
    ├── SessionRefused             -32002  no session now: at the session limit, or stopping
    ├── SessionEnding              -32002  the session is ended: the orchestrator stops, an operator
    ├── SessionCrashed             -32002  a bug in the orchestrator ended the session (logged)
    ├── AgentBusy                  -32002  an agent call over orchestrator.agents' limits
    ├── InvalidSuiteConfiguration  -32003  the suite file is malformed or logically invalid
    ├── SecurityViolation          -32004  a refused mount, target or origin
    ├── ServiceNotFound            -32005  the requested service is not in the suite
    ├── ClientDidNotAnswer         -32006  (to a server) its request to the client got no answer
    └── InvalidMessage                     a first message that is not usable JSON-RPC
        ├── ParseError             -32700  not JSON
        └── InvalidRequest         -32600  JSON, but not a single request object

-32001 has one meaning: the engine (or the Kubernetes API) cannot be reached. A server's request
that the client never answered has its own code, -32006; it goes to the server, never to a
client. SessionRefused, SessionEnding and SessionCrashed answer -32002 on the wire, as the
contract has always said for a refused, ended or crashed session, but their names say what they
are: no container failed.

**The message is what people read.** Many clients print only an error's ``message`` (Python's
``str(exc)``, the Inspector, Claude Code), never ``data``. So the message is the title, then the
reason in words: ``Security Violation: mount '/etc' resolves outside the allowed mount roots``.
The title is the code's (the founding document's titles), except for the events that title would
misname (:data:`TITLE_BY_REASON`: a container that started and later died, a shutdown); the code
stays, since clients test it. ``data.reason`` and ``data.detail`` are what they always were.

Backend errors (the engine's, sockets, YAML) are translated into these at the boundary where they
happen, so the rest of the code only ever sees this tree. Each carries a stable, machine-readable
``reason`` (a constant of :mod:`reactor_fabric._reasons`, documented in ``docs/USAGE.md``) and
optional ``detail`` fields that end up in the JSON-RPC error's ``data``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

from ._reasons import (
    AGENT_BUSY,
    BACKEND_LIST_TOO_LARGE,
    CONNECTION_CLOSED,
    CONTAINER_EXITED,
    CONTAINER_OUTPUT_INVALID,
    CONTAINER_UNRESPONSIVE,
    INTERNAL_ERROR,
    ISSUER_UNAVAILABLE,
    KUBERNETES_TIMEOUT,
    KUBERNETES_UNAVAILABLE,
    ORCHESTRATOR_STOPPING,
    ORCHESTRATOR_UNREACHABLE,
    RATE_LIMITED,
    SESSION_ENDED,
    SESSION_ENDED_BY_OPERATOR,
    TOO_MANY_PER_CALL_CONTAINERS,
    TOO_MANY_REQUESTS_IN_FLIGHT,
    TOO_MANY_SESSIONS,
    USER_SESSION_LIMIT,
    WORKSPACE_BASE_UNKNOWN,
    WORKSPACE_FAILED,
    WORKSPACE_NOT_A_REPOSITORY,
    WORKSPACE_TOO_LARGE,
)

# JSON-RPC 2.0 codes of the product's contract (spec §6).
DOCKER_UNAVAILABLE = -32001
CONTAINER_START_FAILURE = -32002
INVALID_SUITE_CONFIGURATION = -32003
SECURITY_VIOLATION = -32004
SERVICE_NOT_FOUND = -32005
# The product's own, in the JSON-RPC server-error range (-32000..-32099), unused by the MCP
# specification and the SDKs: a server→client request the client did not answer.
NO_ANSWER_FROM_CLIENT = -32006
# JSON-RPC 2.0 standard codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600

# The events whose code's title would tell the user something that did not happen: a container
# that served and then died is no start failure, nor is a refused or ended session, nor a bug.
# docs/USAGE.md's error table shows the title of every reason (tests/unit/test_errors.py).
TITLE_BY_REASON: Final[Mapping[str, str]] = {
    KUBERNETES_UNAVAILABLE: "Kubernetes API Unreachable",
    KUBERNETES_TIMEOUT: "Kubernetes API Unresponsive",
    CONTAINER_EXITED: "Container Exited",
    CONTAINER_OUTPUT_INVALID: "Container Output Invalid",
    BACKEND_LIST_TOO_LARGE: "Container Output Invalid",
    CONTAINER_UNRESPONSIVE: "Container Unresponsive",
    TOO_MANY_SESSIONS: "Too Many Sessions",
    USER_SESSION_LIMIT: "Too Many Sessions",
    RATE_LIMITED: "Rate Limited",
    ORCHESTRATOR_STOPPING: "Orchestrator Stopping",
    SESSION_ENDED_BY_OPERATOR: "Session Ended by Operator",
    INTERNAL_ERROR: "Internal Error",
    ORCHESTRATOR_UNREACHABLE: "Orchestrator Unreachable",
    CONNECTION_CLOSED: "Connection Closed",
    SESSION_ENDED: "Session Ended",
    TOO_MANY_REQUESTS_IN_FLIGHT: "Too Many Requests",
    TOO_MANY_PER_CALL_CONTAINERS: "Too Many Requests",
    AGENT_BUSY: "Agents Busy",
    WORKSPACE_NOT_A_REPOSITORY: "Not a Git Repository",
    WORKSPACE_TOO_LARGE: "Project Too Large to Copy",
    WORKSPACE_BASE_UNKNOWN: "Unknown Base",
    WORKSPACE_FAILED: "Workspace Failed",
}

# A message is one line a client prints; the whole sentence stays in data.detail.
MAX_MESSAGE_CHARS: Final = 400


def titled(title: str, text: str) -> str:
    """``Title: text`` on one line, at most :data:`MAX_MESSAGE_CHARS` characters."""
    message = f"{title}: {' '.join(text.split())}" if text else title
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1].rstrip() + "…"
    return message


class FabricError(Exception):
    """Base of every error the orchestrator reports to a client or an operator.

    ``reason`` is a stable snake_case string for machines; ``message`` (the ``str()`` of the
    exception) is for humans; ``detail`` holds extra JSON-serialisable fields.
    """

    code: ClassVar[int]
    title: ClassVar[str]

    def __init__(self, message: str, *, reason: str, **detail: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.detail = detail

    @property
    def heading(self) -> str:
        """The title this error's message starts with (see :data:`TITLE_BY_REASON`)."""
        return TITLE_BY_REASON.get(self.reason, self.title)

    def to_jsonrpc_error(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` object: the documented code; the message ``Title: what
        happened``, read by people; reason and detail in data, read by programs."""
        data: dict[str, Any] = {"reason": self.reason, "detail": str(self)}
        data.update(self.detail)
        return {"code": self.code, "message": titled(self.heading, str(self)), "data": data}


class DockerUnavailable(FabricError):
    code = DOCKER_UNAVAILABLE
    title = "Docker Daemon Unresponsive"


class ContainerStartFailure(FabricError):
    code = CONTAINER_START_FAILURE
    title = "Container Start Failure"


class SessionRefused(FabricError):
    """No session now: the orchestrator is at its limit of concurrent sessions
    (``too_many_sessions``) or stopping (``orchestrator_stopping``). Nothing was started.

    -32002 on the wire: the documented contract for a refused session, which clients may
    already test for; the message's title says what happened ("Too Many Sessions: …").
    """

    code = CONTAINER_START_FAILURE
    title = "Container Start Failure"


class SessionEnding(FabricError):
    """What the requests in flight of a session that must end get: the orchestrator is stopping
    (``orchestrator_stopping``) or an operator ended it (``session_ended_by_operator``).

    -32002 on the wire, as documented, with a title of its own (see :class:`SessionRefused`).
    """

    code = CONTAINER_START_FAILURE
    title = "Container Start Failure"


class SessionCrashed(FabricError):
    """A bug in the orchestrator ended this session (``internal_error``); it is logged with its
    traceback, and the orchestrator's other sessions go on.

    -32002 on the wire, as documented, with a title of its own (see :class:`SessionRefused`).
    """

    code = CONTAINER_START_FAILURE
    title = "Container Start Failure"


class RateLimited(FabricError):
    """A tool call refused at once: its signed-in user has made ``orchestrator.users``'
    ``calls_per_minute`` calls in the last minute (``rate_limited``; ``data``: ``limit`` and
    ``retry_after_seconds``). Nothing was started.

    -32002 on the wire, the code of a service that cannot serve now, with a title of its own.
    """

    code = CONTAINER_START_FAILURE
    title = "Rate Limited"


class AgentBusy(FabricError):
    """A call of an ``llm_agent`` service refused at once: its session, or the orchestrator,
    has ``orchestrator.agents``' limit of agent calls in flight (``agent_busy``; ``data``:
    ``limit`` and ``scope``, ``session`` or ``orchestrator``). Nothing was started.

    -32002 on the wire, the code of a service that cannot serve now, with a title of its own
    (see :class:`SessionRefused`).
    """

    code = CONTAINER_START_FAILURE
    title = "Container Start Failure"


class WorkspaceRefused(FabricError):
    """An isolated task cannot have its workspace (``workspace_not_a_repository``,
    ``workspace_too_large``, ``workspace_base_unknown``, ``workspace_failed``): nothing was
    started, or the task's changes could not be recorded.

    -32002 on the wire, the code of a service that cannot serve now, with a title of its own
    (see :class:`SessionRefused`).
    """

    code = CONTAINER_START_FAILURE
    title = "Container Start Failure"


class InvalidSuiteConfiguration(FabricError):
    code = INVALID_SUITE_CONFIGURATION
    title = "Invalid Suite Configuration"


class SecurityViolation(FabricError):
    code = SECURITY_VIOLATION
    title = "Security Violation"


class IssuerUnavailable(SecurityViolation):
    """``auth.mode: oidc``: the OpenID provider's discovery document or keys cannot be had
    (the message says what), so no access token can be checked (HTTP 503)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason=ISSUER_UNAVAILABLE)


class ServiceNotFound(FabricError):
    code = SERVICE_NOT_FOUND
    title = "Service Not Found"


class ClientDidNotAnswer(FabricError):
    """A server's request to the client (sampling, elicitation, roots) that the client will not
    answer: none came in time (``client_did_not_answer``), or too many of its session's already
    wait for the client (``too_many_requests_to_client``). Sent to the server, never to a client.
    """

    code = NO_ANSWER_FROM_CLIENT
    title = "Client Did Not Answer"


class InvalidMessage(FabricError):
    """A message that cannot be handled as a single JSON-RPC request or notification.

    ``request_id`` is the message's own id when it could be read (the answer goes to that
    request), else None (the answer has a null id, as JSON-RPC says).
    """

    def __init__(
        self, message: str, *, reason: str, request_id: object = None, **detail: Any
    ) -> None:
        super().__init__(message, reason=reason, **detail)
        self.request_id = request_id


class ParseError(InvalidMessage):
    code = PARSE_ERROR
    title = "Parse error"


class InvalidRequest(InvalidMessage):
    code = INVALID_REQUEST
    title = "Invalid Request"
