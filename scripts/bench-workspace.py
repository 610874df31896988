"""What an isolated workspace adds to a task's start, and what recording its branch costs.

An isolated task (``workspace: isolated``, docs/USAGE.md "Workspaces") waits, before its
container starts, for the copy of the client's project to be made: :func:`reactor_fabric.
workspace.prepare`. This measures that on a generated repository of ``--files`` files (10,000
by default, in nested directories, a few KiB each, some with uncommitted changes and some
untracked, as a working tree is), against what a user would otherwise do:

- ``cp_a``: ``cp -a`` of the working tree without ``.git`` (the floor: copying the same bytes);
- ``git_worktree``: ``git worktree add --detach`` of HEAD (a checkout of its own, what
  container-per-agent tools use; it writes into the client's ``.git``, which we never do, and
  misses the uncommitted changes);
- ``prepare``: ours (the working tree as the client has it, blobs hashed as they are written,
  the uncommitted files' blobs stored for the branch's first commit).

The copies go where the orchestrator makes them (``default_parent``: memory-backed /dev/shm
when it is a tmpfs; ``--copies DIR`` elsewhere), the repository lives on disk, as a user's
does. Then ``record`` after a task changed a few files (fast-import of the two commits and the
branch). Systems are interleaved, repeated (``--repeats``), and reported as P50 and P95 with
their range.

Then on the real engine (``--engine-rounds``, 0 for none): what the copy adds to a call's
start where the orchestrator makes it, beside the container's own start. One orchestrator
serves copies of the bundled ``time`` service, a container per call (ENGINE_SERVICES):
isolated and shared, without a pool and with one (``warm: 1``); one session on ``/mcp`` with the
repository mounted (an ordinary user's, as a client's checkout) calls each once per round, in
an order rotating each round, each call on a quiet engine (no per-call container left, the
pools full, a second for their servers, the CPUs idle). Per call, the audit record's
``start_ms`` (from the container asked for to its server's stdio connected and the copy whole)
and the round trip; what isolation adds is isolated minus shared, paired by round (a pooled
pair's round only when both were served from the pool). Then, each round, a session's first
task: called at once on a project no session had before (a copy of the repository of its own:
copied whole), at once on the repository (on the spare the session before left), and two
seconds after the session opened. The target (issue 50): a task's start on 10,000 files at
most 500 ms later at P95.

    .venv/bin/python scripts/bench-workspace.py                 # bench/workspace-results.json
    .venv/bin/python scripts/bench-workspace.py --files 200 --repeats 3   # (make bench-smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from functools import partial
from pathlib import Path
from typing import Any

import trio
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.mcp import check_result, handshake, websocket_session  # noqa: E402

from bench import engine  # noqa: E402  (scripts/bench: the engine benchmark's harness)
from reactor_fabric.trio.workspaces import default_parent  # noqa: E402
from reactor_fabric.workspace import Bounds, TaskFacts, prepare, record, remove  # noqa: E402

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}
BOUNDS = Bounds(max_files=1_000_000, max_bytes=8 << 30)
FACTS = TaskFacts(service="bench", task="bench task", session="s", call="1", trace="t")


def git(project: Path, *args: str) -> None:
    # safe.directory: the repository is an ordinary user's (give_to_owner), we are root.
    # gc.auto=0: no gc in the background while the copies are measured (make_repository packs
    # the objects itself, as a user's repository has them, before anything is measured).
    command = ["git", "-c", "safe.directory=*", "-c", "gc.auto=0", "-C", str(project), *args]
    subprocess.run(command, check=True, env=GIT_ENV, capture_output=True)


def make_repository(root: Path, files: int) -> Path:
    """A repository of ``files`` files in directories of 50, committed; then 1 % of them
    changed and 1 % new (untracked), and an ignored build directory."""
    project = root / "project"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    for index in range(files):
        path = project / f"src/d{index // 2500}/e{index // 50}/file{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# file {index}\n" + "x = 1\n" * (index % 400 + 20))
    (project / ".gitignore").write_text("build/\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "the project")
    git(project, "gc", "-q")
    for index in range(0, files, 100):
        path = project / f"src/d{index // 2500}/e{index // 50}/file{index}.py"
        path.write_text(path.read_text() + "y = 2  # uncommitted\n")
        (path.parent / f"new{index}.py").write_text("z = 3\n")
    (project / "build").mkdir()
    for index in range(200):
        (project / "build" / f"out{index}.o").write_bytes(b"\0" * 4096)
    return project


def cp_a(project: Path, target: Path) -> None:
    subprocess.run(
        ["cp", "-a", "--reflink=auto", str(project), str(target)], check=True, capture_output=True
    )
    shutil.rmtree(target / ".git")


def measure_one(
    name: str,
    project: Path,
    fd: int,
    owner: tuple[int, int],
    *,
    target: Path,
    samples: dict[str, list[float]],
) -> None:
    """One sample of ``name`` (and, after ``prepare``, of ``record``), its copy removed."""
    began = time.perf_counter()
    if name == "cp_a":
        cp_a(project, target)
        samples[name].append((time.perf_counter() - began) * 1000)
        shutil.rmtree(target)
        return
    if name == "git_worktree":
        git(project, "worktree", "add", "-q", "--detach", str(target))
        samples[name].append((time.perf_counter() - began) * 1000)
        git(project, "worktree", "remove", "--force", str(target))
        return
    workspace = prepare(fd, owner, str(target), base=None, bounds=BOUNDS, cancelled=lambda: False)
    samples[name].append((time.perf_counter() - began) * 1000)
    for index in range(5):  # the task's work
        (target / f"src/d0/e0/task{index}.py").write_text("done = True\n")
    began = time.perf_counter()
    record(workspace, FACTS, f"bench/{target.name}", bounds=BOUNDS, cancelled=lambda: False)
    samples["record"].append((time.perf_counter() - began) * 1000)
    remove(str(target))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 1),
        "p95_ms": round(percentile(values, 0.95), 1),
        "min_ms": round(min(values), 1),
        "max_ms": round(max(values), 1),
    }


# --- on the engine: what an isolated call's start adds ---------------------------------------

# Copies of the bundled `time` service, a container per call: name → (workspace, warm). The
# pooled pair's containers wait started, the project attached at the take.
ENGINE_SERVICES = {
    "time-isolated": ("isolated", 0),
    "time-shared": ("shared", 0),
    "time-isolated-pooled": ("isolated", 1),
    "time-shared-pooled": ("shared", 1),
}
# A session's first isolated task (time-isolated in a session of its own, three a round): called
# as soon as the session is open on a project no session had before (a copy of the project of
# its own: the whole copy), as soon as one is open on the project (the spare the last session on
# it left), and two seconds after (a client's first task comes when its model asks for it: its
# own spare made, when none was left).
FIRST_TASK_NEW_PROJECT = "time-isolated-first-new-project"
FIRST_TASK = "time-isolated-first"
FIRST_TASK_LATER = "time-isolated-first-after-2s"
FIRST_TASKS = {FIRST_TASK_NEW_PROJECT: 0.0, FIRST_TASK: 0.0, FIRST_TASK_LATER: 2.0}  # (pause)
# The start added by isolation: (isolated, shared), paired by round.
ENGINE_PAIRS = {"fresh": ("time-isolated", "time-shared"),
                "pooled": ("time-isolated-pooled", "time-shared-pooled"),
                "first_task_new_project": (FIRST_TASK_NEW_PROJECT, "time-shared"),
                "first_task": (FIRST_TASK, "time-shared"),
                "first_task_after_2s": (FIRST_TASK_LATER, "time-shared")}  # fmt: skip
PROJECT_OWNER = (1000, 1000)
ENGINE_TOOL = {"name": "get_current_time", "arguments": {"timezone": "UTC"}}


def engine_suite(path: Path, mount_root: Path) -> Path:
    """The bundled suite's `time` under the names of ENGINE_SERVICES, and nothing else."""
    bundled = yaml.safe_load((REPO / "claude-mcp-suite.yaml").read_text())
    time_service = bundled["mcp_services"]["time"]
    suite = {
        "version": bundled["version"],
        "orchestrator": {"allowed_mount_roots": [f"{mount_root}/"]},
        "mcp_services": {
            name: {
                **time_service,
                "container_strategy": "fresh_per_call",
                "workspace": mode,
                "warm": warm,
                "timeout": "30m",
            }
            for name, (mode, warm) in ENGINE_SERVICES.items()
        },
    }
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def give_to_owner(project: Path) -> None:
    """The project becomes an ordinary user's, as a client's checkout is (we run as root)."""
    if os.geteuid() != 0:
        return
    for root, dirs, files in os.walk(project):
        for name in [root, *(os.path.join(root, entry) for entry in dirs + files)]:
            os.lchown(name, *PROJECT_OWNER)


