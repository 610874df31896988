"""Agent calls' limits and cancellation on the real engine, with the real Claude Code CLI in the
agent image: the MCP Python SDK 2.x on ``/mcp`` calls ``agent__run_task`` while the scripted
model (tests/messages_api.py) holds its answer, so the call is in flight as long as the test
needs; the model is reached through the egress proxy only, as in test_agent_claude_code_e2e.

- a client that cancels its agent call: the client sees its cancellation, the agent's container
  goes, the trail records the call cancelled;
- with ``max_concurrent_per_session: 1``, a second agent call of the same session is answered
  -32002 ``agent_busy`` at once (while the first is still held), another session's call runs.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from tests.integration.harness import LineProcess, Orchestrator, orchestrator, python2_client
from tests.integration.harness import wait_until as wait_for
from tests.integration.test_agent_claude_code_e2e import (
    KEY,
    KEY_VARIABLE,
    SECRET_NOTE,
    TARGET,
    agent_containers,
    agent_suite,
)
from tests.messages_api import Hold, MessagesAPI, Step, Text, scripted_messages_api

pytestmark = pytest.mark.integration


TASK = {"name": "agent__run_task", "arguments": {"task": "Think about it."}}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "projects" / "app"
    root.mkdir(parents=True)
    (root / "notes.txt").write_text(SECRET_NOTE + "\n")
    root.chmod(0o777)  # (the agent's server runs as the orchestrator's unprivileged account)
    return root


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    return KEY


def limited_suite(tmp_path: Path, api_url: str, **agents: int) -> Path:
    path = agent_suite(tmp_path, api_url, {})
    suite = yaml.safe_load(path.read_text())
    suite["mcp_services"]["agent"]["service_type"] = "llm_agent"  # (its calls: agent calls)
    suite["mcp_services"]["agent"]["workspace"] = "shared"  # (its project is no repository)
    if agents:
        suite["orchestrator"]["agents"] = agents
    path.write_text(yaml.safe_dump(suite))
    return path


def connected(running: Orchestrator, project: Path) -> LineProcess:
    client = python2_client(f"{running.http_url}/mcp?mount={project}:{TARGET}")
    initialized = client.ask({"op": "initialize"})
    assert initialized["ok"], initialized
    return client


def held_by_the_model(api: MessagesAPI, steps: int = 1) -> None:
    """The agent is mid-task: its CLI asked the model, which holds its answer."""
    wait_for(lambda: api.steps_served >= steps, timeout=180, what="the agent asking the model")


def test_a_cancelled_agent_call_stops_the_agent_and_its_container_goes(
    tmp_path: Path, project: Path, key: str, docker_client: docker.DockerClient
) -> None:
    released = threading.Event()
    script: list[Step] = [Hold(released, [Text("too late")])]
    with scripted_messages_api(script) as api:
        suite = limited_suite(tmp_path, api.url)
        try:
            with orchestrator(suite, tmp_path / "orchestrator.log") as running:
                client = connected(running, project)
                try:
                    assert client.ask({"op": "start", **TASK})["ok"]
                    held_by_the_model(api)
                    assert len(agent_containers(docker_client, running)) == 1
                    cancelled = client.ask({"op": "cancel"}, timeout=60)
                    # The container goes, bounded (removed: stdin closed, then stopped).
                    wait_for(
                        lambda: agent_containers(docker_client, running) == [],
                        timeout=60,
                        what="the agent's container removed",
                    )
                    # Both records are written after the removal is done (the container's
                    # record last), so the list may be empty before they are.
                    wait_for(
                        lambda: (
                            {"tool_call", "container_stop"} <= {r["event"] for r in running.audit()}
                        ),
                        what="the call's and the container's audit records",
                    )
                    calls = [r for r in running.audit() if r["event"] == "tool_call"]
                    stops = [
                        r
                        for r in running.audit()
                        if r["event"] == "container_stop" and r.get("service") == "agent"
                    ]
                    # The session goes on: the next call (no agent's) is answered.
                    status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
                finally:
                    client.close()
        finally:
            released.set()

    # The SDK cancels as a caller cancels (notifications/cancelled): no answer is delivered.
    assert cancelled == {"ok": True, "cancelled": True}, cancelled
    assert [(c["service"], c["tool"], c["outcome"]) for c in calls] == [
        ("agent", "run_task", "cancelled")
    ], calls
    assert [s["reason"] for s in stops] == ["call_done"], stops
    assert status["ok"], status


def busy_error(answer: dict[str, Any]) -> dict[str, Any]:
    assert not answer["ok"], answer
    error: dict[str, Any] = answer["error"]
    return error


def test_a_second_agent_call_of_a_session_at_its_limit_is_answered_agent_busy_at_once(
    tmp_path: Path, project: Path, key: str, docker_client: docker.DockerClient
) -> None:
    released = threading.Event()
    script: list[Step] = [Hold(released, [Text("first done")]), [Text("other session's")]]
    with scripted_messages_api(script) as api:
        suite = limited_suite(tmp_path, api.url, max_concurrent_per_session=1)
        try:
            with orchestrator(suite, tmp_path / "orchestrator.log") as running:
                first = connected(running, project)
                other = connected(running, project)
                try:
                    assert first.ask({"op": "start", **TASK})["ok"]
                    held_by_the_model(api)
                    # Refused while the first call is held by the model: at once, not queued.
                    refused = first.ask({"op": "call", **TASK}, timeout=60)
                    assert not released.is_set()
                    # Another session may still call an agent (the orchestrator's limit is 4).
                    answered = other.ask({"op": "call", **TASK}, timeout=300)
                    assert not released.is_set()
                    released.set()
                    finished = first.ask({"op": "finish"}, timeout=300)
                finally:
                    first.close()
                    other.close()
                wait_for(
                    lambda: agent_containers(docker_client, running) == [],
                    what="the agents' containers removed",
                )
                # (a call's record is written once its container is removed: wait for all three)
                wait_for(
                    lambda: sum(r["event"] == "tool_call" for r in running.audit()) >= 3,
                    what="the three calls' audit records",
                )
                calls = [r for r in running.audit() if r["event"] == "tool_call"]
        finally:
            released.set()

    error = busy_error(refused)
    assert error["code"] == -32002, error
    assert error["data"]["reason"] == "agent_busy", error
    assert (error["data"]["scope"], error["data"]["limit"]) == ("session", 1), error
    assert "Agents Busy" in error["message"], error
    assert answered["ok"], answered
    assert "other session's" in answered["structured"]["result"], answered
    assert finished["ok"], finished
    assert "first done" in finished["structured"]["result"], finished
    assert sorted((c["outcome"], c["error_reason"]) for c in calls) == [
        ("error", "agent_busy"),
        ("ok", None),
        ("ok", None),
    ], calls


def test_a_client_that_goes_away_mid_call_stops_the_agent_and_its_container_goes(
    tmp_path: Path, project: Path, key: str, docker_client: docker.DockerClient
) -> None:
    released = threading.Event()
    script: list[Step] = [Hold(released, [Text("too late")])]
    with scripted_messages_api(script) as api:
        suite = limited_suite(tmp_path, api.url)
        try:
            with orchestrator(suite, tmp_path / "orchestrator.log") as running:
                client = connected(running, project)
                try:
                    assert client.ask({"op": "start", **TASK})["ok"]
                    held_by_the_model(api)
                    assert len(agent_containers(docker_client, running)) == 1
                finally:
                    client.close()  # the SDK ends its session (DELETE) with the call in flight
                wait_for(
                    lambda: agent_containers(docker_client, running) == [],
                    timeout=60,
                    what="the agent's container removed",
                )
                wait_for(
                    lambda: any(r["event"] == "session_end" for r in running.audit()),
                    what="the session's end in the trail",
                )
                calls = [r for r in running.audit() if r["event"] == "tool_call"]
                stops = [
                    r
                    for r in running.audit()
                    if r["event"] == "container_stop" and r.get("service") == "agent"
                ]
        finally:
            released.set()

    assert [(c["tool"], c["outcome"]) for c in calls] == [("run_task", "no_answer")], calls
    assert [s["reason"] for s in stops] == ["session_ended"], stops
