"""Command line: ``python -m reactor_fabric [serve options]``, ``validate-config PATH``,
``connect`` (the stdio bridge) and ``catalog``.

Exit codes:

- ``0`` — clean shutdown (SIGINT/SIGTERM), a valid suite for ``validate-config``, every service
  learned for ``catalog``;
- ``1`` — the suite is invalid (every problem is listed, one per line); for ``catalog``, a
  service could not be learned;
- ``2`` — the suite file cannot be read, or the command line is wrong;
- ``3`` — the orchestrator cannot listen (port in use, address not available).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from . import _reasons
from ._cli_shared import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNREADABLE,
    optional_suite,
    read_suite,
)
from ._errors import SecurityViolation
from ._lock_cli import lock_command, lock_file_problem, lock_path
from ._operator_cli import (
    DEFAULT_PORT,
    add_operator_commands,
    audit_command,
    sessions_command,
)
from ._runtime_choice import RUNTIME_NAMES, egress_served, engine_runtime
from ._serve_cli import ServeSettings, serve
from ._version import __version__
from .config.secrets import resolve_suite_secrets
from .config.token import TokenError
from .config.token_record import (
    find_bridge_token,
    searched,
)
from .discovery import build_index, rank_servers, tokens
from .discovery.catalog_file import CatalogFormatError, catalog_json, services_from_json
from .discovery.tokens import count_definition
from .observe.logging import LOG_LEVELS
from .protocol.catalog import Catalog
from .protocol.fabric_discovery import service_texts
from .protocol.suite_lock import (
    LOCK_FILE,
)
from .runtime.engines import EngineAddressError
from .trio.bridge import (
    BridgeError,
    BridgeSettings,
    connect,
    dialled_port,
    mounts_from,
    service_url,
)
from .trio.catalog import Learned, default_store, learn_catalog
from .trio.fabric import (
    REPLICA_NAME,
    new_instance_id,
    process_identity,
    resolve_secrets,
    suite_facts,
)

MAX_CATALOG_BYTES = 256 * 1024 * 1024

DEFAULT_CONFIG = "claude-mcp-suite.yaml"
DEFAULT_HOST = "127.0.0.1"


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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
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
        "--orchestrator-user",
        action="append",
        default=[],
        metavar="USER",
        help="an account (name or uid) the orchestrator runs as, besides you and root: only a "
        "loopback listener of yours, root's or such an account is sent anything (repeatable)",
    )
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
    add_operator_commands(commands, environ)
    return parser


def main(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    parser = build_parser(env)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    commands: dict[str, Callable[[], int]] = {
        "validate-config": lambda: validate_config(args.path, secrets=args.secrets),
        "connect": lambda: connect_command(args, env),
        "catalog": lambda: catalog_command(
            args.catalog_config or args.config, args.refresh, args.json, env
        ),
        "rank": lambda: rank_command(args.catalog, args.top, args.budget),
        "lock": lambda: lock_command(args.lock_config or args.config, args.check, env),
        "audit": lambda: audit_command(args, optional_suite(args.config), env, int(args.port)),
        "sessions": lambda: sessions_command(args, env),
    }
    if args.command in commands:
        return commands[args.command]()
    settings = ServeSettings(
        config=args.config,
        host=args.host,
        port=int(args.port),
        network=args.network,
        log_level=args.log_level,
        token=args.token,
        no_auth=args.no_auth,
        runtime=args.runtime,
        replica=args.replica,
    )
    return serve(settings, env)


def _account_uid(name: str) -> int:
    """``--orchestrator-user``: a uid, or an account name looked up in the password database."""
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise BridgeError(f"--orchestrator-user {name!r}: no such account") from None


def connect_command(args: argparse.Namespace, environ: dict[str, str]) -> int:
    """``reactor-fabric connect``: stdout belongs to MCP, so every message goes to stderr."""
    if not args.url:
        print(
            "reactor-fabric connect: no orchestrator URL (give one, or set "
            "REACTOR_FABRIC_ENDPOINT)",
            file=sys.stderr,
        )
        return EXIT_UNREADABLE
    try:
        port = dialled_port(args.url)
        # Never made here: no token anywhere, none sent (the orchestrator's 401 says so).
        token = find_bridge_token(environ, port)
        settings = BridgeSettings(
            endpoint=args.url,
            service=service_url(args.url, args.service)[1],
            mounts=mounts_from(args.mount, no_mount=args.no_mount, cwd=Path.cwd()),
            config=args.fallback_config,
            token=token.value if token is not None else None,
            token_origin=token.origin if token is not None else None,
            token_places=searched(environ, port),
            trusted_uids=tuple(_account_uid(name) for name in args.orchestrator_user),
        )
        return connect(settings)
    except (BridgeError, SecurityViolation, TokenError) as exc:
        print(f"reactor-fabric connect: {exc}", file=sys.stderr)
        return EXIT_INVALID


def catalog_command(path: str, refresh: bool, as_json: bool, environ: dict[str, str]) -> int:
    """``catalog``: 0 when every service was learned, 1 when some could not be (each says
    why) or the suite is invalid, 2 when the suite cannot be read."""
    suite = read_suite(path)
    if isinstance(suite, int):
        return suite
    store = default_store(environ)

    try:
        runtime = engine_runtime(suite, environ.get("REACTOR_FABRIC_RUNTIME") or None, environ)
    except EngineAddressError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE

    async def learn() -> tuple[Catalog, dict[str, Learned]]:
        try:
            secrets = await trio.to_thread.run_sync(resolve_secrets, suite)
            # (with secrets, their account is looked for: NSS, files)
            identity = await trio.to_thread.run_sync(
                process_identity, new_instance_id(), suite.orchestrator.network, secrets
            )
            async with egress_served(runtime):
                return await learn_catalog(
                    runtime, identity, suite.mcp_services, store, refresh=refresh
                )
        finally:
            await runtime.close()

    catalog, learned = trio.run(learn)
    if as_json:
        texts = service_texts(catalog, suite_facts(suite))
        extra = {
            name: {
                "source": item.source,
                "error": item.offer.error,
                "prompts": list(item.offer.prompts),
                "resources": list(item.offer.resources),
            }
            for name, item in learned.items()
        }
        print(json.dumps(catalog_json(texts, extra=extra), indent=2))
    else:
        for name, item in learned.items():
            if item.offer.error is not None:
                print(f"{name}: not learned: {item.offer.error}")
                continue
            tools = [tool["name"] for tool in catalog.tools_of([name])]
            print(
                f"{name} ({item.source}): {len(tools)} tool(s), {len(item.offer.prompts)} "
                f"prompt(s), {len(item.offer.resources)} resource(s): {', '.join(tools)}"
            )
    return EXIT_INVALID if catalog.errors() else EXIT_OK


def rank_command(path: str, top: int, budget: int | None) -> int:
    """``rank``: 0, or 2 when the catalog cannot be read or is not one."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CATALOG_BYTES + 1)
        if len(data) > MAX_CATALOG_BYTES:
            raise CatalogFormatError(f"larger than {MAX_CATALOG_BYTES} bytes")
        services = services_from_json(json.loads(data))
    except (OSError, ValueError) as exc:
        print(f"reactor-fabric rank: {path}: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    with tokens.held():  # one load of the tokenizer's encoding for the whole catalog
        index = build_index(services, count_tokens=count_definition)
    for line in sys.stdin:
        task = line.strip()
        if not task:
            continue
        started = time.perf_counter()
        ranking = rank_servers(index, task, budget=budget, top=top)
        latency = (time.perf_counter() - started) * 1000.0
        answer = {
            "task": task,
            "recommended_servers": list(ranking.recommended),
            "ranked_servers": [s.name for s in ranking.ranked[: max(0, top)]],
            "confidence": ranking.confidence,
            "latency_ms": round(latency, 4),
        }
        print(json.dumps(answer), flush=True)
    return EXIT_OK


def validate_config(path: str, *, secrets: bool = False) -> int:
    """``validate-config``; with ``secrets``, every secret's source is resolved as the
    orchestrator would at its start (this process's environment and user), each problem
    printed by service, secret and source, never a value."""
    suite = read_suite(path, warnings=True)
    if isinstance(suite, int):
        return suite
    lock_problem = lock_file_problem(path, suite)
    if lock_problem is not None:
        what, problem = lock_problem
        print(f"{lock_path(path)}: {problem}", file=sys.stderr)
        print(f"{path}: invalid ({what})", file=sys.stderr)
        return EXIT_INVALID
    services = ", ".join(suite.mcp_services)
    print(f"{path}: valid ({len(suite.mcp_services)} service(s): {services})")
    if not secrets:
        return EXIT_OK
    resolved = resolve_suite_secrets(suite)
    failed = 0
    for name, service_secrets in resolved.items():
        if service_secrets.reason == _reasons.ACCOUNT_UNAVAILABLE:
            continue  # warned above: valid, refused at run time until the account is defined
        for problem in service_secrets.problems:
            print(f"{path}: service {name}: {problem}", file=sys.stderr)
        failed += len(service_secrets.problems)
        if service_secrets.available:
            names = ", ".join(secret.name for secret in service_secrets.secrets)
            print(f"{path}: service {name}: secrets resolve ({names})")
    if failed:
        print(f"{path}: {failed} secret(s) do not resolve", file=sys.stderr)
        return EXIT_INVALID
    if not resolved:
        print(f"{path}: no service has secrets")
    return EXIT_OK
