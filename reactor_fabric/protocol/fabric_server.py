"""The fabric endpoint's MCP server for one client session, without I/O.

Unlike the per-service relay, which passes frames through untouched, this is an MCP server of
our own: it decodes every message. It answers the client's ``initialize`` / ``server/discover``,
lists the suite's tools, prompts and resources from the catalog (:mod:`.catalog`) under their
shown names, and routes each call to its service's backend — a container of that service for
this session, started on the first use (:class:`StartBackend`) and spoken to as a client.

Feed it events (the methods), carry out the actions it returns, in order:

- :class:`ToClient` — one message for the client;
- :class:`ToBackend` — one line for a service's container (its stdin);
- :class:`StartBackend` — start that service's container for this session; then report
  :meth:`FabricServer.backend_started` (the machine does the MCP handshake with it) or
  :meth:`FabricServer.backend_failed`;
- :class:`StopBackend` — remove that service's container (idle, or broken: ``reason``): the
  machine has forgotten it, and the next call starts a fresh one (transparent respawn);
- :class:`~.fabric_refresh.Refresh` — run it in a worker thread, never on the event loop, then
  report :meth:`FabricServer.refreshed` (also when it failed: ``None``);
- :class:`ToolsChanged` — a service's tools changed: log it and write its audit record.

Time: the machine reads the clock it is given (never sleeps); :attr:`FabricServer.deadline` says
when it next needs :meth:`FabricServer.tick` — a service idle for its timeout, or a backend's
request to the client left unanswered for :data:`ASK_SECONDS`.

Ids. Every request the machine sends — to a backend for the client, to the client for a backend,
its own handshakes — gets an id of its own (one counter), remembered with where the answer
goes; an answer comes back under the id its asker used. So the client's ids and each backend's
ids never meet. Cancellation (``notifications/cancelled``) is mapped the same way; progress
notifications pass as they are (the client's ``progressToken`` travels with the request). A
client request under an id the client still waits on, or a backend request under an id that
backend still waits on, is refused (-32600 ``duplicate_request_id``) before it goes anywhere:
one id, one answer, one audit record.

Requests from a backend: ``roots/list`` is answered here from the session's mounts (``file://``
URIs of their targets); ``ping`` here too; sampling and elicitation go to the client when it
declared the capability, else are refused (-32601). Logging and list-changed notifications go to
the client.

Bounds. What the machine sends a backend on its own (answers to its ``ping`` and ``roots/list``,
refusals, refreshes, the handshake: :attr:`ToBackend.own`) is counted until the driver reports
it written (:meth:`FabricServer.backend_read`): a backend that leaves more than
``own_backlog_bytes`` of it unread has stopped reading its stdin, and is treated as broken
(``container_unresponsive``, as on the relay) rather than grow the orchestrator's memory. The
client's own messages are bounded by the driver (it stops reading the client). At most
:data:`~.session.MAX_SERVER_REQUESTS` backend requests wait for the client at once, as on the
relay; one more is answered to its backend -32006 ``too_many_requests_to_client``. A request
the client does not answer within ASK_SECONDS is answered to its backend -32006
``client_did_not_answer``, as on the relay.

Error handling: a message that is not JSON-RPC gets -32700 / -32600 (never raises); a call to an
unknown tool -32602; a call whose backend cannot start, or whose backend dies, gets the backend's
error (-32002 ``ContainerStartFailure``, ``DockerUnavailable``, a ``SecurityViolation`` of its
mounts) — and the session's other services are not affected.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from .._errors import (
    ClientDidNotAnswer,
    ContainerStartFailure,
    FabricError,
    InvalidRequest,
    ParseError,
)
from .._reasons import (
    BACKEND_LIST_TOO_LARGE,
    CLIENT_DID_NOT_ANSWER,
    HANDSHAKE_FAILED,
    IDLE,
    INVALID_JSON,
    NONE,
)
from .._reasons import INVALID_PARAMS as INVALID_PARAMS_REASON
from .._reasons import METHOD_NOT_FOUND as METHOD_NOT_FOUND_REASON
from ..discovery import DiscoveryIndex
from ..discovery.ranking import ServerRanking, with_choice
from ..discovery.tokens import count_definition
from .answers import (
    MAX_SERVER_REQUESTS,
    UNRESPONSIVE,
    SessionLimits,
    too_many_requests_to_client,
)
from .catalog import Catalog, Entry
from .deep_json import DeepEncoder
from .fabric_discovery import (
    AssistSettings,
    ServiceFacts,
    analysis,
    analyze,
    assist_choice,
    assist_request,
    found_tools,
    index_catalog,
    tool_tokens,
)
from .fabric_refresh import MAX_LIST_BYTES, Refresh, Refreshed, ToolChanges
from .jsonrpc import RequestId, duplicate_request, error_response, peek
from .mcp import (
    CLIENT_VERSION,
    HANDSHAKE_VERSIONS,
    INVALID_PARAMS,
    LIST_CHANGED,
    LIST_METHOD,
    METHOD_NOT_FOUND,
    STATELESS_VERSION,
)
from .tool_calls import ArgumentsMode, ToolCall, ToolCallDone, ToolCalls

Json = dict[str, Any]
Exposure = Literal["discover", "all"]

BACKEND_PROTOCOL = CLIENT_VERSION
MAX_QUEUED_PER_BACKEND = 64
MAX_PENDING = 512
MAX_LISTENERS = 8
# Bytes of the endpoint's own messages a backend may leave unread on its stdin: by default the
# relay's bound on what waits for a server (the driver passes the suite's buffer_to_server).
OWN_BACKLOG_BYTES = SessionLimits().to_server_bytes
FIND_LIMIT = 10
MAX_FIND_LIMIT = 50
SERVER_NAME = "reactor-fabric"
# The reason the metrics give errors of the endpoint's own that carry none.
_REASONS = {METHOD_NOT_FOUND: METHOD_NOT_FOUND_REASON, INVALID_PARAMS: INVALID_PARAMS_REASON}
# The service the audit names for the endpoint's own meta-tools.
FABRIC_SERVICE = "fabric"
# How long a backend's request to the client (sampling, elicitation) may wait for its answer.
ASK_SECONDS = 300.0
SUBSCRIPTION_META = "io.modelcontextprotocol/subscriptionId"
ENVELOPE = "io.modelcontextprotocol/"
CACHE_PRIVATE = {"ttlMs": 0, "cacheScope": "private"}
# What a backend's list_changed makes the machine ask it again, and where the answer goes.
_REFRESH = {notification: (LIST_METHOD[kind], kind) for notification, kind in LIST_CHANGED.items()}
_LISTEN_KEYS = {
    "tools": "toolsListChanged",
    "prompts": "promptsListChanged",
    "resources": "resourcesListChanged",
}

# What the client sent was decoded near the top of the stack; it may be encoded further down
# it (a call queued until its backend is ready goes out from the backend's reader), where
# msgspec alone would fail on what it decoded (see .deep_json).
_encoder = DeepEncoder()


@dataclass(frozen=True)
class ToClient:
    data: bytes
    # An error the endpoint answers with itself: its code and reason (for the metrics).
    error: tuple[int, str] | None = None


@dataclass(frozen=True)
class ToBackend:
    service: str
    data: bytes
    # The endpoint's own message (not the client's): the driver reports it written with
    # FabricServer.backend_read, which the machine's bound on them counts on.
    own: bool = False


@dataclass(frozen=True)
class StartBackend:
    service: str


@dataclass(frozen=True)
class StopBackend:
    service: str
    reason: str


@dataclass(frozen=True)
class ToolsChanged:
    """A service's tools changed on a refresh (what changed: names and hashes, no text)."""

    changes: ToolChanges


