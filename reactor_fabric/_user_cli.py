"""The users' commands besides serving and the lock (as ``_operator_cli.py`` holds the
operators'): ``validate-config`` (a suite checked, its secrets resolved), ``connect`` (the stdio
bridge's entry), ``catalog`` (what every service offers, learned by a probe when the cache does
not have it) and ``rank`` (a catalog's servers ranked for tasks, offline)."""

from __future__ import annotations

import argparse
import functools
import json
import pwd
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import trio

from ._cli_shared import EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE, read_suite
from ._errors import FabricError, SecurityViolation
from ._lock_cli import lock_file_problem, lock_path
from ._reasons import ACCOUNT_UNAVAILABLE, ISOLATION_UNAVAILABLE
from ._runtime_choice import egress_served, engine_runtime
from .config.secrets import resolve_suite_secrets
from .config.settings import suite_facts
from .config.structs import Suite
from .config.token import TokenError
from .config.token_record import find_bridge_token, searched
from .discovery import build_index, rank_servers, tokens
from .discovery.catalog_file import CatalogFormatError, catalog_json, services_from_json
from .discovery.tokens import count_definition
from .policy.container_parts.isolation import resolved_isolation
from .protocol.catalog import Catalog
from .protocol.fabric_discovery import service_texts
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
from .trio.identity import new_instance_id, process_identity, resolve_secrets

MAX_CATALOG_BYTES = 256 * 1024 * 1024


def _account_uid(name: str) -> int:
    """``--orchestrator-user``: a uid, or an account name looked up in the password database."""
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise BridgeError(f"--orchestrator-user {name!r}: no such account") from None


def login_command(args: argparse.Namespace, environ: dict[str, str]) -> int:
    """``login URL``: sign in to the orchestrator at URL now (auth.mode: oidc), so that the
    bridge finds the sign-in kept (it signs in by itself too, when it can open a browser)."""
    if not args.url:
        print(
            "error: give the orchestrator's URL (or set REACTOR_FABRIC_ENDPOINT)", file=sys.stderr
        )
        return EXIT_INVALID
    parts = urlsplit(args.url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.netloc:
        print(f"error: {args.url!r} is not an http:// or ws:// URL", file=sys.stderr)
        return EXIT_INVALID
    base = f"{scheme}://{parts.netloc}"
    from .trio.sign_in_client import SignInClient, SignInError  # noqa: PLC0415 (httpx)

    def notify(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    client = SignInClient(
        environ, base, login="device" if args.device else "browser", notify=notify
    )
    metadata = f"{base}/.well-known/oauth-protected-resource/mcp"
    try:
        trio.run(functools.partial(client.access_token, metadata, fresh=True))
    except SignInError as exc:
        print(f"error: signing in failed: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(f"signed in to {base}; the bridge (reactor-fabric connect) will use this sign-in")
    return EXIT_OK


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
            login=args.login,
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


def isolation_check(path: str, suite: Suite, environ: dict[str, str]) -> int:
    """What each service that asks for gVisor would run under on the engine the orchestrator
    would use, found as its start finds it (its runtimes, and a container created and removed,
    never started); EXIT_INVALID when one would be refused ``isolation_unavailable``."""
    wanting = {n: s for n, s in suite.mcp_services.items() if s.isolation_in_force != "runc"}
    if not wanting:
        print(f"{path}: no service asks for gVisor")
        return EXIT_OK
    try:
        runtime = engine_runtime(suite, environ.get("REACTOR_FABRIC_RUNTIME") or None, environ)
    except EngineAddressError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return EXIT_INVALID

    async def ask() -> None:
        labels = {"reactor-fabric.managed": "true", "reactor-fabric.session": "validate-config"}
        try:
            await runtime.ping()
            await runtime.verify_isolation(next(iter(wanting.values())).image, labels)
        finally:
            await runtime.close()

    try:
        trio.run(ask)
    except FabricError as exc:
        print(f"{path}: the engine did not answer: {exc}", file=sys.stderr)
        return EXIT_INVALID
    capabilities, refused = runtime.capabilities, 0
    for name, service in wanting.items():
        runs_under = resolved_isolation(service, capabilities)
        asked = service.isolation_in_force
        if runs_under == "unavailable":
            refused += 1
            print(
                f"{path}: service {name}: {ISOLATION_UNAVAILABLE}: asks for isolation: gvisor, "
                f"and {capabilities.gvisor_missing}",
                file=sys.stderr,
            )
        elif runs_under == "runc":
            print(
                f"{path}: service {name}: runs under runc ({asked}: {capabilities.gvisor_missing})"
            )
        else:
            print(f"{path}: service {name}: runs under gVisor ({capabilities.gvisor_runtime})")
    return EXIT_INVALID if refused else EXIT_OK


def validate_config(
    path: str,
    *,
    secrets: bool = False,
    engine: bool = False,
    environ: dict[str, str] | None = None,
) -> int:
    """``validate-config``; with ``secrets``, every secret's source is resolved as the
    orchestrator would at its start (this process's environment and user), each problem
    printed by service, secret and source, never a value; with ``engine``, the engine is asked
    what each service asking for gVisor would run under (:func:`isolation_check`)."""
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
    if engine:
        found = isolation_check(path, suite, environ or {})
        if found != EXIT_OK or not secrets:
            return found
    if not secrets:
        return EXIT_OK
    resolved = resolve_suite_secrets(suite)
    failed = 0
    for name, service_secrets in resolved.items():
        if service_secrets.reason == ACCOUNT_UNAVAILABLE:
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
