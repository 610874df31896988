"""The local MCP server images answer MCP over `docker run -i` stdio.

Each test starts one of the four images built by ``scripts/build-images`` (``make
images``) exactly the way the orchestrator runs an MCP server -- ``docker run -i --rm
--network none --cap-drop ALL --security-opt no-new-privileges`` -- and speaks raw
JSON-RPC lines to it: ``initialize``, ``notifications/initialized``, ``tools/list`` and
a ``tools/call`` per image.

Image tags come from ``images/versions.env``; override one with
``REACTOR_FABRIC_IMAGE_TIME``, ``REACTOR_FABRIC_IMAGE_GIT``,
``REACTOR_FABRIC_IMAGE_FILESYSTEM`` or ``REACTOR_FABRIC_IMAGE_EVERYTHING`` (e.g. to test
images pulled from a registry). When Docker or an image is missing the tests FAIL and
say to run ``make images``; they are skipped only when
``REACTOR_FABRIC_SKIP_INTEGRATION=1`` is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import pytest
import trio

if os.environ.get("REACTOR_FABRIC_SKIP_INTEGRATION") == "1":
    pytest.skip(
        "REACTOR_FABRIC_SKIP_INTEGRATION=1: Docker image integration tests skipped",
        allow_module_level=True,
    )

pytestmark = [pytest.mark.integration]

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "images" / "versions.env"

PROTOCOL_VERSION = "2025-06-18"
# The first `docker run` of an image may have to set up its layers; later ones are fast.
START_TIMEOUT_S = 90
REQUEST_TIMEOUT_S = 30
SHUTDOWN_TIMEOUT_S = 15
DOCKER_CLI_TIMEOUT_S = 60

HARDENING = [
    "--network",
    "none",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
]


def _read_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in VERSIONS_FILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        pins[key.strip()] = value.strip()
    return pins


def image_tag(name: str) -> str:
    """Tag of one of the local images: time, git, filesystem or everything."""
    override = os.environ.get(f"REACTOR_FABRIC_IMAGE_{name.upper()}")
    if override:
        return override
    pins = _read_pins()
    version = pins[f"MCP_SERVER_{name.upper()}_VERSION"]
    return f"{pins.get('IMAGE_PREFIX', 'reactor-fabric')}/mcp-server-{name}:{version}"


def require_image(name: str) -> str:
    """The image's tag, after checking Docker answers and has the image; fails otherwise."""
    tag = image_tag(name)
    hint = (
        "Run `make images` (scripts/build-images) to start Docker and build the MCP "
        "server images, or set REACTOR_FABRIC_SKIP_INTEGRATION=1 to skip these tests."
    )
    try:
        proc = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
            check=False,
            capture_output=True,
            text=True,
            timeout=DOCKER_CLI_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        pytest.fail(f"the docker CLI is not installed. {hint}", pytrace=False)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"`docker image inspect {tag}` hung for {DOCKER_CLI_TIMEOUT_S}s. {hint}", pytrace=False
        )
    if proc.returncode != 0:
        reason = proc.stderr.strip() or proc.stdout.strip()
        if "no such image" in reason.lower():
            what = f"Docker image {tag} is missing ({reason})"
        else:
            what = f"the Docker engine is not reachable or failed ({reason})"
        pytest.fail(f"{what}. {hint}", pytrace=False)
    return tag


