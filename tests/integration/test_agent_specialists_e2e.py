"""Specialist agents in concert, on the real engine with the real Claude Code CLI in the agent
image (issue 38 items 2-4, 7): a client (the MCP Python SDK 2.x on ``/mcp``) hands a task to an
``llm_agent`` service; the agent reaches the model (tests/messages_api.py, on this host's
loopback) through the egress proxy only, with its account's key, and the suite's services it
``uses`` through a child session of the client's session, on the client's project.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from tests.integration.harness import (
    Orchestrator,
    git_repo,
    orchestrator,
    python2_client,
    wait_until,
    write_suite,
)
from tests.integration.test_agent_claude_code_e2e import agent_image, echo_tool_result, run_task
from tests.messages_api import Step, Text, ToolUse, scripted_messages_api

pytestmark = pytest.mark.integration

TARGET = "/projects/app"
WORK_KEY_VARIABLE = "RF_TEST_WORK_KEY"
HOME_KEY_VARIABLE = "RF_TEST_HOME_KEY"
WORK_KEY = "sk-test-work-account-not-real"
HOME_KEY = "sk-test-home-account-not-real"
ACCOUNTS = {
    "work": {"secrets": {"ANTHROPIC_API_KEY": {"env": WORK_KEY_VARIABLE, "as": "env"}}},
    "home": {"secrets": {"ANTHROPIC_API_KEY": {"env": HOME_KEY_VARIABLE, "as": "env"}}},
}


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv(WORK_KEY_VARIABLE, WORK_KEY)
    monkeypatch.setenv(HOME_KEY_VARIABLE, HOME_KEY)
    return {"work": WORK_KEY, "home": HOME_KEY}


def agent(api_url: str, account: str, specialty: str, **fields: Any) -> dict[str, Any]:
    """An agent service of the agent image, reaching the scripted API through egress only;
    working on the project itself (``workspace: shared``) unless ``fields`` say otherwise:
    these tests are about the agent, its account and its child session; its workspaces are
    test_agent_workspaces_e2e.py's."""
    port = api_url.rsplit(":", 1)[1]
    return {
        "image": agent_image(),
        "service_type": "llm_agent",
        "workspace": "shared",
        "timeout": "300s",
        "egress": [f"127.0.0.1:{port}"],
        "env": {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}"},
        "config": {"account": account, "specialty": specialty, **fields.pop("config", {})},
        **fields,
    }


def specialist_suite(tmp_path: Path, agents: dict[str, dict[str, Any]]) -> Path:
    path = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path / "projects")],
        test_services=agents,
        accounts=ACCOUNTS,
    )
    suite = yaml.safe_load(path.read_text())
    for name in agents:
        del suite["mcp_services"][name]["network"]  # egress: no network of its own
    path.write_text(yaml.safe_dump(suite))
    return path


def containers_of(client: docker.DockerClient, running: Orchestrator) -> list[Any]:
    return client.containers.list(
        all=True, sparse=True, filters={"label": [f"reactor-fabric.instance={running.instance}"]}
    )


def test_a_specialist_uses_git_on_the_clients_repository_through_its_child_session(
    tmp_path: Path, keys: dict[str, str], docker_client: docker.DockerClient
) -> None:
    repo = git_repo(tmp_path / "projects" / "app", ["the client's own commit 7f3a"])
    repo.chmod(0o777)
    script: list[Step] = [
        [ToolUse("mcp__fabric__git__git_log", {"repo_path": TARGET, "max_count": 5})],
        echo_tool_result,
    ]
    with scripted_messages_api(script) as api:
        suite = specialist_suite(
            tmp_path, {"reviewer": agent(api.url, "work", "You review code.", uses=["git"])}
        )
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            answer, progress = run_task(
                running, repo, {"task": "Review the log."}, "reviewer__run_task"
            )
            wait_until(
                lambda: containers_of(docker_client, running) == [],
                what="the agent's and the child's containers removed",
            )
            wait_until(
                lambda: any(
                    r["event"] == "tool_call" and r["service"] == "reviewer"
                    for r in running.audit()
                ),
                what="the agent's call audited",
            )
            trail = running.audit()
        offered = {tool["name"] for tool in api.messages_requests()[0]["tools"]}

    assert api.refusals == [], api.refusals
    assert answer["ok"], answer
    # The answer reflects the client's repository, read by git through the fabric.
    assert "the client's own commit 7f3a" in json.dumps(answer["content"]), answer
    assert "fabric: git__git_log" in progress, progress
    # The agent was offered the services it uses (and, safe mode, no shell).
    assert "mcp__fabric__git__git_log" in offered, offered
    assert not {name for name in offered if name.startswith("mcp__fabric__time__")}, offered
    assert "Bash" not in offered
    # Provenance: the git call is the child session's, under the client's call.
    [parent_call] = [r for r in trail if r["event"] == "tool_call" and r["service"] == "reviewer"]
    [child_call] = [r for r in trail if r["event"] == "tool_call" and r["service"] == "git"]
    assert child_call["tool"] == "git_log"
    assert child_call["parent"]["session"] == parent_call["session"] != child_call["session"]
    assert child_call["parent"]["call"]["name"] == "run_task"
    assert child_call["parent"]["agent"] == "reviewer"
    assert child_call["trace_id"] == parent_call["trace_id"]
    [child_start] = [
        r
        for r in trail
        if r["event"] == "session_start" and r.get("parent", {}).get("agent") == "reviewer"
    ]
    assert child_start["session"] == child_call["session"]
    assert [m["source"] for m in child_start["mounts"]] == [str(repo)]
    # The child's token never reached the trail or the model.
    assert "REACTOR_FABRIC_FABRIC_TOKEN" not in json.dumps(api.messages_requests())


