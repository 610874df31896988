"""The pure parts of the agent adapter (no MCP SDK, no I/O): the service config → the agent
CLI's argv, and the CLI's stream-json lines → progress steps and the final result.

The adapter's contract (images/README.md, "Agent images"): an agent image runs an MCP server on
stdio exposing ``run_task {task, max_turns?}``; the server starts the agent CLI headless in the
workspace, reports one progress notification per step (:func:`step_of` each event), stops the
CLI on cancellation, at the wall-time limit or past the turn limit, and answers the final text with
``structuredContent`` ``{result, turns, tools_used, duration_ms, cost_usd, stop_reason}``
(:class:`Outcome`), ``isError`` with the reason on any failure. A second agent CLI needs its own
:func:`claude_argv` and :func:`step_of`/:meth:`Outcome.from_result` equivalents; the server
(agent_server.py) and the rest stay.

What the CLI is told, and by whom: the task is given on its stdin, never on its command line,
so that no task is read as an option (``--settings=…`` would be settings, hooks included,
``--dangerously-skip-permissions`` a mode); every other value on the command line is joined to
its option (``--model=VALUE``), so that none is read as an option either, whatever it begins
with, and none is taken by the option before it (several take a list). The settings it loads
are only the ones given here (no settings file at all: ``--setting-sources=``), so that the
project it works in, which may be the code under review, does not configure it: none of its
``.claude/settings.json`` or ``settings.local.json`` (hooks, ``apiKeyHelper``, ``env``,
permission rules, plugins), ``CLAUDE.md`` and its imports, ``.claude/agents``, ``commands``,
``skills``, ``workflows``, nor its ``.mcp.json`` (``--strict-mcp-config``: only the fabric).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Wall time of one run_task unless the config says ``timeout`` (seconds).
DEFAULT_TIMEOUT = 600.0
# Turns of one run_task unless the config or the call says ``max_turns``.
DEFAULT_MAX_TURNS = 50
# Seconds between the CLI's SIGTERM and its SIGKILL (cancellation, timeout, turn limit).
KILL_GRACE = 5.0
# danger_mode false: the only built-in tools the agent has (--tools): read, search and edit
# (acceptEdits: without a prompt inside the working directory, the workspace). No shell, no web,
# no sub-agents. Outside the workspace they would prompt; in -p mode nobody answers, so they are
# denied, and reported in the result's permission_denials.
SAFE_TOOLS = ("Read", "Grep", "Glob", "Edit", "Write", "NotebookEdit")
# Longest text of one progress message.
MAX_STEP_CHARS = 300
# The one MCP server the agent may be given: the orchestrator's fabric endpoint of the call's
# child session (the suite's services the agent service ``uses``), through fabric_relay.py.
FABRIC_SERVER = "fabric"
# Claude Code names an MCP server's tools mcp__<server>__<tool>; a permission rule naming the
# server alone allows all of its tools.
FABRIC_RULE = f"mcp__{FABRIC_SERVER}"


class ConfigError(ValueError):
    """The service's config is not one the adapter accepts."""


