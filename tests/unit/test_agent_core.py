"""The agent image's adapter, its pure parts (images/agent-claude-code/agent_core.py): the service
config → Claude Code's argv, its stream-json events → progress steps and the final answer."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "images" / "agent-claude-code" / "agent_core.py"
_spec = importlib.util.spec_from_file_location("agent_core", SOURCE)
assert _spec is not None
assert _spec.loader is not None
core: Any = importlib.util.module_from_spec(_spec)
sys.modules["agent_core"] = core  # (dataclasses look their module up while the class is made)
_spec.loader.exec_module(core)

WS = "/projects/app"


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "assistant", "message": {"role": "assistant", "content": list(blocks)}}


def tool_use(name: str, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_1", "name": name, "input": tool_input}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def result(**fields: Any) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "all done",
        "num_turns": 2,
        "total_cost_usd": 0.0123,
        "permission_denials": [],
        **fields,
    }


def option(argv: list[str], name: str) -> str:
    """The value of ``--name=VALUE`` in ``argv`` (every value is joined to its option)."""
    [value] = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    return value


def test_the_default_config_is_the_safe_tool_set_with_no_shell() -> None:
    config = core.AgentConfig.parse(None)
    argv = core.claude_argv(config, config.max_turns)
    assert argv[:4] == ["claude", "-p", "--output-format=stream-json", "--verbose"]
    tools = option(argv, "--tools").split(",")
    assert tools == ["Read", "Grep", "Glob", "Edit", "Write", "NotebookEdit"]
    assert "Bash" not in tools
    assert option(argv, "--permission-mode") == "acceptEdits"
    assert "--dangerously-skip-permissions" not in argv
    assert (config.timeout, config.max_turns) == (core.DEFAULT_TIMEOUT, core.DEFAULT_MAX_TURNS)


def test_danger_mode_gives_every_tool_without_prompts_and_the_specialty_goes_through() -> None:
    raw = json.dumps(
        {"danger_mode": True, "specialty": "You review Python.", "model": "m1", "account": "work"}
    )
    argv = core.claude_argv(core.AgentConfig.parse(raw), 50)
    assert "--dangerously-skip-permissions" in argv
    assert not any(a.startswith(("--tools", "--permission-mode")) for a in argv)
    assert option(argv, "--append-system-prompt") == "You review Python."
    assert option(argv, "--model") == "m1"


# Values that would be options of Claude Code on its command line, as a separate argument.
HOSTILE = [
    '--settings={"hooks":{"SessionStart":[{"hooks":[{"type":"command","command":"touch /p"}]}]}}',
    "--dangerously-skip-permissions",
    "--mcp-config",
    "--add-dir",
    "-d",
]


@pytest.mark.parametrize("danger", [False, True])
@pytest.mark.parametrize("value", HOSTILE)
def test_a_specialty_or_model_beginning_with_a_dash_stays_the_value_of_its_option(
    value: str, danger: bool
) -> None:
    config = core.AgentConfig.parse(
        json.dumps({"specialty": value, "model": value, "danger_mode": danger})
    )
    for fabric in (None, "/tmp/h/mcp.json"):
        argv = core.claude_argv(config, 7, mcp_config=fabric)
        # Each argument after "-p" is an option, its value joined to it by "=": nothing is
        # left for the CLI to read as an option of its own, or as a list's next item.
        assert all(a.startswith("--") for a in argv[2:]), argv
        assert f"--append-system-prompt={value}" in argv
        assert f"--model={value}" in argv
        assert argv.count("--dangerously-skip-permissions") == int(danger)
        if not danger:
            assert option(argv, "--permission-mode") == "acceptEdits"


@pytest.mark.parametrize("danger", [False, True])
def test_no_settings_file_and_no_mcp_server_but_the_fabric_are_loaded_in_either_mode(
    danger: bool,
) -> None:
    config = core.AgentConfig.parse(json.dumps({"danger_mode": danger}))
    for fabric in (None, "/tmp/h/mcp.json"):
        argv = core.claude_argv(config, 7, mcp_config=fabric)
        # No source: neither the project's .claude/settings*.json (nor with them its
        # CLAUDE.md, agents, commands, skills) nor a user's.
        assert option(argv, "--setting-sources") == ""
        assert "--strict-mcp-config" in argv
        assert not any(a.startswith(("--settings", "--add-dir", "--plugin")) for a in argv)


def test_the_cli_counts_its_own_turns_against_the_limit() -> None:
    argv = core.claude_argv(core.AgentConfig.parse(None), 7)
    assert option(argv, "--max-turns") == "7"
    # With the API's events (message_start per request), which the run counts itself.
    assert "--include-partial-messages" in argv


@pytest.mark.parametrize(
    "raw",
    [
        "[]",
        '{"danger_mode": "yes"}',
        '{"specialty": 3}',
        '{"max_turns": 0}',
        '{"max_turns": true}',
        '{"timeout": -1}',
        '{"workspace": "relative"}',
    ],
)
def test_a_config_the_adapter_cannot_use_is_refused_with_what_is_wrong(raw: str) -> None:
    with pytest.raises(core.ConfigError):
        core.AgentConfig.parse(raw)


def test_each_text_and_each_tool_use_of_the_stream_is_one_progress_step() -> None:
    run = core.Run(WS)
    events = [
        {"type": "system", "subtype": "init", "cwd": WS},
        assistant(text("Let me look."), tool_use("Read", file_path=f"{WS}/src/app.py")),
        {"type": "user", "message": {"content": [{"type": "tool_result", "content": "x"}]}},
        assistant(tool_use("Grep", pattern="TODO"), tool_use("Bash", command="ls   -la\nwc")),
        assistant(text("   ")),
        assistant(tool_use("TodoWrite", todos=[])),
        result(),
    ]
    steps = [step for event in events for step in run.feed(event)]
    assert steps == ["Let me look.", "Read src/app.py", "Grep TODO", "Bash ls -la wc", "TodoWrite"]
    assert run.tools_used == ["Read", "Grep", "Bash", "TodoWrite"]


def request_started(parent: str | None = None) -> dict[str, Any]:
    """The API's ``message_start`` as the CLI passes it on (``--include-partial-messages``)."""
    return {
        "type": "stream_event",
        "event": {"type": "message_start", "message": {"id": "msg_1", "content": []}},
        "parent_tool_use_id": parent,
    }


