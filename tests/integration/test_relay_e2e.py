"""End to end: the real orchestrator, the real Docker engine, real MCP servers and real clients.

Clients: the official Python SDK 1.x WebSocket client and the TypeScript SDK 1.x
WebSocketClientTransport, each in its own environment (tests/clients/envs.py), driven command by
command so that a test can act between two requests (kill a container, wait for idle...).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import docker
import pytest

from tests.integration.harness import (
    LineProcess,
    Orchestrator,
    answer_past_progress,
    assert_confined_by_effect,
    containers_of,
    git_repo,
    orchestrator,
    orchestrator_fixture,
    python_client,
    started_call,
    text_of,
    ts_client,
    wait_until,
    write_suite,
)

pytestmark = pytest.mark.integration


fabric = orchestrator_fixture(timeouts={"time": "3s", "everything": "5m"})


def mounts(source: Path, target: str = "/workspace", read_only: bool = False) -> str:
    return json.dumps([{"source": str(source), "target": target, "readOnly": read_only}])


def test_two_clients_registering_different_repos_each_see_only_their_own_commits(
    fabric: Orchestrator, project_root: Path, docker_client: docker.DockerClient
) -> None:
    repo_a = git_repo(project_root / "alpha", ["alpha: first commit", "alpha: second commit"])
    repo_b = git_repo(project_root / "beta", ["beta: only commit"])
    url = f"{fabric.ws_url}/mcp/git"
    client_a = python_client(url, "--register", mounts(repo_a))
    client_b: LineProcess | None = None
    try:
        registered_a = client_a.read_json()
        assert registered_a["ok"], registered_a
        session_a = registered_a["result"]["sessionId"]
        assert client_a.ask({"op": "initialize"})["ok"]
        log_a = client_a.ask(
            {"op": "call", "name": "git_log", "arguments": {"repo_path": "/workspace"}}
        )
        assert log_a["ok"], log_a
        assert "alpha: second commit" in text_of(log_a)
        assert "beta" not in text_of(log_a)

        # While A's container runs, B registers a different repository.
        assert len(containers_of(docker_client, session=session_a)) == 1
        client_b = ts_client(url, "--register", mounts(repo_b))
        registered_b = client_b.read_json()
        assert registered_b["ok"], registered_b
        session_b = registered_b["result"]["sessionId"]
        assert client_b.ask({"op": "initialize"})["ok"]
        log_b = client_b.ask(
            {"op": "call", "name": "git_log", "arguments": {"repo_path": "/workspace"}}
        )
        assert log_b["ok"], log_b
        assert "beta: only commit" in text_of(log_b)
        assert "alpha" not in text_of(log_b)

        # Two containers, each with exactly its own client's mount.
        by_session = {}
        for session in (session_a, session_b):
            [container] = containers_of(docker_client, session=session)
            by_session[session] = container.attrs
        for session, repo in ((session_a, repo_a), (session_b, repo_b)):
            attrs = by_session[session]
            # The repository, pinned: a volume bound to the orchestrator's descriptor of it
            # (Docker: anonymous, with the bind in its options; Podman: named, made first), and
            # the container's /workspace is that very directory.
            [mount] = [m for m in attrs["Mounts"] if m["Destination"] == "/workspace"]
            assert mount["Type"] == "volume"
            inside = os.stat(f"/proc/{attrs['State']['Pid']}/root/workspace")
            assert (inside.st_dev, inside.st_ino) == (repo.stat().st_dev, repo.stat().st_ino)
            assert attrs["Config"]["Labels"]["reactor-fabric.service"] == "git"
            assert_confined_by_effect(attrs["State"]["Pid"])
            assert attrs["HostConfig"]["NetworkMode"] == "none"
            assert attrs["Config"]["Tty"] is False
    finally:
        assert client_a.close() == 0
        if client_b is not None:
            assert client_b.close() == 0
    wait_until(
        lambda: (
            not containers_of(docker_client, session=session_a)
            and not containers_of(docker_client, session=session_b)
        ),
        what="both containers to be removed after the clients left",
    )


def test_a_standard_client_gets_its_mounts_from_the_query_string(
    fabric: Orchestrator, project_root: Path, docker_client: docker.DockerClient
) -> None:
    project = project_root / "docs"
    project.mkdir()
    (project / "hello.txt").write_text("hello from the host\n")
    client = python_client(f"{fabric.ws_url}/mcp/filesystem?mount={project}:/workspace:ro")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        listing = client.ask(
            {"op": "call", "name": "list_directory", "arguments": {"path": "/workspace"}}
        )
        assert listing["ok"], listing
        assert "hello.txt" in text_of(listing)
        content = client.ask(
            {"op": "call", "name": "read_text_file", "arguments": {"path": "/workspace/hello.txt"}}
        )
        assert "hello from the host" in text_of(content)
        written = client.ask(
            {
                "op": "call",
                "name": "write_file",
                "arguments": {"path": "/workspace/new.txt", "content": "x"},
            }
        )
        assert not written["ok"]  # mounted read-only
        assert not (project / "new.txt").exists()
    finally:
        assert client.close() == 0


def test_an_idle_container_is_removed_and_the_session_resumes_transparently(
    fabric: Orchestrator, project_root: Path, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/time", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        first = client.ask(
            {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
        )
        assert first["ok"], first
        [before] = containers_of(docker_client, session=session)
        # The suite gives `time` a 3 s idle timeout: the container goes, the connection stays.
        wait_until(
            lambda: not containers_of(docker_client, session=session),
            timeout=60,
            what="idle teardown",
        )
        again = client.ask(
            {
                "op": "call",
                "name": "convert_time",
                "arguments": {
                    "source_timezone": "UTC",
                    "time": "12:00",
                    "target_timezone": "Asia/Tokyo",
                },
            }
        )
        assert again["ok"], again
        assert "21:00" in text_of(again)
        [after] = containers_of(docker_client, session=session)
        assert after.id != before.id
    finally:
        assert client.close() == 0
    events = [entry["event"] for entry in fabric.logs()]
    assert "session_restored" in events


def test_killing_the_container_mid_request_answers_32002_and_the_next_call_respawns(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/everything", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        # The server has the request once it reports progress (it answers only after 60 s).
        started_call(
            client,
            {"name": "trigger-long-running-operation", "arguments": {"duration": 60, "steps": 60}},
        )
        [container] = containers_of(docker_client, session=session)
        container.kill()
        failed = answer_past_progress(client)
        assert not failed["ok"]
        assert failed["error"]["code"] == -32002
        assert failed["error"]["data"]["reason"] == "container_exited"
        assert failed["error"]["data"]["exit_code"] == 137
        echoed = client.ask({"op": "call", "name": "echo", "arguments": {"message": "back"}})
        assert echoed["ok"], echoed
        assert "back" in text_of(echoed)
    finally:
        assert client.close() == 0


def test_progress_notifications_and_a_server_to_client_request_pass_through(
    fabric: Orchestrator,
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/everything", "--roots", "file:///workspace")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        answer = client.ask(
            {
                "op": "call",
                "name": "trigger-long-running-operation",
                "arguments": {"duration": 1, "steps": 3},
                "progress": True,
            }
        )
        assert answer["ok"], answer
        assert [step for step, _total in answer["progress"]] == [1, 2, 3]
        # `everything` asks the client for its roots (a server→client request) once initialized.
        assert client.ask({"op": "roots_requests"})["count"] >= 1
    finally:
        assert client.close() == 0


def test_the_container_environment_holds_only_the_image_env_and_the_service_config(
    tmp_path: Path,
    project_root: Path,
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    secret_env = {**os.environ, "ORCHESTRATOR_SECRET": "must-not-leak"}
    log = tmp_path / "o.log"
    with orchestrator(suite, log) as running:
        client = python_client(f"{running.ws_url}/mcp/everything", env=secret_env)
        try:
            assert client.ask({"op": "initialize"})["ok"]
            answer = client.ask({"op": "call", "name": "get-env"})
            assert answer["ok"], answer
        finally:
            assert client.close() == 0
    environment = json.loads(text_of(answer))
    assert "ORCHESTRATOR_SECRET" not in environment
    assert json.loads(environment["REACTOR_FABRIC_SERVICE_CONFIG"]) == {}


def test_an_orchestrator_killed_with_sigkill_leaves_orphans_the_next_one_removes(
    tmp_path: Path, project_root: Path, docker_client: docker.DockerClient
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    with orchestrator(suite, tmp_path / "first.log", expect_clean_exit=False) as first:
        client = python_client(f"{first.ws_url}/mcp/time", "--register", "[]")
        try:
            session = client.read_json()["result"]["sessionId"]
            assert client.ask({"op": "initialize"})["ok"]
            [orphan] = containers_of(docker_client, session=session)
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(30)
        finally:
            client.close()
    assert containers_of(docker_client, session=session), "the orphan should still exist"
    with orchestrator(suite, tmp_path / "second.log") as second:
        # The start-up sweep runs before the orchestrator reports itself serving.
        assert not containers_of(docker_client, session=session)
        removed = [e for e in second.logs() if e["event"] == "orphan_removed"]
        assert orphan.id[:12] in [e["container"] for e in removed]


def test_an_unreachable_docker_engine_answers_32001_and_the_orchestrator_keeps_serving(
    tmp_path: Path, project_root: Path
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    dead = f"unix://{tmp_path}/no-engine.sock"
    with orchestrator(suite, tmp_path / "o.log", env={"DOCKER_HOST": dead}) as running:
        for _ in range(2):  # a second session is served just the same
            client = python_client(f"{running.ws_url}/mcp/time")
            try:
                answer = client.ask({"op": "initialize"})
            finally:
                client.close()
            assert not answer["ok"]
            assert answer["error"]["code"] == -32001
            assert answer["error"]["data"]["reason"] == "docker_unavailable"
        failures = [e for e in running.logs() if e["event"] == "container_start_failed"]
        assert failures
        assert failures[0]["reason"] == "docker_unavailable"
        assert failures[0]["service"] == "time"


def test_a_missing_image_answers_32002_with_the_reason(tmp_path: Path, project_root: Path) -> None:
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(project_root)],
        images={"time": "reactor-fabric/no-such-image:0"},
    )
    with orchestrator(suite, tmp_path / "o.log") as running:
        client = python_client(f"{running.ws_url}/mcp/time")
        try:
            answer = client.ask({"op": "initialize"})
        finally:
            client.close()
    assert answer["error"]["code"] == -32002
    assert answer["error"]["data"]["reason"] == "image_not_found"


def test_sigterm_closes_sessions_removes_their_containers_and_exits_0(
    tmp_path: Path, project_root: Path, docker_client: docker.DockerClient
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    with orchestrator(suite, tmp_path / "o.log", expect_clean_exit=False) as running:
        client = python_client(f"{running.ws_url}/mcp/time", "--register", "[]")
        try:
            session = client.read_json()["result"]["sessionId"]
            assert client.ask({"op": "initialize"})["ok"]
            assert containers_of(docker_client, session=session)
            running.process.send_signal(signal.SIGTERM)
            assert running.process.wait(timeout=30) == 0
        finally:
            client.close()
    assert not containers_of(docker_client, session=session)
