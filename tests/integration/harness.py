"""Real orchestrator processes and real client processes, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import inspect
import ipaddress
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.parse
import urllib.request
import zoneinfo
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as clock_time
from pathlib import Path
from typing import Any, Literal

import docker
import pytest
import yaml

from reactor_fabric._operator_cli import audit_file_name
from reactor_fabric.config.token import TOKEN_ENV
from reactor_fabric.runtime.stdio_sockets import HELPER_TARGET, SOCKET_TARGET
from reactor_fabric.trio.catalog import PROBE_SESSION_PREFIX
from tests.clients import envs

REPO = Path(__file__).resolve().parents[2]
BUNDLED = yaml.safe_load((REPO / "claude-mcp-suite.yaml").read_text())
READ_TIMEOUT = 120.0
# Every orchestrator a test starts requires this token unless told otherwise, and every client
# process finds it where a user's would: REACTOR_FABRIC_TOKEN (the test clients send it as a
# header over HTTP and as ?token= over WebSocket, whose SDK clients cannot set headers).
TEST_TOKEN = secrets.token_urlsafe(32)
# What client processes get as REACTOR_FABRIC_TOKEN (None: nothing; tests of refusals change it).
CLIENT_TOKEN: str | None = TEST_TOKEN
# The orchestrators the running test started (conftest checks that none left a container).
STARTED: list[Orchestrator] = []


def client_token_env() -> dict[str, str]:
    return {TOKEN_ENV: CLIENT_TOKEN} if CLIENT_TOKEN is not None else {}


class LineProcess:
    """A subprocess spoken to in JSON lines, every read bounded in time."""

    def __init__(
        self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.argv = argv
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **client_token_env(), **(env or {})},
            cwd=cwd,
        )
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        assert self.process.stdout is not None
        self._selector.register(self.process.stdout, selectors.EVENT_READ)

    def readline(self, timeout: float = READ_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                raise TimeoutError(
                    f"no line from {self.argv[:3]} in {timeout}s; stderr: {self.stderr_tail()}"
                )
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                raise EOFError(
                    f"{self.argv[:3]} exited ({self.process.wait()}); stderr: {self.stderr_tail()}"
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def read_json(self, timeout: float = READ_TIMEOUT) -> dict[str, Any]:
        while True:
            line = self.readline(timeout)
            if line.startswith("{"):
                decoded: dict[str, Any] = json.loads(line)
                return decoded

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        self.process.stdin.flush()

    def ask(self, command: dict[str, Any], timeout: float = READ_TIMEOUT) -> dict[str, Any]:
        self.send(command)
        return self.read_json(timeout)

    def stderr_tail(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return "(still running)"
        return self.process.stderr.read().decode(errors="replace")[-3000:]

    def close(self, timeout: float = 30) -> int:
        if self.process.poll() is None and self.process.stdin and not self.process.stdin.closed:
            try:
                self.send({"op": "exit"})
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._selector.close()
        for pipe in (self.process.stdout, self.process.stderr, self.process.stdin):
            if pipe is not None and not pipe.closed:
                pipe.close()
        return code


@dataclass
class Orchestrator:
    process: subprocess.Popen[bytes]
    http_url: str
    log_path: Path
    token: str | None = TEST_TOKEN
    state_dir: Path | None = None  # its XDG_STATE_HOME (its audit trail is there)

    @property
    def auth_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def ws_url(self) -> str:
        return "ws" + self.http_url.removeprefix("http")

    @property
    def instance(self) -> str:
        """This orchestrator's instance id (stamped on its containers), from its logs."""
        return str(next(e["instance"] for e in self.logs() if e["event"] == "serving"))

    @property
    def audit_path(self) -> Path:
        """Its audit trail: the default trail of its port, in its state directory."""
        assert self.state_dir is not None
        port = urllib.parse.urlsplit(self.http_url).port
        assert port is not None
        return self.state_dir / "reactor-fabric" / audit_file_name(port)

    def audit(self) -> list[dict[str, Any]]:
        """The records of its audit trail written so far (complete lines only)."""
        path = self.audit_path
        if not path.exists():
            return []
        complete = path.read_text().rpartition("\n")[0]
        return [json.loads(line) for line in complete.splitlines()]

    def logs(self) -> list[dict[str, Any]]:
        # Only complete lines: the orchestrator may be writing the last one right now.
        complete = self.log_path.read_text().rpartition("\n")[0]
        return [json.loads(line) for line in complete.splitlines() if line.startswith("{")]


