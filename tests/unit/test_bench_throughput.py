"""The benchmark's throughput against a peer, paired by repeat (scripts/bench/stats.py) and
its report.

Issue 53 asks for Streamable HTTP's throughput ahead of supergateway's in every repeat. The
runs of one repeat follow each other, so a repeat's pair met the same minutes of the machine;
comparing one side's worst repeat with the other's best would judge the machine's swings.
"""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

from bench import report, stats  # noqa: E402


def runs(*rates: float | None) -> list[stats.Json]:
    return [{"repeat": repeat, "msgs_per_s": rate} for repeat, rate in enumerate(rates) if rate]


def test_rates_are_compared_repeat_by_repeat_not_worst_against_best() -> None:
    # The machine was slow in repeat 1 for both: ours is ahead in each repeat, though our
    # slowest repeat is slower than their fastest.
    paired = stats.paired_rates(runs(5000, 3500, 5200), runs(4600, 3000, 4700))
    assert paired["ahead_in_every_repeat"] is True
    assert paired["ratio"]["n"] == 3
    assert paired["ratio"]["min"] > 1


def test_one_repeat_behind_is_not_ahead_in_every_repeat() -> None:
    paired = stats.paired_rates(runs(5000, 4000, 5200), runs(4600, 4100, 4700))
    assert paired["ahead_in_every_repeat"] is False
    assert paired["ratio"]["min"] < 1


def test_a_repeat_only_one_side_measured_counts_for_neither() -> None:
    paired = stats.paired_rates(runs(5000, 100, 5200), runs(4600, None, 4700))
    assert paired["ratio"]["n"] == 2
    assert paired["ahead_in_every_repeat"] is True
    assert "error" in stats.paired_rates(runs(5000), runs(None, 4000))


def test_the_report_states_the_paired_verdict_per_payload() -> None:
    summary = {
        "messages": 10,
        "payload_bytes": 16,
        "msgs_per_s": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1},
        "mib_per_s": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1},
        "latency_p50_ms": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1},
        "latency_p99_ms": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1},
        "against_supergateway": stats.paired_rates(runs(5000, 3000), runs(4000, 3100)),
    }
    text = report._throughput({"throughput": {"reactor_fabric_http": {"small": summary}}})
    assert "paired by repeat" in text
    assert "16 B" in text
    assert "not ahead in every repeat" in text
