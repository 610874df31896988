"""Several orchestrators of one user side by side with no configuration (issue 39 item 5): two
on two ports of one machine, sharing the user's state directory, each serve and write a trail
of their own, which ``audit verify`` finds by port, or all at once."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

from reactor_fabric.observe.audit import read_records
from tests.integration.harness import (
    REPO,
    Orchestrator,
    orchestrator,
    python2_client,
    time_call_through_fabric,
    write_suite,
)


def port_of(running: Orchestrator) -> int:
    port = urllib.parse.urlsplit(running.http_url).port
    assert port is not None
    return port


def audit_cli(state: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reactor_fabric", "audit", *arguments],
        env={**os.environ, "XDG_STATE_HOME": str(state)},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_two_orchestrators_with_default_settings_and_one_state_home_serve_at_once_each_with_its_own_trail(  # noqa: E501
    tmp_path: Path, project_root: Path
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    state = tmp_path / "state"
    state.mkdir()
    # One state directory for both, as two instances of one user have (the harness otherwise
    # gives each orchestrator its own): their default trails are in the same place.
    shared = {"XDG_STATE_HOME": str(state)}
    with (
        orchestrator(suite, tmp_path / "first.log", env=shared) as first,
        orchestrator(suite, tmp_path / "second.log", env=shared) as second,
    ):
        # Both serving at once: a tool called through each one's fabric endpoint.
        served = [
            (running, time_call_through_fabric(python2_client(f"{running.http_url}/mcp", "legacy")))
            for running in (first, second)
        ]
    assert first.audit_path != second.audit_path
    assert first.audit_path.parent == second.audit_path.parent == state / "reactor-fabric"
    sessions = {session for _running, session in served}
    for running, session in served:
        records = list(read_records(running.audit_path))
        [start] = [r for r in records if r["event"] == "orchestrator_start"]
        assert start["listen"].endswith(f":{port_of(running)}")
        calls = [r for r in records if r["event"] == "tool_call" and r["service"] == "time"]
        assert [(r["session"], r["tool"], r["outcome"]) for r in calls] == [
            (session, "get_current_time", "ok")
        ]
        assert {r.get("session") for r in records} & sessions == {session}  # not the other's
        verified = audit_cli(state, "verify", "--port", str(port_of(running)))
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert f"chain intact ({running.audit_path})" in verified.stdout
    every = audit_cli(state, "verify", "--all")
    assert every.returncode == 0, every.stdout + every.stderr
    assert every.stdout.count("chain intact") == 2
    for running, _session in served:
        assert f"port {port_of(running)}:" in every.stdout
