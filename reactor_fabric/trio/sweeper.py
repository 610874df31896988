"""Removal of containers nobody owns any more (crash recovery).

Ownership tree: :func:`run_sweeper` runs in the orchestrator's root nursery. At start-up (before
the orchestrator reports itself serving) and then periodically it removes:

- containers of *other* orchestrator instances whose owning process is gone (it was killed, or
  the machine restarted) — see :mod:`..policy.owner`;
- containers of *this* instance that belong to no live session and are older than a grace
  period (a spawn abandoned half-way, a removal that failed).

Alongside its rounds, in a task of its own, it removes as they come the containers whose
removal a teardown's bound cut short (:class:`DeferredRemovals`: a burst of sessions ending
queues its removals behind a busy engine, and a teardown does not wait past its bound): they
are known to be nobody's, so neither a round nor the grace for young containers is waited for.

Error handling: an unreachable engine only postpones the sweep; it never stops the orchestrator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from .._errors import FabricError
from ..policy.container_parts.ownership import LABEL_INSTANCE, LABEL_SESSION
from ..policy.owner import owner_is_gone
from ..runtime.base import ManagedContainer, Runtime

log = logging.getLogger(__name__)

SWEEP_INTERVAL_SECONDS = 60.0
# A container of this instance younger than this may be a spawn still in progress.
OWN_GRACE_SECONDS = 120.0
# Deferred removals waiting at once (more are left to the next round), and removed at once
# (the engine client has 16 call slots; sessions starting meanwhile need some).
MAX_DEFERRED = 4096
DEFERRED_AT_ONCE = 8


class DeferredRemovals:
    """Ids of containers whose removal was cut short, for the sweeper to remove next.

    Bounded: at most :data:`MAX_DEFERRED` wait; one more is refused (``defer`` says so) and
    left to the sweeper's next round, which finds it by its labels anyway.
    """

    def __init__(self, limit: int = MAX_DEFERRED) -> None:
        self._ids: dict[str, None] = {}  # (ordered: removed oldest first)
        self._limit = limit
        self._arrived = trio.Event()

    def __len__(self) -> int:
        return len(self._ids)

    def defer(self, container_id: str) -> bool:
        if container_id not in self._ids and len(self._ids) >= self._limit:
            return False
        self._ids[container_id] = None
        self._arrived.set()
        return True

    def take(self) -> list[str]:
        """Every id waiting (oldest first); none wait after."""
        taken = list(self._ids)
        self._ids.clear()
        if self._arrived.is_set():
            self._arrived = trio.Event()
        return taken

    async def wait(self) -> None:
        """Until an id waits."""
        await self._arrived.wait()


async def remove_deferred(runtime: Runtime, ids: list[str]) -> None:
    """Remove ``ids``, :data:`DEFERRED_AT_ONCE` at a time (each bounded by the engine
    client's call bound; an engine error is logged by the runtime, never raised)."""
    limiter = trio.CapacityLimiter(DEFERRED_AT_ONCE)

    async def remove(container_id: str) -> None:
        async with limiter:
            await runtime.remove(container_id)
        log.info("deferred_removal_done", extra={"container": container_id[:12]})

    async with trio.open_nursery() as nursery:
        for container_id in ids:
            nursery.start_soon(remove, container_id)


def containers_to_remove(
    containers: list[ManagedContainer],
    *,
    instance_id: str,
    this_host: str,
    live_sessions: set[str],
    now: float,
    live_containers: frozenset[str] | set[str] = frozenset(),
    owner_gone: Callable[..., bool] = owner_is_gone,
) -> list[tuple[str, str]]:
    """(container id, why) for each container that should go. Pure.

    A container of this instance is kept while its session lives, or while it is in
    ``live_containers`` (the warm pool's, which belong to no session until handed out).
    """
    doomed: list[tuple[str, str]] = []
    for container in containers:
        labels = container.labels
        container_id = container.id
        if labels.get(LABEL_INSTANCE) == instance_id:
            age = now - (container.created or now)
            owned = labels.get(LABEL_SESSION) in live_sessions or container_id in live_containers
            if not owned and age > OWN_GRACE_SECONDS:
                doomed.append((container_id, "no_live_session"))
        elif owner_gone(labels, this_host=this_host):
            doomed.append((container_id, "owner_gone"))
    return doomed


async def sweep_once(
    runtime: Runtime,
    *,
    instance_id: str,
    this_host: str,
    live_sessions: set[str],
    live_containers: Callable[[], set[str]] = set,
) -> int:
    """Remove what :func:`containers_to_remove` selects; the number removed."""
    containers = await runtime.list_managed()
    doomed = containers_to_remove(
        containers,
        instance_id=instance_id,
        this_host=this_host,
        live_sessions=live_sessions,
        # Asked after the listing: a container handed out meanwhile is in one or the other.
        live_containers=live_containers(),
        now=time.time(),
    )
    for container_id, why in doomed:
        log.warning("orphan_removed", extra={"container": container_id[:12], "why": why})
        await runtime.remove(container_id)
    return len(doomed)


async def remove_instance_containers(runtime: Runtime, instance_id: str) -> int:
    """Remove every container of this instance, in parallel (the last step of a shutdown)."""
    containers = await runtime.list_managed({LABEL_INSTANCE: instance_id})
    async with trio.open_nursery() as nursery:
        for container in containers:
            nursery.start_soon(runtime.remove, container.id)
    return len(containers)


async def run_sweeper(
    runtime: Runtime,
    *,
    instance_id: str,
    this_host: str,
    live_sessions: Callable[[], set[str]],
    live_containers: Callable[[], set[str]] = set,
    interval: float = SWEEP_INTERVAL_SECONDS,
    on_removed: Callable[[int], object] = lambda _count: None,
    deferred: DeferredRemovals | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Sweep now, report started, then sweep every ``interval`` seconds until cancelled, and
    meanwhile remove the ``deferred`` as they come (in a task of their own: a round that
    waits on a busy engine does not hold them up); ``on_removed`` hears how many orphans
    each sweep removed (the metrics). A container both remove is removed once (the second
    finds it gone)."""
    async with trio.open_nursery() as nursery:
        if deferred is not None:
            nursery.start_soon(_remove_deferred_as_they_come, runtime, deferred)
        started = False
        while True:
            try:
                removed = await sweep_once(
                    runtime,
                    instance_id=instance_id,
                    this_host=this_host,
                    live_sessions=live_sessions(),
                    live_containers=live_containers,
                )
                if removed:
                    log.info("sweep_done", extra={"removed": removed})
                    on_removed(removed)
            except FabricError as exc:
                log.warning("sweep_postponed", extra={"reason": exc.reason, "detail": str(exc)})
            if not started:
                task_status.started()
                started = True
            await trio.sleep(interval)


async def _remove_deferred_as_they_come(runtime: Runtime, deferred: DeferredRemovals) -> None:
    while True:
        await deferred.wait()
        await remove_deferred(runtime, deferred.take())
