"""The suite lock on the command line: ``lock`` writes it beside the suite, ``lock --check``
compares the services as learned now with it (protocol/suite_lock.py decides what differs);
reading the lock file, for those, for ``validate-config`` and for serving."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import trio

from ._cli_shared import EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE, read_suite
from ._runtime_choice import egress_served, engine_runtime
from .config.structs import Suite
from .protocol.suite_lock import (
    LOCK_FILE,
    MAX_LOCK_BYTES,
    Drift,
    LockInvalid,
    SuiteLock,
    compare_image,
    compare_offer,
    lock_text,
    missing_lock,
    parse_lock,
    service_lock,
)
from .runtime.engines import EngineAddressError
from .trio.catalog import Learned, default_store, learn_catalog
from .trio.identity import new_instance_id, process_identity


def lock_path(config: str) -> Path:
    """The suite lock's file: beside the suite."""
    return Path(config).parent / LOCK_FILE


def read_lock(config: str) -> SuiteLock | None:
    """The suite's lock (None: there is no lock file); OSError or LockInvalid when it cannot
    be read or is not one."""
    path = lock_path(config)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_LOCK_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_LOCK_BYTES:
        raise LockInvalid(f"larger than {MAX_LOCK_BYTES} bytes")
    return parse_lock(data)


def lock_command(path: str, check: bool, environ: dict[str, str]) -> int:
    """``lock``: write the lock (0; 1 when a service cannot be learned, nothing written);
    ``lock --check``: 0 when everything is as locked, 1 on drift (printed), 2 when the suite
    or the lock cannot be read."""
    suite = read_suite(path)
    if isinstance(suite, int):
        return suite
    locked: SuiteLock | None = None
    if check:
        try:
            locked = read_lock(path)
        except (OSError, LockInvalid) as exc:
            locked = None
            print(f"error: {lock_path(path)}: {exc}", file=sys.stderr)
        if locked is None:
            print(f"error: {lock_path(path)}: no lock to check (run 'lock' first)", file=sys.stderr)
            return EXIT_UNREADABLE
    learned = learn_for_lock(suite, environ)
    if isinstance(learned, int):
        return learned
    failed = {name: item.offer.error for name, item in learned.items() if item.offer.error}
    for name, error in failed.items():
        print(f"{name}: not learned: {error}", file=sys.stderr)
    if locked is not None:
        return _check_lock(path, suite, locked, learned, failed=bool(failed))
    if failed:
        print(f"{lock_path(path)}: not written", file=sys.stderr)
        return EXIT_INVALID
    entries = {
        name: service_lock(suite.mcp_services[name].image, item.image_id, item.offer)
        for name, item in learned.items()
    }
    target = lock_path(path)
    scratch = target.with_name(f".{target.name}.{os.getpid()}")
    scratch.write_text(lock_text(entries))
    scratch.replace(target)  # whole or not at all
    print(f"{target}: {len(entries)} service(s) locked")
    return EXIT_OK


def learn_for_lock(suite: Suite, environ: dict[str, str]) -> dict[str, Learned] | int:
    """Every service's offer and image id, as the orchestrator learns them at start-up (the
    catalog probe, and its cache keyed by the image id); an exit code when the engine's
    address is not usable."""
    try:
        runtime = engine_runtime(suite, environ.get("REACTOR_FABRIC_RUNTIME") or None, environ)
    except EngineAddressError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE

    async def learn() -> dict[str, Learned]:
        try:
            identity = process_identity(new_instance_id(), suite.orchestrator.network)
            async with egress_served(runtime):
                _catalog, learned = await learn_catalog(
                    runtime, identity, suite.mcp_services, default_store(environ)
                )
            return learned
        finally:
            await runtime.close()

    return trio.run(learn)


def lock_drift(suite: Suite, locked: SuiteLock, learned: Mapping[str, Learned]) -> list[Drift]:
    """Everything the services, as learned, differ from the lock in (``lock --check``)."""
    drifts: list[Drift] = []
    for name, item in learned.items():
        image = compare_image(name, suite.mcp_services[name].image, locked, item.image_id)
        drifts += [image] if image is not None else []
        drifts += compare_offer(name, locked, item.offer)
    drifts += [
        Drift(name, "service", name, "removed")
        for name in locked.unknown_services(suite.mcp_services)
    ]
    return drifts


def _check_lock(
    path: str, suite: Suite, locked: SuiteLock, learned: Mapping[str, Learned], *, failed: bool
) -> int:
    drifts = lock_drift(suite, locked, learned)
    for drift in drifts:
        print(drift.describe())
    if drifts or failed:
        return EXIT_INVALID
    print(f"{lock_path(path)}: every service as locked")
    return EXIT_OK


def lock_file_problem(path: str, suite: Suite) -> tuple[str, str] | None:
    """What is wrong with the suite's lock file, if anything (what, then the problem): one that
    cannot be read, names services the suite lacks, or is missing while the suite says
    ``orchestrator.lock: enforce`` or ``warn`` (the orchestrator would not start)."""
    try:
        locked = read_lock(path)
    except (OSError, LockInvalid) as exc:
        return "its lock cannot be read", str(exc)
    if locked is None:
        missing = missing_lock(suite.orchestrator.lock)
        return None if missing is None else ("its lock is missing", missing)
    unknown = locked.unknown_services(suite.mcp_services)
    if unknown:
        return "1 problem(s)", (
            f"names service(s) the suite lacks: {', '.join(unknown)} (run 'lock' again)"
        )
    return None
