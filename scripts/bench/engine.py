"""Processes and containers the harness starts, and how it always gets rid of them.

* Docker calls go through docker-py in worker threads, each bounded in time.
* Every container started here without the orchestrator (the floors, and the ones the peers
  start) carries the label ``reactor-fabric.bench=1``; :func:`remove_bench_containers` removes
  them all, and runs in ``finally`` blocks. The orchestrator's containers carry its PID in
  ``reactor-fabric.owner-pid``; it removes them itself when stopped, and
  :func:`remove_orchestrator_containers` is the safety net.
* Peers (supergateway, mcp-proxy) are installed once into a cache directory with npm / pip.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import docker
import docker.errors
import trio

from reactor_fabric.policy.owner import hostname, process_start_time
from reactor_fabric.runtime.docker_operations import attach_socket
from reactor_fabric.runtime.docker_payload import stdio_mounts
from reactor_fabric.runtime.engine_api import EngineAddress, EngineClient
from reactor_fabric.runtime.stdio_sockets import StdioArea, wrapped_command

from .mcp import AttachedStream, PipeStream, SocketStdioStream, StreamRpc, socket_stream

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
BENCH_LABEL = "reactor-fabric.bench"
MANAGED_LABEL = "reactor-fabric.managed"
OWNER_PID_LABEL = "reactor-fabric.owner-pid"
SERVICE_LABEL = "reactor-fabric.service"
DOCKER_CALL_BOUND = 60.0
PROCESS_EXIT_BOUND = 20.0

_client: docker.APIClient | None = None


def _docker() -> docker.APIClient:
    global _client  # noqa: PLW0603 -- one client for the whole run, created in a thread
    if _client is None:
        _client = docker.APIClient(version="auto", timeout=int(DOCKER_CALL_BOUND))
    return _client


async def docker_call(
    fn: Callable[[docker.APIClient], T], *, bound: float = DOCKER_CALL_BOUND
) -> T:
    """``fn(client)`` in a worker thread, abandoned (and an error raised) after ``bound`` s."""
    with trio.fail_after(bound):
        return await trio.to_thread.run_sync(lambda: fn(_docker()), abandon_on_cancel=True)


_ENGINE_CLIENT: list[EngineClient] = []


def _engine_client() -> EngineClient:
    """The orchestrator's engine client (for the attach floor: the same handed-over socket)."""
    if not _ENGINE_CLIENT:
        _ENGINE_CLIENT.append(EngineClient(EngineAddress.parse(None)))
    return _ENGINE_CLIENT[0]


def docker_sync(fn: Callable[[docker.APIClient], T]) -> T:
    """The same, from synchronous code (start-up checks, final clean-up)."""
    return fn(_docker())


def containers_with(labels: list[str]) -> Callable[[docker.APIClient], list[dict[str, Any]]]:
    def listing(client: docker.APIClient) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = client.containers(all=True, filters={"label": labels})
        return found

    return listing


def _remove_all(labels: list[str]) -> Callable[[docker.APIClient], int]:
    def remove(client: docker.APIClient) -> int:
        removed = 0
        for container in containers_with(labels)(client):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                client.remove_container(container["Id"], force=True)
                removed += 1
        return removed

    return remove


def remove_bench_containers() -> int:
    """Remove every container this harness started outside the orchestrator (synchronous)."""
    return docker_sync(_remove_all([f"{BENCH_LABEL}=1"]))


def remove_orchestrator_containers(pid: int) -> int:
    return docker_sync(_remove_all([f"{MANAGED_LABEL}=true", f"{OWNER_PID_LABEL}={pid}"]))


