"""Instructions per relayed call in the real orchestrator, counted by callgrind.

Latency on a two-core virtual machine is too noisy to credit one change with a few percent;
the number of user-space instructions the orchestrator executes per relayed call is not. This
runs the orchestrator of a revision (or of the working tree) under ``valgrind --tool=callgrind``
on the real Docker engine with one ``time`` service, drives one WebSocket session with N
``tools/call get_current_time`` (one call in flight, or a window of ``--in-flight``), stops it
with SIGTERM, and reads callgrind's total. It does that for a short and a long session; the
difference divided by the difference in calls is the cost of one relayed call, start-up, the
container's creation and the stop cancelling out.

    .venv/bin/python scripts/bench-instructions.py                 # the working tree
    .venv/bin/python scripts/bench-instructions.py 3313cac 9af95a6 # revisions, in one sitting
    .venv/bin/python scripts/bench-instructions.py --no-audit      # the audit trail off
    .venv/bin/python scripts/bench-instructions.py --transport http  # Streamable HTTP POSTs
    .venv/bin/python scripts/bench-instructions.py --endpoint fabric # /mcp, time__get_current_time
    .venv/bin/python scripts/bench-instructions.py --in-flight 16    # 16 calls pipelined
    .venv/bin/python scripts/bench-instructions.py --cprofile 40     # Python functions per call
    .venv/bin/python scripts/bench-instructions.py --floor           # a trio relay of bytes only
    .venv/bin/python scripts/bench-instructions.py --floor streams   # … on trio's streams

``--cprofile N`` runs the same two sessions under cProfile instead of valgrind and prints the
N functions with the most own time per call (the difference between the sessions, divided by
the difference in calls), with their calls per call: where the instructions go, by Python
function (callgrind sees only the interpreter's C functions).

A revision is checked out into a temporary git worktree and imported from there (the venv's
packages are used for everything else). Needs ``valgrind`` (``apt-get install valgrind``) and
the ``time`` image (``make images``). Counts repeat to about 1-2 %. What it does not count: the
kernel's share of the socket calls and the cost of waking up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio
from trio_websocket import open_websocket_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.mcp import HttpRpc, handshake  # the benchmark's own raw HTTP client

from reactor_fabric.runtime.stdio_sockets import BUNDLED_HELPER  # the working tree's build

REPO = Path(__file__).resolve().parent.parent
IMAGE = "reactor-fabric/mcp-server-time:2026.10.19"
START_TIMEOUT_S = 300.0  # the orchestrator starts slowly under valgrind
STOP_TIMEOUT_S = 120.0

SUITE = f"""\
version: "1.0"
orchestrator: {{allowed_mount_roots: ["{tempfile.gettempdir()}"]}}
mcp_services:
  time: {{image: "{IMAGE}", pull: never, network: none, timeout: 30m}}
