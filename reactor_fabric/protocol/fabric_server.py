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
  :meth:`FabricServer.backend_failed`.

Ids. Every request the machine sends — to a backend for the client, to the client for a backend,
its own handshakes — gets an id of its own (one counter), remembered with where the answer
goes; an answer comes back under the id its asker used. So the client's ids and each backend's
ids never meet. Cancellation (``notifications/cancelled``) is mapped the same way; progress
notifications pass as they are (the client's ``progressToken`` travels with the request).

Requests from a backend: ``roots/list`` is answered here from the session's mounts (``file://``
URIs of their targets); ``ping`` here too; sampling and elicitation go to the client when it
declared the capability, else are refused (-32601). Logging and list-changed notifications go to
the client.

Error handling: a message that is not JSON-RPC gets -32700 / -32600 (never raises); a call to an
unknown tool -32602; a call whose backend cannot start, or whose backend dies, gets the backend's
error (-32002 ``ContainerStartFailure``, ``DockerUnavailable``, a ``SecurityViolation`` of its
mounts) — and the session's other services are not affected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from .._errors import ContainerStartFailure, FabricError, InvalidRequest, ParseError
from .catalog import Catalog, Entry
from .jsonrpc import peek

Json = dict[str, Any]
Exposure = Literal["discover", "all"]

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
STATELESS_VERSION = "2026-07-28"
BACKEND_PROTOCOL = "2025-06-18"
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
MAX_QUEUED_PER_BACKEND = 64
MAX_PENDING = 512
FIND_LIMIT = 10
MAX_FIND_LIMIT = 50
SERVER_NAME = "reactor-fabric"

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class ToClient:
    data: bytes


@dataclass(frozen=True)
class ToBackend:
    service: str
    data: bytes


@dataclass(frozen=True)
class StartBackend:
    service: str


Action = ToClient | ToBackend | StartBackend


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


