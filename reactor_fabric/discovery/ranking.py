"""Ranking services for a task, and tools for a query, over a :class:`.DiscoveryIndex`.

:func:`rank_servers` answers ``analyze_task``:

1. **Score** every service: its BM25F score for the task's terms plus its best tool's score.
2. **Choose a set**, greedily: the best service first; then another joins when it explains
   enough of the task that the chosen ones do not (its evidence beyond theirs is at least
   ``join_share`` of the first one's score) and it is the best, or nearly, at one of those
   terms (a second domain, not a weaker copy of the first). At most :data:`MAX_SET`.
3. **Dependencies**: a chosen service brings the services it ``requires`` (transitively).
4. **Budget**: with a token budget, services are taken in that order while their tools'
   definitions fit; one that does not fit is left out and said so.
5. **Confidence**: the probability that the set is exactly right, from a logistic model of
   the ranking's margins (:mod:`.calibration`, fitted on the evaluation's tuning half).

:func:`find_tools` ranks tools: a tool's own score plus a share of its service's.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from .calibration import Calibration, default_calibration
from .index import DiscoveryIndex, ToolRef
from .text import compounds, query_terms

MAX_SET = 3
MAX_EVIDENCE = 4  # terms named in the reasoning per service
CANDIDATES = 8  # the set is chosen among the first ones
WITH_EVIDENCE = 5  # how many of the ranked carry their evidence and best tool
MAX_RANKED = 20  # how many matching services a ranking lists by default
SERVICE_SHARE_IN_TOOLS = 0.3  # find_tools: how much a tool's service's score adds


@dataclass(frozen=True)
class ServerScore:
    name: str
    score: float
    evidence: tuple[str, ...]  # "word (where)" items, strongest first
    best_tool: str | None


@dataclass(frozen=True)
class ServerRanking:
    task: str
    recommended: tuple[str, ...]
    ranked: tuple[ServerScore, ...]  # the first matching services, best first
    confidence: float
    reasoning: str
    estimated_tokens: dict[str, int] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()  # chosen, but over the budget
    features: tuple[float, ...] = ()  # what the confidence was computed from

    @property
    def alternatives(self) -> tuple[str, ...]:
        chosen = set(self.recommended)
        return tuple(s.name for s in self.ranked if s.name not in chosen)


@dataclass(frozen=True)
class ToolHit:
    tool: ToolRef
    service: str
    score: float


def _query(index: DiscoveryIndex, text: str) -> list[str]:
    """The terms a text is ranked by: its own, and its adjacent words written together where
    the catalog has that word ("check out" finds git_checkout)."""
    found = query_terms(text)
    found += [c for c in compounds(text) if c in index.idf and c not in found]
    return found


class _Scores:
    """One query's scores: the services' and the tool slots' that any of its terms hit (a
    position absent scores 0), with each candidate's per-term evidence read on demand (only
    the few services the set is chosen among).

    Sparse sums in term order — the same additions, in the same order, as the dense vectors
    this was once written with, so the scores and the ties' order are theirs. A query touches
    the postings of its few terms only, never the whole catalog."""

    def __init__(self, index: DiscoveryIndex, query: list[str]) -> None:
        self.index = index
        self.query = query
        services: dict[int, float] = {}
        slots: dict[int, float] = {}
        for term in query:
            # (Inlined, not a helper per term: this loop is the ranking's hot path. The first
            # postings are copied whole, in C: 0.0 + x is x.)
            for into, hits in (
                (services, index.service_postings.get(term)),
                (slots, index.tool_postings.get(term)),
                (services, index.name_postings.get(term)),
            ):
                if not hits:
                    continue
                if not into:
                    into.update(hits)
                    continue
                get = into.get
                for position, value in hits.items():
                    into[position] = get(position, 0.0) + value
        self.slots = slots
        # Each service's best tool: its score (a slot present here scores above 0) and its
        # slot, the first of equals as an argmax over the service's slots would choose.
        best: dict[int, float] = {}
        best_slots: dict[int, int] = {}
        owners = index.slot_services
        for slot, value in slots.items():
            owner = owners[slot]
            current = best.get(owner)
            if (
                current is None
                or value > current
                or (value == current and slot < best_slots[owner])
            ):
                best[owner] = value
                best_slots[owner] = slot
        self._best_slots = best_slots
        weight = index.weights.best_tool
        self.total = {
            position: services.get(position, 0.0) + weight * best.get(position, 0.0)
            for position in services.keys() | best.keys()
        }
        self._per_term: dict[int, dict[str, float]] = {}

    def first(self, count: int) -> list[int]:
        """The ``count`` best matching services, best first; ties in the suite's order."""
        return [
            position
            for _, position in heapq.nsmallest(
                count, ((-total, position) for position, total in self.total.items() if total > 0.0)
            )
        ]

    def score(self, position: int) -> float:
        return self.total.get(position, 0.0)

    def best_slot(self, position: int) -> int | None:
        return self._best_slots.get(position)

    def best_tool(self, position: int) -> str | None:
        slot = self.best_slot(position)
        return None if slot is None else self.index.tools[self.index.slot_tools[slot]].name

    def per_term(self, position: int) -> dict[str, float]:
        """How much each term of the query gave the service (its own text and best tool's)."""
        cached = self._per_term.get(position)
        if cached is not None:
            return cached
        index = self.index
        slot = self.best_slot(position)
        weight = index.weights.best_tool
        found: dict[str, float] = {}
        for term in self.query:
            value = index.service_postings.get(term, {}).get(position, 0.0)
            value += index.name_postings.get(term, {}).get(position, 0.0)
            if slot is not None:
                value += weight * index.tool_postings.get(term, {}).get(slot, 0.0)
            if value > 0.0:
                found[term] = value
        self._per_term[position] = found
        return found