def test_a_turn_is_a_model_request_though_the_cli_prints_each_block_as_an_event() -> None:
    # What Claude Code 2.1.332 prints for a turn with a text and two tool uses, then the answer.
    run = core.Run(WS)
    for blocks, message_id in [
        ([text("looking")], "msg_1"),
        ([tool_use("Read", file_path="a")], "msg_1"),
        ([tool_use("Read", file_path="b")], "msg_1"),
        ([text("done")], "msg_2"),
    ]:
        if blocks[0]["type"] == "text":
            run.feed(request_started())
        event = assistant(*blocks)
        event["message"]["id"] = message_id
        run.feed(event)
    assert run.turns == 2
    assert run.tools_used == ["Read", "Read"]


def test_a_gateway_answering_every_request_under_one_id_has_each_request_counted() -> None:
    run = core.Run(WS)
    for _ in range(5):
        run.feed(request_started())
        event = assistant(tool_use("Read", file_path="a"))
        event["message"]["id"] = "msg_gateway"
        run.feed(event)
        run.feed({"type": "user", "message": {"content": [{"type": "tool_result"}]}})
    # A sub-agent's request (danger mode) is its own, not one of the run's turns.
    run.feed(request_started(parent="toolu_1"))
    assert run.turns == 5


def test_at_the_clis_turn_limit_the_turns_are_the_requests_it_made() -> None:
    # Claude Code 2.1.332 with --max-turns=3: three requests, then error_max_turns with
    # num_turns 4 (the turn it did not start counted too).
    run = core.Run(WS)
    for _ in range(3):
        run.feed(request_started())
        run.feed(assistant(tool_use("Read", file_path="a")))
    run.feed(result(subtype="error_max_turns", is_error=True, num_turns=4, result=None))
    outcome = run.outcome(10)
    assert outcome.error == "max_turns: the agent reached its 3 turns"
    assert outcome.structured["turns"] == 3


def test_a_long_step_is_cut_and_a_path_outside_the_workspace_stays_whole() -> None:
    assert core.describe_tool_use("Write", {"file_path": "/tmp/x"}, WS) == "Write /tmp/x"
    step = core.steps_of(assistant(text("y" * 1000)), WS)[0]
    assert len(step) == core.MAX_STEP_CHARS
    assert step.endswith("…")


def test_the_final_result_becomes_the_structured_content() -> None:
    run = core.Run(WS)
    run.feed(assistant(tool_use("Read", file_path=f"{WS}/a")))
    run.feed(result(permission_denials=[{"tool_name": "Write", "tool_input": {}}]))
    outcome = run.outcome(1234)
    assert outcome.error is None
    assert outcome.text == "all done"
    assert outcome.structured == {
        "result": "all done",
        "turns": 2,
        "tools_used": ["Read"],
        "duration_ms": 1234,
        "cost_usd": 0.0123,
        "stop_reason": "success",
        "permission_denials": ["Write"],
    }


