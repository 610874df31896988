"""The agent image's fabric relay (images/agent-claude-code/fabric_relay.py) with the real Claude
Code CLI in a container without a network: the scripted model calls a tool of the fabric, the
call reaches an MCP server on a host Unix socket bound into the container, and its result goes
back to the model and into the agent's answer.

No orchestrator: the container is run as the orchestrator runs an agent service (read-only root,
no capabilities, ``network_mode: none``, ``fabric-stdio --egress`` in front of the image's
entrypoint), with the sockets it would bind at ``/.reactor-fabric`` served by this test:
``stdio.sock`` (this test is the agent server's MCP client and calls ``run_task``),
``egress.sock`` (each connection piped to the scripted Messages API on this host's loopback;
Claude Code speaks to it as to an HTTP proxy) and ``fabric.sock`` (a small line-delimited
JSON-RPC MCP server with one tool, ``echo_project``, standing in for the orchestrator's fabric
endpoint of a child session).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from reactor_fabric.runtime.stdio_sockets import BUNDLED_HELPER
from tests.integration.harness import remove_container
from tests.messages_api import MessagesAPI, Step, Text, ToolUse, scripted_messages_api

pytestmark = pytest.mark.integration

VERSIONS = Path(__file__).resolve().parents[2] / "images" / "versions.env"
TARGET = "/.reactor-fabric"
EGRESS_PORT = 3128
TOKEN = "child-session-token-e2e"
ECHOED = "echo of the client's project: 7 files"
# Every wait of this test (a socket read, the container's end).
DEADLINE = 240.0
MAX_LINE = 1024 * 1024


def agent_image() -> str:
    pins = dict(
        line.split("=", 1)
        for line in VERSIONS.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    return f"{pins['IMAGE_PREFIX']}/agent-claude-code:{pins['AGENT_CLAUDE_CODE_VERSION']}"


def listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o666)  # the image's user (nobody) connects
    server.listen(8)
    server.settimeout(DEADLINE)
    return server


def stop(server: socket.socket, thread: threading.Thread) -> None:
    """``server`` closed, its accepting ``thread`` ended (a shutdown wakes a blocked accept)."""
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)
    server.close()
    thread.join(DEADLINE)


def read_line(stream: Any) -> bytes:
    line = stream.readline(MAX_LINE)
    assert isinstance(line, bytes)
    return line


class Fabric:
    """The stand-in for the orchestrator's fabric endpoint: the lines it received (the first
    one, the auth line, included) and the answers it gave, on one connection."""

    def __init__(self, path: Path) -> None:
        self.server = listen(path)
        self.received: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._serve, name="fabric", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            connection, _ = self.server.accept()
        except OSError:
            return
        with connection, connection.makefile("rb") as stream:
            connection.settimeout(DEADLINE)
            while line := read_line(stream):
                message = json.loads(line)
                self.received.append(message)
                if "id" not in message:
                    continue
                answer = {"jsonrpc": "2.0", "id": message["id"], **self._answer(message)}
                connection.sendall(json.dumps(answer).encode() + b"\n")

    def _answer(self, message: dict[str, Any]) -> dict[str, Any]:
        method = message.get("method")
        if method == "initialize":
            return {
                "result": {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "fabric-stand-in", "version": "1"},
                }
            }
        if method == "tools/list":
            tool = {
                "name": "echo_project",
                "description": "Says what the client's project holds.",
                "inputSchema": {"type": "object", "properties": {"what": {"type": "string"}}},
            }
            return {"result": {"tools": [tool]}}
        if method == "tools/call":
            arguments = message["params"].get("arguments") or {}
            text = f"{ECHOED} ({arguments.get('what')})"
            return {"result": {"content": [{"type": "text", "text": text}]}}
        return {"error": {"code": -32601, "message": f"{method} is not served here"}}

    def close(self) -> None:
        stop(self.server, self.thread)


class EgressPipe:
    """``egress.sock``: each connection piped, byte for byte, to the scripted API's port."""

    def __init__(self, path: Path, port: int) -> None:
        self.server = listen(path)
        self.port = port
        self.accepted = 0
        self.sockets: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, name="egress", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                inside, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            outside = socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE)
            self.sockets += [inside, outside]
            inside.settimeout(DEADLINE)
            for source, sink in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        stop(self.server, self.thread)
        for each in self.sockets:
            each.close()


