"""The fabric endpoint's backends for one session, without I/O: the router of
:class:`~.fabric_server.FabricServer` (its base class).

Each service the session calls gets a backend — a container of that service for this session,
started on first use (:class:`~.events.StartBackend`, keyed by a :class:`~.events.BackendKey`
whose ``seq`` counts the session's starts and names the container; a respawn when its service
ran one before) and spoken to as a client: ``starting`` until the driver reports it started,
``handshaking`` while the router greets it (``initialize``), ``ready`` once it answered;
requests for it wait in its queue until then (at most :data:`MAX_QUEUED_PER_BACKEND`). A
backend that fails to start, exits, breaks its output (``container_output_invalid``), refuses
the handshake or stops reading is forgotten and, when it still runs, stopped at once
(:class:`~.events.StopBackend`, logged ``backend_failed``); an idle one is stopped gracefully.
The next call starts a fresh one (transparent respawn), and the session's other services are
not affected. Events of a backend the router no longer counts on are ignored.

Lifecycles (:class:`Lifecycle`, the suite's ``container_strategy``). By default a service has
one backend per session, its *current* one (:attr:`FabricRouter.backends`). A
``fresh_per_call`` service has none: each call (``tools/call``, ``resources/read``,
``prompts/get``) starts a backend of its own, bound to it, greeted like any other, and removed
(``call_done``) once its call ended and its requests to the client were answered — at most
:data:`MAX_PER_CALL_CONTAINERS` at once per service, one more call refused
(``too_many_per_call_containers``); its list_changed is ignored (the next call's container is
fresh anyway; the catalog is the one learned at start-up). A ``smart_refresh`` service's
current backend that reached ``max_calls`` calls or ``max_age`` seconds is *retired*: the next
call starts a fresh one, and it is removed (``refresh_calls``, ``refresh_age``) once the calls
it has end, never under one; one between calls is retired when it reaches its age (a deadline).
With a ``memory_threshold`` it is measured between calls (:class:`~.events.MeasureBackend`,
once after each call; calls for it wait for the figure) and retired when over
(``refresh_memory``), the calls that waited going to a fresh one. Every backend is in
:attr:`FabricRouter.all_backends`, by key; ids, questions to the client and writes are kept per
backend key.

Ids. Every request the machine sends — to a backend for the client, to the client for a backend,
its own handshakes — gets an id of its own (one counter), remembered with where the answer
goes; an answer comes back under the id its asker used. So the client's ids and each backend's
ids never meet. Cancellation (``notifications/cancelled``) is mapped the same way; progress
notifications pass as they are (the client's ``progressToken`` travels with the request).

Requests from a backend: ``roots/list`` is answered here from the session's mounts (``file://``
URIs of their targets); ``ping`` here too; sampling and elicitation go to the client when it
declared the capability, else are refused (-32601). A backend request under an id that backend
still waits on is refused (-32600 ``duplicate_request_id``). Logging and list-changed
notifications go to the client; a list_changed makes the router ask the backend for its list
again, kept for the session's next catalog refresh (:mod:`.fabric_refresh`, one at a time, at
most one more list in the works per backend however often it repeats).

Bounds. Every line sent to a backend (:class:`~.events.ToBackend`, ending in its newline) is
counted until the driver reports it written (:class:`~.events.StdinWritten`): the client is not
read while a backend has more than ``buffer_to_server_bytes`` waiting (:attr:`accepting`: a
slow service stalls only its session), and a backend that leaves more than
``own_backlog_bytes`` of the machine's own messages unread (answers to its ``ping`` and
``roots/list``, refusals, refreshes, the handshake) has stopped reading its stdin, and is
treated as broken (``container_unresponsive``, as on the relay) rather than grow the
orchestrator's memory. A stopped backend's counts are forgotten with it. At
most :data:`~.answers.MAX_SERVER_REQUESTS` backend requests wait for the client at once, as on
the relay; one more is answered to its backend -32006 ``too_many_requests_to_client``. A request
the client does not answer within :data:`ASK_SECONDS` is answered to its backend -32006
``client_did_not_answer``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import msgspec

from .._errors import (
    ClientDidNotAnswer,
    ContainerStartFailure,
    FabricError,
    InvalidRequest,
    titled,
)
from .._reasons import (
    BACKEND_LIST_TOO_LARGE,
    CALL_DONE,
    CLIENT_DID_NOT_ANSWER,
    CONTAINER_OUTPUT_INVALID,
    EXITED,
    HANDSHAKE_FAILED,
    IDLE,
    INPUT_WAIT_EXPIRED,
    INPUT_WAIT_OVER,
    NOT_NEEDED,
    REFRESH_AGE,
    REFRESH_CALLS,
    REFRESH_MEMORY,
    TOO_MANY_PER_CALL_CONTAINERS,
)
from .agent_slots import AgentSlots
from .answers import (
    MAX_SERVER_REQUESTS,
    UNRESPONSIVE,
    SessionLimits,
    container_exited,
    too_many_requests_to_client,
)
from .catalog import Catalog, Redact, unredacted
from .events import (
    Action,
    BackendBroken,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendMeasured,
    BackendStarted,
    BackendStartFailed,
    CallRef,
    Compute,
    Log,
    MeasureBackend,
    StartBackend,
    StdinWritten,
    StopBackend,
    ToBackend,
    ToClient,
)
from .fabric_discovery import ServiceFacts
from .fabric_messages import (
    CACHE_PRIVATE,
    SERVER_NAME,
    Answers,
    complete,
    encoder,
    for_backend,
    notification_bytes,
)
from .fabric_refresh import MAX_LIST_BYTES, Relists, _Relist
from .input_waits import (
    CAPABILITY_OF,
    INPUT_WAIT_SECONDS,
    INTERACTIVE,
    InputWait,
    InputWaits,
    offered,
)
from .jsonrpc import duplicate_request, error_response
from .lifecycle import REUSE, Lifecycle
from .mcp import (
    CLIENT_VERSION,
    INVALID_PARAMS,
    LIST_CHANGED,
    LIST_METHOD,
    METHOD_NOT_FOUND,
    TITLES,
)
from .served import Served
from .suite_lock import Mode, SuiteLock
from .tool_calls import ArgumentsMode

BackendEvent = (
    BackendStarted | BackendStartFailed | BackendLine | BackendBroken | BackendExited | StdinWritten
)

Json = dict[str, Any]

BACKEND_PROTOCOL = CLIENT_VERSION
MAX_QUEUED_PER_BACKEND = 64
MAX_PENDING = 512
# Bytes of the endpoint's own messages a backend may leave unread on its stdin, and bytes that
# may wait for a backend's stdin before the client is no longer read (the session's bound):
# by default the relay's bound on what waits for a server (the driver passes buffer_to_server).
OWN_BACKLOG_BYTES = SessionLimits().to_server_bytes
# How long a backend's request to the client (sampling, elicitation) may wait for its answer.
ASK_SECONDS = 300.0
# Per-call containers of one service a session may have at once (fresh_per_call): one more call
# is refused (-32600 too_many_per_call_containers) rather than queued, so that a client sees at
# once that it asks more of the service than a session may.
MAX_PER_CALL_CONTAINERS = 8
# What a backend's list_changed makes the machine ask it again, and where the answer goes.
_REFRESH = {notification: (LIST_METHOD[kind], kind) for notification, kind in LIST_CHANGED.items()}


@dataclass(frozen=True)
class _Forwarded:
    """A request sent to a backend: whose it is and how to answer it."""

    key: BackendKey  # the backend it went to
    client_id: object  # the client's id (None: our own handshake)
    method: str
    # What a 2026-07-28 client said, with this request, that it may be asked (see input_waits).
    offers: tuple[str, ...] = ()
    target: object = None  # its tool or prompt name, or URI

    @property
    def service(self) -> str:
        return self.key.service


@dataclass(frozen=True)
class _Asked:
    """A backend's request passed on to the client."""

    key: BackendKey  # the backend that asked
    backend_id: object
    deadline: float

    @property
    def service(self) -> str:
        return self.key.service