def machine_info() -> dict[str, Any]:
    """Cores, memory, kernel, CPU model and the Docker engine's version."""
    info: dict[str, Any] = {"cores": os.cpu_count()}
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                info["memory_mb"] = round(int(line.split()[1]) / 1024)
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                info["cpu"] = line.partition(":")[2].strip()
                break
    uname = os.uname()
    info["kernel"] = f"{uname.sysname} {uname.release} {uname.machine}"
    info["python"] = sys.version.split()[0]
    try:
        version: dict[str, Any] = docker_sync(lambda c: c.version())
        info["docker_server_version"] = version.get("Version")
        info["docker_api_version"] = version.get("ApiVersion")
        docker_info: dict[str, Any] = docker_sync(lambda c: c.info())
        info["docker_storage_driver"] = docker_info.get("Driver")
        info["docker_cgroup"] = (
            f"{docker_info.get('CgroupDriver')} v{docker_info.get('CgroupVersion', '?')}"
        )
    except docker.errors.DockerException as exc:
        info["docker_error"] = str(exc)
    node = shutil.which("node")
    if node:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                [node, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            info["node"] = done.stdout.strip()
    return info


def load_snapshot(orchestrator_pid: int | None = None) -> dict[str, Any]:
    """What else the machine is doing: load average, running containers not started by us."""

    def ours(labels: dict[str, str]) -> bool:
        return BENCH_LABEL in labels or (
            orchestrator_pid is not None and labels.get(OWNER_PID_LABEL) == str(orchestrator_pid)
        )

    others = docker_sync(
        lambda c: [
            container for container in c.containers() if not ours(container.get("Labels") or {})
        ]
    )
    return {
        "loadavg": [round(value, 2) for value in os.getloadavg()],
        "other_running_containers": len(others),
    }


async def bench_container_count() -> int:
    return len(await docker_call(containers_with([f"{BENCH_LABEL}=1"])))


async def wait_for_count(
    counter: Callable[[], Awaitable[int]], expected: int, *, bound: float
) -> int:
    """Poll until ``counter()`` is ``expected`` (or the time is up); the last count."""
    count = -1
    with trio.move_on_after(bound):
        # Polling the engine: there is no event to wait on.
        while (count := await counter()) != expected:  # noqa: ASYNC110
            await trio.sleep(0.1)
    return count


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rpartition(")")[2].split()
    # After the command name: state is field 3, utime 14 and stime 15 (1-based, man proc).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Where a container's CPU accounting is (cgroup v1 and v2, cgroupfs and systemd drivers): the
# directory, the file, and its unit in nanoseconds.
_CGROUP_CPU = (
    ("cpuacct/docker/{id}", "cpuacct.usage", 1),
    ("cpu,cpuacct/docker/{id}", "cpuacct.usage", 1),
    ("cpuacct/system.slice/docker-{id}.scope", "cpuacct.usage", 1),
    ("docker/{id}", "cpu.stat", 1000),
    ("system.slice/docker-{id}.scope", "cpu.stat", 1000),
)


def container_cpu_ns(container: str) -> int | None:
    """CPU time a running container has used so far, from its cgroup (``container``: its id or
    a unique prefix of it, as the orchestrator logs it); None where it cannot be read."""
    root = Path("/sys/fs/cgroup")
    for pattern, name, unit in _CGROUP_CPU:
        if len(container) == 64:
            directories = [root / pattern.format(id=container)]
        else:
            directories = list(root.glob(pattern.format(id=container + "*")))
        for directory in directories:
            try:
                text = (directory / name).read_text()
            except OSError:
                continue
            if name == "cpuacct.usage":
                return int(text)
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) * unit
    return None


def image_exists(image: str) -> bool:
    try:
        docker_sync(lambda c: c.inspect_image(image))  # type: ignore[no-untyped-call]
    except docker.errors.ImageNotFound:
        return False
    return True


# --- the floors: a container without any relay -----------------------------------------


@dataclass
class AttachedContainer:
    """A container driven through Docker's attach socket: the relay-free floor."""

    id: str
    stream: AttachedStream | SocketStdioStream
    rpc: StreamRpc

    async def aclose(self) -> None:
        with trio.move_on_after(PROCESS_EXIT_BOUND) as scope:
            scope.shield = True
            await self.stream.send_eof()
            await self.stream.aclose()
            await docker_call(lambda c: c.remove_container(self.id, force=True))


