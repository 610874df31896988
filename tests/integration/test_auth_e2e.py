"""Authentication on the real orchestrator process: every route and transport refuses a request
without the right token before anything starts, real clients say so, and the token the
orchestrator makes on its first start is all a user (or the stdio bridge) needs."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import trio
from wsproto.events import RejectConnection

from reactor_fabric.config.token import TOKEN_ENV
from reactor_fabric.config.token_record import record_directories, record_name
from tests.http_client import HttpClient, WebSocketClient
from tests.integration import harness
from tests.integration.harness import (
    Orchestrator,
    bridged_client,
    claude_mcp,
    containers_of,
    orchestrator,
    orchestrator_fixture,
    python_client,
    write_suite,
)
from tests.integration.test_bounds_e2e import host_port
from tests.integration.test_error_paths_e2e import LAUNCHERS
from tests.messages import INITIALIZE
from tests.squatter import SQUATTER_UID, needs_squatters, squatting

pytestmark = pytest.mark.integration

WRONG = "wrong-token-0123456789abcdef"


fabric = orchestrator_fixture(scope="module")


@pytest.fixture
def clients_without_a_token(
    fabric: Orchestrator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Client processes find no token: not in the environment, no token file (the bridge's
    client passes it HOME only, so HOME is an empty one: the machine's user may have a real
    token file, e.g. from `make run`), and not the record ``fabric`` keeps for its port (in
    /run/user/UID the bridge would find it whatever HOME is): moved aside meanwhile."""
    monkeypatch.setattr(harness, "CLIENT_TOKEN", None)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    empty_home = tmp_path / "empty-home"
    empty_home.mkdir()
    monkeypatch.setenv("HOME", str(empty_home))
    record = next(Path(e["path"]) for e in fabric.logs() if e["event"] == "token_recorded")
    aside = record.with_name(f".aside-{record.name}")
    record.rename(aside)  # the same file back afterwards: its orchestrator removes it at exit
    try:
        yield
    finally:
        aside.rename(record)


async def _raw_http(
    running: Orchestrator, method: str, target: str, headers: dict[str, str]
) -> Any:
    client = HttpClient(await trio.open_tcp_stream(*host_port(running)))
    try:
        return await client.request(
            method, target, INITIALIZE if method == "POST" else None, headers=headers
        )
    finally:
        await client.aclose()


async def _raw_websocket(running: Orchestrator, target: str, headers: dict[str, str]) -> Any:
    ws, answer = await WebSocketClient.connect(
        await trio.open_tcp_stream(*host_port(running)),
        target,
        headers=[(name.encode(), value.encode()) for name, value in headers.items()],
    )
    body = ws.rejected_body
    await ws.aclose()
    return answer, body


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("POST", "/mcp/time", {}),
        ("POST", "/mcp/time", {"authorization": f"Bearer {WRONG}"}),
        ("POST", f"/mcp/time?token={WRONG}", {}),
        ("POST", "/mcp/time", {"authorization": f"Basic {harness.TEST_TOKEN}"}),
        ("GET", "/mcp/time", {}),
        ("GET", "/mcp/time", {"authorization": f"Bearer {WRONG}"}),
        ("DELETE", "/mcp/time", {"mcp-session-id": "0" * 32}),
        ("DELETE", "/mcp/time", {"authorization": f"Bearer {WRONG}", "mcp-session-id": "0" * 32}),
        ("POST", "/mcp/time/my-stateless-key", {}),
        ("POST", "/mcp", {}),
        ("POST", "/mcp", {"authorization": f"Bearer {WRONG}"}),
        ("POST", f"/mcp?tools=all&token={WRONG}", {}),
        ("GET", "/mcp", {}),
        ("GET", "/mcp", {"authorization": f"Bearer {WRONG}"}),
        ("DELETE", "/mcp", {"mcp-session-id": "0" * 32}),
        ("DELETE", "/mcp", {"authorization": f"Bearer {WRONG}", "mcp-session-id": "0" * 32}),
        ("POST", "/mcp/fabric/my-stateless-key", {}),
        ("POST", f"/mcp/fabric/my-stateless-key?token={WRONG}", {}),
        ("GET", "/mcp/fabric/my-stateless-key", {"authorization": f"Bearer {WRONG}"}),
        ("DELETE", "/mcp/fabric/my-stateless-key", {}),
        ("GET", "/nowhere", {}),
    ],
)
def test_an_http_request_without_the_right_token_gets_401_and_starts_nothing(
    fabric: Orchestrator,
    docker_client: docker.DockerClient,
    method: str,
    target: str,
    headers: dict[str, str],
) -> None:
    reply = trio.run(_raw_http, fabric, method, target, headers)
    assert reply.status == 401
    assert reply.headers["www-authenticate"].startswith("Bearer")
    error = reply.json()["error"]
    assert error["data"]["reason"] in ("token_missing", "token_invalid")
    assert "reactor-fabric/token" in error["data"]["detail"]
    assert not containers_of(docker_client, instance=fabric.instance)


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/mcp/time", {}),
        (f"/mcp/time?token={WRONG}", {}),
        ("/mcp/time", {"authorization": f"Bearer {WRONG}"}),
        ("/mcp", {}),
        (f"/mcp?tools=all&token={WRONG}", {}),
        ("/mcp", {"authorization": f"Bearer {WRONG}"}),
    ],
)
def test_a_websocket_without_the_right_token_is_refused_at_the_handshake(
    fabric: Orchestrator,
    docker_client: docker.DockerClient,
    target: str,
    headers: dict[str, str],
) -> None:
    answer, body = trio.run(_raw_websocket, fabric, target, headers)
    assert isinstance(answer, RejectConnection)
    assert answer.status_code == 401
    assert dict(answer.headers)[b"www-authenticate"].startswith(b"Bearer")
    assert json.loads(body)["error"]["code"] == -32004
    assert not containers_of(docker_client, instance=fabric.instance)