class _Waiting(NamedTuple):
    """A request waiting for its backend's handshake (or memory figure): as it will be
    sent, encoded once, so that what waits is counted in bytes (see accepting)."""

    request: Json
    line: bytes


@dataclass
class _Backend:
    key: BackendKey  # the container the router counts on (events of any other are ignored)
    state: Literal["starting", "handshaking", "ready"]
    queue: list[_Waiting] = field(default_factory=list)  # requests waiting for the handshake
    last_active: float = 0.0
    # Lines sent (ToBackend) not yet reported written (StdinWritten), oldest first: their
    # sizes and whether each is the machine's own; all their bytes, and the own ones'.
    writes: collections.deque[tuple[int, bool]] = field(default_factory=collections.deque)
    queued: int = 0
    unread: int = 0
    # Its lifecycle: "current" (the service's shared one, in FabricRouter.backends), "call"
    # (fresh_per_call: bound to its one call), "retiring" (smart_refresh: past its bounds,
    # removed once the calls it has end).
    role: Literal["current", "call", "retiring"] = "current"
    calls: int = 0  # the calls sent (or queued) to it
    started_at: float | None = None  # when it started (its age; None: still starting)
    retired: str = REFRESH_CALLS  # retiring: the bound it reached (its stop reason)
    # smart_refresh's memory_threshold: its memory is asked for (calls for it wait in its
    # queue for the figure), and its calls when it last was.
    measuring: bool = False
    measured_calls: int = 0


# Stops that end a backend's work rather than a failure of it (not logged backend_failed).
_QUIET_STOPS = frozenset(
    {IDLE, CALL_DONE, REFRESH_CALLS, REFRESH_AGE, REFRESH_MEMORY, NOT_NEEDED, INPUT_WAIT_EXPIRED}
)


def _target(method: str, params: Json) -> object:
    """What a call names: its tool or prompt, or the URI it reads."""
    return params.get("uri" if method == "resources/read" else "name")


def _call_ref(client_id: object, method: str, params: Json) -> CallRef:
    """The call a per-call container serves, as its audit record names it (bounded)."""
    return CallRef.of(client_id, method, _target(method, params))


