"""A session's container and the I/O both endpoints' drivers do with it the same way: its start
(from the warm pool when one fits), its audit, how it exited, and its removal. The running
container's own state and its stderr reading are in :mod:`.live_container`.

Resource handling: :func:`remove_container` is shielded and bounded by the orchestrator's
teardown deadline, runs once per container (a second caller waits for the first), and always
unregisters the container, even when the engine could not be reached.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio

from .._errors import FabricError
from ..config.structs import Service
from ..observe.observer import Observer
from ..policy.child_grant import ChildGrant
from ..policy.git_guard import guards_git
from ..policy.mount_spec import MountSpec
from ..protocol.events import BackendKey, CallRef
from ..protocol.framing import FramingError
from ..protocol.tool_calls import ToolCall, ToolCallDone
from ..runtime.base import Container
from .fabric import ContainerRecord, Fabric, SessionRecord
from .live_container import READ_CHUNK, LiveContainer
from .pooled import HandedOut

log = logging.getLogger(__name__)

# Closing stdin asks a stdio server to exit; after this it is stopped (SIGTERM, then SIGKILL).
STDIN_CLOSE_GRACE_SECONDS = 0.5
STOP_GRACE_SECONDS = 2.0
# After a container's stdout ends, how long its stderr reader may take to log the last lines
# (they explain the exit, and go into the error the client gets).
STDERR_DRAIN_SECONDS = 1.0


async def start_container(
    fabric: Fabric,
    service_name: str,
    service: Service,
    *,
    session_id: str,
    mounts: tuple[MountSpec, ...],
    sequence: int,
    fields: dict[str, Any],
    respawn: bool,
    greeted: bool = False,
    call: CallRef | None = None,
    session: SessionRecord | None = None,
) -> Container:
    """Start a container of ``service`` for a session, registered, logged and audited
    (``respawn``: the session had one of this service before); FabricError if it cannot start.

    The mounts are validated again and pinned at every start (respawns too): the container
    gets the very directories the session was granted, or this start fails with -32004. A
    service with a warm pool hands over one of its started containers when one fits (see
    :mod:`.warm_pool`); otherwise a fresh one is started. ``greeted``: the caller skips the
    handshake with a container the pool greeted (see :meth:`.warm_pool.WarmPool.take`);
    ``call``: the one call the container is started for (fresh_per_call), named in its audit
    record.

    An agent that ``uses`` services gets a child session of ``session`` (the starting
    session's record): a grant made here, before the container exists (its token is in the
    container's environment), and revoked if the start fails, else at its removal
    (:func:`remove_container`). Such a container is never a pooled one: a pooled container was
    made before anyone could grant it anything.
    """
    began = trio.current_time()
    # The suite lock: no container from an image whose digest changed (enforce).
    await fabric.check_image(service_name, service)
    # No container writes the user's .git unless its service must (policy/git_guard.py):
    # never an agent's, nor one of an agent's child session.
    guard_git = guards_git(service, child_session=session is not None and session.depth > 0)
    pins, account, mounts = await fabric.prepare_start(mounts, guard_git=guard_git)
    child = _child_grant(fabric, service_name, service, session, call)
    container: Container | None = None
    if fabric.pool is not None and child is None:
        # A started one from the warm pool, the session's mounts attached (owns the pins
        # unless it has none that fits).
        container = await fabric.pool.take(
            service_name,
            service,
            account=account,
            mounts=mounts,
            pins=pins,
            fields=fields,
            greeted=greeted,
        )
    pooled = container is not None
    if container is None:
        spec = fabric.container_spec(
            service_name,
            service,
            session_id=session_id,
            mounts=mounts,
            sequence=sequence,
            account=account,
            child_token=child.token if child is not None else None,
        )
        if child is not None:
            child = replace(child, container_name=spec.name)
            fabric.grant_child(child)
        try:
            container = await fabric.runtime.spawn(spec, pins)  # owns the pins from here
        except BaseException:
            if child is not None:
                fabric.revoke_child(child.container_name)
            raise
    seconds = trio.current_time() - began
    fabric.container_started(
        container.id,
        ContainerRecord(session_id, service_name, container.name, service.image, time.time()),
    )
    fabric.observer.container_started(
        session=session_id,
        service=service_name,
        container=container.id[:12],
        image=service.image,
        seconds=seconds,
        respawn=respawn,
        pooled=pooled,
        call=call.record() if call is not None else None,
    )
    log.info(
        "container_started",
        extra={
            **fields,
            "container": container.id[:12],
            "container_name": container.name,
            "sequence": sequence,
            "pooled": pooled,
            # Its handshake was done while it waited in the pool: none at this call.
            "greeted": isinstance(container, HandedOut) and container.greeting is not None,
        },
    )
    return container


def _child_grant(
    fabric: Fabric,
    service_name: str,
    service: Service,
    session: SessionRecord | None,
    call: CallRef | None,
) -> ChildGrant | None:
    """The grant of an agent's child session, if it gets one (it uses services, the runtime
    can give its container the socket, and the depth limit leaves it some); its container's
    name is set once the spec names it."""
    if session is None or not service.uses or fabric.runtime.children is None:
        return None
    depth = session.depth + 1
    services = fabric.child_services(service, depth)
    if not services:
        return None
    return ChildGrant(
        token=secrets.token_urlsafe(32),
        container_name="",
        agent=service_name,
        parent_session=session.id,
        parent_call=call,
        trace_id=session.trace_id,
        mounts=session.mounts,
        services=services,
        depth=depth,
    )


def audit_call(
    fabric: Fabric,
    record: SessionRecord,
    call: ToolCall | ToolCallDone,
    *,
    service: str,
    live: LiveContainer | None,
) -> None:
    """One finished tool call of a session (either endpoint's) into the audit trail and the
    metrics; ``live`` is the container that served it, if one still runs."""
    record.tool_calls += 1
    fabric.observer.tool_call(
        call,
        session=record.id,
        endpoint=record.endpoint,
        service=service,
        container=live.container.id[:12] if live is not None else None,
        client=record.client,
        trace_id=record.trace_id,
        parent=record.parent.record() if record.parent is not None else None,
    )


async def how_it_exited(
    fabric: Fabric, live: LiveContainer, fields: dict[str, Any]
) -> tuple[int | None, bool]:
    """(exit code, out of memory) of a container whose output ended on its own, once its
    stderr reader has logged the last lines (bounded: they explain the exit); (None, False) if
    the engine cannot tell."""
    with trio.move_on_after(STDERR_DRAIN_SECONDS):
        await live.stderr_done.wait()
    try:
        status = await fabric.runtime.exit_status(live.container.id)
    except FabricError as exc:
        log.warning("container_inspect_failed", extra={**fields, "reason": exc.reason})
        return None, False
    live.exit_code = status.exit_code
    return status.exit_code, status.oom_killed


async def remove_container(
    fabric: Fabric,
    live: LiveContainer,
    fields: dict[str, Any],
    *,
    forget: Callable[[], object],
) -> None:
    """Stop and remove one container (shielded, bounded; runs once per container).

    ``forget`` drops the driver's reference to it before anyone waiting on ``live.removed``
    wakes up.
    """
    if live.removing:
        await live.removed.wait()
        return
    live.removing = True
    container = live.container
    # An agent's: no new child session from here (those open end with its socket).
    fabric.revoke_child(container.name)
    deferred = False
    try:
        with trio.move_on_at(fabric.teardown_deadline()) as scope:
            scope.shield = True
            if live.stop_graceful:
                with trio.move_on_after(STDIN_CLOSE_GRACE_SECONDS):
                    await _close_stdin_and_wait(live)
            await container.aclose()
            await fabric.runtime.remove(
                container.id, grace=STOP_GRACE_SECONDS if live.stop_graceful else None
            )
        # The teardown's bound passed first (a burst of sessions ending queues its removals
        # behind a busy engine): the sweeper removes what is left, next (sweeper.py).
        deferred = scope.cancelled_caught
        if deferred:
            fabric.deferred_removals.defer(container.id)
    finally:
        forget()
        record = fabric.containers.get(container.id)
        fabric.container_removed(container.id)
        if record is not None:
            fabric.observer.container_stopped(
                session=record.session,
                service=record.service,
                container=container.id[:12],
                reason=live.stop_reason,
                exit_code=live.exit_code,
            )
        live.removed.set()
        log.log(
            logging.WARNING if deferred else logging.INFO,
            "container_removal_deferred" if deferred else "container_removed",
            extra={
                **fields,
                "container": container.id[:12],
                "sequence": live.seq,
                "why": live.stop_reason,
            },
        )


async def _close_stdin_and_wait(live: LiveContainer) -> None:
    """Ask the server to exit (EOF on stdin) and wait until its output ends."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await live.container.stdin.send_eof()
    if live.reading_stdout:
        await live.stdout_done.wait()
        return
    # The session is over and its reader gone: read the rest of the output ourselves.
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, FramingError):
        while await live.container.stdout.receive_some(READ_CHUNK):
            pass