def new_projects(project: Path, count: int) -> list[Path]:
    """``count`` copies of ``project`` (its ``.git`` too) beside it, each a project no session
    had before (its own device and inode: no spare of it kept), written to the disk before
    anything is measured."""
    made = []
    for index in range(count):
        copy = project.parent / f"new-project-{index}"
        subprocess.run(["cp", "-a", str(project), str(copy)], check=True)
        made.append(copy)
    subprocess.run(["sync"], check=True)
    return made


async def engine_rounds(
    project: Path,
    work: Path,
    rounds: int,
    others: list[Path],
    *,
    whole_copy_only: bool = False,
    cold_cache: bool = False,
) -> dict[str, Any]:
    """One orchestrator, one session on /mcp with ``project`` mounted; per round one call of
    each service in an order rotating each round, each on a quiet engine (the pools full, no
    per-call container left), then three sessions of their own whose one call is an isolated
    one, a session's first task (FIRST_TASKS): at once on one of ``others`` (one a round, the
    warm-up's included: a project no session had, copied whole), at once on ``project`` (the
    spare the session before left, kept after its end) and two seconds after the handshake
    (its spare taken at the start, or its own made meanwhile). Per call: its round
    trip (the client's clock) and its container's start (the audit record's ``start_ms``:
    from the call's container asked for to its server's stdio connected, the copy
    included). In the long session each isolated call starts on the spare copy the one before
    it left (docs/USAGE.md, "Workspaces"). ``whole_copy_only``: per round only the shared
    call and the first task on a project no session had (WHOLE_COPY: its pair), for a quick
    comparison of the whole copy between two revisions. The project no session had is read
    into the page cache just before (``cold_cache``: dropped from it instead): see
    :func:`cached`."""
    services = ["time-shared"] if whole_copy_only else list(ENGINE_SERVICES)
    first_tasks = (
        {FIRST_TASK_NEW_PROJECT: FIRST_TASKS[FIRST_TASK_NEW_PROJECT]}
        if whole_copy_only
        else FIRST_TASKS
    )
    suite = engine_suite(work / "suite.yaml", project.parent)
    orch = await engine.start_orchestrator(suite, work / "orchestrator.log")
    pooled = sum(warm for _, warm in ENGINE_SERVICES.values())
    round_trips: dict[str, list[float]] = {name: [] for name in [*services, *first_tasks]}
    first_task = {**ENGINE_TOOL, "name": f"time-isolated__{ENGINE_TOOL['name']}"}
    not_idle = 0  # calls made without the CPUs idle first (something else kept them busy)
    try:

        def query_of(mounted: Path) -> str:
            return "tools=all&mount=" + urllib.parse.quote(f"{mounted}:/workspace", safe="")

        query = query_of(project)
        async with websocket_session(orch.fabric_ws_url(query), subprotocols=["mcp"]) as rpc:
            await handshake(rpc)
            names = services
            for index in range(-1, rounds):  # round -1: a warm-up, not counted
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    not_idle += not await quiet(orch, pooled) and index >= 0
                    tool = {**ENGINE_TOOL, "name": f"{name}__{ENGINE_TOOL['name']}"}
                    with trio.fail_after(120):
                        elapsed, answer = await rpc.call("tools/call", tool)
                    check_result(answer, name)
                    if index >= 0:
                        round_trips[name].append(elapsed / 1e6)
                for name, pause in first_tasks.items():
                    mounted = others[index + 1] if name == FIRST_TASK_NEW_PROJECT else project
                    if name == FIRST_TASK_NEW_PROJECT:
                        await trio.to_thread.run_sync(partial(cached, mounted, evict=cold_cache))
                    not_idle += not await quiet(orch, pooled) and index >= 0
                    async with websocket_session(
                        orch.fabric_ws_url(query_of(mounted)), subprotocols=["mcp"]
                    ) as first:
                        await handshake(first)
                        await trio.sleep(pause)
                        with trio.fail_after(120):
                            elapsed, answer = await first.call("tools/call", first_task)
                        check_result(answer, name)
                    if index >= 0:
                        round_trips[name].append(elapsed / 1e6)
                print(f"engine round {index + 1}/{rounds}", file=sys.stderr, flush=True)
            await quiet(orch, pooled)
    finally:
        await orch.stop()
    measured = engine_records(engine.audit_records(orch.log_path), round_trips, list(first_tasks))
    return {**measured, "not_idle": not_idle}


