"""The command line's arguments, laid out by subcommand: serving's options at the top level
(serving is what runs when no command is named; ``--config`` is also the other commands'
default suite), then each command's, in the order ``--help`` lists them; the operators'
commands add theirs (``_operator_cli.py``)."""

from __future__ import annotations

import argparse
from typing import TypeAlias

from ._operator_cli import DEFAULT_PORT, add_operator_commands
from ._runtime_choice import RUNTIME_NAMES
from ._version import __version__
from .observe.logging import LOG_LEVELS
from .protocol.suite_lock import LOCK_FILE
from .trio.identity import REPLICA_NAME

DEFAULT_CONFIG = "claude-mcp-suite.yaml"
DEFAULT_HOST = "127.0.0.1"

# What add_subparsers returns: each command's function adds its parser to it.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535)")
    return value


def _replica(text: str) -> str:
    if not REPLICA_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a replica name (lowercase letters, digits and -, at most 32)"
        )
    return text


def build_parser(environ: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reactor-fabric",
        description="Serve MCP services from claude-mcp-suite.yaml, one fresh container per "
        "client session.",
    )
    parser.add_argument("--version", action="version", version=f"reactor-fabric {__version__}")
    _serving_options(parser, environ)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _validate_config(commands)
    _connect(commands, environ)
    _login(commands, environ)
    _catalog(commands)
    _rank(commands)
    _lock(commands)
    add_operator_commands(commands, environ)
    return parser


def _serving_options(parser: argparse.ArgumentParser, environ: dict[str, str]) -> None:
    parser.add_argument(
        "--config",
        default=environ.get("REACTOR_FABRIC_CONFIG", DEFAULT_CONFIG),
        help="suite file (env REACTOR_FABRIC_CONFIG; default ./claude-mcp-suite.yaml)",
    )
    parser.add_argument(
        "--host",
        default=environ.get("REACTOR_FABRIC_HOST", DEFAULT_HOST),
        help="address to listen on (env REACTOR_FABRIC_HOST; default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=environ.get("REACTOR_FABRIC_PORT", str(DEFAULT_PORT)),
        help="port to listen on, 0 for any free port (env REACTOR_FABRIC_PORT; default 8765)",
    )
    parser.add_argument(
        "--runtime",
        choices=RUNTIME_NAMES,
        default=environ.get("REACTOR_FABRIC_RUNTIME") or None,
        help="where session containers run: docker (DOCKER_HOST, else the local socket), "
        "podman (CONTAINER_HOST, else Podman's socket) or kubernetes (a pod per session; "
        "orchestrator.kubernetes of the suite) (env REACTOR_FABRIC_RUNTIME; default: the "
        "suite's orchestrator.runtime, else docker)",
    )
    parser.add_argument(
        "--replica",
        type=_replica,
        default=environ.get("REACTOR_FABRIC_REPLICA") or None,
        help="this orchestrator's name among several behind one proxy: it ends every session "
        "id, so the proxy can route by Mcp-Session-Id (see docs/SCALING.md) (env "
        "REACTOR_FABRIC_REPLICA; lowercase letters, digits and -, at most 32)",
    )
    parser.add_argument(
        "--network",
        default=environ.get("REACTOR_FABRIC_NETWORK"),
        help="Docker network for service containers (env REACTOR_FABRIC_NETWORK; default: the "
        "suite's orchestrator.network, else 'bridge'); a service's own network wins",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="the token clients must present (default: env REACTOR_FABRIC_TOKEN, else the one "
        "in ${XDG_CONFIG_HOME:-~/.config}/reactor-fabric/token, made on the first start); "
        "other users can see a command line, so prefer those two",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="accept clients without a token (as orchestrator.auth: none); refused unless "
        "listening on a loopback address",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=environ.get("REACTOR_FABRIC_LOG_LEVEL", "info").lower(),
        help="log level (env REACTOR_FABRIC_LOG_LEVEL; default info)",
    )


def _validate_config(commands: Commands) -> None:
    validate = commands.add_parser(
        "validate-config",
        help="check a suite file and list every problem (exit 0 valid, 1 invalid, 2 unreadable)",
    )
    validate.add_argument("path", help="the suite file to check")
    validate.add_argument(
        "--secrets",
        action="store_true",
        help="also resolve every service's secrets (variables set, files readable only by "
        "this user) without printing a value; exit 1 if one does not resolve",
    )
    validate.add_argument(
        "--engine",
        action="store_true",
        help="also ask the engine, as the orchestrator does at its start, what each service "
        "that asks for gVisor would run under; exit 1 if one is isolation_unavailable",
    )