def rank_servers(
    index: DiscoveryIndex,
    task: str,
    *,
    budget: int | None = None,
    calibration: Calibration | None = None,
    top: int = MAX_RANKED,
) -> ServerRanking:
    """The services ``task`` needs (see the module), and the ``top`` matching ones ranked."""
    scored = _Scores(index, _query(index, task))
    # As far as anything reads: the ranked, the candidates and those after them (_features).
    order = scored.first(max(top, CANDIDATES + MAX_SET))
    ranked = tuple(
        ServerScore(
            name=index.services[p].name,
            score=round(scored.score(p), 4),
            # The evidence of the first few only: nobody reads the twentieth's.
            evidence=_evidence(index, p, scored.per_term(p)) if rank < WITH_EVIDENCE else (),
            best_tool=scored.best_tool(p) if rank < WITH_EVIDENCE else None,
        )
        # Never fewer than the candidates: the chosen set is among them.
        for rank, p in enumerate(order[: max(top, CANDIDATES)])
    )
    if not order:
        return ServerRanking(
            task, (), (), 0.0, "no server's name, description or tools match the task"
        )
    chosen = _choose(index, scored, order)
    with_required = _with_requirements(index, chosen)
    recommended, left_out = _within_budget(index, with_required, budget)
    calibration = calibration or default_calibration()
    features = _features(index, scored, order, chosen)
    confidence = calibration.confidence(features)
    ranked_in = {index.services[p].name for p in chosen}
    reasons = []
    for name in recommended:
        if name in ranked_in:
            position = index.positions[name]
            evidence = _evidence(index, position, scored.per_term(position))
            reasons.append(f"{name}: {', '.join(evidence) or 'matched'}")
        else:
            required_by = [
                c for c in recommended if name in index.services[index.positions[c]].requires
            ]
            reasons.append(f"{name}: required by {', '.join(required_by) or 'the chosen servers'}")
    reasons += [
        f"{name} left out: its tools take {index.tokens_of([name])} tokens, over the budget"
        for name in left_out
    ]
    return ServerRanking(
        task=task,
        recommended=tuple(recommended),
        ranked=ranked,
        confidence=confidence,
        reasoning="; ".join(reasons),
        estimated_tokens={name: index.tokens_of([name]) for name in recommended},
        left_out=tuple(left_out),
        features=features,
    )


def with_choice(
    index: DiscoveryIndex, ranking: ServerRanking, names: list[str], *, budget: int | None, why: str
) -> ServerRanking:
    """``ranking`` with its set replaced by ``names`` (another judge's choice, e.g. the
    client's model): their requirements and the budget apply as to the ranking's own."""
    chosen = [index.positions[n] for n in names if n in index.positions]
    recommended, left_out = _within_budget(index, _with_requirements(index, chosen), budget)
    return replace(
        ranking,
        recommended=tuple(recommended),
        reasoning=f"{why}; ranking's evidence: {ranking.reasoning}",
        estimated_tokens={name: index.tokens_of([name]) for name in recommended},
        left_out=tuple(left_out),
    )