@dataclass(frozen=True)
class AgentConfig:
    specialty: str | None = None
    danger_mode: bool = False
    model: str | None = None
    max_turns: int = DEFAULT_MAX_TURNS
    timeout: float = DEFAULT_TIMEOUT
    workspace: str | None = None

    @classmethod
    def parse(cls, raw: str | None) -> AgentConfig:
        """From ``REACTOR_FABRIC_SERVICE_CONFIG`` (JSON; absent or empty: the defaults). Keys
        the adapter does not know (``account``, …) are left to the orchestrator."""
        value: Any = json.loads(raw) if raw else {}
        if not isinstance(value, dict):
            raise ConfigError("the service config is not a JSON object")
        specialty = value.get("specialty")
        if specialty is not None and not isinstance(specialty, str):
            raise ConfigError("config.specialty must be a string")
        danger = value.get("danger_mode", False)
        if not isinstance(danger, bool):
            raise ConfigError("config.danger_mode must be true or false")
        model = value.get("model")
        if model is not None and not isinstance(model, str):
            raise ConfigError("config.model must be a string")
        turns = value.get("max_turns", DEFAULT_MAX_TURNS)
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise ConfigError("config.max_turns must be a positive integer")
        timeout = value.get("timeout", DEFAULT_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError("config.timeout must be a positive number of seconds")
        workspace = value.get("workspace")
        if workspace is not None and (
            not isinstance(workspace, str) or not workspace.startswith("/")
        ):
            raise ConfigError("config.workspace must be an absolute path")
        return cls(specialty, danger, model, turns, float(timeout), workspace)


def claude_argv(
    config: AgentConfig, max_turns: int, claude: str = "claude", mcp_config: str | None = None
) -> list[str]:
    """The Claude Code command line of a run under ``config`` stopping after ``max_turns`` model
    requests; ``mcp_config``: the file of :func:`fabric_mcp_config`, when the agent has the
    fabric. The task is not on it: the CLI reads it from its stdin (``-p`` without a prompt),
    where nothing is an option."""
    argv = [
        claude,
        "-p",
        "--output-format=stream-json",
        "--verbose",
        # The API's events too (a message_start per model request): the turns counted by
        # Run.feed, whatever ids a gateway gives its messages.
        "--include-partial-messages",
        # No settings file: neither the user's (the run's fresh home has none) nor the
        # project's (.claude/settings*.json, CLAUDE.md, its agents, commands and skills).
        "--setting-sources=",
        # Only the MCP servers of --mcp-config (the fabric, when given): none of a project's
        # .mcp.json, none of a config file's.
        "--strict-mcp-config",
        # The CLI counts its own model requests and ends with error_max_turns at the limit.
        f"--max-turns={max_turns}",
    ]
    if config.model:
        argv.append(f"--model={config.model}")
    if config.specialty:
        argv.append(f"--append-system-prompt={config.specialty}")
    if mcp_config is not None:
        argv.append(f"--mcp-config={mcp_config}")
    if config.danger_mode:
        argv.append("--dangerously-skip-permissions")
    else:
        argv += [f"--tools={','.join(SAFE_TOOLS)}", "--permission-mode=acceptEdits"]
        if mcp_config is not None:
            # In safe mode an MCP tool asks for permission, which nobody answers headless: it
            # would be denied ("you haven't granted it yet"). The fabric's tools are allowed by
            # name; the built-in set stays as above.
            argv.append(f"--allowedTools={FABRIC_RULE}")
    return argv


def fabric_mcp_config(python: str, relay: str, socket: str, token: str) -> dict[str, Any]:
    """Claude Code's MCP config with the one server ``fabric``: the relay, run by ``python``,
    told the socket and the token through its own environment (the config's ``env``), so that
    neither is in the CLI's environment nor on any command line."""
    return {
        "mcpServers": {
            FABRIC_SERVER: {
                "type": "stdio",
                "command": python,
                "args": [relay],
                "env": {
                    "REACTOR_FABRIC_FABRIC_SOCKET": socket,
                    "REACTOR_FABRIC_FABRIC_TOKEN": token,
                },
            }
        }
    }


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_STEP_CHARS else text[: MAX_STEP_CHARS - 1] + "…"


def _relative(path: str, workspace: str) -> str:
    prefix = workspace.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def describe_tool_use(name: str, tool_input: Any, workspace: str) -> str:
    """``Read src/app.py``, ``Bash ls -la``, ``Grep TODO``: the tool and what it acts on; an
    MCP tool (``mcp__fabric__git__git_log``) as its server and its name (``fabric:
    git__git_log``)."""
    if name.startswith("mcp__"):
        server, _, tool = name[len("mcp__") :].partition("__")
        if server and tool:
            name = f"{server}: {tool}"
    if not isinstance(tool_input, dict):
        return _short(name)
    for key in ("file_path", "notebook_path", "path", "command", "pattern", "url", "query"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            if key.endswith("path"):
                value = _relative(value, workspace)
            return _short(f"{name} {value}")
    return _short(name)


def parse_line(line: str | bytes) -> dict[str, Any] | None:
    """One stream-json line as an event, or ``None`` for a line that is not a JSON object."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def steps_of(event: dict[str, Any], workspace: str) -> list[str]:
    """The progress steps an event is: each text and each tool use of an assistant message."""
    if event.get("type") != "assistant":
        return []
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    steps: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            if block["text"].strip():
                steps.append(_short(block["text"]))
        elif block.get("type") == "tool_use" and isinstance(block.get("name"), str):
            steps.append(describe_tool_use(block["name"], block.get("input"), workspace))
    return steps


def is_model_request(event: dict[str, Any]) -> bool:
    """Whether ``event`` is the start of the answer to one of the run's own model requests (the
    API's ``message_start``, which ``--include-partial-messages`` passes on; a sub-agent's,
    with its ``parent_tool_use_id``, is not the run's turn)."""
    inner = event.get("event")
    return (
        event.get("type") == "stream_event"
        and isinstance(inner, dict)
        and inner.get("type") == "message_start"
        and event.get("parent_tool_use_id") is None
    )


@dataclass
class Run:
    """What one run has shown so far, fed each event in order."""

    workspace: str
    turns: int = 0
    tools_used: list[str] = field(default_factory=list)
    last_text: str = ""
    result: dict[str, Any] | None = None

    def feed(self, event: dict[str, Any]) -> list[str]:
        """Take ``event`` in; the progress steps it makes."""
        if is_model_request(event):
            # A turn is a model request, counted when its answer starts. Not a message id: a
            # gateway may answer every request under one id (a run of 100 turns was counted
            # as one), and the CLI prints one assistant event per content block anyway.
            self.turns += 1
        elif event.get("type") == "assistant":
            message = event.get("message")
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    name = block.get("name")
                    if isinstance(name, str):
                        self.tools_used.append(name)
                elif isinstance(block, dict) and block.get("type") == "text":
                    text = block.get("text")
                    if isinstance(text, str) and text.strip():
                        self.last_text = text
        elif event.get("type") == "result":
            self.result = event
        return steps_of(event, self.workspace)

    def outcome(self, duration_ms: int, stopped: str | None = None) -> Outcome:
        """The answer: ``stopped`` is why the adapter ended the CLI itself (``timeout``,
        ``max_turns``) or why it failed (``crashed: …``), else the CLI's own result decides."""
        result = self.result or {}
        cost = result.get("total_cost_usd")
        turns = result.get("num_turns")
        text = result.get("result")
        final = text if isinstance(text, str) else self.last_text
        # The model requests counted; none seen (a CLI that printed no request): the CLI's
        # own count. Not the CLI's first: at its turn limit its num_turns also counts the
        # turn it refused to start.
        counted = self.turns
        if counted == 0 and isinstance(turns, int) and not isinstance(turns, bool):
            counted = turns
        structured: dict[str, Any] = {
            "result": final,
            "turns": counted,
            "tools_used": list(self.tools_used),
            "duration_ms": duration_ms,
            "cost_usd": float(cost) if isinstance(cost, int | float) else 0.0,
            "stop_reason": "",
        }
        if stopped is not None:
            structured["stop_reason"] = stopped.split(":", 1)[0]
            return Outcome(structured, error=stopped)
        if self.result is None:
            structured["stop_reason"] = "crashed"
            return Outcome(structured, error="crashed: the agent ended without a result")
        subtype = result.get("subtype")
        reason = result.get("stop_reason")
        structured["stop_reason"] = (
            reason if isinstance(reason, str) and reason else str(subtype or "")
        )
        if result.get("is_error") or subtype != "success":
            if subtype == "error_max_turns":
                structured["stop_reason"] = "max_turns"
                return Outcome(
                    structured,
                    error=f"max_turns: the agent reached its {structured['turns']} turns",
                )
            why = final or str(result.get("errors") or subtype or "the agent failed")
            return Outcome(structured, error=f"agent_error: {_short(why)}")
        denials = result.get("permission_denials")
        if isinstance(denials, list) and denials:
            structured["permission_denials"] = [
                d.get("tool_name") for d in denials if isinstance(d, dict) and "tool_name" in d
            ]
        return Outcome(structured)


@dataclass(frozen=True)
class Outcome:
    structured: dict[str, Any]
    error: str | None = None

    @property
    def text(self) -> str:
        if self.error is not None:
            return self.error
        return str(self.structured["result"])