def _connect(commands: Commands, environ: dict[str, str]) -> None:
    bridge = commands.add_parser(
        "connect",
        help="a stdio MCP server that relays to the orchestrator (for clients that launch "
        "local commands)",
    )
    bridge.add_argument(
        "url",
        nargs="?",
        default=environ.get("REACTOR_FABRIC_ENDPOINT"),
        help="orchestrator URL, ws://HOST:PORT or ws://HOST:PORT/mcp/SERVICE "
        "(default: env REACTOR_FABRIC_ENDPOINT)",
    )
    bridge.add_argument("--service", help="service name (unless the URL ends in /mcp/SERVICE)")
    bridge.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="SRC:TARGET[:ro]",
        help="a directory to mount (repeatable); default: the current directory at /workspace",
    )
    bridge.add_argument("--no-mount", action="store_true", help="register no mount at all")
    bridge.add_argument(
        "--config",
        dest="fallback_config",
        default=None,
        help="suite file giving the service's local_command fallback, for when the "
        "orchestrator is unreachable (default: ~/.config/reactor-fabric/claude-mcp-suite.yaml, "
        "with ~ your home directory from the password database, not HOME or XDG_CONFIG_HOME; "
        "never a suite in the current directory)",
    )
    bridge.add_argument(
        "--login",
        choices=["browser", "device", "none"],
        default="browser",
        help="when the orchestrator's users sign in (auth.mode: oidc) and no sign-in is kept: "
        "'browser' opens the sign-in page (the device flow when there is no browser), "
        "'device' prints an address and a code to enter on any device, 'none' refuses "
        "(sign in first with `reactor-fabric login`)",
    )
    bridge.add_argument(
        "--orchestrator-user",
        action="append",
        default=[],
        metavar="USER",
        help="an account (name or uid) the orchestrator runs as, besides you and root: only a "
        "loopback listener of yours, root's or such an account is sent anything (repeatable)",
    )


def _login(commands: Commands, environ: dict[str, str]) -> None:
    login = commands.add_parser(
        "login",
        help="sign in to an orchestrator whose users sign in with an OpenID provider "
        "(auth.mode: oidc), ahead of the bridge; the sign-in is kept for it",
    )
    login.add_argument(
        "url",
        nargs="?",
        default=environ.get("REACTOR_FABRIC_ENDPOINT"),
        help="the orchestrator's URL (http(s):// or ws(s)://; default: env "
        "REACTOR_FABRIC_ENDPOINT)",
    )
    login.add_argument(
        "--device",
        action="store_true",
        help="print an address and a code to sign in on any device, instead of opening a browser",
    )


def _catalog(commands: Commands) -> None:
    catalog = commands.add_parser(
        "catalog",
        help="show what every service offers (tools, prompts, resources), learning it from a "
        "container of each service when the cache does not have it",
    )
    catalog.add_argument(
        "--config", dest="catalog_config", default=None, help="suite file (default: as above)"
    )
    catalog.add_argument(
        "--refresh", action="store_true", help="learn every service again, ignoring the cache"
    )
    catalog.add_argument(
        "--json",
        action="store_true",
        help="print the catalog as JSON in the form 'rank --catalog' reads (docs/DISCOVERY.md)",
    )


def _rank(commands: Commands) -> None:
    rank = commands.add_parser(
        "rank",
        help="rank a catalog's servers for tasks read from stdin, one per line; writes one "
        "JSON object per task (offline: no orchestrator, no Docker)",
    )
    rank.add_argument("--catalog", required=True, help="a catalog file ('catalog --json')")
    rank.add_argument(
        "--top", type=int, default=10, help="how many servers ranked_servers lists (10)"
    )
    rank.add_argument(
        "--budget", type=int, default=None, help="tokens of tool definitions the set may take"
    )


def _lock(commands: Commands) -> None:
    lock = commands.add_parser(
        "lock",
        help=f"write {LOCK_FILE} beside the suite: each service's image id and the hashes of "
        "its tool, prompt and resource template definitions (--check: compare instead; exit 1 "
        "on drift)",
    )
    lock.add_argument(
        "--config", dest="lock_config", default=None, help="suite file (default: as above)"
    )
    lock.add_argument(
        "--check",
        action="store_true",
        help="compare the services with the lock, print what changed, exit 1 on drift",
    )
