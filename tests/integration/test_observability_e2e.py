"""End to end, what operators see: the audit trail, ``/metrics``, the sessions command.

The real orchestrator and engine, the bundled servers and real clients (the Python SDK 1.x over
WebSocket on the relay, the SDK 2.x over Streamable HTTP on the fabric endpoint; a raw WebSocket
client where a test needs a frame no SDK sends on demand, the cancellation). One orchestrator
serves the module; each test looks only at its own sessions' records, and checks that the
metrics' counters equal the trail's records at that moment.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import docker
import pytest
import trio
import trio_websocket
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import (
    REPO,
    Orchestrator,
    answer_past_progress,
    containers_of,
    orchestrator_fixture,
    post,
    python2_client,
    python_client,
    started_call,
    time_call_through_fabric,
    wait_until,
)
from tests.messages import INITIALIZE, INITIALIZED, request

pytestmark = pytest.mark.integration

LONG_CALL = {
    "name": "trigger-long-running-operation",
    "arguments": {"duration": 60, "steps": 60},
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("observability")
    (home / "projects").mkdir()
    return home


fabric = orchestrator_fixture(scope="module", home="home")


def records_of(fabric: Orchestrator, session: str) -> list[dict[str, Any]]:
    return [r for r in fabric.audit() if r.get("session") == session]


def ended(fabric: Orchestrator, session: str) -> list[dict[str, Any]]:
    """The session's records, once its session_end and container stops are written."""

    def done() -> bool:
        records = records_of(fabric, session)
        events = Counter(r["event"] for r in records)
        return events["session_end"] == 1 and events["container_stop"] == events["container_start"]

    wait_until(done, what=f"the end of session {session} in the audit trail")
    return records_of(fabric, session)


def calls_in(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == "tool_call"]


def metrics(fabric: Orchestrator) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    request_ = urllib.request.Request(f"{fabric.http_url}/metrics", headers=fabric.auth_header)
    with urllib.request.urlopen(request_, timeout=10) as answer:
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def assert_metrics_match_the_trail(fabric: Orchestrator) -> None:
    """reactor_fabric_tool_calls_total equals the trail's tool_call records, label by label."""

    def counted() -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str, str]]]:
        trail = Counter(
            (r["service"], r["tool"], r["outcome"])
            for r in fabric.audit()
            if r["event"] == "tool_call"
        )
        exported: Counter[tuple[str, str, str]] = Counter()
        for (name, labels), value in metrics(fabric).items():
            if name == "reactor_fabric_tool_calls_total":
                label = dict(labels)
                exported[(label["service"], label["tool"], label["outcome"])] = int(value)
        return trail, exported

    def equal() -> bool:
        trail, exported = counted()
        return trail == exported

    wait_until(equal, what="metrics equal to the trail")


