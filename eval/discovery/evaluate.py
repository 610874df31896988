"""The discovery evaluation: how well ``reactor-fabric rank`` chooses servers for tasks.

``make eval-discovery`` runs this. It

1. builds ``catalog.json`` (the ``catalog --json`` form) from the recorded servers in
   ``servers/`` — each one's public package description and its real ``tools/list``;
2. runs the real CLI, ``python -m reactor_fabric rank --catalog catalog.json``, over every task
   of ``tasks.jsonl`` and scores what it printed, separately for the tuning half and the
   held-out half (a task's half is fixed by the SHA-256 of its text: nobody picks it);
3. measures latency (the CLI's in-process ``latency_ms``) at the catalog's size and at 100
   services (the catalog replicated under new names), and the index's memory (tracemalloc);
4. reports the tool-definition tokens of the top-3 servers against all, and how well the
   confidence is calibrated (reliability bins, expected calibration error, Brier score).

Metrics. A task's ``servers`` is a list of roles; a role is a server, or a list of servers any
of which does (only where servers genuinely overlap). top-1: the first ranked server fills a
role. top-3: every role is filled within the first three. Set precision: the share of
recommended servers that fill a role; set recall: the share of roles the recommended set
fills; exact: both are 1 and there are as many servers as roles.

Options: ``--fit`` refits the confidence model on the tuning half and writes
``reactor_fabric/discovery/calibration.json``; ``--tune`` searches the ranking's weights on the
tuning half (the defaults in ``index.Weights`` were chosen so); ``--misses tune`` lists the
tuning half's misses (looking at the held-out ones to tune would make them no longer held out).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from reactor_fabric.discovery import (  # noqa: E402
    DiscoveryIndex,
    Weights,
    build_index,
    default_calibration,
    rank_servers,
    tokens,
)
from reactor_fabric.discovery.calibration import Calibration  # noqa: E402
from reactor_fabric.discovery.catalog_file import catalog_json  # noqa: E402
from reactor_fabric.discovery.index import ServiceText  # noqa: E402
from reactor_fabric.protocol.fabric_meta_tools import META_DEFINITIONS  # noqa: E402

CATALOG = HERE / "catalog.json"
TASKS = HERE / "tasks.jsonl"
RESULTS = HERE / "results.json"
CALIBRATION = ROOT / "reactor_fabric" / "discovery" / "calibration.json"
LATENCY_REPEATS = 10
AT_SCALE = 100
BINS = 10

Json = dict[str, Any]


# --- inputs -------------------------------------------------------------------------------------


def build_catalog() -> list[ServiceText]:
    services = []
    for path in sorted((HERE / "servers").glob("*.json")):
        record = json.loads(path.read_text())
        services.append(
            ServiceText(
                name=record["name"],
                description=record.get("description") or "",
                tools=tuple(record["tools"]),
            )
        )
    CATALOG.write_text(json.dumps(catalog_json(services), indent=1, ensure_ascii=False) + "\n")
    return services


def load_tasks() -> list[Json]:
    tasks = []
    for number, line in enumerate(TASKS.read_text().splitlines(), 1):
        if not line.strip():
            continue
        task = json.loads(line)
        task["roles"] = [[r] if isinstance(r, str) else list(r) for r in task["servers"]]
        task["half"] = "tune" if hashlib.sha256(task["task"].encode()).digest()[0] % 2 else "test"
        task["line"] = number
        tasks.append(task)
    return tasks


def check_tasks(tasks: list[Json], names: set[str]) -> None:
    unknown = {s for t in tasks for role in t["roles"] for s in role if s not in names}
    if unknown:
        sys.exit(f"tasks name servers the catalog does not have: {sorted(unknown)}")


# --- the CLI ------------------------------------------------------------------------------------


def run_cli(catalog: Path, tasks: list[str], *, top: int = 10) -> list[Json]:
    command = [sys.executable, "-m", "reactor_fabric", "rank", "--catalog", str(catalog)]
    command += ["--top", str(top)]
    done = subprocess.run(
        command,
        input="\n".join(tasks) + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"rank failed ({done.returncode}): {done.stderr}")
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    if len(answers) != len(tasks):
        sys.exit(f"rank answered {len(answers)} of {len(tasks)} tasks")
    return answers


# --- scores -------------------------------------------------------------------------------------


def score(task: Json, ranked: list[str], recommended: list[str]) -> Json:
    roles = task["roles"]
    needed = {s for role in roles for s in role}
    filled = [any(s in role for s in recommended) for role in roles]
    useful = [s for s in recommended if s in needed]
    return {
        "top1": bool(ranked) and ranked[0] in needed,
        "top3": all(any(s in role for s in ranked[:3]) for role in roles),
        "precision_hits": len(useful),
        "recommended": len(recommended),
        "recall_hits": sum(filled),
        "roles": len(roles),
        "exact": all(filled) and len(useful) == len(recommended) == len(roles),
    }


def summary(rows: list[Json]) -> Json:
    if not rows:
        return {}
    count = len(rows)
    return {
        "tasks": count,
        "multi_server_tasks": sum(r["roles"] > 1 for r in rows),
        "top1": sum(r["top1"] for r in rows) / count,
        "top3_recall": sum(r["top3"] for r in rows) / count,
        "set_precision": sum(r["precision_hits"] for r in rows)
        / max(1, sum(r["recommended"] for r in rows)),
        "set_recall": sum(r["recall_hits"] for r in rows) / max(1, sum(r["roles"] for r in rows)),
        "exact_set": sum(r["exact"] for r in rows) / count,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def replicated(services: list[ServiceText], size: int) -> list[ServiceText]:
    """``services`` copied under new names until there are ``size`` of them."""
    copies = list(services)
    for round_ in itertools.count(2):
        for service in services:
            if len(copies) >= size:
                return copies
            copies.append(replace(service, name=f"{service.name}-copy{round_}"))
    return copies


def index_memory(services: list[ServiceText]) -> tuple[float, float]:
    """(retained, peak) MiB of building the index (the tokenizer, loaded before, excluded)."""
    tokens.load()
    tracemalloc.start()
    index = build_index(services, count_tokens=tokens.count_definition)
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del index
    return retained / 2**20, peak / 2**20


# --- calibration --------------------------------------------------------------------------------


def fit_logistic(features: list[tuple[float, ...]], labels: list[int]) -> Calibration:
    """Logistic regression by Newton's method with a small L2 penalty (no library needed)."""
    width = len(features[0]) + 1
    rows = [(1.0, *f) for f in features]
    weights = [0.0] * width
    penalty = 0.1
    for _ in range(50):
        gradient = [-penalty * w for w in weights]
        hessian = [[-penalty if i == j else 0.0 for j in range(width)] for i in range(width)]
        hessian[0][0] = -1e-9
        gradient[0] = 0.0
        for row, label in zip(rows, labels, strict=True):
            z = max(-30.0, min(30.0, sum(w * x for w, x in zip(weights, row, strict=True))))
            p = 1.0 / (1.0 + math.exp(-z))
            for i in range(width):
                gradient[i] += (label - p) * row[i]
                for j in range(width):
                    hessian[i][j] -= p * (1 - p) * row[i] * row[j]
        step = solve(hessian, gradient)
        weights = [w - s for w, s in zip(weights, step, strict=True)]
        if max(abs(s) for s in step) < 1e-8:
            break
    return Calibration(weights[0], tuple(weights[1:]))


def solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    size = len(vector)
    augmented = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    for column in range(size):
        pivot = max(range(column, size), key=lambda r: abs(augmented[r][column]))
        augmented[column], augmented[pivot] = augmented[pivot], augmented[column]
        if abs(augmented[column][column]) < 1e-12:
            continue
        for row in range(size):
            if row != column:
                factor = augmented[row][column] / augmented[column][column]
                augmented[row] = [
                    a - factor * b for a, b in zip(augmented[row], augmented[column], strict=True)
                ]
    return [
        augmented[i][size] / augmented[i][i] if abs(augmented[i][i]) > 1e-12 else 0.0
        for i in range(size)
    ]


def reliability(confidences: list[float], outcomes: list[bool]) -> Json:
    bins = []
    ece = 0.0
    for b in range(BINS):
        low, high = b / BINS, (b + 1) / BINS
        members = [
            (c, o)
            for c, o in zip(confidences, outcomes, strict=True)
            if low <= c < high or (b == BINS - 1 and c == 1.0)
        ]
        if not members:
            continue
        mean_confidence = statistics.fmean(c for c, _ in members)
        accuracy = statistics.fmean(float(o) for _, o in members)
        ece += len(members) / len(confidences) * abs(mean_confidence - accuracy)
        bins.append(
            {
                "bin": f"{low:.1f}-{high:.1f}",
                "tasks": len(members),
                "mean_confidence": round(mean_confidence, 3),
                "exact_rate": round(accuracy, 3),
            }
        )
    brier = statistics.fmean(
        (c - float(o)) ** 2 for c, o in zip(confidences, outcomes, strict=True)
    )
    return {"ece": round(ece, 4), "brier": round(brier, 4), "bins": bins}


