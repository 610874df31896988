"""The fabric endpoint's MCP server for one client session, without I/O.

Unlike the per-service relay, which passes frames through untouched, this is an MCP server of
our own: it decodes every message. It answers the client's ``initialize`` / ``server/discover``,
lists the suite's tools, prompts and resources from the catalog under their shown names with
the endpoint's own tools first (:mod:`.fabric_lists`), and has each call routed to its
service's backend.

:class:`FabricServer` is made from a :class:`~.fabric_setup.FabricSetup`: the orchestrator's
frozen settings (:class:`~.settings.Settings`, built once from the suite) and what is the
session's own (its id, catalog and index, mounts, exposure and active services, client lease,
the shared count of agent calls, the redaction of secrets, the time it opens). It holds its
parts as fields: its replies ledger (:class:`~.fabric_replies.Replies`: the client as it
introduced itself, every answer it gets and the tool calls they end), its router
(:class:`~.fabric_router.FabricRouter`: the calls routed, backends, ids both ways,
cancellation, backends' questions, refreshes; made with the ledger, which both answer
through), the router's backends (:attr:`FabricServer.table`, which
the server ticks and ends), its lists (:class:`~.fabric_lists.Lists`) and the analyses waiting
for the client's model (:class:`~.fabric_meta_tools.Assists`). It dispatches the client's
messages, calls a meta-tool with a frozen view of the session
(:class:`~.fabric_meta_tools.MetaContext`) and carries out the outcome it returns (an answer, a
refusal, a question for the client's model, a call by name), and ends the session.

It keeps the one session contract (:class:`~.events.SessionMachineContract`): the driver feeds
it :mod:`.events` with their time and carries out the actions it returns, in order. A catalog
refresh is a :class:`~.events.Compute`. :attr:`deadline` says when it next needs a
:class:`~.events.Tick` (also when the client's model does not choose in time).
:class:`~.events.Shutdown` answers everything owed, tells the client and ends the session;
:class:`~.events.ClientGone` records its calls, stops every backend, ends.

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

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import msgspec

from .._errors import FabricError, InvalidRequest, ParseError
from .._reasons import INVALID_JSON, ORCHESTRATOR_STOPPING
from .answers import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    ENDED_BY_OPERATOR,
    log_notification,
    session_ending,
)
from .catalog import Catalog
from .client_lease import ClientLease
from .events import (
    Action,
    BackendKey,
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
    Tick,
    ToClient,
    ToolCallDone,
    ToolsChanged,
    WorkspaceRecorded,
)
from .fabric_discovery import index_catalog
from .fabric_lists import MAX_LISTENERS, Lists
from .fabric_messages import (
    discover_result,
    notification_bytes,
)
from .fabric_meta_tools import (
    META_TOOLS,
    Assists,
    CallByName,
    Containers,
    Exposure,
    MetaContext,
    MetaSettings,
    Question,
    Refusal,
    assist_analysis,
    assisted,
)
from .fabric_refresh import Refreshed
from .fabric_replies import Replies
from .fabric_roster import Routed
from .fabric_router import FabricRouter
from .fabric_setup import FabricSetup
from .jsonrpc import Peek, RequestId, peek
from .lifecycle import Lifecycle
from .mcp import INVALID_PARAMS, METHOD_NOT_FOUND
from .served import Served

__all__ = ["Exposure", "FabricServer", "FabricSetup", "Lifecycle"]

Json = dict[str, Any]

# The lists the client may ask for, by the key of their result (see .fabric_lists).
LISTED = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}


class FabricServer:
    """The MCP server of one fabric-endpoint session (see the module's docs)."""

    def __init__(self, setup: FabricSetup) -> None:
        self.call_rate = setup.call_rate
        settings, now, catalog = setup.settings, setup.now, setup.catalog
        self.session_id = setup.session_id
        self.version = setup.version
        self.replies = Replies(now=now, audit_arguments=settings.audit_arguments)
        facts = dict(settings.facts)
        count_tokens = setup.count_tokens
        self.router = FabricRouter(setup, self.replies)
        self.table = self.router.table  # (the router's backends: ticked and ended from here)
        self.lists = Lists(catalog, setup.exposure, set(setup.active))
        # What the meta-tools read of the suite, for the session's whole life.
        self.meta_settings = MetaSettings(
            facts=facts,
            profiles={name: list(services) for name, services in settings.profiles.items()},
            token_budget=settings.token_budget,
            assist=settings.assist,
            count_tokens=count_tokens,
        )
        # The ranking index of this session's catalog: the orchestrator's shared one when it
        # is given (built once per catalog), rebuilt here when a service's tools change.
        index = setup.index
        self.index = index if index is not None else index_catalog(catalog, facts, count_tokens)
        self.assists = Assists()  # analyze_task calls waiting for the client's model
        self.started_at = now
        self.lease = ClientLease(setup.client_lease, now)  # (see .client_lease)
        self.closed = False  # the session was ended (Shutdown, ClientGone): EndSession sent
        self.gone = False  # the client left: nothing more to do
        self._message_bytes = 0  # the size of the client message being handled

    # --- what the trio layer and tests read ---------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The session's catalog (the router's: a refresh replaces it)."""
        return self.router.catalog

    @property
    def backends(self) -> Mapping[str, Routed]:
        return self.table.roster.current

    @property
    def all_backends(self) -> Mapping[BackendKey, Routed]:
        return self.table.roster.all

    @property
    def served(self) -> Served:
        """Which container served which call (get_status, /api/sessions)."""
        return self.table.served

    # --- the contract ---------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self.table.roster.accepting

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event at ``now``; the actions to carry out, in order."""
        self.replies.now = now  # (the clock of the router's parts too)
        actions = [] if self.gone else self._handle(event, now)
        self.router.hold_agent_slots(gone=self.gone)
        return actions

    def _handle(self, event: Event, now: float) -> list[Action]:
        actions: list[Action] = []
        match event:
            case ClientFrame(frame=frame, message=known):
                self.lease.touch(now)
                self._message_bytes = len(frame)
                actions = self.replies.with_done(self._client_message(frame, known))
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
                actions = self.router.backend_measured(event)
            case WorkspaceRecorded():
                actions = self._workspace_recorded(event)
            case _:
                if isinstance(event, BackendLine):
                    self.lease.touch(now)
                actions = self.router.backend_event(event)
        if self.closed:
            return actions
        # A per-call backend whose call ended, a retiring one whose calls ended: removed.
        return actions + self.table.settle_all()

    def _workspace_recorded(self, event: WorkspaceRecorded) -> list[Action]:
        """A held answer goes out naming its task's work (none held: answered already, the
        session ending meanwhile)."""
        exchanges = self.router.exchanges
        if event.workspace is not None:
            self.table.served.recorded(event.key, event.workspace.get("branch"))
        answers = [exchanges.relay(h.request, h.message) for h in exchanges.held.release(event)]
        return self.replies.with_done(list[Action](answers))

    def abandon(self, now: float) -> list[Action]:
        """The session is over without the machine ending it: the calls still open will never
        be answered (their records, ``no_answer``)."""
        return [ToolCallDone(call) for call in self.replies.calls.abandon(now)]

    def _client_gone(self) -> list[Action]:
        """The client left: its open calls are recorded, every backend stopped."""
        actions = self.abandon(self.replies.now)
        self.gone = True
        if self.closed:
            return actions
        self.closed = True
        return [*actions, *self.table.stop_all(), EndSession()]

    def _shutdown(self, reason: str) -> list[Action]:
        """The orchestrator stops, or an operator ended the session: everything owed is
        answered, the client told, and the session ends (nothing starts after)."""
        if self.closed:
            return []
        self.closed = True
        error = session_ending(reason)
        actions = self.answer_all(error)
        if reason == ENDED_BY_OPERATOR:
            # Clients show log messages; a request in flight shows the error above.
            actions.append(ToClient(log_notification("warning", str(error))))
        code = CLOSE_GOING_AWAY if reason == ORCHESTRATOR_STOPPING else CLOSE_NORMAL
        return [*actions, CloseClient(code, reason.replace("_", " ")), EndSession()]

    def answer_all(self, error: FabricError) -> list[Action]:
        """The session ends (shutdown, a failure): every request the client waits for gets
        ``error``, every open subscription its end, an analysis waiting for the client's model
        the ranking's answer. Nothing is owed afterwards.

        The driver ends the session next, but feeds what comes until then: a client request
        gets ``error`` too, and the backends hear nothing more (a start that completes is not
        greeted, a call that waited for it is not sent: its client was told it failed)."""
        actions = self.table.end(error)
        for assist in self.assists.end():
            ranked = assist_analysis(self.catalog, assist, "ranking")
            actions.append(self.replies.result(assist.client_id, ranked))
        actions += [self.replies.result(id_, ended) for id_, ended in self.lists.end()]
        return self.replies.with_done(actions)

    # --- model checking -----------------------------------------------------------------------

    def clone(self) -> FabricServer:
        """An independent copy of the machine in its current state (for model checking). What
        is never changed in place is shared: the catalog and its index (replaced whole by a
        refresh), the settings, a running :class:`Refresh`, the requests waiting in a queue."""
        twin = copy.copy(self)
        twin.replies = self.replies.clone()
        twin.router = self.router.clone(twin.replies)
        twin.table = twin.router.table
        twin.lists = self.lists.clone()
        twin.assists = self.assists.clone()
        twin.lease = dataclasses.replace(self.lease)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        """A hashable summary of the whole state: equal fingerprints behave alike (used to
        explore every reachable state once when model-checking the machine). The ranking index
        is left out: it is made from the catalog, which is in."""
        return (
            self.replies.fingerprint(),
            self.router.fingerprint(),
            msgspec.json.encode(self.catalog.services),
            self.lists.fingerprint(),
            self.closed,
            self.gone,
            self.assists.fingerprint(),
            self.lease.state(),
        )

    # --- time ---------------------------------------------------------------------------------

    @property
    def deadline(self) -> float | None:
        """When a :class:`~.events.Tick` is next due (None: nothing will come due by itself)."""
        if self.table.ending is not None:
            return None
        due = self.table.deadlines() + self.assists.deadlines()
        due.append(math.inf if self.lease.deadline is None else self.lease.deadline)
        finite = [when for when in due if when != math.inf]
        return min(finite) if finite else None

    def _on_tick(self) -> list[Action]:
        """Whatever came due: backends' stdin, their unanswered requests to the client, calls
        not resumed, analyses the client's model did not choose for in time (the ranking's
        answer stands), idle services, the client's lease."""
        if self.table.ending is not None:
            return []
        now = self.replies.now
        actions = self.table.tick()
        for our_id, assist in self.assists.expired(now):
            note = {"requestId": our_id, "reason": "no answer in time"}
            actions.append(ToClient(notification_bytes("notifications/cancelled", note)))
            late = "ranking (the client's model did not answer in time)"
            ranked = assist_analysis(self.catalog, assist, late)
            actions.append(self.replies.result(assist.client_id, ranked))
        actions += self.table.stop_idle()
        return self.replies.with_done(actions) + self.lease.expire_if_due(now)

    # --- events from the client ---------------------------------------------------------------

    def _client_message(self, data: bytes, known: Peek | None = None) -> list[Action]:
        """One message from the client (``known``: its envelope, peeked already)."""
        try:
            kind = known or peek(data)
            message = msgspec.json.decode(data)
        except (ParseError, InvalidRequest) as exc:
            return [self.replies.error(exc.request_id, exc)]
        except (msgspec.DecodeError, RecursionError):
            return [self.replies.error(None, ParseError("not valid JSON", reason=INVALID_JSON))]
        if kind.is_response:
            return self._client_answer(message)
        method = str(message["method"])
        params = message.get("params")
        if not isinstance(params, dict):
            params = {}
        if not kind.is_request:
            return self._client_notification(method, params)
        request_id: RequestId = message["id"]
        if (
            request_id in self.replies.calls.open
            or request_id in self.lists.listeners
            or self.router.waits_on(request_id)
            or self.assists.waits_on(request_id)
        ):
            # A request of the client's under this id is still to be answered.
            return self.replies.refuse_duplicate(request_id, method, params, self._message_bytes)
        return self._client_request(request_id, method, params)

    def _client_request(self, request_id: object, method: str, params: Json) -> list[Action]:
        replies = self.replies
        ending = self.table.ending
        if ending is not None:
            # The session ends: the request starts nothing, and gets the ending's error (a
            # tools/call its record, as every call).
            if method == "tools/call" and isinstance(request_id, str | int):
                replies.begin_call(request_id, params, self._message_bytes)
            return [replies.error(request_id, ending)]
        listed = LISTED.get(method)
        if listed is not None:
            listing = self.lists.listing(listed, self.catalog, stateless=replies.stateless)
            return [replies.result(request_id, listing)]
        if method in ("initialize", "server/discover", "ping"):
            if method == "initialize":
                return [replies.introduce(request_id, params, self.version)]
            result = discover_result(self.version) if method == "server/discover" else {}
            return [replies.result(request_id, result)]
        handler = {
            "tools/call": self._call,
            "prompts/get": self.router.get_prompt,
            "resources/read": self.router.read_resource,
            "subscriptions/listen": self._on_listen,
        }.get(method)
        if handler is None:
            unknown = f"method {method!r} is not available"
            return [replies.fail(request_id, METHOD_NOT_FOUND, unknown)]
        return handler(request_id, params)

    def _on_listen(self, request_id: object, params: Json) -> list[Action]:
        """A 2026-07-28 client opens its stream of list changes (answered when it ends)."""
        ack = self.lists.listen(request_id, params)
        if ack is None:
            too_many = f"at most {MAX_LISTENERS} subscriptions per session"
            return [self.replies.fail(request_id, INVALID_PARAMS, too_many)]
        return [ack]

    def _client_notification(self, method: str, params: Json) -> list[Action]:
        if method != "notifications/cancelled":
            return []  # initialized, roots/list_changed (roots come from the mounts), …
        client_id = params.get("requestId")
        self.replies.cancelled(client_id)
        if self.lists.listeners.pop(client_id, None) is not None:
            return []  # a subscription the client closed: nothing to answer
        return self.router.cancel(client_id, params)

    def _client_answer(self, message: Json) -> list[Action]:
        answered = message.get("id")
        assist = self.assists.waiting.pop(answered, None) if isinstance(answered, int) else None
        if assist is not None:
            result = assisted(self.index, self.catalog, assist, message)
            return [self.replies.result(assist.client_id, result)]
        return self.router.client_answer(answered, message)

    # --- tools ----------------------------------------------------------------------------------

    def _call(self, request_id: object, params: Json) -> list[Action]:
        """A tools/call: its record begun; refused at once over its user's rate, else run."""
        if isinstance(request_id, str | int):
            self.replies.begin_call(request_id, params, self._message_bytes)
        limited = self.call_rate.refusal(self.replies.now) if self.call_rate is not None else None
        if limited is not None:
            return [self.replies.error(request_id, limited)]
        name = params.get("name")
        arguments = params.get("arguments")
        if not isinstance(arguments, dict):
            arguments = {}
        meta = META_TOOLS.get(name) if isinstance(name, str) else None
        if meta is None:
            return self.router.call_tool(request_id, name, params)
        outcome = meta.handler(self._meta_context(), arguments, params)
        if isinstance(outcome, Question):
            return [ToClient(self.assists.ask(self.router.new_id(), request_id, outcome))]
        if isinstance(outcome, CallByName):
            return self.router.call_tool(request_id, outcome.name, outcome.params)
        if isinstance(outcome, Refusal):
            return [self.replies.fail(request_id, outcome.code, outcome.message)]
        answer = self.replies.result(request_id, outcome.result)
        stateless = self.replies.stateless
        activated = (
            self.lists.activate(outcome.active, self.catalog, stateless=stateless)
            if outcome.active is not None
            else []
        )
        return [answer, *activated]

    def _meta_context(self) -> MetaContext:
        """What a meta-tool sees of the session, now."""
        now = self.replies.now
        containers = Containers(
            session_id=self.session_id,
            uptime=now - self.started_at,
            live=tuple(
                {"server": key.service, "state": backend.state.value}
                for key, backend in self.all_backends.items()
            ),
            recent=tuple(self.served.records(self.started_at)),
        )
        return MetaContext(
            catalog=self.catalog,
            index=self.index,
            exposure=self.lists.exposure,
            active=tuple(self.lists.active),
            stateless=self.replies.stateless,
            sampling="sampling" in self.replies.client_capabilities,
            now=now,
            settings=self.meta_settings,
            containers=containers,
        )

    # --- refreshes ------------------------------------------------------------------------------

    def _computed(self, job: Job, result: Refreshed | None) -> list[Action]:
        """The refresh ran (``None``: it failed or was given up; the catalog stays as it was):
        its catalog (the router's) and index are this session's now, its tool changes are
        recorded, the client is told — a handshake-era client if it lists a refreshed service,
        a listener if it asked — and a backend that repeated list_changed meanwhile is asked
        again."""
        relisting = self.router.relisting
        finished = relisting.done(job, result)
        if finished is None:
            return []
        refresh, _held = finished
        actions: list[Action] = []
        if result is not None:
            if result.index is not None:
                self.index = result.index
            actions += [ToolsChanged(changes) for changes in result.changes]
            stateless = self.replies.stateless
            actions += self.lists.announce(refresh.lists, self.catalog, stateless=stateless)
        actions += relisting.settled(finished)
        return self.replies.with_done(actions)