async def start_attached(image: str, *, command: list[str] | None = None) -> AttachedContainer:
    """Create (stdin open, no TTY, no network), attach before start, start."""

    def create_attach_start(client: docker.APIClient) -> tuple[str, Any]:
        host_config = client.create_host_config(
            network_mode="none", log_config=docker.types.LogConfig(type="none")
        )
        created: dict[str, Any] = client.create_container(
            image=image,
            command=command,
            stdin_open=True,
            tty=False,
            labels={BENCH_LABEL: "1"},
            network_disabled=True,
            host_config=host_config,
        )
        container_id = str(created["Id"])
        try:
            # The orchestrator's own attach (the engine's upgraded connection, handed over).
            sock = attach_socket(_engine_client(), container_id, stderr_only=False)
            try:
                client.start(container_id)
            except BaseException:
                sock.close()
                raise
        except BaseException:
            client.remove_container(container_id, force=True)
            raise
        return container_id, sock

    container_id, sock = await docker_call(create_attach_start)
    stream = AttachedStream(socket_stream(sock))
    return AttachedContainer(id=container_id, stream=stream, rpc=StreamRpc(stream))


@contextlib.asynccontextmanager
async def attached(image: str) -> AsyncIterator[StreamRpc]:
    """:func:`start_attached` for the duration of the block, removed after it."""
    container = await start_attached(image)
    try:
        yield container.rpc
    finally:
        await container.aclose()


@dataclass
class SocketStdioContainer(AttachedContainer):
    """A container whose stdin and stdout are a socket to us, as the orchestrator's are (see
    reactor_fabric/runtime/stdio_sockets.py): the floor of the orchestrator's own data path."""

    area: StdioArea

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            with trio.move_on_after(PROCESS_EXIT_BOUND) as scope:
                scope.shield = True
                await trio.to_thread.run_sync(self.area.close)


def _bench_stdio_area() -> StdioArea:
    pid = os.getpid()
    owner = {
        "reactor-fabric.owner-host": hostname(),
        "reactor-fabric.owner-pid": str(pid),
        "reactor-fabric.owner-start": process_start_time(pid) or "",
    }
    return StdioArea.open(f"bench-{pid}", owner=owner, this_host=hostname())


async def start_socket_stdio(image: str) -> SocketStdioContainer:
    """Create and start (no network, as the attach floor) with ``fabric-stdio`` in front of the
    image's command, and take its connection. Needs the helper built (make images)."""
    area = await trio.to_thread.run_sync(_bench_stdio_area)
    container_id: str | None = None
    try:
        pending = await trio.to_thread.run_sync(area.listen)
        try:

            def create_start(client: docker.APIClient) -> str:
                config = client.inspect_image(image)["Config"] or {}  # type: ignore[no-untyped-call]
                host_config = client.create_host_config(
                    network_mode="none",
                    log_config=docker.types.LogConfig(type="none"),
                    mounts=[
                        docker.types.Mount(m["Target"], m["Source"], type="bind", read_only=True)
                        for m in stdio_mounts(area.helper, pending.path)
                    ],
                )
                created: dict[str, Any] = client.create_container(
                    image=image,
                    entrypoint=wrapped_command(config.get("Entrypoint"), config.get("Cmd"), None),
                    labels={BENCH_LABEL: "1"},
                    network_disabled=True,
                    host_config=host_config,
                )
                client.start(created["Id"])
                return str(created["Id"])

            container_id = await docker_call(create_start)
            with trio.fail_after(DOCKER_CALL_BOUND):
                await trio.lowlevel.wait_readable(pending.listener)
            connection, _ = pending.listener.accept()
        finally:
            pending.close()
    except BaseException:
        with trio.CancelScope(shield=True):
            if container_id is not None:
                cid = container_id
                await docker_call(lambda c: c.remove_container(cid, force=True))
            await trio.to_thread.run_sync(area.close)
        raise
    connection.setblocking(False)
    stream = SocketStdioStream(socket_stream(connection))
    return SocketStdioContainer(id=container_id, area=area, stream=stream, rpc=StreamRpc(stream))