def write_suite(
    path: Path,
    roots: list[str],
    *,
    timeouts: dict[str, str] | None = None,
    images: dict[str, str] | None = None,
    test_services: dict[str, dict[str, Any]] | None = None,
    service_fields: dict[str, dict[str, Any]] | None = None,
    **orchestrator: Any,
) -> Path:
    """The bundled suite's services, with test roots and (optionally) other timeouts/images,
    plus ``test_services``: name → fields added to a local test image's service (see
    :func:`build_test_image`), e.g. ``{"image": tag, "config": {...}}``; ``service_fields``:
    name → fields set on a bundled service (``container_strategy``, ``warm``…)."""
    suite = json.loads(json.dumps(BUNDLED))
    # The bundled accounts stay (its specialist names one), unless the test gives its own.
    accounts = BUNDLED["orchestrator"].get("accounts", {})
    suite["orchestrator"] = {"allowed_mount_roots": roots, "accounts": accounts, **orchestrator}
    # No warm pool unless a test asks for one (test_warm_pool_e2e): the others count and
    # inspect their sessions' containers, and a pool's would be in the way.
    for service in suite["mcp_services"].values():
        service.pop("warm", None)
    for name, timeout in (timeouts or {}).items():
        suite["mcp_services"][name]["timeout"] = timeout
    for name, image in (images or {}).items():
        suite["mcp_services"][name]["image"] = image
    for name, fields in (service_fields or {}).items():
        suite["mcp_services"][name].update(fields)
    for name, fields in (test_services or {}).items():
        suite["mcp_services"][name] = {"pull": "never", "network": "none", **fields}
    for name, fields in (service_fields or {}).items():
        suite["mcp_services"][name].update(fields)
    path.write_text(yaml.safe_dump(suite))
    return path


DOCKER_SOCKET = "/var/run/docker.sock"


def engine_socket() -> str:
    """The socket of the engine the tests use: DOCKER_HOST's (Podman's, say), else Docker's."""
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else DOCKER_SOCKET


TEST_IMAGES = Path(__file__).resolve().parent / "images"


def build_test_image(
    name: str, *, version: str = "1", buildargs: dict[str, str] | None = None
) -> str:
    """Build ``images/NAME`` on the bundled time image (its Python; nothing is downloaded), as
    ``reactor-fabric/test-NAME:VERSION``; ``buildargs``: more build arguments (two builds of
    one directory that differ in one of them)."""
    tag = f"reactor-fabric/test-{name}:{version}"
    client = docker.from_env(version="auto", timeout=120)
    try:
        base = BUNDLED["mcp_services"]["time"]["image"]
        # rm/forcerm: the build's intermediate containers go too (docker-py keeps them by
        # default, and each run of the tests left some on the engine).
        client.images.build(
            path=str(TEST_IMAGES / name),
            tag=tag,
            buildargs={"BASE": base, **(buildargs or {})},
            # Podman's builder reuses a cached layer whose instruction reads a build argument
            # given another value: two builds that differ only there would be one image.
            nocache=buildargs is not None,
            rm=True,
            forcerm=True,
        )
    finally:
        client.close()
    return tag


def post(fabric: Orchestrator, path: str, message: dict[str, Any], **headers: str) -> Any:
    """A raw Streamable HTTP POST of one JSON-RPC message (for frames and headers no SDK sends
    on demand); the open response."""
    body = json.dumps(message).encode()
    all_headers = {
        **fabric.auth_header,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
        **headers,
    }
    request_ = urllib.request.Request(f"{fabric.http_url}{path}", body, all_headers)
    return urllib.request.urlopen(request_, timeout=30)


