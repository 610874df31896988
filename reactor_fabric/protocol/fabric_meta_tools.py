"""The fabric endpoint's own tools (meta-tools), without I/O: one registry, name → definition
and handler.

Each meta-tool is one function here, registered with its definition (name, description, input
schema) by :func:`meta_tool`: the endpoint lists the definitions in this file's order (before
the services' tools) and calls the handler for a ``tools/call`` of its name. A handler gets the
session (:class:`MetaToolHost`, which :class:`~.fabric_server.FabricServer` is), the request's
id, its ``arguments`` (an object, ``{}`` when the client sent none) and its whole ``params``, and
returns the actions, in order — usually the one answer (``host._result``), or a request to the
client first (``analyze_task`` asking the client's model), answered later.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._reasons import SERVICE_NOT_FOUND
from ..discovery import DiscoveryIndex
from ..discovery.ranking import ServerRanking, with_choice
from .catalog import Catalog
from .events import Action, BackendKey, ToClient
from .fabric_discovery import (
    AssistSettings,
    ServiceFacts,
    analysis,
    analyze,
    assist_choice,
    assist_request,
    found_tools,
    tool_tokens,
)
from .fabric_messages import encoder, notification
from .fabric_router import Routed
from .mcp import INVALID_PARAMS
from .served import Served

Json = dict[str, Any]

FIND_LIMIT = 10
MAX_FIND_LIMIT = 50


@dataclass(frozen=True)
class _Assist:
    """An analyze_task waiting for the client's model to choose among candidates."""

    client_id: object
    ranking: ServerRanking
    candidates: tuple[str, ...]
    budget: int | None
    deadline: float


class MetaToolHost(Protocol):
    """What a meta-tool sees of its session."""

    active: list[str]
    _assisting: dict[int, _Assist]

    @property
    def session_id(self) -> str: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def index(self) -> DiscoveryIndex: ...
    @property
    def exposure(self) -> str: ...
    @property
    def facts(self) -> Mapping[str, ServiceFacts]: ...
    @property
    def profiles(self) -> Mapping[str, Sequence[str]]: ...
    @property
    def all_backends(self) -> Mapping[BackendKey, Routed]: ...
    @property
    def started_at(self) -> float: ...
    @property
    def served(self) -> Served: ...
    @property
    def token_budget(self) -> int | None: ...
    @property
    def assist(self) -> AssistSettings: ...
    @property
    def client_capabilities(self) -> Json: ...
    @property
    def count_tokens(self) -> Callable[[Json], int]: ...
    @property
    def now(self) -> float: ...

    @property
    def _stateless(self) -> bool: ...

    def listed_tools(self) -> list[Json]: ...
    def _shown(self) -> list[str]: ...
    def _new_id(self) -> int: ...
    def _result(self, request_id: object, result: Json) -> ToClient: ...
    def _fail(self, request_id: object, code: int, message: str) -> ToClient: ...
    def _call_entry(self, request_id: object, name: object, params: Json) -> list[Action]: ...


Handler = Callable[[MetaToolHost, object, Json, Json], list[Action]]


@dataclass(frozen=True)
class MetaTool:
    definition: Json  # as tools/list shows it: name, description, inputSchema
    handler: Handler


META_TOOLS: dict[str, MetaTool] = {}


def meta_tool(definition: Json) -> Callable[[Handler], Handler]:
    """Register the decorated handler as the meta-tool ``definition`` describes."""

    def register(handler: Handler) -> Handler:
        META_TOOLS[definition["name"]] = MetaTool(definition, handler)
        return handler

    return register


@meta_tool(
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
    }
)
def _find_tools(
    host: MetaToolHost, request_id: object, arguments: Json, _params: Json
) -> list[Action]:
    query = str(arguments.get("query", ""))
    limit = arguments.get("limit", FIND_LIMIT)
    limit = max(1, min(MAX_FIND_LIMIT, limit if isinstance(limit, int) else FIND_LIMIT))
    unavailable = host.catalog.unavailable()
    tools = found_tools(host.index, query, limit)
    for tool in tools:
        # A tool known from its service's last learning, but the service cannot run now.
        if tool["server"] in unavailable:
            tool["unavailable"] = unavailable[tool["server"]]
    result = {"tools": tools, "unavailable": unavailable}
    return [host._result(request_id, _structured(result))]