def test_a_forged_origin_is_refused_even_with_the_token(fabric: Orchestrator) -> None:
    forged = {"authorization": f"Bearer {harness.TEST_TOKEN}", "origin": "https://evil.example"}
    assert trio.run(_raw_http, fabric, "POST", "/mcp/time", forged).status == 403
    assert trio.run(_raw_http, fabric, "GET", "/healthz", forged).status == 403
    answer, _ = trio.run(_raw_websocket, fabric, "/mcp/time", forged)
    assert answer.status_code == 403


def test_healthz_tells_a_caller_without_the_token_only_the_status(fabric: Orchestrator) -> None:
    for headers in ({}, {"authorization": f"Bearer {WRONG}"}):
        reply = trio.run(_raw_http, fabric, "GET", "/healthz", headers)
        assert (reply.status, reply.json()) == (200, {"status": "ok"})
    bearer = {"authorization": f"Bearer {harness.TEST_TOKEN}"}
    reply = trio.run(_raw_http, fabric, "GET", "/healthz", bearer)
    assert reply.json()["docker"] == "ok"
    assert "docker_version" in reply.json()
    # HEAD tells no more: the length of its answer is the status-only one's.
    for headers in ({}, {"authorization": f"Bearer {WRONG}"}):
        head = trio.run(_raw_http, fabric, "HEAD", "/healthz", headers)
        assert (head.status, head.body) == (200, b"")
        assert head.headers["content-length"] == str(len(b'{"status": "ok"}'))


# What each real client shows a user whose token is missing (measured; the assertion is the
# most each one can show). The refusal's body is a JSON-RPC error, which clients that read
# error bodies surface with its reason; Node's WebSocket hides every handshake status. The
# WWW-Authenticate error_description changed none of them (measured 2026-11 with mcp 2.3.0 and
# 1.30.0, websockets 17.4, the TypeScript SDK 1.32.2; docs/TROUBLESHOOTING.md has the others).
SHOWN = {
    "bridge-sdk2-stdio": "token_missing",  # the bridge answers with the JSON-RPC error
    "sdk2-http": "token_missing",  # mcp 2.x surfaces a JSON-RPC error in a non-2xx body
    "ts-http": "token_missing",  # TypeScript SDK: "Error POSTing to endpoint: {body}"
    "sdk1-http": "401",  # mcp 1.x: httpx's "Client error '401'"
    "sdk1-ws": "HTTP 401",  # websockets' InvalidStatus
    "ts-ws": "non-101 status code",
}