class McpStdioSession:
    """A minimal MCP client over a child process's stdin/stdout (JSON-RPC, one per line)."""

    def __init__(self, proc: trio.Process, stderr_file: IO[bytes], label: str) -> None:
        self._proc = proc
        self._stderr_file = stderr_file
        self._label = label
        self._buffer = b""
        self._next_id = 1
        self.notifications: list[dict[str, Any]] = []
        self.server_requests: list[dict[str, Any]] = []

    def stderr_tail(self, limit: int = 2000) -> str:
        self._stderr_file.flush()
        self._stderr_file.seek(0)
        data: bytes = self._stderr_file.read()
        return data.decode("utf-8", "replace")[-limit:]

    async def send(self, message: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        await self._proc.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def _read_line(self) -> bytes:
        assert self._proc.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self._proc.stdout.receive_some(65536)
            if not chunk:
                raise AssertionError(
                    f"{self._label}: the server closed stdout (exit {self._proc.poll()}); "
                    f"stderr:\n{self.stderr_tail()}"
                )
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    async def _answer_server_request(self, message: dict[str, Any]) -> None:
        self.server_requests.append(message)
        method = message.get("method")
        if method == "roots/list":
            result: dict[str, Any] = {"roots": []}
        elif method == "ping":
            result = {}
        else:
            await self.send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {
                        "code": -32601,
                        "message": f"method not supported by test client: {method}",
                    },
                }
            )
            return
        await self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})

    async def request(
        self, method: str, params: dict[str, Any] | None = None, limit_s: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        """Send a request and return its result; skips notifications and non-JSON lines."""
        request_id = self._next_id
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            with trio.fail_after(limit_s):
                await self.send(message)
                while True:
                    line = await self._read_line()
                    try:
                        reply = json.loads(line)
                    except ValueError:
                        continue  # not a JSON-RPC line (stray output)
                    if not isinstance(reply, dict):
                        continue
                    if "method" in reply:
                        if "id" in reply:
                            await self._answer_server_request(reply)
                        else:
                            self.notifications.append(reply)
                        continue
                    if reply.get("id") != request_id:
                        continue
                    if "error" in reply:
                        raise AssertionError(f"{self._label}: {method} failed: {reply['error']}")
                    result = reply.get("result")
                    assert isinstance(result, dict), reply
                    return result
        except trio.TooSlowError:
            raise AssertionError(
                f"{self._label}: no answer to {method} within {limit_s}s; "
                f"stderr:\n{self.stderr_tail()}"
            ) from None

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)

    async def initialize(self) -> dict[str, Any]:
        result = await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "reactor-fabric-image-tests", "version": "0"},
            },
            limit_s=START_TIMEOUT_S,
        )
        await self.notify("notifications/initialized")
        return result

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.request("tools/call", {"name": name, "arguments": arguments})
        assert result.get("isError") is not True, (
            f"{self._label}: {name} returned an error: {result}"
        )
        return result

    async def close(self) -> None:
        """Close stdin (the servers exit on EOF), wait a bounded time, then kill."""
        if self._proc.stdin is not None:
            with suppress(trio.BrokenResourceError):
                await self._proc.stdin.aclose()
        with trio.move_on_after(SHUTDOWN_TIMEOUT_S):
            await self._proc.wait()
        if self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        if self._proc.stdout is not None:
            await self._proc.stdout.aclose()


@asynccontextmanager
async def docker_mcp_server(
    image: str, *server_args: str, docker_args: tuple[str, ...] = ()
) -> AsyncIterator[McpStdioSession]:
    """Run an image as the orchestrator does and yield an MCP stdio session to it."""
    name = f"reactor-fabric-test-{uuid.uuid4().hex[:12]}"
    cmd = [
        "docker",
        "run",
        "-i",
        "--rm",
        "--name",
        name,
        *HARDENING,
        *docker_args,
        image,
        *server_args,
    ]
    with tempfile.TemporaryFile() as stderr_file:
        proc = await trio.lowlevel.open_process(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr_file
        )
        session = McpStdioSession(proc, stderr_file, label=image)
        try:
            yield session
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await session.close()
                finally:
                    # Killing the docker CLI does not always stop the container: make sure.
                    with trio.move_on_after(DOCKER_CLI_TIMEOUT_S):
                        await trio.run_process(
                            ["docker", "rm", "-f", name],
                            check=False,
                            capture_stdout=True,
                            capture_stderr=True,
                            stdin=b"",
                        )


async def initialize_and_list_tools(session: McpStdioSession) -> list[str]:
    init = await session.initialize()
    server_info = init.get("serverInfo")
    assert isinstance(server_info, dict), init
    assert server_info.get("name"), init
    # Every image speaks the protocol version the orchestrator asks for.
    assert init.get("protocolVersion") == PROTOCOL_VERSION, init
    assert "tools" in init.get("capabilities", {}), init
    listed = await session.request("tools/list", {})
    tools = listed.get("tools")
    assert isinstance(tools, list), listed
    assert tools, listed
    return [tool["name"] for tool in tools]


def tool_text(result: dict[str, Any]) -> str:
    return "\n".join(
        item.get("text", "") for item in result.get("content", []) if item.get("type") == "text"
    )


# ------------------------------------------------------------------------------ time


async def test_time_image_answers_tools_list_over_docker_run_stdio() -> None:
    time_image = require_image("time")
    async with docker_mcp_server(time_image) as session:
        names = await initialize_and_list_tools(session)
    assert "get_current_time" in names, names
    assert "convert_time" in names, names