def sha256_of(arguments: dict[str, Any]) -> str:
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_every_relay_tool_call_is_audited_once_with_who_where_and_how_it_ended(
    fabric: Orchestrator,
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/time", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        good = client.ask(
            {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
        )
        assert good["ok"], good
        bad = client.ask(
            {"op": "call", "name": "get_current_time", "arguments": {"timezone": "Nowhere/Bad"}}
        )
        assert not bad["ok"], bad
    finally:
        assert client.close() == 0
    records = ended(fabric, session)
    events = [r["event"] for r in records]
    assert events[0] == "session_start"
    assert events[-1] == "session_end" or events[-2:] == ["container_stop", "session_end"]
    [start] = [r for r in records if r["event"] == "session_start"]
    assert start["endpoint"] == "relay"
    assert start["client"]["transport"] == "websocket"
    assert start["client"]["peer"].startswith("127.0.0.1:")
    assert start["client"]["token"].startswith("sha256:")
    assert fabric.token is not None
    assert fabric.token not in json.dumps(records)
    [container] = [r for r in records if r["event"] == "container_start"]
    assert (container["service"], container["respawn"]) == ("time", False)
    [stop] = [r for r in records if r["event"] == "container_stop"]
    assert (stop["container"], stop["reason"]) == (container["container"], "session_ended")
    first, second = calls_in(records)
    for call in (first, second):
        assert (call["endpoint"], call["service"], call["tool"]) == (
            "relay",
            "time",
            "get_current_time",
        )
        assert call["container"] == container["container"]
        assert call["client"] == start["client"]
        assert call["duration_ms"] > 0
        assert call["bytes_in"] > 0
        assert call["bytes_out"] > 0
        assert len(call["trace_id"]) == 32
        assert call["trace_id"] == start["trace_id"]
    assert (first["outcome"], first["error_code"]) == ("ok", None)
    assert first["arguments_sha256"] == sha256_of({"timezone": "UTC"})
    assert second["outcome"] == "error"
    assert first["request_id"] != second["request_id"]
    assert "Nowhere/Bad" not in json.dumps(records)  # arguments are hashed by default
    assert_metrics_match_the_trail(fabric)


def test_a_killed_container_is_audited_as_the_error_its_client_got(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/everything", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        started_call(client, LONG_CALL)  # the server has it, and answers only after 60 s
        [container] = containers_of(docker_client, session=session)
        container.kill()
        failed = answer_past_progress(client)
        assert failed["error"]["data"]["reason"] == "container_exited"
    finally:
        assert client.close() == 0
    records = ended(fabric, session)
    [call] = [c for c in calls_in(records) if c["tool"] == LONG_CALL["name"]]
    assert (call["outcome"], call["error_code"], call["error_reason"]) == (
        "error",
        -32002,
        "container_exited",
    )
    stops = [r for r in records if r["event"] == "container_stop"]
    assert (stops[0]["reason"], stops[0]["exit_code"]) == ("exited", 137)
    assert_metrics_match_the_trail(fabric)


def test_a_client_that_vanishes_mid_call_is_audited_as_no_answer_and_its_container_removed(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/everything", "--register", "[]")
    session = client.read_json()["result"]["sessionId"]
    assert client.ask({"op": "initialize"})["ok"]
    started_call(client, LONG_CALL)  # the server has it
    client.process.send_signal(signal.SIGKILL)
    client.close()
    records = ended(fabric, session)
    [call] = calls_in(records)
    assert (call["outcome"], call["tool"]) == ("no_answer", LONG_CALL["name"])
    assert containers_of(docker_client, session=session) == []
    assert_metrics_match_the_trail(fabric)


def test_a_call_the_client_cancels_is_audited_as_cancelled_once(fabric: Orchestrator) -> None:
    async def cancel_a_call() -> None:
        url = f"{fabric.ws_url}/mcp/everything?token={fabric.token}"
        async with trio_websocket.open_websocket_url(url) as ws:
            await ws.send_message(json.dumps(INITIALIZE))
            json.loads(await ws.get_message())
            await ws.send_message(json.dumps(INITIALIZED))
            progressing = {**LONG_CALL, "_meta": {"progressToken": "p7"}}
            await ws.send_message(json.dumps(request(7, "tools/call", progressing)))
            # The server has the call once it reports progress (past any other notification).
            while json.loads(await ws.get_message()).get("method") != "notifications/progress":
                pass
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 7, "reason": "the user pressed stop"},
            }
            await ws.send_message(json.dumps(cancel))
            # The client leaves once the orchestrator took the cancel (its record is written).
            await trio.to_thread.run_sync(
                lambda: wait_until(cancel_recorded, what="the cancelled call's record")
            )

    before = {r.get("session") for r in fabric.audit()}

    def cancel_recorded() -> bool:
        records = [r for r in fabric.audit() if r.get("session") not in before]
        return any(c["request_id"] == 7 for c in calls_in(records))

    trio.run(cancel_a_call)
    wait_until(
        lambda: any(
            r["event"] == "session_end" and r["session"] not in before for r in fabric.audit()
        ),
        what="the session's end",
    )
    [session] = {
        r["session"]
        for r in fabric.audit()
        if r["event"] == "session_start" and r["session"] not in before
    }
    [call] = calls_in(ended(fabric, session))
    assert (call["outcome"], call["request_id"]) == ("cancelled", 7)
    assert_metrics_match_the_trail(fabric)


def test_fabric_endpoint_calls_are_audited_under_the_service_and_tool_that_ran_them(
    fabric: Orchestrator,
) -> None:
    client = python2_client(f"{fabric.http_url}/mcp", "legacy")
    session = time_call_through_fabric(client)
    records = ended(fabric, session)
    [start] = [r for r in records if r["event"] == "session_start"]
    assert (start["endpoint"], start["client"]["transport"]) == ("fabric", "streamable-http")
    calls = {(c["service"], c["tool"]): c for c in calls_in(records)}
    assert set(calls) == {("fabric", "get_status"), ("time", "get_current_time")}
    routed = calls[("time", "get_current_time")]
    assert (routed["endpoint"], routed["outcome"]) == ("fabric", "ok")
    [container] = [r for r in records if r["event"] == "container_start"]
    assert routed["container"] == container["container"]
    assert routed["arguments_sha256"] == sha256_of({"timezone": "UTC"})
    assert_metrics_match_the_trail(fabric)


def run_cli(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reactor_fabric", *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_audit_verify_accepts_the_trail_and_catches_an_edited_or_a_removed_line(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/time", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        for _ in range(3):
            assert client.ask(
                {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
            )["ok"]
    finally:
        assert client.close() == 0
    ended(fabric, session)
    copy = tmp_path / "audit.jsonl"
    shutil.copy(fabric.audit_path, copy)
    lines = copy.read_bytes().splitlines(keepends=True)
    lines = lines[: len(lines)]  # a consistent snapshot: complete lines only
    copy.write_bytes(b"".join(line for line in lines if line.endswith(b"\n")))
    intact = run_cli("audit", "verify", "--path", str(copy))
    assert intact.returncode == 0, intact.stdout + intact.stderr
    assert "chain intact" in intact.stdout

    # What a person tidying up the trail might do: flip one call's outcome.
    lines = copy.read_bytes().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if b'"outcome":"ok"' in line)
    edited = list(lines)
    edited[index] = edited[index].replace(b'"outcome":"ok"', b'"outcome":"error"')
    copy.write_bytes(b"".join(edited))
    caught = run_cli("audit", "verify", "--path", str(copy))
    assert caught.returncode == 1
    assert f"{copy}:{index + 2}: the previous line was changed or removed" in caught.stdout

    removed = lines[:index] + lines[index + 1 :]
    copy.write_bytes(b"".join(removed))
    caught = run_cli("audit", "verify", "--path", str(copy))
    assert caught.returncode == 1
    assert f"{copy}:{index + 1}: the previous line was changed or removed" in caught.stdout

    # Reading: the session's calls, filtered, as JSON lines and as text.
    shown = run_cli(
        "audit",
        "--path",
        str(fabric.audit_path),
        "--session",
        session,
        "--tool",
        "get_current_time",
        "--json",
    )
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(line)["outcome"] for line in shown.stdout.splitlines()] == ["ok"] * 3
    text = run_cli(
        "audit", "--path", str(fabric.audit_path), "--session", session, "--since", "10m"
    )
    assert text.stdout.count("tool_call") == 3
    assert "session_start" in text.stdout


def test_an_operator_lists_sessions_and_ends_one_whose_client_is_told_why(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/everything", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        wait_until(lambda: bool(containers_of(docker_client, session=session)), what="container")
        token = fabric.token
        assert token is not None
        listed = run_cli("sessions", "--url", fabric.http_url, f"--token={token}", "--json")
        assert listed.returncode == 0, listed.stderr
        [mine] = [s for s in json.loads(listed.stdout)["sessions"] if s["id"] == session]
        assert (mine["endpoint"], mine["service"], mine["transport"]) == (
            "relay",
            "everything",
            "websocket",
        )
        [container] = containers_of(docker_client, session=session)
        assert [c["id"] for c in mine["containers"]] == [container.id[:12]]
        text = run_cli("sessions", "--url", fabric.http_url, f"--token={token}")
        assert session in text.stdout

        started_call(client, LONG_CALL)  # the server has it
        end = run_cli("sessions", "--url", fabric.http_url, f"--token={token}", "--end", session)
        assert end.returncode == 0, end.stdout + end.stderr
        told = answer_past_progress(client)
        assert told["error"]["data"]["reason"] == "session_ended_by_operator", told
        assert "an operator of the orchestrator ended this session" in json.dumps(told["error"])
    finally:
        client.close()
    records = ended(fabric, session)
    assert [c["error_reason"] for c in calls_in(records)] == ["session_ended_by_operator"]
    assert {r["reason"] for r in records if r["event"] == "container_stop"} == {
        "session_ended_by_operator"
    }
    assert containers_of(docker_client, session=session) == []
    gone = run_cli(
        "sessions", "--url", fabric.http_url, f"--token={fabric.token}", "--end", session
    )
    assert gone.returncode == 1
    assert "no such session" in gone.stderr


def test_metrics_need_the_token_and_count_what_happened(fabric: Orchestrator) -> None:
    anonymous = urllib.request.Request(f"{fabric.http_url}/metrics")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=10)
    assert refused.value.code == 401
    refused.value.close()
    figures = metrics(fabric)
    names = {name for name, _labels in figures}
    for expected in (
        "reactor_fabric_sessions",
        "reactor_fabric_containers",
        "reactor_fabric_tool_calls_total",
        "reactor_fabric_tool_call_duration_seconds_bucket",
        "reactor_fabric_container_start_seconds_bucket",
        "reactor_fabric_errors_total",
        "reactor_fabric_relay_bytes_total",
        "reactor_fabric_idle_teardowns_total",
        "reactor_fabric_respawns_total",
        "reactor_fabric_orphans_removed_total",
        "reactor_fabric_audit_dropped_total",
    ):
        assert expected in names, expected
    errors = {
        dict(labels)["reason"]: value
        for (name, labels), value in figures.items()
        if name == "reactor_fabric_errors_total"
    }
    assert errors.get("token_missing", 0) >= 1  # the anonymous request above
    relayed = {
        dict(labels)["direction"]: value
        for (name, labels), value in figures.items()
        if name == "reactor_fabric_relay_bytes_total"
    }
    assert relayed["to_server"] > 0
    assert relayed["to_client"] > 0
    assert figures[("reactor_fabric_audit_dropped_total", ())] == 0


def test_the_trace_context_of_the_opening_request_and_of_each_call_reaches_the_trail(
    fabric: Orchestrator,
) -> None:
    opening = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    per_call = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with post(fabric, "/mcp/time", INITIALIZE, traceparent=opening) as answer:
        session_header = answer.headers["Mcp-Session-Id"]
        answer.read()
    sid = {"Mcp-Session-Id": session_header}
    post(fabric, "/mcp/time", INITIALIZED, **sid).close()
    arguments = {"name": "get_current_time", "arguments": {"timezone": "UTC"}}
    traced = {**arguments, "_meta": {"traceparent": per_call}}
    for number, params in [(2, traced), (3, arguments)]:
        with post(fabric, "/mcp/time", request(number, "tools/call", params), **sid) as answer:
            assert b'"result"' in answer.read()
    delete = urllib.request.Request(
        f"{fabric.http_url}/mcp/time", method="DELETE", headers={**fabric.auth_header, **sid}
    )
    urllib.request.urlopen(delete, timeout=30).close()

    def opened() -> list[str]:
        return [
            r["session"]
            for r in fabric.audit()
            if r["event"] == "session_start" and r["trace_id"] == opening.split("-")[1]
        ]

    wait_until(lambda: bool(opened()), what="the session's start")
    [session] = opened()
    records = ended(fabric, session)
    [start] = [r for r in records if r["event"] == "session_start"]
    assert start["client"]["transport"] == "streamable-http"
    assert start["client"]["peer"].startswith("127.0.0.1:")
    assert [c["trace_id"] for c in calls_in(records)] == [
        per_call.split("-")[1],
        opening.split("-")[1],
    ]


TEST_TOOLS = REPO / ".cache" / "test-tools" / "usr" / "bin"


def test_promtool_accepts_the_metrics(fabric: Orchestrator) -> None:
    request_ = urllib.request.Request(f"{fabric.http_url}/metrics", headers=fabric.auth_header)
    with urllib.request.urlopen(request_, timeout=10) as answer:
        text = answer.read()
    checked = subprocess.run(
        [str(TEST_TOOLS / "promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def documented_scrape_config() -> str:
    """The scrape config block of docs/OPERATIONS.md, as a user would copy it."""
    text = (REPO / "docs" / "OPERATIONS.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    [block] = [str(b) for b in blocks if "job_name: reactor-fabric" in b]
    return block


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_real_prometheus_scrapes_the_documented_config_and_stores_what_the_trail_says(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{fabric.token}\n")
    port = fabric.http_url.rsplit(":", 1)[1]
    config = (
        documented_scrape_config()
        .replace("/home/me/.config/reactor-fabric/token", str(token_file))
        .replace("127.0.0.1:8765", f"127.0.0.1:{port}")
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
    )
    (tmp_path / "prometheus.yml").write_text(config)
    web = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    server = subprocess.Popen(
        [
            str(TEST_TOOLS / "prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=log,
        stderr=log,
    )
    try:
        client = python_client(f"{fabric.ws_url}/mcp/time", "--register", "[]")
        try:
            session = client.read_json()["result"]["sessionId"]
            assert client.ask({"op": "initialize"})["ok"]
            call = {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
            assert client.ask(call)["ok"]
        finally:
            assert client.close() == 0
        ended(fabric, session)
        trail = sum(1 for r in fabric.audit() if r["event"] == "tool_call")

        def stored() -> float | None:
            query = urllib.parse.urlencode({"query": "sum(reactor_fabric_tool_calls_total)"})
            try:
                url = f"http://127.0.0.1:{web}/api/v1/query?{query}"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    result = json.load(answer)["data"]["result"]
            except (OSError, ValueError):
                return None
            return float(result[0]["value"][1]) if result else None

        wait_until(lambda: stored() == trail, what=f"Prometheus to store {trail} calls")
        url = f"http://127.0.0.1:{web}/api/v1/targets"
        with urllib.request.urlopen(url, timeout=5) as answer:
            [target] = json.load(answer)["data"]["activeTargets"]
        assert (target["health"], target["labels"]["job"]) == ("up", "reactor-fabric")
    finally:
        server.terminate()
        server.wait(30)
        log.close()