def engine_records(
    audited: list[dict[str, Any]], round_trips: dict[str, list[float]], first_tasks: list[str]
) -> dict[str, Any]:
    """Per service (and each of ``first_tasks``, in their order in a round) the containers'
    starts in order, and whether each was a pooled one, the warm-up round's left out."""
    starts: dict[str, list[float]] = {name: [] for name in round_trips}
    pooled_starts: dict[str, list[bool]] = {name: [] for name in round_trips}
    records = [
        r
        for r in audited
        if r.get("event") == "container_start" and r.get("service") in ENGINE_SERVICES
    ]
    # The long session is the one with a container of every service; the others are each
    # round's first tasks, in FIRST_TASKS' order.
    [long_session] = {r["session"] for r in records if r["service"] == "time-shared"}
    firsts = 0
    for started in records:
        name = started["service"]
        if started["session"] != long_session:
            name, firsts = first_tasks[firsts % len(first_tasks)], firsts + 1
        elif name not in starts:
            continue  # (a pool's, of a service not called: --whole-copy-only)
        starts[name].append(float(started["start_ms"]))
        pooled_starts[name].append(bool(started.get("pooled")))
    for name, values in starts.items():  # (the warm-up's)
        del values[0], pooled_starts[name][0]
    return {"round_trip": round_trips, "start": starts, "pooled": pooled_starts}


