"""Several orchestrators of one user side by side: each instance's default audit trail is its
own, keyed by its port, and the operators' ``audit`` command finds one, or every one."""

from __future__ import annotations

from pathlib import Path

import pytest

from reactor_fabric import _operator_cli as operator_cli
from reactor_fabric._cli import main
from reactor_fabric.config.structs import Suite
from reactor_fabric.config.suite import check_suite_text
from reactor_fabric.observe.audit import AuditInUse, AuditWriter

SUITE = """\
version: "1.0"
mcp_services:
  time: {image: "mcp/time"}
orchestrator:
  allowed_mount_roots: ["/tmp"]
"""


def suite(orchestrator: str = "") -> Suite:
    checked = check_suite_text(SUITE + orchestrator, source="suite.yaml")
    assert checked.suite is not None, checked.issues
    return checked.suite


def state(tmp_path: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(tmp_path)}


def trail(path: Path, *events: str) -> None:
    writer = AuditWriter(path, max_bytes=1 << 20, keep=1)
    writer.open()
    try:
        for event in events:
            assert writer.submit({"ts": "2026-11-26T23:00:00.000Z", "event": event})
    finally:
        writer.close()


def test_two_orchestrators_on_two_ports_with_default_settings_each_write_a_trail_of_their_own(
    tmp_path: Path,
) -> None:
    environ = state(tmp_path)
    first = operator_cli.open_audit(suite(), environ, 8765)
    # Refused (another orchestrator writes the trail) when every instance shared one.
    second = operator_cli.open_audit(suite(), environ, 9000)
    assert first is not None
    assert second is not None
    try:
        assert first.path != second.path
        assert first.path.parent == second.path.parent == tmp_path / "state" / "reactor-fabric"
    finally:
        first.close()
        second.close()


def test_the_default_ports_trail_keeps_its_old_name_and_another_ports_is_named_by_it(
    tmp_path: Path,
) -> None:
    environ = state(tmp_path)
    directory = tmp_path / "state" / "reactor-fabric"
    assert operator_cli.audit_path(None, environ) == directory / "audit.jsonl"
    assert operator_cli.audit_path(None, environ, 8765) == directory / "audit.jsonl"
    assert operator_cli.audit_path(None, environ, 9000) == directory / "audit-9000.jsonl"


def test_an_explicit_audit_path_wins_and_two_orchestrators_given_the_same_one_are_refused(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared.jsonl"
    configured = suite(f"  audit: {{path: {str(shared)!r}}}\n")
    environ = state(tmp_path)
    assert operator_cli.audit_path(configured, environ, 9000) == shared
    first = operator_cli.open_audit(configured, environ, 8765)
    assert first is not None
    try:
        with pytest.raises(AuditInUse, match="another orchestrator writes the audit trail"):
            operator_cli.open_audit(configured, environ, 9000)
    finally:
        first.close()


def test_audit_verify_reads_the_default_ports_trail_unless_given_a_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = state(tmp_path)
    directory = tmp_path / "state" / "reactor-fabric"
    trail(directory / "audit.jsonl", "a")
    trail(directory / "audit-9000.jsonl", "b", "c")
    assert main(["audit", "verify"], environ=environ) == 0
    assert "ok: 1 records" in capsys.readouterr().out
    assert main(["audit", "verify", "--port", "9000"], environ=environ) == 0
    assert f"ok: 2 records, chain intact ({directory / 'audit-9000.jsonl'})" in (
        capsys.readouterr().out
    )


def test_audit_reads_the_trail_of_the_port_the_serve_command_would_listen_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = state(tmp_path)
    directory = tmp_path / "state" / "reactor-fabric"
    trail(directory / "audit.jsonl", "on_8765")
    trail(directory / "audit-9000.jsonl", "on_9000")
    assert main(["--port", "9000", "audit", "--json"], environ=environ) == 0
    assert '"on_9000"' in capsys.readouterr().out
    assert main(["audit", "--json"], environ={**environ, "REACTOR_FABRIC_PORT": "9000"}) == 0
    assert '"on_9000"' in capsys.readouterr().out
    assert main(["audit", "--json"], environ=environ) == 0
    assert '"on_8765"' in capsys.readouterr().out


def test_audit_for_port_0_says_to_give_the_port_the_orchestrator_got(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "--port", "0"], environ=state(tmp_path)) == 1
    assert "give the port the orchestrator listens on" in capsys.readouterr().err


def test_audit_verify_all_checks_every_instances_trail_and_fails_when_one_is_broken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = state(tmp_path)
    directory = tmp_path / "state" / "reactor-fabric"
    trail(directory / "audit.jsonl", "a")
    trail(directory / "audit-9000.jsonl", "b", "c")
    assert main(["audit", "verify", "--all"], environ=environ) == 0
    out = capsys.readouterr().out
    assert "port 8765:" in out
    assert "port 9000:" in out
    assert out.count("chain intact") == 2
    broken = directory / "audit-9000.jsonl"
    lines = broken.read_bytes().splitlines(keepends=True)
    broken.write_bytes(lines[1])  # the first line removed
    assert main(["audit", "verify", "--all"], environ=environ) == 1
    assert "FAILED" in capsys.readouterr().out


def test_audit_list_names_every_instances_trail_by_port_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = state(tmp_path)
    directory = tmp_path / "state" / "reactor-fabric"
    trail(directory / "audit.jsonl", "a")
    trail(directory / "audit-9000.jsonl", "b")
    trail(directory / "audit-41234.jsonl", "c")
    (directory / "audit-70000.jsonl").write_text("")  # no port's
    (directory / "notes.jsonl").write_text("")
    assert [port for port, _path in operator_cli.found_trails(directory)] == [8765, 9000, 41234]
    assert main(["audit", "list"], environ=environ) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in out] == [
        ["port", "8765", str(directory / "audit.jsonl")],
        ["port", "9000", str(directory / "audit-9000.jsonl")],
        ["port", "41234", str(directory / "audit-41234.jsonl")],
    ]


def test_audit_list_says_when_there_is_no_trail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "list"], environ=state(tmp_path)) == 2
    assert "no audit trail in" in capsys.readouterr().err
