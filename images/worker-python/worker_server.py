"""The Python worker: an MCP server (stdio, the official Python SDK) that runs Python, installs
packages, runs the project's tests and lints it, and reads and writes its files — in the
workspace (the project the suite mounted), as the ordinary user the container runs as.

Every process a call starts runs in a process group of its own under ``prlimit`` (address
space, open files), its output read as it comes and bounded (``worker_core.Bounded``), killed
with its whole group at the call's timeout, when the call is cancelled, or when it is done (a
background child of a finished run goes with it). Packages go into the session's virtual
environment under ``/tmp`` (the container's own, gone with it: never the project's files),
from the index pip is told of in the service's environment (``PIP_INDEX_URL``), reached only
through the orchestrator's egress proxy; that environment sees the image's pytest, ruff and
pip through a ``.pth`` file, after its own packages.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import anyio
import anyio.abc
from anyio.abc import Process
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from typing_extensions import TypedDict  # (pydantic's schemas need it on Python 3.11)
from worker_core import (
    LINT_TIMEOUT,
    OUTPUT_BYTES,
    PIP_TIMEOUT,
    PYTHON_TIMEOUT,
    TESTS_TIMEOUT,
    Bounded,
    Refused,
    Workspace,
    code_of,
    components,
    installed_of,
    lint_findings,
    requirements,
    test_arguments,
    timeout_of,
)

TOOLS_SITE = "/opt/worker-tools/site"
RUFF = f"{TOOLS_SITE}/bin/ruff"
PYTHON = "/usr/bin/python3"
STATE = os.path.join(os.environ.get("HOME") or "/tmp", "worker")  # noqa: S108 - the container's
VENV = os.path.join(STATE, "venv")
RUNS = os.path.join(STATE, "runs")
BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_boot.py")
DEFAULT_WORKSPACE = "/workspace"
# Bind mounts that are not the project: the engine's, the orchestrator's sockets and secrets.
NOT_PROJECT = (
    "/.reactor-fabric",
    "/etc/",
    "/run/",
    "/var/run/",
    "/dev",
    "/proc",
    "/sys",
    "/tmp",  # noqa: S108
    "/opt/",
    "/usr/",
)
MEMORY_ENV = "WORKER_MEMORY_LIMIT_MB"
DEFAULT_MEMORY_MB = 2048
KILL_DRAIN_SECONDS = 2.0
# ruff's JSON report is read whole (about 300 bytes a finding), then its first findings kept.
LINT_REPORT_BYTES = 16 * 1024 * 1024
# What the server itself is told and its runs are not.
PRIVATE_ENV = ("WORKER_PYTEST_REPORT",)


def _a_bind(fields: list[str]) -> bool:
    """Whether a mountinfo line (id parent major:minor root mountpoint … - fstype …) is a bind
    of a host directory: its root is not "/" (runc); under gVisor every host file the gofer
    serves is a 9p mount with root "/", the container's own root included."""
    fstype = fields[fields.index("-") + 1] if "-" in fields[:-1] else ""
    return fields[3] != "/" or (fstype == "9p" and fields[4] != "/")


def workspace_root() -> str:
    """``WORKER_WORKSPACE``, else the container's first bind mount that is not the engine's or
    the orchestrator's (the project the suite mounted), else /workspace."""
    configured = os.environ.get("WORKER_WORKSPACE")
    if configured:
        return configured
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as info:
            for line in info:
                fields = line.split()
                if len(fields) > 4 and _a_bind(fields):
                    target = fields[4].replace("\\040", " ")
                    if not target.startswith(NOT_PROJECT) and os.path.isdir(target):
                        return target
    except OSError:
        pass
    return DEFAULT_WORKSPACE


