"""The Python worker's calls on the real engine, under runc and under gVisor (issue 51).

One orchestrator serves the bundled worker image (``reactor-fabric/worker-python``,
``reuse_per_session``) under four names (WORKERS): runc with a warm pool of one, runc without,
gVisor without, and gVisor with a pool (which serves sessions without a project only: a mount
made on the host after a gVisor container started is not seen in it, docs/USAGE.md
"Isolation"). Each round opens, for each of them in an order rotating each round and each on a
quiet machine (no container of a session left, the pools full, the CPUs idle: see quiet), a
session of its own on ``/mcp`` (with a project mounted, but for the gVisor pool's), and calls
``run_python`` with ``print(1)`` twice:

- ``first``: the session's first call, its round trip from the client (the container taken
  from the pool or started, the handshake, the run);
- ``start``: that container's start as the audit trail records it (``start_ms``: asked for to
  its server's stdio connected; for a pooled one, the take);
- ``first_over_start``: ``first`` minus ``start``, paired (what the first run adds to the
  container it got; the issue's target: at most 50 ms at P95 over the pool's take);
- ``warm``: the second call's round trip (the container running, its environment made).

Reported as P50 and P95 with their range (``--rounds``, a warm-up round not counted). The
reference for a sandbox's start is E2B's and Daytona's published 27-150 ms (their own
measurements, not repeated here). Without gVisor on the engine (docs/USAGE.md, "Isolation"),
the gVisor rows say why instead.

    .venv/bin/python scripts/bench-worker.py                      # bench/worker-results.json
    .venv/bin/python scripts/bench-worker.py --rounds 1 --json bench/tmp/worker-smoke.json
    .venv/bin/python scripts/bench-worker.py --refill-hold null --json /tmp/no-hold.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import trio
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench.mcp import check_result, handshake, websocket_session  # noqa: E402

from bench import engine  # noqa: E402  (scripts/bench: the engine benchmark's harness)

# name -> (isolation, warm, with a project mounted)
WORKERS: dict[str, tuple[str, int, bool]] = {
    "worker-runc-pooled": ("runc", 1, True),
    "worker-runc": ("runc", 0, True),
    "worker-gvisor": ("gvisor", 0, True),
    "worker-gvisor-pooled": ("gvisor", 1, False),
}
CALL = {"name": "run_python", "arguments": {"code": "print(1)"}}
PROJECT_OWNER = (1000, 1000)


def worker_suite(path: Path, mount_root: Path, refill_hold: str | None) -> Path:
    """The bundled suite's worker under the names of WORKERS, and nothing else; the pool's
    ``refill_hold`` as given ("default": the orchestrator's)."""
    bundled = yaml.safe_load((REPO / "claude-mcp-suite.yaml").read_text())
    worker = bundled["mcp_services"]["python_worker"]
    orchestrator: dict[str, Any] = {"allowed_mount_roots": [f"{mount_root}/"]}
    if refill_hold != "default":
        orchestrator["warm_pool"] = {"refill_hold": refill_hold}
    suite = {
        "version": bundled["version"],
        "orchestrator": orchestrator,
        "mcp_services": {
            name: {**worker, "isolation": isolation, "warm": warm, "timeout": "30m"}
            for name, (isolation, warm, _mounted) in WORKERS.items()
        },
    }
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def make_project(root: Path) -> Path:
    project = root / "projects" / "app"
    project.mkdir(parents=True)
    (project / "app.py").write_text("VALUE = 1\n")
    if os.geteuid() == 0:
        for path in (project, project / "app.py"):
            os.lchown(path, *PROJECT_OWNER)
    return project


async def quiet(orch: Any, pooled: int, *, bound: float = 120.0) -> bool:
    """Until no session's container of the orchestrator is left, its pools hold at least
    ``pooled`` containers, and the machine's CPUs are idle (a pooled container is handed out
    once it runs, while its server may still be loading: a session's measurements must not
    share the CPU with that, nor with anything else left of the previous session). Whether the
    CPUs were idle (engine.until_cpus_idle)."""
    with trio.fail_after(bound):
        while True:
            names = [c["Names"][0] for c in await engine.docker_call(orch.containers())]
            if sum("-pool-" in n for n in names) >= pooled and all("-pool-" in n for n in names):
                break
            await trio.sleep(0.1)
    return await engine.until_cpus_idle()


async def rounds(project: Path, work: Path, count: int, refill_hold: str | None) -> dict[str, Any]:
    suite = worker_suite(work / "suite.yaml", project.parent.parent, refill_hold)
    orch = await engine.start_orchestrator(suite, work / "orchestrator.log")
    unavailable = {
        e["service"]: e.get("detail", "")
        for e in engine.log_events(orch.log_path)
        if e.get("event") == "service_isolation" and e.get("runs_under") == "unavailable"
    }
    measured = [name for name in WORKERS if name not in unavailable]
    pooled = sum(WORKERS[name][1] for name in measured)
    first: dict[str, list[float]] = {name: [] for name in measured}
    warm: dict[str, list[float]] = {name: [] for name in measured}
    not_idle = 0  # sessions measured without the CPUs idle first
    try:
        for index in range(-1, count):  # round -1: a warm-up, not counted
            shift = index % len(measured)
            for name in measured[shift:] + measured[:shift]:
                idle = await quiet(orch, pooled)
                not_idle += index >= 0 and not idle
                mounted = WORKERS[name][2]
                query = "tools=all" + (
                    "&mount=" + urllib.parse.quote(f"{project}:/workspace", safe="")
                    if mounted
                    else ""
                )
                call = {**CALL, "name": f"{name}__{CALL['name']}"}
                async with websocket_session(
                    orch.fabric_ws_url(query), subprotocols=["mcp"]
                ) as rpc:
                    await handshake(rpc)
                    with trio.fail_after(120):
                        first_ns, answer = await rpc.call("tools/call", call)
                        check_result(answer, name)
                        warm_ns, answer = await rpc.call("tools/call", call)
                        check_result(answer, name)
                if index >= 0:
                    first[name].append(first_ns / 1e6)
                    warm[name].append(warm_ns / 1e6)
            print(f"worker round {index + 1}/{count}", file=sys.stderr, flush=True)
        await quiet(orch, pooled)
    finally:
        await orch.stop()
    starts, pooled_flags = starts_of(engine.audit_records(orch.log_path), measured)
    return {
        "first": first,
        "warm": warm,
        "start": starts,
        "pooled": pooled_flags,
        "unavailable": unavailable,
        "not_idle": not_idle,
    }


def starts_of(
    audited: list[dict[str, Any]], names: list[str]
) -> tuple[dict[str, list[float]], dict[str, list[bool]]]:
    """Per service its sessions' container starts in order (and whether each was pooled), the
    warm-up round's left out."""
    starts: dict[str, list[float]] = {name: [] for name in names}
    pooled: dict[str, list[bool]] = {name: [] for name in names}
    for record in audited:
        if record.get("event") == "container_start" and record.get("service") in starts:
            starts[record["service"]].append(float(record["start_ms"]))
            pooled[record["service"]].append(bool(record.get("pooled")))
    for name in names:
        del starts[name][:1], pooled[name][:1]
    return starts, pooled


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))]


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "p50_ms": round(sorted(values)[len(values) // 2], 1),
        "p95_ms": round(percentile(values, 0.95), 1),
        "min_ms": round(min(values), 1),
        "max_ms": round(max(values), 1),
    }


def figures(measured: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in measured["first"]:
        first, start = measured["first"][name], measured["start"][name]
        paired = list(zip(first, start, strict=False))
        found[name] = {
            "isolation": WORKERS[name][0],
            "project_mounted": WORKERS[name][2],
            "first": summary(first),
            "start": summary(start),
            "first_over_start": summary([f - s for f, s in paired]),
            "warm": summary(measured["warm"][name]),
            "pooled_starts": sum(measured["pooled"][name]),
        }
    for name, why in measured["unavailable"].items():
        found[name] = {"unavailable": why}
    found["sessions_measured_on_a_busy_machine"] = measured["not_idle"]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "worker-results.json")
    parser.add_argument(
        "--refill-hold",
        default="default",
        help="the pool's orchestrator.warm_pool.refill_hold (a duration, or 'null': none; "
        "default: the orchestrator's own)",
    )
    args = parser.parse_args()
    hold = None if args.refill_hold == "null" else args.refill_hold
    with tempfile.TemporaryDirectory(prefix="rf-bench-worker-") as tmp:
        root = Path(tmp)
        root.chmod(0o711)  # the project's owner reaches it
        project = make_project(root)
        work = root / "engine"
        work.mkdir()
        measured = trio.run(rounds, project, work, args.rounds, hold)
    results = {
        "rounds": args.rounds,
        "refill_hold": args.refill_hold,
        "machine": engine.machine_info(),
        **figures(measured),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