def _choose(index: DiscoveryIndex, scored: _Scores, order: list[int]) -> list[int]:
    weights = index.weights
    candidates = order[:CANDIDATES]
    first = candidates[0]
    chosen = [first]
    covered = dict(scored.per_term(first))
    top = scored.score(first)
    # The strongest evidence any candidate has for each term.
    strongest: dict[str, float] = {}
    for position in candidates:
        for term, value in scored.per_term(position).items():
            strongest[term] = max(strongest.get(term, 0.0), value)
    while len(chosen) < MAX_SET:
        best_gain, best_position = 0.0, None
        for position in candidates:
            if position in chosen:
                continue
            gain = 0.0
            leads = False
            for term, value in scored.per_term(position).items():
                extra = value - covered.get(term, 0.0)
                if extra > 0.0:
                    gain += extra
                    if (
                        value >= weights.join_lead * strongest[term]
                        and covered.get(term, 0.0) < 0.5 * value
                    ):
                        leads = True
            if leads and gain > best_gain:
                best_gain, best_position = gain, position
        if best_position is None or best_gain < weights.join_share * top:
            break
        chosen.append(best_position)
        for term, value in scored.per_term(best_position).items():
            covered[term] = max(covered.get(term, 0.0), value)
    return chosen


def _with_requirements(index: DiscoveryIndex, chosen: list[int]) -> list[str]:
    """The chosen services' names, each followed by what it requires (transitively, once)."""
    names: list[str] = []
    for position in chosen:
        name = index.services[position].name
        names += [n for n in (name, *_requirements(index, name)) if n not in names]
    return names


def _within_budget(
    index: DiscoveryIndex, names: list[str], budget: int | None
) -> tuple[list[str], list[str]]:
    if budget is None:
        return names, []
    kept: list[str] = []
    left_out: list[str] = []
    spent = 0
    for name in names:
        group = [name, *_requirements(index, name)]
        cost = index.tokens_of(s for s in dict.fromkeys(group) if s not in kept)
        if spent + cost <= budget:
            kept.extend(s for s in dict.fromkeys(group) if s not in kept)
            spent += cost
        else:
            left_out.append(name)
    return kept, [n for n in left_out if n not in kept]


def _requirements(index: DiscoveryIndex, name: str) -> list[str]:
    """What ``name`` requires, transitively, depth first in the suite's order; each once,
    never ``name`` itself (requirements may form a cycle)."""
    found: list[str] = []

    def walk(current: str) -> None:
        for required in index.services[index.positions[current]].requires:
            if required != name and required not in found and required in index.positions:
                found.append(required)
                walk(required)

    walk(name)
    return found


def _features(
    index: DiscoveryIndex, scored: _Scores, order: list[int], chosen: list[int]
) -> tuple[float, ...]:
    """What the confidence is computed from (see :mod:`.calibration`); ``order``: the
    matching services, best first (at least the candidates and :data:`MAX_SET` more)."""
    first = scored.score(order[0])
    unchosen = [scored.score(p) for p in order[: CANDIDATES + MAX_SET] if p not in chosen]
    runner_up = unchosen[0] if unchosen else 0.0
    query = scored.query
    known = [t for t in query if t in index.idf]
    mass = sum(index.idf[t] for t in known) or 1.0
    explained = {t for p in chosen for t in scored.per_term(p)}
    coverage = sum(index.idf[t] for t in known if t in explained) / mass
    last = scored.score(chosen[-1])
    return (
        math.log1p(first),  # how strong the evidence is at all
        first / (first + runner_up),  # how far the set stands above the rest
        last / (last + runner_up),
        coverage,  # how much of the task's (known) words the set explains
        len(known) / max(1, len(query)),  # how much of the task the catalog knows at all
        float(len(chosen) > 1),
    )


def _evidence(index: DiscoveryIndex, position: int, per_term: dict[str, float]) -> tuple[str, ...]:
    strongest = sorted(per_term.items(), key=lambda item: -item[1])[:MAX_EVIDENCE]
    described = []
    for term, _ in strongest:
        where = index.fields.get(term, {}).get(position, "tool")
        label = {"name": "name", "about": "description", "tool_text": "tools"}.get(where, "tools")
        described.append(f"{term} ({label})")
    return tuple(described)


def find_tools(
    index: DiscoveryIndex,
    query: str,
    *,
    limit: int = 10,
    services: Iterable[str] | None = None,
) -> list[ToolHit]:
    """Tools for ``query``, best first: a tool's own score plus a share of its service's."""
    wanted = (
        None if services is None else {index.positions[s] for s in services if s in index.positions}
    )
    scored = _Scores(index, _query(index, query))
    totals, owners, tools = scored.total, index.slot_services, index.slot_tools
    combined = {
        slot: value + SERVICE_SHARE_IN_TOOLS * totals.get(owners[slot], 0.0)
        for slot, value in scored.slots.items()
        if value > 0.0 and tools[slot] >= 0 and (wanted is None or owners[slot] in wanted)
    }
    best = [
        slot for _, slot in heapq.nsmallest(max(0, limit), ((-v, s) for s, v in combined.items()))
    ]
    return [
        ToolHit(
            index.tools[index.slot_tools[slot]],
            index.services[index.slot_services[slot]].name,
            round(combined[slot], 4),
        )
        for slot in best
    ]
