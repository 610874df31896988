"""The stdio bridge's pure parts: endpoint URLs and the mounts it registers."""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from reactor_fabric.trio.bridge import (
    BridgeError,
    BridgeSettings,
    fallback_command,
    fallback_suite,
    mounts_from,
    own_config_dir,
    service_url,
    start_command,
)

REPO = Path(__file__).resolve().parents[3]
UPPERCASE_ECHO = "import sys; print(sys.stdin.read().upper())"


@pytest.mark.parametrize(
    ("endpoint", "service", "url"),
    [
        ("ws://127.0.0.1:8765", "git", "ws://127.0.0.1:8765/mcp/git"),
        ("ws://127.0.0.1:8765/", "git", "ws://127.0.0.1:8765/mcp/git"),
        ("ws://127.0.0.1:8765/mcp/time", None, "ws://127.0.0.1:8765/mcp/time"),
        ("http://localhost:8765/mcp/git", "git", "ws://localhost:8765/mcp/git"),
        ("https://fabric.example:443", "git", "wss://fabric.example:443/mcp/git"),
    ],
)
def test_the_endpoint_may_be_given_in_any_usual_form(
    endpoint: str, service: str | None, url: str
) -> None:
    assert service_url(endpoint, service) == (url, url.rsplit("/", 1)[1])


@pytest.mark.parametrize(
    "endpoint",
    ["ws://127.0.0.1:8765", "http://127.0.0.1:8765/mcp", "ws://127.0.0.1:8765/mcp/fabric"],
)
def test_without_a_service_the_bridge_goes_to_the_fabric_endpoint(endpoint: str) -> None:
    assert service_url(endpoint, None) == ("ws://127.0.0.1:8765/mcp", "fabric")


@pytest.mark.parametrize(
    ("endpoint", "service", "words"),
    [
        ("ftp://x:1", "git", "not a ws://"),
        ("ws://x:1/mcp/time", "git", "names service 'time'"),
        ("ws://x:1/other/path", "git", "expected ws://HOST:PORT"),
    ],
)
def test_an_unusable_endpoint_is_a_clear_error(
    endpoint: str, service: str | None, words: str
) -> None:
    with pytest.raises(BridgeError, match=words):
        service_url(endpoint, service)


def test_by_default_the_current_directory_is_mounted_at_workspace(tmp_path: Path) -> None:
    assert mounts_from([], no_mount=False, cwd=tmp_path) == [
        {"source": str(tmp_path), "target": "/workspace", "readOnly": False}
    ]
    assert mounts_from([], no_mount=True, cwd=tmp_path) == []


def test_mount_options_replace_the_default_and_relative_sources_are_resolved(
    tmp_path: Path,
) -> None:
    (tmp_path / "docs").mkdir()
    assert mounts_from(["docs:/d:ro", "/abs:/a"], no_mount=False, cwd=tmp_path) == [
        {"source": str(tmp_path / "docs"), "target": "/d", "readOnly": True},
        {"source": "/abs", "target": "/a", "readOnly": False},
    ]


def test_connect_without_an_endpoint_says_how_to_give_one() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reactor_fabric", "connect", "--service", "git"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "REACTOR_FABRIC_ENDPOINT" in done.stderr
    assert done.stdout == ""


