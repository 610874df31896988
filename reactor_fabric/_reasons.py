"""Every ``reason`` the orchestrator gives, in one place.

A reason is a stable snake_case string for machines: the ``data.reason`` of a JSON-RPC error
(the class in :mod:`reactor_fabric._errors` gives its code), the ``reason`` of a log line, of
an audit record, of a metric's label. Code names the constant, never the string, so that this
module is the one list; ``tests/unit/test_reasons.py`` checks it against the table of
docs/USAGE.md's "Errors" section in both directions (each reason here is documented, each
documented reason is here).

Two kinds:

- **Answered**: a :class:`~reactor_fabric._errors.FabricError` carries it, so a client (or, for
  a server→client request, a server) can get it in ``data.reason``; also logged and counted.
  Documented in the error table, one row each.
- **Logged only**: never in an error a client or server gets; the log line, audit record or
  metric label that carries it is named in the second table ("Reasons only the log carries").

A few reasons are templates (``{action}``, ``{status}``): the value is made with
:meth:`str.format` from a closed set of words, and documented as the template.

Pure: no imports; the protocol layer may use it (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

from typing import Final

# ============================================================================================
# Answered: -32001 DockerUnavailable (the engine, or the Kubernetes API, cannot be reached)
# ============================================================================================

# The engine's socket refused, or is missing (a connection error of any engine call).
DOCKER_UNAVAILABLE: Final = "docker_unavailable"
# An engine call did not answer within its bound (30 s; a pull: its own bound).
DOCKER_TIMEOUT: Final = "docker_timeout"
# runtime: kubernetes — the API server cannot be reached, failed (5xx), or its credentials
# cannot be loaded.
KUBERNETES_UNAVAILABLE: Final = "kubernetes_unavailable"
# runtime: kubernetes — an API call over its bound, or a pod's start over start_timeout.
KUBERNETES_TIMEOUT: Final = "kubernetes_timeout"

# ============================================================================================
# Answered: -32006 ClientDidNotAnswer (to a *server*, never to a client)
# ============================================================================================

# A server's request to the client (sampling, elicitation, roots) got no answer in time.
CLIENT_DID_NOT_ANSWER: Final = "client_did_not_answer"
# A server's request to the client refused at once: MAX_SERVER_REQUESTS of its session's
# already wait for the client (relay and fabric endpoint).
TOO_MANY_REQUESTS_TO_CLIENT: Final = "too_many_requests_to_client"

# ============================================================================================
# Answered: -32002 ContainerStartFailure (a container could not start, or stopped serving)
# ============================================================================================

# The image is not there (engine: not found on create or pull; a pod: ErrImagePull & co).
IMAGE_NOT_FOUND: Final = "image_not_found"
# The engine (or the API server) refused to create the container or pod.
CREATE_FAILED: Final = "create_failed"
# A secret of the service (`secrets:`) could not be resolved when the orchestrator started (an
# unset variable, a missing or too widely readable file), or cannot be delivered: the service
# is refused, its containers never created; the other services serve.
SECRET_UNAVAILABLE: Final = "secret_unavailable"  # noqa: S105 - a reason, not a secret
# An agent service (llm_agent) names a model account (config.account) that
# orchestrator.accounts does not define: that service alone is refused (validate-config warns).
ACCOUNT_UNAVAILABLE: Final = "account_unavailable"
# A service with an egress allowlist (`egress:`) cannot have its proxy here: the engine is not
# local (socket stdio off: the container reaches the proxy through a socket of the orchestrator's
# stdio area), or the fabric-stdio helper is missing. Refused rather than started with a network.
EGRESS_UNAVAILABLE: Final = "egress_unavailable"
# A service with `isolation: gvisor` where the engine has no gVisor runtime (`runsc`, or the
# Kubernetes RuntimeClass the suite names): refused rather than run under runc.
ISOLATION_UNAVAILABLE: Final = "isolation_unavailable"
# The container or pod did not start (the engine refused, the pod failed to run).
START_FAILED: Final = "start_failed"
# The engine refused to attach the container's stdio, or the attach broke.
ATTACH_FAILED: Final = "attach_failed"
# The engine cannot attach stdio as the orchestrator needs it (no upgraded attach).
ATTACH_UNSUPPORTED: Final = "attach_unsupported"
# The engine refused to pull the image.
PULL_FAILED: Final = "pull_failed"
# The engine refused to inspect a container (on the in-memory runtime: no such container).
INSPECT_FAILED: Final = "inspect_failed"
# Any other engine call refused (``action``: ping, probe, verify, update, remove, list):
# :func:`engine_call_failed` makes it; create, start, attach, pull and inspect have their own
# constants above with the same shape.
ENGINE_CALL_FAILED: Final = "{action}_failed"
# Socket stdio: the container ended, or did not connect its stdio socket within the API call
# time-out, before its server ran.
STDIO_NOT_CONNECTED: Final = "stdio_not_connected"
# The server's container exited on its own with requests in flight (exit code, stderr in data).
CONTAINER_EXITED: Final = "container_exited"
# The server wrote a message over max_message_size: the container is replaced.
CONTAINER_OUTPUT_INVALID: Final = "container_output_invalid"
# The server stopped reading its stdin (or, on /mcp, left more than buffer_to_server of the
# orchestrator's own messages unread): the container is replaced.
CONTAINER_UNRESPONSIVE: Final = "container_unresponsive"
# A replacement container did not take the replayed initialize: the session cannot go on.
REPLAY_FAILED: Final = "replay_failed"
# /mcp: a service answered the refresh of a list (after its list_changed) with over 1 MiB.
BACKEND_LIST_TOO_LARGE: Final = "backend_list_too_large"
# /mcp: a service answered the orchestrator's initialize with an error.
HANDSHAKE_FAILED: Final = "handshake_failed"
# A bug in the orchestrator, contained to its session and logged with its traceback.
INTERNAL_ERROR: Final = "internal_error"
# The stdio bridge: the orchestrator cannot be reached.
ORCHESTRATOR_UNREACHABLE: Final = "orchestrator_unreachable"
# The stdio bridge: the orchestrator closed the WebSocket before answering the first message.
CONNECTION_CLOSED: Final = "connection_closed"

# --- -32002 too, by the contract's code, but not a start failure: SessionRefused/SessionEnding -

# SessionRefused: the orchestrator is at its limit of concurrent sessions (max_sessions).
TOO_MANY_SESSIONS: Final = "too_many_sessions"
# SessionRefused: the signed-in user has as many sessions as orchestrator.users allows them
# (their max_sessions).
USER_SESSION_LIMIT: Final = "user_session_limit"
# RateLimited: the signed-in user has made orchestrator.users' calls_per_minute tool calls in
# the last minute (data: limit, retry_after_seconds).
RATE_LIMITED: Final = "rate_limited"
# SessionRefused (a new session) or SessionEnding (one in progress): the orchestrator is
# stopping. Also a container's stop reason in the audit.
ORCHESTRATOR_STOPPING: Final = "orchestrator_stopping"
# SessionEnding: an operator ended the session (``reactor-fabric sessions end``). Also a
# container's stop reason in the audit.
SESSION_ENDED_BY_OPERATOR: Final = "session_ended_by_operator"
# AgentBusy: a call of an llm_agent service while its session, or the whole orchestrator, has
# orchestrator.agents' limit of agent calls in flight (answered at once, never queued).
AGENT_BUSY: Final = "agent_busy"
# WorkspaceRefused: an isolated task's project is not the top of a git work tree (use
# workspace: shared, or git init). Nothing was started.
WORKSPACE_NOT_A_REPOSITORY: Final = "workspace_not_a_repository"
# WorkspaceRefused: an isolated task's project has more bytes or files to copy than
# orchestrator.workspaces allows. Nothing was started.
WORKSPACE_TOO_LARGE: Final = "workspace_too_large"
# WorkspaceRefused: an isolated task's ``base`` names no branch or commit of the client's
# repository (or is not a ref name at all). Nothing was started.
WORKSPACE_BASE_UNKNOWN: Final = "workspace_base_unknown"
# WorkspaceRefused: the task's copy could not be made, or its changes not recorded (git failed
# or timed out, the disk is full); the message says which step.
WORKSPACE_FAILED: Final = "workspace_failed"

# ============================================================================================
# Answered: -32003 InvalidSuiteConfiguration
# ============================================================================================

# The suite file is malformed or logically invalid (also its log reason at start-up).
INVALID_SUITE_CONFIGURATION: Final = "invalid_suite_configuration"
# The suite file cannot be read (logged at start-up).
SUITE_UNREADABLE: Final = "suite_unreadable"

# ============================================================================================
# Answered: -32004 SecurityViolation
# ============================================================================================

MOUNT_OUTSIDE_ALLOWED_ROOTS: Final = "mount_outside_allowed_roots"
MOUNT_SOURCE_MISSING: Final = "mount_source_missing"
MOUNT_SOURCE_NOT_ABSOLUTE: Final = "mount_source_not_absolute"
MOUNT_TARGET_NOT_ABSOLUTE: Final = "mount_target_not_absolute"
# A source, or a target, with a NUL character.
MOUNT_SOURCE_INVALID: Final = "mount_source_invalid"
MOUNT_TARGET_INVALID: Final = "mount_target_invalid"
# A target that is '/', holds '..', or is inside a system directory.
MOUNT_TARGET_FORBIDDEN: Final = "mount_target_forbidden"
# A target not under allowed_mount_targets nor the source's own path.
MOUNT_TARGET_NOT_ALLOWED: Final = "mount_target_not_allowed"
# A same-path target where the image has something of its own (refused at the start).
MOUNT_TARGET_IN_IMAGE: Final = "mount_target_in_image"
MOUNT_TARGET_DUPLICATE: Final = "mount_target_duplicate"
# The engine's socket as a source (under any name, e.g. a hard link).
DOCKER_SOCKET_FORBIDDEN: Final = "docker_socket_forbidden"
# A mount that is not an object with string source and target.
MOUNT_MALFORMED: Final = "mount_malformed"
# A path over 4096 bytes, refused before any resolving.
MOUNT_PATH_TOO_LONG: Final = "mount_path_too_long"
TOO_MANY_MOUNTS: Final = "too_many_mounts"
# A mount's path changed since it was validated (refused at a container's start).
MOUNT_CHANGED: Final = "mount_changed"
# A writable mount whose Git directory cannot be kept read-only (policy/git_guard.py): its
# .git is a symlink, or it is a Git directory or inside one; the service may not write Git.
GIT_DIR_UNGUARDABLE: Final = "git_dir_unguardable"
# The container's mount could not be checked against what was validated.
MOUNT_UNVERIFIABLE: Final = "mount_unverifiable"
# The orchestrator's user may not open or read the source (also: the staging area's mount
# cannot be made, in pool_mounts_unavailable).
MOUNT_NOT_PERMITTED: Final = "mount_not_permitted"
# HTTP: a keyed session URL asked for by a client with other mounts.
SESSION_KEY_IN_USE: Final = "session_key_in_use"
# HTTP 401 on every route and transport (no token, a wrong token).
TOKEN_MISSING: Final = "token_missing"  # noqa: S105 - a reason, not a secret
TOKEN_INVALID: Final = "token_invalid"  # noqa: S105 - a reason, not a secret
# orchestrator.auth.mode: oidc — HTTP 401: the access token's exp has passed (sign in again, or
# refresh); HTTP 403: it lacks a scope auth.scopes requires.
TOKEN_EXPIRED: Final = "token_expired"  # noqa: S105 - a reason, not a secret
TOKEN_INSUFFICIENT_SCOPE: Final = "token_insufficient_scope"  # noqa: S105 - a reason
# orchestrator.auth.mode: oidc — HTTP 503: the issuer's keys cannot be had (its discovery
# document or key set unreachable or unusable), so no token can be checked.
ISSUER_UNAVAILABLE: Final = "issuer_unavailable"
# orchestrator.users — the signed-in user may not use this service (their entry's services,
# or an agent spending an account their entry's accounts leave out): a relay session to it
# is refused; the fabric endpoint does not list it to them.
SERVICE_NOT_ALLOWED: Final = "service_not_allowed"
# The stdio bridge: the orchestrator refused the WebSocket handshake with this HTTP status
# and no error of its own in the body (403: a refused Origin or Host).
HTTP_STATUS: Final = "http_{status}"
# The stdio bridge: the loopback listener it reached belongs to another user than you, root
# or the account named with --orchestrator-user — not your orchestrator (a port squatter, or
# another user's orchestrator); it was sent nothing.
LISTENER_NOT_YOURS: Final = "listener_not_yours"
# orchestrator.lock: enforce — a tool whose definition differs from the suite lock's hash is
# hidden, and a call of it refused (data names the tool and the parts that changed).
TOOL_DEFINITION_CHANGED: Final = "tool_definition_changed"
# orchestrator.lock: enforce — the service's image is not the one the suite lock names (its
# digest changed): no container is started from it.
IMAGE_CHANGED: Final = "image_changed"

# ============================================================================================
# Answered: -32005 ServiceNotFound
# ============================================================================================

SERVICE_NOT_FOUND: Final = "service_not_found"

# ============================================================================================
# Answered: -32700 ParseError
# ============================================================================================

INVALID_JSON: Final = "invalid_json"
INVALID_UTF8: Final = "invalid_utf8"
# JSON nested deeper than the parser's bound.
JSON_TOO_DEEP: Final = "json_too_deep"

# ============================================================================================
# Answered: -32600 InvalidRequest
# ============================================================================================

BATCH_NOT_SUPPORTED: Final = "batch_not_supported"
NOT_AN_OBJECT: Final = "not_an_object"
INVALID_ID: Final = "invalid_id"
INVALID_METHOD: Final = "invalid_method"
NOT_JSONRPC: Final = "not_jsonrpc"
# A first message that is a response, not a request.
UNEXPECTED_RESPONSE: Final = "unexpected_response"
# The first message's "register" request (mounts) without an id, or without mounts.
REGISTER_WITHOUT_ID: Final = "register_without_id"
REGISTER_WITHOUT_MOUNTS: Final = "register_without_mounts"
# The session already has max_in_flight requests in flight.
TOO_MANY_REQUESTS_IN_FLIGHT: Final = "too_many_requests_in_flight"
# A request id already in flight in the session (a client's; or a server's, still waiting for
# the client).
DUPLICATE_REQUEST_ID: Final = "duplicate_request_id"
# HTTP: a request that needs a session came without one (stateless_needs_session_url: a
# stateless probe of an endpoint that needs a session URL).
SESSION_REQUIRED: Final = "session_required"
STATELESS_NEEDS_SESSION_URL: Final = "stateless_needs_session_url"
# HTTP: the session ended before answering. Also a container's stop reason in the audit: its
# client session ended.
SESSION_ENDED: Final = "session_ended"
# HTTP 400: an MCP-Protocol-Version the orchestrator does not know.
UNSUPPORTED_PROTOCOL_VERSION: Final = "unsupported_protocol_version"
# /mcp: a ?tools= that is neither discover nor all.
UNKNOWN_EXPOSURE: Final = "unknown_exposure"
# /mcp: a ?profile= the suite does not have.
PROFILE_NOT_FOUND: Final = "profile_not_found"
# /mcp: a call of a fresh_per_call service while the session already has
# MAX_PER_CALL_CONTAINERS of its calls in flight, each in its own container.
TOO_MANY_PER_CALL_CONTAINERS: Final = "too_many_per_call_containers"
# /mcp, a 2026-07-28 client: a retry whose requestState resumes no call waiting for input (its
# wait expired or its container ended, it was used already, or it was never issued here).
INPUT_WAIT_OVER: Final = "input_wait_over"

# ============================================================================================
# Logged only (never in an error a client or a server gets)
# ============================================================================================

# --- a container's stop reason (audit container_stop, log container_removed's "why") -----------
# (also: session_ended, orchestrator_stopping, session_ended_by_operator, replay_failed,
# container_output_invalid, container_unresponsive, backend_list_too_large, above)

# The session's container was idle for its service's idle_timeout.
IDLE: Final = "idle"
# The container exited on its own.
EXITED: Final = "exited"
# A container that started after its session stopped needing it.
NOT_NEEDED: Final = "not_needed"
# container_strategy fresh_per_call: the container served its call (on /mcp its one call; on
# the relay, the session's requests all answered) and goes; the next request gets a fresh one.
CALL_DONE: Final = "call_done"
# container_strategy smart_refresh: the container was replaced between calls, having served
# max_calls_per_container calls, being older than max_container_age, or using more memory
# than memory_threshold.
REFRESH_CALLS: Final = "refresh_calls"
REFRESH_AGE: Final = "refresh_age"
REFRESH_MEMORY: Final = "refresh_memory"
# /mcp: a call that waited for a 2026-07-28 client's retry (input_required) past its bound: its
# per-call container is removed.
INPUT_WAIT_EXPIRED: Final = "input_wait_expired"

# --- socket_stdio_unavailable: stdio goes through the engine's attach --------------------------

# The fabric-stdio helper binary is not there.
HELPER_MISSING: Final = "helper_missing"
# The image has no command to wrap.
NO_COMMAND: Final = "no_command"
# The directory for the stdio sockets cannot be made private (owner, mode, links).
STDIO_DIRECTORY: Final = "stdio_directory"
# The stdio directory's path is too long for a Unix socket's.
PATH_LENGTH: Final = "path_length"

# --- pool_mounts_unavailable: sessions with mounts get fresh containers -----------------------
# (also: mount_not_permitted, above)

# The orchestrator does not run as root, which the staging area's mounts need.
NOT_ROOT: Final = "not_root"
# The staging directory cannot be made.
STAGING_DIRECTORY: Final = "staging_directory"
# A mount made on the host did not appear in the container (another mount namespace).
PROPAGATION_MISSING: Final = "propagation_missing"
# The runtime cannot attach mounts to a running container (not Docker or Podman).
RUNTIME: Final = "runtime"

# --- refused connections (log: connection_refused, websocket_refused, request_refused) ---------

# More open connections than the server takes.
TOO_MANY_CONNECTIONS: Final = "too_many_connections"
# More WebSocket handshakes waiting than the server takes.
TOO_MANY_PENDING_CONNECTIONS: Final = "too_many_pending_connections"
# A refused Origin or Host (HTTP 403; the client gets no JSON-RPC error).
ORIGIN_OR_HOST_NOT_ALLOWED: Final = "origin_or_host_not_allowed"

# --- start-up (log: cannot_authenticate, engine_unusable, audit_unwritable, cannot_listen, ----
# --- tracing_unavailable) ----------------------------------------------------------------------

# The token cannot be read or made.
AUTH_SETUP: Final = "auth_setup"
# The engine's address (DOCKER_HOST, CONTAINER_HOST) is not usable.
ENGINE_ADDRESS: Final = "engine_address"
# The audit file cannot be opened for writing.
AUDIT_UNWRITABLE: Final = "audit_unwritable"
# The suite lock (claude-mcp-suite.lock beside the suite) cannot be read, or is not one.
LOCK_UNREADABLE: Final = "lock_unreadable"
# The port is taken.
PORT_IN_USE: Final = "port_in_use"
# Any other reason the socket cannot listen.
CANNOT_LISTEN: Final = "cannot_listen"
# OTEL_* asks for traces but the opentelemetry packages are not installed.
OTEL_NOT_INSTALLED: Final = "otel_not_installed"
# OTEL_EXPORTER_OTLP_PROTOCOL names a protocol other than http/protobuf.
OTLP_PROTOCOL_UNSUPPORTED: Final = "otlp_protocol_unsupported"

# --- a session's catalog (log: catalog_refresh_failed) ----------------------------------------

# The refresh of a list did not finish within its bound.
TIMEOUT: Final = "timeout"

# --- a container's egress proxy (audit egress, log egress_refused; HTTP 4xx/502 to the client) -

# The destination the container asked for is not in its service's `egress` list (403).
EGRESS_NOT_LISTED: Final = "egress_not_listed"
# A listed name resolved only to addresses a name may not lead to (loopback, link-local,
# private…) that are not listed themselves (403).
EGRESS_ADDRESS_REFUSED: Final = "egress_address_refused"
# The listed name does not resolve (502).
EGRESS_UNRESOLVED: Final = "egress_unresolved"
# The destination refused the connection, or did not answer within the connect bound (502).
EGRESS_CONNECT_FAILED: Final = "egress_connect_failed"
# Not a request the proxy serves: no CONNECT or absolute http:// request, a head over 16 KiB
# or not sent within its bound (400).
EGRESS_BAD_REQUEST: Final = "egress_bad_request"
# The container's connections to the proxy are at their bound (503).
EGRESS_BUSY: Final = "egress_busy"
# A connection to the proxy's TCP way in (Kubernetes pods) without the Proxy-Authorization of
# a pod the proxy serves: no credential, or one of no pod running now (407).
EGRESS_UNAUTHORIZED: Final = "egress_unauthorized"

# --- the label of reactor_fabric_errors_total for /mcp's own errors that carry no data.reason -

METHOD_NOT_FOUND: Final = "method_not_found"
INVALID_PARAMS: Final = "invalid_params"
# Any other such error.
NONE: Final = "none"


def engine_call_failed(action: str) -> str:
    """The reason of an engine call ``action`` that the engine refused (``create_failed``…)."""
    return ENGINE_CALL_FAILED.format(action=action)


def http_status(status: int) -> str:
    """The stdio bridge's reason for a handshake refused with ``status`` (``http_403``)."""
    return HTTP_STATUS.format(status=status)
