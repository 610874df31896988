"""The fabric endpoint's router for one session, without I/O: the client's calls routed to
its services' backends, and what the backends say heard and passed on.

A field of :class:`~.fabric_server.FabricServer`, which hands it the client's calls
(``tools/call``, ``prompts/get``, ``resources/read``: named as the session's catalog shows
them, resolved here, then :meth:`FabricRouter.forward`), their cancellations, the client's
answers to backends' questions, and the backends' events; it
answers the client through the session's replies ledger (:class:`~.fabric_replies.Replies`,
given when it is made) and returns what the driver is to do. Its parts, public:

- :attr:`FabricRouter.table`, the session's backends (:class:`~.fabric_backends.BackendTable`
  on a :class:`~.fabric_roster.Roster`): the backend a call goes to (the service's current one,
  or one of its own for a ``fresh_per_call`` service, started if need be; a smart_refresh
  service's retired one hands over the calls that waited for it), starts and handshakes,
  bounds, stops and failures, deadlines (the server ticks and ends it);
- :attr:`FabricRouter.exchanges`, its requests in flight both ways
  (:class:`~.fabric_exchanges.Exchanges`): the ids it gives them, the backends' questions to
  the client, the calls that wait for a 2026-07-28 client's retry (``input_required``);
- :attr:`FabricRouter.relisting`, the session's catalog and its refreshes after a backend's
  list_changed (:class:`~.fabric_relists.Relisting`).

Logging and progress notifications of a backend go to the client as they are. Events of a
backend the router no longer counts on are ignored. A call of an ``llm_agent`` service is an
agent call: the orchestrator's count of them (``orchestrator.agents``) may refuse it.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from .._errors import ContainerStartFailure, InvalidRequest
from .._reasons import (
    CONTAINER_OUTPUT_INVALID,
    REFRESH_MEMORY,
    TOO_MANY_PER_CALL_CONTAINERS,
)
from .answers import container_exited
from .backend import Role, measured
from .catalog import Catalog, Entry
from .events import (
    Action,
    BackendBroken,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendMeasured,
    BackendStarted,
    BackendStartFailed,
    Log,
    StartBackend,
    StdinWritten,
    ToClient,
)
from .fabric_backends import BackendTable
from .fabric_exchanges import Exchanges, OwnReply, call_ref
from .fabric_messages import encoder, for_backend, notification_bytes
from .fabric_refresh import Relists
from .fabric_relists import REFRESH, Relisting
from .fabric_replies import Replies
from .fabric_roster import MAX_PER_CALL_CONTAINERS, MAX_QUEUED_PER_BACKEND, Waiting
from .fabric_setup import FabricSetup, backend_limits
from .input_waits import offered
from .mcp import INVALID_PARAMS
from .suite_lock import withheld_error
from .workspace_answers import BASE_NEEDS_ISOLATED, names_base

BackendEvent = (
    BackendStarted | BackendStartFailed | BackendLine | BackendBroken | BackendExited | StdinWritten
)

Json = dict[str, Any]

MAX_PENDING = 512


class FabricRouter:
    """A session's backends, routed to and heard from (see the module's docs)."""

    def __init__(self, setup: FabricSetup, replies: Replies) -> None:
        settings = setup.settings
        self.replies = replies
        self.exchanges = Exchanges(replies)
        relists = Relists()  # (a backend's end forgets its lists: the table's too)
        self.table = BackendTable(
            replies,
            self.exchanges,
            relists,
            version=setup.version,
            lifecycles=settings.lifecycles,
            idle_timeouts=settings.idle_timeouts,
            limits=setup.limits or backend_limits(settings),
        )
        self.relisting = Relisting(
            setup.catalog,
            relists,
            self.table,
            self.exchanges,
            facts=dict(settings.facts),
            count_tokens=setup.count_tokens,
            redact=setup.redact,
            lock=settings.lock,
            lock_mode=settings.lock_mode,
        )
        self.session_id = setup.session_id  # (what the shared count of agent calls holds it by)
        self.roots = [{"uri": f"file://{target}", "name": target} for target in setup.mount_targets]
        # The llm_agent services, whose calls are agent calls, and the orchestrator's shared
        # count of them (None: no limit, as in most tests).
        self.agents = frozenset(settings.agents)
        # (those that work in the client's project itself: a task's base cannot be honoured)
        self.shared_agents = self.agents - settings.isolated
        self.agent_slots = setup.agent_slots
        self._backend_bytes = 0  # the size of the backend message being handled

    @property
    def catalog(self) -> Catalog:
        """The session's (see :class:`~.fabric_relists.Relisting`: a refresh replaces it)."""
        return self.relisting.catalog

    def new_id(self) -> int:
        """An id of the session's own, for a request of the server's to the client."""
        return self.exchanges.new_id()

    def waits_on(self, client_id: object) -> bool:
        """Whether a call of the client's under this id is at a backend."""
        return self.exchanges.waits_on(client_id)

    def hold_agent_slots(self, *, gone: bool) -> None:
        """The session's agent calls in flight, counted from the state after every event (every
        way a call ends frees its slot): the client's calls of llm_agent services sent or
        waiting to be sent, not answered yet."""
        if self.agent_slots is not None and self.agents:  # (no agent service: never any)
            calls = 0 if gone else self.exchanges.agent_calls(self.agents)
            self.agent_slots.hold(self.session_id, calls)

    # --- the client's calls ---------------------------------------------------------------------

    def call_tool(self, client_id: object, name: object, params: Json) -> list[Action]:
        """A tools/call of a service's tool, by its shown name (``service__tool``)."""
        catalog, calls = self.catalog, self.replies.calls
        entry: Entry | None = catalog.tool(name) if isinstance(name, str) else None
        if entry is not None:
            route = (entry.service, entry.name)
        else:
            withheld = catalog.withheld_tool(name) if isinstance(name, str) else None
            if withheld is not None:
                # A tool the suite lock withholds (orchestrator.lock: enforce).
                service, why = withheld
                if isinstance(client_id, str | int):
                    calls.route(client_id, service, str(why.get("tool")))
                return [self.replies.error(client_id, withheld_error(service, why))]
            # A service whose offer could not be learned is still called by name: its start
            # answers why it cannot run (-32002 image_not_found…), not "unknown tool".
            addressed = catalog.addressed(name) if isinstance(name, str) else None
            if addressed is None:
                return [self.replies.fail(client_id, INVALID_PARAMS, f"unknown tool {name!r}")]
            route = addressed
        service, tool = route
        if isinstance(client_id, str | int):
            calls.route(client_id, service, tool)
        if service in self.shared_agents and names_base(params):
            return [self.replies.error(client_id, BASE_NEEDS_ISOLATED)]
        return self.forward(service, client_id, "tools/call", {**params, "name": tool})

    def get_prompt(self, client_id: object, params: Json) -> list[Action]:
        """A prompts/get, by the prompt's shown name."""
        entry = self.catalog.prompt(str(params.get("name")))
        if entry is None:
            unknown = f"unknown prompt {params.get('name')!r}"
            return [self.replies.fail(client_id, INVALID_PARAMS, unknown)]
        named = {**params, "name": entry.name}
        return self.forward(entry.service, client_id, "prompts/get", named)

    def read_resource(self, client_id: object, params: Json) -> list[Action]:
        """A resources/read, by the resource's shown URI."""
        route = self.catalog.resource(str(params.get("uri")))
        if route is None:
            unknown = f"unknown resource {params.get('uri')!r}"
            return [self.replies.fail(client_id, INVALID_PARAMS, unknown)]
        service, uri = route
        return self.forward(service, client_id, "resources/read", {**params, "uri": uri})

    def forward(self, service: str, client_id: object, method: str, params: Json) -> list[Action]:
        """A call of the client's (tools/call, resources/read, prompts/get) for ``service``:
        to its current backend, or to one of its own (fresh_per_call), started if need be."""
        if len(self.exchanges.forwarded) >= MAX_PENDING:
            return [self.replies.fail(client_id, INVALID_PARAMS, "too many requests in flight")]
        if self.agent_slots is not None and service in self.agents:
            calls = self.exchanges.agent_calls(self.agents)
            busy = self.agent_slots.refusal(self.session_id, calls, service)
            if busy is not None:
                fields = {"backend": service, **{k: busy.detail[k] for k in ("limit", "scope")}}
                refused = self.replies.error(client_id, busy)
                return [Log("info", "agent_call_refused", fields), refused]
        stateless = self.replies.stateless
        if stateless and isinstance(params.get("requestState"), str):
            return self._resume(service, client_id, method, params)
        offers = offered(params) if stateless else ()
        return self._route(service, client_id, method, for_backend(params), offers)

    def _route(
        self, service: str, client_id: object, method: str, params: Json, offers: tuple[str, ...]
    ) -> list[Action]:
        """A call to its service's backend (``params`` as the backend may see them; ``offers``:
        what its 2026-07-28 client may be asked)."""
        request = {"jsonrpc": "2.0", "id": None, "method": method, "params": params}
        table, roster = self.table, self.table.roster
        if roster.lifecycle(service).strategy == "fresh_per_call":
            return self._forward_fresh(service, client_id, method, request, offers)
        backend = roster.current.get(service)
        spent = roster.spent(backend, self.replies.now) if backend is not None else None
        if backend is not None and spent is not None:
            # smart_refresh: it takes no more calls; it goes once those it has end (settle).
            table.retire(backend, spent)
            backend = None
        if backend is None:
            started = self._start_for(service, client_id, method, request, Role.CURRENT, offers)
            return [*started, *table.settle()]
        if not backend.ready or backend.measuring:
            if len(backend.queue) >= MAX_QUEUED_PER_BACKEND:
                still = f"{service} is still starting"
                return [self.replies.fail(client_id, INVALID_PARAMS, still)]
            self._remember(request, backend.key, client_id, method, offers)
            backend.queue.append(Waiting(request, encoder.encode(request)))
            backend.calls += 1
            return []
        self._remember(request, backend.key, client_id, method, offers)
        backend.calls += 1
        backend.last_active = self.replies.now
        return table.send(backend.key, encoder.encode(request))

    def _forward_fresh(
        self, service: str, client_id: object, method: str, request: Json, offers: tuple[str, ...]
    ) -> list[Action]:
        """fresh_per_call: a container of its own for this call, within the session's bound."""
        if self.table.roster.per_call(service) >= MAX_PER_CALL_CONTAINERS:
            refusal = InvalidRequest(
                f"this session already has {MAX_PER_CALL_CONTAINERS} calls of {service} in "
                "flight, each in a container of its own (fresh_per_call): retry when one ends",
                reason=TOO_MANY_PER_CALL_CONTAINERS,
            )
            return [self.replies.error(client_id, refusal)]
        actions = self._start_for(service, client_id, method, request, Role.CALL, offers)
        # The log names the call its container serves (container_started names the sequence).
        call = {
            "backend": service,
            "sequence": self.table.roster.seq,
            "method": method,
            "call": client_id,
        }
        return [Log("info", "per_call_container", call), *actions]

    def _start_for(  # noqa: PLR0917 (the call, and what the backend is for)
        self,
        service: str,
        client_id: object,
        method: str,
        request: Json,
        role: Role,
        offers: tuple[str, ...],
    ) -> list[Action]:
        roster, now = self.table.roster, self.replies.now
        backend = roster.add(service, role, now)
        key = backend.key
        self.table.served.asked(key, roster.lifecycle(service).strategy, now)
        self._remember(request, key, client_id, method, offers)
        backend.queue.append(Waiting(request, encoder.encode(request)))
        if role is Role.CALL:
            # A pooled container the pool greeted will do (no handshake at the call, see
            # BackendTable.started); its audit record names the call.
            call = call_ref(client_id, method, request["params"], task=True)
            return [StartBackend(key, greeted=True, call=call)]
        return [StartBackend(key, respawn=service in self.table.roster.had)]

    def _remember(
        self,
        request: Json,
        key: BackendKey,
        client_id: object,
        method: str,
        offers: tuple[str, ...] = (),
    ) -> None:
        self.exchanges.remember(request, key, client_id, method, offers)
        self.table.served.call(key, call_ref(client_id, method, request.get("params") or {}))

    def cancel(self, client_id: object, params: Json) -> list[Action]:
        """The client cancelled its request ``client_id``: withdrawn from its backend (a
        per-call backend is removed with it: see settle)."""
        found = self.exchanges.cancelled(client_id)
        if found is None:
            # Its answer may be held for its workspace: it is not sent any more.
            self.exchanges.held.withdraw(lambda forwarded: forwarded.client_id == client_id)
            return []
        our_id, forwarded = found
        del self.exchanges.forwarded[our_id]
        backend = self.table.roster.all.get(forwarded.key)
        if backend is not None and any(w.request["id"] == our_id for w in backend.queue):
            # Not sent yet: take it out of the queue; nobody will answer it.
            backend.queue = [w for w in backend.queue if w.request["id"] != our_id]
            return []
        # The backend should not answer a cancelled request: nothing waits for one. A per-call
        # backend is removed with its call (settle); it is told first, so that it may stop its
        # work (an agent its CLI) before its stdin closes.
        note = notification_bytes("notifications/cancelled", {**params, "requestId": our_id})
        return self.table.send(forwarded.key, note)

    def client_answer(self, answered: object, message: Json) -> list[Action]:
        """The client answered a backend's question: to that backend, under its id."""
        reply = self.exchanges.client_answer(answered, message)
        return [] if reply is None else self.table.send(*reply)

    def _resume(self, service: str, client_id: object, method: str, params: Json) -> list[Action]:
        """The client retries a call that waits (see :meth:`.Exchanges.resume`)."""
        resumed = self.exchanges.resume(service, client_id, method, params, self.replies.now)
        if isinstance(resumed, list):
            return resumed
        actions: list[Action] = []
        for reply in resumed.replies:
            actions += self.table.send(resumed.key, reply)
        if resumed.answer is not None:
            return actions + self._backend_answer(resumed.key, resumed.answer)
        return actions + list(resumed.then)

    # --- lifecycles -----------------------------------------------------------------------------

    def backend_measured(self, event: BackendMeasured) -> list[Action]:
        """A backend's memory figure: over the threshold, it takes no more calls (removed once
        what it has ends, ``refresh_memory``) and the calls that waited for the figure go to a
        fresh one; under it, or unknown (logged: nothing is decided on it), they go to it."""
        key = event.key
        backend = self.table.roster.all.get(key)
        if backend is None or not backend.measuring or self.table.ending is not None:
            return []  # stopped (idle, aged, failed) while measured, or the session ends
        lifecycle = self.table.roster.lifecycle(key.service)
        memory, threshold = event.memory_bytes, lifecycle.memory_threshold
        fields = {"backend": key.service, "sequence": key.seq}
        if not measured(backend, lifecycle, memory):
            if memory is None:
                unknown = Log("info", "container_memory_unknown", fields)
                return [unknown, *self.table.send_queue(key, backend)]
            return self.table.send_queue(key, backend)
        waiting, backend.queue = backend.queue, []
        if backend.role is Role.CURRENT:
            self.table.retire(backend, REFRESH_MEMORY)
        over = {**fields, "reason": REFRESH_MEMORY, "memory": memory, "threshold": threshold}
        refreshed = Log("info", "container_refreshed", over)
        return self.replies.with_done([refreshed, *self._hand_over(waiting)])

    def _hand_over(self, waiting: list[Waiting]) -> list[Action]:
        """Calls that waited for a retired backend: forwarded again, as if they came now (to
        the service's current backend, a fresh one started for the first)."""
        actions: list[Action] = []
        for request, _ in waiting:
            forwarded = self.exchanges.forwarded.pop(request["id"], None)
            if forwarded is None:
                continue
            client_id, method = forwarded.client_id, forwarded.method
            actions += self._route(
                forwarded.service, client_id, method, request["params"], forwarded.offers
            )
        return actions

    # --- events from backends -------------------------------------------------------------------

    def backend_event(self, event: BackendEvent) -> list[Action]:
        """An event of a backend: ignored unless it is of one the router counts on."""
        key = event.key
        service = key.service
        backend = self.table.roster.all.get(key)
        if backend is None:
            return []  # a backend stopped (or failed) since: nothing is owed to it
        actions: list[Action] = []
        match event:
            case StdinWritten(nbytes=nbytes):
                self.table.roster.written(backend, nbytes, self.replies.now)
            case BackendStarted(greeting=greeting, container=container, workspace=workspace):
                backend.workspace = workspace
                actions = self.table.started(key, container, greeted=greeting is not None)
            case BackendLine(line=line):
                actions = self._backend_line(key, line)
            case BackendStartFailed(error=error):
                fields = {"backend": service, "reason": error.reason}
                failed = self.table.failed(key, error)
                actions = [Log("warning", "container_start_failed", fields), *failed]
            case BackendBroken(detail=detail):
                broken = ContainerStartFailure(
                    f"the {service} server wrote a line the orchestrator cannot relay: {detail}",
                    reason=CONTAINER_OUTPUT_INVALID,
                )
                actions = self.table.output_ended(backend, broken)
            case BackendExited(exit_code=code, oom_killed=oom, stderr=stderr):
                exited = container_exited(service, code, oom, list(stderr), service=service)
                actions = self.table.output_ended(backend, exited)
        return actions

    def _backend_line(self, key: BackendKey, data: bytes) -> list[Action]:
        """One line from a backend's container."""
        if self.table.ending is not None:
            return []  # nothing is owed any more, nor asked of the client
        self._backend_bytes = len(data)
        return self.replies.with_done(self._backend_message(key, data))

    def _backend_message(self, key: BackendKey, data: bytes) -> list[Action]:
        try:
            message = msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            message = None  # not a message: a server's stray output
        if not isinstance(message, dict):
            return []
        backend = self.table.roster.all.get(key)
        if backend is not None:
            backend.last_active = self.replies.now
        if "method" in message:
            if "id" in message:
                request = self.exchanges.backend_request(key, message, self.roots, self.replies.now)
                if isinstance(request, OwnReply):
                    return self.table.send(key, request.data, own=True)
                return request
            return self._backend_notification(key, message)
        return self._backend_answer(key, message)

    def _backend_answer(self, key: BackendKey, message: Json) -> list[Action]:
        forwarded = self.exchanges.answered(key, message)
        if forwarded is None:
            return []
        if forwarded.client_id is None:
            if forwarded.method == "initialize":
                return self.table.handshake_done(key, message)
            return self.relisting.answered(key, forwarded.method, message, self._backend_bytes)
        backend = self.table.roster.all.get(key)
        if backend is not None and backend.workspace:
            # Its container is stopped next (the call is done, settle); the answer goes out
            # once what the task changed in its copy is recorded (see .workspace_answers).
            self.exchanges.held.hold(key, forwarded, message)
            return []
        return [self.exchanges.relay(forwarded, message)]

    def _backend_notification(self, key: BackendKey, message: Json) -> list[Action]:
        method = message.get("method")
        if method in ("notifications/progress", "notifications/message"):
            return [ToClient(encoder.encode(message))]
        if method == "notifications/cancelled":
            params = message.get("params")
            return self.exchanges.withdrawn(key, params) if isinstance(params, dict) else []
        if isinstance(method, str) and method in REFRESH:
            return self.relisting.changed(key, method)
        return []

    # --- model checking -----------------------------------------------------------------------

    def clone(self, replies: Replies) -> FabricRouter:
        """An independent copy answering through ``replies`` (the twin's ledger). What is
        never changed in place is shared: the catalog (replaced whole by a refresh), the
        settings, a running :class:`~.fabric_refresh.Refresh`, the requests waiting in a
        queue."""
        twin = copy.copy(self)
        twin.replies = replies
        twin.exchanges = self.exchanges.clone(replies)
        relists = self.relisting.relists.clone()
        twin.table = self.table.clone(replies, twin.exchanges, relists)
        twin.relisting = self.relisting.clone(relists, twin.table, twin.exchanges)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """Its whole state, hashable (the catalog is the server's to fingerprint)."""
        return (
            self.table.fingerprint(),
            self.exchanges.fingerprint(),
            self.relisting.relists.fingerprint(),
        )
