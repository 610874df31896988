"""The fabric endpoint's own tools (meta-tools), without I/O: one registry, name → definition
and handler.

Each meta-tool is one function here, registered with its definition (name, description, input
schema) by :func:`meta_tool`: the endpoint lists the definitions in this file's order (before
the services' tools) and calls the handler for a ``tools/call`` of its name. A handler gets what
it may see of the session — a :class:`MetaContext`, a frozen value the server makes for the
call: its catalog and ranking index, the services it shows (its exposure and active services),
the client's kind, the suite's settings (:class:`MetaSettings`) and a view of its containers —
and the request's ``arguments`` (an object, ``{}`` when the client sent none) and whole
``params``. It changes nothing: it returns what the client is to get, a :data:`MetaOutcome` —
an :class:`Answer` (with, for ``activate_servers`` and ``switch_context``, the session's active
services from then on), a :class:`Refusal`, a :class:`Question` for the client's model
(``analyze_task``'s model assist, answered later: :class:`Assists` keeps those that wait), or,
for ``call_tool``, a :class:`CallByName` that the server routes as the call it names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._reasons import SERVICE_NOT_FOUND
from ..discovery import DiscoveryIndex
from ..discovery.ranking import ServerRanking, with_choice
from .catalog import Catalog
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
from .fabric_messages import encoder
from .mcp import INVALID_PARAMS

Json = dict[str, Any]
Exposure = Literal["discover", "all"]

FIND_LIMIT = 10
MAX_FIND_LIMIT = 50


@dataclass(frozen=True)
class MetaSettings:
    """What the suite says that the meta-tools read, the same for the session's whole life."""

    facts: Mapping[str, ServiceFacts]
    profiles: Mapping[str, Sequence[str]]
    token_budget: int | None
    assist: AssistSettings
    count_tokens: Callable[[Json], int]


@dataclass(frozen=True)
class Containers:
    """What get_status shows of the session: its id, age and containers."""

    session_id: str
    uptime: float
    live: tuple[Json, ...]  # each backend counted on: its server and state
    recent: tuple[Json, ...]  # which container served which call (see .served)


@dataclass(frozen=True)
class MetaContext:
    """What a meta-tool sees of its session, at the call."""

    catalog: Catalog
    index: DiscoveryIndex
    exposure: Exposure
    active: tuple[str, ...]
    stateless: bool  # a 2026-07-28 client: its lists change only when it reconnects
    sampling: bool  # the client declared sampling (its model may be asked)
    now: float
    settings: MetaSettings
    containers: Containers

    def listed_tools(self, active: Sequence[str] | None = None) -> list[Json]:
        """The session's tools/list (with ``active`` services, if given)."""
        return listed_tools(self.catalog, self.exposure, self.active if active is None else active)


@dataclass(frozen=True)
class Answer:
    """The call's result; ``active``: the session's active services from now on."""

    result: Json
    active: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Refusal:
    """The call is refused with this JSON-RPC error."""

    code: int
    message: str


@dataclass(frozen=True)
class Assist:
    """An analyze_task waiting for the client's model to choose among candidates."""

    client_id: object
    ranking: ServerRanking
    candidates: tuple[str, ...]
    budget: int | None
    deadline: float


@dataclass(frozen=True)
class Question:
    """Ask the client's model (``sampling/createMessage`` with ``params``); the call is
    answered once it chose, or did not (see :class:`Assists`)."""

    params: Json
    ranking: ServerRanking
    candidates: tuple[str, ...]
    budget: int | None
    deadline: float


@dataclass(frozen=True)
class CallByName:
    """call_tool: the call goes to the tool ``name`` with these ``params``."""

    name: object
    params: Json


MetaOutcome = Answer | Refusal | Question | CallByName
Handler = Callable[[MetaContext, Json, Json], MetaOutcome]


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


def shown(catalog: Catalog, exposure: Exposure, active: Sequence[str]) -> list[str]:
    """The services whose tools, prompts and resources the session lists."""
    return list(catalog.services) if exposure == "all" else list(active)