# --- tuning -------------------------------------------------------------------------------------


def tune(services: list[ServiceText], tasks: list[Json]) -> None:
    tuning = [t for t in tasks if t["half"] == "tune"]
    grid = {
        "about": [1.0, 3.0],
        "tool_text": [0.25, 0.5, 1.0],
        "best_tool": [0.25, 0.5],
        "idf_power": [1.0, 1.5, 2.0],
        "name_bonus": [3.0, 5.0],
        "join_share": [0.35, 0.5],
    }
    results = []
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        weights = replace(Weights(), **dict(zip(keys, values, strict=True)))
        index = build_index(services, count_tokens=tokens.count_definition, weights=weights)
        rows = []
        for task in tuning:
            ranking = rank_servers(index, task["task"])
            rows.append(score(task, [s.name for s in ranking.ranked], list(ranking.recommended)))
        s = summary(rows)
        objective = s["top1"] + s["top3_recall"] + s["exact_set"]
        results.append((objective, values, s))
    results.sort(key=lambda r: -r[0])
    for objective, values, s in results[:10]:
        chosen = dict(zip(keys, values, strict=True))
        print(
            f"{objective:.3f} {chosen} top1={s['top1']:.3f} top3={s['top3_recall']:.3f} "
            f"exact={s['exact_set']:.3f}"
        )


# --- main ---------------------------------------------------------------------------------------


def fit(index: DiscoveryIndex, tasks: list[Json]) -> None:
    """Refit the confidence model on the tuning half: P(the recommended set is exact)."""
    tuning = [t for t in tasks if t["half"] == "tune"]
    features, labels = [], []
    for task in tuning:
        ranking = rank_servers(index, task["task"])
        row = score(task, [s.name for s in ranking.ranked], list(ranking.recommended))
        features.append(ranking.features)
        labels.append(int(row["exact"]))
    fitted = fit_logistic(features, labels)
    fitted_on = f"eval/discovery tuning half ({len(tuning)} tasks): P(recommended set is exact)"
    data = {"bias": fitted.bias, "coefficients": list(fitted.coefficients), "fitted_on": fitted_on}
    CALIBRATION.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {CALIBRATION.relative_to(ROOT)}: {fitted}")


def accuracy(index: DiscoveryIndex, tasks: list[Json], misses_of: str | None) -> Json:
    """Every task through the real CLI, scored per half; the token savings; calibration."""
    answers = run_cli(CATALOG, [t["task"] for t in tasks])
    rows: dict[str, list[Json]] = {"tune": [], "test": []}
    confidences: dict[str, list[float]] = {"tune": [], "test": []}
    outcomes: dict[str, list[bool]] = {"tune": [], "test": []}
    reductions, set_reductions = [], []
    for task, answer in zip(tasks, answers, strict=True):
        row = score(task, answer["ranked_servers"], answer["recommended_servers"])
        rows[task["half"]].append(row)
        confidences[task["half"]].append(answer["confidence"])
        outcomes[task["half"]].append(row["exact"])
        reductions.append(1 - index.tokens_of(answer["ranked_servers"][:3]) / index.all_tokens)
        set_reductions.append(1 - index.tokens_of(answer["recommended_servers"]) / index.all_tokens)
        if misses_of == task["half"] and not (row["top1"] and row["top3"] and row["exact"]):
            print(
                f"MISS line {task['line']}: {task['task']!r} expected {task['servers']} "
                f"got {answer['recommended_servers']} ranked {answer['ranked_servers'][:4]} "
                f"confidence {answer['confidence']}"
            )
    meta_tokens = sum(tokens.count_definition(t) for t in META_DEFINITIONS)
    return {
        "tune": summary(rows["tune"]),
        "test": summary(rows["test"]),
        "all": summary(rows["tune"] + rows["test"]),
        "calibration": {
            half: reliability(confidences[half], outcomes[half]) for half in ("tune", "test")
        },
        "tokens": {
            "tokenizer": tokens.method(),
            "all_tools": index.all_tokens,
            "meta_tools": meta_tokens,
            "top3_reduction_median": round(statistics.median(reductions), 4),
            "top3_reduction_min": round(min(reductions), 4),
            "recommended_reduction_median": round(statistics.median(set_reductions), 4),
        },
    }