async def test_time_image_tells_the_current_utc_time_through_tools_call() -> None:
    time_image = require_image("time")
    async with docker_mcp_server(time_image) as session:
        await session.initialize()
        result = await session.call_tool("get_current_time", {"timezone": "UTC"})
    payload = json.loads(tool_text(result))
    assert payload["timezone"] == "UTC", payload
    reported = datetime.fromisoformat(payload["datetime"])
    assert reported.utcoffset() == timedelta(0), payload
    assert abs(reported - datetime.now(UTC)) < timedelta(minutes=5), payload


# ------------------------------------------------------------------------------- git


async def test_git_image_answers_tools_list_over_docker_run_stdio() -> None:
    git_image = require_image("git")
    async with docker_mcp_server(git_image) as session:
        names = await initialize_and_list_tools(session)
    assert "git_log" in names, names
    assert "git_status" in names, names


@pytest.fixture
def host_git_repo(tmp_path: Path) -> Path:
    """A one-commit repository made on the host, readable by the container's capless root."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = [
        "git",
        "-c",
        "init.defaultBranch=main",
        "-c",
        "user.name=Reactor Fabric",
        "-c",
        "user.email=rf@example.invalid",
    ]
    subprocess.run([*git, "init", "-q", str(repo)], check=True, timeout=60)
    subprocess.run(
        [*git, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "hello from the host"],
        check=True,
        timeout=60,
    )
    # The container's root has no CAP_DAC_OVERRIDE: make the repository world-readable.
    subprocess.run(["chmod", "-R", "a+rX", str(repo)], check=True, timeout=60)
    return repo


async def test_git_image_reads_the_log_of_a_read_only_bind_mounted_repository(
    host_git_repo: Path,
) -> None:
    git_image = require_image("git")
    repo = host_git_repo
    async with docker_mcp_server(
        git_image, "--repository", "/repo", docker_args=("--read-only", "-v", f"{repo}:/repo:ro")
    ) as session:
        await session.initialize()
        log = await session.call_tool("git_log", {"repo_path": "/repo"})
        status = await session.call_tool("git_status", {"repo_path": "/repo"})
    assert "hello from the host" in tool_text(log), log
    assert "working tree clean" in tool_text(status), status


# ------------------------------------------------------------------------ filesystem


async def test_filesystem_image_answers_tools_list_over_docker_run_stdio() -> None:
    filesystem_image = require_image("filesystem")
    async with docker_mcp_server(filesystem_image) as session:
        names = await initialize_and_list_tools(session)
        # Without directory arguments or client roots the image's default applies.
        allowed = await session.call_tool("list_allowed_directories", {})
    assert "list_directory" in names, names
    assert "read_text_file" in names, names
    assert "/workspace" in tool_text(allowed), allowed


@pytest.fixture
def host_data_dir(tmp_path: Path) -> Path:
    """A world-readable directory with one text file, to bind-mount into the container."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello.txt").write_text("hello from the host\n", encoding="utf-8")
    data.chmod(0o755)
    (data / "hello.txt").chmod(0o644)
    return data


async def test_filesystem_image_reads_a_file_from_a_directory_given_as_argument(
    host_data_dir: Path,
) -> None:
    filesystem_image = require_image("filesystem")
    data = host_data_dir
    async with docker_mcp_server(
        filesystem_image, "/data", docker_args=("-v", f"{data}:/data:ro")
    ) as session:
        await session.initialize()
        listing = await session.call_tool("list_directory", {"path": "/data"})
        content = await session.call_tool("read_text_file", {"path": "/data/hello.txt"})
    assert "hello.txt" in tool_text(listing), listing
    assert "hello from the host" in tool_text(content), content


# ------------------------------------------------------------------------ everything


async def test_everything_image_answers_tools_list_over_docker_run_stdio() -> None:
    everything_image = require_image("everything")
    async with docker_mcp_server(everything_image) as session:
        names = await initialize_and_list_tools(session)
    assert "echo" in names, names


async def test_everything_image_echoes_a_message_through_tools_call() -> None:
    everything_image = require_image("everything")
    async with docker_mcp_server(everything_image) as session:
        await session.initialize()
        result = await session.call_tool("echo", {"message": "ping from reactor-fabric"})
    assert "ping from reactor-fabric" in tool_text(result), result