Action = ToClient | ToBackend | StartBackend | StopBackend | ToolCallDone | Refresh | ToolsChanged


@dataclass(frozen=True)
class _Forwarded:
    """A request sent to a backend: whose it is and how to answer it."""

    service: str
    client_id: object  # the client's id (None: our own handshake)
    method: str


@dataclass(frozen=True)
class _Asked:
    """A backend's request passed on to the client."""

    service: str
    backend_id: object
    deadline: float


@dataclass(frozen=True)
class _Assist:
    """An analyze_task waiting for the client's model to choose among candidates."""

    client_id: object
    ranking: ServerRanking
    candidates: tuple[str, ...]
    budget: int | None
    deadline: float


@dataclass(eq=False)
class _Relist:
    """A backend's list asked for after its list_changed, until it is in the catalog."""

    again: bool = False  # it sent list_changed again meanwhile: asked once more after


@dataclass
class _Backend:
    state: Literal["starting", "handshaking", "ready"]
    queue: list[Json] = field(default_factory=list)  # requests waiting for the handshake
    last_active: float = 0.0
    unread: int = 0  # bytes of our own messages (lines) sent and not yet reported written


META_TOOLS: tuple[Json, ...] = (
    {
        "name": "find_tools",
        "description": "Find tools of every server of the suite, active or not, for a task or "
        "a query. Call one with call_tool.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what the tool should do"},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_FIND_LIMIT},
            },
            "required": ["query"],
        },
    },
    {
        "name": "call_tool",
        "description": "Call any tool of the suite by its full name (server__tool), listed or not.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "the tool's name, e.g. git__git_log"},
                "arguments": {"type": "object", "description": "the tool's arguments"},
            },
            "required": ["name"],
        },
    },
    {
        "name": "activate_servers",
        "description": "Add servers' tools to the tool list (and optionally remove the others).",
        "inputSchema": {
            "type": "object",
            "properties": {
                "servers": {"type": "array", "items": {"type": "string"}},
                "deactivate_others": {"type": "boolean"},
            },
            "required": ["servers"],
        },
    },
    {
        "name": "get_status",
        "description": "This session's servers, their containers, the catalog's problems, and "
        "the tokens its tool list costs against every tool of the suite.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "analyze_task",
        "description": "Which servers of the suite a task needs: the set to activate "
        "(recommended_servers), the others ranked, a calibrated confidence, the evidence, and "
        "each server's tool-definition tokens, within an optional token budget.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "task_description": {"type": "string"},
                "context_hints": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "more words about the task (files, languages, services)",
                },
                "budget": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "at most this many tokens of tool definitions in the set",
                },
            },
            "required": ["task_description"],
        },
    },
    {
        "name": "list_available_capabilities",
        "description": "The suite's servers grouped by category, with example tasks.",
        "inputSchema": {
            "type": "object",
            "properties": {"category_filter": {"type": "string"}},
        },
    },
    {
        "name": "switch_context",
        "description": "Make a profile's servers (or the given ones) the active servers.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "profile": {"type": "string"},
                "add_servers": {"type": "array", "items": {"type": "string"}},
                "remove_servers": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
)
META_NAMES = frozenset(tool["name"] for tool in META_TOOLS)


