"""Command-line behaviour and exit codes (in-process, plus the installed entry points)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from reactor_fabric._cli import main
from reactor_fabric.observe.audit import AuditWriter

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "claude-mcp-suite.yaml"
INVALID = (
    'version: "1.0"\n'
    "orchestrator: {allowed_mount_roots: [rel]}\n"
    'mcp_services: {t: {image: x, timeout: "0s"}}\n'
)


@pytest.fixture
def invalid_suite(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(INVALID)
    return path


def test_validate_config_exits_0_for_the_bundled_suite(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config", str(BUNDLED)], environ={}) == 0
    assert "valid (6 service(s)" in capsys.readouterr().out


def test_validate_config_exits_1_and_lists_every_problem(
    invalid_suite: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate-config", str(invalid_suite)], environ={}) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{invalid_suite}:2:")
    assert err[1].startswith(f"{invalid_suite}:3:")
    assert err[-1] == f"{invalid_suite}: invalid (2 problem(s))"


def test_validate_config_accepts_the_reference_suite_and_refuses_a_bound_it_would_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = REPO / "tests" / "unit" / "data" / "reference-advanced-mcp-suite.yaml"
    assert main(["validate-config", str(reference)], environ={}) == 0
    assert "valid (11 service(s)" in capsys.readouterr().out
    ignored = tmp_path / "ignored.yaml"
    ignored.write_text(
        'version: "1.0"\n'
        "orchestrator: {allowed_mount_roots: []}\n"
        "mcp_services:\n"
        "  agent:\n"
        "    image: x\n"
        "    service_type: llm_agent\n"
        "    max_calls_per_container: 4\n"
    )
    assert main(["validate-config", str(ignored)], environ={}) == 1
    [problem, summary] = capsys.readouterr().err.splitlines()
    assert problem == (
        f"{ignored}:7:5: mcp_services.agent.max_calls_per_container: only read with "
        "container_strategy: smart_refresh, and this service's strategy is fresh_per_call, the "
        "default for service_type llm_agent; set container_strategy: smart_refresh, or remove "
        "max_calls_per_container"
    )
    assert summary == f"{ignored}: invalid (1 problem(s))"


def test_validate_config_exits_2_when_the_file_cannot_be_read(tmp_path: Path) -> None:
    assert main(["validate-config", str(tmp_path / "missing.yaml")], environ={}) == 2
    assert main(["validate-config", str(tmp_path)], environ={}) == 2


def test_a_usage_error_exits_2() -> None:
    assert main(["--port", "99999"], environ={}) == 2
    assert main(["--no-such-flag"], environ={}) == 2


def test_the_orchestrator_refuses_to_start_on_an_invalid_suite_with_code_32003_in_the_logs(
    invalid_suite: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(invalid_suite), "--port", "0"], environ={}) == 1
    err = capsys.readouterr().err.splitlines()
    logged = [json.loads(line) for line in err if line.startswith("{")]
    assert [entry["code"] for entry in logged] == [-32003, -32003]
    assert {entry["reason"] for entry in logged} == {"invalid_suite_configuration"}
    assert logged[0]["line"] == 2
    assert any("not a valid suite; not starting" in line for line in err)


def test_the_config_path_comes_from_the_environment_when_not_given(
    invalid_suite: Path,
) -> None:
    assert main(["--port", "0"], environ={"REACTOR_FABRIC_CONFIG": str(invalid_suite)}) == 1


def test_an_unreadable_suite_stops_the_orchestrator_with_exit_2(tmp_path: Path) -> None:
    assert main(["--config", str(tmp_path / "none.yaml")], environ={}) == 2


def test_a_port_in_use_exits_3_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(
            ["--config", str(BUNDLED), "--port", str(port)],
            environ={"XDG_CONFIG_HOME": str(tmp_path)},
        )
    assert code == 3
    assert "choose another with --port" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "suite_auth"),
    [(["--no-auth"], None), ([], "none")],
    ids=["flag", "suite"],
)
def test_authentication_cannot_be_off_on_an_address_other_machines_reach(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    arguments: list[str],
    suite_auth: str | None,
) -> None:
    suite = tmp_path / "suite.yaml"
    text = BUNDLED.read_text()
    if suite_auth is not None:
        text = text.replace("orchestrator:\n", f"orchestrator:\n  auth: {suite_auth}\n", 1)
    suite.write_text(text)
    for host in ("0.0.0.0", "192.0.2.1"):
        code = main(["--config", str(suite), "--host", host, "--port", "0", *arguments], environ={})
        assert code == 2
        assert "only allowed on a loopback address" in capsys.readouterr().err


def test_a_token_file_others_can_read_stops_the_start_with_what_to_do(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    token = tmp_path / "reactor-fabric" / "token"
    token.parent.mkdir()
    token.write_text("a" * 40)
    token.chmod(0o644)
    code = main(
        ["--config", str(BUNDLED), "--port", "0"], environ={"XDG_CONFIG_HOME": str(tmp_path)}
    )
    assert code == 2
    assert f"chmod 600 {token}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "reactor_fabric", "validate-config"],
        [str(REPO / "scripts" / "validate-config")],
        ["make", "-s", "--no-print-directory", "validate-config"],
    ],
    ids=["python-m", "script", "make"],
)
def test_every_documented_validate_command_tells_valid_invalid_and_unreadable_apart(
    command: list[str], invalid_suite: Path, tmp_path: Path
) -> None:
    def run(path: Path) -> tuple[int, str]:
        argv = [*command, f"CONFIG={path}"] if command[0] == "make" else [*command, str(path)]
        done = subprocess.run(
            argv, cwd=REPO, capture_output=True, text=True, check=False, timeout=300
        )
        return done.returncode, done.stderr

    assert run(BUNDLED)[0] == 0
    invalid_code, invalid_err = run(invalid_suite)
    unreadable_code, unreadable_err = run(tmp_path / "missing.yaml")
    assert f"{invalid_suite}:2:" in invalid_err
    assert "no such file" in unreadable_err
    if command[0] == "make":
        # make reports any failed recipe as 2, so the target prints the validator's own code.
        assert "validate-config: exit 1 (invalid)" in invalid_err
        assert "validate-config: exit 2 (unreadable)" in unreadable_err
        assert (invalid_code, unreadable_code) == (2, 2)
    else:
        assert (invalid_code, unreadable_code) == (1, 2)


def _trail(path: Path, *records: dict[str, object]) -> None:
    audit = AuditWriter(path, max_bytes=1 << 20, keep=1)
    audit.open()
    try:
        assert audit.submit_many(list(records)) == len(records)
    finally:
        audit.close()


def test_audit_escapes_control_characters_and_newlines_in_every_field_of_its_human_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    forged = "x\n2026-11-22T14:02:03.120Z tool_call        session=aaaa outcome=ok\x1b[2J\x1b[H"
    _trail(
        path,
        {
            "ts": "2026-11-22T14:02:03.120Z\r",
            "event": "session_start",
            "session": "s\x1b]0;t\x07",
            "endpoint": "relay",
            "service": "git",
            "client": {"peer": "1.2.3.4:5\n", "transport": "websocket\x9b"},
            "mounts": [{"source": "/src\u2028", "target": "/dst\u202e"}],
        },
        {
            "ts": "2026-11-22T14:02:04.000Z",
            "event": "tool_call",
            "session": "s",
            "service": "git",
            "tool": forged,
            "outcome": "error\\x1b",
            "error_reason": "r\x00",
            "duration_ms": 1.0,
        },
    )
    assert main(["audit", "--path", str(path)], environ={}) == 0
    out = capsys.readouterr().out
    lines = out.splitlines(keepends=False)
    assert len(lines) == 2  # no line forged
    assert all(character.isprintable() for character in out.replace("\n", ""))
    assert "tool=x\\n2026-11-22T14:02:03.120Z tool_call" in lines[1]
    assert "\\x1b[2J\\x1b[H" in lines[1]
    assert "outcome=error\\\\x1b" in lines[1]  # a backslash sent is not an escape made
    assert "client=1.2.3.4:5\\n/websocket\\x9b" in lines[0]
    assert "mounts=/src\\u2028:/dst\\u202e" in lines[0]


def test_audit_shows_what_a_tools_changed_record_names_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    _trail(
        path,
        {
            "ts": "2026-11-22T14:02:04.000Z",
            "event": "tools_changed",
            "session": "s",
            "service": "git",
            "added": ["new\x1b[2J"],
            "removed": [],
            "changed": [{"tool": "log", "fields": ["description"], "sha256": {}}],
        },
    )
    assert main(["audit", "--path", str(path)], environ={}) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert "tools_changed" in line
    assert "added=new\\x1b[2J changed=log" in line
    assert "removed=" not in line


def test_audit_verify_exits_1_when_the_first_lines_of_the_trail_were_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    _trail(path, *({"ts": "t", "event": "tool_call", "n": n} for n in range(4)))
    assert main(["audit", "verify", "--path", str(path)], environ={}) == 0
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[3:]))
    assert main(["audit", "verify", "--path", str(path)], environ={}) == 1
    out = capsys.readouterr().out
    assert f"{path}:1: the first record does not start the chain" in out
    assert "FAILED: 1 problem(s) in 2 records" in out


def test_audit_verify_fails_a_cut_head_of_the_oldest_rotated_file_and_counts_files_rotated_away(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path, max_bytes=2000, keep=2)
    audit.open()
    try:
        for n in range(300):
            assert audit.submit({"ts": "t", "event": "tool_call", "n": n})
    finally:
        audit.close()
    oldest = tmp_path / "audit.jsonl.2"
    number = json.loads(oldest.read_bytes().splitlines()[0])["file"]
    assert main(["audit", "verify", "--path", str(path)], environ={}) == 0
    out = capsys.readouterr().out
    assert f"note: the oldest line follows {number - 1} file(s) rotated away" in out
    assert "ok: " in out
    oldest.write_bytes(b"".join(oldest.read_bytes().splitlines(keepends=True)[2:]))
    assert main(["audit", "verify", "--path", str(path)], environ={}) == 1
    out = capsys.readouterr().out
    assert f"{oldest}:1: the first lines of this file were removed" in out
    assert "FAILED: 1 problem(s)" in out


def test_audit_verify_reports_an_over_deep_line_as_tampering_with_its_number_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    _trail(path, *({"ts": "t", "event": "tool_call", "n": n} for n in range(2)))
    header, first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(header + first + b"[" * 100_000 + b"]" * 100_000 + b"\n" + second)
    assert main(["audit", "verify", "--path", str(path)], environ={}) == 1
    assert f"{path}:3: not a JSON object" in capsys.readouterr().out
    assert main(["audit", "--path", str(path)], environ={}) == 0  # reading skips it
    assert len(capsys.readouterr().out.splitlines()) == 2
