"""The orchestrator's CPU per relayed call and its calls per second, revisions alternated.

``make bench``'s throughput part measures every system in one run, 1,500 calls a repeat, with
the orchestrator's CPU read in 10 ms ticks: good for comparing systems, coarse for comparing
two revisions of the orchestrator. This measures one thing at a time: one orchestrator of a
revision, one WebSocket session on ``/mcp/everything``, N ``echo`` calls of 16 bytes with a
window of calls in flight (16, as ``make bench``), and the orchestrator's user and system CPU
time over those calls from ``/proc/PID/stat`` (every thread counted). Revisions are measured
in turn, ``--repeats`` rounds, so that a machine's slow minute falls on all of them; it prints
each run and, per revision, the median and the spread.

    .venv/bin/python scripts/bench-relay-cpu.py 46cefed HEAD            # two revisions
    .venv/bin/python scripts/bench-relay-cpu.py 46cefed HEAD --suite bundled --repeats 5

``--suite minimal`` serves the everything service alone; ``bundled`` serves the bundled suite
(its warm pools and agent included: what users run). Needs the Docker engine and the images
(``make images``). Nothing else should run on the machine meanwhile.

``--instructions`` runs the orchestrator under callgrind instead and reports the instructions
of the timed calls only (the counters zeroed before them and dumped after, so the start, the
history and the warm-up are not counted): deterministic to a percent or two where calls per
second on a two-core machine are not (needs ``valgrind``; about 50 times slower).

    .venv/bin/python scripts/bench-relay-cpu.py 46cefed HEAD --suite bundled --history 2000 \
        --history-kinds all --calls 2000 --repeats 1 --instructions
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location(
    "bench_instructions", REPO / "scripts" / "bench-instructions.py"
)
assert _SPEC is not None
assert _SPEC.loader is not None
instructions = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_instructions"] = instructions
_SPEC.loader.exec_module(instructions)  # its session driver, worktrees and port helpers

EVERYTHING = "reactor-fabric/mcp-server-everything:2026.8.31"
MINIMAL_SUITE = f"""\
version: "1.0"
orchestrator: {{allowed_mount_roots: ["{tempfile.gettempdir()}"]}}
mcp_services:
  everything: {{image: "{EVERYTHING}", pull: never, network: none, timeout: 1m}}
