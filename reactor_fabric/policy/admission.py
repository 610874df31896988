"""Whether a new session is admitted, and with what: a pure decision, in the order it is made.

A session's first message is judged in five steps; the first that fails refuses the session
with its error, answered to the first message's id (or none) and nothing started:

1. **classify** the first message
   (:func:`~reactor_fabric.protocol.handshake.classify_first_message`): unusable → its
   ``InvalidMessage`` (parse error, a response, a registerClient without id or mounts);
2. **service**: the endpoint names a service of the suite, or is the fabric endpoint →
   ``service_not_found``;
3. **options** of the fabric endpoint from its URL query (``?tools=``, ``?profile=``) →
   ``unknown_exposure``, ``profile_not_found``;
4. **mounts** requested: registerClient's, else the ``?mount=`` values parsed →
   ``mount_malformed``; then validated against the mount policy, which resolves paths on the
   file system: that I/O is the caller's (in a worker thread), between :func:`admission` (steps
   1-4) and :func:`capacity` (step 5);
5. **capacity**: the orchestrator stopping → ``orchestrator_stopping``; as many sessions live as
   its limit → ``too_many_sessions``. The check is on numbers; the count it reads and updates is
   :class:`~reactor_fabric.trio.registry.SessionRegistry`'s (``SessionRegistry.admit``).

The options and mounts of a URL's query may come as headers instead
(:func:`requested_options`): the same values, for clients that show or log the URL, or that drop
an error's message when the URL has a query (Claude Code).

Pure: no I/O, no trio; the caller does the validation and answers the refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

from .._errors import (
    FabricError,
    InvalidMessage,
    InvalidRequest,
    SecurityViolation,
    ServiceNotFound,
    SessionRefused,
)
from .._reasons import (
    ORCHESTRATOR_STOPPING,
    PROFILE_NOT_FOUND,
    SERVICE_NOT_ALLOWED,
    SERVICE_NOT_FOUND,
    TOO_MANY_SESSIONS,
    UNKNOWN_EXPOSURE,
    USER_SESSION_LIMIT,
)
from ..config.structs import Service, Suite
from ..config.suite import FABRIC_ENDPOINT
from ..protocol.fabric_server import Exposure
from ..protocol.handshake import FirstMessage, RegisterClient, classify_first_message
from .mounts import parse_query_mount

__all__ = [
    "EXPOSURES",
    "Admission",
    "Capacity",
    "FabricOptions",
    "Refusal",
    "admission",
    "capacity",
    "fabric_options",
    "requested_options",
    "service_not_found",
]

EXPOSURES: tuple[Exposure, ...] = ("discover", "all")

# The session's options a client may send as a header rather than in the URL's query: the same
# names and values. A mount header may list several mounts, separated by commas (a path with a
# comma goes in the query).
OPTION_HEADERS: Mapping[bytes, str] = {
    b"x-reactor-fabric-mount": "mount",
    b"x-reactor-fabric-tools": "tools",
    b"x-reactor-fabric-profile": "profile",
}


class RequestedOptions(dict[str, list[str]]):
    """The session's options by name, each with its values in order; ``headers`` names the
    header an option's last value (the one that counts) came in, so that a refusal names what
    the client sent — ``X-Reactor-Fabric-Tools``, not a ``?tools=`` it never wrote. Compares
    as the plain mapping."""

    def __init__(
        self, values: Mapping[str, list[str]], headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(values)
        self.headers: dict[str, str] = dict(headers or {})


def option_source(options: Mapping[str, list[str]], name: str, value: str) -> str:
    """How the client gave option ``name`` = ``value``, in its own terms, for a message."""
    header = options.headers.get(name) if isinstance(options, RequestedOptions) else None
    if header is not None:
        return f"the {header} header {value!r}"
    return f"?{name}={value!r}"


def requested_options(query: str, headers: Mapping[bytes, str]) -> RequestedOptions:
    """The session's options as the request asks for them: its URL query's values, then its
    option headers' (:data:`OPTION_HEADERS`), by name — what admission reads (``mount``,
    ``tools``, ``profile``) and a keyed session compares to tell its owner."""
    options = parse_qs(query)
    given: dict[str, str] = {}
    for header, name in OPTION_HEADERS.items():
        value = headers.get(header)
        if value is None:
            continue
        parts = value.split(",") if name == "mount" else [value]
        values = [part.strip() for part in parts if part.strip()]
        if values:
            options.setdefault(name, []).extend(values)
            given[name] = _header_name(header)
    return RequestedOptions(options, given)


def _header_name(header: bytes) -> str:
    """``x-reactor-fabric-tools`` as written in the docs: ``X-Reactor-Fabric-Tools``."""
    return "-".join(part.capitalize() for part in header.decode("ascii").split("-"))


@dataclass(frozen=True)
class FabricOptions:
    """What the client chose in the endpoint's URL: ``?tools=`` and ``?profile=``."""

    exposure: Exposure
    active: tuple[str, ...] = ()  # the servers of the chosen profile