@contextlib.asynccontextmanager
async def socket_stdio(image: str) -> AsyncIterator[StreamRpc]:
    """:func:`start_socket_stdio` for the duration of the block, removed after it."""
    container = await start_socket_stdio(image)
    try:
        yield container.rpc
    finally:
        await container.aclose()


# Every container the benchmark starts logs nothing in the engine, as the orchestrator's do
# (HostConfig LogConfig none): otherwise dockerd would encode and store each message of the
# floors and the peers and not ours, and the comparisons would be partly of engine logging.
NO_ENGINE_LOG = ("--log-driver", "none")


def docker_run_argv(image: str, *options: str) -> list[str]:
    return [
        "docker", "run", "-i", "--rm", "--label", f"{BENCH_LABEL}=1", *NO_ENGINE_LOG, *options,
        image,
    ]  # fmt: skip


@dataclass
class PipedProcess:
    """A child process spoken to over its stdin/stdout (``docker run -i --rm IMAGE``)."""

    process: trio.Process
    stream: PipeStream
    rpc: StreamRpc

    async def aclose(self) -> int | None:
        """Close stdin (the MCP way to stop a stdio server), reap; kill if it lingers."""
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
        return await reap(self.process, PROCESS_EXIT_BOUND)


async def spawn_piped(argv: list[str], stderr: IO[bytes]) -> PipedProcess:
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
    )
    stream = PipeStream(process)
    return PipedProcess(process=process, stream=stream, rpc=StreamRpc(stream))


@contextlib.asynccontextmanager
async def piped(argv: list[str], stderr: IO[bytes]) -> AsyncIterator[StreamRpc]:
    """:func:`spawn_piped` for the duration of the block; stdin closed and reaped after it."""
    process = await spawn_piped(argv, stderr)
    try:
        yield process.rpc
    finally:
        await process.aclose()


async def reap(process: trio.Process, bound: float, *, sig: int | None = None) -> int | None:
    """Wait for a process (after sending ``sig``); SIGKILL it after ``bound`` s."""
    with trio.CancelScope(shield=True):
        if sig is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
        with trio.move_on_after(bound):
            await process.wait()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with trio.move_on_after(10):
                await process.wait()
    return process.returncode


# --- the orchestrator -------------------------------------------------------------------

BENCH_TOKEN = secrets.token_urlsafe(32)