def scale(services: list[ServiceText], tasks: list[Json]) -> Json:
    """Latency through the CLI and index memory, at the catalog's size and at 100 services."""
    texts = [t["task"] for t in tasks]
    latency: Json = {}
    memory: Json = {}
    with tempfile.TemporaryDirectory() as scratch:
        big = replicated(services, AT_SCALE)
        big_path = Path(scratch) / "catalog-100.json"
        big_path.write_text(json.dumps(catalog_json(big)))
        for label, path, members in (
            (f"{len(services)} servers", CATALOG, services),
            (f"{len(big)} servers", big_path, big),
        ):
            values = [a["latency_ms"] for a in run_cli(path, texts * LATENCY_REPEATS)]
            latency[label] = {
                "p50_ms": round(statistics.median(values), 4),
                "p99_ms": round(percentile(values, 99), 4),
                "max_ms": round(max(values), 4),
                "samples": len(values),
            }
            retained, peak = index_memory(members)
            memory[label] = {"retained_mib": round(retained, 2), "peak_mib": round(peak, 2)}
    return {"latency": latency, "index_memory": memory}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="refit the confidence (tuning half)")
    parser.add_argument("--tune", action="store_true", help="search the weights (tuning half)")
    parser.add_argument("--misses", choices=["tune", "test"], help="list one half's misses")
    args = parser.parse_args()

    services = build_catalog()
    tasks = load_tasks()
    check_tasks(tasks, {s.name for s in services})
    if args.tune:
        tune(services, tasks)
        return 0
    index = build_index(services, count_tokens=tokens.count_definition)
    if args.fit:
        fit(index, tasks)
        default_calibration.cache_clear()
    report: Json = {"catalog": {"servers": len(services), "tools": len(index.tools)}}
    report |= accuracy(index, tasks, args.misses)
    report |= scale(services, tasks)
    report["run"] = {"date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0]}
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    print_report(report)
    return 0


def print_report(report: Json) -> None:
    c = report["catalog"]
    print(f"catalog: {c['servers']} servers, {c['tools']} tools")
    print(f"{'half':6} {'tasks':>5} {'multi':>5}", end="")
    print("".join(f" {h:>7}" for h in ("top-1", "top-3", "set P", "set R", "exact")))
    for half in ("tune", "test", "all"):
        s = report[half]
        print(f"{half:6} {s['tasks']:5d} {s['multi_server_tasks']:5d}", end="")
        keys = ("top1", "top3_recall", "set_precision", "set_recall", "exact_set")
        print("".join(f" {s[k]:7.1%}" for k in keys))
    for label, values in report["latency"].items():
        memory = report["index_memory"][label]
        print(
            f"latency at {label}: P50 {values['p50_ms']} ms, P99 {values['p99_ms']} ms "
            f"({values['samples']} rankings); index {memory['retained_mib']} MiB "
            f"(peak {memory['peak_mib']})"
        )
    t = report["tokens"]
    print(
        f"tokens ({t['tokenizer']}): all tools {t['all_tools']}; the top-3 servers save "
        f"{t['top3_reduction_median']:.1%} (median; min {t['top3_reduction_min']:.1%}); the "
        f"recommended set saves {t['recommended_reduction_median']:.1%}; the meta-tools cost "
        f"{t['meta_tools']}"
    )
    for half in ("tune", "test"):
        cal = report["calibration"][half]
        bins = ", ".join(
            f"{b['bin']}: {b['tasks']} @ {b['mean_confidence']:.2f} -> {b['exact_rate']:.2f}"
            for b in cal["bins"]
        )
        print(f"calibration ({half}): ECE {cal['ece']}, Brier {cal['brier']}; {bins}")


if __name__ == "__main__":
    sys.exit(main())
