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
most :data:`~.session.MAX_SERVER_REQUESTS` backend requests wait for the client at once, as on
the relay; one more is answered to its backend -32006 ``too_many_requests_to_client``. A request
the client does not answer within :data:`ASK_SECONDS` is answered to its backend -32006
``client_did_not_answer``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from .._errors import ClientDidNotAnswer, ContainerStartFailure, FabricError, titled
from .._reasons import (
    BACKEND_LIST_TOO_LARGE,
    CLIENT_DID_NOT_ANSWER,
    CONTAINER_OUTPUT_INVALID,
    EXITED,
    HANDSHAKE_FAILED,
    IDLE,
)
from .answers import (
    MAX_SERVER_REQUESTS,
    UNRESPONSIVE,
    SessionLimits,
    container_exited,
    too_many_requests_to_client,
)
from .catalog import Catalog
from .events import (
    Action,
    BackendBroken,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendStarted,
    BackendStartFailed,
    Compute,
    Log,
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
from .jsonrpc import duplicate_request, error_response
from .mcp import (
    CLIENT_VERSION,
    INVALID_PARAMS,
    LIST_CHANGED,
    LIST_METHOD,
    METHOD_NOT_FOUND,
    TITLES,
)
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
# What a backend's list_changed makes the machine ask it again, and where the answer goes.
_REFRESH = {notification: (LIST_METHOD[kind], kind) for notification, kind in LIST_CHANGED.items()}


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


@dataclass
class _Backend:
    key: BackendKey  # the container the router counts on (events of any other are ignored)
    state: Literal["starting", "handshaking", "ready"]
    queue: list[Json] = field(default_factory=list)  # requests waiting for the handshake
    last_active: float = 0.0
    # Lines sent (ToBackend) not yet reported written (StdinWritten), oldest first: their
    # sizes and whether each is the machine's own; all their bytes, and the own ones'.
    writes: collections.deque[tuple[int, bool]] = field(default_factory=collections.deque)
    queued: int = 0
    unread: int = 0


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
    ) -> None:
        super().__init__(now=now, audit_arguments=audit_arguments)
        self.catalog = catalog
        # What a refresh makes the session's catalog and index with.
        self.facts = dict(facts)
        self.count_tokens = count_tokens
        self.mount_targets = tuple(mount_targets)
        self.version = version
        self.own_backlog_bytes = own_backlog_bytes
        self.buffer_to_server_bytes = buffer_to_server_bytes
        self.idle_timeouts = dict(idle_timeouts)
        self.client_capabilities: Json = {}
        self.backends: dict[str, _Backend] = {}  # each service's current backend
        self._seq = 0  # the last backend's sequence (it names its container)
        self._had: set[str] = set()  # services that had a container (the next is a respawn)
        self._forwarded: dict[int, _Forwarded] = {}
        self._asked: dict[int, _Asked] = {}
        self._backend_bytes = 0  # the size of the backend message being handled
        self.relists = Relists()  # refreshes after backends' list_changed
        # The session is ending (see answer_all): what everything coming meanwhile is told.
        self._ending: FabricError | None = None

    # --- routing to backends --------------------------------------------------------------------

    def _forward(self, service: str, client_id: object, method: str, params: Json) -> list[Action]:
        if len(self._forwarded) >= MAX_PENDING:
            return [self._fail(client_id, INVALID_PARAMS, "too many requests in flight")]
        request = {"jsonrpc": "2.0", "id": None, "method": method, "params": for_backend(params)}
        backend = self.backends.get(service)
        if backend is None:
            self._seq += 1
            key = BackendKey(service, self._seq)
            self.backends[service] = _Backend(key, "starting", [request], self.now)
            self._remember(request, service, client_id, method)
            return [StartBackend(key, respawn=service in self._had)]
        if backend.state != "ready":
            if len(backend.queue) >= MAX_QUEUED_PER_BACKEND:
                return [self._fail(client_id, INVALID_PARAMS, f"{service} is still starting")]
            backend.queue.append(request)
            self._remember(request, service, client_id, method)
            return []
        self._remember(request, service, client_id, method)
        backend.last_active = self.now
        return self._send(service, encoder.encode(request))

    def _remember(self, request: Json, service: str, client_id: object, method: str) -> None:
        request["id"] = self._new_id()
        self._forwarded[request["id"]] = _Forwarded(service, client_id, method)

    def _cancel_forwarded(self, client_id: object, params: Json) -> list[Action]:
        """The client cancelled its request ``client_id``: withdrawn from its backend."""
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
                return self._send(
                    forwarded.service, notification_bytes("notifications/cancelled", note)
                )
        return []

    # --- events from backends -------------------------------------------------------------------

    def _backend_event(self, event: BackendEvent) -> list[Action]:
        """An event of a backend: ignored unless it is of the service's current one."""
        service = event.key.service
        backend = self.backends.get(service)
        if backend is None or backend.key != event.key:
            return []  # a backend stopped (or failed) since: nothing is owed to it
        actions: list[Action] = []
        match event:
            case StdinWritten(nbytes=nbytes):
                self._written(backend, nbytes)
            case BackendStarted():
                self._had.add(service)
                actions = self._backend_started(service)
            case BackendLine(line=line):
                actions = self._backend_line(service, line)
            case BackendStartFailed(error=error):
                fields = {"backend": service, "reason": error.reason}
                failed = self._failed(service, error)
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

    def _output_ended(self, backend: _Backend, error: FabricError) -> list[Action]:
        """A backend's output ended (it exited, or broke the framing): removed at once, logged
        as the failure it is, and what it owed answered with ``error``."""
        stop = self._stop(backend.key, EXITED, logged=error.reason)
        self.backends.pop(backend.key.service)  # (also while the session ends)
        return [*stop, *self._failed(backend.key.service, error)]

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
        ``logged`` or ``reason``) unless idle. Gracefully (its stdin closed, a moment to exit)
        unless it no longer reads its stdin or has exited: those are removed at once."""
        stop = StopBackend(key, reason, graceful=reason not in (UNRESPONSIVE, EXITED))
        if reason == IDLE:
            return [stop]
        return [
            Log("warning", "backend_failed", {"backend": key.service, "reason": logged or reason}),
            stop,
        ]

    def _backend_started(self, service: str) -> list[Action]:
        """The service's container runs: greet it as a client would."""
        backend = self.backends.get(service)
        if backend is None or self._ending is not None:
            return []
        backend.state = "handshaking"
        backend.last_active = self.now
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
        return self._own(service, encoder.encode(handshake))

    def _backend_line(self, service: str, data: bytes) -> list[Action]:
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
            result = complete(result)
            reply["result"] = (
                {**CACHE_PRIVATE, **result} if forwarded.method == "resources/read" else result
            )
        data = encoder.encode(reply)
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
            stop = self._stop(backend.key, refused.reason)
            return [*stop, *self._backend_failed(service, refused)]
        backend.state = "ready"
        actions = self._own(service, notification_bytes("notifications/initialized", None))
        if service not in self.backends:
            return actions  # it was found broken
        for request in backend.queue:
            actions += self._send(service, encoder.encode(request))
        backend.queue = []
        return actions

    def _backend_request(self, service: str, message: Json) -> list[Action]:
        method = str(message.get("method"))
        answer: Json = {"jsonrpc": "2.0", "id": message.get("id")}
        if any(a.service == service and a.backend_id == answer["id"] for a in self._asked.values()):
            # The client's answer could not be told from the first's: refused, as the relay does.
            answer["error"] = duplicate_request(answer["id"]).to_jsonrpc_error()
            return self._own(service, encoder.encode(answer))
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
            self._asked[our_id] = _Asked(service, message.get("id"), self.now + ASK_SECONDS)
            return [ToClient(encoder.encode({**message, "id": our_id}))]
        else:
            answer["error"] = {
                "code": METHOD_NOT_FOUND,
                "message": titled(TITLES[METHOD_NOT_FOUND], f"the client does not offer {method}"),
            }
        return self._own(service, encoder.encode(answer))

    def _backend_notification(self, service: str, message: Json) -> list[Action]:
        method = message.get("method")
        if method in ("notifications/progress", "notifications/message"):
            return [ToClient(encoder.encode(message))]
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
                            notification_bytes(
                                "notifications/cancelled", {**params, "requestId": our_id}
                            )
                        )
                    ]
            return []
        if isinstance(method, str) and method in _REFRESH:
            # Ask the service what it offers now (see _refreshed); unless its list is asked for
            # or in the works already: then once more after that one, however often it repeats.
            _list_method, kind = _REFRESH[method]
            return self._ask_list(service, kind) if self.relists.changed(service, kind) else []
        return []

    def _ask_list(self, service: str, kind: str) -> list[Action]:
        list_method = LIST_METHOD[kind]
        our_id = self._new_id()
        self._forwarded[our_id] = _Forwarded(service, None, list_method)
        request = {"jsonrpc": "2.0", "id": our_id, "method": list_method}
        return self._own(service, encoder.encode(request))

    def _refreshed(self, service: str, method: str, message: Json) -> list[Action]:
        """A service's fresh list (after its list_changed): kept for the next refresh, which
        makes the catalog and index from it off the event loop (a Compute; its Computed: see
        ``FabricServer._computed``). A list over :data:`MAX_LIST_BYTES` is refused: the backend
        is treated as broken."""
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
            stop = self._stop(self.backends[service].key, BACKEND_LIST_TOO_LARGE)
            return [*self._backend_failed(service, error), *stop]
        self.relists.keep(service, kind, relist, entries)
        return self._next_refresh()

    def _next_refresh(self) -> list[Action]:
        refresh = self.relists.next(self.catalog, self.facts, self.count_tokens)
        if refresh is None:
            return []
        # (a refresh that fails leaves the catalog as it was: logged, not the session's end)
        return [Compute(refresh, failure_event="catalog_refresh_failed")]

    def _list_done(self, service: str, kind: str, relist: _Relist) -> list[Action]:
        again = self.relists.done(service, kind, relist)
        return self._ask_list(service, kind) if again else []

    @property
    def accepting(self) -> bool:
        """Whether the client may be read: no backend has more than the session's bound
        waiting for its stdin (a slow service stalls only this session)."""
        return all(b.queued <= self.buffer_to_server_bytes for b in self.backends.values())

    def _send(self, service: str, data: bytes, *, own: bool = False) -> list[Action]:
        """One line for ``service``'s current backend, counted until reported written. A
        message of the endpoint's own (``own``) is within the bound on what it leaves unread:
        past it the backend has stopped reading its stdin while asking (pings, roots,
        refreshes…): it is broken, not the orchestrator's memory (one message alone may exceed
        the bound, as a client's may)."""
        backend = self.backends.get(service)
        if backend is None:
            return []  # forgotten (broken, stopped): nothing is owed to it any more
        line = data + b"\n"
        size = len(line)
        if own:
            if backend.unread and backend.unread + size > self.own_backlog_bytes:
                return self._unresponsive(service, backend.unread)
            backend.unread += size
        backend.queued += size
        backend.writes.append((size, own))
        return [ToBackend(backend.key, line)]

    def _own(self, service: str, data: bytes) -> list[Action]:
        return self._send(service, data, own=True)

    def _unresponsive(self, service: str, unread: int) -> list[Action]:
        error = ContainerStartFailure(
            f"the {service} server stopped reading its input ({unread} bytes of the "
            "orchestrator's own messages to it unread); its container was removed, the next "
            "call starts a fresh one",
            reason=UNRESPONSIVE,
        )
        # Stopped first: the driver drops what waits for its stdin before the answers go out.
        stop = self._stop(self.backends[service].key, UNRESPONSIVE)
        return [*stop, *self._backend_failed(service, error)]

    def _failed(self, service: str, error: FabricError) -> list[Action]:
        """The service's container could not start, or ended: answer what it owed, forget it
        (the next call starts a new one). The session's other services go on."""
        if self._ending is not None:
            self.backends.pop(service, None)
            return []  # it owes nothing any more
        return self._with_done(self._backend_failed(service, error))

    def _backend_failed(self, service: str, error: FabricError) -> list[Action]:
        self.backends.pop(service, None)
        self.relists.forget(service)
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

    def _backend_deadlines(self) -> list[float]:
        """When backends' questions to the client expire, and when idle backends stop."""
        due = [asked.deadline for asked in self._asked.values()]
        for service, backend in self.backends.items():
            if backend.state == "ready" and not self._busy(service):
                due.append(backend.last_active + self.idle_timeouts.get(service, math.inf))
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
                actions += self._own(asked.service, error_response(asked.backend_id, error))
                note = {"requestId": our_id, "reason": "no answer in time"}
                actions.append(ToClient(notification_bytes("notifications/cancelled", note)))
        return actions

    def _stop_idle(self, now: float) -> list[Action]:
        """Stop the backends idle for their service's timeout."""
        actions: list[Action] = []
        for service, backend in list(self.backends.items()):
            idle_until = backend.last_active + self.idle_timeouts.get(service, math.inf)
            if backend.state == "ready" and not self._busy(service) and idle_until <= now:
                del self.backends[service]
                self.relists.forget(service)
                actions += self._stop(backend.key, IDLE)
        return actions

    def _busy(self, service: str) -> bool:
        return any(f.service == service for f in self._forwarded.values()) or any(
            a.service == service for a in self._asked.values()
        )

    def _touch(self, service: str) -> None:
        backend = self.backends.get(service)
        if backend is not None:
            backend.last_active = self.now
