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
their range. The target (issue 50): ``prepare`` at most 500 ms at P95 for 10,000 files.

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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

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
    subprocess.run(["git", "-C", str(project), *args], check=True, env=GIT_ENV, capture_output=True)


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "workspace-results.json")
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
        project = make_repository(root, args.files)
        copies = args.copies or Path(default_parent()) / "bench"
        copies.mkdir(parents=True, exist_ok=True)
        fd = os.open(project, os.O_PATH | os.O_DIRECTORY)
        owner = (os.stat(project).st_uid, os.stat(project).st_gid)
        try:
            for repeat in range(args.repeats):
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
    results = {
        "files": args.files,
        "repeats": args.repeats,
        **{name: summary(values) for name, values in samples.items()},
    }
    results["prepare_over_cp_a_p50"] = round(
        results["prepare"]["p50_ms"] / max(results["cp_a"]["p50_ms"], 0.001), 2
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