def make_environment() -> None:
    """The session's virtual environment (no pip of its own: the image's, through the .pth)."""
    if os.path.exists(os.path.join(VENV, "bin", "python")):
        return
    os.makedirs(RUNS, mode=0o700, exist_ok=True)
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", VENV], check=True, capture_output=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    with open(os.path.join(VENV, "lib", version, "site-packages", "_worker_tools.pth"), "w") as pth:
        pth.write(TOOLS_SITE + "\n")


def run_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
    env.update(
        PATH=f"{VENV}/bin:{TOOLS_SITE}/bin:/usr/local/bin:/usr/bin:/bin",
        VIRTUAL_ENV=VENV,
        LANG="C.UTF-8",
        PYTHONDONTWRITEBYTECODE="1",  # no __pycache__ left in the project
        PYTHONUNBUFFERED="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
    )
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


@dataclass
class Ran:
    exit_code: int | None
    stdout: Bounded
    stderr: Bounded
    duration_ms: int
    timed_out: bool


def _limited(argv: list[str]) -> list[str]:
    memory = int(os.environ.get(MEMORY_ENV) or DEFAULT_MEMORY_MB) * 1024 * 1024
    return ["prlimit", f"--as={memory}", "--nofile=4096", "--", *argv]


async def _spawn(argv: list[str], *, cwd: str, env: dict[str, str], stdin: int) -> Process:
    """``argv`` started under prlimit in a process group of its own, its output piped."""
    return await anyio.open_process(
        _limited(argv),
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


async def run(
    argv: list[str],
    *,
    cwd: str,
    timeout: float,
    env: dict[str, str],
    tail: bool = False,
    stdout_limit: int = OUTPUT_BYTES,
) -> Ran:
    """Run ``argv`` bounded (see the module's docstring): each stream's first (or, ``tail``,
    last) bytes kept, stdout's up to ``stdout_limit`` (a report read whole), stderr's up to
    OUTPUT_BYTES."""
    started = time.monotonic()
    process = await _spawn(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    return await ran_to_end(process, started, timeout=timeout, tail=tail, stdout_limit=stdout_limit)


async def ran_to_end(
    process: Process,
    started: float,
    *,
    timeout: float,
    tail: bool = False,
    stdout_limit: int = OUTPUT_BYTES,
) -> Ran:
    """``process``'s output read (bounded) until it ends or ``timeout`` has passed; its whole
    group killed then, whatever happens (a cancellation too)."""
    stdout, stderr = Bounded(limit=stdout_limit, tail=tail), Bounded(tail=tail)
    timed_out = False
    try:
        async with anyio.create_task_group() as pumps:
            assert process.stdout is not None
            assert process.stderr is not None
            pumps.start_soon(_pump, process.stdout, stdout)
            pumps.start_soon(_pump, process.stderr, stderr)
            with anyio.move_on_after(timeout) as waiting:
                await process.wait()
            timed_out = waiting.cancelled_caught
            _kill_group(process)  # (what it left running in the background too)
            pumps.cancel_scope.deadline = anyio.current_time() + KILL_DRAIN_SECONDS
    finally:
        with anyio.CancelScope(shield=True):
            await _killed(process)
    return Ran(
        None if timed_out else process.returncode,
        stdout,
        stderr,
        round((time.monotonic() - started) * 1000),
        timed_out,
    )


async def _killed(process: Process) -> None:
    """``process``'s group killed and the process reaped (waiting at most KILL_DRAIN_SECONDS)."""
    _kill_group(process)
    with anyio.move_on_after(KILL_DRAIN_SECONDS):
        await process.wait()


class Spare:
    """The next ``run_python``'s interpreter, started ahead (worker_boot.py): at the server's
    start, and again in the background each time a run is done. An interpreter's start is most
    of a short run's cost; this way a call pays only for its code.

    One at most, taken by one call (a second call at once starts its own, as any call does when
    there is none); thrown away after ``pip_install`` (it read the environment's ``.pth`` files
    when it started, before the install) and at the server's end (its whole group killed).
    """

    def __init__(self) -> None:
        self._process: Process | None = None
        self._starting = False
        self.background: anyio.abc.TaskGroup | None = None

    async def given(self, order: bytes) -> Process:
        """An interpreter that took ``order`` (worker_boot.py reads it to the end of its
        stdin): the spare, else — none, or it died waiting — one started now. (The next spare
        is started when the run is done: :meth:`refill_soon`; started now, it would take the
        CPU from this run.) Killed, whatever interrupts the hand-over (a cancellation too)."""
        process, self._process = self._process, None
        took = False
        try:
            if process is not None:
                took = await _ordered(process, order)
                if not took:
                    await _killed(process)
            if not took:
                process = await _booted()
                took = await _ordered(process, order)
        except BaseException:
            if process is not None:
                with anyio.CancelScope(shield=True):
                    await _killed(process)
            raise
        assert process is not None
        if not took:
            await _killed(process)
            raise ToolError("run_python: the session's interpreter did not start")
        return process

    def refill_soon(self) -> None:
        """Start the next spare in the background (once the server runs)."""
        if self.background is not None:
            self.background.start_soon(self.refill)

    async def refill(self) -> None:
        if self._process is not None or self._starting:
            return
        self._starting = True
        try:
            self._process = await _booted()
        except OSError as exc:  # (the environment is missing: each call says so itself)
            print(f"worker-python: no spare interpreter: {exc}", file=sys.stderr)
        finally:
            self._starting = False

    async def discard(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            with anyio.CancelScope(shield=True):
                await _killed(process)

    async def renew(self) -> None:
        """The spare (if any) thrown away and another started in the background."""
        await self.discard()
        self.refill_soon()


async def _ordered(process: Process, order: bytes) -> bool:
    """Whether ``process`` took its order (worker_boot.py reads it to the end of its stdin)."""
    assert process.stdin is not None
    try:
        await process.stdin.send(order)
        await process.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        return False
    return True


async def _booted() -> Process:
    """An interpreter of the session's environment waiting for its order (worker_boot.py)."""
    return await _spawn(
        [f"{VENV}/bin/python", BOOT], cwd=RUNS, env=run_environment(), stdin=subprocess.PIPE
    )


async def _pump(stream: anyio.abc.ByteReceiveStream, into: Bounded) -> None:
    async for chunk in stream:
        into.add(chunk)


def _kill_group(process: anyio.abc.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def refused(exc: Refused) -> ToolError:
    return ToolError(str(exc))


def timed_out(tool: str, seconds: float, ran: Ran) -> ToolError:
    tail = Bounded(limit=4000, tail=True)
    tail.add(ran.stdout.kept)
    tail.add(ran.stderr.kept)
    return ToolError(
        f"{tool}: timed out after {seconds:g} s (its processes were killed); "
        f"the output's end:\n{tail.text()}"
    )


# --- the tools ---------------------------------------------------------------------------------


class PythonRun(TypedDict):
    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int


class Installed(TypedDict):
    name: str
    version: str


class PipInstall(TypedDict):
    installed: list[Installed]
    requested: list[str]
    output: str
    duration_ms: int


class Failure(TypedDict):
    id: str
    outcome: str
    message: str


class TestRun(TypedDict):
    passed: int
    failed: int
    errors: int
    skipped: int
    xfailed: int
    xpassed: int
    collected: int
    exit_code: int
    failures: list[Failure]
    failures_truncated: bool
    output: str
    output_truncated: bool
    duration_ms: int


class Finding(TypedDict):
    file: str
    line: int
    column: int
    code: str
    message: str
    fixable: bool


class Lint(TypedDict):
    findings: list[Finding]
    total: int
    truncated: bool
    duration_ms: int


class FileRead(TypedDict):
    path: str
    content: str
    encoding: str
    size: int
    offset: int
    bytes: int
    truncated: bool


class FileWritten(TypedDict):
    path: str
    bytes_written: int
    size: int


class Entry(TypedDict):
    path: str
    type: str
    size: int | None


class Listing(TypedDict):
    path: str
    entries: list[Entry]
    truncated: bool


SPARE = Spare()


@contextlib.asynccontextmanager
async def _lifespan(_server: MCPServer[None]) -> AsyncIterator[None]:
    """The spare interpreter's life: its background refills, and its end with the server's."""
    async with anyio.create_task_group() as background:
        SPARE.background = background
        background.start_soon(SPARE.refill)
        try:
            yield None
        finally:
            SPARE.background = None
            background.cancel_scope.cancel()
            await SPARE.discard()


server = MCPServer(
    "worker-python",
    lifespan=_lifespan,
    instructions=(
        "A Python sandbox on the project: run code, install packages into the session's "
        "environment, run the project's tests and lint it, read and write its files. Paths are "
        "relative to the project's root."
    ),
)
_installing = anyio.Lock()
_run_names = itertools.count(1)


def _workspace() -> Workspace:
    root = workspace_root()
    if not os.path.isdir(root):
        raise ToolError(f"no workspace: {root} is not a directory")
    return Workspace(root)


def _environment_ready() -> None:
    try:
        make_environment()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ToolError(f"the session's Python environment cannot be made: {exc}") from exc


@server.tool(
    description="Run Python code in the project's directory with the session's packages; "
    "returns its exit code, stdout and stderr (each at most 64 KiB, truncation said) and "
    "duration. timeout: seconds, default 30, at most 600 (the run is killed at it).",
)
async def run_python(code: str, timeout: float | None = None) -> PythonRun:
    try:
        seconds = timeout_of(timeout, PYTHON_TIMEOUT, "run_python")
        source = code_of(code)
    except Refused as exc:
        raise refused(exc) from exc
    workspace = _workspace()
    _environment_ready()
    script = os.path.join(RUNS, f"run-{next(_run_names)}.py")
    with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
        file.write(source)
    try:
        started = time.monotonic()
        order = f"{workspace.root}\0{script}".encode("utf-8", "surrogateescape")
        process = await SPARE.given(order)
        ran = await ran_to_end(process, started, timeout=seconds)
    finally:
        os.unlink(script)
        SPARE.refill_soon()
    if ran.timed_out or ran.exit_code is None:
        raise timed_out("run_python", seconds, ran)
    return PythonRun(
        exit_code=ran.exit_code,
        stdout=ran.stdout.text(),
        stderr=ran.stderr.text(),
        stdout_truncated=ran.stdout.truncated,
        stderr_truncated=ran.stderr.truncated,
        duration_ms=ran.duration_ms,
    )


@server.tool(
    description="Install packages into the session's Python environment (not the project's "
    "files; it lasts as long as the session) from the package index the service may reach. "
    "packages: requirements such as 'requests', 'attrs==24.2', 'rich[jupyter]>=13'. Returns "
    "what was installed. timeout: seconds, default 300, at most 900.",
)
async def pip_install(packages: list[str], timeout: float | None = None) -> PipInstall:
    try:
        seconds = timeout_of(timeout, PIP_TIMEOUT, "pip_install")
        wanted = requirements(packages)
    except Refused as exc:
        raise refused(exc) from exc
    workspace = _workspace()
    _environment_ready()
    report = os.path.join(RUNS, f"pip-{next(_run_names)}.json")
    async with _installing:  # (one pip at a time in one environment)
        try:
            ran = await run(
                [f"{VENV}/bin/python", "-m", "pip", "install", "--no-cache-dir",
                 "--progress-bar", "off", "--report", report, "--", *wanted],
                cwd=workspace.root,
                timeout=seconds,
                env=run_environment(),
                tail=True,
            )  # fmt: skip
            try:
                with open(report, encoding="utf-8") as file:
                    installed = installed_of(file.read())
            except OSError:
                installed = []
        finally:
            if os.path.exists(report):
                os.unlink(report)
            # (the spare read the environment's .pth files before the install)
            await SPARE.renew()
    output = Bounded(limit=8000, tail=True)
    output.add(ran.stdout.kept + ran.stderr.kept)
    if ran.timed_out:
        raise timed_out("pip_install", seconds, ran)
    if ran.exit_code != 0:
        hint = ""
        if "from versions: none" in output.text():  # (pip says why only in its debug log)
            hint = await anyio.to_thread.run_sync(_index_hint, wanted[0])
        raise ToolError(
            f"pip_install failed (pip's exit status {ran.exit_code}):\n{output.text()}{hint}"
        )
    return PipInstall(
        installed=[Installed(name=i["name"], version=i["version"]) for i in installed],
        requested=wanted,
        output=output.text(),
        duration_ms=ran.duration_ms,
    )


def _index_hint(requirement: str) -> str:
    """Why the index had no version, when it refused to answer: its status and the egress
    proxy's reason (``X-Reactor-Fabric-Reason``), asked once more as pip asked."""
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    name = re.split(r"[\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
    url = f"{index.rstrip('/')}/{name}/"
    try:
        with urllib.request.urlopen(url, timeout=10):  # noqa: S310 - the index pip was told
            return ""
    except urllib.error.HTTPError as exc:
        reason = exc.headers.get("X-Reactor-Fabric-Reason")
        said = f" ({reason})" if reason else ""
        return f"\nThe package index answered {url}: HTTP {exc.code}{said}."
    except (OSError, ValueError) as exc:
        return f"\nThe package index {url} cannot be reached: {exc}."


@server.tool(
    description="Run the project's tests with pytest (in the session's environment): counts "
    "of passed, failed, errors and skipped, the failing tests' ids with their first lines, "
    "and the output's end. path: a test file, directory or node id (file::test) relative to "
    "the project; args: more pytest arguments. timeout: seconds, default 300, at most 1800.",
)
async def run_tests(
    path: str | None = None, args: list[str] | None = None, timeout: float | None = None
) -> TestRun:
    workspace = _workspace()
    try:
        seconds = timeout_of(timeout, TESTS_TIMEOUT, "run_tests")
        extra = test_arguments(args)
        target = _test_target(workspace, path)
    except Refused as exc:
        raise refused(exc) from exc
    _environment_ready()
    report = os.path.join(RUNS, f"pytest-{next(_run_names)}.json")
    try:
        ran = await run(
            [f"{VENV}/bin/python", "-m", "pytest", "-p", "no:cacheprovider",
             "-p", "worker_pytest_report", "--color=no", "-q", *extra, *target],
            cwd=workspace.root,
            timeout=seconds,
            env=run_environment(WORKER_PYTEST_REPORT=report),
            tail=True,
        )  # fmt: skip
        if ran.timed_out:
            raise timed_out("run_tests", seconds, ran)
        summary = _read_json(report)
    finally:
        if os.path.exists(report):
            os.unlink(report)
    output = Bounded(tail=True)
    output.add(ran.stdout.kept + ran.stderr.kept)
    if summary is None:
        raise ToolError(
            f"run_tests: pytest ended without a report (exit status {ran.exit_code}):\n"
            f"{output.text()}"
        )
    return TestRun(
        passed=int(summary.get("passed", 0)),
        failed=int(summary.get("failed", 0)),
        errors=int(summary.get("errors", 0)),
        skipped=int(summary.get("skipped", 0)),
        xfailed=int(summary.get("xfailed", 0)),
        xpassed=int(summary.get("xpassed", 0)),
        collected=int(summary.get("collected", 0)),
        exit_code=ran.exit_code if ran.exit_code is not None else -1,
        failures=[
            Failure(id=str(f["id"]), outcome=str(f["outcome"]), message=str(f["message"]))
            for f in summary.get("failures", [])
        ],
        failures_truncated=bool(summary.get("failures_truncated")),
        output=output.text(),
        output_truncated=ran.stdout.truncated or ran.stderr.truncated or output.truncated,
        duration_ms=ran.duration_ms,
    )


def _test_target(workspace: Workspace, path: str | None) -> list[str]:
    """pytest's positional argument for ``path`` (checked as every path is; a node id's
    ``::test`` part kept), after ``--`` so that it is never an option."""
    if not path:
        return []
    file_part, separator, node = path.partition("::")
    parts = workspace.resolve(file_part)
    return ["--", "/".join(parts) + separator + node if parts else "." + separator + node]


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@server.tool(
    description="Lint the project (or path, relative to it) with ruff, the project's own ruff "
    "configuration if it has one: the findings as {file, line, column, code, message, "
    "fixable}, at most 1000. timeout: seconds, default 60, at most 600.",
)
async def lint(path: str | None = None, timeout: float | None = None) -> Lint:
    workspace = _workspace()
    try:
        seconds = timeout_of(timeout, LINT_TIMEOUT, "lint")
        parts = workspace.resolve(path or "")
    except Refused as exc:
        raise refused(exc) from exc
    _environment_ready()
    ran = await run(
        [RUFF, "check", "--output-format", "json", "--no-cache", "--exit-zero", "--",
         "/".join(parts) or "."],
        cwd=workspace.root,
        timeout=seconds,
        env=run_environment(),
        stdout_limit=LINT_REPORT_BYTES,
    )  # fmt: skip
    if ran.timed_out:
        raise timed_out("lint", seconds, ran)
    if ran.exit_code != 0 or ran.stdout.truncated:
        detail = ran.stderr.text() if ran.exit_code != 0 else "its report is over 16 MiB"
        raise ToolError(f"lint: ruff failed (exit status {ran.exit_code}): {detail}")
    try:
        result = lint_findings(ran.stdout.text(), os.path.realpath(workspace.root))
    except Refused as exc:
        raise refused(exc) from exc
    return Lint(
        findings=cast(list[Finding], result["findings"]),
        total=result["total"],
        truncated=result["truncated"],
        duration_ms=ran.duration_ms,
    )


@server.tool(
    description="Read a file of the project (path relative to its root): its text (or base64 "
    "when it is not UTF-8), at most 1 MiB from offset; says when there is more.",
)
def read_file(path: str, offset: int = 0, limit: int = 1024 * 1024) -> FileRead:
    try:
        return cast(FileRead, _workspace().read(path, offset=offset, limit=limit))
    except Refused as exc:
        raise refused(exc) from exc


@server.tool(
    description="Write a file of the project (path relative to its root; its directories are "
    "made): content as UTF-8 text, replacing the file, or appended with append=true.",
)
def write_file(path: str, content: str, append: bool = False) -> FileWritten:
    try:
        return cast(FileWritten, _workspace().write(path, content, append=append))
    except Refused as exc:
        raise refused(exc) from exc


@server.tool(
    description="List a directory of the project (path relative to its root, default the "
    "root): entries {path, type: file|directory|link|other, size}; recursive lists below it "
    "(not into .git, not through links). At most limit entries (default 2000).",
)
def list_files(path: str = "", recursive: bool = False, limit: int = 2000) -> Listing:
    try:
        components(path)  # (refused before the directory is looked at)
        listed = _workspace().list(path, recursive=recursive, limit=limit)
    except Refused as exc:
        raise refused(exc) from exc
    return Listing(
        path=listed["path"],
        entries=cast(list[Entry], listed["entries"]),
        truncated=listed["truncated"],
    )


if __name__ == "__main__":
    try:
        make_environment()  # (before the first call: a pooled container has it ready)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"worker-python: the session's environment cannot be made: {exc}", file=sys.stderr)
    server.run("stdio")