def test_an_unreachable_orchestrator_without_fallback_answers_the_client_then_exits_1(
    tmp_path: Path,
) -> None:
    initialize = {"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {}}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reactor_fabric",
            "connect",
            "ws://127.0.0.1:9",
            "--service",
            "git",
            "--config",
            str(tmp_path / "none.yaml"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        input=json.dumps(initialize) + "\n",
    )
    assert done.returncode == 1
    warning, line, rest = done.stderr.split("\n", 2)
    assert warning == (
        "Warning: Could not connect to Reactor-Fabric at ws://127.0.0.1:9. "
        "Falling back to standalone mode."
    )
    assert line.startswith("reactor-fabric connect: ")
    assert "service 'git' has no local fallback" in line
    # How to start it as installed, not `make run` alone (which needs a checkout).
    assert f"start the orchestrator: `{sys.executable} -m reactor_fabric --port 9`" in line
    assert rest == ""  # one plain line, no traceback
    answer = json.loads(done.stdout)
    assert answer["id"] == 7
    assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (
        -32002,
        "orchestrator_unreachable",
    )


def test_the_unreachable_message_says_how_to_start_the_orchestrator_as_installed() -> None:
    # A client's configuration names the installed program by its full path: the same one.
    program = "/opt/rf/.venv/bin/reactor-fabric"
    assert start_command("ws://127.0.0.1:8765", program) == f"{program} --port 8765"
    assert start_command("ws://localhost:9000/mcp/git", program) == f"{program} --port 9000"
    assert start_command("ws://[::1]:8765", program) == f"{program} --host ::1 --port 8765"
    assert start_command("ws://127.0.0.1:8765", "/x/__main__.py") == (
        f"{sys.executable} -m reactor_fabric --port 8765"
    )


def test_an_unreachable_orchestrator_falls_back_to_the_local_command(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        'version: "1.0"\norchestrator: {allowed_mount_roots: []}\n'
        "mcp_services:\n  echo:\n    image: x\n"
        f"    local_command: [{sys.executable!r}, '-c', {UPPERCASE_ECHO!r}]\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reactor_fabric",
            "connect",
            "ws://127.0.0.1:9/mcp/echo",
            "--config",
            str(suite),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        input="hello\n",
    )
    assert done.returncode == 0, done.stderr
    assert "Falling back to standalone mode." in done.stderr
    assert done.stdout.strip() == "HELLO"


def _connect_unreachable(
    cwd: Path, config_home: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reactor_fabric", "connect", "ws://127.0.0.1:9/mcp/echo", *extra],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        input=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize"}) + "\n",
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO),
            "HOME": str(config_home),
            "XDG_CONFIG_HOME": str(config_home),
            **(env or {}),
        },
    )


def _suite_running(marker: Path) -> str:
    script = f"open({str(marker)!r}, 'w').write('ran')"
    return (
        'version: "1.0"\norchestrator: {allowed_mount_roots: []}\n'
        "mcp_services:\n  echo:\n    image: x\n"
        f"    local_command: [{sys.executable!r}, '-c', {script!r}]\n"
    )


def test_a_suite_in_the_working_directory_never_runs_its_local_command(tmp_path: Path) -> None:
    # The client's project, freshly cloned: its suite file must not choose what runs on the host,
    # also when the environment names it.
    project = tmp_path / "project"
    project.mkdir()
    marker = tmp_path / "ran"
    (project / "claude-mcp-suite.yaml").write_text(_suite_running(marker))
    for env in ({}, {"REACTOR_FABRIC_CONFIG": "claude-mcp-suite.yaml"}):
        done = _connect_unreachable(project, tmp_path / "empty-config", env=env)
        assert done.returncode == 1
        assert not marker.exists()
        assert "has no local fallback" in done.stderr
        assert json.loads(done.stdout)["error"]["data"]["reason"] == "orchestrator_unreachable"


def test_the_users_own_configuration_gives_the_local_fallback(tmp_path: Path) -> None:
    config = tmp_path / "home" / ".config" / "reactor-fabric"
    config.mkdir(parents=True)
    (config / "claude-mcp-suite.yaml").write_text(_suite_running(tmp_path / "ran"))
    (config / "claude-mcp-suite.yaml").chmod(0o644)
    settings = BridgeSettings("ws://127.0.0.1:9", "echo", [], config=None)
    command, origin = fallback_command(settings, home=config)
    assert command is not None
    assert command[0] == sys.executable
    assert origin == str(config / "claude-mcp-suite.yaml")


def test_the_own_configuration_is_found_through_the_password_database_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", "project")
    monkeypatch.setenv("XDG_CONFIG_HOME", "/elsewhere")
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert own_config_dir() == home / ".config" / "reactor-fabric"
    settings = BridgeSettings("ws://127.0.0.1:9", "echo", [], config=None)
    assert fallback_suite(settings) == home / ".config" / "reactor-fabric" / "claude-mcp-suite.yaml"