class ContainerHost:
    """The orchestrator as one session's driver sees it (:class:`.driver.SessionHost`): the
    session's containers started with its mounts, audited under its record."""

    def __init__(self, fabric: Fabric, record: SessionRecord) -> None:
        self._fabric = fabric
        self._record = record

    @property
    def observer(self) -> Observer:
        return self._fabric.observer

    @property
    def max_message_bytes(self) -> int:
        return self._fabric.max_message_bytes

    @property
    def stopping(self) -> trio.Event:
        return self._fabric.stopping

    @property
    def compute_limiter(self) -> trio.CapacityLimiter:
        return self._fabric.refresh_limiter

    def teardown_deadline(self) -> float:
        return self._fabric.teardown_deadline()

    async def start(
        self,
        key: BackendKey,
        *,
        respawn: bool,
        fields: dict[str, Any],
        greeted: bool = False,
        call: CallRef | None = None,
    ) -> Container:
        service = self._fabric.service(key.service)
        # The machines ask only for services of the suite (admission checked the relay's).
        assert service is not None, key
        return await start_container(
            self._fabric,
            key.service,
            service,
            session_id=self._record.id,
            mounts=self._record.mounts,
            sequence=key.seq,
            fields=fields,
            respawn=respawn,
            greeted=greeted,
            call=call,
            session=self._record,
        )

    async def exit_status(
        self, live: LiveContainer, fields: dict[str, Any]
    ) -> tuple[int | None, bool]:
        return await how_it_exited(self._fabric, live, fields)

    async def remove(
        self, live: LiveContainer, fields: dict[str, Any], forget: Callable[[], object]
    ) -> None:
        await remove_container(self._fabric, live, fields, forget=forget)

    async def memory_usage(self, live: LiveContainer) -> int | None:
        try:
            return await self._fabric.runtime.memory_usage(live.container.id)
        except FabricError as exc:
            # Unreadable: no decision on it (the lifecycle measures again after the next call).
            log.info("container_stats_failed", extra={"reason": exc.reason})
            return None

    def audit(self, call: ToolCallDone, *, service: str, live: LiveContainer | None) -> None:
        audit_call(self._fabric, self._record, call, service=service, live=live)
