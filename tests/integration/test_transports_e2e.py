"""Every kind of client on the real engine: Streamable HTTP (Python SDK 2.x in both eras, the
TypeScript SDK), the stdio bridge launched by the Python SDK's stdio client, and WebSocket — each
reaching its own fresh container with its own mounts, all at once."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.harness import (
    REPO,
    LineProcess,
    Orchestrator,
    bridged_client,
    containers_of,
    converted_time,
    git_repo,
    mounted_directories,
    orchestrator_fixture,
    python2_client,
    python_client,
    text_of,
    ts_client,
    wait_until,
)
from tests.messages import INITIALIZE

pytestmark = pytest.mark.integration


def sdk2_stdio_bridge(
    endpoint: str, service: str, *bridge_args: str, cwd: Path | None = None
) -> LineProcess:
    return bridged_client(endpoint, "--service", service, *bridge_args, cwd=cwd)


fabric = orchestrator_fixture()


def git_log(client: LineProcess) -> dict[str, Any]:
    return client.ask({"op": "call", "name": "git_log", "arguments": {"repo_path": "/workspace"}})


def test_the_python_sdk_2_over_streamable_http_works_in_the_handshake_era(
    fabric: Orchestrator, project_root: Path
) -> None:
    repo = git_repo(project_root / "hs", ["handshake-era commit"])
    client = python2_client(f"{fabric.http_url}/mcp/git?mount={repo}:/workspace")
    try:
        hello = client.ask({"op": "initialize"})
        assert hello["ok"], hello
        # On the bare URL a dual client's server/discover probe is refused, so it falls back.
        assert hello["protocol"] == "2025-11-25"
        answer = git_log(client)
        assert answer["ok"], answer
        assert "handshake-era commit" in text_of(answer)
    finally:
        assert client.close() == 0


def test_the_python_sdk_2_over_streamable_http_works_stateless_on_a_keyed_url(
    fabric: Orchestrator, project_root: Path, docker_client: docker.DockerClient
) -> None:
    repo = git_repo(project_root / "sl", ["stateless commit"])
    client = python2_client(f"{fabric.http_url}/mcp/git/agent-42?mount={repo}:/workspace")
    try:
        hello = client.ask({"op": "initialize"})
        assert hello["ok"], hello
        assert hello["protocol"] == "2026-07-28"
        for _ in range(3):
            answer = git_log(client)
            assert answer["ok"], answer
            assert "stateless commit" in text_of(answer)
        # Three stateless requests, one session, one container.
        assert len(containers_of(docker_client, service="git", instance=fabric.instance)) == 1
        time_client = python2_client(f"{fabric.http_url}/mcp/time/agent-42")
        try:
            assert time_client.ask({"op": "initialize"})["ok"]
            answer = time_client.ask(
                {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
            )
            assert answer["ok"], answer
        finally:
            assert time_client.close() == 0
    finally:
        assert client.close() == 0


def test_the_typescript_sdk_over_streamable_http_calls_tools(fabric: Orchestrator) -> None:
    client = ts_client(f"{fabric.http_url}/mcp/time")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        assert "convert_time" in client.ask({"op": "list_tools"})["tools"]
        answer = client.ask(
            {
                "op": "call",
                "name": "convert_time",
                "arguments": {
                    "source_timezone": "UTC",
                    "time": "08:00",
                    "target_timezone": "Europe/Paris",
                },
            }
        )
        assert answer["ok"], answer
        # Paris is UTC+1 in winter and UTC+2 in summer: the answer for today, not a season's.
        target = json.loads(text_of(answer))["target"]["datetime"]
        assert target[10:] in converted_time("08:00", "Europe/Paris")
    finally:
        assert client.close() == 0


def test_the_stdio_bridge_mounts_the_current_directory_for_the_python_sdk_stdio_client(
    fabric: Orchestrator, project_root: Path, docker_client: docker.DockerClient
) -> None:
    repo = git_repo(project_root / "cwd", ["commit seen through the bridge"])
    client = sdk2_stdio_bridge(fabric.ws_url, "git", cwd=repo)
    try:
        assert client.ask({"op": "initialize"})["ok"]
        answer = git_log(client)
        assert answer["ok"], answer
        assert "commit seen through the bridge" in text_of(answer)
        [container] = containers_of(docker_client, service="git", instance=fabric.instance)
        assert mounted_directories(container, [repo]) == [(str(repo), "/workspace")]
    finally:
        assert client.close() == 0
    wait_until(
        lambda: not containers_of(docker_client, service="git", instance=fabric.instance),
        what="the bridge's container to be removed after the client left",
    )


def test_clients_of_every_transport_at_once_each_get_their_own_container_and_files(
    fabric: Orchestrator, project_root: Path, docker_client: docker.DockerClient
) -> None:
    repos = {
        name: git_repo(project_root / name, [f"{name} secret commit"])
        for name in ("websocket", "http", "bridge", "typescript")
    }
    clients = {
        "websocket": python_client(
            f"{fabric.ws_url}/mcp/git?mount={repos['websocket']}:/workspace"
        ),
        "http": python2_client(f"{fabric.http_url}/mcp/git?mount={repos['http']}:/workspace"),
        "bridge": sdk2_stdio_bridge(
            fabric.ws_url, "git", "--mount", f"{repos['bridge']}:/workspace"
        ),
        "typescript": ts_client(
            f"{fabric.http_url}/mcp/git?mount={repos['typescript']}:/workspace"
        ),
    }
    try:
        for client in clients.values():
            assert client.ask({"op": "initialize"})["ok"]
        # All four sessions are live at the same time, each with its own container.
        assert len(containers_of(docker_client, service="git", instance=fabric.instance)) == 4
        for name, client in clients.items():
            text = text_of(git_log(client))
            assert f"{name} secret commit" in text
            others = [other for other in repos if other != name]
            assert not any(f"{other} secret" in text for other in others), (name, text)
        sources = sorted(
            source
            for c in containers_of(docker_client, service="git", instance=fabric.instance)
            for source, _target in mounted_directories(c, list(repos.values()))
        )
        assert sources == sorted(str(repo) for repo in repos.values())
    finally:
        for client in clients.values():
            assert client.close() == 0
    wait_until(
        lambda: not containers_of(docker_client, service="git", instance=fabric.instance),
        what="every container to be removed",
    )


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_the_stdio_bridge_exits_cleanly_on_eof_and_on_signals_leaving_no_container(
    fabric: Orchestrator, project_root: Path, docker_client: docker.DockerClient, how: str
) -> None:
    bridge = LineProcess(
        [
            sys.executable,
            "-m",
            "reactor_fabric",
            "connect",
            f"{fabric.ws_url}/mcp/time",
            "--no-mount",
        ],
        cwd=REPO,
    )
    try:
        bridge.send(INITIALIZE)
        assert bridge.read_json()["result"]["serverInfo"]["name"] == "mcp-time"
        assert containers_of(docker_client, service="time", instance=fabric.instance)
        if how == "eof":
            assert bridge.process.stdin is not None
            bridge.process.stdin.close()
        else:
            bridge.process.send_signal(signal.SIGTERM)
        assert bridge.process.wait(timeout=30) == 0
    finally:
        bridge.close()
    wait_until(
        lambda: not containers_of(docker_client, service="time", instance=fabric.instance),
        what="the bridge's container to be removed",
    )