class FabricRouter(Answers):
    """A session's backends: their lifecycle, the ids both ways, what waits for them (see the
    module's docs). :class:`~.fabric_server.FabricServer` is the session's MCP server on top."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        mount_targets: Iterable[str],
        version: str,
        now: float,
        audit_arguments: ArgumentsMode,
        own_backlog_bytes: int,
        buffer_to_server_bytes: int,
        facts: Mapping[str, ServiceFacts],
        count_tokens: Callable[[Json], int],
        idle_timeouts: Mapping[str, float],
        lifecycles: Mapping[str, Lifecycle],
        agents: Iterable[str] = (),
        agent_slots: AgentSlots | None = None,
        redact: Redact = unredacted,
    ) -> None:
        super().__init__(now=now, audit_arguments=audit_arguments)
        self.catalog = catalog
        # What a refresh makes the session's catalog and index with: fresh lists without the
        # suite's secret values (see .catalog).
        self.facts = dict(facts)
        self.count_tokens = count_tokens
        self.redact = redact
        self.mount_targets = tuple(mount_targets)
        self.version = version
        self.own_backlog_bytes = own_backlog_bytes
        self.buffer_to_server_bytes = buffer_to_server_bytes
        self.idle_timeouts = dict(idle_timeouts)
        self.lifecycles = dict(lifecycles)
        # The llm_agent services, whose calls are agent calls, and the orchestrator's shared
        # count of them (None: no limit, as in most tests).
        self.agents = frozenset(agents)
        self.agent_slots = agent_slots
        self.session_id = ""  # (FabricServer's: what the shared count holds this session by)
        self.client_capabilities: Json = {}
        # Every backend the router counts on, and each service's current (shared) one among
        # them; a fresh_per_call backend, or a retiring smart_refresh one, is only in the first.
        self.all_backends: dict[BackendKey, _Backend] = {}
        self.backends: dict[str, _Backend] = {}
        self._seq = 0  # the last backend's sequence (it names its container)
        self._had: set[str] = set()  # services that had a container (the next is a respawn)
        self._forwarded: dict[int, _Forwarded] = {}
        self._asked: dict[int, _Asked] = {}
        self._backend_bytes = 0  # the size of the backend message being handled
        self.relists = Relists()  # refreshes after backends' list_changed
        # The suite lock a backend's fresh tools are checked against (set by FabricServer).
        self.lock: SuiteLock | None = None
        self.lock_mode: Mode = "off"
        self.waits = InputWaits()  # calls waiting for a 2026-07-28 client's retry
        # The session is ending (see answer_all): what everything coming meanwhile is told.
        self._ending: FabricError | None = None
        # Which container served which call (get_status, /api/sessions), bounded.
        self.served = Served()

    def lifecycle(self, service: str) -> Lifecycle:
        return self.lifecycles.get(service, REUSE)

    @property
    def agent_calls(self) -> int:
        """The session's agent calls in flight: the client's calls of llm_agent services sent
        or waiting to be sent, not answered yet (a cancelled one, one whose container ended,
        one answered with the session's end are gone from these)."""
        return sum(
            1
            for forwarded in self._forwarded.values()
            if forwarded.client_id is not None and forwarded.service in self.agents
        )

    # --- routing to backends --------------------------------------------------------------------

    def _forward(self, service: str, client_id: object, method: str, params: Json) -> list[Action]:
        """A call of the client's (tools/call, resources/read, prompts/get) for ``service``:
        to its current backend, or to one of its own (fresh_per_call), started if need be."""
        if len(self._forwarded) >= MAX_PENDING:
            return [self._fail(client_id, INVALID_PARAMS, "too many requests in flight")]
        if self.agent_slots is not None and service in self.agents:
            busy = self.agent_slots.refusal(self.session_id, self.agent_calls, service)
            if busy is not None:
                fields = {"backend": service, **{k: busy.detail[k] for k in ("limit", "scope")}}
                return [Log("info", "agent_call_refused", fields), self._error(client_id, busy)]
        if self._stateless and isinstance(params.get("requestState"), str):
            return self._resume(service, client_id, method, params)
        offers = offered(params) if self._stateless else ()
        return self._route(service, client_id, method, for_backend(params), offers)

    def _route(
        self, service: str, client_id: object, method: str, params: Json, offers: tuple[str, ...]
    ) -> list[Action]:
        """A call to its service's backend (``params`` as the backend may see them; ``offers``:
        what its 2026-07-28 client may be asked)."""
        request = {"jsonrpc": "2.0", "id": None, "method": method, "params": params}
        lifecycle = self.lifecycle(service)
        if lifecycle.strategy == "fresh_per_call":
            return self._forward_fresh(service, client_id, method, request, offers)
        backend = self.backends.get(service)
        spent = self._exhausted(backend, lifecycle) if backend is not None else None
        if backend is not None and spent is not None:
            # smart_refresh: it takes no more calls; it goes once those it has end (_settle).
            self._retire(backend, spent)
            backend = None
        if backend is None:
            started = self._start_for(service, client_id, method, request, "current", offers=offers)
            return [*started, *self._settle()]
        if backend.state != "ready" or backend.measuring:
            if len(backend.queue) >= MAX_QUEUED_PER_BACKEND:
                return [self._fail(client_id, INVALID_PARAMS, f"{service} is still starting")]
            self._remember(request, backend.key, client_id, method, offers)
            backend.queue.append(_Waiting(request, encoder.encode(request)))
            backend.calls += 1
            return []
        self._remember(request, backend.key, client_id, method, offers)
        backend.calls += 1
        backend.last_active = self.now
        return self._send(backend.key, encoder.encode(request))

    def _forward_fresh(
        self, service: str, client_id: object, method: str, request: Json, offers: tuple[str, ...]
    ) -> list[Action]:
        """fresh_per_call: a container of its own for this call, within the session's bound."""
        running = sum(
            1 for b in self.all_backends.values() if b.key.service == service and b.role == "call"
        )
        if running >= MAX_PER_CALL_CONTAINERS:
            refusal = InvalidRequest(
                f"this session already has {MAX_PER_CALL_CONTAINERS} calls of {service} in "
                "flight, each in a container of its own (fresh_per_call): retry when one ends",
                reason=TOO_MANY_PER_CALL_CONTAINERS,
            )
            return [self._error(client_id, refusal)]
        actions = self._start_for(
            service, client_id, method, request, "call", offers=offers, params=request["params"]
        )
        # The log names the call its container serves (container_started names the sequence).
        call = {"backend": service, "sequence": self._seq, "method": method, "call": client_id}
        return [Log("info", "per_call_container", call), *actions]

    def _start_for(
        self,
        service: str,
        client_id: object,
        method: str,
        request: Json,
        role: Literal["current", "call"],
        *,
        offers: tuple[str, ...] = (),
        params: Json | None = None,
    ) -> list[Action]:
        self._seq += 1
        key = BackendKey(service, self._seq)
        backend = _Backend(key, "starting", [], self.now, role=role, calls=1)
        self.all_backends[key] = backend
        self.served.asked(key, self.lifecycle(service).strategy, self.now)
        if role == "current":
            self.backends[service] = backend
        self._remember(request, key, client_id, method, offers)
        backend.queue.append(_Waiting(request, encoder.encode(request)))
        if role == "call":
            # A pooled container the pool greeted will do (no handshake at the call, see
            # _backend_started); its audit record names the call.
            call = _call_ref(client_id, method, params or {})
            return [StartBackend(key, greeted=True, call=call)]
        return [StartBackend(key, respawn=service in self._had)]

    def _exhausted(self, backend: _Backend, lifecycle: Lifecycle) -> str | None:
        """Which bound a smart_refresh backend has reached (None while it may take calls)."""
        return lifecycle.bound_reached(backend.calls, backend.started_at, self.now)

    def _remember(
        self,
        request: Json,
        key: BackendKey,
        client_id: object,
        method: str,
        offers: tuple[str, ...] = (),
    ) -> None:
        request["id"] = self._new_id()
        params = request.get("params")
        target = _target(method, params) if isinstance(params, dict) else None
        self._bind(request["id"], _Forwarded(key, client_id, method, offers, target))
        self.served.call(key, _call_ref(client_id, method, request.get("params") or {}))

    def _bind(self, our_id: int, forwarded: _Forwarded) -> None:
        """The backend's answer to ``our_id`` goes to the client's request ``forwarded`` names
        (a call sent now, or one resumed by the client's retry: see _resume)."""
        self._forwarded[our_id] = forwarded
        if isinstance(forwarded.client_id, str | int):
            # (a tools/call's record names its container)
            self.calls.serve(forwarded.client_id, forwarded.key.seq)

    def _cancel_forwarded(self, client_id: object, params: Json) -> list[Action]:
        """The client cancelled its request ``client_id``: withdrawn from its backend (a
        per-call backend is removed with it: see _settle)."""
        for our_id, forwarded in self._forwarded.items():
            if forwarded.client_id == client_id and forwarded.client_id is not None:
                backend = self.all_backends.get(forwarded.key)
                if backend is not None and any(w.request["id"] == our_id for w in backend.queue):
                    # Not sent yet: take it out of the queue; nobody will answer it.
                    backend.queue = [w for w in backend.queue if w.request["id"] != our_id]
                    del self._forwarded[our_id]
                    return []
                # The backend should not answer a cancelled request: nothing waits for one.
                del self._forwarded[our_id]
                # A per-call backend is removed with its call (_settle); it is told first, so
                # that it may stop its work (an agent its CLI) before its stdin closes.
                note = {**params, "requestId": our_id}
                return self._send(
                    forwarded.key, notification_bytes("notifications/cancelled", note)
                )
        return []

    def _settle(self) -> list[Action]:
        """Remove the backends whose work is done: a per-call one whose call ended (and whose
        requests to the client were answered), a retiring one whose calls ended. One still
        starting waits for its start (see _backend_started): a stop before would find nothing."""
        if self._ending is not None:
            return []
        actions: list[Action] = []
        for key, backend in list(self.all_backends.items()):
            if backend.role == "current" or backend.state != "ready" or self._busy(key):
                continue
            del self.all_backends[key]
            actions += self._stop(key, CALL_DONE if backend.role == "call" else backend.retired)
        return actions

    def _retire(self, backend: _Backend, bound: str) -> None:
        """smart_refresh: the service's current backend takes no more calls (the next starts a
        fresh one); it is removed, for ``bound``, once the calls it has end (_settle)."""
        backend.role = "retiring"
        backend.retired = bound
        del self.backends[backend.key.service]
        self.relists.forget(backend.key.service)

    def _settle_all(self) -> list[Action]:
        """After every event: a smart_refresh backend past its bounds with no call in flight is
        retired now rather than at the next call, what is done is removed (_settle), and one
        due for a memory reading is measured."""
        for service, backend in list(self.backends.items()):
            lifecycle = self.lifecycle(service)
            if lifecycle.strategy != "smart_refresh" or backend.state != "ready":
                continue
            spent = self._exhausted(backend, lifecycle)
            if spent is not None and not self._busy(backend.key):
                self._retire(backend, spent)
        return self._settle() + self._measure_between_calls()

    # --- smart_refresh's memory_threshold ---------------------------------------------------------

    def _measure_between_calls(self) -> list[Action]:
        """A smart_refresh backend with a ``memory_threshold`` is measured between calls (ready,
        nothing in flight), once after each call that could have grown it (the relay's rule);
        calls for it meanwhile wait in its queue for the figure (see _forward), so that a
        container over the threshold serves none."""
        if self._ending is not None:
            return []
        actions: list[Action] = []
        for service, backend in self.backends.items():
            lifecycle = self.lifecycle(service)
            if (
                lifecycle.strategy != "smart_refresh"
                or lifecycle.memory_threshold is None
                or backend.state != "ready"
                or backend.measuring
                or backend.calls <= backend.measured_calls
                or self._busy(backend.key)
            ):
                continue
            backend.measuring = True
            backend.measured_calls = backend.calls
            actions.append(MeasureBackend(backend.key))
        return actions

    def _backend_measured(self, event: BackendMeasured) -> list[Action]:
        """A backend's memory figure: over the threshold, it takes no more calls (removed once
        what it has ends, ``refresh_memory``) and the calls that waited for the figure go to a
        fresh one; under it, or unknown (logged: nothing is decided on it), they go to it."""
        key = event.key
        backend = self.all_backends.get(key)
        if backend is None or not backend.measuring or self._ending is not None:
            return []  # stopped (idle, aged, failed) while measured, or the session ends
        backend.measuring = False
        memory, threshold = event.memory_bytes, self.lifecycle(key.service).memory_threshold
        fields = {"backend": key.service, "sequence": key.seq}
        if memory is None:
            unknown = Log("info", "container_memory_unknown", fields)
            return [unknown, *self._send_queue(key, backend)]
        if threshold is None or memory <= threshold:
            return self._send_queue(key, backend)
        waiting, backend.queue = backend.queue, []
        if backend.role == "current":
            self._retire(backend, REFRESH_MEMORY)
        over = {**fields, "reason": REFRESH_MEMORY, "memory": memory, "threshold": threshold}
        refreshed = Log("info", "container_refreshed", over)
        return self._with_done([refreshed, *self._hand_over(waiting)])

    def _hand_over(self, waiting: list[_Waiting]) -> list[Action]:
        """Calls that waited for a retired backend: forwarded again, as if they came now (to
        the service's current backend, a fresh one started for the first)."""
        actions: list[Action] = []
        for request, _ in waiting:
            forwarded = self._forwarded.pop(request["id"], None)
            if forwarded is None:
                continue
            client_id, method = forwarded.client_id, forwarded.method
            actions += self._route(
                forwarded.service, client_id, method, request["params"], forwarded.offers
            )
        return actions

    # --- events from backends -------------------------------------------------------------------

    def _backend_event(self, event: BackendEvent) -> list[Action]:
        """An event of a backend: ignored unless it is of one the router counts on."""
        key = event.key
        service = key.service
        backend = self.all_backends.get(key)
        if backend is None:
            return []  # a backend stopped (or failed) since: nothing is owed to it
        actions: list[Action] = []
        match event:
            case StdinWritten(nbytes=nbytes):
                self._written(backend, nbytes)
            case BackendStarted(greeting=greeting, container=container):
                self.served.started(key, container, self.now)
                self._had.add(service)
                actions = self._backend_started(key, greeted=greeting is not None)
            case BackendLine(line=line):
                actions = self._backend_line(key, line)
            case BackendStartFailed(error=error):
                fields = {"backend": service, "reason": error.reason}
                failed = self._failed(key, error)
                actions = [Log("warning", "container_start_failed", fields), *failed]
            case BackendBroken(detail=detail):
                broken = ContainerStartFailure(
                    f"the {service} server wrote a line the orchestrator cannot relay: {detail}",
                    reason=CONTAINER_OUTPUT_INVALID,
                )
                actions = self._output_ended(backend, broken)
            case BackendExited(exit_code=code, oom_killed=oom, stderr=stderr):
                exited = container_exited(service, code, oom, list(stderr), service=service)
                actions = self._output_ended(backend, exited)
        return actions

    def _forget(self, key: BackendKey) -> None:
        self.all_backends.pop(key, None)
        current = self.backends.get(key.service)
        if current is not None and current.key == key:
            del self.backends[key.service]

    def _output_ended(self, backend: _Backend, error: FabricError) -> list[Action]:
        """A backend's output ended (it exited, or broke the framing): removed at once, logged
        as the failure it is, and what it owed answered with ``error``."""
        stop = self._stop(backend.key, EXITED, logged=error.reason)
        self._forget(backend.key)  # (also while the session ends)
        return [*stop, *self._failed(backend.key, error)]

    def _written(self, backend: _Backend, nbytes: int) -> None:
        """``nbytes`` of what was sent to ``backend`` (whole lines, oldest first) are written."""
        while nbytes > 0 and backend.writes:
            size, own = backend.writes.popleft()
            nbytes -= size
            backend.queued -= size
            if own:
                backend.unread -= size

    def _stop(self, key: BackendKey, reason: str, logged: str | None = None) -> list[Action]:
        """Stop a backend the router forgot, logged as failed (``backend_failed``, with
        ``logged`` or ``reason``) unless its work is done (idle, its call ended, refreshed).
        Gracefully (its stdin closed, a moment to exit) unless it no longer reads its stdin or
        has exited: those are removed at once."""
        self.served.ended(key, logged or reason, self.now)
        stop = StopBackend(key, reason, graceful=reason not in (UNRESPONSIVE, EXITED))
        if reason in _QUIET_STOPS:
            return [stop]
        return [
            Log("warning", "backend_failed", {"backend": key.service, "reason": logged or reason}),
            stop,
        ]

    def _backend_started(self, key: BackendKey, *, greeted: bool = False) -> list[Action]:
        """The service's container runs: greet it as a client would, unless the warm pool did
        (``greeted``: a per-call one, its handshake done while it waited): then it is ready."""
        backend = self.all_backends.get(key)
        if backend is None or self._ending is not None:
            return []
        backend.started_at = self.now
        if backend.role != "current" and not backend.queue:
            # Its call was cancelled while it started (or, retiring, its calls): not needed.
            del self.all_backends[key]
            return self._stop(key, NOT_NEEDED)
        backend.last_active = self.now
        if greeted:
            backend.state = "ready"
            note = {"backend": key.service, "sequence": key.seq}
            return [Log("info", "backend_greeted_by_pool", note), *self._send_queue(key, backend)]
        backend.state = "handshaking"
        capabilities: Json = {"roots": {"listChanged": False}}
        for capability in ("sampling", "elicitation"):
            if self._stateless:
                # A 2026-07-28 client says per call what it may be asked (see input_waits).
                capabilities[capability] = {}
            elif capability in self.client_capabilities:
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
        self._forwarded[handshake_id] = _Forwarded(key, None, "initialize")
        return self._own(key, encoder.encode(handshake))

    def _backend_line(self, key: BackendKey, data: bytes) -> list[Action]:
        """One line from a backend's container."""
        if self._ending is not None:
            return []  # nothing is owed any more, nor asked of the client
        self._backend_bytes = len(data)
        return self._with_done(self._backend_message(key, data))

    def _backend_message(self, key: BackendKey, data: bytes) -> list[Action]:
        try:
            message = msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            message = None  # not a message: a server's stray output
        if not isinstance(message, dict):
            return []
        self._touch(key)
        if "method" in message:
            if "id" in message:
                return self._backend_request(key, message)
            return self._backend_notification(key, message)
        return self._backend_answer(key, message)

    def _backend_answer(self, key: BackendKey, message: Json) -> list[Action]:
        our_id = message.get("id")
        if not isinstance(our_id, int):
            return []
        forwarded = self._forwarded.get(our_id)
        if forwarded is None:
            wait = self.waits.of_call(key, our_id)
            if wait is not None:
                wait.answer = message  # the client's retry takes it
            return []
        if forwarded.key != key:
            return []
        del self._forwarded[our_id]
        if forwarded.client_id is None:
            if forwarded.method == "initialize":
                return self._handshake_done(key, message)
            return self._refreshed(key, forwarded.method, message)
        reply = {k: v for k, v in message.items() if k != "id"}
        reply["id"] = forwarded.client_id
        result = reply.get("result")
        if self._stateless and isinstance(result, dict):
            result = complete(result)
            reply["result"] = (
                {**CACHE_PRIVATE, **result} if forwarded.method == "resources/read" else result
            )
        data = encoder.encode(reply)
        self._ended(forwarded.client_id, data)
        return [ToClient(data)]

    def _handshake_done(self, key: BackendKey, message: Json) -> list[Action]:
        backend = self.all_backends.get(key)
        service = key.service
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
            stop = self._stop(key, refused.reason)
            return [*stop, *self._backend_failed(key, refused)]
        backend.state = "ready"
        actions = self._own(key, notification_bytes("notifications/initialized", None))
        if key not in self.all_backends:
            return actions  # it was found broken
        return actions + self._send_queue(key, backend)

    def _send_queue(self, key: BackendKey, backend: _Backend) -> list[Action]:
        """A backend just ready: the requests that waited for it, in order."""
        actions: list[Action] = []
        for waiting in backend.queue:
            actions += self._send(key, waiting.line)
        backend.queue = []
        return actions

    def _backend_request(self, key: BackendKey, message: Json) -> list[Action]:
        method = str(message.get("method"))
        answer: Json = {"jsonrpc": "2.0", "id": message.get("id")}
        if any(a.key == key and a.backend_id == answer["id"] for a in self._asked.values()):
            # The client's answer could not be told from the first's: refused, as the relay does.
            answer["error"] = duplicate_request(answer["id"]).to_jsonrpc_error()
            return self._own(key, encoder.encode(answer))
        if method == "roots/list":
            roots = [{"uri": f"file://{target}", "name": target} for target in self.mount_targets]
            answer["result"] = {"roots": roots}
        elif method == "ping":
            answer["result"] = {}
        elif method in CAPABILITY_OF and self._stateless:
            return self._ask_by_result(key, message)
        elif CAPABILITY_OF.get(method) in self.client_capabilities:
            if len(self._asked) >= MAX_SERVER_REQUESTS:
                # As on the relay: the client is not asked more than this at once; the
                # backend is told at once (and never waits for the expiry of each).
                refusal = too_many_requests_to_client(MAX_SERVER_REQUESTS)
                return self._own(key, error_response(message.get("id"), refusal))
            our_id = self._new_id()
            self._asked[our_id] = _Asked(key, message.get("id"), self.now + ASK_SECONDS)
            return [ToClient(encoder.encode({**message, "id": our_id}))]
        else:
            return self._refuse_question(key, answer["id"], f"the client does not offer {method}")
        return self._own(key, encoder.encode(answer))

    def _refuse_question(self, key: BackendKey, backend_id: object, why: str) -> list[Action]:
        error = {"code": METHOD_NOT_FOUND, "message": titled(TITLES[METHOD_NOT_FOUND], why)}
        return self._own(key, encoder.encode({"jsonrpc": "2.0", "id": backend_id, "error": error}))

    # --- questions for a 2026-07-28 client (see .input_waits) ---------------------------------

    def _ask_by_result(self, key: BackendKey, message: Json) -> list[Action]:
        """A backend's question while the client is a 2026-07-28 one: the call it belongs to is
        answered ``input_required`` and waits for the client's retry, in its container."""
        method = str(message.get("method"))
        backend_id = message.get("id")
        calls = [
            (our_id, call)
            for our_id, call in self._forwarded.items()
            if call.key == key and call.client_id is not None and call.method in INTERACTIVE
        ]
        waits = self.waits.on(key)
        if len(calls) + len(waits) != 1:
            # On stdio a question does not say which call it is for: a server that runs
            # several at once cannot be asked through results (one per container can).
            why = (
                f"a 2026-07-28 client is asked within a call, and {key.service} has "
                f"{len(calls) + len(waits)} calls in flight: the question cannot be tied to one"
            )
            return self._refuse_question(key, backend_id, why)
        offers = waits[0].offers if waits else calls[0][1].offers
        if CAPABILITY_OF[method] not in offers:
            return self._refuse_question(key, backend_id, f"the client does not offer {method}")
        if len(self._asked) + self.waits.questions() >= MAX_SERVER_REQUESTS:
            refusal = too_many_requests_to_client(MAX_SERVER_REQUESTS)
            return self._own(key, error_response(backend_id, refusal))
        if waits:
            # The client has its round's result already: asked with the next one, at its retry.
            waits[0].ask(backend_id, method, message.get("params"))
            return []
        our_id, call = calls[0]
        del self._forwarded[our_id]
        wait = InputWait(
            key, our_id, call.method, call.target, self.now + INPUT_WAIT_SECONDS, call.offers
        )
        wait.ask(backend_id, method, message.get("params"))
        return self._park(wait, call.client_id)

    def _park(self, wait: InputWait, client_id: object) -> list[Action]:
        """The client's call ``client_id`` is answered ``input_required``: it waits."""
        self.waits.open(wait, self._new_id())
        note = {"backend": wait.key.service, "sequence": wait.key.seq, "round": wait.rounds}
        body = {"jsonrpc": "2.0", "id": client_id, "result": wait.result()}
        return [Log("info", "input_required", note), self._answer(client_id, body)]

    def _resume(self, service: str, client_id: object, method: str, params: Json) -> list[Action]:
        """The client retries a call that waits (its ``requestState``): its answers go to the
        backend's questions, under the backend's ids, and the call goes on in its container;
        its answer, or the next question, is this retry's answer."""
        state = params["requestState"]
        wait = self.waits.take(state)
        if wait is None:
            over = InvalidRequest(
                f"this requestState resumes no call: {self.waits.why(state)}; call again "
                "without it",
                reason=INPUT_WAIT_OVER,
            )
            return [self._error(client_id, over)]
        target = _target(method, params)
        if (wait.key.service, wait.method, wait.target) != (service, method, target):
            self.waits.put_back(wait)
            other = f"this requestState resumes a {wait.method} of {wait.target!r}, not {target!r}"
            return [self._fail(client_id, INVALID_PARAMS, other)]
        responses = params.get("inputResponses")
        responses = responses if isinstance(responses, dict) else {}
        actions: list[Action] = []
        for question, (backend_id, _asked) in list(wait.asked.items()):
            response = responses.get(question)
            if isinstance(response, dict):
                del wait.asked[question]
                reply = {"jsonrpc": "2.0", "id": backend_id, "result": response}
                actions += self._send(wait.key, encoder.encode(reply))
        self._bind(wait.call_id, _Forwarded(wait.key, client_id, method, wait.offers, wait.target))
        if wait.answer is not None:
            return actions + self._backend_answer(wait.key, {**wait.answer, "id": wait.call_id})
        if wait.asked:  # questions left unanswered, or asked since: another round
            del self._forwarded[wait.call_id]
            wait.deadline = self.now + INPUT_WAIT_SECONDS
            return actions + self._park(wait, client_id)
        return actions

    def _expire_waits(self, now: float) -> list[Action]:
        """Calls the client did not resume in time: given up. A per-call container goes (it
        served nothing else); another is told its questions go unanswered and the call is
        cancelled, and serves on."""
        actions: list[Action] = []
        for wait in self.waits.expired(now):
            backend = self.all_backends.get(wait.key)
            if backend is None:
                continue
            note = {"backend": wait.key.service, "sequence": wait.key.seq}
            actions.append(Log("info", "input_wait_expired", note))
            if backend.role == "call":
                del self.all_backends[wait.key]
                actions += self._stop(wait.key, INPUT_WAIT_EXPIRED)
                continue
            error = ClientDidNotAnswer(
                "the client did not retry its call with the answer in time",
                reason=CLIENT_DID_NOT_ANSWER,
            )
            for backend_id, _asked in wait.asked.values():
                actions += self._own(wait.key, error_response(backend_id, error))
            cancel = {"requestId": wait.call_id, "reason": "the client did not retry in time"}
            actions += self._own(wait.key, notification_bytes("notifications/cancelled", cancel))
        return actions

    def _backend_notification(self, key: BackendKey, message: Json) -> list[Action]:
        method = message.get("method")
        if method in ("notifications/progress", "notifications/message"):
            return [ToClient(encoder.encode(message))]
        if method == "notifications/cancelled":
            params = message.get("params")
            if isinstance(params, dict):
                self.waits.withdrawn(key, params.get("requestId"))
                asked = [
                    i
                    for i, a in self._asked.items()
                    if a.key == key and a.backend_id == params.get("requestId")
                ]
                for our_id in asked:
                    del self._asked[our_id]
                    return [
                        ToClient(
                            notification_bytes(
                                "notifications/cancelled", {**params, "requestId": our_id}
                            )
                        )
                    ]
            return []
        if isinstance(method, str) and method in _REFRESH:
            backend = self.all_backends.get(key)
            if backend is None or backend.role != "current":
                # A per-call (or retiring) container's list is moot: the next call gets a
                # fresh container, whose offer is the one learned at start-up.
                return []
            # Ask the service what it offers now (see _refreshed); unless its list is asked for
            # or in the works already: then once more after that one, however often it repeats.
            _list_method, kind = _REFRESH[method]
            return self._ask_list(key, kind) if self.relists.changed(key.service, kind) else []
        return []

    def _ask_list(self, key: BackendKey, kind: str) -> list[Action]:
        list_method = LIST_METHOD[kind]
        our_id = self._new_id()
        self._forwarded[our_id] = _Forwarded(key, None, list_method)
        request = {"jsonrpc": "2.0", "id": our_id, "method": list_method}
        return self._own(key, encoder.encode(request))

    def _refreshed(self, key: BackendKey, method: str, message: Json) -> list[Action]:
        """A service's fresh list (after its list_changed): kept for the next refresh, which
        makes the catalog and index from it off the event loop (a Compute; its Computed: see
        ``FabricServer._computed``). A list over :data:`MAX_LIST_BYTES` is refused: the backend
        is treated as broken."""
        service = key.service
        kind = dict(_REFRESH.values()).get(method)
        if kind is None:
            return []
        result = message.get("result")
        entries = result.get(kind) if isinstance(result, dict) else None
        relist = self.relists.asked.get((service, kind))
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
            stop = self._stop(key, BACKEND_LIST_TOO_LARGE)
            return [*self._backend_failed(key, error), *stop]
        self.relists.keep(service, kind, relist, entries)
        return self._next_refresh()

    def _next_refresh(self) -> list[Action]:
        refresh = self.relists.next(
            self.catalog,
            self.facts,
            self.count_tokens,
            self.lock,
            self.lock_mode,
            redact=self.redact,
        )
        if refresh is None:
            return []
        # (a refresh that fails leaves the catalog as it was: logged, not the session's end)
        return [Compute(refresh, failure_event="catalog_refresh_failed")]

    def _list_done(self, service: str, kind: str, relist: _Relist) -> list[Action]:
        again = self.relists.done(service, kind, relist)
        if not again:
            return []
        backend = self.backends.get(service)
        return [] if backend is None else self._ask_list(backend.key, kind)

    @property
    def accepting(self) -> bool:
        """Whether the client may be read: no backend has more than the session's bound
        waiting for its stdin — sent and not reported written, or waiting for its handshake
        (a slow service, or one slow to start, stalls only this session; without the second,
        a client could pile up to :data:`MAX_QUEUED_PER_BACKEND` messages of the largest size
        per starting backend)."""
        bound = self.buffer_to_server_bytes
        return all(
            b.queued + sum(len(w.line) for w in b.queue) <= bound
            for b in self.all_backends.values()
        )

    def _send(self, key: BackendKey, data: bytes, *, own: bool = False) -> list[Action]:
        """One line for the backend ``key``, counted until reported written. A
        message of the endpoint's own (``own``) is within the bound on what it leaves unread:
        past it the backend has stopped reading its stdin while asking (pings, roots,
        refreshes…): it is broken, not the orchestrator's memory (one message alone may exceed
        the bound, as a client's may)."""
        backend = self.all_backends.get(key)
        if backend is None:
            return []  # forgotten (broken, stopped): nothing is owed to it any more
        line = data + b"\n"
        size = len(line)
        if own:
            if backend.unread and backend.unread + size > self.own_backlog_bytes:
                return self._unresponsive(key, backend.unread)
            backend.unread += size
        backend.queued += size
        backend.writes.append((size, own))
        return [ToBackend(backend.key, line)]

    def _own(self, key: BackendKey, data: bytes) -> list[Action]:
        return self._send(key, data, own=True)

    def _unresponsive(self, key: BackendKey, unread: int) -> list[Action]:
        error = ContainerStartFailure(
            f"the {key.service} server stopped reading its input ({unread} bytes of the "
            "orchestrator's own messages to it unread); its container was removed, the next "
            "call starts a fresh one",
            reason=UNRESPONSIVE,
        )
        # Stopped first: the driver drops what waits for its stdin before the answers go out.
        stop = self._stop(key, UNRESPONSIVE)
        return [*stop, *self._backend_failed(key, error)]

    def _failed(self, key: BackendKey, error: FabricError) -> list[Action]:
        """A backend could not start, or ended: answer what it owed, forget it (the next call
        starts a new one). The session's other backends go on."""
        if self._ending is not None:
            self._forget(key)
            return []  # it owes nothing any more
        return self._with_done(self._backend_failed(key, error))

    def _backend_failed(self, key: BackendKey, error: FabricError) -> list[Action]:
        self.served.ended(key, error.reason, self.now)
        current = self.backends.get(key.service)
        if current is not None and current.key == key:
            self.relists.forget(key.service)
        self._forget(key)
        actions: list[Action] = []
        for our_id, forwarded in list(self._forwarded.items()):
            if forwarded.key != key:
                continue
            del self._forwarded[our_id]
            if forwarded.client_id is not None:
                actions.append(self._error(forwarded.client_id, error))
        for our_id, asked in list(self._asked.items()):
            if asked.key == key:
                del self._asked[our_id]
        self.waits.drop(key, f"its container ended ({error.reason})")
        return actions

    def _backend_deadlines(self) -> list[float]:
        """When backends' questions to the client expire, and when idle backends stop."""
        due = [asked.deadline for asked in self._asked.values()] + self.waits.deadlines()
        for service, backend in self.backends.items():
            if backend.state == "ready" and not self._busy(backend.key):
                due.append(backend.last_active + self.idle_timeouts.get(service, math.inf))
        return due + self._age_deadlines()

    def _age_deadlines(self) -> list[float]:
        """When current smart_refresh backends between calls reach their ``max_container_age``:
        retired then (see _settle_all), as the relay does, rather than at the next event."""
        due: list[float] = []
        for service, backend in self.backends.items():
            lifecycle = self.lifecycle(service)
            max_age, started_at = lifecycle.max_age, backend.started_at
            if (
                lifecycle.strategy == "smart_refresh"
                and max_age is not None
                and started_at is not None
                and backend.state == "ready"
                and not self._busy(backend.key)
            ):
                due.append(started_at + max_age)
        return due

    def _expire_asked(self, now: float) -> list[Action]:
        """Backends' questions the client left unanswered in time: answered to the backend."""
        actions: list[Action] = []
        for our_id, asked in list(self._asked.items()):
            # (still asked: a backend found broken meanwhile took its questions along)
            if asked.deadline <= now and our_id in self._asked:
                del self._asked[our_id]
                error = ClientDidNotAnswer(
                    "the client did not answer this request in time", reason=CLIENT_DID_NOT_ANSWER
                )
                actions += self._own(asked.key, error_response(asked.backend_id, error))
                note = {"requestId": our_id, "reason": "no answer in time"}
                actions.append(ToClient(notification_bytes("notifications/cancelled", note)))
        return actions + self._expire_waits(now)

    def _stop_idle(self, now: float) -> list[Action]:
        """Stop the current backends idle for their service's timeout (per-call and retiring
        ones go when their calls end: see _settle)."""
        actions: list[Action] = []
        for service, backend in list(self.backends.items()):
            idle_until = backend.last_active + self.idle_timeouts.get(service, math.inf)
            if backend.state == "ready" and not self._busy(backend.key) and idle_until <= now:
                self._forget(backend.key)
                self.relists.forget(service)
                actions += self._stop(backend.key, IDLE)
        return actions

    def _busy(self, key: BackendKey) -> bool:
        return (
            any(f.key == key for f in self._forwarded.values())
            or any(a.key == key for a in self._asked.values())
            or self.waits.holds(key)  # a call waiting for a 2026-07-28 client's retry
        )

    def _touch(self, key: BackendKey) -> None:
        backend = self.all_backends.get(key)
        if backend is not None:
            backend.last_active = self.now