def listed_tools(catalog: Catalog, exposure: Exposure, active: Sequence[str]) -> list[Json]:
    """The session's tools/list: the meta-tools, then the shown services' tools."""
    return [*META_DEFINITIONS, *catalog.tools_of(shown(catalog, exposure, active))]


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
def _find_tools(session: MetaContext, arguments: Json, _params: Json) -> MetaOutcome:
    query = str(arguments.get("query", ""))
    limit = arguments.get("limit", FIND_LIMIT)
    limit = max(1, min(MAX_FIND_LIMIT, limit if isinstance(limit, int) else FIND_LIMIT))
    unavailable = session.catalog.unavailable()
    tools = found_tools(session.index, query, limit)
    for tool in tools:
        # A tool known from its service's last learning, but the service cannot run now.
        if tool["server"] in unavailable:
            tool["unavailable"] = unavailable[tool["server"]]
    result = {"tools": tools, "unavailable": unavailable}
    return Answer(_structured(result))


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
def _call_tool(_session: MetaContext, arguments: Json, params: Json) -> MetaOutcome:
    target = arguments.get("name")
    # Models often nest a tool's arguments as "parameters": both are accepted.
    inner = arguments.get("arguments", arguments.get("parameters", {}))
    if not isinstance(inner, dict):
        inner = {}
    if target in META_TOOLS:
        return Refusal(INVALID_PARAMS, "call_tool calls a server's tool")
    # The outer request's _meta (its progressToken) goes along.
    return CallByName(target, {**params, "arguments": inner})


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
def _activate(session: MetaContext, arguments: Json, _params: Json) -> MetaOutcome:
    wanted = arguments.get("servers")
    if not isinstance(wanted, list):
        return Refusal(INVALID_PARAMS, "servers must be a list of names")
    # A service of the suite whose learning failed (its image missing, say) is not activated:
    # it is answered in failed with why, as an unknown name is, rather than shown as working.
    catalog = session.catalog
    unavailable = catalog.unavailable()
    known = [
        s for s in wanted if isinstance(s, str) and s in catalog.services and s not in unavailable
    ]
    failed = [_not_activated(s, unavailable) for s in wanted if s not in known]
    chosen = set(known) | (set() if arguments.get("deactivate_others") else set(session.active))
    active = _active(catalog, chosen)
    result = _structured(
        {
            "activated": known,
            "failed": failed,
            "reconnect_required": session.stateless,
            "estimated_tools_count": len(session.listed_tools(active)),
        }
    )
    return Answer(result, active)


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
def _status(session: MetaContext, _arguments: Json, _params: Json) -> MetaOutcome:
    catalog, containers = session.catalog, session.containers
    status = {
        "session_id": containers.session_id,
        "active_servers": list(session.active),
        "total_tools": len(catalog.tools),
        # (a fresh_per_call service has one per call in flight)
        "containers": list(containers.live),
        # Which container served which call: live ones and the last ended ones (bounded).
        "recent_containers": list(containers.recent),
        "catalog_errors": catalog.errors(),
        # The services that cannot run now, each with its error and reason (a secret or an
        # account missing, an image refused, a probe failed).
        "unavailable": catalog.unavailable(),
        "uptime": round(containers.uptime, 3),
        "tool_tokens": tool_tokens(
            session.index,
            shown(catalog, session.exposure, session.active),
            META_DEFINITIONS if session.exposure == "discover" else (),
            session.settings.count_tokens,
        ),
    }
    drift = catalog.lock_drift()
    if drift:  # (the suite lock: what differs from it, per service; absent without any)
        status["lock_drift"] = drift
    return Answer(_structured(status))


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
def _analyze(session: MetaContext, arguments: Json, _params: Json) -> MetaOutcome:
    """Rank the suite's servers for a task (:mod:`reactor_fabric.discovery`); when the ranking
    is unsure and the suite allows it, ask the client's model to choose (see :class:`Assists`)."""
    ranking, budget = analyze(session.index, arguments, session.settings.token_budget)
    settings = session.settings.assist
    if (
        settings.enabled
        and session.sampling
        and ranking.confidence < settings.below_confidence
        and len(ranking.ranked) >= 2
    ):
        params, candidates = assist_request(ranking, session.index, settings.candidates)
        deadline = session.now + settings.timeout
        return Question(params, ranking, tuple(candidates), budget, deadline)
    return Answer(_analysis(session.catalog, analysis(ranking, budget=budget)))


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
def _capability_list(session: MetaContext, arguments: Json, _params: Json) -> MetaOutcome:
    wanted = arguments.get("category_filter")
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for service in session.catalog.services:
        facts = session.settings.facts.get(service, ServiceFacts())
        for category in facts.categories or ("other",):
            servers, tasks = groups.setdefault(category, ([], []))
            servers.append(service)
            tasks.extend(facts.example_tasks)
    listed = [
        {"category": category, "servers": servers, "example_tasks": tasks}
        for category, (servers, tasks) in groups.items()
        if not isinstance(wanted, str) or wanted.lower() in category.lower()
    ]
    result = {"capabilities": listed, "unavailable": session.catalog.unavailable()}
    return Answer(_structured(result))


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
def _switch(session: MetaContext, arguments: Json, _params: Json) -> MetaOutcome:
    profile = arguments.get("profile")
    add = arguments.get("add_servers", [])
    remove = arguments.get("remove_servers", [])
    catalog, profiles = session.catalog, session.settings.profiles
    if not isinstance(add, list) or not isinstance(remove, list):
        return Refusal(INVALID_PARAMS, "servers must be lists of names")
    if profile is not None and profile not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        return Refusal(INVALID_PARAMS, f"unknown profile {profile!r} (profiles: {known})")
    unknown_servers = [s for s in [*add, *remove] if s not in catalog.services]
    if unknown_servers:
        return Refusal(INVALID_PARAMS, f"unknown servers {unknown_servers}")
    chosen = set(profiles[profile]) if profile is not None else set(session.active)
    chosen = (chosen | set(add)) - set(remove)
    # As activate_servers: a service that cannot run is not made active, and is named with why.
    unavailable = catalog.unavailable()
    failed = [
        _not_activated(s, unavailable) for s in catalog.services if s in chosen and s in unavailable
    ]
    active = _active(catalog, chosen - set(unavailable))
    result = _structured(
        {
            "new_configuration": {
                "profile": profile,
                "active_servers": list(active),
                "tools_count": len(session.listed_tools(active)),
            },
            "failed": failed,
            "reconnect_required": session.stateless,
        }
    )
    return Answer(result, active)


