"""The fabric endpoint's MCP server for one client session, without I/O.

Unlike the per-service relay, which passes frames through untouched, this is an MCP server of
our own: it decodes every message. It answers the client's ``initialize`` / ``server/discover``,
lists the suite's tools, prompts and resources from the catalog (:mod:`.catalog`) under their
shown names with the endpoint's own tools first (:mod:`.fabric_meta_tools`), and routes each
call to its service's backend (:mod:`.fabric_router`, its base class: backends, ids both ways,
queueing, cancellation, backends' requests, refreshes).

It keeps the one session contract (:class:`~.events.SessionMachineContract`): the driver feeds
it :mod:`.events` with their time and carries out the actions it returns, in order (what it
decides of backends: see :mod:`.fabric_router`). A catalog refresh is a :class:`~.events.Compute`.
:attr:`deadline` says when it next needs a :class:`~.events.Tick` (also when the client's model
does not choose in time). :class:`~.events.Shutdown` answers everything owed, tells the client
and ends the session; :class:`~.events.ClientGone` records its calls, stops every backend, ends.

A client request under an id the client still waits on is refused (-32600
``duplicate_request_id``) before it goes anywhere: one id, one answer, one audit record.

Error handling: a message that is not JSON-RPC gets -32700 / -32600 (never raises); a call to an
unknown tool -32602 (but ``{service}__{tool}`` of a service whose offer could not be learned goes
to that service: see :meth:`.catalog.Catalog.addressed`); a call whose backend cannot start, or
whose backend dies, gets the backend's error (-32002 ``ContainerStartFailure``,
``DockerUnavailable``, a ``SecurityViolation`` of its mounts) — and the session's other services
are not affected.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from .._errors import FabricError, InvalidRequest, ParseError
from .._reasons import (
    INVALID_JSON,
    ORCHESTRATOR_STOPPING,
    SESSION_ENDED,
)
from ..discovery import DiscoveryIndex
from ..discovery.tokens import count_definition
from .agent_slots import AgentSlots
from .answers import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    ENDED_BY_OPERATOR,
    log_notification,
    session_ending,
)
from .catalog import Catalog, Entry, Redact, unredacted
from .client_lease import ClientLease
from .events import (
    Action,
    BackendLine,
    BackendMeasured,
    ClientActivity,
    ClientFrame,
    ClientGone,
    ClientRegistered,
    CloseClient,
    Computed,
    EndSession,
    Event,
    Job,
    Shutdown,
    StopBackend,
    Tick,
    ToClient,
    ToolCallDone,
    ToolsChanged,
)
from .fabric_discovery import AssistSettings, ServiceFacts, index_catalog
from .fabric_messages import (
    CACHE_PRIVATE,
    FABRIC_SERVICE,
    discover_result,
    encoder,
    initialize_result,
    negotiated,
    notification,
    notification_bytes,
)
from .fabric_meta_tools import (
    META_DEFINITIONS,
    META_NAMES,
    META_TOOLS,
    _Assist,
    assist_analysis,
    assisted,
)
from .fabric_refresh import Refreshed
from .fabric_router import (
    ASK_SECONDS,
    MAX_PER_CALL_CONTAINERS,
    MAX_QUEUED_PER_BACKEND,
    OWN_BACKLOG_BYTES,
    FabricRouter,
)
from .jsonrpc import RequestId, peek
from .lifecycle import Lifecycle
from .mcp import INVALID_PARAMS, METHOD_NOT_FOUND
from .suite_lock import Mode, SuiteLock, withheld_error
from .tool_calls import ArgumentsMode

__all__ = [
    "ASK_SECONDS",
    "FABRIC_SERVICE",
    "MAX_LISTENERS",
    "MAX_PER_CALL_CONTAINERS",
    "MAX_QUEUED_PER_BACKEND",
    "META_NAMES",
    "Exposure",
    "FabricServer",
    "Lifecycle",
]

Json = dict[str, Any]
Exposure = Literal["discover", "all"]

MAX_LISTENERS = 8
SUBSCRIPTION_META = "io.modelcontextprotocol/subscriptionId"
_LISTEN_KEYS = {
    "tools": "toolsListChanged",
    "prompts": "promptsListChanged",
    "resources": "resourcesListChanged",
}


class FabricServer(FabricRouter):
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
        now: float = 0.0,
        index: DiscoveryIndex | None = None,
        token_budget: int | None = None,
        assist: AssistSettings | None = None,
        count_tokens: Callable[[Json], int] = count_definition,
        audit_arguments: ArgumentsMode = "hash",
        own_backlog_bytes: int = OWN_BACKLOG_BYTES,
        buffer_to_server_bytes: int = OWN_BACKLOG_BYTES,
        client_lease: float | None = None,
        lifecycles: Mapping[str, Lifecycle] | None = None,
        lock: SuiteLock | None = None,
        lock_mode: Mode = "off",
        agents: Iterable[str] = (),
        agent_slots: AgentSlots | None = None,
        redact: Redact = unredacted,
    ) -> None:
        super().__init__(
            catalog,
            mount_targets=mount_targets,
            version=version,
            now=now,
            audit_arguments=audit_arguments,
            own_backlog_bytes=own_backlog_bytes,
            buffer_to_server_bytes=buffer_to_server_bytes,
            facts=facts or {},
            count_tokens=count_tokens,
            idle_timeouts=idle_timeouts or {},
            lifecycles=lifecycles or {},
            agents=agents,
            agent_slots=agent_slots,
            redact=redact,
        )
        self.session_id = session_id
        self.lock, self.lock_mode = lock, lock_mode  # (see suite_lock.py)
        self.exposure: Exposure = exposure
        wanted = set(active)  # once: ``active`` may be an iterator
        self.active: list[str] = [s for s in catalog.services if s in wanted]
        self.profiles = {name: list(services) for name, services in (profiles or {}).items()}
        # The ranking index of this session's catalog: the orchestrator's shared one when it
        # is given (built once per catalog), rebuilt here when a service's tools change.
        self.index = (
            index if index is not None else index_catalog(catalog, self.facts, count_tokens)
        )
        self.token_budget = token_budget
        self.assist = assist or AssistSettings()
        self._assisting: dict[int, _Assist] = {}
        self.started_at = now
        # Open 2026-07-28 subscriptions/listen requests: their id → what they asked for.
        self._listeners: dict[object, Json] = {}
        self.lease = ClientLease(client_lease, now)  # (see .client_lease)
        self._closed = False  # the session was ended (Shutdown, ClientGone): EndSession sent
        self._gone = False  # the client left: nothing more to do

    # --- the contract ---------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event at ``now``; the actions to carry out, in order."""
        actions = self._handle(event, now)
        if self.agent_slots is not None:
            # Counted from the state after every event: every way a call ends frees its slot.
            self.agent_slots.hold(self.session_id, 0 if self._gone else self.agent_calls)
        return actions

    def _handle(self, event: Event, now: float) -> list[Action]:
        self.now = now
        if self._gone:
            return []
        actions: list[Action] = []
        match event:
            case ClientFrame(frame=frame):
                self.lease.touch(now)
                actions = self._client_frame(frame)
            case ClientActivity():
                self.lease.touch(now)
            case ClientRegistered():
                pass  # backends start when a call needs them
            case ClientGone():
                actions = self._client_gone()
            case Tick():
                actions = self._on_tick()
            case Shutdown(reason=reason):
                actions = self._shutdown(reason)
            case Computed(job=job, result=result):
                refreshed = result if isinstance(result, Refreshed) else None
                actions = self._computed(job, refreshed)
            case BackendMeasured():
                actions = self._backend_measured(event)
            case _:
                if isinstance(event, BackendLine):
                    self.lease.touch(now)
                actions = self._backend_event(event)
        if self._closed:
            return actions
        # A per-call backend whose call ended, a retiring one whose calls ended: removed.
        return actions + self._settle_all()

    def abandon(self, now: float) -> list[Action]:
        """The session is over without the machine ending it: the calls still open will never
        be answered (their records, ``no_answer``)."""
        return [ToolCallDone(call) for call in self.calls.abandon(now)]

    def _client_gone(self) -> list[Action]:
        """The client left: its open calls are recorded, every backend stopped."""
        actions = self.abandon(self.now)
        self._gone = True
        if self._closed:
            return actions
        self._closed = True
        stops = [
            StopBackend(b.key, SESSION_ENDED, graceful=True) for b in self.all_backends.values()
        ]
        self.all_backends.clear()
        self.backends.clear()
        return [*actions, *stops, EndSession()]

    def _shutdown(self, reason: str) -> list[Action]:
        """The orchestrator stops, or an operator ended the session: everything owed is
        answered, the client told, and the session ends (nothing starts after)."""
        if self._closed:
            return []
        self._closed = True
        error = session_ending(reason)
        actions = self.answer_all(error)
        if reason == ENDED_BY_OPERATOR:
            # Clients show log messages; a request in flight shows the error above.
            actions.append(ToClient(log_notification("warning", str(error))))
        code = CLOSE_GOING_AWAY if reason == ORCHESTRATOR_STOPPING else CLOSE_NORMAL
        return [*actions, CloseClient(code, reason.replace("_", " ")), EndSession()]

    # --- model checking -----------------------------------------------------------------------

    def clone(self) -> FabricServer:
        """An independent copy of the machine in its current state (for model checking). What
        is never changed in place is shared: the catalog and its index (replaced whole by a
        refresh), the settings, a running :class:`Refresh`, the requests waiting in a queue."""
        twin = copy.copy(self)
        twin.active = list(self.active)
        twin._assisting = dict(self._assisting)
        twin.all_backends = {
            key: dataclasses.replace(
                backend, queue=list(backend.queue), writes=collections.deque(backend.writes)
            )
            for key, backend in self.all_backends.items()
        }
        # (the same objects as the twin's all_backends, as here)
        twin.backends = {s: twin.all_backends[b.key] for s, b in self.backends.items()}
        twin._had = set(self._had)
        twin._forwarded = dict(self._forwarded)
        twin._asked = dict(self._asked)
        twin._listeners = dict(self._listeners)
        twin.calls = self.calls.clone()
        twin.served = self.served.clone()
        twin._done = list(self._done)
        twin.relists = self.relists.clone()
        twin.waits = self.waits.clone()
        twin.lease = dataclasses.replace(self.lease)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """A hashable summary of the whole state: equal fingerprints behave alike (used to
        explore every reachable state once when model-checking the machine). The ranking index
        is left out: it is made from the catalog, which is in."""

        def encoded(value: object) -> bytes:
            return encoder.encode(value)

        return (
            encoded(self.catalog.services),
            tuple(self.active),
            self.exposure,
            encoded(self.client_capabilities),
            self.protocol_version,
            tuple(
                (
                    b.key,
                    b.state,
                    tuple(w.line for w in b.queue),
                    b.last_active,
                    tuple(b.writes),
                    b.role,
                    b.calls,
                    b.started_at,
                    b.measuring,
                    b.measured_calls,
                )
                for _k, b in sorted(self.all_backends.items())
            ),
            tuple(sorted((s, b.key) for s, b in self.backends.items())),
            self._seq,
            tuple(sorted(self._had)),
            self._closed,
            self._gone,
            tuple(sorted(((i, repr(f)) for i, f in self._forwarded.items()))),
            tuple(sorted(((i, repr(a)) for i, a in self._asked.items()))),
            tuple(sorted(((i, repr(a)) for i, a in self._assisting.items()))),
            tuple(sorted((repr(i), encoded(w)) for i, w in self._listeners.items())),
            self._next_id,
            tuple(sorted((repr(i), repr(c)) for i, c in self.calls.open.items())),
            len(self._done),
            self.relists.fingerprint(),
            self.waits.fingerprint(),
            None if self._ending is None else self._ending.reason,
            self.lease.state(),
        )

    # --- time ---------------------------------------------------------------------------------

    @property
    def deadline(self) -> float | None:
        """When a :class:`~.events.Tick` is next due (None: nothing will come due by itself)."""
        if self._ending is not None:
            return None
        due = self._backend_deadlines()
        due += [assist.deadline for assist in self._assisting.values()]
        due.append(math.inf if self.lease.deadline is None else self.lease.deadline)
        finite = [when for when in due if when != math.inf]
        return min(finite) if finite else None

    def _on_tick(self) -> list[Action]:
        """Whatever came due: backends' unanswered requests to the client, idle services."""
        if self._ending is not None:
            return []
        return self._with_done(self._tick()) + self.lease.expire_if_due(self.now)

    def _tick(self) -> list[Action]:
        now = self.now
        actions = self._expire_asked(now)
        for our_id, assist in list(self._assisting.items()):
            if assist.deadline <= now:
                # The client's model did not answer in time: the ranking's answer stands.
                del self._assisting[our_id]
                note = {"requestId": our_id, "reason": "no answer in time"}
                actions.append(ToClient(notification_bytes("notifications/cancelled", note)))
                late = "ranking (the client's model did not answer in time)"
                actions.append(assist_analysis(self, assist, late))
        return actions + self._stop_idle(now)

    def answer_all(self, error: FabricError) -> list[Action]:
        """The session ends (shutdown, a failure): every request the client waits for gets
        ``error``, every open subscription its end. Nothing is owed afterwards.

        The driver ends the session next, but feeds what comes until then: a client request
        gets ``error`` too, and the backends hear nothing more (a start that completes is not
        greeted, a call that waited for it is not sent: its client was told it failed)."""
        self._ending = error
        for backend in self.all_backends.values():
            backend.queue = []  # (their requests are answered below)
        return self._with_done(self._answer_all(error))

    def _answer_all(self, error: FabricError) -> list[Action]:
        actions: list[Action] = [
            self._error(forwarded.client_id, error)
            for forwarded in self._forwarded.values()
            if forwarded.client_id is not None
        ]
        self._forwarded.clear()
        self._asked.clear()
        self.waits.clear()  # (their retries find the session ending)
        actions += [assist_analysis(self, assist, "ranking") for assist in self._assisting.values()]
        self._assisting.clear()
        for request_id in self._listeners:
            ended = {"resultType": "complete", "_meta": {SUBSCRIPTION_META: request_id}}
            actions.append(self._result(request_id, ended))
        self._listeners.clear()
        return actions

    # --- events from the client ---------------------------------------------------------------

    def _client_frame(self, data: bytes) -> list[Action]:
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
        self.protocol_version = negotiated(params.get("protocolVersion"))
        capabilities = params.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        result = initialize_result(self.protocol_version, self.version)
        return [self._result(request_id, result)]

    def _on_discover(self, request_id: object, _params: Json) -> list[Action]:
        return [self._result(request_id, discover_result(self.version))]

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
        return [ToClient(notification_bytes("notifications/subscriptions/acknowledged", ack))]

    def _client_notification(self, method: str, params: Json) -> list[Action]:
        if method == "notifications/cancelled":
            return self._cancel(params)
        return []  # initialized, roots/list_changed (roots come from the mounts), …

    def _cancel(self, params: Json) -> list[Action]:
        client_id = params.get("requestId")
        if self.calls.open and isinstance(client_id, str | int):
            call = self.calls.cancelled(client_id, self.now)
            if call is not None:
                self._done.append(call)
        if self._listeners.pop(client_id, None) is not None:
            return []  # a subscription the client closed: nothing to answer
        return self._cancel_forwarded(client_id, params)

    def _client_answer(self, message: Json) -> list[Action]:
        answered = message.get("id")
        assist = self._assisting.pop(answered, None) if isinstance(answered, int) else None
        if assist is not None:
            return [assisted(self, assist, message)]
        asked = self._asked.pop(answered, None) if isinstance(answered, int) else None
        if asked is None:
            return []  # an answer to nothing we asked: dropped
        reply = {k: v for k, v in message.items() if k != "id"}
        reply["id"] = asked.backend_id
        return self._send(asked.key, encoder.encode(reply))

    # --- tools ----------------------------------------------------------------------------------

    def listed_tools(self) -> list[Json]:
        return [*META_DEFINITIONS, *self.catalog.tools_of(self._shown())]

    def _shown(self) -> list[str]:
        return list(self.catalog.services) if self.exposure == "all" else self.active

    def _call(self, request_id: object, params: Json) -> list[Action]:
        name = params.get("name")
        arguments = params.get("arguments")
        if isinstance(request_id, str | int):
            self._begin_call(request_id, params)
        if not isinstance(arguments, dict):
            arguments = {}
        meta = META_TOOLS.get(name) if isinstance(name, str) else None
        if meta is not None:
            return meta.handler(self, request_id, arguments, params)
        return self._call_entry(request_id, name, params)

    def _call_entry(self, request_id: object, name: object, params: Json) -> list[Action]:
        entry: Entry | None = self.catalog.tool(name) if isinstance(name, str) else None
        if entry is not None:
            route = (entry.service, entry.name)
        else:
            # A service whose offer could not be learned is still called by name: its start
            # answers why it cannot run (-32002 image_not_found…), not "unknown tool".
            withheld = self.catalog.withheld_tool(name) if isinstance(name, str) else None
            if withheld is not None:
                return [self._withheld(request_id, *withheld)]
            addressed = self.catalog.addressed(name) if isinstance(name, str) else None
            if addressed is None:
                return [self._fail(request_id, INVALID_PARAMS, f"unknown tool {name!r}")]
            route = addressed
        service, tool = route
        if isinstance(request_id, str | int):
            self.calls.route(request_id, service, tool)
        return self._forward(service, request_id, "tools/call", {**params, "name": tool})

    def _withheld(self, request_id: object, service: str, why: Json) -> ToClient:
        """A call of a tool the suite lock withholds (orchestrator.lock: enforce)."""
        if isinstance(request_id, str | int):
            self.calls.route(request_id, service, str(why.get("tool")))
        return self._error(request_id, withheld_error(service, why))

    # --- refreshes and answers ------------------------------------------------------------------

    def _computed(self, job: Job, result: Refreshed | None) -> list[Action]:
        """The refresh ran (``None``: it failed or was given up; the catalog stays as it was):
        its catalog and index are this session's now, its tool changes are recorded, the
        client is told — a handshake-era client if it lists a refreshed service, a listener if
        it asked — and a backend that repeated list_changed meanwhile is asked again."""
        finished = self.relists.finished(job)
        if finished is None or self._ending is not None:
            return []
        refresh, held = finished
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
        for (service, kind), relist in held.items():
            actions += self._list_done(service, kind, relist)
        actions += self._next_refresh()
        return self._with_done(actions)

    def _announce(self, kind: str, services: list[str]) -> list[Action]:
        method = f"notifications/{kind}/list_changed"
        actions: list[Action] = [
            ToClient(notification_bytes(method, {"_meta": {SUBSCRIPTION_META: listen_id}}))
            for listen_id, wants in self._listeners.items()
            if wants.get(_LISTEN_KEYS[kind])
        ]
        shown = self._shown()
        if not self._stateless and any(service in shown for service in services):
            actions.append(notification(method))
        return actions

    def _listing(self, result: Json) -> Json:
        # 2026-07-28 list results say how long they may be cached; this session's lists are
        # its own (its mounts, its activation): private, and re-asked each time.
        return {**CACHE_PRIVATE, **result} if self._stateless else result