def test_two_accounts_agents_each_get_only_their_own_key_and_reach_no_unlisted_destination(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    project = tmp_path / "projects" / "app"
    project.mkdir(parents=True)
    project.chmod(0o777)
    probe = (
        'python3 -c "import os, urllib.request as u\n'
        "for opener in (u.build_opener(), u.build_opener(u.ProxyHandler({}))):\n"
        "    try: opener.open('http://127.0.0.1:9/', timeout=5); print('REACHED')\n"
        "    except Exception as e: print('REFUSED', e)\n"
        "print('KEY', os.environ.get('ANTHROPIC_API_KEY'))\""
    )
    script: list[Step] = [
        [ToolUse("Bash", {"command": probe, "description": "reach an unlisted destination"})],
        [Text("work done")],
        [Text("home done")],
    ]
    with scripted_messages_api(script) as api:
        suite = specialist_suite(
            tmp_path,
            {
                "worker": agent(api.url, "work", "WORK SPECIALTY", config={"danger_mode": True}),
                "homer": agent(api.url, "home", "HOME SPECIALTY"),
            },
        )
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            worked, _ = run_task(running, project, {"task": "Try the network."}, "worker__run_task")
            homed, _ = run_task(running, project, {"task": "Say done."}, "homer__run_task")
            wait_until(
                lambda: any(
                    r["event"] == "egress" and r["outcome"] == "refused" for r in running.audit()
                ),
                what="the refused connection audited",
            )
            egress = [r for r in running.audit() if r["event"] == "egress"]
        requests = api.messages_requests()
        received = [r for r in api.received if r.path.startswith("/v1/messages")]
        results = json.dumps(list(api.tool_results().values()))

    assert api.refusals == [], api.refusals
    assert worked["ok"], worked
    assert homed["ok"], homed
    # Each agent's requests carry its own account's key, and only that one.
    seen: dict[str, set[str]] = {}
    for request, raw in zip(requests, received, strict=True):
        specialty = "WORK" if "WORK SPECIALTY" in json.dumps(request["system"]) else "HOME"
        seen.setdefault(specialty, set()).add(str(raw.headers.get("x-api-key")))
    assert seen == {"WORK": {WORK_KEY}, "HOME": {HOME_KEY}}, seen
    # Inside the work agent's container: only its own key; nothing but the listed
    # destination reachable, through the proxy (403) or around it (no network).
    assert f"KEY {WORK_KEY}" in results, results
    assert HOME_KEY not in results, results
    assert "REACHED" not in results, results
    assert results.count("REFUSED") == 2, results
    assert "403" in results, results
    refused = [r for r in egress if r["outcome"] == "refused"]
    assert {(r["service"], r["destination"], r["reason"]) for r in refused} == {
        ("worker", "127.0.0.1:9", "egress_not_listed")
    }, refused


def test_two_clients_specialists_at_once_each_see_only_their_own_project(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    notes = {"left": "the left client's note 1c9e", "right": "the right client's note 88ab"}
    projects: dict[str, Path] = {}
    for name, note in notes.items():
        root = tmp_path / "projects" / name
        root.mkdir(parents=True)
        (root / "notes.txt").write_text(note + "\n")
        root.chmod(0o777)
        projects[name] = root

    def read_then_echo(request: dict[str, Any]) -> list[Any]:
        """Each agent's first turn reads the notes, its second says what it read: the two
        agents' requests interleave, so each step answers whichever asks."""
        said = json.dumps(request["messages"])
        if "tool_result" not in said:
            return [ToolUse("Read", {"file_path": f"{TARGET}/notes.txt"})]
        return echo_tool_result(request)

    both_started = threading.Barrier(2, timeout=120)
    answers: dict[str, dict[str, Any]] = {}

    with scripted_messages_api([read_then_echo] * 4) as api:
        suite = specialist_suite(tmp_path, {"reader": agent(api.url, "work", "You read.")})
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:

            def client(name: str) -> None:
                both_started.wait()
                answers[name], _ = run_task(
                    running, projects[name], {"task": "What do the notes say?"}, "reader__run_task"
                )

            threads = [threading.Thread(target=client, args=(name,)) for name in notes]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)

    assert api.refusals == [], api.refusals
    for name, note in notes.items():
        other = notes["right" if name == "left" else "left"]
        shown = json.dumps(answers[name]["content"])
        assert answers[name]["ok"], answers[name]
        assert note in shown, (name, shown)
        assert other not in shown, (name, shown)


REFERENCE = (
    Path(__file__).resolve().parents[1] / "unit" / "data" / "reference-advanced-mcp-suite.yaml"
)
LOCAL_TOOL_IMAGES = {
    "filesystem": "reactor-fabric/mcp-server-filesystem:2026.8.31",
    "git_advanced": "reactor-fabric/mcp-server-git:2026.10.19",
}


def test_the_reference_designs_suite_with_local_images_runs_its_agent_services(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    """The reference design's example suite, as it is but for its images (ours, built here),
    its accounts defined, and the scripted model as the agents' API: each of its agent services
    (every lifecycle: fresh per call, smart refresh, per session) answers a task."""
    suite = yaml.safe_load(REFERENCE.read_text())
    agents = [n for n, s in suite["mcp_services"].items() if s.get("service_type") == "llm_agent"]
    assert sorted(agents) == [
        "code_reviewer",
        "devops_expert",
        "docs_generator",
        "react_specialist",
    ]
    # A repository: the suite's per-call agents work on copies of it (workspace: isolated,
    # their default), its other agents on the project itself.
    project = git_repo(tmp_path / "projects" / "app", ["the client's commit"])
    project.chmod(0o777)

    def say_done(request: dict[str, Any]) -> list[Text]:
        return [Text(f"answer from {json.dumps(request['system'])[:40]}")]

    script: list[Step] = [say_done] * len(agents)
    with scripted_messages_api(script) as api:
        port = api.url.rsplit(":", 1)[1]
        suite["orchestrator"]["allowed_mount_roots"].append(str(tmp_path / "projects"))
        accounts = {
            a
            for s in suite["mcp_services"].values()
            for a in [s.get("config", {}).get("account")]
            if a
        }
        suite["orchestrator"]["accounts"] = {
            name: {"secrets": {"ANTHROPIC_API_KEY": {"env": WORK_KEY_VARIABLE, "as": "env"}}}
            for name in accounts
        }
        for name, service in suite["mcp_services"].items():
            service["pull"] = "never"
            if name in agents:
                service["image"] = agent_image()
                service["egress"] = [f"127.0.0.1:{port}"]
                service["env"] = {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}"}
                if "account" not in service.get("config", {}):
                    service["secrets"] = {"ANTHROPIC_API_KEY": {"env": WORK_KEY_VARIABLE}}
            else:
                service["image"] = LOCAL_TOOL_IMAGES.get(
                    name, "reactor-fabric/mcp-server-time:2026.10.19"
                )
                service["network"] = "none"
        path = tmp_path / "reference.yaml"
        path.write_text(yaml.safe_dump(suite))
        with orchestrator(path, tmp_path / "orchestrator.log") as running:
            answers = {
                name: run_task(
                    running, project, {"task": f"Task for {name}."}, f"{name}__run_task"
                )[0]
                for name in agents
            }
        received = [r for r in api.received if r.path.startswith("/v1/messages")]

    assert api.refusals == [], api.refusals
    for name, answer in answers.items():
        assert answer["ok"], (name, answer)
        assert "answer" in json.dumps(answer["content"]), (name, answer)
        strategy = suite["mcp_services"][name].get("container_strategy", "fresh_per_call")
        workspace = (answer["structured"] or {}).get("workspace")
        if strategy == "fresh_per_call":
            assert workspace is not None, (name, answer)
            assert workspace["commit"] is None  # (it said done, and changed nothing)
        else:
            assert workspace is None, (name, answer)
    # Each agent's specialty reached its model; every request carried the account's key.
    specialties = {json.dumps(r["system"]) for r in api.messages_requests()}
    for name in agents:
        specialty = suite["mcp_services"][name]["config"]["specialty"]
        assert any(specialty in system for system in specialties), name
    assert {r.headers.get("x-api-key") for r in received} == {WORK_KEY}


BUNDLED_SUITE = Path(__file__).resolve().parents[2] / "claude-mcp-suite.yaml"


def test_the_bundled_suite_serves_its_specialist_as_unavailable_without_a_key_and_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make run`` without ANTHROPIC_API_KEY: code_reviewer is listed unavailable with the
    reason, a call to it answers it, and the other services serve."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with orchestrator(BUNDLED_SUITE, tmp_path / "orchestrator.log") as running:
        client = python2_client(f"{running.http_url}/mcp?tools=all")
        try:
            assert client.ask({"op": "initialize"})["ok"]
            status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
            refused = client.ask(
                {"op": "call", "name": "code_reviewer__run_task", "arguments": {"task": "t"}}
            )
            timed = client.ask(
                {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
            )
        finally:
            client.close()

    unavailable = status["structured"]["unavailable"]
    assert set(unavailable) == {"code_reviewer"}, unavailable
    assert unavailable["code_reviewer"]["reason"] == "secret_unavailable"
    assert "ANTHROPIC_API_KEY is not set" in unavailable["code_reviewer"]["detail"]
    assert refused["ok"] is False, refused
    assert refused["error"]["code"] == -32002, refused
    assert refused["error"]["data"]["reason"] == "secret_unavailable", refused
    assert timed["ok"], timed
