"""The agent image's MCP server (images/agent-claude-code/agent_server.py) with a stand-in for the
``claude`` command (a script printing stream-json, then ending, failing or hanging), driven by
the official Python SDK's client in-process: no Docker, no model."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

IMAGE = Path(__file__).resolve().parents[2] / "images" / "agent-claude-code"
sys.path.insert(0, str(IMAGE))
import agent_server  # type: ignore[import-not-found]  # noqa: E402

HANG = "hang"


def fake_claude(bin_dir: Path, events: list[dict[str, Any]], then: str | int) -> Path:
    """A ``claude`` on ``bin_dir`` printing ``events`` as stream-json, then exiting with ``then``
    (a number) or hanging (``HANG``); its argv goes to ``bin_dir/argv``, what it read on its
    stdin (to its end) to ``bin_dir/stdin``, its pid to ``bin_dir/pid`` (before it prints
    anything)."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "claude"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""
            import json, os, sys, time
            open({str(bin_dir / "argv")!r}, "w").write(json.dumps(sys.argv[1:]))
            open({str(bin_dir / "stdin")!r}, "wb").write(sys.stdin.buffer.read())
            open({str(bin_dir / "pid")!r}, "w").write(str(os.getpid()))
            for event in {events!r}:
                print(json.dumps(event), flush=True)
            if {then!r} == {HANG!r}:
                time.sleep(600)
            print("the fake's last words", file=sys.stderr)
            sys.exit({then if isinstance(then, int) else 0})
            """
        )
    )
    script.chmod(0o755)
    return bin_dir


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "project"
    where.mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(agent_server, "KILL_GRACE", 2.0)
    return where


def configure(monkeypatch: pytest.MonkeyPatch, workspace: Path, **config: Any) -> None:
    monkeypatch.setenv(
        "REACTOR_FABRIC_SERVICE_CONFIG", json.dumps({"workspace": str(workspace), **config})
    )


ASSISTANT_READ = {
    "type": "assistant",
    "message": {"content": [{"type": "tool_use", "name": "Read", "input": {"file_path": "a.py"}}]},
}
RESULT = {
    "type": "result",
    "subtype": "success",
    "is_error": False,
    "result": "the answer",
    "num_turns": 2,
    "total_cost_usd": 0.5,
}


async def call(arguments: dict[str, Any], steps: list[str] | None = None) -> Any:
    async def heard(progress: float, total: float | None, message: str | None) -> None:
        if steps is not None:
            steps.append(str(message))

    async with Client(agent_server.server) as client:
        return await client.call_tool("run_task", arguments, progress_callback=heard)


async def test_a_task_answers_the_final_text_with_the_structured_content_and_its_steps(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_claude(tmp_path / "bin", [ASSISTANT_READ, RESULT], 0)
    configure(monkeypatch, workspace, specialty="Be brief.")
    progress: list[str] = []
    answer = await call({"task": "look"}, progress)
    assert not answer.is_error, answer
    assert answer.content[0].text == "the answer"
    assert answer.structured_content["tools_used"] == ["Read"]
    assert answer.structured_content["cost_usd"] == 0.5
    assert progress == ["Read a.py"]
    argv = json.loads((tmp_path / "bin" / "argv").read_text())
    assert argv[0] == "-p"
    assert "look" not in argv  # the task is on the CLI's stdin
    assert (tmp_path / "bin" / "stdin").read_text() == "look"
    assert "--append-system-prompt=Be brief." in argv


# Tasks that Claude Code would read as its options on its command line (issue 48, item 3):
# its version; settings whose hook runs a command before any model call; MCP servers; every
# permission; a directory beyond the workspace; debug output.
HOSTILE_TASKS = [
    "--version",
    '--settings={"hooks":{"SessionStart":[{"hooks":[{"type":"command","command":"touch /x"}]}]}}',
    '--mcp-config={"mcpServers":{"x":{"command":"sh","args":["-c","touch /x"]}}}',
    "--dangerously-skip-permissions",
    "--add-dir=/",
    "-d",
]


@pytest.mark.parametrize("danger", [False, True])
async def test_a_task_that_looks_like_an_option_reaches_the_cli_as_text_on_its_stdin(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, danger: bool
) -> None:
    configure(monkeypatch, workspace, danger_mode=danger)
    bin_dir = fake_claude(tmp_path / "bin", [RESULT], 0)
    answer = await call({"task": "plain words"})
    assert not answer.is_error, answer
    plain_argv = json.loads((bin_dir / "argv").read_text())
    for task in HOSTILE_TASKS:
        answer = await call({"task": task})
        assert not answer.is_error, answer
        # The command line is the one of any task: the task is nowhere on it.
        assert json.loads((bin_dir / "argv").read_text()) == plain_argv, task
        assert (bin_dir / "stdin").read_text() == task


async def test_a_cli_that_crashes_answers_is_error_with_its_exit_and_last_words(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_claude(tmp_path / "bin", [ASSISTANT_READ], 3)
    configure(monkeypatch, workspace)
    answer = await call({"task": "look"})
    assert answer.is_error
    assert answer.content[0].text == "crashed: the agent exited with 3 (the fake's last words)"


async def test_a_task_past_its_wall_time_is_stopped_and_answers_is_error(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = fake_claude(tmp_path / "bin", [ASSISTANT_READ], HANG)
    configure(monkeypatch, workspace, timeout=1)
    answer = await call({"task": "look"})
    assert answer.is_error
    assert answer.content[0].text == "timeout: the task ran past its 1 s"
    assert answer.structured_content["stop_reason"] == "timeout"
    assert not process_alive(int((bin_dir / "pid").read_text()))


async def test_a_task_past_its_turns_is_stopped_though_a_gateway_gives_every_turn_one_id(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CLI that goes on past its --max-turns, against a gateway answering every request under
    # one message id (issue 48, item 14: 92-107 turns ran against max_turns 3).
    read = [{"type": "tool_use", "name": "Read", "input": {"file_path": "a.py"}}]
    started = {"type": "message_start", "message": {"id": "msg_gw", "content": []}}
    turn: list[dict[str, Any]] = [
        {"type": "stream_event", "event": started, "parent_tool_use_id": None},
        {"type": "assistant", "message": {"id": "msg_gw", "content": read}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "content": "x"}]}},
    ]
    bin_dir = fake_claude(tmp_path / "bin", turn * 3, HANG)
    # (the wall time: what would stop it if the turns were not counted)
    configure(monkeypatch, workspace, max_turns=5, timeout=20)
    answer = await call({"task": "look", "max_turns": 2})
    assert answer.is_error
    assert answer.content[0].text == "max_turns: the agent reached its 2 turns"
    assert answer.structured_content["turns"] == 3
    assert "--max-turns=2" in json.loads((bin_dir / "argv").read_text())
    assert not process_alive(int((bin_dir / "pid").read_text()))


async def test_a_cancelled_call_stops_the_cli(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = fake_claude(tmp_path / "bin", [ASSISTANT_READ], HANG)
    configure(monkeypatch, workspace)
    stepped = trio.Event()

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        stepped.set()

    async with Client(agent_server.server) as client, trio.open_nursery() as nursery:

        async def calling() -> None:
            await client.call_tool("run_task", {"task": "look"}, progress_callback=heard)

        nursery.start_soon(calling)
        await stepped.wait()
        pid = int((bin_dir / "pid").read_text())
        assert process_alive(pid)
        nursery.cancel_scope.cancel()
    # The server stops it with SIGTERM, SIGKILL after 2 s: its pidfd is readable once it ended.
    with contextlib.suppress(ProcessLookupError):  # (gone already)
        pidfd = os.pidfd_open(pid)
        try:
            with trio.fail_after(30):
                await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
    assert not process_alive(pid)


async def test_a_bad_config_answers_is_error_without_running_anything(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = fake_claude(tmp_path / "bin", [RESULT], 0)
    configure(monkeypatch, workspace, danger_mode="sure")
    answer = await call({"task": "look"})
    assert answer.is_error
    assert answer.content[0].text.startswith("config_invalid: ")
    assert not (bin_dir / "argv").exists()


def process_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, reaped by nobody here, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def recording_claude(bin_dir: Path) -> Path:
    """A ``claude`` on ``bin_dir`` recording its argv, its environment and the MCP config file it
    is given (content and mode, while it runs) into ``bin_dir/seen``, then answering a result."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "claude"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""
            import json, os, sys
            argv = sys.argv[1:]
            seen = {{"argv": argv, "env": dict(os.environ)}}
            [path] = [a.split("=", 1)[1] for a in argv if a.startswith("--mcp-config=")] or [None]
            if path is not None:
                seen["config_path"] = path
                seen["config"] = json.load(open(path))
                seen["config_mode"] = os.stat(path).st_mode & 0o777
                seen["dir_mode"] = os.stat(os.path.dirname(path)).st_mode & 0o777
            open({str(bin_dir / "seen")!r}, "w").write(json.dumps(seen))
            print(json.dumps({RESULT!r}), flush=True)
            """
        )
    )
    script.chmod(0o755)
    return bin_dir


async def test_with_a_fabric_socket_the_cli_gets_the_relay_as_its_one_mcp_server_and_no_token(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = recording_claude(tmp_path / "bin")
    configure(monkeypatch, workspace)
    fabric = tmp_path / "fabric.sock"
    fabric.touch()  # exists: the relay, not the adapter, connects to it
    monkeypatch.setenv("REACTOR_FABRIC_FABRIC_SOCKET", str(fabric))
    monkeypatch.setenv("REACTOR_FABRIC_FABRIC_TOKEN", "child-token-1")
    answer = await call({"task": "look"})
    assert not answer.is_error, answer
    seen = json.loads((bin_dir / "seen").read_text())
    argv = seen["argv"]
    assert f"--mcp-config={seen['config_path']}" in argv
    assert "--strict-mcp-config" in argv
    assert "--allowedTools=mcp__fabric" in argv
    server = seen["config"]["mcpServers"]["fabric"]
    assert list(seen["config"]["mcpServers"]) == ["fabric"]
    assert server["command"] == sys.executable
    assert server["args"] == [str(IMAGE / "fabric_relay.py")]
    assert server["env"] == {
        "REACTOR_FABRIC_FABRIC_SOCKET": str(fabric),
        "REACTOR_FABRIC_FABRIC_TOKEN": "child-token-1",
    }
    # The token is in a file only the run's user reads, in the run's own home; never in the
    # CLI's environment or argv (the relay alone gets it, through the config's env).
    assert (seen["config_mode"], seen["dir_mode"]) == (0o600, 0o700)
    assert "child-token-1" not in json.dumps(seen["env"])
    assert "child-token-1" not in json.dumps(argv)
    assert "REACTOR_FABRIC_FABRIC_SOCKET" not in seen["env"]
    assert seen["env"]["ENABLE_TOOL_SEARCH"] == "false"
    # The home, the config with it, is gone after the run.
    assert not await trio.Path(seen["config_path"]).exists()


async def test_without_a_fabric_socket_the_cli_has_no_mcp_server(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = recording_claude(tmp_path / "bin")
    configure(monkeypatch, workspace)
    monkeypatch.setenv("REACTOR_FABRIC_FABRIC_SOCKET", str(tmp_path / "absent.sock"))
    monkeypatch.setenv("REACTOR_FABRIC_FABRIC_TOKEN", "child-token-1")
    answer = await call({"task": "look"})
    assert not answer.is_error, answer
    seen = json.loads((bin_dir / "seen").read_text())
    assert not any(a.startswith(("--mcp-config", "--allowedTools")) for a in seen["argv"])
    assert "ENABLE_TOOL_SEARCH" not in seen["env"]
    assert "child-token-1" not in json.dumps(seen["env"])


async def test_an_accounts_claude_credentials_file_is_the_runs_own_login_and_goes_with_it(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "CLAUDE_CREDENTIALS").write_text('{"claudeAiOauth": {"accessToken": "at-1"}}')
    monkeypatch.setattr(agent_server, "SECRETS_DIR", str(secrets))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "claude"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""
            import json, os
            path = os.path.join(os.environ["CLAUDE_CONFIG_DIR"], ".credentials.json")
            mode = os.stat(path).st_mode & 0o777
            seen = {{"path": path, "text": open(path).read(), "mode": mode}}
            open({str(bin_dir / "seen")!r}, "w").write(json.dumps(seen))
            print(json.dumps({RESULT!r}), flush=True)
            """
        )
    )
    script.chmod(0o755)
    configure(monkeypatch, workspace)
    answer = await call({"task": "look"})
    assert not answer.is_error, answer
    seen = json.loads((bin_dir / "seen").read_text())
    assert seen["text"] == '{"claudeAiOauth": {"accessToken": "at-1"}}'
    assert seen["mode"] == 0o600
    assert not await trio.Path(seen["path"]).exists()  # the run's home is gone


def test_without_a_credentials_secret_nothing_is_installed(tmp_path: Path) -> None:
    assert not agent_server.install_credentials(str(tmp_path), secrets_dir=str(tmp_path / "no"))
    assert not (tmp_path / ".claude").exists()
