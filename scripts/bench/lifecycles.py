"""The container lifecycles part of the benchmark: its services, systems and figures.

One orchestrator serves copies of the bundled ``time`` service under other names and
strategies; one ``tools/call get_current_time`` is measured on each system, the systems
interleaved round by round (see ``Harness.lifecycles`` in scripts/bench.py). What the issue
judges: with the warm pool, the P95 of (fresh call - reused call), paired by round, ≤ 30 ms; and
a ``docker run -i --rm`` per call at least 20 times slower than a pooled fresh call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .stats import Json, ratio, spread, summarize

# Copies of `time`: name → (container_strategy, warm). The relay's pooled copy is its own
# service: the relay replays its client's `initialize`, so it never takes a container the pool
# greeted for /mcp, and sharing one service would make the two endpoints take each other's
# pool away (see "Greeted, for fresh_per_call" in docs/USAGE.md).
SERVICES = {
    "time-fresh": ("fresh_per_call", 1),
    "time-fresh-cold": ("fresh_per_call", 0),
    "time-relay-fresh": ("fresh_per_call", 1),
}
# system → (endpoint, service): "fabric" is /mcp (the tool `{service}__get_current_time`),
# "relay" /mcp/{service}, "docker_run" a `docker run -i --rm` per call (no orchestrator),
# "direct" the first call of a server started and greeted beforehand, spoken to over its
# container's own socket (no orchestrator): what a fresh server's first call costs by itself.
SYSTEMS = {
    "reused": ("fabric", "time"),
    "fresh_pooled": ("fabric", "time-fresh"),
    "fresh_unpooled": ("fabric", "time-fresh-cold"),
    "relay_reused": ("relay", "time"),
    "relay_fresh_pooled": ("relay", "time-relay-fresh"),
    "docker_run_per_call": ("docker_run", "time"),
    "direct_first_call": ("direct", "time"),
}
# Warmed up by one call before the rounds: the reused containers start, /mcp switches its pool's
# greetings on (see Harness._lifecycle_rounds). The others start from nothing on every call.
WARM_UP = ("reused", "fresh_pooled", "relay_reused", "relay_fresh_pooled")
# The added latency of a fresh container: (fresh, reused) on the same endpoint.
PAIRS = {
    "fabric_pooled": ("fresh_pooled", "reused"),
    "fabric_unpooled": ("fresh_unpooled", "reused"),
    "relay_pooled": ("relay_fresh_pooled", "relay_reused"),
    # What the orchestrator adds to a fresh server's own first call: the take, the hand-out.
    "fabric_pooled_over_first_call": ("fresh_pooled", "direct_first_call"),
}
# What a per-call gateway without a pool pays, as a multiple of a pooled fresh call.
RATIOS = {
    "docker_run_over_fresh_pooled": ("docker_run_per_call", "fresh_pooled"),
    "docker_run_over_relay_fresh_pooled": ("docker_run_per_call", "relay_fresh_pooled"),
    "fresh_unpooled_over_fresh_pooled": ("fresh_unpooled", "fresh_pooled"),
}
TARGET_ADDED_P95_MS = 30.0
TARGET_RATIO = 20.0

Round = dict[str, int]  # system → its call's round trip (ns); a system missing: no sample


def warm() -> dict[str, int]:
    return {name: count for name, (_, count) in SERVICES.items() if count}


def samples(rounds: list[Round], system: str) -> list[int]:
    return [r[system] for r in rounds if system in r]


def paired(rounds: list[Round], fresh: str, reused: str) -> list[int]:
    """``fresh - reused`` (ns) in every round that measured both."""
    return [r[fresh] - r[reused] for r in rounds if fresh in r and reused in r]


def figures(repeats: list[list[Round]]) -> Json:
    """Per system: every sample's figures and the spread of the repeats' P50 and P95; per pair:
    the paired difference's figures and its repeats' spread; per ratio: of P50 and of P95, over
    every sample and repeat by repeat; the two targets."""
    every = [r for rounds in repeats for r in rounds]
    out: Json = {"systems": {}, "added": {}, "ratios": {}}
    for name in SYSTEMS:
        stats = summarize(samples(every, name))
        stats["repeats"] = _repeats(repeats, functools.partial(samples, system=name))
        out["systems"][name] = stats
    for pair, (fresh, reused) in PAIRS.items():
        stats = summarize(paired(every, fresh, reused))
        stats["repeats"] = _repeats(repeats, functools.partial(paired, fresh=fresh, reused=reused))
        out["added"][pair] = {"fresh": fresh, "reused": reused, **stats}
    for key, (slow, fast) in RATIOS.items():
        systems = out["systems"]
        per_repeat = [
            (summarize(samples(rounds, slow)), summarize(samples(rounds, fast)))
            for rounds in repeats
        ]
        out["ratios"][key] = {
            "of": [slow, fast],
            **{
                f"ratio_{p}": ratio(systems[slow].get(f"{p}_ms"), systems[fast].get(f"{p}_ms"))
                for p in ("p50", "p95")
            },
            **{
                f"ratio_{p}_repeats": spread(
                    [ratio(s.get(f"{p}_ms"), f.get(f"{p}_ms")) for s, f in per_repeat]
                )
                for p in ("p50", "p95")
            },
        }
    added = out["added"]["fabric_pooled"].get("p95_ms")
    times = out["ratios"]["docker_run_over_fresh_pooled"].get("ratio_p50")
    out["targets"] = {
        "added_p95_ms": added,
        "added_p95_target_ms": TARGET_ADDED_P95_MS,
        "added_met": None if added is None else added <= TARGET_ADDED_P95_MS,
        "ratio": times,
        "ratio_target": TARGET_RATIO,
        "ratio_met": None if times is None else times >= TARGET_RATIO,
    }
    return out


def _repeats(repeats: list[list[Round]], of: Callable[[list[Round]], list[int]]) -> Json:
    """The spread of each repeat's P50 and P95 of ``of(rounds)``."""
    stats = [summarize(of(rounds)) for rounds in repeats]
    return {key: spread([s.get(key) for s in stats]) for key in ("p50_ms", "p95_ms")}
