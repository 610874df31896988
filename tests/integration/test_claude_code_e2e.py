"""Claude Code itself, run headless (``claude -p``), calls a ``fresh_per_call`` service through
the fabric endpoint ``/mcp``, on the real engine: each of its tool calls runs in a container of
its own, removed after it.

The model is a script (tests/messages_api.py): Claude Code's ``ANTHROPIC_BASE_URL`` is a local
stand-in for the Messages API that answers its turns with ``tool_use`` blocks, then a text; no
key, no network. What Claude Code 2.1.332 sends it (with
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``): only ``POST /v1/messages?beta=true``, streamed
(``"stream": true``), one per turn, each with the whole history — no ``count_tokens``, no model
check, nothing else. Its MCP tools are deferred by default (tool search): the first request
offers only its built-in tools and ``ToolSearch``, and names the MCP tools in a reminder; the
model loads one with ``ToolSearch`` (``select:mcp__fabric__time__get_current_time``), and the
requests after that offer it. The script does just that (``ENABLE_TOOL_SEARCH=false`` would
offer every MCP tool from the first request instead). The tools are listed with the header
``X-Reactor-Fabric-Tools: all`` (each service's tools as ``service__tool``); in ``-p`` mode an
MCP tool runs only if ``--allowedTools`` names it.

Which container served each call is read from the audit trail; that the engine created that
many and removed each, from the engine's own events.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import pytest

from reactor_fabric.trio.catalog import PROBE_SESSION_PREFIX
from tests.clients import envs
from tests.integration import harness
from tests.integration.harness import (
    Orchestrator,
    orchestrator_fixture,
    wait_until,
)
from tests.messages_api import Block, Step, Text, ToolUse, scripted_messages_api

pytestmark = pytest.mark.integration

# What the test is about: set to reuse_per_session, it fails (one container serves every call).
STRATEGY = "fresh_per_call"
SERVER = "fabric"  # the name Claude Code knows the orchestrator by: its tools are mcp__fabric__*
TOOL = f"mcp__{SERVER}__time__get_current_time"
ZONES = ["UTC", "Europe/Paris", "Asia/Tokyo", "America/New_York", "Australia/Sydney"]


fabric = orchestrator_fixture(service_fields={"time": {"container_strategy": STRATEGY}})


def times_read(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The current times the client sent back in ``request`` (its tool results, in order)."""
    return [
        json.loads(block["content"])
        for message in request["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result" and isinstance(block.get("content"), str)
    ]


def summary(request: dict[str, Any]) -> Sequence[Block]:
    """The script's last turn: the times the tool calls returned, as the answer's text."""
    return [Text("; ".join(f"{t['timezone']} {t['datetime']}" for t in times_read(request)))]


def run_claude(workdir: Path, fabric: Orchestrator, api_url: str) -> dict[str, Any]:
    """``claude -p`` (a fresh home and project below ``workdir``) with the orchestrator as its
    only MCP server and ``api_url`` as its Messages API; its JSON result, asserted to exit 0."""
    home = workdir / "claude-home"
    project = workdir / "claude-project"
    home.mkdir()
    project.mkdir()
    config = workdir / "mcp.json"
    headers = {"Authorization": f"Bearer {harness.TEST_TOKEN}", "X-Reactor-Fabric-Tools": "all"}
    server = {"type": "http", "url": f"{fabric.http_url}/mcp", "headers": headers}
    config.write_text(json.dumps({"mcpServers": {SERVER: server}}))
    environ = {
        "HOME": str(home),
        "PATH": os.environ["PATH"],
        "ANTHROPIC_BASE_URL": api_url,
        "ANTHROPIC_API_KEY": "not-a-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    prompt = f"What time is it in {', '.join(ZONES)}?"
    done = subprocess.run(
        [
            str(envs.claude_code()),
            "-p",
            prompt,
            "--output-format",
            "json",
            "--mcp-config",
            str(config),
            "--strict-mcp-config",  # no other MCP server (of the home or the project)
            "--allowedTools",
            TOOL,
        ],
        cwd=project,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def claude_sessions(fabric: Orchestrator) -> set[str]:
    """The sessions Claude Code opened on the orchestrator (its user agent, in the audit)."""
    return {
        r["session"]
        for r in fabric.audit()
        if r["event"] == "session_start"
        and r["client"].get("user_agent", "").startswith("claude-code/")
    }


def time_records(fabric: Orchestrator, event: str, sessions: set[str]) -> list[dict[str, Any]]:
    return [
        r
        for r in fabric.audit()
        if r["event"] == event and r.get("service") == "time" and r.get("session") in sessions
    ]


def gone(client: docker.DockerClient, container: str) -> bool:
    # Sparse: a full listing inspects what it found, and a container being removed raises.
    return client.containers.list(all=True, sparse=True, filters={"id": container}) == []


def engine_events(client: docker.DockerClient, instance: str, since: float) -> dict[str, list[str]]:
    """Container id → what the engine did to it (create, start, destroy…) since ``since``, for
    the time service's containers of client sessions of ``instance``."""
    # One label in the engine's filter, the rest checked here: Podman 4.3 answers events that
    # match *any* of several label filters (Docker: all), e.g. another orchestrator's `time`.
    wanted = {"reactor-fabric.instance": instance, "reactor-fabric.service": "time"}
    done: dict[str, list[str]] = {}
    for event in client.events(
        since=int(since),
        until=int(time.time()) + 1,
        decode=True,
        filters={"label": [f"reactor-fabric.instance={instance}"]},
    ):
        if event.get("Type") != "container":
            continue
        attributes = event.get("Actor", {}).get("Attributes", {})
        if any(attributes.get(key) != value for key, value in wanted.items()):
            continue
        if attributes.get("reactor-fabric.session", "").startswith(PROBE_SESSION_PREFIX):
            continue
        done.setdefault(event["Actor"]["ID"], []).append(event["Action"])
    return done


def test_claude_code_calling_a_per_call_service_gets_each_call_served_by_a_container_of_its_own(
    fabric: Orchestrator, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    script: list[Step] = [
        [ToolUse("ToolSearch", {"query": f"select:{TOOL}"})],
        *([ToolUse(TOOL, {"timezone": zone})] for zone in ZONES),
        summary,
    ]
    since = time.time() - 1  # the engine's events are stamped in whole seconds
    before = datetime.now().astimezone().replace(microsecond=0)
    with scripted_messages_api(script) as api:
        result = run_claude(tmp_path, fabric, api.url)
        requests = api.messages_requests()
    after = datetime.now().astimezone()

    # Claude Code ran the whole script and printed the model's last text as its result.
    assert api.refusals == [], api.refusals
    assert len(requests) == len(script)
    assert result["type"] == "result", result
    assert result["subtype"] == "success", result
    assert result["is_error"] is False, result
    assert result["permission_denials"] == [], result
    # The scripted server received the real times, one per call, in the zones asked.
    times = times_read(requests[-1])
    assert [t["timezone"] for t in times] == ZONES, times
    for read in times:
        assert before <= datetime.fromisoformat(read["datetime"]) <= after, (before, read, after)
    assert result["result"] == "; ".join(f"{t['timezone']} {t['datetime']}" for t in times)

    # The orchestrator ran each call in a container of its own, started for that call.
    sessions = claude_sessions(fabric)
    assert sessions, fabric.audit()
    # (A call's record may follow its answer.)
    wait_until(
        lambda: len(time_records(fabric, "tool_call", sessions)) >= len(ZONES),
        what="a tool_call record per call",
    )
    served_by = [r["container"] for r in time_records(fabric, "tool_call", sessions)]
    assert len(served_by) == len(ZONES), served_by
    assert len(set(served_by)) == len(ZONES), served_by  # as many containers as calls
    starts = time_records(fabric, "container_start", sessions)
    assert sorted(r["container"] for r in starts) == sorted(served_by)
    assert [r["call"]["name"] for r in starts] == ["get_current_time"] * len(ZONES)

    # Each is gone after its call (Claude Code keeps its MCP session open until it exits and
    # never ends it: the containers go with the calls, not with the session).
    wait_until(
        lambda: all(gone(docker_client, c) for c in served_by), what="every container removed"
    )
    wait_until(
        lambda: len(time_records(fabric, "container_stop", sessions)) == len(ZONES),
        what="a container_stop record per call",
    )
    stops = time_records(fabric, "container_stop", sessions)
    assert {r["reason"] for r in stops} == {"call_done"}, stops

    # The engine's own record: it created exactly these containers for the service, and
    # removed each ("destroy" on Docker, "remove" on Podman).
    # (Podman writes its events to a file that a reader may find behind: read until complete.)
    def engine_saw_every_one() -> bool:
        seen = engine_events(docker_client, fabric.instance, since)
        return sorted(c[:12] for c in seen) == sorted(served_by) and all(
            {"destroy", "remove"} & set(actions) for actions in seen.values()
        )

    with contextlib.suppress(AssertionError):
        wait_until(engine_saw_every_one, timeout=20, what="the engine's events")
    created = engine_events(docker_client, fabric.instance, since)
    assert sorted(c[:12] for c in created) == sorted(served_by), created
    for container, actions in created.items():
        assert "create" in actions, (container, actions)
        assert {"destroy", "remove"} & set(actions), (container, actions)
    left = docker_client.containers.list(
        all=True, sparse=True, filters={"label": [f"reactor-fabric.instance={fabric.instance}"]}
    )
    assert left == [], [c.id for c in left]