class FabricServer:
    """The MCP server of one fabric-endpoint session (see the module's docs)."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        session_id: str,
        mount_targets: Iterable[str] = (),
        exposure: Exposure = "discover",
        active: Iterable[str] = (),
        version: str = "0",
        facts: Mapping[str, ServiceFacts] | None = None,
        profiles: Mapping[str, Sequence[str]] | None = None,
        idle_timeouts: Mapping[str, float] | None = None,
        clock: Callable[[], float] = lambda: 0.0,
        index: DiscoveryIndex | None = None,
        token_budget: int | None = None,
        assist: AssistSettings | None = None,
        count_tokens: Callable[[Json], int] = count_definition,
        audit_arguments: ArgumentsMode = "hash",
        own_backlog_bytes: int = OWN_BACKLOG_BYTES,
    ) -> None:
        self.catalog = catalog
        self.own_backlog_bytes = own_backlog_bytes
        self.session_id = session_id
        self.mount_targets = tuple(mount_targets)
        self.exposure: Exposure = exposure
        wanted = set(active)  # once: ``active`` may be an iterator
        self.active: list[str] = [s for s in catalog.services if s in wanted]
        self.version = version
        self.facts = dict(facts or {})
        self.profiles = {name: list(services) for name, services in (profiles or {}).items()}
        self.idle_timeouts = dict(idle_timeouts or {})
        self.clock = clock
        self.count_tokens = count_tokens
        # The ranking index of this session's catalog: the orchestrator's shared one when it
        # is given (built once per catalog), rebuilt here when a service's tools change.
        self.index = (
            index if index is not None else index_catalog(catalog, self.facts, count_tokens)
        )
        self.token_budget = token_budget
        self.assist = assist or AssistSettings()
        self._assisting: dict[int, _Assist] = {}
        self.started_at = clock()
        self.client_capabilities: Json = {}
        self.protocol_version: str | None = None
        self.backends: dict[str, _Backend] = {}
        self._forwarded: dict[int, _Forwarded] = {}
        self._asked: dict[int, _Asked] = {}
        # Open 2026-07-28 subscriptions/listen requests: their id → what they asked for.
        self._listeners: dict[object, Json] = {}
        self._next_id = 0
        # The client's tools/call requests without an outcome yet, and those that got one
        # while handling the current event (returned as ToolCallDone after its actions).
        self.calls = ToolCalls(audit_arguments)
        self._done: list[ToolCall] = []
        self._message_bytes = 0  # the size of the client message being handled
        self._backend_bytes = 0  # the size of the backend message being handled
        # Refreshes (see fabric_refresh): each backend's list asked for or in the works, by
        # (service, kind); the answers waiting for the next Refresh; the one running (one at
        # most) and the lists it holds.
        self._refreshing: dict[tuple[str, str], _Relist] = {}
        self._fresh: dict[tuple[str, str], tuple[_Relist, tuple[Any, ...]]] = {}
        self._refresh: Refresh | None = None
        self._running: dict[tuple[str, str], _Relist] = {}
        # The session is ending (see answer_all): what everything coming meanwhile is told.
        self._ending: FabricError | None = None

    # --- model checking -----------------------------------------------------------------------

    def clone(self) -> FabricServer:
        """An independent copy of the machine in its current state (for model checking). What
        is never changed in place is shared: the catalog and its index (replaced whole by a
        refresh), the settings, a running :class:`Refresh`, the requests waiting in a queue."""
        twin = copy.copy(self)
        twin.active = list(self.active)
        twin._assisting = dict(self._assisting)
        twin.backends = {
            service: dataclasses.replace(backend, queue=list(backend.queue))
            for service, backend in self.backends.items()
        }
        twin._forwarded = dict(self._forwarded)
        twin._asked = dict(self._asked)
        twin._listeners = dict(self._listeners)
        twin.calls = self.calls.clone()
        twin._done = list(self._done)
        # A refresh's lists are told apart by identity (see _list_done): one twin per original.
        twins: dict[int, _Relist] = {}

        def twin_of(relist: _Relist) -> _Relist:
            return twins.setdefault(id(relist), dataclasses.replace(relist))

        twin._refreshing = {key: twin_of(relist) for key, relist in self._refreshing.items()}
        twin._fresh = {key: (twin_of(r), entries) for key, (r, entries) in self._fresh.items()}
        twin._running = {key: twin_of(relist) for key, relist in self._running.items()}
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """A hashable summary of the whole state: equal fingerprints behave alike (used to
        explore every reachable state once when model-checking the machine). The ranking index
        is left out: it is made from the catalog, which is in."""
        numbers: dict[int, int] = {}

        def relist(r: _Relist) -> tuple[int, bool]:
            # Which lists are the same one matters (see _list_done), not where they live.
            return numbers.setdefault(id(r), len(numbers)), r.again

        def encoded(value: object) -> bytes:
            return _encoder.encode(value)

        refresh = self._refresh
        return (
            encoded(self.catalog.services),
            tuple(self.active),
            self.exposure,
            encoded(self.client_capabilities),
            self.protocol_version,
            tuple(
                (s, b.state, encoded(b.queue), b.last_active, b.unread)
                for s, b in sorted(self.backends.items())
            ),
            tuple(sorted(((i, repr(f)) for i, f in self._forwarded.items()))),
            tuple(sorted(((i, repr(a)) for i, a in self._asked.items()))),
            tuple(sorted(((i, repr(a)) for i, a in self._assisting.items()))),
            tuple(sorted((repr(i), encoded(w)) for i, w in self._listeners.items())),
            self._next_id,
            tuple(sorted((repr(i), repr(c)) for i, c in self.calls.open.items())),
            len(self._done),
            tuple((k, relist(r)) for k, r in sorted(self._refreshing.items())),
            tuple((k, relist(r), encoded(e)) for k, (r, e) in sorted(self._fresh.items())),
            # (its base is the catalog: that changes only when it is reported done)
            None if refresh is None else encoded(refresh.lists),
            tuple((k, relist(r)) for k, r in sorted(self._running.items())),
            None if self._ending is None else self._ending.reason,
        )

    # --- time ---------------------------------------------------------------------------------

    @property
    def deadline(self) -> float | None:
        """When :meth:`tick` is next due (None: nothing will come due by itself)."""
        if self._ending is not None:
            return None
        due = [asked.deadline for asked in self._asked.values()]
        due += [assist.deadline for assist in self._assisting.values()]
        for service, backend in self.backends.items():
            if backend.state == "ready" and not self._busy(service):
                due.append(backend.last_active + self.idle_timeouts.get(service, math.inf))
        finite = [when for when in due if when != math.inf]
        return min(finite) if finite else None

    def tick(self) -> list[Action]:
        """Whatever came due: backends' unanswered requests to the client, idle services."""
        if self._ending is not None:
            return []
        return self._with_done(self._tick())

    def _tick(self) -> list[Action]:
        now = self.clock()
        actions: list[Action] = []
        for our_id, asked in list(self._asked.items()):
            # (still asked: a backend found broken meanwhile took its questions along)
            if asked.deadline <= now and our_id in self._asked:
                del self._asked[our_id]
                error = ClientDidNotAnswer(
                    "the client did not answer this request in time", reason=CLIENT_DID_NOT_ANSWER
                )
                actions += self._own(asked.service, error_response(asked.backend_id, error))
                note = {"requestId": our_id, "reason": "no answer in time"}
                actions.append(ToClient(_notification_bytes("notifications/cancelled", note)))
        for our_id, assist in list(self._assisting.items()):
            if assist.deadline <= now:
                # The client's model did not answer in time: the ranking's answer stands.
                del self._assisting[our_id]
                note = {"requestId": our_id, "reason": "no answer in time"}
                actions.append(ToClient(_notification_bytes("notifications/cancelled", note)))
                actions.append(
                    self._analysis(assist, "ranking (the client's model did not answer in time)")
                )
        for service, backend in list(self.backends.items()):
            idle_until = backend.last_active + self.idle_timeouts.get(service, math.inf)
            if backend.state == "ready" and not self._busy(service) and idle_until <= now:
                del self.backends[service]
                self._forget_refreshes(service)
                actions.append(StopBackend(service, IDLE))
        return actions

    def _busy(self, service: str) -> bool:
        return any(f.service == service for f in self._forwarded.values()) or any(
            a.service == service for a in self._asked.values()
        )

    def _touch(self, service: str) -> None:
        backend = self.backends.get(service)
        if backend is not None:
            backend.last_active = self.clock()

    def answer_all(self, error: FabricError) -> list[Action]:
        """The session ends (shutdown, a failure): every request the client waits for gets
        ``error``, every open subscription its end. Nothing is owed afterwards.

        The driver ends the session next, but feeds what comes until then: a client request
        gets ``error`` too, and the backends hear nothing more (a start that completes is not
        greeted, a call that waited for it is not sent: its client was told it failed)."""
        self._ending = error
        for backend in self.backends.values():
            backend.queue = []  # (their requests are answered below)
        return self._with_done(self._answer_all(error))

    def client_gone(self) -> list[Action]:
        """The client left: the calls it waits for will never be answered to it."""
        now = self.clock()
        return [ToolCallDone(call) for call in self.calls.abandon(now)]

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
            call = self.calls.answered(request_id, data, self.clock())
            if call is not None:
                self._done.append(call)

    def _answer_all(self, error: FabricError) -> list[Action]:
        actions: list[Action] = [
            self._error(forwarded.client_id, error)
            for forwarded in self._forwarded.values()
            if forwarded.client_id is not None
        ]
        self._forwarded.clear()
        self._asked.clear()
        actions += [self._analysis(assist, "ranking") for assist in self._assisting.values()]
        self._assisting.clear()
        for request_id in self._listeners:
            ended = {"resultType": "complete", "_meta": {SUBSCRIPTION_META: request_id}}
            actions.append(self._result(request_id, ended))
        self._listeners.clear()
        return actions

    # --- events from the client ---------------------------------------------------------------

    def client_message(self, data: bytes) -> list[Action]:
        """One message from the client."""
        self._message_bytes = len(data)
        return self._with_done(self._client_message(data))

    def _client_message(self, data: bytes) -> list[Action]:
        try:
            kind = peek(data)
            message = msgspec.json.decode(data)
        except (ParseError, InvalidRequest) as exc:
            return [self._error(exc.request_id, exc)]
        except (msgspec.DecodeError, RecursionError):
            return [self._error(None, ParseError("not valid JSON", reason=INVALID_JSON))]
        if kind.is_response:
            return self._client_answer(message)
        method = str(message["method"])
        params = message.get("params")
        if not isinstance(params, dict):
            params = {}
        if not kind.is_request:
            return self._client_notification(method, params)
        if self._client_waits_on(message["id"]):
            return self._refuse_duplicate(message["id"], method, params)
        return self._client_request(message["id"], method, params)

    def _client_waits_on(self, request_id: RequestId) -> bool:
        """Whether a request of the client's under this id is still to be answered."""
        return (
            request_id in self.calls.open
            or request_id in self._listeners
            or any(f.client_id == request_id for f in self._forwarded.values())
            or any(a.client_id == request_id for a in self._assisting.values())
        )

    def _refuse_duplicate(self, request_id: RequestId, method: str, params: Json) -> list[Action]:
        """Answer a request under an id in flight without touching what is in flight: the
        first request keeps its answer to come, and a tools/call its one record (the refused
        one gets its own)."""
        error = duplicate_request(request_id)
        body = {"jsonrpc": "2.0", "id": request_id, "error": error.to_jsonrpc_error()}
        data = _encoder.encode(body)
        if method == "tools/call":
            tool, arguments, traceparent = _audited(params)
            refused = self.calls.refused(
                request_id,
                tool=tool,
                service=FABRIC_SERVICE,
                arguments=arguments,
                traceparent=traceparent,
                nbytes=self._message_bytes,
                answer=data,
                now=self.clock(),
            )
            self._done.append(refused)
        return [ToClient(data, (error.code, error.reason))]

    def _client_request(self, request_id: object, method: str, params: Json) -> list[Action]:
        if self._ending is not None:
            # The session ends: the request starts nothing, and gets the ending's error (a
            # tools/call its record, as every call).
            if method == "tools/call" and isinstance(request_id, str | int):
                self._begin_call(request_id, params)
            return [self._error(request_id, self._ending)]
        handler = {
            "initialize": self._on_initialize,
            "server/discover": self._on_discover,
            "ping": self._on_ping,
            "tools/list": self._on_tools_list,
            "tools/call": self._call,
            "prompts/list": self._on_prompts_list,
            "prompts/get": self._on_prompts_get,
            "resources/list": self._on_resources_list,
            "resources/templates/list": self._on_templates_list,
            "resources/read": self._on_resources_read,
            "subscriptions/listen": self._on_listen,
        }.get(method)
        if handler is None:
            return [self._fail(request_id, METHOD_NOT_FOUND, f"method {method!r} is not available")]
        return handler(request_id, params)

    def _on_initialize(self, request_id: object, params: Json) -> list[Action]:
        return [self._result(request_id, self._initialize(params))]

    def _on_discover(self, request_id: object, _params: Json) -> list[Action]:
        return [self._result(request_id, self._discover())]

    def _on_ping(self, request_id: object, _params: Json) -> list[Action]:
        return [self._result(request_id, {})]

    def _on_tools_list(self, request_id: object, _params: Json) -> list[Action]:
        return [self._result(request_id, self._listing({"tools": self.listed_tools()}))]

    def _on_prompts_list(self, request_id: object, _params: Json) -> list[Action]:
        prompts = self.catalog.prompts_of(self._shown())
        return [self._result(request_id, self._listing({"prompts": prompts}))]

    def _on_prompts_get(self, request_id: object, params: Json) -> list[Action]:
        entry = self.catalog.prompt(str(params.get("name")))
        if entry is None:
            return [
                self._fail(request_id, INVALID_PARAMS, f"unknown prompt {params.get('name')!r}")
            ]
        return self._forward(
            entry.service, request_id, "prompts/get", {**params, "name": entry.name}
        )

    def _on_resources_list(self, request_id: object, _params: Json) -> list[Action]:
        resources = self.catalog.resources_of(self._shown())
        return [self._result(request_id, self._listing({"resources": resources}))]

    def _on_templates_list(self, request_id: object, _params: Json) -> list[Action]:
        templates = [t for s in self._shown() for t in self.catalog.services[s].resource_templates]
        return [self._result(request_id, self._listing({"resourceTemplates": templates}))]

    def _on_resources_read(self, request_id: object, params: Json) -> list[Action]:
        route = self.catalog.resource(str(params.get("uri")))
        if route is None:
            unknown = f"unknown resource {params.get('uri')!r}"
            return [self._fail(request_id, INVALID_PARAMS, unknown)]
        service, uri = route
        return self._forward(service, request_id, "resources/read", {**params, "uri": uri})

    def _on_listen(self, request_id: object, params: Json) -> list[Action]:
        """A 2026-07-28 client opens its stream of list changes (answered when it ends)."""
        if len(self._listeners) >= MAX_LISTENERS:
            too_many = f"at most {MAX_LISTENERS} subscriptions per session"
            return [self._fail(request_id, INVALID_PARAMS, too_many)]
        asked = params.get("notifications")
        asked = asked if isinstance(asked, dict) else {}
        honoured = {key: True for key in _LISTEN_KEYS.values() if asked.get(key) is True}
        self._listeners[request_id] = honoured
        # Everything on a subscription's stream names it in _meta (how clients demultiplex).
        ack = {"notifications": honoured, "_meta": {SUBSCRIPTION_META: request_id}}
        return [ToClient(_notification_bytes("notifications/subscriptions/acknowledged", ack))]

    def _client_notification(self, method: str, params: Json) -> list[Action]:
        if method == "notifications/cancelled":
            return self._cancel(params)
        return []  # initialized, roots/list_changed (roots come from the mounts), …

    def _client_answer(self, message: Json) -> list[Action]:
        answered = message.get("id")
        assist = self._assisting.pop(answered, None) if isinstance(answered, int) else None
        if assist is not None:
            return [self._assisted(assist, message)]
        asked = self._asked.pop(answered, None) if isinstance(answered, int) else None
        if asked is None:
            return []  # an answer to nothing we asked: dropped
        reply = {k: v for k, v in message.items() if k != "id"}
        reply["id"] = asked.backend_id
        return [ToBackend(asked.service, _encoder.encode(reply))]

    # --- tools ----------------------------------------------------------------------------------

    def listed_tools(self) -> list[Json]:
        return [*META_TOOLS, *self.catalog.tools_of(self._shown())]

    def _shown(self) -> list[str]:
        return list(self.catalog.services) if self.exposure == "all" else self.active

    def _call(self, request_id: object, params: Json) -> list[Action]:
        name = params.get("name")
        arguments = params.get("arguments")
        if isinstance(request_id, str | int):
            self._begin_call(request_id, params)
        if not isinstance(arguments, dict):
            arguments = {}
        answering: dict[str, Callable[[Json], Json]] = {
            "find_tools": self._find_tools,
            "get_status": lambda _arguments: self._status(),
            "list_available_capabilities": self._capability_list,
        }
        acting: dict[str, Callable[[object, Json], list[Action]]] = {
            "analyze_task": self._analyze,
            "activate_servers": self._activate,
            "switch_context": self._switch,
        }
        if name == "call_tool":
            return self._call_tool(request_id, params, arguments)
        if isinstance(name, str) and name in answering:
            return [self._result(request_id, answering[name](arguments))]
        if isinstance(name, str) and name in acting:
            return acting[name](request_id, arguments)
        return self._call_entry(request_id, name, params)

    def _begin_call(self, request_id: RequestId, params: Json) -> None:
        """The audit's view of a call (see :func:`_audited`)."""
        tool, arguments, traceparent = _audited(params)
        self.calls.begin(
            request_id,
            tool=tool,
            # The endpoint's own until routed to a service's tool (see _call_entry).
            service=FABRIC_SERVICE,
            arguments=arguments,
            traceparent=traceparent,
            nbytes=self._message_bytes,
            now=self.clock(),
        )

    def _call_tool(self, request_id: object, params: Json, arguments: Json) -> list[Action]:
        target = arguments.get("name")
        # Models often nest a tool's arguments as "parameters": both are accepted.
        inner = arguments.get("arguments", arguments.get("parameters", {}))
        if not isinstance(inner, dict):
            inner = {}
        if target in META_NAMES:
            return [self._fail(request_id, INVALID_PARAMS, "call_tool calls a server's tool")]
        # The outer request's _meta (its progressToken) goes along.
        return self._call_entry(request_id, target, {**params, "arguments": inner})

    def _call_entry(self, request_id: object, name: object, params: Json) -> list[Action]:
        entry: Entry | None = self.catalog.tool(name) if isinstance(name, str) else None
        if entry is None:
            return [self._fail(request_id, INVALID_PARAMS, f"unknown tool {name!r}")]
        if isinstance(request_id, str | int):
            self.calls.route(request_id, entry.service, entry.name)
        return self._forward(
            entry.service, request_id, "tools/call", {**params, "name": entry.name}
        )

    def _find_tools(self, arguments: Json) -> Json:
        query = str(arguments.get("query", ""))
        limit = arguments.get("limit", FIND_LIMIT)
        limit = max(1, min(MAX_FIND_LIMIT, limit if isinstance(limit, int) else FIND_LIMIT))
        return _structured({"tools": found_tools(self.index, query, limit)})

    def _status(self) -> Json:
        return _structured(
            {
                "session_id": self.session_id,
                "active_servers": list(self.active),
                "total_tools": len(self.catalog.tools),
                "containers": [
                    {"server": service, "state": backend.state}
                    for service, backend in self.backends.items()
                ],
                "catalog_errors": self.catalog.errors(),
                "uptime": round(self.clock() - self.started_at, 3),
                "tool_tokens": tool_tokens(
                    self.index,
                    self._shown(),
                    META_TOOLS if self.exposure == "discover" else (),
                    self.count_tokens,
                ),
            }
        )

    def _activate(self, request_id: object, arguments: Json) -> list[Action]:
        wanted = arguments.get("servers")
        if not isinstance(wanted, list):
            return [self._fail(request_id, INVALID_PARAMS, "servers must be a list of names")]
        known = [s for s in wanted if isinstance(s, str) and s in self.catalog.services]
        failed = [s for s in wanted if s not in known]
        chosen = set(known) | (set() if arguments.get("deactivate_others") else set(self.active))
        changed = self._make_active(chosen)
        result = _structured(
            {
                "activated": known,
                "failed": failed,
                "reconnect_required": self._stateless,
                "estimated_tools_count": len(self.listed_tools()),
            }
        )
        return [self._result(request_id, result), *changed]

    def _switch(self, request_id: object, arguments: Json) -> list[Action]:
        profile = arguments.get("profile")
        add = arguments.get("add_servers", [])
        remove = arguments.get("remove_servers", [])
        if not isinstance(add, list) or not isinstance(remove, list):
            return [self._fail(request_id, INVALID_PARAMS, "servers must be lists of names")]
        if profile is not None and profile not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none"
            unknown = f"unknown profile {profile!r} (profiles: {known})"
            return [self._fail(request_id, INVALID_PARAMS, unknown)]
        unknown_servers = [s for s in [*add, *remove] if s not in self.catalog.services]
        if unknown_servers:
            return [self._fail(request_id, INVALID_PARAMS, f"unknown servers {unknown_servers}")]
        chosen = set(self.profiles[profile]) if profile is not None else set(self.active)
        chosen = (chosen | set(add)) - set(remove)
        changed = self._make_active(chosen)
        result = _structured(
            {
                "new_configuration": {
                    "profile": profile,
                    "active_servers": list(self.active),
                    "tools_count": len(self.listed_tools()),
                },
                "reconnect_required": self._stateless,
            }
        )
        return [self._result(request_id, result), *changed]

    @property
    def _stateless(self) -> bool:
        # A 2026-07-28 client never sent initialize: its lists never change within a
        # connection, so activation shows only after it reconnects.
        return self.protocol_version is None

    def _make_active(self, chosen: set[str]) -> list[Action]:
        """Set the active servers; tell a handshake-era client if its tool list changed."""
        before = self.listed_tools() if not self._stateless else None
        self.active = [s for s in self.catalog.services if s in chosen]
        if before is None or before == self.listed_tools():
            return []
        return [_notification("notifications/tools/list_changed")]

    def _analyze(self, request_id: object, arguments: Json) -> list[Action]:
        """Rank the suite's servers for a task (:mod:`reactor_fabric.discovery`); when the
        ranking is unsure and the suite allows it, ask the client's model to choose."""
        ranking, budget = analyze(self.index, arguments, self.token_budget)
        settings = self.assist
        if (
            settings.enabled
            and "sampling" in self.client_capabilities
            and ranking.confidence < settings.below_confidence
            and len(ranking.ranked) >= 2
        ):
            params, candidates = assist_request(ranking, self.index, settings.candidates)
            our_id = self._new_id()
            deadline = self.clock() + settings.timeout
            self._assisting[our_id] = _Assist(
                request_id, ranking, tuple(candidates), budget, deadline
            )
            request = {
                "jsonrpc": "2.0",
                "id": our_id,
                "method": "sampling/createMessage",
                "params": params,
            }
            return [ToClient(_encoder.encode(request))]
        return [self._result(request_id, _structured(analysis(ranking, budget=budget)))]

    def _assisted(self, assist: _Assist, message: Json) -> ToClient:
        """The client's model answered (or refused): its choice among the candidates, or the
        ranking's own when it chose none of them."""
        chosen = assist_choice(message.get("result"), assist.candidates)
        if not chosen:
            refused = "refused" if "error" in message else "chose none of the candidates"
            return self._analysis(assist, f"ranking (the client's model {refused})")
        why = f"chosen by the client's model among {', '.join(assist.candidates)}"
        ranking = with_choice(self.index, assist.ranking, chosen, budget=assist.budget, why=why)
        result = analysis(ranking, budget=assist.budget, decided_by="client_model")
        return self._result(assist.client_id, _structured(result))

    def _analysis(self, assist: _Assist, decided_by: str) -> ToClient:
        result = analysis(assist.ranking, budget=assist.budget, decided_by=decided_by)
        return self._result(assist.client_id, _structured(result))

    def _capability_list(self, arguments: Json) -> Json:
        wanted = arguments.get("category_filter")
        groups: dict[str, tuple[list[str], list[str]]] = {}
        for service in self.catalog.services:
            facts = self.facts.get(service, ServiceFacts())
            for category in facts.categories or ("other",):
                servers, tasks = groups.setdefault(category, ([], []))
                servers.append(service)
                tasks.extend(facts.example_tasks)
        listed = [
            {"category": category, "servers": servers, "example_tasks": tasks}
            for category, (servers, tasks) in groups.items()
            if not isinstance(wanted, str) or wanted.lower() in category.lower()
        ]
        return _structured({"capabilities": listed})

    # --- routing to backends --------------------------------------------------------------------

    def _forward(self, service: str, client_id: object, method: str, params: Json) -> list[Action]:
        if len(self._forwarded) >= MAX_PENDING:
            return [self._fail(client_id, INVALID_PARAMS, "too many requests in flight")]
        request = {"jsonrpc": "2.0", "id": None, "method": method, "params": _for_backend(params)}
        backend = self.backends.get(service)
        if backend is None:
            self.backends[service] = _Backend("starting", [request], self.clock())
            self._remember(request, service, client_id, method)
            return [StartBackend(service)]
        if backend.state != "ready":
            if len(backend.queue) >= MAX_QUEUED_PER_BACKEND:
                return [self._fail(client_id, INVALID_PARAMS, f"{service} is still starting")]
            backend.queue.append(request)
            self._remember(request, service, client_id, method)
            return []
        self._remember(request, service, client_id, method)
        backend.last_active = self.clock()
        return [ToBackend(service, _encoder.encode(request))]

    def _remember(self, request: Json, service: str, client_id: object, method: str) -> None:
        request["id"] = self._new_id()
        self._forwarded[request["id"]] = _Forwarded(service, client_id, method)

    def _cancel(self, params: Json) -> list[Action]:
        client_id = params.get("requestId")
        if self.calls.open and isinstance(client_id, str | int):
            call = self.calls.cancelled(client_id, self.clock())
            if call is not None:
                self._done.append(call)
        if self._listeners.pop(client_id, None) is not None:
            return []  # a subscription the client closed: nothing to answer
        for our_id, forwarded in self._forwarded.items():
            if forwarded.client_id == client_id and forwarded.client_id is not None:
                backend = self.backends.get(forwarded.service)
                if backend is not None and backend.state != "ready":
                    # Not sent yet: take it out of the queue; nobody will answer it.
                    backend.queue = [r for r in backend.queue if r["id"] != our_id]
                    del self._forwarded[our_id]
                    return []
                # The backend should not answer a cancelled request: nothing waits for one.
                del self._forwarded[our_id]
                note = {**params, "requestId": our_id}
                return [
                    ToBackend(
                        forwarded.service, _notification_bytes("notifications/cancelled", note)
                    )
                ]
        return []

    # --- events from backends -------------------------------------------------------------------

    def backend_started(self, service: str) -> list[Action]:
        """The service's container runs: greet it as a client would."""
        backend = self.backends.get(service)
        if backend is None or self._ending is not None:
            return []
        backend.state = "handshaking"
        backend.last_active = self.clock()
        capabilities: Json = {"roots": {"listChanged": False}}
        for capability in ("sampling", "elicitation"):
            if capability in self.client_capabilities:
                capabilities[capability] = self.client_capabilities[capability]
        handshake_id = self._new_id()
        handshake = {
            "jsonrpc": "2.0",
            "id": handshake_id,
            "method": "initialize",
            "params": {
                "protocolVersion": BACKEND_PROTOCOL,
                "capabilities": capabilities,
                "clientInfo": {"name": SERVER_NAME, "version": self.version},
            },
        }
        self._forwarded[handshake_id] = _Forwarded(service, None, "initialize")
        return self._own(service, _encoder.encode(handshake))

    def backend_message(self, service: str, data: bytes) -> list[Action]:
        """One line from a service's container."""
        if self._ending is not None:
            return []  # nothing is owed any more, nor asked of the client
        self._backend_bytes = len(data)
        return self._with_done(self._backend_message(service, data))

    def _backend_message(self, service: str, data: bytes) -> list[Action]:
        try:
            message = msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            message = None  # not a message: a server's stray output
        if not isinstance(message, dict):
            return []
        self._touch(service)
        if "method" in message:
            if "id" in message:
                return self._backend_request(service, message)
            return self._backend_notification(service, message)
        return self._backend_answer(service, message)

    def _backend_answer(self, service: str, message: Json) -> list[Action]:
        our_id = message.get("id")
        if not isinstance(our_id, int):
            return []
        forwarded = self._forwarded.get(our_id)
        if forwarded is None or forwarded.service != service:
            return []
        del self._forwarded[our_id]
        if forwarded.client_id is None:
            if forwarded.method == "initialize":
                return self._handshake_done(service, message)
            return self._refreshed(service, forwarded.method, message)
        reply = {k: v for k, v in message.items() if k != "id"}
        reply["id"] = forwarded.client_id
        result = reply.get("result")
        if self._stateless and isinstance(result, dict):
            result = _complete(result)
            reply["result"] = (
                {**CACHE_PRIVATE, **result} if forwarded.method == "resources/read" else result
            )
        data = _encoder.encode(reply)
        self._ended(forwarded.client_id, data)
        return [ToClient(data)]

    def _handshake_done(self, service: str, message: Json) -> list[Action]:
        backend = self.backends.get(service)
        if backend is None:
            return []
        if "result" not in message:
            error = message.get("error")
            detail = error.get("message") if isinstance(error, dict) else "no result"
            refused = ContainerStartFailure(
                f"{service} refused the handshake: {detail}", reason=HANDSHAKE_FAILED
            )
            # Removed as well as forgotten: the next call starts a fresh one, and this one
            # would otherwise run beside it until the session ends.
            stop = StopBackend(service, refused.reason)
            return [stop, *self._backend_failed(service, refused)]
        backend.state = "ready"
        actions = self._own(service, _notification_bytes("notifications/initialized", None))
        if service not in self.backends:
            return actions  # it was found broken
        actions += [ToBackend(service, _encoder.encode(request)) for request in backend.queue]
        backend.queue = []
        return actions

    def _backend_request(self, service: str, message: Json) -> list[Action]:
        method = str(message.get("method"))
        answer: Json = {"jsonrpc": "2.0", "id": message.get("id")}
        if any(a.service == service and a.backend_id == answer["id"] for a in self._asked.values()):
            # The client's answer could not be told from the first's: refused, as the relay does.
            answer["error"] = duplicate_request(answer["id"]).to_jsonrpc_error()
            return self._own(service, _encoder.encode(answer))
        capability = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation"}
        if method == "roots/list":
            roots = [{"uri": f"file://{target}", "name": target} for target in self.mount_targets]
            answer["result"] = {"roots": roots}
        elif method == "ping":
            answer["result"] = {}
        elif capability.get(method) in self.client_capabilities:
            if len(self._asked) >= MAX_SERVER_REQUESTS:
                # As on the relay: the client is not asked more than this at once; the
                # backend is told at once (and never waits for the expiry of each).
                refusal = too_many_requests_to_client(MAX_SERVER_REQUESTS)
                return self._own(service, error_response(message.get("id"), refusal))
            our_id = self._new_id()
            self._asked[our_id] = _Asked(service, message.get("id"), self.clock() + ASK_SECONDS)
            return [ToClient(_encoder.encode({**message, "id": our_id}))]
        else:
            answer["error"] = {
                "code": METHOD_NOT_FOUND,
                "message": f"the client does not offer {method}",
            }
        return self._own(service, _encoder.encode(answer))

    def _backend_notification(self, service: str, message: Json) -> list[Action]:
        method = message.get("method")
        if method in ("notifications/progress", "notifications/message"):
            return [ToClient(_encoder.encode(message))]
        if method == "notifications/cancelled":
            params = message.get("params")
            if isinstance(params, dict):
                asked = [
                    i
                    for i, a in self._asked.items()
                    if a.service == service and a.backend_id == params.get("requestId")
                ]
                for our_id in asked:
                    del self._asked[our_id]
                    return [
                        ToClient(
                            _notification_bytes(
                                "notifications/cancelled", {**params, "requestId": our_id}
                            )
                        )
                    ]
            return []
        if isinstance(method, str) and method in _REFRESH:
            # Ask the service what it offers now (see _refreshed); unless its list is asked for
            # or in the works already: then once more after that one, however often it repeats.
            _list_method, kind = _REFRESH[method]
            relist = self._refreshing.get((service, kind))
            if relist is not None:
                relist.again = True
                return []
            return self._ask_list(service, kind)
        return []

    def _ask_list(self, service: str, kind: str) -> list[Action]:
        self._refreshing[service, kind] = _Relist()
        list_method = next(m for m, k in _REFRESH.values() if k == kind)
        our_id = self._new_id()
        self._forwarded[our_id] = _Forwarded(service, None, list_method)
        request = {"jsonrpc": "2.0", "id": our_id, "method": list_method}
        return self._own(service, _encoder.encode(request))

    def _refreshed(self, service: str, method: str, message: Json) -> list[Action]:
        """A service's fresh list (after its list_changed): kept for the next :class:`Refresh`,
        which makes the catalog and index from it off the event loop (see :meth:`refreshed`).
        A list over :data:`MAX_LIST_BYTES` is refused: the backend is treated as broken."""
        kind = dict(_REFRESH.values()).get(method)
        if kind is None:
            return []
        result = message.get("result")
        entries = result.get(kind) if isinstance(result, dict) else None
        relist = self._refreshing.get((service, kind))
        if relist is None:
            return []  # asked of a container that is gone since
        if not isinstance(entries, list) or service not in self.catalog.services:
            return self._list_done(service, kind, relist)  # no list: the catalog stays
        if self._backend_bytes > MAX_LIST_BYTES:
            error = ContainerStartFailure(
                f"the {service} server answered {method} with {self._backend_bytes} bytes, more "
                f"than the {MAX_LIST_BYTES} the fabric endpoint takes: it is treated as broken",
                reason=BACKEND_LIST_TOO_LARGE,
            )
            actions = self._backend_failed(service, error)
            return [*actions, StopBackend(service, BACKEND_LIST_TOO_LARGE)]
        self._fresh[service, kind] = (relist, tuple(entries))
        return self._next_refresh()

    def _next_refresh(self) -> list[Action]:
        """The next :class:`Refresh`, with every list that came meanwhile, if none runs."""
        if self._refresh is not None or not self._fresh:
            return []
        fresh = self._fresh.items()
        lists = tuple((service, kind, entries) for (service, kind), (_, entries) in fresh)
        self._running = {key: relist for key, (relist, _) in self._fresh.items()}
        self._fresh = {}
        self._refresh = Refresh(self.catalog, lists, self.facts, self.count_tokens)
        return [self._refresh]

    def refreshed(self, refresh: Refresh, result: Refreshed | None) -> list[Action]:
        """``refresh`` ran (``None``: it failed or was given up; the catalog stays as it was):
        its catalog and index are this session's now, its tool changes are recorded, the
        client is told — a handshake-era client if it lists a refreshed service, a listener if
        it asked — and a backend that repeated list_changed meanwhile is asked again."""
        if refresh is not self._refresh:
            return []
        self._refresh = None
        if self._ending is not None:
            return []
        running, self._running = self._running, {}
        actions: list[Action] = []
        if result is not None:
            self.catalog = result.catalog
            if result.index is not None:
                self.index = result.index
            actions += [ToolsChanged(changes) for changes in result.changes]
            for kind in _LISTEN_KEYS:
                refreshed = [service for service, k, _entries in refresh.lists if k == kind]
                if refreshed:
                    actions += self._announce(kind, refreshed)
        for (service, kind), relist in running.items():
            actions += self._list_done(service, kind, relist)
        actions += self._next_refresh()
        return self._with_done(actions)

    def _announce(self, kind: str, services: list[str]) -> list[Action]:
        method = f"notifications/{kind}/list_changed"
        actions: list[Action] = [
            ToClient(_notification_bytes(method, {"_meta": {SUBSCRIPTION_META: listen_id}}))
            for listen_id, wants in self._listeners.items()
            if wants.get(_LISTEN_KEYS[kind])
        ]
        shown = self._shown()
        if not self._stateless and any(service in shown for service in services):
            actions.append(_notification(method))
        return actions

    def _list_done(self, service: str, kind: str, relist: _Relist) -> list[Action]:
        """A backend's list is in the catalog (or came to nothing): asked again if it sent
        list_changed meanwhile. (A container gone since forgot its lists: nothing to do.)"""
        if self._refreshing.get((service, kind)) is not relist:
            return []
        del self._refreshing[service, kind]
        return self._ask_list(service, kind) if relist.again else []

    def _forget_refreshes(self, service: str) -> None:
        """The service's container is gone: the next one's list_changed is asked at once."""
        for key in [key for key in self._refreshing if key[0] == service]:
            del self._refreshing[key]
        for key in [key for key in self._fresh if key[0] == service]:
            del self._fresh[key]

    def backend_read(self, service: str, nbytes: int) -> None:
        """``nbytes`` of the endpoint's own messages (:attr:`ToBackend.own`, with their newline)
        were written to the service's container's stdin."""
        backend = self.backends.get(service)
        if backend is not None:
            backend.unread = max(0, backend.unread - nbytes)

    def _own(self, service: str, data: bytes) -> list[Action]:
        """A message of the endpoint's own for ``service``'s container, within the bound on
        what it leaves unread. Past it the backend has stopped reading its stdin while asking
        (pings, roots, refreshes…): it is broken, not the orchestrator's memory (one message
        alone may exceed the bound, as a client's may)."""
        backend = self.backends.get(service)
        if backend is None:
            return []  # forgotten (broken, stopped): nothing is owed to it any more
        size = len(data) + 1  # the driver ends each line with a newline
        if backend.unread and backend.unread + size > self.own_backlog_bytes:
            return self._unresponsive(service, backend.unread)
        backend.unread += size
        return [ToBackend(service, data, own=True)]

    def _unresponsive(self, service: str, unread: int) -> list[Action]:
        error = ContainerStartFailure(
            f"the {service} server stopped reading its input ({unread} bytes of the "
            "orchestrator's own messages to it unread); its container was removed, the next "
            "call starts a fresh one",
            reason=UNRESPONSIVE,
        )
        # Stopped first: the driver drops what waits for its stdin before the answers go out.
        return [StopBackend(service, UNRESPONSIVE), *self._backend_failed(service, error)]

    def backend_failed(self, service: str, error: FabricError) -> list[Action]:
        """The service's container could not start, or ended: answer what it owed, forget it
        (the next call starts a new one). The session's other services go on."""
        if self._ending is not None:
            return []  # it owes nothing any more
        return self._with_done(self._backend_failed(service, error))

    def _backend_failed(self, service: str, error: FabricError) -> list[Action]:
        self.backends.pop(service, None)
        self._forget_refreshes(service)
        actions: list[Action] = []
        for our_id, forwarded in list(self._forwarded.items()):
            if forwarded.service != service:
                continue
            del self._forwarded[our_id]
            if forwarded.client_id is not None:
                actions.append(self._error(forwarded.client_id, error))
        for our_id, asked in list(self._asked.items()):
            if asked.service == service:
                del self._asked[our_id]
        return actions

    # --- answers --------------------------------------------------------------------------------

    def _initialize(self, params: Json) -> Json:
        requested = params.get("protocolVersion")
        self.protocol_version = (
            requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
        )
        capabilities = params.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": self._capabilities(),
            "serverInfo": {"name": SERVER_NAME, "version": self.version},
            "instructions": "Tools are named server__tool. Use find_tools to find one for a "
            "task among every server of the suite, and call_tool to call it.",
        }

    def _discover(self) -> Json:
        return {
            **CACHE_PRIVATE,
            "supportedVersions": [STATELESS_VERSION],
            "capabilities": self._capabilities(),
            "resultType": "complete",
            "_meta": {
                "io.modelcontextprotocol/serverInfo": {"name": SERVER_NAME, "version": self.version}
            },
        }

    def _capabilities(self) -> Json:
        return {
            "tools": {"listChanged": True},
            "prompts": {"listChanged": False},
            "resources": {"listChanged": False, "subscribe": False},
        }

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _listing(self, result: Json) -> Json:
        # 2026-07-28 list results say how long they may be cached; this session's lists are
        # its own (its mounts, its activation): private, and re-asked each time.
        return {**CACHE_PRIVATE, **result} if self._stateless else result

    def _result(self, request_id: object, result: Json) -> ToClient:
        if self._stateless:
            result = _complete(result)
        return self._answer(request_id, {"jsonrpc": "2.0", "id": request_id, "result": result})

    def _fail(self, request_id: object, code: int, message: str) -> ToClient:
        error = {"code": code, "message": message}
        body = {"jsonrpc": "2.0", "id": request_id, "error": error}
        return self._answer(request_id, body, (code, _REASONS.get(code, NONE)))

    def _error(self, request_id: object, error: FabricError) -> ToClient:
        body = {"jsonrpc": "2.0", "id": request_id, "error": error.to_jsonrpc_error()}
        return self._answer(request_id, body, (error.code, error.reason))

    def _answer(
        self, request_id: object, body: Json, error: tuple[int, str] | None = None
    ) -> ToClient:
        data = _encoder.encode(body)
        self._ended(request_id, data)
        return ToClient(data, error)


def _audited(params: Json) -> tuple[object, object, object]:
    """What the audit keeps of a tools/call's params: the tool it names (call_tool: the one it
    calls), its arguments and the client's traceparent."""
    name = params.get("name")
    arguments = params.get("arguments")
    if name == "call_tool" and isinstance(arguments, dict):
        name = arguments.get("name")
        arguments = arguments.get("arguments", arguments.get("parameters"))
    meta = params.get("_meta")
    return name, arguments, meta.get("traceparent") if isinstance(meta, dict) else None


def _complete(result: Json) -> Json:
    """A result as 2026-07-28 requires it: ``resultType`` says it is the whole answer."""
    return result if "resultType" in result else {"resultType": "complete", **result}


def _for_backend(params: Json) -> Json:
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


def _structured(content: Json) -> Json:
    """A CallToolResult carrying ``content`` as structured content and as its JSON text."""
    text = _encoder.encode(content).decode()
    return {"content": [{"type": "text", "text": text}], "structuredContent": content}


def _notification(method: str) -> ToClient:
    return ToClient(_notification_bytes(method, None))


def _notification_bytes(method: str, params: Json | None) -> bytes:
    message: Json = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return _encoder.encode(message)