"""

# The same with the audit trail off (revisions from 3f6b057 on: older ones refuse the key).
SUITE_WITHOUT_AUDIT = SUITE.replace(
    "orchestrator: {", "orchestrator: {audit: {enabled: false}, ", 1
)

# The call each session repeats (the same over both transports).
GET_TIME: dict[str, object] = {"name": "get_current_time", "arguments": {"timezone": "UTC"}}
# Where a session goes, and the call's name there: the relay, or the fabric endpoint (every
# tool shown, under its namespaced name; the container starts on the first call).
ENDPOINTS: dict[str, tuple[str, dict[str, object]]] = {
    "relay": ("/mcp/time", GET_TIME),
    "fabric": ("/mcp?tools=all", {**GET_TIME, "name": "time__get_current_time"}),
}

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench-instructions", "version": "1"},
    },
}


async def drive_session(
    url: str, calls: int, call_params: dict[str, object], in_flight: int = 1
) -> None:
    """One session: initialize, then ``calls`` tool calls, ``in_flight`` of them sent before
    their answers are read (a window: a new call goes out as each answer comes back); each
    answer checked."""
    async with open_websocket_url(url, subprotocols=["mcp"]) as ws:
        await ws.send_message(json.dumps(INITIALIZE))
        answer = json.loads(await ws.get_message())
        if "result" not in answer:
            raise RuntimeError(f"initialize failed: {answer}")
        await ws.send_message(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

        async def send(request_id: int) -> None:
            call = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
            await ws.send_message(json.dumps({**call, "params": call_params}))

        sent = min(in_flight, calls)
        for request_id in range(1, sent + 1):
            await send(request_id)
        outstanding = set(range(1, sent + 1))
        while outstanding:
            answer = json.loads(await ws.get_message())
            if "id" not in answer:
                continue  # a server's notification (the everything server sends some)
            if answer.get("id") not in outstanding or "result" not in answer:
                raise RuntimeError(f"a call failed: {answer}")
            outstanding.discard(answer["id"])
            if sent < calls:
                sent += 1
                outstanding.add(sent)
                await send(sent)


async def drive_http_session(
    port: int, token: str, calls: int, path: str, call_params: dict[str, object]
) -> None:
    """The same over Streamable HTTP: a POST per message on one kept-alive connection."""
    rpc = HttpRpc("127.0.0.1", port, path, {"Authorization": f"Bearer {token}"})
    await handshake(rpc)
    for request_id in range(1, calls + 1):
        _, answer = await rpc.call("tools/call", call_params)
        if "result" not in answer:
            raise RuntimeError(f"call {request_id} failed: {answer}")
    await rpc.aclose()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_healthy(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the orchestrator exited with {process.returncode} at start")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.5)
    raise RuntimeError("the orchestrator did not start listening in time")


def count_instructions(
    source: Path,
    workdir: Path,
    calls: int,
    *,
    audit: bool,
    transport: str,
    endpoint: str,
    in_flight: int = 1,
    cprofile: bool = False,
    floor: str | None = None,
) -> int:
    """Total instructions of one orchestrator run serving one session of ``calls`` calls
    (with ``cprofile``: 0, and the run's pstats in ``workdir/profile-CALLS.out``)."""
    port = free_port()
    suite = workdir / "suite.yaml"
    suite.write_text(SUITE if audit else SUITE_WITHOUT_AUDIT)
    log = workdir / f"valgrind-{calls}.log"
    # Authentication on, as users run it (older revisions ignore the variable and the query).
    token = secrets.token_urlsafe(32)
    env = dict(os.environ, PYTHONPATH=str(source), REACTOR_FABRIC_TOKEN=token)
    # A worktree has no built stdio helper (it is not in git): revisions that use one get the
    # working tree's (make images builds it), so their containers' stdio is what users get.
    if BUNDLED_HELPER.exists():
        env.setdefault("REACTOR_FABRIC_STDIO_HELPER", str(BUNDLED_HELPER))
    if cprofile:
        runner = [sys.executable, "-m", "cProfile", "-o", str(workdir / f"profile-{calls}.out")]
    else:
        runner = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={workdir / f'callgrind-{calls}.out'}",
            sys.executable,
        ]
    program = ["-m", "reactor_fabric", "--config", str(suite)]
    if floor:
        program = [str(REPO / "scripts" / "bench" / "trio_floor_relay.py"), "--image", IMAGE]
        if floor == "streams":
            program.append("--streams")
    command = [*runner, *program, "--port", str(port)]
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=source, env=env, stdout=subprocess.DEVNULL, stderr=log_file
        )
        try:
            wait_healthy(port, process)
            path, call_params = ENDPOINTS[endpoint]
            if transport == "http":
                trio.run(drive_http_session, port, token, calls, path, call_params)
            else:
                joiner = "&" if "?" in path else "?"
                url = f"ws://127.0.0.1:{port}{path}{joiner}token={token}"
                trio.run(drive_session, url, calls, call_params, in_flight)
            process.send_signal(signal.SIGTERM)
            process.wait(STOP_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    if cprofile:
        return 0
    match = re.search(r"Collected : ([\d,]+)", log.read_text(errors="replace"))
    if match is None:
        raise RuntimeError(f"no callgrind total in {log}")
    return int(match.group(1).replace(",", ""))


@contextlib.contextmanager
def checkout(revision: str | None, workdir: Path) -> Iterator[Path]:
    """The source tree of ``revision`` (a temporary worktree), or the working tree for None."""
    if revision is None:
        yield REPO
        return
    tree = workdir / "tree"
    git = ["git", "-C", str(REPO)]
    subprocess.run([*git, "worktree", "add", "--detach", str(tree), revision], check=True)
    try:
        yield tree
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)


