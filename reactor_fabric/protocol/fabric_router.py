"""The fabric endpoint's backends for one session, without I/O: the router of
:class:`~.fabric_server.FabricServer` (its base class).

Each service the session calls gets a backend — a container of that service for this session,
started on first use (:class:`StartBackend`) and spoken to as a client: ``starting`` until
the driver reports it running, ``handshaking`` while the router greets it (``initialize``),
``ready`` once it answered; requests for it wait in its queue until then (at most
:data:`MAX_QUEUED_PER_BACKEND`). A backend that fails, refuses the handshake or stops reading is
forgotten and, when it still runs, stopped (:class:`StopBackend`): the next call starts a fresh
one (transparent respawn), and the session's other services are not affected.

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

Bounds. What the machine sends a backend on its own (answers to its ``ping`` and ``roots/list``,
refusals, refreshes, the handshake: :attr:`ToBackend.own`) is counted until the driver reports
it written (:meth:`FabricRouter.backend_read`): a backend that leaves more than
``own_backlog_bytes`` of it unread has stopped reading its stdin, and is treated as broken
(``container_unresponsive``, as on the relay) rather than grow the orchestrator's memory. At
most :data:`~.session.MAX_SERVER_REQUESTS` backend requests wait for the client at once, as on
the relay; one more is answered to its backend -32006 ``too_many_requests_to_client``. A request
the client does not answer within :data:`ASK_SECONDS` is answered to its backend -32006
``client_did_not_answer`` (see ``FabricServer.tick``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from .._errors import ClientDidNotAnswer, ContainerStartFailure, FabricError
from .._reasons import (
    BACKEND_LIST_TOO_LARGE,
    CLIENT_DID_NOT_ANSWER,
    HANDSHAKE_FAILED,
    IDLE,
    NONE,
)
from .._reasons import INVALID_PARAMS as INVALID_PARAMS_REASON
from .._reasons import METHOD_NOT_FOUND as METHOD_NOT_FOUND_REASON
from .catalog import Catalog
from .fabric_discovery import ServiceFacts
from .fabric_messages import (
    CACHE_PRIVATE,
    Action,
    StartBackend,
    StopBackend,
    ToBackend,
    ToClient,
    complete,
    encoder,
    for_backend,
    notification_bytes,
)
from .fabric_refresh import MAX_LIST_BYTES, Refresh
from .jsonrpc import duplicate_request, error_response
from .mcp import CLIENT_VERSION, INVALID_PARAMS, LIST_CHANGED, LIST_METHOD, METHOD_NOT_FOUND
from .session import (
    MAX_SERVER_REQUESTS,
    UNRESPONSIVE,
    SessionLimits,
    too_many_requests_to_client,
)
from .tool_calls import ArgumentsMode, ToolCall, ToolCallDone, ToolCalls

Json = dict[str, Any]

BACKEND_PROTOCOL = CLIENT_VERSION
MAX_QUEUED_PER_BACKEND = 64
MAX_PENDING = 512
# Bytes of the endpoint's own messages a backend may leave unread on its stdin: by default the
# relay's bound on what waits for a server (the driver passes the suite's buffer_to_server).
OWN_BACKLOG_BYTES = SessionLimits().to_server_bytes
SERVER_NAME = "reactor-fabric"
# The reason the metrics give errors of the endpoint's own that carry none.
_REASONS = {METHOD_NOT_FOUND: METHOD_NOT_FOUND_REASON, INVALID_PARAMS: INVALID_PARAMS_REASON}
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


class FabricRouter:
    """A session's backends: their lifecycle, the ids both ways, what waits for them (see the
    module's docs). :class:`~.fabric_server.FabricServer` is the session's MCP server on top."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        mount_targets: Iterable[str],
        version: str,
        clock: Callable[[], float],
        audit_arguments: ArgumentsMode,
        own_backlog_bytes: int,
        facts: Mapping[str, ServiceFacts],
        count_tokens: Callable[[Json], int],
        idle_timeouts: Mapping[str, float],
    ) -> None:
        self.catalog = catalog
        # What a refresh makes the session's catalog and index with.
        self.facts = dict(facts)
        self.count_tokens = count_tokens
        self.mount_targets = tuple(mount_targets)
        self.version = version
        self.clock = clock
        self.own_backlog_bytes = own_backlog_bytes
        self.idle_timeouts = dict(idle_timeouts)
        self.client_capabilities: Json = {}
        self.protocol_version: str | None = None
        self.backends: dict[str, _Backend] = {}
        self._forwarded: dict[int, _Forwarded] = {}
        self._asked: dict[int, _Asked] = {}
        self._next_id = 0
        # The client's tools/call requests without an outcome yet, and those that got one
        # while handling the current event (returned as ToolCallDone after its actions).
        self.calls = ToolCalls(audit_arguments)
        self._done: list[ToolCall] = []
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

    @property
    def _stateless(self) -> bool:
        # A 2026-07-28 client never sent initialize: its lists never change within a
        # connection, so activation shows only after it reconnects.
        return self.protocol_version is None

    # --- routing to backends --------------------------------------------------------------------

    def _forward(self, service: str, client_id: object, method: str, params: Json) -> list[Action]:
        if len(self._forwarded) >= MAX_PENDING:
            return [self._fail(client_id, INVALID_PARAMS, "too many requests in flight")]
        request = {"jsonrpc": "2.0", "id": None, "method": method, "params": for_backend(params)}
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
        return [ToBackend(service, encoder.encode(request))]

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
                return [
                    ToBackend(
                        forwarded.service, notification_bytes("notifications/cancelled", note)
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
        return self._own(service, encoder.encode(handshake))

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
            return self._backendnotification(service, message)
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
            stop = StopBackend(service, refused.reason)
            return [stop, *self._backend_failed(service, refused)]
        backend.state = "ready"
        actions = self._own(service, notification_bytes("notifications/initialized", None))
        if service not in self.backends:
            return actions  # it was found broken
        actions += [ToBackend(service, encoder.encode(request)) for request in backend.queue]
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
            self._asked[our_id] = _Asked(service, message.get("id"), self.clock() + ASK_SECONDS)
            return [ToClient(encoder.encode({**message, "id": our_id}))]
        else:
            answer["error"] = {
                "code": METHOD_NOT_FOUND,
                "message": f"the client does not offer {method}",
            }
        return self._own(service, encoder.encode(answer))

    def _backendnotification(self, service: str, message: Json) -> list[Action]:
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
        return self._own(service, encoder.encode(request))

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

    # --- answers --------------------------------------------------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

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

    def _result(self, request_id: object, result: Json) -> ToClient:
        if self._stateless:
            result = complete(result)
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
        data = encoder.encode(body)
        self._ended(request_id, data)
        return ToClient(data, error)