"""
ECHO: dict[str, object] = {"name": "echo", "arguments": {"message": "x" * 16}}
WARM_UP_CALLS = 200


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(user, system) clock ticks of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


# --history-kinds all: the four kinds of session make bench's round-trip part opens on the
# orchestrator before its throughput part (the relay and /mcp, over WebSocket and HTTP).
FABRIC_TIME: dict[str, object] = {**instructions.GET_TIME, "name": "time__get_current_time"}


def history_sessions(port: int, token: str, calls: int, kinds: str) -> None:
    """``calls`` calls on the time service first, in sessions of 500, one in flight: over
    the relay's WebSocket alone (``relay``), or in turn over the relay and ``/mcp``, each over
    WebSocket and Streamable HTTP (``all``)."""
    relay_ws = f"ws://127.0.0.1:{port}/mcp/time?token={token}"
    fabric_ws = f"ws://127.0.0.1:{port}/mcp?tools=all&token={token}"
    for done in range(0, calls, 500):
        n = min(500, calls - done)
        trio.run(instructions.drive_session, relay_ws, n, instructions.GET_TIME)
        if kinds == "all":
            drive_http = instructions.drive_http_session
            trio.run(drive_http, port, token, n, "/mcp/time", instructions.GET_TIME)
            trio.run(instructions.drive_session, fabric_ws, n, FABRIC_TIME)
            trio.run(drive_http, port, token, n, "/mcp?tools=all", FABRIC_TIME)


def measure(
    source: Path,
    suite_text: str,
    calls: int,
    in_flight: int,
    *,
    history: int = 0,
    history_kinds: str = "relay",
    count_instructions: bool = False,
) -> dict[str, float]:
    """One orchestrator of ``source``: ``history`` calls on the time service first (see
    :func:`history_sessions`: what ``make bench``'s round-trip part does before the throughput
    part), warmed up, then ``calls`` calls timed and counted (under callgrind, their
    instructions: ``count_instructions``)."""
    with tempfile.TemporaryDirectory(prefix="rf-relay-cpu-") as tmp:
        suite = Path(tmp) / "suite.yaml"
        suite.write_text(suite_text)
        port = instructions.free_port()
        token = secrets.token_urlsafe(32)
        env = dict(os.environ, PYTHONPATH=str(source), REACTOR_FABRIC_TOKEN=token)
        if instructions.BUNDLED_HELPER.exists():
            env.setdefault("REACTOR_FABRIC_STDIO_HELPER", str(instructions.BUNDLED_HELPER))
        command = [sys.executable, "-m", "reactor_fabric", "--config", str(suite)]
        dumps = Path(tmp) / "callgrind.out"
        if count_instructions:
            command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dumps}", *command]
        with (Path(tmp) / "log").open("wb") as log:
            process = subprocess.Popen(
                [*command, "--port", str(port)],
                cwd=source,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            try:
                instructions.wait_healthy(port, process)
                history_sessions(port, token, history, history_kinds)
                url = f"ws://127.0.0.1:{port}/mcp/everything?token={token}"
                trio.run(instructions.drive_session, url, WARM_UP_CALLS, ECHO, in_flight)
                if count_instructions:
                    callgrind_control("-z", process.pid)  # (what came before is not counted)
                user0, system0 = cpu_ticks(process.pid)
                began = time.perf_counter()
                trio.run(instructions.drive_session, url, calls, ECHO, in_flight)
                seconds = time.perf_counter() - began
                user1, system1 = cpu_ticks(process.pid)
                if count_instructions:
                    callgrind_control("-d", process.pid)
                    counted = dumped_total(Path(f"{dumps}.1"))
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(instructions.STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    if count_instructions:
        return {"instructions_per_call": round(counted / calls)}
    tick = 1e6 / os.sysconf("SC_CLK_TCK") / calls
    return {
        "calls_per_s": round(calls / seconds),
        "user_us_per_call": round((user1 - user0) * tick, 1),
        "system_us_per_call": round((system1 - system0) * tick, 1),
    }


def callgrind_control(option: str, pid: int) -> None:
    """Zero (``-z``) or dump (``-d``) the counters of the orchestrator under callgrind."""
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def dumped_total(path: Path) -> int:
    """The instructions of one callgrind dump (its ``summary:`` or ``totals:`` line)."""
    for _attempt in range(100):  # (the dump is written while the orchestrator runs on)
        if path.exists():
            found = re.search(r"^(?:summary|totals): (\d+)", path.read_text(), re.MULTILINE)
            if found is not None:
                return int(found.group(1))
        time.sleep(0.1)
    raise RuntimeError(f"no callgrind dump at {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="+", help="git revisions (WORKTREE: the working tree)")
    parser.add_argument("--calls", type=int, default=10_000, help="calls timed per run")
    parser.add_argument("--in-flight", type=int, default=16, help="calls in flight (window)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the revisions")
    parser.add_argument("--suite", choices=("minimal", "bundled"), default="minimal")
    parser.add_argument(
        "--history", type=int, default=0, help="calls on /mcp/time before (bundled suite)"
    )
    parser.add_argument(
        "--history-kinds",
        choices=("relay", "all"),
        default="relay",
        help="the history's sessions: the relay over WebSocket, or every kind make bench opens",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count the timed calls' instructions under callgrind instead of timing them",
    )
    args = parser.parse_args()
    if args.history and args.suite != "bundled":
        parser.error("--history calls the time service: use --suite bundled")
    runs: dict[str, list[dict[str, float]]] = {revision: [] for revision in args.revisions}
    with contextlib.ExitStack() as stack:
        trees = {
            revision: REPO
            if revision == "WORKTREE"
            else stack.enter_context(
                instructions.checkout(
                    revision, Path(stack.enter_context(tempfile.TemporaryDirectory()))
                )
            )
            for revision in args.revisions
        }
        for round_ in range(args.repeats):
            for revision in args.revisions:
                tree = trees[revision]
                # Each revision's own bundled suite (a newer one may use fields it refuses).
                bundled = (tree / "claude-mcp-suite.yaml").read_text()
                result = measure(
                    tree,
                    bundled if args.suite == "bundled" else MINIMAL_SUITE,
                    args.calls,
                    args.in_flight,
                    history=args.history,
                    history_kinds=args.history_kinds,
                    count_instructions=args.instructions,
                )
                runs[revision].append(result)
                print(json.dumps({"revision": revision, "round": round_ + 1, **result}), flush=True)
    for revision, results in runs.items():
        summary = {
            key: {
                "median": statistics.median(r[key] for r in results),
                "min": min(r[key] for r in results),
                "max": max(r[key] for r in results),
            }
            for key in results[0]
        }
        print(json.dumps({"revision": revision, "summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
