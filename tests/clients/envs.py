"""Environments of the real MCP clients the end-to-end tests drive, built once and cached.

The Python SDK's 1.x (WebSocket) and 2.x lines are the same distribution, so each gets its own
virtual environment; the TypeScript SDK gets its own node_modules. They live under
``$XDG_CACHE_HOME/reactor-fabric/clients/`` (or ``REACTOR_FABRIC_CLIENTS_DIR``), keyed by what
they install, and are reused while that does not change.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON_SDK1 = "mcp[ws]>=1.25,<2"
TS_SDK1 = "@modelcontextprotocol/sdk@^1.32"
CLAUDE_CODE = "@anthropic-ai/claude-code@^2.1"


def clients_dir() -> Path:
    explicit = os.environ.get("REACTOR_FABRIC_CLIENTS_DIR")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "reactor-fabric" / "clients"


def _keyed(name: str, spec: str) -> Path:
    digest = hashlib.sha256(spec.encode()).hexdigest()[:12]
    return clients_dir() / f"{name}-{digest}"


def _run(argv: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )


def python_sdk1() -> Path:
    """The Python interpreter of an environment with the MCP Python SDK 1.x (WebSocket)."""
    home = _keyed("python-mcp1", PYTHON_SDK1)
    python = home / "bin" / "python"
    if not (home / ".ready").exists():
        shutil.rmtree(home, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(home)])
        _run([str(python), "-m", "pip", "install", "--quiet", PYTHON_SDK1])
        (home / ".ready").touch()
    return python


def _npm_environment(name: str, spec: str) -> Path:
    """A directory with ``spec`` installed from npm (built once, kept while ``spec`` holds)."""
    home = _keyed(name, spec)
    if not (home / ".ready").exists():
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        (home / "package.json").write_text(f'{{"name": "rf-{name}", "private": true}}\n')
        _run(["npm", "install", "--no-audit", "--no-fund", "--silent", spec], cwd=home)
        (home / ".ready").touch()
    return home


def ts_sdk1() -> Path:
    """A directory with the TypeScript SDK 1.x installed (scripts must be copied into it)."""
    return _npm_environment("ts-sdk1", TS_SDK1)


def claude_code() -> Path:
    """The ``claude`` command of Claude Code (its ``mcp add/list`` need no API key)."""
    return _npm_environment("claude-code", CLAUDE_CODE) / "node_modules" / ".bin" / "claude"


def node_command(script: str) -> list[str]:
    """``node`` with the script placed next to the SDK (ESM resolves imports from the file)."""
    home = ts_sdk1()
    target = home / script
    shutil.copyfile(HERE / script, target)
    node = shutil.which("node") or "node"
    major = int(
        subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
        .stdout.strip()
        .lstrip("v")
        .split(".")[0]
    )
    # Node 20 has WebSocket only behind a flag; 22+ has it by default.
    flags = ["--experimental-websocket"] if major < 22 else []
    return [node, *flags, str(target)]
