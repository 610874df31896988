"""Serving, the command line's default: the suite read (every problem logged and said), then
what serves built from it, each of which may refuse the start (the token, the runtime, the
listening socket, the audit trail of its port, the suite lock), then the process tuned (CPU
slice, allocator, the GIL's switch interval, the start's objects frozen out of the collector's
way) and served until a signal (``_serve_signals.py``)."""

from __future__ import annotations

import errno
import gc
import logging
import os
import socket
import sys
from dataclasses import dataclass

import trio

from . import _token_counter
from ._allocator import tune as tune_allocator
from ._cli_shared import EXIT_CANNOT_LISTEN, EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE
from ._errors import INVALID_SUITE_CONFIGURATION
from ._lock_cli import lock_path, read_lock
from ._operator_cli import open_audit
from ._reasons import (
    AUDIT_UNWRITABLE,
    AUTH_SETUP,
    CANNOT_LISTEN,
    ENGINE_ADDRESS,
    LOCK_UNREADABLE,
    PORT_IN_USE,
    SUITE_UNREADABLE,
)
from ._reasons import INVALID_SUITE_CONFIGURATION as INVALID_SUITE_REASON
from ._runtime_choice import engine_runtime
from ._scheduling import Slice, shorten_slice
from ._serve_signals import serve_until_signalled
from ._version import __version__
from .config.hosts import is_loopback_name as is_loopback
from .config.structs import Suite
from .config.suite import SuiteUnreadable, check_suite_text, read_suite_file
from .config.token import Token, TokenError, load_or_create_token
from .observe.audit import now_iso
from .observe.logging import configure_logging
from .observe.observer import Observer
from .observe.otel import tracing_from_environment
from .policy.sign_in import SignInUnconfigured, sign_in_for
from .protocol.suite_lock import LockInvalid, SuiteLock, lock_mode, missing_lock
from .runtime.base import Runtime
from .runtime.engines import EngineAddressError
from .trio.catalog import default_store
from .trio.serve import Fabric, assemble, bind_listener

# Every log line of a start names this logger (its "logger" field), as before _cli.py was split.
log = logging.getLogger("reactor_fabric.cli")


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


def serve(settings: ServeSettings, environ: dict[str, str] | None = None) -> int:
    # First, before the orchestrator makes threads (the log writer is the first): they
    # inherit it. Those a library made on import get it here.
    cpu_slice = shorten_slice(whole_process=True)
    allocator = tune_allocator()
    _token_counter.use()  # (tiktoken never in this process: see _token_counter)
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
        extra={"reason": LOCK_UNREADABLE, "path": path, "detail": detail},
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
                "reason": SUITE_UNREADABLE,
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
                    "reason": INVALID_SUITE_REASON,
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
        token = _token(settings, suite.orchestrator.auth_settings.mode, environ)
    except TokenError as exc:
        log.error("cannot_authenticate", extra={"reason": AUTH_SETUP, "detail": str(exc)})
        print(f"error: {exc}; not starting", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        runtime = engine_runtime(suite, settings.runtime, environ)
    except EngineAddressError as exc:
        log.error("engine_unusable", extra={"reason": ENGINE_ADDRESS, "detail": str(exc)})
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
        sign_in = None if settings.no_auth else sign_in_for(suite.orchestrator, settings.host, port)
    except SignInUnconfigured as exc:
        log.error("cannot_authenticate", extra={"reason": AUTH_SETUP, "detail": str(exc)})
        print(f"error: {exc}; not starting", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        audit = open_audit(suite, environ, port)
    except OSError as exc:
        log.error("audit_unwritable", extra={"reason": AUDIT_UNWRITABLE, "detail": str(exc)})
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
    # The orchestrator's parts, its settings built once from the suite (and the lock).
    fabric = assemble(
        suite,
        runtime,
        lock=locked if mode != "off" else None,
        lock_mode=mode,
        network=settings.network or suite.orchestrator.network,
        listen_host=settings.host,
        token=token.value if token is not None else None,
        catalog_store=default_store(environ),
        observer=observer,
        replica=settings.replica,
        sign_in=sign_in,
    )
    try:
        return _serve_fabric(fabric, settings, token, cpu_slice, environ, listener=listener)
    finally:
        if audit is not None:
            audit.submit(
                {
                    "ts": now_iso(),
                    "event": "orchestrator_stop",
                    "instance": fabric.starter.identity.instance_id,
                }
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
    # What the start made (modules, the suite and its schemas: most of the objects the
    # collector tracks) lives as long as the process: moved out of the collector's way. A full
    # collection stops every thread, a workspace's copy included, for as long as it walks what
    # it tracks: measured 60-105 ms each before, 15-50 ms after, several times a minute while
    # sessions come and go (docs/BENCHMARKS.md, "Issue 50").
    gc.collect()
    gc.freeze()
    try:
        trio.run(serve_until_signalled, fabric, token, environ, listener)
    except OSError as exc:
        return _cannot_listen(settings, exc)
    return EXIT_OK


def _cannot_listen(settings: ServeSettings, exc: OSError) -> int:
    """Said and logged: the port cannot be had (in use, or the address not available)."""
    reason = PORT_IN_USE if exc.errno == errno.EADDRINUSE else CANNOT_LISTEN
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
        + (" (choose another with --port or REACTOR_FABRIC_PORT)" if reason == PORT_IN_USE else ""),
        file=sys.stderr,
    )
    return EXIT_CANNOT_LISTEN


def _token(settings: ServeSettings, auth: str, environ: dict[str, str]) -> Token | None:
    """The token clients must present, or None when authentication is off (loopback only) or
    users sign in instead (``oidc``: the orchestrator has no token of its own)."""
    if auth == "oidc" and not settings.no_auth:
        return None
    if settings.no_auth or auth == "none":
        if not is_loopback(settings.host):
            raise TokenError(
                f"authentication is off (--no-auth or orchestrator.auth: none), which is only "
                f"allowed on a loopback address, not on {settings.host!r}: anyone who reaches "
                "the port could start containers with mounts"
            )
        return None
    return load_or_create_token(environ, settings.token)
