"""The agent image's MCP server (stdio, the official Python SDK): Claude Code as the tool
``run_task``. Contract and config: images/README.md ("Agent images"); the pure parts (argv,
stream-json → steps and result) are in agent_core.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import anyio
from agent_core import (
    KILL_GRACE,
    AgentConfig,
    ConfigError,
    Run,
    claude_argv,
    fabric_mcp_config,
    parse_line,
)
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent

CONFIG_ENV = "REACTOR_FABRIC_SERVICE_CONFIG"
# An account's Claude login (orchestrator.accounts.NAME.secrets.CLAUDE_CREDENTIALS, as: file):
# where the orchestrator delivers it, and the most it may be (the orchestrator's secret bound).
SECRETS_DIR = "/run/secrets"
CREDENTIALS_SECRET = "CLAUDE_CREDENTIALS"  # noqa: S105 - the secret's name
MAX_CREDENTIALS_BYTES = 64 * 1024
# The orchestrator's fabric endpoint of the call's child session, bound into the container, and
# the token that authenticates to it (fabric_relay.py). Only the relay gets them.
FABRIC_SOCKET_ENV = "REACTOR_FABRIC_FABRIC_SOCKET"
FABRIC_TOKEN_ENV = "REACTOR_FABRIC_FABRIC_TOKEN"  # noqa: S105 - the name, not a token
RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fabric_relay.py")
DEFAULT_WORKSPACE = "/workspace"
# Mounts a container has that are not the project: the engine's and the orchestrator's own.
# (Prefixes compared with, nothing is written there.)
NOT_PROJECT = (
    "/.reactor-fabric",
    "/etc/",
    "/proc",
    "/sys",
    "/dev",
    "/run/",
    "/tmp",  # noqa: S108
    "/opt/",
    "/usr/",
    "/home/",
)
# Longest stream-json line read (a tool result may be large); longer lines are skipped.
MAX_LINE = 8 * 1024 * 1024
# Variables of the server's environment the CLI gets (the API's, the proxy's, the locale's).
PASSED = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "all_proxy",
    "no_proxy",
    "PATH",
    "LANG",
    "TZ",
    "USER",
    "LOGNAME",
)


def _a_bind(fields: list[str]) -> bool:
    """Whether a mountinfo line (id parent major:minor root mountpoint … - fstype …) is a bind
    of a host directory: its root is not "/" (runc); under gVisor every host file the gofer
    serves is a 9p mount with root "/", the container's own root included."""
    fstype = fields[fields.index("-") + 1] if "-" in fields[:-1] else ""
    return fields[3] != "/" or (fstype == "9p" and fields[4] != "/")


def workspace(config: AgentConfig) -> str:
    """``config.workspace``, else the container's first bind mount that is not the engine's or
    the orchestrator's (the project the suite mounted), else /workspace."""
    if config.workspace:
        return config.workspace
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as info:
            for line in info:
                fields = line.split()
                if len(fields) > 4 and _a_bind(fields):
                    target = fields[4].replace("\\040", " ")
                    if not target.startswith(NOT_PROJECT) and os.path.isdir(target):
                        return target
    except OSError:
        pass
    return DEFAULT_WORKSPACE


def error(text: str, structured: dict[str, Any] | None = None) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], is_error=True, structured_content=structured
    )


def prepare(max_turns: int | None) -> tuple[AgentConfig, int, str] | CallToolResult:
    """The config, the turn limit and the workspace of a call, or why it cannot run."""
    try:
        config = AgentConfig.parse(os.environ.get(CONFIG_ENV))
    except (ConfigError, ValueError) as exc:
        return error(f"config_invalid: {exc}")
    if max_turns is not None and max_turns < 1:
        return error("invalid_arguments: max_turns must be a positive integer")
    limit = min(max_turns, config.max_turns) if max_turns is not None else config.max_turns
    where = workspace(config)
    if not os.path.isdir(where):
        return error(f"no_workspace: {where} is not a directory")
    return config, limit, where