@pytest.mark.parametrize("client", sorted(LAUNCHERS))
def test_a_real_client_without_the_token_reports_the_refusal(
    fabric: Orchestrator,
    docker_client: docker.DockerClient,
    clients_without_a_token: None,
    client: str,
) -> None:
    process = LAUNCHERS[client](fabric, "time", "")
    try:
        answer = process.ask({"op": "initialize"}, timeout=60)
    finally:
        process.close()
    assert not answer["ok"], answer
    assert SHOWN[client] in json.dumps(answer), answer
    if "error" in answer and "data" in answer["error"]:
        assert answer["error"]["code"] == -32004
        assert "reactor-fabric/token" in answer["error"]["data"]["detail"]
    assert not containers_of(docker_client, instance=fabric.instance)


def test_the_first_start_makes_a_private_token_that_the_start_up_lines_and_the_bridge_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker_client: docker.DockerClient
) -> None:
    # A user's home, as the orchestrator and the bridge (whose client passes it only HOME and
    # PATH, no token) both find it.
    home = tmp_path / "home"
    home.mkdir()
    config = home / ".config"
    monkeypatch.setattr(harness, "CLIENT_TOKEN", None)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    suite = write_suite(tmp_path / "suite.yaml", [str(tmp_path)])
    with orchestrator(suite, tmp_path / "o.log", token=None) as running:
        token_file = config / "reactor-fabric" / "token"
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert running.process.stdout is not None
        lines = [running.process.stdout.readline().decode() for _ in range(5)]
        assert f"token (from {token_file}): {token}" in lines[0]
        assert any(f"/mcp?token={token}" in line for line in lines)
        assert any(f"/mcp/{{service}}?token={token}" in line for line in lines)
        # The bridge needs nothing but the file it finds by itself.
        bridge = bridged_client(running.ws_url, "--service", "time", "--no-mount")
        try:
            assert bridge.ask({"op": "initialize"}, timeout=60)["ok"]
        finally:
            assert bridge.close() == 0
        # A URL with the printed token is all a client that cannot set headers needs.
        url_client = python_client(f"{running.ws_url}/mcp/time?token={token}", "--register", "[]")
        try:
            assert "result" in url_client.read_json()
            assert url_client.ask({"op": "initialize"})["ok"]
        finally:
            assert url_client.close() == 0
    assert os.listdir(config / "reactor-fabric") == ["token"]


@pytest.fixture
def filtered_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What an MCP client passes the bridge it starts: a HOME with no token file, and no
    REACTOR_FABRIC_TOKEN, XDG_CONFIG_HOME or XDG_RUNTIME_DIR; the test clients send none."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setattr(harness, "CLIENT_TOKEN", None)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("HOME", str(home))
    return home


def test_a_bridge_started_with_a_filtered_environment_finds_the_token_given_by_flag(
    tmp_path: Path, filtered_home: Path, docker_client: docker.DockerClient
) -> None:
    # The orchestrator gets its token with --token (no file); the SDK 2.x client starts the
    # bridge with its default environment (HOME, PATH, ...): REACTOR_FABRIC_TOKEN never gets
    # there. The port's record is all the bridge has.
    suite = write_suite(tmp_path / "suite.yaml", [str(tmp_path)])
    with orchestrator(suite, tmp_path / "o.log") as running:
        assert not (filtered_home / ".config" / "reactor-fabric" / "token").exists()
        bridge = bridged_client(running.ws_url, "--service", "time", "--no-mount")
        try:
            answer = bridge.ask({"op": "initialize"}, timeout=60)
            assert answer["ok"], answer
            answer = bridge.ask(
                {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}},
                timeout=120,
            )
            assert answer["ok"], answer
        finally:
            assert bridge.close() == 0
        port = int(running.http_url.rsplit(":", 1)[1])
        directory = record_directories({"HOME": str(filtered_home)}, os.geteuid())[0]
        record = directory / record_name(port)
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
        assert harness.TEST_TOKEN not in running.log_path.read_text()
        # Without the record (and no variable, no file) the bridge has no token to send.
        record.unlink()
        bridge = bridged_client(running.ws_url, "--service", "time", "--no-mount")
        try:
            answer = bridge.ask({"op": "initialize"}, timeout=60)
            assert answer["error"]["code"] == -32004
            assert answer["error"]["data"]["reason"] == "token_missing"
            assert str(record) in answer["error"]["data"]["detail"]
        finally:
            bridge.close()
    assert not record.exists()
    assert not [p for p in directory.iterdir() if p.name.startswith(("port-", ".port-"))]