@dataclass
class _Backend:
    state: Literal["starting", "handshaking", "ready"]
    queue: list[Json] = field(default_factory=list)  # requests waiting for the handshake


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
        "description": "This session's servers, their containers, and the catalog's problems.",
        "inputSchema": {"type": "object", "properties": {}},
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
    ) -> None:
        self.catalog = catalog
        self.session_id = session_id
        self.mount_targets = tuple(mount_targets)
        self.exposure: Exposure = exposure
        wanted = set(active)  # once: ``active`` may be an iterator
        self.active: list[str] = [s for s in catalog.services if s in wanted]
        self.version = version
        self.client_capabilities: Json = {}
        self.protocol_version: str | None = None
        self.backends: dict[str, _Backend] = {}
        self._forwarded: dict[int, _Forwarded] = {}
        self._asked: dict[int, _Asked] = {}
        self._next_id = 0

    # --- events from the client ---------------------------------------------------------------

    def client_message(self, data: bytes) -> list[Action]:
        """One message from the client."""
        try:
            kind = peek(data)
            message = msgspec.json.decode(data)
        except (ParseError, InvalidRequest) as exc:
            return [self._error(exc.request_id, exc)]
        except (msgspec.DecodeError, RecursionError):
            return [self._error(None, ParseError("not valid JSON", reason="invalid_json"))]
        if kind.is_response:
            return self._client_answer(message)
        method = str(message["method"])
        params = message.get("params")
        if not isinstance(params, dict):
            params = {}
        if not kind.is_request:
            return self._client_notification(method, params)
        return self._client_request(message["id"], method, params)

    def _client_request(self, request_id: object, method: str, params: Json) -> list[Action]:
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
        return [self._result(request_id, {"tools": self.listed_tools()})]

    def _on_prompts_list(self, request_id: object, _params: Json) -> list[Action]:
        return [self._result(request_id, {"prompts": self.catalog.prompts_of(self._shown())})]

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
        return [self._result(request_id, {"resources": self.catalog.resources_of(self._shown())})]

    def _on_templates_list(self, request_id: object, _params: Json) -> list[Action]:
        templates = [t for s in self._shown() for t in self.catalog.services[s].resource_templates]
        return [self._result(request_id, {"resourceTemplates": templates})]

    def _on_resources_read(self, request_id: object, params: Json) -> list[Action]:
        route = self.catalog.resource(str(params.get("uri")))
        if route is None:
            unknown = f"unknown resource {params.get('uri')!r}"
            return [self._fail(request_id, INVALID_PARAMS, unknown)]
        service, uri = route
        return self._forward(service, request_id, "resources/read", {**params, "uri": uri})

    def _client_notification(self, method: str, params: Json) -> list[Action]:
        if method == "notifications/cancelled":
            return self._cancel(params)
        return []  # initialized, roots/list_changed (roots come from the mounts), …

    def _client_answer(self, message: Json) -> list[Action]:
        answered = message.get("id")
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
        if not isinstance(arguments, dict):
            arguments = {}
        if name == "find_tools":
            return [self._result(request_id, self._find_tools(arguments))]
        if name == "get_status":
            return [self._result(request_id, self._status())]
        if name == "activate_servers":
            return self._activate(request_id, arguments)
        if name == "call_tool":
            target = arguments.get("name")
            inner = arguments.get("arguments", arguments.get("parameters", {}))
            if not isinstance(inner, dict):
                inner = {}
            if target in META_NAMES:
                return [self._fail(request_id, INVALID_PARAMS, "call_tool calls a server's tool")]
            return self._call_entry(request_id, target, {**params, "arguments": inner})
        return self._call_entry(request_id, name, params)

    def _call_entry(self, request_id: object, name: object, params: Json) -> list[Action]:
        entry: Entry | None = self.catalog.tool(name) if isinstance(name, str) else None
        if entry is None:
            return [self._fail(request_id, INVALID_PARAMS, f"unknown tool {name!r}")]
        return self._forward(
            entry.service, request_id, "tools/call", {**params, "name": entry.name}
        )

    def _find_tools(self, arguments: Json) -> Json:
        query = _words(str(arguments.get("query", "")))
        limit = arguments.get("limit", FIND_LIMIT)
        limit = max(1, min(MAX_FIND_LIMIT, limit if isinstance(limit, int) else FIND_LIMIT))
        scored = []
        for position, entry in enumerate(self.catalog.tools.values()):
            # A word in the tool's or service's name counts twice as much as one in its
            # description. (A simple ranking: issue 11 makes it excellent.)
            named = _words(f"{entry.service} {entry.name}")
            described = _words(str(entry.definition.get("description") or ""))
            score = sum(2 * (word in named) + (word in described) for word in query)
            if score:
                scored.append((-score, position, entry))
        found = [
            {
                "name": entry.shown,
                "server": entry.service,
                "description": str(entry.definition.get("description") or ""),
                "inputSchema": entry.definition.get("inputSchema", {"type": "object"}),
            }
            for _, _, entry in sorted(scored, key=lambda item: item[:2])[:limit]
        ]
        return _structured({"tools": found})

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
            }
        )

    def _activate(self, request_id: object, arguments: Json) -> list[Action]:
        wanted = arguments.get("servers")
        if not isinstance(wanted, list):
            return [self._fail(request_id, INVALID_PARAMS, "servers must be a list of names")]
        known = [s for s in wanted if isinstance(s, str) and s in self.catalog.services]
        failed = [s for s in wanted if s not in known]
        before = list(self.active)
        chosen = set(known) | (set() if arguments.get("deactivate_others") else set(self.active))
        self.active = [s for s in self.catalog.services if s in chosen]
        stateless = self.protocol_version is None
        result = _structured(
            {
                "activated": known,
                "failed": failed,
                # 2026-07-28 clients' lists never change within a connection.
                "reconnect_required": stateless,
                "estimated_tools_count": len(self.listed_tools()),
            }
        )
        actions: list[Action] = [self._result(request_id, result)]
        if self.active != before and not stateless and self.exposure == "discover":
            actions.append(_notification("notifications/tools/list_changed"))
        return actions

    # --- routing to backends --------------------------------------------------------------------

    def _forward(self, service: str, client_id: object, method: str, params: Json) -> list[Action]:
        if len(self._forwarded) >= MAX_PENDING:
            return [self._fail(client_id, INVALID_PARAMS, "too many requests in flight")]
        request = {"jsonrpc": "2.0", "id": None, "method": method, "params": params}
        backend = self.backends.get(service)
        if backend is None:
            self.backends[service] = _Backend("starting", [request])
            self._remember(request, service, client_id, method)
            return [StartBackend(service)]
        if backend.state != "ready":
            if len(backend.queue) >= MAX_QUEUED_PER_BACKEND:
                return [self._fail(client_id, INVALID_PARAMS, f"{service} is still starting")]
            backend.queue.append(request)
            self._remember(request, service, client_id, method)
            return []
        self._remember(request, service, client_id, method)
        return [ToBackend(service, _encoder.encode(request))]

    def _remember(self, request: Json, service: str, client_id: object, method: str) -> None:
        request["id"] = self._new_id()
        self._forwarded[request["id"]] = _Forwarded(service, client_id, method)

    def _cancel(self, params: Json) -> list[Action]:
        client_id = params.get("requestId")
        for our_id, forwarded in self._forwarded.items():
            if forwarded.client_id == client_id and forwarded.client_id is not None:
                backend = self.backends.get(forwarded.service)
                if backend is not None and backend.state != "ready":
                    # Not sent yet: take it out of the queue; nobody will answer it.
                    backend.queue = [r for r in backend.queue if r["id"] != our_id]
                    del self._forwarded[our_id]
                    return []
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
        if backend is None:
            return []
        backend.state = "handshaking"
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
        return [ToBackend(service, _encoder.encode(handshake))]

    def backend_message(self, service: str, data: bytes) -> list[Action]:
        """One line from a service's container."""
        try:
            message = msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            message = None  # not a message: a server's stray output
        if not isinstance(message, dict):
            return []
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
            return self._handshake_done(service, message)
        reply = {k: v for k, v in message.items() if k != "id"}
        reply["id"] = forwarded.client_id
        return [ToClient(_encoder.encode(reply))]

    def _handshake_done(self, service: str, message: Json) -> list[Action]:
        backend = self.backends.get(service)
        if backend is None:
            return []
        if "result" not in message:
            error = message.get("error")
            detail = error.get("message") if isinstance(error, dict) else "no result"
            return self.backend_failed(
                service,
                ContainerStartFailure(
                    f"{service} refused the handshake: {detail}", reason="handshake_failed"
                ),
            )
        backend.state = "ready"
        actions: list[Action] = [
            ToBackend(service, _notification_bytes("notifications/initialized", None))
        ]
        actions += [ToBackend(service, _encoder.encode(request)) for request in backend.queue]
        backend.queue = []
        return actions

    def _backend_request(self, service: str, message: Json) -> list[Action]:
        method = str(message.get("method"))
        answer: Json = {"jsonrpc": "2.0", "id": message.get("id")}
        capability = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation"}
        if method == "roots/list":
            roots = [{"uri": f"file://{target}", "name": target} for target in self.mount_targets]
            answer["result"] = {"roots": roots}
        elif method == "ping":
            answer["result"] = {}
        elif capability.get(method) in self.client_capabilities:
            our_id = self._new_id()
            self._asked[our_id] = _Asked(service, message.get("id"))
            return [ToClient(_encoder.encode({**message, "id": our_id}))]
        else:
            answer["error"] = {
                "code": METHOD_NOT_FOUND,
                "message": f"the client does not offer {method}",
            }
        return [ToBackend(service, _encoder.encode(answer))]

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
        if method in (
            "notifications/tools/list_changed",
            "notifications/prompts/list_changed",
            "notifications/resources/list_changed",
        ):
            return [ToClient(_encoder.encode(message))]
        return []

    def backend_failed(self, service: str, error: FabricError) -> list[Action]:
        """The service's container could not start, or ended: answer what it owed, forget it
        (the next call starts a new one). The session's other services go on."""
        self.backends.pop(service, None)
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

    def _result(self, request_id: object, result: Json) -> ToClient:
        return ToClient(_encoder.encode({"jsonrpc": "2.0", "id": request_id, "result": result}))

    def _fail(self, request_id: object, code: int, message: str) -> ToClient:
        error = {"code": code, "message": message}
        return ToClient(_encoder.encode({"jsonrpc": "2.0", "id": request_id, "error": error}))

    def _error(self, request_id: object, error: FabricError) -> ToClient:
        body = {"jsonrpc": "2.0", "id": request_id, "error": error.to_jsonrpc_error()}
        return ToClient(_encoder.encode(body))


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


_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")


def _words(text: str) -> set[str]:
    """Lower-case words of ``text``: split on anything not a letter or digit and on camelCase,
    a plural ``s`` dropped (``zones`` finds ``zone``)."""
    words = (word.lower() for word in _SPLIT.split(text) if len(word) > 1)
    return {word[:-1] if len(word) > 3 and word.endswith("s") else word for word in words}