def cached(project: Path, *, evict: bool) -> None:
    """Read every file of ``project`` (its ``.git`` too) into the page cache, or drop them from
    it (``evict``). Why: these machines page out what was not read for about a minute (DAMON's
    reclaim), so a project copied when the benchmark began would be in memory in one round and
    on the disk in another, depending on the round's length: a copy read from this virtual
    disk takes four times as long (docs/BENCHMARKS.md, "Issue 50"). By default the whole copy
    is measured with the project in memory, as a project being worked on is; --cold-cache
    measures it read from the disk."""
    for root, _dirs, names in os.walk(project):
        for name in names:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue  # (a symlink)
            try:
                if evict:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                else:
                    while os.read(fd, 1 << 20):
                        pass
            finally:
                os.close(fd)


async def quiet(orch: Any, pooled: int, *, bound: float = 120.0) -> bool:
    """Until no per-call container of the orchestrator is left and its pools hold at least
    ``pooled`` containers (a pool may hold one more for a while), a second more, and the
    machine's CPUs idle (a refilled pool's server still loading, the orchestrator still making
    or removing a spare copy: a call's start must not share the cores with what the call
    before left running); whether they were (engine.until_cpus_idle)."""
    with trio.fail_after(bound):
        while True:
            names = [c["Names"][0] for c in await engine.docker_call(orch.containers())]
            if sum("-pool-" in n for n in names) >= pooled and all("-pool-" in n for n in names):
                break
            await trio.sleep(0.1)
    await trio.sleep(1.0)
    return await engine.until_cpus_idle()


