"""The benchmark's container lifecycles figures (scripts/bench/lifecycles.py) and their report.

Issue 36 judges `fresh_per_call` by two figures of one run: with the warm pool, the P95 of
(fresh call - reused call), paired by round, and how many times slower a `docker run -i --rm`
per call is than a pooled fresh call. They are pinned here on hand-made rounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

from bench import lifecycles, report  # noqa: E402

MS = 1_000_000


def one_round(**ms: float) -> lifecycles.Round:
    return {name: int(value * MS) for name, value in ms.items()}


def test_the_added_latency_is_paired_by_round_and_a_round_missing_either_counts_for_neither() -> (
    None
):
    rounds = [
        one_round(reused=1, fresh_pooled=11),
        one_round(reused=30, fresh_pooled=32),  # a slow moment of the machine for both
        one_round(fresh_pooled=500),  # its reused call failed: no pair
        one_round(reused=1),  # a miss of the pool: no pair
    ]

    added = lifecycles.figures([rounds])["added"]["fabric_pooled"]

    assert added["n"] == 2
    assert (added["p50_ms"], added["max_ms"]) == (2.0, 10.0)


def test_the_targets_are_met_by_a_small_paired_p95_and_a_docker_run_twenty_times_slower() -> None:
    rounds = [one_round(reused=1, fresh_pooled=21, docker_run_per_call=1000 + i) for i in range(20)]

    targets = lifecycles.figures([rounds[:10], rounds[10:]])["targets"]

    assert targets["added_p95_ms"] == 20.0
    assert targets["added_met"] is True
    assert targets["ratio"] == round(1009 / 21, 2)
    assert targets["ratio_met"] is True


def test_the_targets_are_missed_by_a_paired_p95_over_30_ms_and_a_ratio_under_20() -> None:
    rounds = [one_round(reused=1, fresh_pooled=41, docker_run_per_call=800) for _ in range(5)]

    targets = lifecycles.figures([rounds])["targets"]

    assert (targets["added_p95_ms"], targets["added_met"]) == (40.0, False)
    assert targets["ratio_met"] is False  # 800 / 41 < 20


def test_a_system_never_measured_leaves_its_figures_unmeasured_and_the_targets_undecided() -> None:
    figures = lifecycles.figures([[one_round(reused=1)]])

    assert "error" in figures["systems"]["fresh_pooled"]
    assert figures["targets"]["added_met"] is None
    assert figures["targets"]["ratio_met"] is None


def test_the_report_says_whether_the_targets_were_met_and_why_a_part_was_not_measured() -> None:
    rounds = [one_round(reused=1, fresh_pooled=41, docker_run_per_call=2000) for _ in range(5)]
    results = {"lifecycles": {"config": {"repeats": 1}, **lifecycles.figures([rounds])}}

    text = report._lifecycles(results)
    bar = report._lifecycle_bar(results["lifecycles"])
    not_run = report._lifecycles({"lifecycles": {"systems": {"reused": {"error": "--only"}}}})

    assert "+40.0 ms against ≤ 30 ms: **missed**" in text
    assert "48.78x against ≥ 20x: met" in text
    assert bar[-1] == "**missed**"
    assert "Not measured: --only" in not_run