@needs_squatters
def test_a_squatter_on_ipv6_loopback_beside_the_running_orchestrator_gets_nothing_from_a_bridge(
    tmp_path: Path, filtered_home: Path
) -> None:
    # The orchestrator listens on 127.0.0.1:PORT and records its token for PORT; another local
    # user binds [::1]:PORT, a socket of its own. A bridge dialling [::1] (as `localhost` does
    # where it resolves to ::1 first) used to send that user the running orchestrator's token.
    suite = write_suite(tmp_path / "suite.yaml", [str(tmp_path)])
    with orchestrator(suite, tmp_path / "o.log") as running:
        port = int(running.http_url.rsplit(":", 1)[1])
        with squatting("::1", port) as squatter:
            bridge = bridged_client(f"ws://[::1]:{port}", "--service", "time", "--no-mount")
            try:
                answer = bridge.ask({"op": "initialize"}, timeout=60)
            finally:
                bridge.close()
            received = squatter.finish()
        # The real client shows the refusal; the squatter was reached and got not one byte.
        assert answer["error"]["code"] == -32004, answer
        assert answer["error"]["data"]["reason"] == "listener_not_yours"
        assert f"[::1]:{port} (uid {SQUATTER_UID})" in answer["error"]["message"]
        assert received == [""]
        # The user's own orchestrator, on the address it bound, is reached as always.
        bridge = bridged_client(f"ws://127.0.0.1:{port}", "--service", "time", "--no-mount")
        try:
            answer = bridge.ask({"op": "initialize"}, timeout=60)
            assert answer["ok"], answer
        finally:
            assert bridge.close() == 0


def test_claude_code_connects_with_the_token_by_header_url_or_bridge_and_fails_without(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    """`claude mcp list` checks each server's connection (no API key needed)."""
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    # The user's token file, where the orchestrator would have made it: all the bridge needs.
    token_file = home / ".config" / "reactor-fabric" / "token"
    token_file.parent.mkdir(parents=True, mode=0o700)
    token_file.write_text(f"{harness.TEST_TOKEN}\n")
    token_file.chmod(0o600)
    url = f"{fabric.http_url}/mcp/time"
    # Claude Code starts it with HOME and PATH only, in the project: PYTHONPATH makes it this
    # checkout's code (not whatever the interpreter's environment has installed).
    bridge = [
        *("env", f"PYTHONPATH={harness.REPO}", sys.executable),
        *("-m", "reactor_fabric", "connect", f"{fabric.ws_url}/mcp/time"),
    ]
    for arguments in (
        [
            "--transport",
            "http",
            "by-header",
            url,
            "--header",
            f"Authorization: Bearer {harness.TEST_TOKEN}",
        ],
        ["--transport", "http", "in-url", f"{url}?token={harness.TEST_TOKEN}"],
        ["--transport", "http", "without", url],
        ["--transport", "http", "wrong", url, "--header", f"Authorization: Bearer {WRONG}"],
        ["bridge", "--", *bridge, "--no-mount"],
    ):
        claude_mcp(home, project, "add", *arguments)
    listed = claude_mcp(home, project, "list", timeout=300)
    lines = {line.split(":", 1)[0]: line for line in listed.splitlines() if ":" in line}
    status = {
        name: ("Connected" in line, "Failed to connect" in line) for name, line in lines.items()
    }
    for name in ("by-header", "in-url", "bridge"):
        assert status.get(name) == (True, False), listed
    for name in ("without", "wrong"):
        assert status.get(name) == (False, True), listed
    # The 401's body is on the line (2.1.332: without a token it tries OAuth's dynamic client
    # registration, which the orchestrator refuses with the same body; with a wrong header it
    # quotes the body).
    assert "Security Violation: no token was sent" in lines["without"], listed
    assert "Security Violation: the token is wrong" in lines["wrong"], listed
