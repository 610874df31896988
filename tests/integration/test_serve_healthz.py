"""The orchestrator process, started as a user starts it, serves /healthz and stops cleanly."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_orchestrator_on_port_0_prints_its_url_serves_healthz_and_exits_0_on_sigterm() -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reactor_fabric",
            "--config",
            str(REPO / "claude-mcp-suite.yaml"),
            "--port",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first_line = process.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:(\d+))", first_line)
        assert match, first_line
        assert match.group(2) != "0"
        with urllib.request.urlopen(f"{match.group(1)}/healthz", timeout=30) as response:
            assert response.status == 200
            body = json.loads(response.read())
        assert body["status"] == "ok"
        assert body["docker"] == "ok"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()
        stderr = process.stderr.read() if process.stderr else ""
        if process.stderr:
            process.stderr.close()
    logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert "serving" in [entry["event"] for entry in logged]
    assert "shutting_down" in [entry["event"] for entry in logged]


def test_healthz_is_503_when_the_docker_engine_is_unreachable(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reactor_fabric",
            "--config",
            str(REPO / "claude-mcp-suite.yaml"),
            "--port",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"},
    )
    try:
        assert process.stdout is not None
        url = re.search(r"on (http://[^ ]+) ", process.stdout.readline())
        assert url
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{url.group(1)}/healthz", timeout=30)
        assert caught.value.code == 503
        body = json.loads(caught.value.read())
        caught.value.close()
        assert body["docker"] == "unavailable"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        if process.stdout:
            process.stdout.close()