@pytest.mark.parametrize(
    ("events", "stopped", "error", "stop_reason"),
    [
        # The API failed: Claude Code says so in a result marked is_error.
        (
            [result(is_error=True, result="API Error: 401 invalid x-api-key")],
            None,
            "agent_error: API Error: 401 invalid x-api-key",
            "success",
        ),
        ([result(subtype="error_max_turns", num_turns=3)], None, "max_turns: ", "max_turns"),
        ([assistant(text("half"))], None, "crashed: the agent ended without a result", "crashed"),
        (
            [assistant(text("half"))],
            "timeout: the task ran past its 5 s",
            "timeout: the task ran past its 5 s",
            "timeout",
        ),
        ([], "crashed: the agent exited with 1 (boom)", "crashed: the agent exited", "crashed"),
    ],
)
def test_every_failure_is_an_error_with_its_reason(
    events: list[dict[str, Any]], stopped: str | None, error: str, stop_reason: str
) -> None:
    run = core.Run(WS)
    for event in events:
        run.feed(event)
    outcome = run.outcome(10, stopped)
    assert outcome.error is not None
    assert outcome.error.startswith(error), outcome
    assert outcome.text == outcome.error
    assert outcome.structured["stop_reason"] == stop_reason
    assert set(outcome.structured) >= {"result", "turns", "tools_used", "duration_ms", "cost_usd"}


def test_a_line_that_is_not_a_json_object_is_skipped() -> None:
    assert core.parse_line(b"not json") is None
    assert core.parse_line(b"[1]") is None
    assert core.parse_line(b'{"type": "system"}') == {"type": "system"}


def test_with_the_fabric_the_safe_mode_allows_only_the_fabric_server_besides_the_safe_set() -> None:
    argv = core.claude_argv(core.AgentConfig.parse(None), 50, mcp_config="/tmp/h/mcp.json")
    assert option(argv, "--mcp-config") == "/tmp/h/mcp.json"
    assert "--strict-mcp-config" in argv
    # Headless, an MCP tool's permission prompt is never answered: only an allow rule lets the
    # fabric's tools run, and it names the fabric alone.
    assert option(argv, "--allowedTools") == "mcp__fabric"
    tools = option(argv, "--tools").split(",")
    assert tools == ["Read", "Grep", "Glob", "Edit", "Write", "NotebookEdit"]
    assert option(argv, "--permission-mode") == "acceptEdits"


def test_with_the_fabric_in_danger_mode_no_allow_rule_is_needed() -> None:
    raw = json.dumps({"danger_mode": True})
    argv = core.claude_argv(core.AgentConfig.parse(raw), 50, mcp_config="/h/mcp.json")
    assert option(argv, "--mcp-config") == "/h/mcp.json"
    assert "--strict-mcp-config" in argv
    assert not any(a.startswith("--allowedTools") for a in argv)
    assert "--dangerously-skip-permissions" in argv


def test_without_the_fabric_no_mcp_server_is_configured() -> None:
    for raw in (None, json.dumps({"danger_mode": True})):
        argv = core.claude_argv(core.AgentConfig.parse(raw), 50)
        assert not any(a.startswith(("--mcp-config", "--allowedTools")) for a in argv)


def test_the_fabric_config_runs_the_relay_with_the_socket_and_token_in_its_own_environment() -> (
    None
):
    config = core.fabric_mcp_config(
        "/opt/agent/bin/python3", "/opt/agent/app/fabric_relay.py", "/.reactor-fabric/f.sock", "t1"
    )
    assert config == {
        "mcpServers": {
            "fabric": {
                "type": "stdio",
                "command": "/opt/agent/bin/python3",
                "args": ["/opt/agent/app/fabric_relay.py"],
                "env": {
                    "REACTOR_FABRIC_FABRIC_SOCKET": "/.reactor-fabric/f.sock",
                    "REACTOR_FABRIC_FABRIC_TOKEN": "t1",
                },
            }
        }
    }


def test_an_mcp_tool_use_is_a_step_naming_its_server_and_tool() -> None:
    run = core.Run(WS)
    steps = run.feed(
        assistant(
            tool_use("mcp__fabric__git__git_log", repo_path=WS, max_count=3),
            tool_use("mcp__fabric__filesystem__read_file", path=f"{WS}/src/app.py"),
        )
    )
    assert steps == ["fabric: git__git_log", "fabric: filesystem__read_file src/app.py"]
    assert run.tools_used == ["mcp__fabric__git__git_log", "mcp__fabric__filesystem__read_file"]