@pytest.fixture
def area() -> Iterator[Path]:
    if not BUNDLED_HELPER.exists():
        pytest.skip("fabric-stdio is not built (scripts/build-stdio-helper)")
    directory = Path(tempfile.mkdtemp(prefix="afr-"))
    directory.chmod(0o755)
    shutil.copy(BUNDLED_HELPER, directory / "fabric-stdio")
    (directory / "fabric-stdio").chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_task(stdio: socket.socket, task: str) -> tuple[dict[str, Any], list[str]]:
    """As the agent server's MCP client on ``stdio.sock``: ``run_task`` and its progress."""
    connection, _ = stdio.accept()
    with connection, connection.makefile("rb") as stream:
        connection.settimeout(DEADLINE)

        def send(message: dict[str, Any]) -> None:
            connection.sendall(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

        def answer_to(request_id: int, progress: list[str]) -> dict[str, Any]:
            while line := read_line(stream):
                message = json.loads(line)
                if message.get("method") == "notifications/progress":
                    progress.append(str(message["params"].get("message")))
                elif message.get("id") == request_id:
                    return dict(message)
            raise AssertionError(f"the agent server closed before answering {request_id}")

        send(
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "e2e", "version": "1"},
                },
            }
        )
        assert "result" in answer_to(1, [])
        send({"method": "notifications/initialized"})
        send(
            {
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "run_task",
                    "arguments": {"task": task},
                    "_meta": {"progressToken": "p"},
                },
            }
        )
        progress: list[str] = []
        return answer_to(2, progress), progress


def say_the_tool_result(request: dict[str, Any]) -> list[Text]:
    results = [
        block.get("content")
        for message in request["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    return [Text(f"The fabric said: {json.dumps(results[-1])}")]


def test_the_scripted_model_uses_a_fabric_tool_through_the_relay_in_a_container_without_network(
    area: Path, docker_client: docker.DockerClient
) -> None:
    image = agent_image()
    try:
        docker_client.images.get(image)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{image} is not built (scripts/build-images agent-claude-code)")
    script: list[Step] = [
        [ToolUse("mcp__fabric__echo_project", {"what": "files"})],
        say_the_tool_result,
    ]
    stdio = listen(area / "stdio.sock")
    fabric = Fabric(area / "fabric.sock")
    container = None
    api: MessagesAPI
    try:
        with scripted_messages_api(script) as api:
            api_port = int(api.url.rsplit(":", 1)[1])
            egress = EgressPipe(area / "egress.sock", api_port)
            try:
                proxy = f"http://127.0.0.1:{EGRESS_PORT}"
                container = docker_client.containers.run(
                    image,
                    entrypoint=[f"{TARGET}/fabric-stdio"],
                    command=[
                        "--egress",
                        str(EGRESS_PORT),
                        f"{TARGET}/egress.sock",
                        f"{TARGET}/stdio.sock",
                        "python3",
                        "/opt/agent/app/agent_server.py",
                    ],
                    environment={
                        # The model API as the container sees it: through the egress forwarder.
                        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{api_port}",
                        "ANTHROPIC_API_KEY": "sk-test-not-real",
                        "HTTPS_PROXY": proxy,
                        "HTTP_PROXY": proxy,
                        "ALL_PROXY": proxy,
                        "NO_PROXY": "",
                        "REACTOR_FABRIC_FABRIC_SOCKET": f"{TARGET}/fabric.sock",
                        "REACTOR_FABRIC_FABRIC_TOKEN": TOKEN,
                        "REACTOR_FABRIC_SERVICE_CONFIG": json.dumps({"danger_mode": False}),
                        "HOME": "/tmp",
                    },
                    network_mode="none",
                    read_only=True,
                    tmpfs={"/tmp": ""},
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges"],
                    volumes={str(area): {"bind": TARGET, "mode": "ro"}},
                    detach=True,
                )
                answer, progress = run_task(stdio, "What does the project hold?")
            finally:
                if container is not None:
                    logs = container.logs(stderr=True, stdout=False).decode(errors="replace")
                    remove_container(container)
                egress.close()
    finally:
        stdio.close()
        fabric.close()

    assert api.refusals == [], api.refusals
    result = answer.get("result")
    assert result is not None, (answer, logs)
    assert not result.get("isError"), (result, logs)
    # The fabric heard the auth line first, with the child session's token, then MCP.
    assert fabric.received, logs
    assert fabric.received[0] == {
        "jsonrpc": "2.0",
        "method": "fabric/child",
        "params": {"token": TOKEN},
    }
    methods = [m.get("method") for m in fabric.received[1:]]
    assert "initialize" in methods, methods
    assert "fabric/child" not in methods, methods
    calls = [m["params"] for m in fabric.received if m.get("method") == "tools/call"]
    assert [(c["name"], c.get("arguments")) for c in calls] == [("echo_project", {"what": "files"})]
    # The tool's result reached the model's next request, and the agent's answer.
    assert ECHOED in json.dumps(api.tool_results()), api.tool_results()
    assert ECHOED in result["structuredContent"]["result"], result
    assert result["structuredContent"]["tools_used"] == ["mcp__fabric__echo_project"]
    assert "permission_denials" not in result["structuredContent"], result
    assert "fabric: echo_project" in progress, progress
    # The model was offered the fabric's tool and the safe set, no shell; the token went to the
    # fabric only, never to the model.
    offered = {tool["name"] for tool in api.messages_requests()[0]["tools"]}
    assert "mcp__fabric__echo_project" in offered, offered
    assert "Bash" not in offered, offered
    assert TOKEN not in json.dumps(api.messages_requests())
    assert egress.accepted >= 1
