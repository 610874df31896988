"""End to end, the fabric endpoint ``/mcp``: the real orchestrator and engine, the bundled
servers, and real clients — the Python SDK 2.x (handshake session, and the 2026-07-28 keyed
URL), the Python SDK 1.x over WebSocket, the TypeScript SDK over HTTP, Claude Code, the bridge.

One orchestrator serves the module (its ``time`` service idles after 3 s, so that teardown and
respawn can be watched); each test has its own sessions and looks only at their containers.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.clients import envs
from tests.integration import harness
from tests.integration.harness import (
    LineProcess,
    Orchestrator,
    bridged_client,
    claude_shows_connected,
    containers_of,
    converted_time,
    git_repo,
    orchestrator,
    orchestrator_fixture,
    python2_client,
    python_client,
    text_of,
    ts_client,
    wait_until,
    write_suite,
)

pytestmark = pytest.mark.integration

META_TOOLS = {
    "find_tools",
    "call_tool",
    "activate_servers",
    "get_status",
    "analyze_task",
    "list_available_capabilities",
    "switch_context",
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("fabric")
    (home / "projects").mkdir()
    return home


fabric = orchestrator_fixture(
    scope="module",
    home="home",
    timeouts={"time": "3s", "everything": "5m", "git": "5m"},
    # analyze_task asks a client that offers sampling whenever it is below certainty.
    fabric={"model_assist": {"enabled": True, "below_confidence": 1, "timeout": "30s"}},
)


def sdk2(url: str, mode: str = "legacy") -> LineProcess:
    return python2_client(url, mode)


def session_of(fabric: Orchestrator, client: LineProcess) -> str:
    """The session id of a client's fabric session, as get_status tells it."""
    status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
    assert status["ok"], status
    return str(status["structured"]["session_id"])


def services_started(docker_client: docker.DockerClient, session: str) -> list[str]:
    return sorted(
        c.labels["reactor-fabric.service"] for c in containers_of(docker_client, session=session)
    )