def engine_figures(measured: dict[str, Any]) -> dict[str, Any]:
    """Per service its start and round trip; per pair what isolation adds, paired by round."""
    figures: dict[str, Any] = {
        name: {
            "start": summary(measured["start"][name]),
            "round_trip": summary(measured["round_trip"][name]),
            "pooled_starts": sum(measured["pooled"][name]),
        }
        for name in measured["start"]
    }
    figures["calls_without_idle_cpus"] = measured["not_idle"]
    for pair, (isolated, shared) in ENGINE_PAIRS.items():
        if isolated not in measured["start"] or shared not in measured["start"]:
            continue  # (not measured: --whole-copy-only)
        # A pooled pair's round counts only when both calls got a pooled container.
        rounds = [
            index
            for index, both in enumerate(
                zip(measured["pooled"][isolated], measured["pooled"][shared], strict=True)
            )
            if pair != "pooled" or all(both)
        ]
        for what in ("start", "round_trip"):
            added = [measured[what][isolated][i] - measured[what][shared][i] for i in rounds]
            figures[f"added_{what}_{pair}"] = summary(added) if added else None
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "workspace-results.json")
    parser.add_argument(
        "--engine-rounds",
        type=int,
        default=12,
        help="rounds on the real engine (0: none): one call of each ENGINE_SERVICES per round",
    )
    parser.add_argument("--only-engine", action="store_true", help="skip the copies measured here")
    parser.add_argument(
        "--cold-cache",
        action="store_true",
        help="drop the new project's files from the page cache before its first task",
    )
    parser.add_argument(
        "--whole-copy-only",
        action="store_true",
        help="on the engine, only a shared call and a first task on a new project per round",
    )
    parser.add_argument(
        "--copies",
        type=Path,
        default=None,
        help="where the copies go (default: where the orchestrator makes them, default_parent)",
    )
    args = parser.parse_args()
    samples: dict[str, list[float]] = {
        "cp_a": [],
        "git_worktree": [],
        "prepare": [],
        "record": [],
    }
    with tempfile.TemporaryDirectory(prefix="rf-bench-workspace-") as tmp:
        root = Path(tmp)
        root.chmod(0o711)  # the project's owner reaches it (give_to_owner)
        project = make_repository(root, args.files)
        copies = args.copies or Path(default_parent()) / "bench"
        copies.mkdir(parents=True, exist_ok=True)
        give_to_owner(project)
        fd = os.open(project, os.O_PATH | os.O_DIRECTORY)
        owner = (os.stat(project).st_uid, os.stat(project).st_gid)
        try:
            for repeat in range(0 if args.only_engine else args.repeats):
                order = ["cp_a", "git_worktree", "prepare"]
                shift = repeat % len(order)
                for name in order[shift:] + order[:shift]:
                    where = copies
                    measure_one(
                        name, project, fd, owner, target=where / f"{name}-{repeat}", samples=samples
                    )
                print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr, flush=True)
        finally:
            os.close(fd)
            if args.copies is None:
                shutil.rmtree(copies, ignore_errors=True)
        engine = None
        if args.engine_rounds:
            work = root / "engine"
            work.mkdir()
            others = new_projects(project, args.engine_rounds + 1)
            measured = trio.run(
                partial(
                    engine_rounds,
                    whole_copy_only=args.whole_copy_only,
                    cold_cache=args.cold_cache,
                ),
                project,
                work,
                args.engine_rounds,
                others,
            )
            engine = engine_figures(measured)
    results = {
        "files": args.files,
        "new_project_cache": "cold" if args.cold_cache else "warm",
        "repeats": args.repeats,
        **{name: summary(values) for name, values in samples.items() if values},
        "engine": engine,
    }
    if samples["prepare"]:
        results["prepare_over_cp_a_p50"] = round(
            results["prepare"]["p50_ms"] / max(results["cp_a"]["p50_ms"], 0.001), 2
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
