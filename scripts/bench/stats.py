"""Figures: order statistics of latency samples, and the ``STATS`` / ``BURST`` shapes."""

from __future__ import annotations

import math
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