@dataclass(frozen=True)
class Refusal:
    """The session is refused: ``error`` answers the first message, whose id is ``request_id``
    (None when it had none, or could not be read)."""

    request_id: object
    error: FabricError


@dataclass(frozen=True)
class Admission:
    """Steps 1-4 passed: the first message classified, what the session serves (a service of
    the suite, or the fabric endpoint with its options), and the mounts it asks for, still to
    be validated (registerClient's as sent, or the ``?mount=`` values in the same shape)."""

    first: FirstMessage
    request_id: object
    service: Service | None  # None on the fabric endpoint
    options: FabricOptions | None  # on the fabric endpoint only
    mounts: object


@dataclass(frozen=True)
class Capacity:
    """What step 5 reads: the sessions live now, the most there may be, and whether the
    orchestrator is stopping."""

    sessions: int
    limit: int
    stopping: bool
    # The user's own sessions now, and the most they may have (None: no limit of their own).
    user_sessions: int = 0
    user_limit: int | None = None


def admission(
    first_frame: bytes,
    *,
    endpoint: str,
    suite: Suite,
    query: Mapping[str, list[str]],
    query_mounts: list[str],
) -> Admission | Refusal:
    """Steps 1-4 for a session of ``endpoint`` (a service's name, or the fabric endpoint) whose
    first message is ``first_frame`` (see the module docstring)."""
    try:
        first = classify_first_message(first_frame)
    except InvalidMessage as exc:
        return Refusal(exc.request_id, exc)
    request_id = first.id if isinstance(first, RegisterClient) else first.peek.id
    service: Service | None = None
    options: FabricOptions | None = None
    try:
        if endpoint == FABRIC_ENDPOINT:
            options = fabric_options(suite, query)
        else:
            service = suite.mcp_services.get(endpoint)
            if service is None:
                raise service_not_found(endpoint)
        mounts: object = (
            first.mounts
            if isinstance(first, RegisterClient)
            else [parse_query_mount(text) for text in query_mounts]
        )
    except FabricError as exc:
        return Refusal(request_id, exc)
    return Admission(first, request_id, service, options, mounts)


def capacity(state: Capacity) -> SessionRefused | None:
    """Step 5: why a new session has no room (stopping first: no session may start then,
    whatever the count), or None when it has."""
    if state.stopping:
        return SessionRefused("the orchestrator is stopping", reason=ORCHESTRATOR_STOPPING)
    if state.sessions >= state.limit:
        return SessionRefused(
            "the orchestrator has reached its limit of concurrent sessions; try again later",
            reason=TOO_MANY_SESSIONS,
        )
    if state.user_limit is not None and state.user_sessions >= state.user_limit:
        return SessionRefused(
            f"you have {state.user_sessions} sessions open, as many as orchestrator.users "
            "allows you; end one (or let it go idle) and try again",
            reason=USER_SESSION_LIMIT,
            limit=state.user_limit,
        )
    return None


def service_not_found(name: str) -> ServiceNotFound:
    """The error for an endpoint that names no service of the suite."""
    return ServiceNotFound(
        f"no service named {name!r} in the suite", reason=SERVICE_NOT_FOUND, service=name
    )


def service_not_allowed(name: str) -> SecurityViolation:
    """The error for a relay session to a service its signed-in user may not use."""
    return SecurityViolation(
        f"you may not use the service {name!r} (orchestrator.users: it is not among your "
        "services, or it spends a model account you may not)",
        reason=SERVICE_NOT_ALLOWED,
        service=name,
    )


def fabric_options(suite: Suite, query: Mapping[str, list[str]]) -> FabricOptions:
    """The session's options from its URL query; InvalidRequest for a value we do not know."""
    exposure: Exposure = suite.orchestrator.fabric.default_exposure
    tools = query.get("tools", [])
    if tools:
        wanted = tools[-1]
        if wanted == "discover":
            exposure = "discover"
        elif wanted == "all":
            exposure = "all"
        else:
            raise InvalidRequest(
                f"{option_source(query, 'tools', wanted)} is not an exposure: use "
                "discover or all (?tools=discover, or X-Reactor-Fabric-Tools: all)",
                reason=UNKNOWN_EXPOSURE,
                supported=list(EXPOSURES),
            )
    profiles = query.get("profile", [])
    if not profiles:
        return FabricOptions(exposure)
    profile = profiles[-1]
    if profile not in suite.profiles:
        known = ", ".join(sorted(suite.profiles)) or "none"
        raise InvalidRequest(
            f"no profile named {profile!r} in the suite (profiles: {known})",
            reason=PROFILE_NOT_FOUND,
            profile=profile,
        )
    return FabricOptions(exposure, tuple(suite.profiles[profile].services))
