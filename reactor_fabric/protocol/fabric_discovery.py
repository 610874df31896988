"""The fabric endpoint's discovery answers — ``analyze_task``, ``find_tools``, the token
figures of ``get_status`` — and the model assist of ``analyze_task``, without I/O.

The ranking itself is :mod:`reactor_fabric.discovery`; this module feeds it the session's
catalog and the suite's words about each service, and shapes what it found into the tools'
results.

Model assist. When the suite enables it, the client declared ``sampling`` and the ranking's
confidence is below the threshold, ``analyze_task`` asks the client's own model
(``sampling/createMessage``) to choose among the top candidates: :func:`assist_request` builds
the request, :func:`assist_choice` reads the answer. Whatever the model says, only names among
the candidates count; an empty, malformed or refused answer leaves the ranking's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..discovery import DiscoveryIndex, ServerRanking, ServiceText, build_index, find_tools, tokens
from ..discovery.ranking import rank_servers
from ..discovery.tokens import count_definition
from .catalog import Catalog, shown_name

Json = dict[str, Any]
MAX_TASK_CHARS = 4000  # a task is a sentence or a paragraph; longer is cut before ranking
ASSIST_MAX_TOKENS = 200


@dataclass(frozen=True)
class ServiceFacts:
    """What the suite says about a service, for ranking and the capability list."""

    description: str = ""
    categories: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    example_tasks: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()


@dataclass(frozen=True)
class AssistSettings:
    enabled: bool = False
    below_confidence: float = 0.5
    timeout: float = 20.0
    candidates: int = 5


def service_texts(catalog: Catalog, facts: Mapping[str, ServiceFacts]) -> list[ServiceText]:
    """Every service of ``catalog``, in the suite's order, as the ranking reads it."""
    texts = []
    for name, offer in catalog.services.items():
        known = facts.get(name, ServiceFacts())
        texts.append(
            ServiceText(
                name=name,
                description=known.description,
                keywords=known.keywords,
                categories=known.categories,
                example_tasks=known.example_tasks,
                requires=known.requires,
                tools=offer.tools,
            )
        )
    return texts


def index_catalog(
    catalog: Catalog,
    facts: Mapping[str, ServiceFacts],
    count_tokens: Callable[[Json], int] = count_definition,
) -> DiscoveryIndex:
    """The ranking index of a session's catalog. Token counts are of each definition as its
    service lists it (the shown name and ``[service]`` prefix add a few tokens per tool)."""
    with tokens.held():  # one load of the encoding for the whole catalog, dropped after
        return build_index(service_texts(catalog, facts), count_tokens=count_tokens)


def task_text(arguments: Json) -> str:
    hints = arguments.get("context_hints")
    hints_text = " ".join(str(h) for h in hints) if isinstance(hints, list) else ""
    return f"{arguments.get('task_description', '')} {hints_text}"[:MAX_TASK_CHARS]


def budget_of(arguments: Json, default: int | None) -> int | None:
    budget = arguments.get("budget")
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        return budget
    return default


def analysis(ranking: ServerRanking, *, budget: int | None, decided_by: str = "ranking") -> Json:
    """``analyze_task``'s structured result."""
    return {
        "recommended_servers": list(ranking.recommended),
        "alternative_servers": list(ranking.alternatives),
        "confidence": ranking.confidence,
        "reasoning": ranking.reasoning,
        "estimated_tokens": dict(ranking.estimated_tokens),
        "budget": budget,
        "left_out_over_budget": list(ranking.left_out),
        "decided_by": decided_by,
        "scores": {s.name: s.score for s in ranking.ranked},
    }


def analyze(
    index: DiscoveryIndex, arguments: Json, default_budget: int | None
) -> tuple[ServerRanking, int | None]:
    budget = budget_of(arguments, default_budget)
    return rank_servers(index, task_text(arguments), budget=budget), budget


def found_tools(index: DiscoveryIndex, query: str, limit: int) -> list[Json]:
    """``find_tools``' list: each tool under its shown name, with its server and schema."""
    return [
        {
            "name": shown_name(hit.service, hit.tool.name),
            "server": hit.service,
            "description": hit.tool.description,
            "inputSchema": hit.tool.definition.get("inputSchema", {"type": "object"}),
            "score": hit.score,
        }
        for hit in find_tools(index, query[:MAX_TASK_CHARS], limit=limit)
    ]


def tool_tokens(
    index: DiscoveryIndex,
    shown: Sequence[str],
    meta_tools: Sequence[Json],
    count_tokens: Callable[[Json], int] = count_definition,
) -> Json:
    """``get_status.tool_tokens``: what this session's tool list costs vs. every tool."""
    meta = sum(count_tokens(tool) for tool in meta_tools)
    exposed = meta + index.tokens_of(shown)
    everything = index.all_tokens
    saved = 1.0 - exposed / everything if everything else 0.0
    return {
        "exposed": exposed,
        "all": everything,
        "saved_ratio": round(saved, 3),
        "tokenizer": tokens.method(),
    }


def assist_request(
    ranking: ServerRanking, index: DiscoveryIndex, candidates: int
) -> tuple[Json, list[str]]:
    """The ``sampling/createMessage`` params asking the client's model to choose, and the
    candidates it may choose among."""
    names = [s.name for s in ranking.ranked[:candidates]]
    lines = []
    for name in names:
        service = index.services[index.positions[name]]
        tools = ", ".join(str(t.get("name")) for t in service.tools[:12])
        about = service.description or "(no description)"
        lines.append(f"- {name}: {about} Tools: {tools}")
    prompt = (
        "Which of these MCP servers does the task below need? Answer with a JSON array of "
        "server names only (one, or several if the task spans several of them), e.g. "
        f'["{names[0]}"].\n\nServers:\n' + "\n".join(lines) + f"\n\nTask: {ranking.task.strip()}"
    )
    params = {
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "systemPrompt": "You route developer tasks to tool servers. Reply with JSON only.",
        "maxTokens": ASSIST_MAX_TOKENS,
        "temperature": 0,
        "includeContext": "none",
    }
    return params, names


_ARRAY = re.compile(r"\[[^\[\]]*\]")


def assist_choice(result: object, candidates: Sequence[str]) -> list[str]:
    """The candidates the model chose, in its order ([] when it chose none of them)."""
    if not isinstance(result, dict):
        return []
    content = result.get("content")
    blocks = content if isinstance(content, list) else [content]
    text = " ".join(
        str(block.get("text", ""))
        for block in blocks
        if isinstance(block, dict) and block.get("type") == "text"
    )
    chosen: list[str] = []
    match = _ARRAY.search(text)
    if match is not None:
        try:
            parsed = json.loads(match.group(0))
        except ValueError:
            parsed = []
        if isinstance(parsed, list):
            chosen = [n for n in parsed if isinstance(n, str) and n in candidates]
    if not chosen:
        # A model that answered in words: the candidates it names, in its order.
        found = sorted(
            (text.find(n), n) for n in candidates if re.search(rf"\b{re.escape(n)}\b", text)
        )
        chosen = [n for _, n in found]
    return list(dict.fromkeys(chosen))
