"""Figures: order statistics of latency samples, and the ``STATS`` / ``BURST`` shapes."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

Json = dict[str, Any]


def percentile(sorted_ms: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: a value that was really observed (no interpolation)."""
    if not sorted_ms:
        raise ValueError("no samples")
    rank = max(1, math.ceil(fraction * len(sorted_ms)))
    return sorted_ms[rank - 1]


def summarize(samples_ns: Sequence[int]) -> Json:
    """``STATS = {n, min_ms, p50_ms, p95_ms, p99_ms, max_ms}`` of nanosecond samples."""
    if not samples_ns:
        return {"error": "no sample was collected"}
    ms = sorted(sample / 1e6 for sample in samples_ns)
    return {
        "n": len(ms),
        "min_ms": round(ms[0], 3),
        "p50_ms": round(percentile(ms, 0.50), 3),
        "p95_ms": round(percentile(ms, 0.95), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(ms[-1], 3),
    }


def burst(*, ok: int, failed: int, first_response_ns: Sequence[int], containers_left: int) -> Json:
    """``BURST = {ok, failed, p50_first_response_ms, p95_first_response_ms, containers_left}``."""
    ms = sorted(sample / 1e6 for sample in first_response_ns)
    return {
        "ok": ok,
        "failed": failed,
        "p50_first_response_ms": round(percentile(ms, 0.50), 3) if ms else None,
        "p95_first_response_ms": round(percentile(ms, 0.95), 3) if ms else None,
        "containers_left": containers_left,
    }


def measured(stats: object) -> bool:
    return isinstance(stats, dict) and "error" not in stats and "p50_ms" in stats


def difference(system: Json, floor: Json, key: str) -> float | None:
    """``system[key] - floor[key]`` in ms, when both were measured."""
    if not (measured(system) and measured(floor)):
        return None
    return round(float(system[key]) - float(floor[key]), 3)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 2)


def spread(values: Sequence[float | None]) -> Json:
    """``{median, min, max, n}`` of per-repeat figures (None where a repeat did not measure)."""
    known = sorted(float(v) for v in values if v is not None)
    if not known:
        return {"error": "no repeat measured it"}
    middle = len(known) // 2
    median = known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2
    return {
        "median": round(median, 3),
        "min": round(known[0], 3),
        "max": round(known[-1], 3),
        "n": len(known),
    }


def bootstrap(
    samples_ns: Sequence[int],
    fraction: float,
    *,
    against: Sequence[int] | None = None,
    resamples: int = 2000,
    seed: int = 9,
) -> tuple[float, float]:
    """95 % interval of a percentile (ms) — or of its difference with ``against``'s — by the
    bootstrap: resample with replacement, take the figure, keep the 2.5th and 97.5th values.

    Seeded, so that the same samples always give the same interval.
    """
    rng = random.Random(seed)
    ms = [sample / 1e6 for sample in samples_ns]
    other = [sample / 1e6 for sample in against] if against is not None else None
    figures = []
    for _ in range(resamples):
        figure = percentile(sorted(rng.choices(ms, k=len(ms))), fraction)
        if other is not None:
            figure -= percentile(sorted(rng.choices(other, k=len(other))), fraction)
        figures.append(figure)
    figures.sort()
    return (
        round(figures[int(0.025 * resamples)], 3),
        round(figures[int(0.975 * resamples) - 1], 3),
    )


def paired_rates(mine: Sequence[Json], theirs: Sequence[Json], key: str = "msgs_per_s") -> Json:
    """Rates paired by repeat: ``{ratio: spread of mine ÷ theirs, ahead_in_every_repeat}``.

    Each run carries its ``repeat``; a repeat that only one side measured counts for neither.
    The runs of a repeat follow each other (rotated), so the two met the same minutes of the
    machine: a paired ratio does not carry the spread between repeats that comparing one
    side's worst repeat with the other's best does.
    """
    by_repeat = {run["repeat"]: run[key] for run in theirs if run.get(key)}
    ratios = [
        run[key] / by_repeat[run["repeat"]]
        for run in mine
        if run.get(key) and run.get("repeat") in by_repeat
    ]
    if not ratios:
        return {"error": "no repeat measured both"}
    return {"ratio": spread(ratios), "ahead_in_every_repeat": min(ratios) > 1}