@pytest.mark.parametrize(
    ("home", "config_home"),
    [
        (".", ".config"),  # relative: resolved inside the project, the bridge's directory
        ("{project}", "{project}/.config"),  # absolute, into the project
        ("/nonexistent", "{project}/.config"),
    ],
)
def test_a_projects_client_configuration_cannot_move_the_users_own_suite_into_the_project(
    tmp_path: Path, home: str, config_home: str
) -> None:
    # The attack: the project's client configuration sets HOME or XDG_CONFIG_HOME so that
    # "your own" suite is the project's, a cloned file of the user's that passes the owner
    # and mode check; its local_command would run on the host.
    project = tmp_path / "project"
    planted = project / ".config" / "reactor-fabric"
    planted.mkdir(parents=True)
    marker = tmp_path / "ran"
    (planted / "claude-mcp-suite.yaml").write_text(_suite_running(marker))
    (planted / "claude-mcp-suite.yaml").chmod(0o644)
    env = {
        "HOME": home.format(project=project),
        "XDG_CONFIG_HOME": config_home.format(project=project),
    }
    done = _connect_unreachable(project, project, env=env)
    assert not marker.exists()
    assert done.returncode == 1
    assert "has no local fallback" in done.stderr
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert str(real_home / ".config" / "reactor-fabric" / "claude-mcp-suite.yaml") in done.stderr


def test_a_fallback_suite_others_may_write_is_not_trusted(tmp_path: Path) -> None:
    config = tmp_path / "config" / "reactor-fabric"
    config.mkdir(parents=True)
    (config / "claude-mcp-suite.yaml").write_text(_suite_running(tmp_path / "ran"))
    (config / "claude-mcp-suite.yaml").chmod(0o664)
    settings = BridgeSettings("ws://127.0.0.1:9", "echo", [], config=None)
    command, why = fallback_command(settings, home=config)
    assert command is None
    assert "writable by others" in why


class PingingAtTheClose(threading.Thread):
    """An orchestrator stand-in (one WebSocket, wsproto over a plain socket) whose keepalive
    ping crosses the bridge's close: it answers the registration, echoes messages back, and
    when the bridge's Close comes it sends a Ping before its own Close, as a ping sent just
    before the Close arrived would be."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pinged_while_closing = False

    def run(self) -> None:
        conn, _ = self.listener.accept()
        with conn, self.listener:
            conn.settimeout(30)
            ws = WSConnection(ConnectionType.SERVER)

            def send(event: Any) -> None:
                conn.sendall(ws.send(event))

            while True:
                data = conn.recv(65536)
                if not data:
                    return
                ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, Request):
                        send(AcceptConnection(subprotocol="mcp"))
                    elif isinstance(event, TextMessage):
                        message = json.loads(event.data)
                        if message.get("method") == "fabric/registerClient":
                            answer = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
                            send(TextMessage(json.dumps(answer)))
                        else:
                            send(TextMessage(event.data))
                    elif isinstance(event, CloseConnection):
                        # (by hand: wsproto, rightly, sends nothing but the Close now)
                        payload = b"reactor-fabric"
                        conn.sendall(bytes([0x89, len(payload)]) + payload)  # FIN, Ping
                        self.pinged_while_closing = True
                        time.sleep(0.3)  # the bridge reads the ping before the close
                        send(event.response())
                        return


def test_a_ping_crossing_the_bridges_close_ends_it_cleanly(tmp_path: Path) -> None:
    # (trio-websocket answers such a ping with a pong wsproto refuses to send while closing,
    # python-trio/trio-websocket#184: the bridge said "Event Pong(...) cannot be sent" and
    # exited 1 after a session that had ended normally.)
    server = PingingAtTheClose()
    server.start()
    request = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    with subprocess.Popen(
        [sys.executable, "-m", "reactor_fabric", "connect", f"ws://127.0.0.1:{server.port}/mcp"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    ) as bridge:
        assert bridge.stdin is not None
        assert bridge.stdout is not None
        assert bridge.stderr is not None
        bridge.stdin.write(json.dumps(request) + "\n")
        bridge.stdin.flush()
        served = json.loads(bridge.stdout.readline())  # the session itself was served
        bridge.stdin.close()  # the client is done: the bridge closes its WebSocket
        stderr = bridge.stderr.read()
        bridge.wait(timeout=60)
    server.join(timeout=30)
    assert served == request
    assert server.pinged_while_closing
    assert (bridge.returncode, stderr) == (0, "")