@meta_tool(
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
    }
)
def _call_tool(
    host: MetaToolHost, request_id: object, arguments: Json, params: Json
) -> list[Action]:
    target = arguments.get("name")
    # Models often nest a tool's arguments as "parameters": both are accepted.
    inner = arguments.get("arguments", arguments.get("parameters", {}))
    if not isinstance(inner, dict):
        inner = {}
    if target in META_TOOLS:
        return [host._fail(request_id, INVALID_PARAMS, "call_tool calls a server's tool")]
    # The outer request's _meta (its progressToken) goes along.
    return host._call_entry(request_id, target, {**params, "arguments": inner})


@meta_tool(
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
    }
)
def _activate(
    host: MetaToolHost, request_id: object, arguments: Json, _params: Json
) -> list[Action]:
    wanted = arguments.get("servers")
    if not isinstance(wanted, list):
        return [host._fail(request_id, INVALID_PARAMS, "servers must be a list of names")]
    # A service of the suite whose learning failed (its image missing, say) is not activated:
    # it is answered in failed with why, as an unknown name is, rather than shown as working.
    unavailable = host.catalog.unavailable()
    known = [
        s
        for s in wanted
        if isinstance(s, str) and s in host.catalog.services and s not in unavailable
    ]
    failed = [_not_activated(s, unavailable) for s in wanted if s not in known]
    chosen = set(known) | (set() if arguments.get("deactivate_others") else set(host.active))
    changed = _make_active(host, chosen)
    result = _structured(
        {
            "activated": known,
            "failed": failed,
            "reconnect_required": host._stateless,
            "estimated_tools_count": len(host.listed_tools()),
        }
    )
    return [host._result(request_id, result), *changed]


def _not_activated(server: object, unavailable: Mapping[str, Json]) -> Json:
    """activate_servers' ``failed`` entry for ``server``: its name, reason and detail."""
    if isinstance(server, str) and server in unavailable:
        return {"server": server, **unavailable[server]}
    return {
        "server": server,
        "reason": SERVICE_NOT_FOUND,
        "detail": f"the suite has no service {server!r}",
    }


@meta_tool(
    {
        "name": "get_status",
        "description": "This session's servers, their containers (and the ones it recently "
        "had, with the calls each served), the catalog's problems, and the tokens its tool list "
        "costs against every tool of the suite.",
        "inputSchema": {"type": "object", "properties": {}},
    }
)
def _status(
    host: MetaToolHost, request_id: object, _arguments: Json, _params: Json
) -> list[Action]:
    status = {
        "session_id": host.session_id,
        "active_servers": list(host.active),
        "total_tools": len(host.catalog.tools),
        "containers": [
            # (a fresh_per_call service has one per call in flight)
            {"server": key.service, "state": backend.state.value}
            for key, backend in host.all_backends.items()
        ],
        # Which container served which call: live ones and the last ended ones (bounded).
        "recent_containers": host.served.records(host.started_at),
        "catalog_errors": host.catalog.errors(),
        # The services that cannot run now, each with its error and reason (a secret or an
        # account missing, an image refused, a probe failed).
        "unavailable": host.catalog.unavailable(),
        "uptime": round(host.now - host.started_at, 3),
        "tool_tokens": tool_tokens(
            host.index,
            host._shown(),
            META_DEFINITIONS if host.exposure == "discover" else (),
            host.count_tokens,
        ),
    }
    drift = host.catalog.lock_drift()
    if drift:  # (the suite lock: what differs from it, per service; absent without any)
        status["lock_drift"] = drift
    return [host._result(request_id, _structured(status))]


@meta_tool(
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
    }
)
def _analyze(
    host: MetaToolHost, request_id: object, arguments: Json, _params: Json
) -> list[Action]:
    """Rank the suite's servers for a task (:mod:`reactor_fabric.discovery`); when the ranking
    is unsure and the suite allows it, ask the client's model to choose (see :func:`assisted`)."""
    ranking, budget = analyze(host.index, arguments, host.token_budget)
    settings = host.assist
    if (
        settings.enabled
        and "sampling" in host.client_capabilities
        and ranking.confidence < settings.below_confidence
        and len(ranking.ranked) >= 2
    ):
        params, candidates = assist_request(ranking, host.index, settings.candidates)
        our_id = host._new_id()
        deadline = host.now + settings.timeout
        host._assisting[our_id] = _Assist(request_id, ranking, tuple(candidates), budget, deadline)
        request = {
            "jsonrpc": "2.0",
            "id": our_id,
            "method": "sampling/createMessage",
            "params": params,
        }
        return [ToClient(encoder.encode(request))]
    return [host._result(request_id, _analysis(host, analysis(ranking, budget=budget)))]