@contextmanager
def orchestrator(
    suite: Path,
    log_path: Path,
    *extra: str,
    expect_clean_exit: bool = True,
    env: dict[str, str] | None = None,
    run_as: tuple[int, int] | None = None,
    token: str | None = TEST_TOKEN,
) -> Iterator[Orchestrator]:
    """An orchestrator on a free port; ``run_as`` (uid, gid) starts it as that user, a member
    of the group that may use the Docker socket (the set-up the docs recommend over root)."""
    account: dict[str, Any] = {}
    python = sys.executable
    if run_as is not None:
        account = {
            "user": run_as[0],
            "group": run_as[1],
            "extra_groups": [os.stat(engine_socket()).st_gid],
        }
        python, path = python_for(account)
        env = {**(env or {}), "PYTHONPATH": path}
    # A state directory of its own: the audit trail of one orchestrator per file.
    state = log_path.with_name(log_path.stem + "-state")
    if run_as is not None:
        # Another user cannot reach into pytest's private temporary directory.
        state = Path(tempfile.mkdtemp(prefix="reactor-fabric-state-"))
        os.chown(state, *run_as)
    state.mkdir(exist_ok=True)
    env = {"XDG_STATE_HOME": str(state), **(env or {})}
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [
            python,
            "-m",
            "reactor_fabric",
            "--config",
            str(suite),
            "--port",
            "0",
            "--log-level",
            "debug",
            # One argument: a token may begin with "-" (token_urlsafe), which argparse would
            # take for an option.
            *([f"--token={token}"] if token is not None else []),
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log_file,
        env={**os.environ, **(env or {})},
        **account,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline().decode()
        match = re.search(r"on (http://[^ ]+) ", first)
        assert match, f"orchestrator did not start: {first!r}\n{log_path.read_text()[-3000:]}"
        # Its state directory: the harness's own, unless the test gave one (env).
        state_home = Path(env["XDG_STATE_HOME"])
        running = Orchestrator(process, match.group(1), log_path, token, state_home)
        STARTED.append(running)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise
            if expect_clean_exit:
                assert code == 0, log_path.read_text()[-3000:]
        if process.stdout:
            process.stdout.close()
        log_file.close()
        if run_as is not None:
            shutil.rmtree(state, ignore_errors=True)


def orchestrator_fixture(
    *,
    scope: Literal["function", "module"] = "function",
    home: str | None = None,
    roots: Literal["projects", "home"] = "projects",
    given: Callable[..., dict[str, Any]] | None = None,
    env: Callable[..., dict[str, str]] | None = None,
    after: Callable[..., None] | None = None,
    **options: Any,
) -> Any:
    """A fixture serving one orchestrator (:func:`orchestrator`) to the tests that ask for it
    by the name a test module binds it to: ``fabric = orchestrator_fixture(scope="module")``.

    Its suite is the bundled one written by :func:`write_suite` with ``options`` (timeouts,
    images, test_services, service_fields, orchestrator settings), its suite file and log in
    ``home``: the fixture of that name's directory, else the test's tmp_path (``scope``
    "function": one orchestrator per test) or a directory of the module's own ("module": one
    shared by the module's tests). Mounts are allowed below ``home/projects`` (``roots``
    "projects": for one per test, the ``project_root`` fixture's) or anywhere in ``home``.
    ``given``, ``env`` and ``after`` are functions whose parameters name other fixtures: the
    options that depend on them (an image the module builds, a cluster), the orchestrator's
    environment, and what is checked once it has stopped.
    """

    def values(request: pytest.FixtureRequest, function: Callable[..., Any]) -> dict[str, Any]:
        names = inspect.signature(function).parameters
        return {name: request.getfixturevalue(name) for name in names}

    @pytest.fixture(scope=scope)
    def served(request: pytest.FixtureRequest) -> Iterator[Orchestrator]:
        if home is not None:
            place: Path = request.getfixturevalue(home)
        elif scope == "function":
            place = request.getfixturevalue("tmp_path")
        else:
            factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
            place = factory.mktemp(request.module.__name__.rpartition(".")[2])
        if roots == "home":
            allowed = place
        elif scope == "function" and home is None:
            allowed = request.getfixturevalue("project_root")
        else:
            allowed = place / "projects"
            allowed.mkdir(exist_ok=True)
        more = given(**values(request, given)) if given is not None else {}
        suite = write_suite(place / "suite.yaml", [str(allowed)], **options, **more)
        environment = env(**values(request, env)) if env is not None else None
        with orchestrator(suite, place / "orchestrator.log", env=environment) as running:
            yield running
        if after is not None:
            after(**values(request, after))

    return served


def python_for(account: dict[str, Any]) -> tuple[str, str]:
    """An interpreter of our Python version that ``account`` may run, and the PYTHONPATH that
    gives it our packages: the venv's own interpreter may live in root's home (pyenv)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    path = os.pathsep.join([sysconfig.get_paths()["purelib"], str(REPO)])
    candidates = [sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    for candidate in candidates:
        try:
            works = subprocess.run(
                [candidate, "-c", "import reactor_fabric, trio, msgspec, docker"],
                env={**os.environ, "PYTHONPATH": path},
                capture_output=True,
                check=False,
                **account,
            )
        except OSError:
            continue
        if works.returncode == 0:
            return candidate, path
    raise AssertionError(
        f"no Python {version} that uid {account['user']} may run among {candidates}"
    )


# An ordinary user's: a client's checkout on a developer's machine (the tests run as root).
CLIENT_IDS = (1000, 1000)


def give_to_client(project: Path) -> Path:
    """Make ``project`` (every file below it) the client's, as a checkout is, and let the
    client reach it: git in the orchestrator runs as the repository's owner, by path."""
    for path in [project, *project.rglob("*")]:
        os.lchown(path, *CLIENT_IDS)
    for parent in project.parents:
        with contextlib.suppress(OSError):
            parent.chmod(parent.stat().st_mode | 0o011)
    return project


def git_repo(path: Path, commits: list[str]) -> Path:
    path.mkdir(parents=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=env)
    for message in commits:
        (path / "log.txt").write_text(message)
        subprocess.run(["git", "-C", str(path), "add", "log.txt"], check=True, env=env)
        subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", message], check=True, env=env)
    return path


CLIENTS = Path(__file__).resolve().parents[1] / "clients"


def python_client(url: str, *args: str, env: dict[str, str] | None = None) -> LineProcess:
    return LineProcess(
        [str(envs.python_sdk1()), str(CLIENTS / "mcp1_client.py"), url, *args], env=env
    )


def python2_client(
    url: str, mode: str = "auto", *args: str, env: dict[str, str] | None = None
) -> LineProcess:
    """The Python SDK 2.x over Streamable HTTP (``mode``: auto, or legacy: the handshake;
    ``args``: more of mcp2_client.py's options, e.g. --trace)."""
    return LineProcess(
        [sys.executable, str(CLIENTS / "mcp2_client.py"), "http", url, "--mode", mode, *args],
        env=env,
    )


def time_call_through_fabric(client: LineProcess) -> str:
    """On an SDK 2.x client of the fabric endpoint: initialize, learn the session's id from
    ``get_status``, call ``time__get_current_time`` (asserted ok), close (asserted clean); the
    session's id."""
    try:
        initialized = client.ask({"op": "initialize"})
        assert initialized["ok"], initialized
        status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
        assert status.get("ok"), status
        assert "structured" in status, status
        session = str(status["structured"]["session_id"])
        answer = client.ask(
            {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        )
        assert answer["ok"], answer
    finally:
        assert client.close() == 0
    return session


def bridged_client(
    endpoint: str,
    *bridge_args: str,
    cwd: Path | None = None,
    server_env: dict[str, str] | None = None,
) -> LineProcess:
    """The Python SDK 2.x with the stdio bridge as its server: it launches
    ``reactor-fabric connect ENDPOINT BRIDGE_ARGS`` (in ``cwd``: what the bridge mounts;
    ``server_env``: variables set in the bridge's environment, as a client's "env" block)."""
    command = [sys.executable, "-m", "reactor_fabric", "connect", endpoint, *bridge_args]
    extra = ["--cwd", str(cwd)] if cwd is not None else []
    env = {**(server_env or {}), "REACTOR_FABRIC_SERVER_ENV": ",".join(server_env or {})}
    return LineProcess(
        [sys.executable, str(CLIENTS / "mcp2_client.py"), "stdio", *extra, "--", *command],
        cwd=REPO,
        env=env,
    )


def claude_mcp(home: Path, project: Path, *arguments: str, timeout: float = 120) -> str:
    """``claude mcp ARGUMENTS`` as a user whose home is ``home`` runs it in ``project``
    (Claude Code's ``mcp add/list/get`` need no API key); its stdout, asserted to succeed."""
    environ = {
        "HOME": str(home),
        "PATH": os.environ["PATH"],
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return subprocess.run(
        [str(envs.claude_code()), "mcp", *arguments],
        cwd=project,
        env=environ,
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout,
    ).stdout


def claude_shows_connected(workdir: Path, name: str, url: str) -> None:
    """Claude Code, given ``url`` as the HTTP server ``name`` with the test token (a fresh home
    and project below ``workdir``), lists it as connected."""
    home = workdir / "claude-home"
    project = workdir / "claude-project"
    home.mkdir()
    project.mkdir()
    authorization = f"Authorization: Bearer {TEST_TOKEN}"
    claude_mcp(home, project, "add", "--transport", "http", name, url, "--header", authorization)
    listed = claude_mcp(home, project, "list", timeout=300)
    assert f"{name}: {url} (HTTP) - ✔ Connected" in listed, listed


def ts_client(url: str, *args: str) -> LineProcess:
    transport = "http" if url.startswith("http") else "ws"
    return LineProcess([*envs.node_command("ts_client.mjs"), transport, url, *args])


def started_call(client: LineProcess, call: dict[str, Any]) -> None:
    """Have ``client`` (the Python SDK 1.x) send ``call``, a long one that reports progress,
    and return once the first progress is reported: the server has the request and works on
    it."""
    client.send({"op": "call", **call, "report_progress": True})
    first = client.read_json()
    assert first.get("op") == "progress", first


def answer_past_progress(client: LineProcess, timeout: float = READ_TIMEOUT) -> dict[str, Any]:
    """The next answer ``client`` reports, past the progress a call reported before it."""
    answer = client.read_json(timeout)
    while answer.get("op") == "progress":
        answer = client.read_json(timeout)
    return answer


def wait_until(condition: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def remove_container(container: Any, *, volumes: bool = False) -> None:
    """Force-remove a container a test started itself, as the product's engine client does.

    Podman answers a force-remove that meets a container exiting on its own (its process
    just ended) with a 500 "container state improper" instead of removing it; asked again a
    moment later, it does. A container already gone is fine.
    """
    deadline = time.monotonic() + 30
    while True:
        try:
            container.remove(force=True, v=volumes)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            exiting = exc.status_code == 500 and "container state improper" in str(exc)
            if not exiting or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        else:
            return


def containers_of(
    client: docker.DockerClient, *, include_probes: bool = False, **labels: str
) -> list[Any]:
    """Containers with these reactor-fabric labels, fully inspected; those of client sessions
    only, unless ``include_probes`` (an orchestrator's catalog probes run at its start-up).

    The listing is taken sparse (ids and labels, one call) and each container inspected on
    its own: one removed in between (the orchestrator removing it right now: NotFound; Podman
    a 500 "no such container") is no longer there, and is left out. (docker-py's full listing
    inspects them all and fails on such a one; retried, it could fail every time under a
    warm pool's churn, and its sparse fallback had neither names nor labels.)
    """
    filters = [f"reactor-fabric.{key.replace('_', '-')}={value}" for key, value in labels.items()]
    found: list[Any] = []
    for listed in client.containers.list(all=True, filters={"label": filters}, sparse=True):
        try:
            container = client.containers.get(str(listed.id))
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            # Podman's 500 "no such container" when it went while we looked.
            if exc.status_code == 500 and "no such container" in str(exc.explanation or ""):
                continue
            raise
        session = container.labels.get("reactor-fabric.session", "")
        if include_probes or not session.startswith(PROBE_SESSION_PREFIX):
            found.append(container)
    return found


def bridge_gateway(client: Any) -> str:
    """The address of the engine's default bridge on this machine (where a container reaches
    the host). Docker leaves ``Gateway`` out of the network's IPAM config when the bridge's
    interface had its address before the daemon started; then it is the bridge interface's
    own address, which Docker gives as the subnet's first host unless ``--bip`` says other."""
    network = client.api.inspect_network("bridge")
    config = network["IPAM"]["Config"][0]
    if config.get("Gateway"):
        return str(config["Gateway"])
    interface = (network.get("Options") or {}).get("com.docker.network.bridge.name")
    if interface:
        shown = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "dev", interface],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if "inet" in shown:
            return shown[shown.index("inet") + 1].split("/")[0]
    return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


@contextlib.contextmanager
def bridge_up(client: Any) -> Iterator[str]:
    """The engine's default bridge address (:func:`bridge_gateway`), usable on this host for the
    block. Podman creates its bridge's interface only while a container is attached to it, so
    that a listener can be bound there one is kept running on it meanwhile (Docker's is there
    from the daemon's start)."""
    keeper = None
    if engine_is_podman(client):
        keeper = client.containers.run(
            "reactor-fabric/base:bookworm", ["sleep", "600"], detach=True, remove=True
        )
    try:
        yield bridge_gateway(client)
    finally:
        if keeper is not None:
            with contextlib.suppress(Exception):
                keeper.remove(force=True)


def engine_is_podman(client: Any) -> bool:
    """Whether the engine the tests use is Podman (its /version lists a Podman component)."""
    components = client.version().get("Components") or []
    return any(component.get("Name") == "Podman Engine" for component in components)


def assert_confined_by_effect(pid: int) -> None:
    """A container's init (``pid``, on the host) and the server it runs are confined, as the
    kernel sees them, not as an engine reports its settings (Docker says ``CapDrop: ["ALL"]``,
    Podman lists the capabilities it dropped): no capability at all, not even in the bounding
    set, no new privileges, not root, and a read-only root file system."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert children, "the container's init runs no server"
    for process in (pid, *map(int, children)):
        status = dict(
            line.split(":\t", 1)
            for line in Path(f"/proc/{process}/status").read_text().splitlines()
        )
        for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status[field], 16) == 0, (process, field, status[field])
        assert status["NoNewPrivs"].strip() == "1", process
        assert "0" not in status["Uid"].split(), (process, status["Uid"])
    root = next(
        line.split()
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        if line.split()[4] == "/"
    )
    assert "ro" in root[5].split(","), root


def mounted_directories(container: Any, candidates: list[Path]) -> list[tuple[str, str]]:
    """(host directory, target) of each of a running container's mounts, as the container sees
    them: the mount at each target, looked at through /proc/PID/root, matched by device and inode
    against ``candidates`` ("?" when it is none of them). Mounts are pinned volumes, so the
    engine's own record of the source names a volume, not the directory. The two binds of the
    container's socket stdio (our program and its socket, runtime/stdio_sockets.py) are not a
    session's mounts and are left out."""
    pid = container.attrs["State"]["Pid"]
    known = {(p.stat().st_dev, p.stat().st_ino): str(p) for p in candidates}
    found = []
    for mount in container.attrs["Mounts"]:
        if mount["Destination"] in (HELPER_TARGET, SOCKET_TARGET):
            continue
        inside = os.stat(f"/proc/{pid}/root{mount['Destination']}")
        found.append((known.get((inside.st_dev, inside.st_ino), "?"), mount["Destination"]))
    return found


def text_of(answer: dict[str, Any]) -> str:
    return "\n".join(item.get("text", "") for item in answer["content"])


def converted_time(utc_time: str, zone: str) -> set[str]:
    """How mcp-server-time writes ``utc_time`` (HH:MM, today in UTC) in ``zone``: the local
    time with its offset (``T09:00:00+01:00``), for today and tomorrow — the server takes its
    own date, which may be the next one if the call crosses midnight. Across most of the year
    both days give the same answer; a zone's offset (summer time) is never assumed."""
    hours, minutes = (int(part) for part in utc_time.split(":"))
    today = datetime.now(UTC).date()
    shown = set()
    for day in (today, today + timedelta(days=1)):
        moment = datetime.combine(day, clock_time(hours, minutes), tzinfo=UTC)
        shown.add(moment.astimezone(zoneinfo.ZoneInfo(zone)).isoformat()[10:])
    return shown