def test_a_handshake_client_lists_namespaced_tools_and_a_call_starts_only_that_service(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = sdk2(f"{fabric.http_url}/mcp?tools=all")
    try:
        assert client.ask({"op": "initialize"})["server"] == "reactor-fabric"
        tools = set(client.ask({"op": "list_tools"})["tools"])
        assert tools >= META_TOOLS
        assert {"time__get_current_time", "git__git_log", "everything__echo"} <= tools
        assert all(len(name) <= 64 for name in tools)
        session = session_of(fabric, client)
        assert services_started(docker_client, session) == []  # listing starts nothing
        answer = client.ask(
            {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        )
        assert answer["ok"], answer
        assert '"timezone": "UTC"' in text_of(answer)
        assert services_started(docker_client, session) == ["time"]
    finally:
        client.close()


def test_a_stateless_client_finds_and_calls_a_tool_that_is_not_listed(
    fabric: Orchestrator,
) -> None:
    client = sdk2(f"{fabric.http_url}/mcp/fabric/stateless-key", mode="auto")
    try:
        assert client.ask({"op": "initialize"})["protocol"] == "2026-07-28"
        assert set(client.ask({"op": "list_tools"})["tools"]) == META_TOOLS
        found = client.ask(
            {"op": "call", "name": "find_tools", "arguments": {"query": "echo a message"}}
        )
        assert "everything__echo" in [tool["name"] for tool in found["structured"]["tools"]]
        echoed = client.ask(
            {
                "op": "call",
                "name": "call_tool",
                "arguments": {"name": "everything__echo", "arguments": {"message": "hi"}},
            }
        )
        assert echoed["ok"], echoed
        assert text_of(echoed) == "Echo: hi"
    finally:
        client.close()


def test_two_sessions_with_different_repos_each_see_only_their_own_git_log(
    fabric: Orchestrator, home: Path, docker_client: docker.DockerClient
) -> None:
    repos = {
        name: git_repo(home / "projects" / f"fabric-{name}", [f"{name}: the only commit"])
        for name in ("alpha", "beta")
    }
    clients = {
        name: python_client(f"{fabric.ws_url}/mcp?mount={repo}:/workspace")
        for name, repo in repos.items()
    }
    try:
        for name, client in clients.items():
            assert client.ask({"op": "initialize"})["ok"]
            log = client.ask(
                {"op": "call", "name": "git__git_log", "arguments": {"repo_path": "/workspace"}}
            )
            assert log["ok"], log
            other = "beta" if name == "alpha" else "alpha"
            assert f"{name}: the only commit" in text_of(log)
            assert other not in text_of(log)
        sessions = {session_of(fabric, client) for client in clients.values()}
        assert len(sessions) == 2
        for session in sessions:
            assert services_started(docker_client, session) == ["git"]
    finally:
        for client in clients.values():
            client.close()


def test_activation_changes_the_list_and_the_client_hears_list_changed(
    fabric: Orchestrator,
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        assert set(client.ask({"op": "list_tools"})["tools"]) == META_TOOLS
        activated = client.ask(
            {"op": "call", "name": "activate_servers", "arguments": {"servers": ["git"]}}
        )
        assert activated["structured"]["activated"] == ["git"]
        assert activated["structured"]["reconnect_required"] is False
        tools = set(client.ask({"op": "list_tools"})["tools"])
        assert "git__git_log" in tools
        assert "time__get_current_time" not in tools
        heard = client.ask({"op": "heard"})
        assert "notifications/tools/list_changed" in heard["notifications"]
    finally:
        client.close()


def test_an_idle_service_is_removed_and_the_next_call_respawns_it(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        call = {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        assert client.ask(call)["ok"]
        session = session_of(fabric, client)
        [first] = containers_of(docker_client, session=session)
        wait_until(
            lambda: not containers_of(docker_client, session=session),
            what="the idle time container to be removed",
        )
        assert client.ask(call)["ok"]  # transparently started again
        [second] = containers_of(docker_client, session=session)
        assert second.id != first.id
    finally:
        client.close()


def test_progress_roots_and_sampling_pass_between_everything_and_the_client(
    fabric: Orchestrator, home: Path
) -> None:
    project = home / "projects" / "sampling"
    project.mkdir()
    client = python_client(f"{fabric.ws_url}/mcp?mount={project}:/workspace", "--sampling")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        progress = client.ask(
            {
                "op": "call",
                "name": "everything__trigger-long-running-operation",
                "arguments": {"duration": 1, "steps": 2},
                "progress": True,
            }
        )
        assert progress["ok"], progress
        assert progress["progress"] == [[1.0, 2.0], [2.0, 2.0]]
        roots = client.ask({"op": "call", "name": "everything__get-roots-list", "arguments": {}})
        assert "file:///workspace" in text_of(roots)
        sampled = client.ask(
            {
                "op": "call",
                "name": "everything__trigger-sampling-request",
                "arguments": {"prompt": "hello", "maxTokens": 10},
            }
        )
        assert sampled["ok"], sampled
        assert "sampled by the test client" in text_of(sampled)
        assert client.ask({"op": "heard"})["sampling"] == 1
    finally:
        client.close()


def test_a_killed_service_fails_its_call_in_flight_while_another_keeps_working(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        echo = {"op": "call", "name": "everything__echo", "arguments": {"message": "x"}}
        assert client.ask(echo)["ok"]
        started = client.ask(
            {
                "op": "start",
                "tag": "long",
                "name": "everything__trigger-long-running-operation",
                "arguments": {"duration": 60, "steps": 60},
            }
        )
        assert started["ok"]
        assert client.ask(
            {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        )["ok"]
        session = session_of(fabric, client)
        [everything] = [
            c
            for c in containers_of(docker_client, session=session)
            if c.labels["reactor-fabric.service"] == "everything"
        ]
        everything.kill()
        failed = client.ask({"op": "result", "tag": "long"})
        assert failed["ok"] is False, failed
        assert failed["error"]["code"] == -32002
        assert failed["error"]["data"]["reason"] == "container_exited"
        still = client.ask(
            {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        )
        assert still["ok"], still
    finally:
        client.close()


def test_the_typescript_sdk_lists_and_calls_over_http(fabric: Orchestrator) -> None:
    client = ts_client(f"{fabric.http_url}/mcp?tools=all")
    try:
        assert client.ask({"op": "initialize"})["server"] == "reactor-fabric"
        assert "git__git_status" in client.ask({"op": "list_tools"})["tools"]
        converted = client.ask(
            {
                "op": "call",
                "name": "time__convert_time",
                "arguments": {
                    "source_timezone": "UTC",
                    "time": "12:00",
                    "target_timezone": "Asia/Tokyo",
                },
            }
        )
        assert converted["ok"], converted
        # The converted time itself (Tokyo is UTC+9 all year), not the zone the request echoes.
        target = json.loads(text_of(converted))["target"]["datetime"]
        assert converted_time("12:00", "Asia/Tokyo") == {"T21:00:00+09:00"}
        assert target[10:] == "T21:00:00+09:00"
    finally:
        client.close()


def test_claude_code_shows_the_fabric_endpoint_connected(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    """`claude mcp list` connects to each server it has (no API key needed)."""
    claude_shows_connected(tmp_path, "fabric", f"{fabric.http_url}/mcp")


def test_the_bridge_without_a_service_serves_the_whole_suite(
    fabric: Orchestrator, home: Path
) -> None:
    project = home / "projects" / "bridged"
    project.mkdir()
    (project / "notes.txt").write_text("bridged and mounted\n")
    client = bridged_client(fabric.ws_url, cwd=project)
    try:
        assert client.ask({"op": "initialize"})["server"] == "reactor-fabric"
        read = client.ask(
            {
                "op": "call",
                "name": "filesystem__read_text_file",
                "arguments": {"path": "/workspace/notes.txt"},
            }
        )
        assert read["ok"], read
        assert "bridged and mounted" in text_of(read)
    finally:
        client.close()


def inspector(fabric: Orchestrator, url: str, home: Path, *arguments: str) -> Any:
    """One MCP Inspector CLI command; its JSON output (stdout), asserted to succeed."""
    done = subprocess.run(
        [
            *envs.inspector_cli(),
            url,
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {harness.TEST_TOKEN}",
            "--stored-auth-only",
            *arguments,
        ],
        env={**os.environ, "HOME": str(home)},  # it keeps a store in HOME
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def inspector_calls_time(fabric: Orchestrator, url: str, home: Path) -> None:
    """The Inspector CLI calls ``time__get_current_time`` at ``url`` (tools listed), asserted to
    answer for UTC."""
    called = inspector(
        fabric,
        url,
        home,
        "--method",
        "tools/call",
        "--tool-name",
        "time__get_current_time",
        "--tool-arg",
        "timezone=UTC",
    )
    assert called["structuredContent"]["timezone"] == "UTC"


def test_the_inspector_cli_lists_and_calls_namespaced_tools(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    every = f"{fabric.http_url}/mcp?tools=all"
    listed = inspector(fabric, every, tmp_path, "--method", "tools/list")
    names = {tool["name"] for tool in listed["tools"]}
    assert {"time__get_current_time", "filesystem__read_text_file"} | META_TOOLS <= names
    inspector_calls_time(fabric, every, tmp_path)
    # With the default exposure the Inspector (which calls only listed tools) uses call_tool.
    through = inspector(
        fabric,
        f"{fabric.http_url}/mcp",
        tmp_path,
        "--method",
        "tools/call",
        "--tool-name",
        "call_tool",
        "--tool-args-json",
        '{"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}',
    )
    assert through["structuredContent"]["timezone"] == "UTC"


def test_prompts_and_resources_of_a_service_are_listed_and_routed(fabric: Orchestrator) -> None:
    client = python_client(f"{fabric.ws_url}/mcp?tools=all")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        assert "everything__args-prompt" in client.ask({"op": "list_prompts"})["prompts"]
        prompt = client.ask(
            {"op": "get_prompt", "name": "everything__args-prompt", "arguments": {"city": "Paris"}}
        )
        assert "Paris" in prompt["messages"][0]["content"]["text"]
        uri = "demo://resource/static/document/features.md"
        assert uri in client.ask({"op": "list_resources"})["resources"]
        read = client.ask({"op": "read_resource", "uri": uri})
        assert read["contents"][0]["text"].startswith("# Everything Server - Features")
    finally:
        client.close()


def test_a_stateless_client_subscribes_to_list_changes(fabric: Orchestrator) -> None:
    client = sdk2(f"{fabric.http_url}/mcp/fabric/listening", mode="auto")
    try:
        assert client.ask({"op": "initialize"})["protocol"] == "2026-07-28"
        listened = client.ask({"op": "listen"})
        assert listened["ok"], listened
        assert listened["honored"]["toolsListChanged"] is True
        assert client.ask({"op": "call", "name": "get_status", "arguments": {}})["ok"]
    finally:
        client.close()


@pytest.mark.parametrize(
    ("query", "reason"),
    [("?profile=nope", "profile_not_found"), ("?tools=some", "unknown_exposure")],
)
def test_an_unknown_profile_or_exposure_is_the_error_the_clients_show(
    fabric: Orchestrator, query: str, reason: str
) -> None:
    for client in (
        sdk2(f"{fabric.http_url}/mcp{query}"),
        python_client(f"{fabric.ws_url}/mcp{query}"),
        ts_client(f"{fabric.http_url}/mcp{query}"),
    ):
        try:
            refused = client.ask({"op": "initialize"})
            assert refused["ok"] is False, refused
            assert refused["error"]["code"] == -32600, refused
            assert refused["error"]["data"]["reason"] == reason, refused
            assert query.split("=")[1] in refused["error"]["data"]["detail"], refused
        finally:
            client.close()


def test_analyze_task_find_tools_and_get_status_answer_from_the_ranking_engine(
    fabric: Orchestrator,
) -> None:
    client = sdk2(f"{fabric.http_url}/mcp")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        analysed = client.ask(
            {
                "op": "call",
                "name": "analyze_task",
                "arguments": {"task_description": "show me the last commits of my repository"},
            }
        )
        assert analysed["ok"], analysed
        result = analysed["structured"]
        assert result["recommended_servers"] == ["git"]
        assert result["decided_by"] == "ranking"  # this client offers no sampling
        assert result["estimated_tokens"]["git"] > 100
        assert result["reasoning"].startswith("git: commit (description)")
        assert 0.0 < result["confidence"] <= 1.0
        assert "git" not in result["alternative_servers"]
        found = client.ask(
            {
                "op": "call",
                "name": "find_tools",
                "arguments": {"query": "current time in a timezone", "limit": 3},
            }
        )
        assert found["structured"]["tools"][0]["name"] == "time__get_current_time"
        assert len(found["structured"]["tools"]) <= 3
        tokens = client.ask({"op": "call", "name": "get_status", "arguments": {}})["structured"][
            "tool_tokens"
        ]
        assert tokens["tokenizer"] == "cl100k_base"
        assert 0 < tokens["exposed"] < tokens["all"]
        assert tokens["saved_ratio"] > 0.5
        # Counted in a child process: tiktoken's library is never mapped into the
        # orchestrator (see reactor_fabric/_token_counter.py).
        assert "tiktoken" not in Path(f"/proc/{fabric.process.pid}/maps").read_text()
    finally:
        client.close()


def test_an_unsure_analysis_asks_the_clients_own_model_and_takes_its_choice(
    fabric: Orchestrator,
) -> None:
    # The SDK 1.x client's sampling callback plays the model: it answers with a server name.
    client = python_client(
        f"{fabric.ws_url}/mcp", "--sampling", "--sampling-reply", 'I would use ["time"].'
    )
    try:
        assert client.ask({"op": "initialize"})["ok"]
        task = "what changed in my repository since this morning, in my time zone"
        analysed = client.ask(
            {"op": "call", "name": "analyze_task", "arguments": {"task_description": task}}
        )
        assert analysed["ok"], analysed
        result = analysed["structured"]
        assert result["decided_by"] == "client_model"
        assert result["recommended_servers"] == ["time"]
        assert result["reasoning"].startswith("chosen by the client's model among")
        heard = client.ask({"op": "heard"})
        assert heard["sampling"] == 1
        [prompt] = heard["prompts"]
        assert task in prompt
        assert "- git:" in prompt
        assert "- time:" in prompt
    finally:
        client.close()


def test_a_service_whose_image_is_missing_is_named_with_its_reason_not_an_unknown_tool(
    tmp_path: Path,
) -> None:
    # Its own orchestrator: a suite naming an image that is not there (never pulled).
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path)],
        test_services={"ghost": {"image": "reactor-fabric/ghost:none"}},
    )
    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        client = sdk2(f"{running.http_url}/mcp")
        try:
            assert client.ask({"op": "initialize"})["ok"]
            activated = client.ask(
                {
                    "op": "call",
                    "name": "activate_servers",
                    "arguments": {"servers": ["ghost", "time"]},
                }
            )
            assert activated["ok"], activated
            assert activated["structured"]["activated"] == ["time"]
            [failed] = activated["structured"]["failed"]
            assert failed["server"] == "ghost"
            assert failed["reason"] == "image_not_found"
            # Any tool of it: the start's failure, not -32602 unknown tool.
            called = client.ask({"op": "call", "name": "ghost__anything", "arguments": {}})
            assert called["ok"] is False, called
            assert called["error"]["code"] == -32002
            assert called["error"]["data"]["reason"] == "image_not_found"
            found = client.ask(
                {"op": "call", "name": "find_tools", "arguments": {"query": "ghost"}}
            )
            assert found["structured"]["unavailable"]["ghost"]["reason"] == "image_not_found"
        finally:
            client.close()
