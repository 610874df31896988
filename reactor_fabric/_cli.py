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
import errno
import json
import logging
import os
import pwd
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from . import _reasons
from ._allocator import tune as tune_allocator
from ._cli_shared import (
    EXIT_CANNOT_LISTEN,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNREADABLE,
    optional_suite,
    read_suite,
)
from ._errors import INVALID_SUITE_CONFIGURATION, SecurityViolation
from ._lock_cli import lock_command, lock_file_problem, lock_path, read_lock
from ._operator_cli import (
    DEFAULT_PORT,
    add_operator_commands,
    audit_command,
    open_audit,
    sessions_command,
)
from ._runtime_choice import RUNTIME_NAMES, egress_served, engine_runtime
from ._scheduling import Slice, shorten_slice
from ._version import __version__
from .config.secrets import resolve_suite_secrets
from .config.structs import Suite
from .config.suite import SuiteUnreadable, check_suite_text, read_suite_file
from .config.token import Token, TokenError, load_or_create_token
from .config.token_record import (
    TokenRecord,
    find_bridge_token,
    remove_record,
    searched,
    write_record,
)
from .discovery import build_index, rank_servers, tokens
from .discovery.catalog_file import CatalogFormatError, catalog_json, services_from_json
from .discovery.tokens import count_definition
from .observe.audit import now_iso
from .observe.logging import LOG_LEVELS, configure_logging
from .observe.observer import Observer
from .observe.otel import tracing_from_environment
from .policy.auth import is_loopback
from .protocol.catalog import Catalog
from .protocol.fabric_discovery import service_texts
from .protocol.suite_lock import (
    LOCK_FILE,
    LockInvalid,
    SuiteLock,
    lock_mode,
    missing_lock,
)
from .runtime.base import Runtime
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
    Fabric,
    new_instance_id,
    process_identity,
    resolve_secrets,
    suite_facts,
)
from .trio.serve import Orchestrator, bind_listener, serve_orchestrator

log = logging.getLogger("reactor_fabric.cli")

MAX_CATALOG_BYTES = 256 * 1024 * 1024

DEFAULT_CONFIG = "claude-mcp-suite.yaml"
DEFAULT_HOST = "127.0.0.1"
# Seconds a thread may hold the GIL while another waits for it (see _serve_fabric).
GIL_SWITCH_INTERVAL = 0.0005


@dataclass(frozen=True)
class ServeSettings:
    config: str
    host: str
    port: int
    network: str | None
    log_level: str
    token: str | None = None
    no_auth: bool = False
    runtime: str | None = None
    replica: str | None = None


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


def serve(settings: ServeSettings, environ: dict[str, str] | None = None) -> int:
    # First, before the orchestrator makes threads (the log writer is the first): they
    # inherit it. Those a library made on import get it here.
    cpu_slice = shorten_slice(whole_process=True)
    allocator = tune_allocator()
    stop_logging = configure_logging(settings.log_level)
    if not allocator.tuned:
        log.info("allocator_untuned", extra={"reason": allocator.reason})
    try:
        return _serve(settings, dict(os.environ if environ is None else environ), cpu_slice)
    finally:
        stop_logging()  # writes what is still queued


def _serving_lock(config: str, setting: str | None) -> SuiteLock | int | None:
    """The suite lock to serve with (None: no lock file, and ``orchestrator.lock`` unset or
    ``off``); an exit code, logged and said, when it cannot be read, or when there is none and
    the suite says ``enforce`` or ``warn``: serving as if there were none would drop the check
    it asks for."""
    try:
        locked = read_lock(config)
    except (OSError, LockInvalid) as exc:
        return _lock_unreadable(config, str(exc))
    missing = missing_lock(setting) if locked is None else None
    if missing is not None:
        return _lock_unreadable(config, missing)
    return locked


def _lock_unreadable(config: str, detail: str) -> int:
    path = str(lock_path(config))
    log.error(
        "lock_unreadable",
        extra={"reason": _reasons.LOCK_UNREADABLE, "path": path, "detail": detail},
    )
    print(f"error: {path}: {detail}; not starting", file=sys.stderr)
    return EXIT_UNREADABLE


def _serve(settings: ServeSettings, environ: dict[str, str], cpu_slice: Slice) -> int:
    try:
        text = read_suite_file(settings.config)
    except SuiteUnreadable as exc:
        log.error(
            "suite_unreadable",
            extra={
                "code": INVALID_SUITE_CONFIGURATION,
                "reason": _reasons.SUITE_UNREADABLE,
                "detail": str(exc),
            },
        )
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    check = check_suite_text(text, source=settings.config)
    if check.suite is None:
        for issue in check.issues:
            log.error(
                "invalid_suite_configuration",
                extra={
                    "code": INVALID_SUITE_CONFIGURATION,
                    "reason": _reasons.INVALID_SUITE_CONFIGURATION,
                    "file": issue.file,
                    "line": issue.line,
                    "column": issue.column,
                    "key": issue.path,
                    "detail": issue.message,
                },
            )
        print(f"error: {settings.config} is not a valid suite; not starting:", file=sys.stderr)
        for issue in check.issues:
            print(f"  {issue}", file=sys.stderr)
        return EXIT_INVALID
    for warning in check.warnings:
        log.warning(
            "suite_warning",
            extra={
                "file": warning.file,
                "line": warning.line,
                "column": warning.column,
                "key": warning.path,
                "detail": warning.message,
            },
        )
    return _serve_suite(settings, check.suite, environ, cpu_slice)


