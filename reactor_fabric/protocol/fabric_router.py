"""The fabric endpoint's router for one session, without I/O: the client's calls routed to
its services' backends, and what the backends say heard and passed on.

A field of :class:`~.fabric_server.FabricServer`, which hands it the client's calls
(:meth:`FabricRouter.forward`: ``tools/call``, ``resources/read``, ``prompts/get``), their
cancellations, the client's answers to backends' questions, and the backends' events; it
answers the client through the session's replies ledger (:class:`~.fabric_replies.Replies`,
given when it is made) and returns what the driver is to do. It is composed of:

- the session's backends and their lifecycles (:class:`~.fabric_backends.BackendTable`): the
  backend a call goes to (the service's current one, or one of its own for a
  ``fresh_per_call`` service, started if need be), starts and handshakes, bounds, stops and
  failures, idle and age deadlines, smart_refresh's retirements and memory readings;
- its requests in flight both ways (:class:`~.fabric_exchanges.Exchanges`): the ids it gives
  them, the backends' questions to the client, the calls that wait for a 2026-07-28 client's
  retry (``input_required``);
- its list refreshes (:class:`~.fabric_refresh.Relists`): a backend's list_changed makes the
  router ask it for its list again, kept for the session's next catalog refresh (one at a time,
  at most one more list in the works per backend however often it repeats), which the driver
  runs off the event loop (a :class:`~.events.Compute`; a list over
  :data:`~.fabric_refresh.MAX_LIST_BYTES` is refused: the backend is treated as broken). The
  session's catalog is the router's: a refresh replaces it (:meth:`FabricRouter.refresh_done`).

Logging and progress notifications of a backend go to the client as they are. Events of a
backend the router no longer counts on are ignored. A call of an ``llm_agent`` service is an
agent call: the orchestrator's count of them (``orchestrator.agents``) may refuse it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from .._errors import ContainerStartFailure, FabricError, InvalidRequest
from .._reasons import (
    BACKEND_LIST_TOO_LARGE,
    CONTAINER_OUTPUT_INVALID,
    REFRESH_MEMORY,
    TOO_MANY_PER_CALL_CONTAINERS,
)
from .agent_slots import AgentSlots
from .answers import container_exited
from .backend import Role, measured
from .catalog import Catalog, Redact
from .events import (
    Action,
    BackendBroken,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendMeasured,
    BackendStarted,
    BackendStartFailed,
    Compute,
    Job,
    Log,
    StartBackend,
    StdinWritten,
    ToClient,
)
from .fabric_backends import (
    MAX_PER_CALL_CONTAINERS,
    MAX_QUEUED_PER_BACKEND,
    BackendTable,
    Limits,
    Routed,
    Waiting,
)
from .fabric_discovery import ServiceFacts
from .fabric_exchanges import Exchanges, OwnReply, call_ref
from .fabric_messages import encoder, for_backend, notification_bytes
from .fabric_refresh import MAX_LIST_BYTES, Finished, Refreshed, Relist, Relists
from .fabric_replies import Replies
from .input_waits import offered
from .lifecycle import Lifecycle
from .mcp import INVALID_PARAMS, LIST_CHANGED, LIST_METHOD
from .served import Served
from .suite_lock import Mode, SuiteLock

BackendEvent = (
    BackendStarted | BackendStartFailed | BackendLine | BackendBroken | BackendExited | StdinWritten
)

Json = dict[str, Any]

MAX_PENDING = 512
# What a backend's list_changed makes the machine ask it again, and where the answer goes.
REFRESH = {notification: (LIST_METHOD[kind], kind) for notification, kind in LIST_CHANGED.items()}


class FabricRouter:
    """A session's backends, routed to and heard from (see the module's docs)."""

    def __init__(
        self,
        catalog: Catalog,
        replies: Replies,
        *,
        session_id: str,
        mount_targets: Iterable[str],
        version: str,
        facts: Mapping[str, ServiceFacts],
        count_tokens: Callable[[Json], int],
        redact: Redact,
        lifecycles: Mapping[str, Lifecycle],
        idle_timeouts: Mapping[str, float],
        limits: Limits,
        lock: SuiteLock | None,
        lock_mode: Mode,
        agents: Iterable[str],
        agent_slots: AgentSlots | None,
    ) -> None:
        self.catalog = catalog  # the session's: replaced whole by a refresh
        self.replies = replies
        self.exchanges = Exchanges(replies)
        self.relists = Relists()  # refreshes after backends' list_changed
        self.table = BackendTable(
            replies,
            self.exchanges,
            self.relists,
            version=version,
            lifecycles=lifecycles,
            idle_timeouts=idle_timeouts,
            limits=limits,
        )
        self.session_id = session_id  # (what the shared count of agent calls holds it by)
        self.roots = [{"uri": f"file://{target}", "name": target} for target in mount_targets]
        # What a refresh makes the session's catalog and index with: fresh lists without the
        # suite's secret values (see .catalog), checked against the suite lock.
        self.facts = dict(facts)
        self.count_tokens = count_tokens
        self.redact = redact
        self.lock, self.lock_mode = lock, lock_mode
        # The llm_agent services, whose calls are agent calls, and the orchestrator's shared
        # count of them (None: no limit, as in most tests).
        self.agents = frozenset(agents)
        self.agent_slots = agent_slots
        self._backend_bytes = 0  # the size of the backend message being handled

    @property
    def now(self) -> float:
        """The time of the event being handled (the replies ledger's: the server's clock)."""
        return self.replies.now

    @property
    def backends(self) -> Mapping[str, Routed]:
        """Each service's current backend."""
        return self.table.current

    @property
    def all_backends(self) -> Mapping[BackendKey, Routed]:
        """Every backend the router counts on."""
        return self.table.all

    @property
    def served(self) -> Served:
        return self.table.served

    @property
    def ending(self) -> FabricError | None:
        """What the session ends with, once it ends (see :meth:`answer_all`)."""
        return self.table.ending

    @property
    def accepting(self) -> bool:
        return self.table.accepting

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
        if self.agent_slots is not None:
            calls = 0 if gone else self.exchanges.agent_calls(self.agents)
            self.agent_slots.hold(self.session_id, calls)

    # --- the client's calls ---------------------------------------------------------------------

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
        table = self.table
        if table.lifecycle(service).strategy == "fresh_per_call":
            return self._forward_fresh(service, client_id, method, request, offers)
        backend = table.current.get(service)
        spent = table.spent(backend) if backend is not None else None
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
        backend.last_active = self.now
        return table.send(backend.key, encoder.encode(request))

    def _forward_fresh(
        self, service: str, client_id: object, method: str, request: Json, offers: tuple[str, ...]
    ) -> list[Action]:
        """fresh_per_call: a container of its own for this call, within the session's bound."""
        if self.table.per_call(service) >= MAX_PER_CALL_CONTAINERS:
            refusal = InvalidRequest(
                f"this session already has {MAX_PER_CALL_CONTAINERS} calls of {service} in "
                "flight, each in a container of its own (fresh_per_call): retry when one ends",
                reason=TOO_MANY_PER_CALL_CONTAINERS,
            )
            return [self.replies.error(client_id, refusal)]
        actions = self._start_for(service, client_id, method, request, Role.CALL, offers)
        # The log names the call its container serves (container_started names the sequence).
        call = {"backend": service, "sequence": self.table.seq, "method": method, "call": client_id}
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
        backend = self.table.add(service, role)
        key = backend.key
        self._remember(request, key, client_id, method, offers)
        backend.queue.append(Waiting(request, encoder.encode(request)))
        if role is Role.CALL:
            # A pooled container the pool greeted will do (no handshake at the call, see
            # BackendTable.started); its audit record names the call.
            call = call_ref(client_id, method, request["params"])
            return [StartBackend(key, greeted=True, call=call)]
        return [StartBackend(key, respawn=service in self.table.had)]

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
            return []
        our_id, forwarded = found
        del self.exchanges.forwarded[our_id]
        backend = self.table.all.get(forwarded.key)
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
        resumed = self.exchanges.resume(service, client_id, method, params, self.now)
        if isinstance(resumed, list):
            return resumed
        actions: list[Action] = []
        for reply in resumed.replies:
            actions += self.table.send(resumed.key, reply)
        if resumed.answer is not None:
            return actions + self._backend_answer(resumed.key, resumed.answer)
        return actions + list(resumed.then)

    # --- lifecycles -----------------------------------------------------------------------------

    def settle_all(self) -> list[Action]:
        """After every event (see :meth:`.BackendTable.settle_all`)."""
        return self.table.settle_all()

    def backend_measured(self, event: BackendMeasured) -> list[Action]:
        """A backend's memory figure: over the threshold, it takes no more calls (removed once
        what it has ends, ``refresh_memory``) and the calls that waited for the figure go to a
        fresh one; under it, or unknown (logged: nothing is decided on it), they go to it."""
        key = event.key
        backend = self.table.all.get(key)
        if backend is None or not backend.measuring or self.ending is not None:
            return []  # stopped (idle, aged, failed) while measured, or the session ends
        lifecycle = self.table.lifecycle(key.service)
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
        backend = self.table.all.get(key)
        if backend is None:
            return []  # a backend stopped (or failed) since: nothing is owed to it
        actions: list[Action] = []
        match event:
            case StdinWritten(nbytes=nbytes):
                self.table.written(backend, nbytes)
            case BackendStarted(greeting=greeting, container=container):
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
        if self.ending is not None:
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
        backend = self.table.all.get(key)
        if backend is not None:
            backend.last_active = self.now
        if "method" in message:
            if "id" in message:
                request = self.exchanges.backend_request(key, message, self.roots, self.now)
                if isinstance(request, OwnReply):
                    return self.table.own(key, request.data)
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
            return self._refreshed(key, forwarded.method, message)
        return [self.exchanges.relay(forwarded, message)]

    def _backend_notification(self, key: BackendKey, message: Json) -> list[Action]:
        method = message.get("method")
        if method in ("notifications/progress", "notifications/message"):
            return [ToClient(encoder.encode(message))]
        if method == "notifications/cancelled":
            params = message.get("params")
            return self.exchanges.withdrawn(key, params) if isinstance(params, dict) else []
        if isinstance(method, str) and method in REFRESH:
            backend = self.table.all.get(key)
            if backend is None or backend.role is not Role.CURRENT:
                # A per-call (or retiring) container's list is moot: the next call gets a
                # fresh container, whose offer is the one learned at start-up.
                return []
            # Ask the service what it offers now (see _refreshed); unless its list is asked for
            # or in the works already: then once more after that one, however often it repeats.
            _list_method, kind = REFRESH[method]
            return self._ask_list(key, kind) if self.relists.changed(key.service, kind) else []
        return []

    # --- refreshes ------------------------------------------------------------------------------

    def _ask_list(self, key: BackendKey, kind: str) -> list[Action]:
        method = LIST_METHOD[kind]
        request = {"jsonrpc": "2.0", "id": self.exchanges.own(key, method), "method": method}
        return self.table.own(key, encoder.encode(request))

    def _refreshed(self, key: BackendKey, method: str, message: Json) -> list[Action]:
        """A service's fresh list (after its list_changed): kept for the next refresh, which
        makes the catalog and index from it off the event loop (a Compute; its Computed: see
        :meth:`refresh_done`). A list over :data:`MAX_LIST_BYTES` is refused: the backend is
        treated as broken."""
        service = key.service
        kind = dict(REFRESH.values()).get(method)
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
            return self.table.broken(key, error)
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

    def refresh_done(self, job: Job, result: Refreshed | None) -> Finished | None:
        """The refresh ``job`` ran (``result`` None: it failed or was given up; the catalog
        stays as it was): its catalog is the session's now. The refresh and the lists it held
        (None: not the one running, or the session ends: nothing to do), for
        :meth:`refresh_settled` once the client is told."""
        finished = self.relists.finished(job)
        if finished is None or self.ending is not None:
            return None
        if result is not None:
            self.catalog = result.catalog
        return finished

    def refresh_settled(self, finished: Finished) -> list[Action]:
        """After a refresh: a backend that repeated list_changed meanwhile is asked again, and
        the next refresh starts."""
        actions: list[Action] = []
        for (service, kind), relist in finished[1].items():
            actions += self._list_done(service, kind, relist)
        return actions + self._next_refresh()

    def _list_done(self, service: str, kind: str, relist: Relist) -> list[Action]:
        again = self.relists.done(service, kind, relist)
        if not again:
            return []
        backend = self.table.current.get(service)
        return [] if backend is None else self._ask_list(backend.key, kind)

    # --- time and the session's end ------------------------------------------------------------

    def deadlines(self) -> list[float]:
        """When something of the backends comes due (see :meth:`.BackendTable.deadlines`)."""
        return self.table.deadlines()

    def tick(self) -> list[Action]:
        """What came due of the backends' stdin, their questions to the client and the calls
        waiting for a retry (idle backends: :meth:`stop_idle`)."""
        return self.table.tick()

    def stop_idle(self) -> list[Action]:
        return self.table.stop_idle()

    def answer_all(self, error: FabricError) -> list[Action]:
        """The session ends: every call in flight is answered ``error``; the backends are owed
        nothing more (see :meth:`.BackendTable.end`)."""
        return self.table.end(error)

    def stop_all(self) -> list[Action]:
        """The client left: every backend is stopped."""
        return self.table.stop_all()

    # --- model checking -----------------------------------------------------------------------

    def clone(self, replies: Replies) -> FabricRouter:
        """An independent copy answering through ``replies`` (the twin's ledger). What is
        never changed in place is shared: the catalog (replaced whole by a refresh), the
        settings, a running :class:`~.fabric_refresh.Refresh`, the requests waiting in a
        queue."""
        twin = copy.copy(self)
        twin.replies = replies
        twin.exchanges = self.exchanges.clone(replies)
        twin.relists = self.relists.clone()
        twin.table = self.table.clone(replies, twin.exchanges, twin.relists)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """Its whole state, hashable (the catalog is the server's to fingerprint)."""
        return (
            self.table.fingerprint(),
            self.exchanges.fingerprint(),
            self.relists.fingerprint(),
        )