@meta_tool(
    {
        "name": "list_available_capabilities",
        "description": "The suite's servers grouped by category, with example tasks.",
        "inputSchema": {
            "type": "object",
            "properties": {"category_filter": {"type": "string"}},
        },
    }
)
def _capability_list(
    host: MetaToolHost, request_id: object, arguments: Json, _params: Json
) -> list[Action]:
    wanted = arguments.get("category_filter")
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for service in host.catalog.services:
        facts = host.facts.get(service, ServiceFacts())
        for category in facts.categories or ("other",):
            servers, tasks = groups.setdefault(category, ([], []))
            servers.append(service)
            tasks.extend(facts.example_tasks)
    listed = [
        {"category": category, "servers": servers, "example_tasks": tasks}
        for category, (servers, tasks) in groups.items()
        if not isinstance(wanted, str) or wanted.lower() in category.lower()
    ]
    result = {"capabilities": listed, "unavailable": host.catalog.unavailable()}
    return [host._result(request_id, _structured(result))]


@meta_tool(
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
    }
)
def _switch(host: MetaToolHost, request_id: object, arguments: Json, _params: Json) -> list[Action]:
    profile = arguments.get("profile")
    add = arguments.get("add_servers", [])
    remove = arguments.get("remove_servers", [])
    if not isinstance(add, list) or not isinstance(remove, list):
        return [host._fail(request_id, INVALID_PARAMS, "servers must be lists of names")]
    if profile is not None and profile not in host.profiles:
        known = ", ".join(sorted(host.profiles)) or "none"
        unknown = f"unknown profile {profile!r} (profiles: {known})"
        return [host._fail(request_id, INVALID_PARAMS, unknown)]
    unknown_servers = [s for s in [*add, *remove] if s not in host.catalog.services]
    if unknown_servers:
        return [host._fail(request_id, INVALID_PARAMS, f"unknown servers {unknown_servers}")]
    chosen = set(host.profiles[profile]) if profile is not None else set(host.active)
    chosen = (chosen | set(add)) - set(remove)
    # As activate_servers: a service that cannot run is not made active, and is named with why.
    unavailable = host.catalog.unavailable()
    failed = [
        _not_activated(s, unavailable)
        for s in host.catalog.services
        if s in chosen and s in unavailable
    ]
    changed = _make_active(host, chosen - set(unavailable))
    result = _structured(
        {
            "new_configuration": {
                "profile": profile,
                "active_servers": list(host.active),
                "tools_count": len(host.listed_tools()),
            },
            "failed": failed,
            "reconnect_required": host._stateless,
        }
    )
    return [host._result(request_id, result), *changed]


# What tools/list shows of the meta-tools, in the order they are registered above.
META_DEFINITIONS: tuple[Json, ...] = tuple(tool.definition for tool in META_TOOLS.values())
META_NAMES = frozenset(META_TOOLS)


def _make_active(host: MetaToolHost, chosen: set[str]) -> list[Action]:
    """Set the active servers; tell a handshake-era client if its tool list changed."""
    before = host.listed_tools() if not host._stateless else None
    host.active = [s for s in host.catalog.services if s in chosen]
    if before is None or before == host.listed_tools():
        return []
    return [notification("notifications/tools/list_changed")]


def assisted(host: MetaToolHost, assist: _Assist, message: Json) -> ToClient:
    """The client's model answered an analyze_task's question (or refused): its choice among
    the candidates, or the ranking's own when it chose none of them."""
    chosen = assist_choice(message.get("result"), assist.candidates)
    if not chosen:
        refused = "refused" if "error" in message else "chose none of the candidates"
        return assist_analysis(host, assist, f"ranking (the client's model {refused})")
    why = f"chosen by the client's model among {', '.join(assist.candidates)}"
    ranking = with_choice(host.index, assist.ranking, chosen, budget=assist.budget, why=why)
    result = analysis(ranking, budget=assist.budget, decided_by="client_model")
    return host._result(assist.client_id, _analysis(host, result))


def assist_analysis(host: MetaToolHost, assist: _Assist, decided_by: str) -> ToClient:
    """An analyze_task answered with the ranking's own choice (the model did not choose)."""
    result = analysis(assist.ranking, budget=assist.budget, decided_by=decided_by)
    return host._result(assist.client_id, _analysis(host, result))


def _analysis(host: MetaToolHost, result: Json) -> Json:
    """analyze_task's result, with the suite's services that cannot run marked (the ranking
    reads their words, and may recommend one: the client is told it is unavailable, and why)."""
    return _structured({**result, "unavailable": host.catalog.unavailable()})


def _structured(content: Json) -> Json:
    """A CallToolResult carrying ``content`` as structured content and as its JSON text."""
    text = encoder.encode(content).decode()
    return {"content": [{"type": "text", "text": text}], "structuredContent": content}
