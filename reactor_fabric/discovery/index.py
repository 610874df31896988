"""The ranking index: every service's and every tool's words, scored once, up front.

A catalog (:class:`ServiceText` per service) is indexed into per-term postings: for each term,
which services and which tools it scores for and how much (BM25F: term frequency per field,
weighted, length-normalised, saturated, times the term's rarity). A query is then a handful of
dictionary look-ups and additions — no pass over the catalog — which is what keeps a ranking
of a hundred services well under a millisecond.

Two levels, because both carry evidence on real catalogs:

- **services**: the name (weighted highest: a task that names a server means it), what the
  suite says about the service (description, keywords, categories, example tasks), and all of
  its tools' text together (weighted lowest; it carries the load when a service says little
  about itself);
- **tools**: each tool alone (its name's pieces, its description, its argument names), so a
  task that describes one tool's job well ("open a pull request") finds that tool's service
  even among services whose own text says little. A service's score adds its best tool's.

Pure: no I/O; token counts come in with the catalog (:mod:`.tokens`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .text import pieces, terms

Json = dict[str, Any]


@dataclass(frozen=True)
class ServiceText:
    """What the ranking knows of one service: the suite's words about it and its tools."""

    name: str
    description: str = ""
    keywords: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    example_tasks: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    tools: tuple[Json, ...] = ()  # as the service listed them (name, description, inputSchema)


@dataclass(frozen=True)
class Weights:
    """The ranking's parameters (chosen on the tuning half of the evaluation set)."""

    name: float = 4.0  # the service's name
    about: float = 3.0  # the suite's description, keywords, categories, example tasks
    tool_text: float = 0.25  # every tool's text, as one field of the service
    tool_name: float = 2.0  # within one tool: its name's pieces
    tool_description: float = 1.0
    tool_arguments: float = 0.5
    best_tool: float = 0.5  # how much a service's best tool adds to its score
    k1: float = 1.2
    b: float = 0.75
    # Rarity counts more than BM25's own idf says: a term's idf is raised to this power, so
    # one rare word ("gitlab") outweighs several common ones ("open", "project", "file").
    idf_power: float = 1.5
    # A task that names a service (or a word of its description that starts with its name,
    # "PostgreSQL" for postgres) means it: this many times the name's idf, outside BM25's
    # saturation, on top of the name field.
    name_bonus: float = 3.0
    # Sets: another service joins the recommended set when what it adds beyond the ones
    # chosen is at least this share of the first one's score…
    join_share: float = 0.35
    # … and it is the best, or nearly, at some term of the task.
    join_lead: float = 0.9


@dataclass(frozen=True)
class ToolRef:
    service: int  # index into DiscoveryIndex.services
    name: str  # the service's own name for it
    description: str
    definition: Json
    tokens: int