def cli_environment(home: str, fabric: bool = False) -> dict[str, str]:
    """The CLI's environment: the API's, the proxy's and the locale's variables of the server's,
    a home of its own, and no traffic but the API's. ``fabric``: the agent has the fabric."""
    env = {k: v for k, v in os.environ.items() if k in PASSED}
    env |= {
        "HOME": home,
        "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    if fabric:
        # Claude Code may defer MCP tools behind its ToolSearch tool (it does with every tool
        # allowed): the model then needs a turn to find them, and an endpoint without tool
        # search refuses the request. The fabric's tools are the point: offered at once.
        env["ENABLE_TOOL_SEARCH"] = "false"
    return env


def install_credentials(home: str, secrets_dir: str | None = None) -> bool:
    """When the service's account gave a Claude credentials file (the secret
    ``CLAUDE_CREDENTIALS``, delivered as a file): a copy in the run's own configuration
    directory, where Claude Code reads its login (``.credentials.json``, 0600; gone with the
    run's home). Whether there was one."""
    source = os.path.join(secrets_dir or SECRETS_DIR, CREDENTIALS_SECRET)
    try:
        with open(source, "rb") as file:
            data = file.read(MAX_CREDENTIALS_BYTES + 1)
    except FileNotFoundError:
        return False
    if len(data) > MAX_CREDENTIALS_BYTES:
        raise OSError(f"{source} is larger than {MAX_CREDENTIALS_BYTES} bytes")
    directory = os.path.join(home, ".claude")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    target = os.path.join(directory, ".credentials.json")
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    return True


def write_mcp_config(home: str) -> str | None:
    """When the orchestrator bound a fabric socket into the container: the MCP config naming
    the relay as the server ``fabric``, written into the run's private ``home`` (0700, removed
    after the run) as a 0600 file holding the token; its path. Else ``None``."""
    socket = os.environ.get(FABRIC_SOCKET_ENV, "")
    if not socket:
        return None
    if not os.path.exists(socket):
        print(
            f"agent: no fabric: {FABRIC_SOCKET_ENV} names {socket}, which is absent",
            file=sys.stderr,
        )
        return None
    config = fabric_mcp_config(sys.executable, RELAY, socket, os.environ.get(FABRIC_TOKEN_ENV, ""))
    path = os.path.join(home, "mcp.json")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        json.dump(config, file)
    return path


class AgentRun:
    """One run_task: the CLI's process, its events read into a :class:`Run`."""

    def __init__(
        self, ctx: Context, process: anyio.abc.Process, where: str, limit: int, task: str
    ) -> None:
        self.ctx = ctx
        self.process = process
        self.run = Run(where)
        self.limit = limit
        self.task = task
        self.steps = 0
        self.stderr_tail = bytearray()

    async def give_task(self) -> None:
        """The task on the CLI's stdin, then its end: ``claude -p`` without a prompt argument
        reads its prompt there, as text whatever it begins with (on the command line, a task
        ``--settings=…`` would be an option), and of any length (one argument may be 128 KiB)."""
        assert self.process.stdin is not None
        try:
            await self.process.stdin.send(self.task.encode())
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the CLI ended before reading it: its exit says why
        finally:
            await self.process.stdin.aclose()

    async def read_stderr(self) -> None:
        assert self.process.stderr is not None
        async for chunk in self.process.stderr:
            self.stderr_tail.extend(chunk)
            del self.stderr_tail[:-4096]

    async def pump(self) -> str | None:
        """Each event in, each step reported; why the adapter stops the CLI itself (the turn
        limit), if it does."""
        assert self.process.stdout is not None
        pending = b""
        async for chunk in self.process.stdout:
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                event = parse_line(line)
                if event is None:
                    continue
                for step in self.run.feed(event):
                    self.steps += 1
                    await self.ctx.report_progress(self.steps, None, step)
                if self.run.turns > self.limit and self.run.result is None:
                    return f"max_turns: the agent reached its {self.limit} turns"
            if len(pending) > MAX_LINE:
                pending = b""  # a line too long to keep: skipped
        return None

    async def execute(self, wall_time: float) -> str | None:
        """Until the CLI ends, the turn limit or the wall time; why it was stopped, if."""
        stopped: str | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(self.read_stderr)
            group.start_soon(self.give_task)
            with anyio.move_on_after(wall_time) as deadline:
                stopped = await self.pump()
                if stopped is None:
                    await self.process.wait()
            if deadline.cancelled_caught:
                stopped = f"timeout: the task ran past its {wall_time:g} s"
            await _stop(self.process)
        if stopped is None and self.run.result is None and self.process.returncode != 0:
            tail = self.stderr_tail.decode(errors="replace").strip().splitlines()[-3:]
            stopped = f"crashed: the agent exited with {self.process.returncode}" + (
                f" ({' | '.join(tail)})" if tail else ""
            )
        return stopped


server = MCPServer("agent-claude-code")


@server.tool(
    description="Run a task with the Claude Code agent in the project's workspace; returns its "
    "final answer with {result, turns, tools_used, duration_ms, cost_usd, stop_reason}. With "
    "Reactor-Fabric's isolated workspaces the task works on a copy of the project and its "
    "changes come back as a branch (structuredContent.workspace); base: a branch or commit of "
    "the project's repository to start from instead of the working tree (the orchestrator "
    "makes that copy: on /mcp, for a service with workspace: isolated)."
)
async def run_task(
    task: str, ctx: Context, max_turns: int | None = None, base: str | None = None
) -> CallToolResult:
    del base  # (the orchestrator's: the copy this container sees already starts from it)
    prepared = prepare(max_turns)
    if isinstance(prepared, CallToolResult):
        return prepared
    config, limit, where = prepared
    # A fresh Claude Code home per run: nothing of one task (history, settings) reaches the next.
    home = tempfile.mkdtemp(prefix="claude-home-")
    try:
        install_credentials(home)
    except OSError as exc:
        shutil.rmtree(home, ignore_errors=True)
        return error(f"crashed: cannot install the account's credentials: {exc.strerror or exc}")
    try:
        mcp_config = write_mcp_config(home)
    except OSError as exc:
        shutil.rmtree(home, ignore_errors=True)
        return error(f"crashed: cannot write the MCP config: {exc.strerror or exc}")
    started = time.monotonic()
    process = await anyio.open_process(
        claude_argv(config, limit, mcp_config=mcp_config),
        cwd=where,
        env=cli_environment(home, fabric=mcp_config is not None),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    agent = AgentRun(ctx, process, where, limit, task)
    try:
        stopped = await agent.execute(config.timeout)
    finally:
        # Cancelled (the client's notifications/cancelled) or failed: the CLI goes too.
        with anyio.CancelScope(shield=True):
            await _stop(process)
            shutil.rmtree(home, ignore_errors=True)
    outcome = agent.run.outcome(round((time.monotonic() - started) * 1000), stopped)
    if outcome.error is not None:
        return error(outcome.error, outcome.structured)
    return CallToolResult(
        content=[TextContent(type="text", text=outcome.text)],
        structured_content=outcome.structured,
    )


async def _stop(process: anyio.abc.Process) -> None:
    """SIGTERM to the CLI's process group, SIGKILL after the grace."""
    if process.returncode is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with anyio.move_on_after(KILL_GRACE):
        await process.wait()
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    await process.wait()


if __name__ == "__main__":
    server.run("stdio")
