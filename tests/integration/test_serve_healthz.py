"""The orchestrator process, started as a user starts it, serves /healthz and stops cleanly."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from reactor_fabric._scheduling import SHORT_SLICE_NS, thread_slice
from tests.integration.harness import REPO, Orchestrator, orchestrator


def healthz(running: Orchestrator) -> urllib.request.Request:
    return urllib.request.Request(f"{running.http_url}/healthz", headers=running.auth_header)


def test_the_orchestrator_on_port_0_prints_its_url_serves_healthz_and_exits_0_on_sigterm(
    tmp_path: Path,
) -> None:
    # The harness starts `python -m reactor_fabric --config … --port 0`, reads the URL from the
    # first stdout line and, on leaving, sends SIGTERM and requires exit code 0.
    with orchestrator(REPO / "claude-mcp-suite.yaml", tmp_path / "o.log") as running:
        assert not running.http_url.endswith(":0")
        with urllib.request.urlopen(healthz(running), timeout=30) as response:
            assert response.status == 200
            body = json.loads(response.read())
        assert body["status"] == "ok"
        assert body["docker"] == "ok"
        # The bundled suite's warm pool starts containers at once: their stdio is a socket of
        # their own (a fallback to the engine's attach would show here, and in the log).
        deadline = time.monotonic() + 60
        while "stdio" not in body and time.monotonic() < deadline:
            time.sleep(0.2)  # a real process: polled, bounded
            with urllib.request.urlopen(healthz(running), timeout=30) as response:
                body = json.loads(response.read())
        assert body.get("stdio") == "socket", running.logs()
        # Every thread of the orchestrator (the event loop's and the workers trio made since)
        # has the short CPU slice, on a kernel that has slices of a thread's choosing (one
        # that reports a slice for this thread).
        if thread_slice() is not None:
            threads = list(Path(f"/proc/{running.process.pid}/task").iterdir())
            assert len(threads) > 1
            assert {thread_slice(int(t.name)) for t in threads} == {SHORT_SLICE_NS}
        # Without the token: up or not, nothing more.
        with urllib.request.urlopen(f"{running.http_url}/healthz", timeout=30) as response:
            assert json.loads(response.read()) == {"status": "ok"}
    events = [entry["event"] for entry in running.logs()]
    assert "serving" in events
    assert "shutting_down" in events
    if thread_slice() is not None:
        assert "cpu_slice_shortened" in events


def test_healthz_is_503_when_the_docker_engine_is_unreachable(tmp_path: Path) -> None:
    dead = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    with orchestrator(REPO / "claude-mcp-suite.yaml", tmp_path / "o.log", env=dead) as running:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(healthz(running), timeout=30)
        assert caught.value.code == 503
        body = json.loads(caught.value.read())
        caught.value.close()
        assert body["docker"] == "unavailable"
        assert "cannot reach" in body["docker_error"]