@dataclass
class Orchestrator:
    process: trio.Process
    http_url: str
    log_path: Path
    banner: str
    _log_file: IO[bytes] = field(repr=False)
    # The orchestrator runs as users run it, with authentication on: every request carries it.
    token: str = BENCH_TOKEN

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.http_url.rsplit(":", 1)[1].rstrip("/"))

    def ws_url(self, service: str, query: str = "") -> str:
        """The service's WebSocket URL with the token in it (WebSocket clients send no header)."""
        base = "ws" + self.http_url.removeprefix("http")
        query = "&".join(part for part in (query, f"token={self.token}") if part)
        return f"{base}/mcp/{service}?{query}"

    def fabric_ws_url(self, query: str = "") -> str:
        """The fabric endpoint's (``/mcp``) WebSocket URL with the token in it."""
        base = "ws" + self.http_url.removeprefix("http")
        query = "&".join(part for part in (query, f"token={self.token}") if part)
        return f"{base}/mcp?{query}"

    def containers(self) -> Callable[[docker.APIClient], list[dict[str, Any]]]:
        return containers_with([f"{MANAGED_LABEL}=true", f"{OWNER_PID_LABEL}={self.pid}"])

    async def container_count(self) -> int:
        return len(await docker_call(self.containers()))

    async def wait_for_containers(self, expected: int, *, bound: float) -> int:
        """Poll until exactly ``expected`` containers of ours exist (or the time is up)."""
        return await wait_for_count(self.container_count, expected, bound=bound)

    async def get(self, path: str, *, bound: float = 10.0) -> bytes:
        """``GET path`` with the token (an operator's request: /metrics, /healthz)."""
        request = urllib.request.Request(self.http_url + path, headers=self.auth_headers)

        def fetch() -> bytes:
            with urllib.request.urlopen(request, timeout=bound) as response:
                body: bytes = response.read()
                return body

        with trio.fail_after(bound + 1):
            return await trio.to_thread.run_sync(fetch, abandon_on_cancel=True)

    async def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The Prometheus exposition: each sample's labels and value, by metric name."""
        return parse_metrics((await self.get("/metrics")).decode())

    async def healthz(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(await self.get("/healthz"))
        return found

    async def stop(self) -> int | None:
        try:
            return await reap(self.process, 60, sig=signal.SIGTERM)
        finally:
            with contextlib.suppress(OSError):
                if self.process.stdout is not None:
                    await self.process.stdout.aclose()
            self._log_file.close()


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of the Prometheus text format (comments skipped), by metric name."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        found.setdefault(name, []).append((dict(_LABEL.findall(labels or "")), float(value)))
    return found


class LogTail:
    """The JSON lines an orchestrator appends to its log from now on (or from its start),
    read without waiting."""

    def __init__(self, path: Path, *, from_start: bool = False) -> None:
        self._file = path.open("rb")
        if not from_start:
            self._file.seek(0, os.SEEK_END)
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        data = self._partial + self._file.read()
        *lines, self._partial = data.split(b"\n")
        return json_objects(lines)

    def close(self) -> None:
        self._file.close()


def log_events(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of an orchestrator's log (lines that are not JSON are skipped)."""
    with path.open("rb") as log:
        return json_objects(log)


def json_objects(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    """The lines that are JSON objects, decoded (the others, a traceback say, skipped)."""
    objects: list[dict[str, Any]] = []
    for line in lines:
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                objects.append(value)
    return objects


def audit_records(log_path: Path) -> list[dict[str, Any]]:
    """The audit trail of the orchestrator that logs to ``log_path`` (its ``audit_trail`` event
    names the file), as written so far; empty when there is none."""
    for event in log_events(log_path):
        if event.get("event") == "audit_trail" and isinstance(event.get("path"), str):
            with contextlib.suppress(OSError):
                return log_events(Path(event["path"]))
    return []


async def start_orchestrator(suite: Path, log_path: Path) -> Orchestrator:
    """``python -m reactor_fabric --config SUITE --port 0``; ready once it prints its URL."""
    log_file = log_path.open("wb")
    # A state directory of its own: each orchestrator writes its own audit trail.
    state = log_path.with_name(log_path.stem + "-state")
    state.mkdir(exist_ok=True)
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            *("-m", "reactor_fabric", "--config", str(suite), "--port", "0"),
            f"--token={BENCH_TOKEN}",  # one argument: a token may begin with "-"
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log_file,
        cwd=REPO,
        env={**os.environ, "XDG_STATE_HOME": str(state)},
    )
    try:
        assert process.stdout is not None
        first = b""
        with trio.fail_after(60):
            while b"\n" not in first:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                first += chunk
    except BaseException:
        await reap(process, 10, sig=signal.SIGTERM)
        log_file.close()
        raise
    banner = first.decode(errors="replace").strip()
    match = re.search(r"on (http://\S+)", banner)
    if not match:
        await reap(process, 10, sig=signal.SIGTERM)
        log_file.close()
        raise RuntimeError(f"the orchestrator did not start: {banner!r}; log: {log_path}")
    return Orchestrator(process, match.group(1), log_path, banner, log_file)


# --- peers: the relays a user might pick instead -----------------------------------------

SUPERGATEWAY_SPEC = "supergateway@4"
MCP_PROXY_SPEC = "mcp-proxy==0.13.*"
INSTALL_BOUND = 600


def peers_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "reactor-fabric" / "bench-peers"


def _keyed(name: str, spec: str) -> Path:
    return peers_dir() / f"{name}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"


def _run(argv: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=INSTALL_BOUND
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {(done.stdout + done.stderr)[-1500:]}")


def ensure_supergateway() -> list[str]:
    """``[node, .../supergateway/dist/index.js]``, installed with npm on first use."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError("node and npm are needed for supergateway")
    home = _keyed("supergateway", SUPERGATEWAY_SPEC)
    entry = home / "node_modules" / "supergateway" / "dist" / "index.js"
    if not (home / ".ready").exists():
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        (home / "package.json").write_text('{"name": "rf-bench-peers", "private": true}\n')
        _run([npm, "install", "--no-audit", "--no-fund", "--silent", SUPERGATEWAY_SPEC], cwd=home)
        (home / ".ready").touch()
    if not entry.exists():
        raise RuntimeError(f"supergateway installed, but {entry} is missing")
    return [node, str(entry)]


def ensure_mcp_proxy() -> list[str]:
    """``[.../bin/mcp-proxy]`` from its own virtual environment, installed with pip."""
    home = _keyed("mcp-proxy", MCP_PROXY_SPEC)
    program = home / "bin" / "mcp-proxy"
    if not (home / ".ready").exists():
        shutil.rmtree(home, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(home)])
        _run(
            [
                str(home / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                MCP_PROXY_SPEC,
            ]
        )
        (home / ".ready").touch()
    return [str(program)]


def installed_version(kind: str) -> str | None:
    """The version of an installed peer, for the results file."""
    if kind == "supergateway":
        package = (
            _keyed("supergateway", SUPERGATEWAY_SPEC)
            / "node_modules"
            / "supergateway"
            / "package.json"
        )
        found = (
            re.search(r'"version":\s*"([^"]+)"', package.read_text()) if package.exists() else None
        )
        return found.group(1) if found else None
    home = _keyed("mcp-proxy", MCP_PROXY_SPEC)
    for info in (home / "lib").glob("python*/site-packages/mcp_proxy-*.dist-info"):
        return info.name.removeprefix("mcp_proxy-").removesuffix(".dist-info")
    return None


@dataclass
class Peer:
    """A relay process (its stdin is kept open: supergateway exits when stdin closes)."""

    name: str
    process: trio.Process
    port: int

    def alive(self) -> bool:
        return self.process.returncode is None and self.process.poll() is None

    async def stop(self) -> int | None:
        try:
            return await reap(self.process, PROCESS_EXIT_BOUND, sig=signal.SIGTERM)
        finally:
            if self.process.stdin is not None:
                with contextlib.suppress(OSError, trio.BrokenResourceError):
                    await self.process.stdin.aclose()


async def start_peer(name: str, argv: list[str], port: int, log: IO[bytes]) -> Peer:
    process = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=log,
    )
    return Peer(name=name, process=process, port=port)


# The machine counts as idle while its CPUs are busy less than this share of a quarter second;
# it is waited for that long at most.
IDLE_BELOW = 0.05
IDLE_WAIT_SECONDS = 30.0


async def until_cpus_idle() -> bool:
    """Until the machine's CPUs are idle (a measurement must not share them with what the one
    before left running: a pooled container's server still loading, a copy being removed);
    whether they were, within IDLE_WAIT_SECONDS (else something else keeps them busy: the
    caller measures anyway, and counts it)."""
    with trio.move_on_after(IDLE_WAIT_SECONDS) as waiting:
        while await busy_share(0.25) > IDLE_BELOW:
            pass
    return not waiting.cancelled_caught


async def busy_share(seconds: float) -> float:
    """The share of the machine's CPU time not idle over ``seconds`` (/proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(n) for n in stat.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # (all, idle + iowait)

    total, idle = sample()
    await trio.sleep(seconds)
    total2, idle2 = sample()
    spent = total2 - total
    return 0.0 if spent <= 0 else 1.0 - (idle2 - idle) / spent