def _serve_suite(
    settings: ServeSettings, suite: Suite, environ: dict[str, str], cpu_slice: Slice
) -> int:
    """Serve a valid suite: its token, engine, lock and audit trail first (each may refuse)."""
    try:
        token = _token(settings, suite.orchestrator.auth, environ)
    except TokenError as exc:
        log.error("cannot_authenticate", extra={"reason": _reasons.AUTH_SETUP, "detail": str(exc)})
        print(f"error: {exc}; not starting", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        runtime = engine_runtime(suite, settings.runtime, environ)
    except EngineAddressError as exc:
        log.error("engine_unusable", extra={"reason": _reasons.ENGINE_ADDRESS, "detail": str(exc)})
        print(f"error: {exc}; not starting", file=sys.stderr)
        return EXIT_UNREADABLE
    # Bound before the trail opens: an instance's default trail is keyed by the port it
    # listens on (for --port 0, the one it got), so two instances never share one.
    try:
        listener = bind_listener(settings.host, settings.port)
    except OSError as exc:
        return _cannot_listen(settings, exc)
    with listener:
        return _serve_bound(
            settings, suite, environ, cpu_slice, token=token, runtime=runtime, listener=listener
        )


def _serve_bound(
    settings: ServeSettings,
    suite: Suite,
    environ: dict[str, str],
    cpu_slice: Slice,
    *,
    token: Token | None,
    runtime: Runtime,
    listener: socket.socket,
) -> int:
    """Serve on ``listener``: the audit trail of its port and the lock first (each may refuse)."""
    port = int(listener.getsockname()[1])
    try:
        audit = open_audit(suite, environ, port)
    except OSError as exc:
        log.error(
            "audit_unwritable", extra={"reason": _reasons.AUDIT_UNWRITABLE, "detail": str(exc)}
        )
        print(
            f"error: the audit trail cannot be written: {exc}; not starting (set "
            "orchestrator.audit.path, or orchestrator.audit.enabled: false)",
            file=sys.stderr,
        )
        return EXIT_UNREADABLE
    observer = Observer(
        services=suite.mcp_services,
        audit=audit,
        tracing=tracing_from_environment(environ),
    )
    if audit is not None:
        log.info("audit_trail", extra={"path": str(audit.path)})
        audit.submit(
            {
                "ts": now_iso(),
                "event": "orchestrator_start",
                "version": __version__,
                "pid": os.getpid(),
                "listen": f"{settings.host}:{port}",
            }
        )
    locked = _serving_lock(settings.config, suite.orchestrator.lock)
    if isinstance(locked, int):
        return locked
    mode = lock_mode(suite.orchestrator.lock, locked is not None)
    if locked is not None:
        log.info("suite_lock", extra={"path": str(lock_path(settings.config)), "mode": mode})
    fabric = Fabric(
        suite=suite,
        lock=locked if mode != "off" else None,
        lock_mode=mode,
        runtime=runtime,
        network=settings.network or suite.orchestrator.network,
        listen_host=settings.host,
        token=token.value if token is not None else None,
        catalog_store=default_store(environ),
        observer=observer,
        replica=settings.replica,
    )
    try:
        return _serve_fabric(fabric, settings, token, cpu_slice, environ, listener=listener)
    finally:
        if audit is not None:
            audit.submit(
                {"ts": now_iso(), "event": "orchestrator_stop", "instance": fabric.instance_id}
            )
        observer.close()


def _serve_fabric(
    fabric: Fabric,
    settings: ServeSettings,
    token: Token | None,
    cpu_slice: Slice,
    environ: dict[str, str],
    *,
    listener: socket.socket,
) -> int:
    if cpu_slice.shortened:
        log.info(
            "cpu_slice_shortened",
            extra={"slice_us": (cpu_slice.ns or 0) / 1000, "threads": cpu_slice.threads},
        )
    else:
        log.info(
            "cpu_slice_unchanged",
            extra={"reason": cpu_slice.reason, "slice_us": (cpu_slice.ns or 0) / 1000 or None},
        )
    # The event loop shares the GIL with worker threads (engine calls, the audit writer, the
    # log writer). A thread busy in Python keeps it until the switch interval ends: 5 ms by
    # default, which a relayed message then waits on top of its own time. Measured: with
    # refills' engine calls running, that was the orchestrator's own share of a live session's
    # P99 (docs/BENCHMARKS.md, the warm pool). A shorter interval bounds the wait; the cost is
    # more frequent hand-overs while two threads both compute, which is rare here.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    try:
        trio.run(_serve_until_signalled, fabric, settings, token, environ, listener)
    except OSError as exc:
        return _cannot_listen(settings, exc)
    return EXIT_OK


def _cannot_listen(settings: ServeSettings, exc: OSError) -> int:
    """Said and logged: the port cannot be had (in use, or the address not available)."""
    reason = _reasons.PORT_IN_USE if exc.errno == errno.EADDRINUSE else _reasons.CANNOT_LISTEN
    log.error(
        "cannot_listen",
        extra={
            "reason": reason,
            "host": settings.host,
            "port": settings.port,
            "detail": str(exc),
        },
    )
    print(
        f"error: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
        + (
            " (choose another with --port or REACTOR_FABRIC_PORT)"
            if reason == _reasons.PORT_IN_USE
            else ""
        ),
        file=sys.stderr,
    )
    return EXIT_CANNOT_LISTEN


def connection_help(http_url: str, fabric: Fabric, token: Token | None) -> str:
    """What the start-up line adds: the URLs to paste into a client, with the token. The fabric
    endpoint (every service in one MCP server) comes first: it is what most users want."""
    service = next(iter(fabric.suite.mcp_services), "SERVICE")
    if token is None:
        return (
            f"  authentication is OFF: any local process may connect "
            f"(e.g. {http_url}/mcp, or {http_url}/mcp/{service} for one service)"
        )
    ws_url = "ws" + http_url.removeprefix("http")
    return "\n".join(
        [
            f"  token (from {token.origin}): {token.value}",
            f"  every service in one MCP server: {http_url}/mcp with the header "
            f"'Authorization: Bearer {token.value}', or {http_url}/mcp?token={token.value} "
            f"(WebSocket: {ws_url}/mcp?token={token.value})",
            f"  Claude Code: claude mcp add --transport http reactor-fabric {http_url}/mcp "
            f"--header 'Authorization: Bearer {token.value}'",
            f"  one service: {http_url}/mcp/{{service}}?token={token.value} "
            f"(WebSocket: {ws_url}/mcp/{{service}}?token={token.value}), or the header",
            f"  stdio bridge (reads the token itself): reactor-fabric connect {ws_url} "
            f"[--service {service}]",
        ]
    )


def _token(settings: ServeSettings, auth: str, environ: dict[str, str]) -> Token | None:
    """The token clients must present, or None when authentication is off (loopback only)."""
    if settings.no_auth or auth == "none":
        if not is_loopback(settings.host):
            raise TokenError(
                f"authentication is off (--no-auth or orchestrator.auth: none), which is only "
                f"allowed on a loopback address, not on {settings.host!r}: anyone who reaches "
                "the port could start containers with mounts"
            )
        return None
    return load_or_create_token(environ, settings.token)


def _record_token(environ: dict[str, str], port: int, token: Token | None) -> TokenRecord | None:
    """The port's token record for the stdio bridge (config.token_record); None without
    authentication or when it cannot be written safely (then a bridge needs the variable or
    the default file, and the warning says why)."""
    if token is None:
        return None
    try:
        record = write_record(environ, port, token.value)
    except TokenError as exc:
        log.warning(
            "token_record_unwritable", extra={"reason": _reasons.AUTH_SETUP, "detail": str(exc)}
        )
        return None
    log.info("token_recorded", extra={"path": str(record.path)})
    return record


async def _serve_until_signalled(
    fabric: Fabric,
    settings: ServeSettings,
    token: Token | None,
    environ: dict[str, str],
    listener: socket.socket,
) -> None:
    """Serve; the first SIGINT/SIGTERM stops gracefully (bounded), a second one at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        # Recorded once the port is ours (and known, for --port 0), before the start-up line:
        # a bridge started after it finds the token. Removed at every exit (a killed
        # orchestrator's record is replaced by the next start on the port).
        record = _record_token(environ, listener.getsockname()[1], token)
        try:
            async with trio.open_nursery() as nursery:

                async def serve(*, task_status: trio.TaskStatus[Orchestrator]) -> None:
                    await serve_orchestrator(fabric, listener, task_status=task_status)
                    nursery.cancel_scope.cancel()  # the shutdown is over: stop watching signals

                running: Orchestrator = await nursery.start(serve)
                print(
                    f"Reactor-Fabric {__version__} serving {len(fabric.suite.mcp_services)} "
                    f"service(s) on {running.http_url} (all in one: {running.http_url}/mcp; "
                    f"health: {running.http_url}/healthz)",
                    flush=True,
                )
                print(connection_help(running.http_url, fabric, token), flush=True)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if fabric.stopping.is_set():
                        log.warning("stopping_now", extra={"signal": name})
                        nursery.cancel_scope.cancel()
                        return
                    log.info("signal_received", extra={"signal": name})
                    running.stop()
        finally:
            if record is not None:
                remove_record(record)