def measure(
    revision: str | None,
    low: int,
    high: int,
    *,
    audit: bool,
    transport: str,
    endpoint: str,
    in_flight: int,
    keep: Path | None,
    cprofile: int = 0,
    floor: str | None = None,
) -> dict[str, object]:
    with (
        tempfile.TemporaryDirectory(prefix="rf-instr-") as tmp,
        checkout(revision, Path(tmp)) as tree,
    ):
        options = {
            "audit": audit,
            "transport": transport,
            "endpoint": endpoint,
            "in_flight": in_flight,
            "cprofile": cprofile > 0,
            "floor": floor,
        }
        short = count_instructions(tree, Path(tmp), low, **options)  # type: ignore[arg-type]
        long = count_instructions(tree, Path(tmp), high, **options)  # type: ignore[arg-type]
        if keep is not None:
            target = keep / (revision or "working-tree")
            target.mkdir(parents=True, exist_ok=True)
            for out in [*Path(tmp).glob("callgrind-*.out"), *Path(tmp).glob("profile-*.out")]:
                shutil.copy(out, target / out.name)
        if cprofile:
            return profile_per_call(
                Path(tmp) / f"profile-{low}.out",
                Path(tmp) / f"profile-{high}.out",
                high - low,
                cprofile,
            )
    return {
        "revision": f"the trio floor relay ({floor})" if floor else revision or "working tree",
        "audit": audit and not floor,
        "transport": transport,
        "endpoint": endpoint,
        "in_flight": in_flight,
        f"instructions_{low}_calls": short,
        f"instructions_{high}_calls": long,
        "instructions_per_call": round((long - short) / (high - low)),
    }


def profile_per_call(short: Path, long: Path, calls: int, top: int) -> dict[str, object]:
    """What one call adds to a cProfile run: per function, its calls and own time per call."""

    def table(path: Path) -> dict[tuple[str, int, str], tuple[int, float]]:
        stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
        return {key: (value[1], value[2]) for key, value in stats.items()}

    before, after = table(short), table(long)
    rows = []
    for key, (count, own) in after.items():
        count_0, own_0 = before.get(key, (0, 0.0))
        rows.append(((count - count_0) / calls, (own - own_0) / calls * 1e6, key))
    rows.sort(key=lambda row: row[1], reverse=True)
    for per_call, micros, (file, line, name) in rows[:top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        print(f"{micros:8.1f} us {per_call:6.1f} x  {name}  {where}", file=sys.stderr)
    return {
        "function_calls_per_call": round(sum(row[0] for row in rows), 1),
        "own_time_per_call_us": round(sum(row[1] for row in rows), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*", help="git revisions (default: the working tree)")
    parser.add_argument("--low", type=int, default=100, help="calls in the short session")
    parser.add_argument("--high", type=int, default=600, help="calls in the long session")
    parser.add_argument(
        "--no-audit", action="store_true", help="the audit trail off (revisions from 3f6b057)"
    )
    parser.add_argument(
        "--transport",
        choices=("websocket", "http"),
        default="websocket",
        help="how the session talks to the orchestrator (default: websocket)",
    )
    parser.add_argument(
        "--endpoint",
        choices=tuple(ENDPOINTS),
        default="relay",
        help="the relay (/mcp/time) or the fabric endpoint (/mcp, time__get_current_time)",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=1,
        help="calls sent before their answers are read (WebSocket only; default 1)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="copy callgrind's outputs to KEEP/REVISION/ (for callgrind_annotate)",
    )
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile instead of valgrind: print the N costliest functions per call",
    )
    parser.add_argument(
        "--floor",
        nargs="?",
        const="bare",
        choices=("bare", "streams"),
        help="count scripts/bench/trio_floor_relay.py (a trio relay of bytes only) instead",
    )
    args = parser.parse_args()
    if args.floor and (args.revisions or args.transport != "websocket" or args.endpoint != "relay"):
        parser.error("--floor is the WebSocket relay's floor: no revisions, transport or endpoint")
    if not args.cprofile and shutil.which("valgrind") is None:
        print("valgrind is needed: apt-get install valgrind", file=sys.stderr)
        return 2
    if args.high <= args.low:
        parser.error("--high must be greater than --low")
    if args.in_flight < 1 or (args.in_flight > 1 and args.transport != "websocket"):
        parser.error("--in-flight takes a positive number, and more than 1 only over websocket")
    for revision in args.revisions or [None]:
        result = measure(
            revision,
            args.low,
            args.high,
            audit=not args.no_audit,
            transport=args.transport,
            endpoint=args.endpoint,
            in_flight=args.in_flight,
            keep=args.keep,
            cprofile=args.cprofile,
            floor=args.floor,
        )
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