@dataclass
class DiscoveryIndex:
    """Postings of a catalog's terms, for :func:`.ranking.rank_servers` and
    :func:`.ranking.find_tools`.

    Tools live in *slots*, each service's contiguous (a service without tools has one empty
    slot), so that a service's tools are a range of slots. Each term's postings are one
    dictionary (position → score): a query adds the few postings of its terms — sparse, as
    most terms hit a handful of services — and reads one service's evidence from the same.

    No numpy: it was used here for vector additions and cost the orchestrator 12 MB resident
    (and an OpenBLAS thread pool) for sums over a few dozen postings per query, which plain
    dictionaries do as fast at these sizes (``make eval-discovery`` measures the latency).
    """

    services: tuple[ServiceText, ...]
    tools: tuple[ToolRef, ...]
    weights: Weights
    idf: Mapping[str, float]  # over services
    service_postings: Mapping[str, Mapping[int, float]]  # term → {service: score}
    tool_postings: Mapping[str, Mapping[int, float]]  # term → {slot: score}
    name_postings: Mapping[str, Mapping[int, float]]  # term → {service: its name bonus}
    slot_starts: tuple[int, ...]  # each service's first slot
    slot_tools: tuple[int, ...]  # each slot's tool (-1: a service's empty slot)
    slot_services: tuple[int, ...]  # each slot's service
    # Which of a service's fields hold a term (for the reasoning): term → {service: field}
    fields: Mapping[str, Mapping[int, str]]
    service_tokens: tuple[int, ...]  # tool-definition tokens of each service's tools
    positions: Mapping[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.positions = {text.name: i for i, text in enumerate(self.services)}

    @property
    def all_tokens(self) -> int:
        return sum(self.service_tokens)

    def tokens_of(self, names: Iterable[str]) -> int:
        return sum(self.service_tokens[self.positions[n]] for n in names if n in self.positions)


def build_index(
    services: Sequence[ServiceText],
    *,
    count_tokens: Callable[[Json], int],
    weights: Weights | None = None,
) -> DiscoveryIndex:
    """Index ``services`` (in the suite's order); ``count_tokens`` sizes a tool definition."""
    weights = weights or Weights()
    tools: list[ToolRef] = []
    service_fields: list[dict[str, Counter[str]]] = []
    tool_fields: list[dict[str, Counter[str]]] = []
    for position, service in enumerate(services):
        about = " ".join(
            [service.description, *service.keywords, *service.categories, *service.example_tasks]
        )
        everything: Counter[str] = Counter()
        for tool in service.tools:
            name = str(tool.get("name") or "")
            description = str(tool.get("description") or "")
            fields = {
                "tool_name": Counter(terms(name)),
                "tool_description": Counter(terms(description)),
                "tool_arguments": Counter(terms(" ".join(_arguments(tool)))),
            }
            for counts in fields.values():
                everything.update(counts)
            tool_fields.append(fields)
            tools.append(ToolRef(position, name, description, tool, count_tokens(tool)))
        service_fields.append(
            {
                "name": Counter(terms(service.name)),
                "about": Counter(terms(about)),
                "tool_text": everything,
            }
        )
    service_postings, idf = _bm25f(service_fields, weights)
    name_postings: dict[str, dict[int, float]] = {}
    for position, service in enumerate(services):
        for term in _name_terms(service):
            bonus = weights.name_bonus * idf.get(term, 0.0)
            if bonus > 0.0:
                name_postings.setdefault(term, {})[position] = bonus
    by_tool, _ = _bm25f(tool_fields, weights)
    slot_starts, slot_tools, slot_services = _slots(services)
    slot_of_tool = {tool: slot for slot, tool in enumerate(slot_tools) if tool >= 0}
    tool_postings = {
        term: {slot_of_tool[tool]: value for tool, value in hits.items()}
        for term, hits in by_tool.items()
    }
    where: dict[str, dict[int, str]] = {}
    for position, fields in enumerate(service_fields):
        for name in ("tool_text", "about", "name"):  # the last one written wins: the strongest
            for term in fields[name]:
                where.setdefault(term, {})[position] = name
    service_tokens = [0] * len(services)
    for ref in tools:
        service_tokens[ref.service] += ref.tokens
    return DiscoveryIndex(
        services=tuple(services),
        tools=tuple(tools),
        weights=weights,
        idf=idf,
        service_postings=service_postings,
        tool_postings=tool_postings,
        name_postings=name_postings,
        slot_starts=tuple(slot_starts),
        slot_tools=tuple(slot_tools),
        slot_services=tuple(slot_services),
        fields=where,
        service_tokens=tuple(service_tokens),
    )


MIN_NAME_PREFIX = 4


def _slots(services: Sequence[ServiceText]) -> tuple[list[int], list[int], list[int]]:
    """(each service's first slot, each slot's tool or -1, each slot's service): each
    service's tools in a row, one empty slot for a service without tools."""
    starts: list[int] = []
    tools: list[int] = []
    owners: list[int] = []
    next_tool = 0
    for position, service in enumerate(services):
        starts.append(len(tools))
        count = len(service.tools)
        tools.extend(range(next_tool, next_tool + count) if count else [-1])
        owners.extend([position] * max(1, count))
        next_tool += count
    return starts, tools, owners


def _name_terms(service: ServiceText) -> set[str]:
    """The service's name's terms, and its description's words that extend a piece of its
    name ("PostgreSQL" for postgres, "Kubernetes" for kubernetes) — how tasks name it."""
    named = set(terms(service.name))
    name_pieces = [p for p in pieces(service.name) if len(p) >= MIN_NAME_PREFIX]
    for word in pieces(service.description):
        if any(word.startswith(piece) for piece in name_pieces):
            named.update(terms(word))
    return named


def _bm25f(
    documents: Sequence[Mapping[str, Counter[str]]], weights: Weights
) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    """Per-term postings of BM25F scores over ``documents`` (each a set of named fields)."""
    count = len(documents)
    if not count:
        return {}, {}
    names = {name for document in documents for name in document}
    average = {
        name: max(1.0, sum(sum(d.get(name, Counter()).values()) for d in documents) / count)
        for name in names
    }
    frequency: Counter[str] = Counter()
    for document in documents:
        frequency.update({term for counts in document.values() for term in counts})
    idf = {
        term: math.log(1.0 + (count - df + 0.5) / (df + 0.5)) ** weights.idf_power
        for term, df in frequency.items()
    }
    postings: dict[str, dict[int, float]] = {}
    k1, b = weights.k1, weights.b
    for position, document in enumerate(documents):
        pseudo: dict[str, float] = {}
        for name, counts in document.items():
            weight = float(getattr(weights, name))
            norm = 1.0 - b + b * sum(counts.values()) / average[name]
            for term, tf in counts.items():
                pseudo[term] = pseudo.get(term, 0.0) + weight * tf / norm
        for term, weighted in pseudo.items():
            score = idf[term] * weighted / (k1 + weighted)
            postings.setdefault(term, {})[position] = score
    return postings, idf


def _arguments(tool: Json) -> list[str]:
    schema = tool.get("inputSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return [str(name) for name in properties] if isinstance(properties, dict) else []