# What tools/list shows of the meta-tools, in the order they are registered above.
META_DEFINITIONS: tuple[Json, ...] = tuple(tool.definition for tool in META_TOOLS.values())
META_NAMES = frozenset(META_TOOLS)


def _active(catalog: Catalog, chosen: set[str]) -> tuple[str, ...]:
    """The active services ``chosen``, in the suite's order."""
    return tuple(s for s in catalog.services if s in chosen)


def _analysis(catalog: Catalog, result: Json) -> Json:
    """analyze_task's result, with the suite's services that cannot run marked (the ranking
    reads their words, and may recommend one: the client is told it is unavailable, and why)."""
    return _structured({**result, "unavailable": catalog.unavailable()})


class Assists:
    """The analyze_task calls waiting for the client's model, by the id of the question it was
    asked (:class:`Question`), until it answers or :attr:`Assist.deadline` comes."""

    def __init__(self) -> None:
        self.waiting: dict[int, Assist] = {}

    def ask(self, our_id: int, client_id: object, question: Question) -> bytes:
        """The call ``client_id`` waits for the model, asked under ``our_id``: the request."""
        self.waiting[our_id] = Assist(
            client_id, question.ranking, question.candidates, question.budget, question.deadline
        )
        request = {
            "jsonrpc": "2.0",
            "id": our_id,
            "method": "sampling/createMessage",
            "params": question.params,
        }
        return encoder.encode(request)

    def waits_on(self, client_id: object) -> bool:
        return any(assist.client_id == client_id for assist in self.waiting.values())

    def deadlines(self) -> list[float]:
        return [assist.deadline for assist in self.waiting.values()]

    def expired(self, now: float) -> list[tuple[int, Assist]]:
        """The calls whose model did not answer in time (no longer waiting)."""
        due = [(our_id, a) for our_id, a in self.waiting.items() if a.deadline <= now]
        for our_id, _assist in due:
            del self.waiting[our_id]
        return due

    def end(self) -> list[Assist]:
        """The session ends: every call still waiting."""
        ended = list(self.waiting.values())
        self.waiting.clear()
        return ended

    def clone(self) -> Assists:
        twin = Assists()
        twin.waiting = dict(self.waiting)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return tuple(sorted(((i, repr(a)) for i, a in self.waiting.items())))


def assisted(index: DiscoveryIndex, catalog: Catalog, assist: Assist, message: Json) -> Json:
    """The client's model answered an analyze_task's question (or refused): the call's result,
    with its choice among the candidates, or the ranking's own when it chose none of them."""
    chosen = assist_choice(message.get("result"), assist.candidates)
    if not chosen:
        refused = "refused" if "error" in message else "chose none of the candidates"
        return assist_analysis(catalog, assist, f"ranking (the client's model {refused})")
    why = f"chosen by the client's model among {', '.join(assist.candidates)}"
    ranking = with_choice(index, assist.ranking, chosen, budget=assist.budget, why=why)
    return _analysis(catalog, analysis(ranking, budget=assist.budget, decided_by="client_model"))


def assist_analysis(catalog: Catalog, assist: Assist, decided_by: str) -> Json:
    """An analyze_task's result with the ranking's own choice (the model did not choose)."""
    return _analysis(catalog, analysis(assist.ranking, budget=assist.budget, decided_by=decided_by))


def _structured(content: Json) -> Json:
    """A CallToolResult carrying ``content`` as structured content and as its JSON text."""
    text = encoder.encode(content).decode()
    return {"content": [{"type": "text", "text": text}], "structuredContent": content}
