"""What the clients that print only an error's message show their user, on the real engine.

The MCP Inspector CLI 2.x prints ``{"error": {"code", "message"}}`` and nothing of the error's
data; Claude Code's ``claude mcp list`` and ``claude mcp get`` print one line per server. The
reason must be on that line, in words (the message is "Title: what happened").

Claude Code (2.1.332) replaces the whole message of a failed connection by ``ProtocolError
dialing URL`` (the URL redacted) whenever the server's URL has a query string — so for
``?mount=`` or ``?token=`` no wording of ours can reach that line, only the code does. The
mounts and options may come as headers instead (``X-Reactor-Fabric-Mount``), which keeps the
URL plain and the reason on the line; and its stdio servers' errors are printed whole: the
stdio bridge (``--mount``) shows the reason too (docs/TROUBLESHOOTING.md, "What each client
prints").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.clients import envs
from tests.integration import harness
from tests.integration.harness import (
    REPO,
    Orchestrator,
    claude_mcp,
    containers_of,
    orchestrator_fixture,
    wait_until,
)

pytestmark = pytest.mark.integration


fabric = orchestrator_fixture(scope="module")


def inspector_command(url: str, *arguments: str) -> list[str]:
    return [
        *envs.inspector_cli(),
        url,
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {harness.TEST_TOKEN}",
        "--stored-auth-only",
        *arguments,
    ]


def inspector_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The error the Inspector CLI printed (its last JSON line on stderr), asserted to fail."""
    assert done.returncode != 0, (done.stdout, done.stderr)
    printed = [line for line in done.stderr.splitlines() if line.startswith("{")]
    assert printed, done.stderr
    error: dict[str, Any] = json.loads(printed[-1])["error"]
    return error


def run_inspector(url: str, home: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        inspector_command(url, *arguments),
        env={**os.environ, "HOME": str(home)},  # it keeps a store in HOME
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_inspector_cli_prints_which_mount_was_refused_and_why(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    done = run_inspector(
        f"{fabric.http_url}/mcp?mount=/etc:/workspace", tmp_path, "--method", "tools/list"
    )
    message = inspector_error(done)["message"]
    assert message.startswith("Security Violation: '/etc'"), message
    assert "is outside the allowed mount roots" in message, message


def test_the_inspector_cli_prints_that_the_container_exited_during_the_call(
    fabric: Orchestrator, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    call = subprocess.Popen(
        inspector_command(
            f"{fabric.http_url}/mcp?tools=all",
            "--method",
            "tools/call",
            "--tool-name",
            "everything__trigger-long-running-operation",
            "--tool-arg",
            "duration=120",
            "steps=120",
        ),
        env={**os.environ, "HOME": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def everything() -> list[Any]:
            return containers_of(docker_client, instance=fabric.instance, service="everything")

        wait_until(lambda: bool(everything()), what="the everything container")
        [container] = everything()

        # Its server is up and reading: from here the orchestrator is talking to it (its
        # handshake, then the call), and a death is "exited before answering" either way.
        session = container.labels["reactor-fabric.session"]

        def server_started() -> bool:
            return any(
                entry["event"] == "container_stderr" and "Starting" in entry.get("line", "")
                for entry in fabric.logs()
                if entry.get("session") == session
            )

        wait_until(server_started, what="the everything server's start-up line")
        container.kill()
        stdout, stderr = call.communicate(timeout=60)
    finally:
        if call.poll() is None:
            call.kill()
            call.communicate()
    message = inspector_error(
        subprocess.CompletedProcess(call.args, call.returncode, stdout, stderr)
    )["message"]
    assert message.startswith("Container Exited: the everything server exited"), message
    assert "137" in message, message
    assert "Container Start Failure" not in message, message


def claude_user(workdir: Path) -> tuple[Path, Path]:
    """A home with the orchestrator's token file (all the bridge needs) and a project."""
    home = workdir / "home"
    project = workdir / "project"
    project.mkdir(parents=True)
    token_file = home / ".config" / "reactor-fabric" / "token"
    token_file.parent.mkdir(parents=True, mode=0o700)
    token_file.write_text(f"{harness.TEST_TOKEN}\n")
    token_file.chmod(0o600)
    return home, project


def bridge(fabric: Orchestrator, target: str, *arguments: str) -> list[str]:
    """The stdio bridge as Claude Code starts it (HOME and PATH only: our code by PYTHONPATH)."""
    return [
        "env",
        f"PYTHONPATH={REPO}",
        sys.executable,
        "-m",
        "reactor_fabric",
        "connect",
        f"{fabric.ws_url}{target}",
        *arguments,
    ]


def listed_lines(listed: str) -> dict[str, str]:
    return {
        line.split(":", 1)[0]: line for line in listed.splitlines() if " - " in line and ":" in line
    }


def test_claude_code_shows_the_reason_of_a_refusal_on_its_mcp_list_and_get_lines(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    home, project = claude_user(tmp_path)
    header = f"Authorization: Bearer {harness.TEST_TOKEN}"
    servers = {
        "bridge-mount": ["--", *bridge(fabric, "/mcp/time", "--mount", "/etc:/workspace")],
        "fabric-bridge-mount": ["--", *bridge(fabric, "/mcp", "--mount", "/etc:/workspace")],
        "unknown": [
            "--transport",
            "http",
            f"{fabric.http_url}/mcp/no-such-service",
            "--header",
            header,
        ],
        "url-mount": [
            "--transport",
            "http",
            f"{fabric.http_url}/mcp?mount=/etc:/workspace",
            "--header",
            header,
        ],
        "header-mount": [
            "--transport",
            "http",
            f"{fabric.http_url}/mcp",
            "--header",
            header,
            "--header",
            "X-Reactor-Fabric-Mount: /etc:/workspace",
        ],
    }
    for name, arguments in servers.items():
        if arguments[0] == "--":
            claude_mcp(home, project, "add", name, *arguments)
        else:
            claude_mcp(home, project, "add", *arguments[:2], name, *arguments[2:])
    lines = listed_lines(claude_mcp(home, project, "list", timeout=300))
    for name in ("bridge-mount", "fabric-bridge-mount", "header-mount"):
        line = lines[name]
        assert "✘ Failed to connect — -32004: Security Violation: '/etc'" in line, line
        assert "is outside the allowed mount roots" in line, line
    # Claude Code redacts the parts of the server's URL from the line (the service's name too).
    assert "-32005: Service Not Found: no service named" in lines["unknown"], lines["unknown"]
    # A URL with a query: Claude Code keeps only the code (see the module's docstring).
    assert "✘ Failed to connect — -32004" in lines["url-mount"], lines["url-mount"]
    got = claude_mcp(home, project, "get", "bridge-mount", timeout=300)
    assert "Issue: -32004: Security Violation: '/etc'" in got, got
