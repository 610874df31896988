"""Sessions' containers: their start (from the warm pool when one fits, else fresh), their
audit, how they exited, their removal — :class:`ContainerStarter`, one per orchestrator — and
:class:`ContainerHost`, what one session's driver sees of it. The running container's own
state and its stderr reading are in :mod:`.live_container`.

The starter holds what a start needs beyond the session: this process's identity (the owner
labels, the secrets' account), the mount policy (every start validates and pins the session's
mounts again), the suite lock's image check, the warm pool (:class:`ContainerPool`), and the
grants of agents' child sessions (made at their container's start, revoked at its removal).

Resource handling: a start's pins are handed to the runtime (or the pool), or closed here if
the start fails first; a child grant made for a start that fails is revoked. :meth:`remove
<ContainerStarter.remove>` is shielded and bounded by the orchestrator's teardown deadline,
runs once per container (a second caller waits for the first), and always unregisters the
container, even when the engine could not be reached; one whose removal the bound cut short is
left to the sweeper (:class:`~.sweeper.DeferredRemovals`).

Error handling: a start raises the FabricError a session is answered with (a refused mount, a
secret or an image refused, the engine's failure); the engine's failure to say how a container
exited or how much memory it uses is logged and answered with "unknown".
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import trio

from .._errors import FabricError, WorkspaceRefused
from .._reasons import WORKSPACE_FAILED
from ..config.structs import Service
from ..observe.observer import Observer
from ..observe.redaction import SECRET_VALUES
from ..policy.accounts import UNPRIVILEGED, Account, account_named, orchestrator_ids, server_ids
from ..policy.child_grant import ChildGrant
from ..policy.container_parts.ownership import ContainerIdentity
from ..policy.container_parts.secrets import runs_as
from ..policy.container_spec import container_spec_for
from ..policy.git_guard import guards_git
from ..policy.mount_spec import MountSpec
from ..policy.mounts import MountPolicy
from ..policy.pinning import PinSet
from ..protocol.events import BackendKey, CallRef
from ..protocol.framing import FramingError
from ..protocol.settings import Settings
from ..protocol.tool_calls import ToolCall, ToolCallDone
from ..runtime.base import Container, Gate, Runtime
from ..workspace import TaskFacts
from .live_container import READ_CHUNK, LiveContainer
from .pooled import HandedOut
from .registry import ContainerRecord, SessionRecord, SessionRegistry
from .sweeper import DeferredRemovals
from .workspaces import TaskCopy, TaskWorkspaces

log = logging.getLogger(__name__)

# Closing stdin asks a stdio server to exit; after this it is stopped (SIGTERM, then SIGKILL).
STDIN_CLOSE_GRACE_SECONDS = 0.5
STOP_GRACE_SECONDS = 2.0
# After a container's stdout ends, how long its stderr reader may take to log the last lines
# (they explain the exit, and go into the error the client gets).
STDERR_DRAIN_SECONDS = 1.0

# The suite lock's verdict on a start's image id (:meth:`.CatalogService.image_checked`).
ImageCheck = Callable[[str, Service, str | None], FabricError | None]


class ContainerPool(Protocol):
    """What the starter sees of the warm pool (:class:`~.warm_pool.WarmPool`). A protocol,
    so that this module, which the pool uses, does not import the pool back."""

    def container_ids(self) -> set[str]:
        """The pooled containers it knows (the sweeper leaves them alone)."""

    def ready_by_service(self) -> dict[str, int]:
        """How many started containers wait, per service (the metrics)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pools filled until the orchestrator stops; then remove what is pooled."""

    async def take(
        self,
        service_name: str,
        service: Service,
        *,
        account: Account,
        mounts: tuple[MountSpec, ...],
        pins: PinSet | None,
        fields: dict[str, Any],
        greeted: bool = False,
        gate: Gate | None = None,
    ) -> Container | None:
        """A started container of ``service_name`` for a session, its mounts attached (and
        ``pins`` released); None when none fits (``pins`` then stay the caller's).
        ``greeted``: one the pool greeted will do (the caller skips its handshake); ``gate``:
        the mounts are attached once it returned."""


class ContainerStarter:
    """Starts and removes sessions' containers (see the module docstring). ``pool`` is set
    by the serving once the warm pool is made (None: no service keeps one)."""

    def __init__(
        self,
        runtime: Runtime,
        identity: ContainerIdentity,
        mount_policy: MountPolicy,
        services: Mapping[str, Service],
        *,
        settings: Settings,
        registry: SessionRegistry,
        observer: Observer,
        image_checked: ImageCheck,
        deferred: DeferredRemovals,
    ) -> None:
        self.runtime = runtime
        self.identity = identity
        self.mount_policy = mount_policy
        self.pool: ContainerPool | None = None
        # Containers whose removal a teardown's bound cut short: the sweeper removes them next.
        self.deferred = deferred
        # Agent containers' child sessions, by the container's name: made at its start,
        # revoked at its removal (see reactor_fabric.trio.child_sessions).
        self.child_grants: dict[str, ChildGrant] = {}
        self.services = services
        self._settings = settings
        self._registry = registry
        self._observer = observer
        self._image_checked = image_checked
        # Isolated calls' copies (set by the serving once its area is made; None: none can
        # be made, and isolated calls are refused), and the copy of each running container.
        self.workspaces: TaskWorkspaces | None = None
        self.copies: dict[str, TaskCopy] = {}

    def pooled(self) -> dict[str, int]:
        """The warm pool's ready containers by service (none without a pool)."""
        return self.pool.ready_by_service() if self.pool is not None else {}

    def live_container_ids(self) -> set[str]:
        """Every container this orchestrator uses now: sessions' and the warm pool's."""
        pooled = self.pool.container_ids() if self.pool is not None else set()
        return set(self._registry.containers) | pooled

    # --- a start ----------------------------------------------------------------------------

    async def start(
        self,
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
        (``respawn``: the session had one of this service before); FabricError if it cannot
        start.

        The mounts are validated again and pinned at every start (respawns too): the container
        gets the very directories the session was granted, or this start fails with -32004. A
        service with a warm pool hands over one of its started containers when one fits (see
        :mod:`.warm_pool`); otherwise a fresh one is started. ``greeted``: the caller skips the
        handshake with a container the pool greeted (see :meth:`.warm_pool.WarmPool.take`);
        ``call``: the one call the container is started for (fresh_per_call), named in its
        audit record.

        An agent that ``uses`` services gets a child session of ``session`` (the starting
        session's record): a grant made here, before the container exists (its token is in the
        container's environment), and revoked if the start fails, else at its removal
        (:meth:`remove`). Such a container is never a pooled one: a pooled container was made
        before anyone could grant it anything.
        """
        began = trio.current_time()
        # The suite lock: no container from an image whose digest changed (enforce).
        await self.check_image(service_name, service)
        # An isolated call works on a copy of the project, which has no .git of the client's.
        # (validation: only a fresh_per_call service is isolated, so its container serves one
        # task; the relay starts it with the session's handshake, before the call.)
        isolated = service.workspace_mode == "isolated" and any(not m.read_only for m in mounts)
        # No container writes the user's .git unless its service must (policy/git_guard.py):
        # never an agent's, nor one of an agent's child session.
        child_session = session is not None and session.depth > 0
        guard_git = guards_git(service, child_session=child_session) and not isolated
        pins, account, mounts = await self.prepare_start(mounts, guard_git=guard_git)
        copy: TaskCopy | None = None
        if isolated:
            assert pins is not None  # (isolated: a writable mount)
            # The copy is the account's the server runs as (a secret-bearing one's own).
            owner = runs_as(service_name, service, self.identity, account)
            pins, mounts, copy = await self._isolate(
                service_name, pins, mounts, session_id=session_id, sequence=sequence, call=call,
                session=session, account=owner, agent=service.service_type == "llm_agent",
            )  # fmt: skip
        try:
            container = await self._start_container(
                service_name,
                service,
                session_id=session_id,
                sequence=sequence,
                pins=pins,
                mounts=mounts,
                account=account,
                fields=fields,
                greeted=greeted,
                call=call,
                session=session,
                grant_mounts=mounts if copy is not None else None,
                # The copy is filled while the container is made; its server waits for it.
                gate=copy.filled if copy is not None else None,
            )
        except BaseException:
            if copy is not None:
                await self._workspaces().discard(copy)
            raise
        if copy is not None:
            self.copies[container.id] = copy
            # The session's next task from the working tree starts on a spare copy.
            self._workspaces().make_spare_after(copy)
        seconds = trio.current_time() - began
        self._registry.container_started(
            container.id,
            ContainerRecord(session_id, service_name, container.name, service.image, time.time()),
        )
        self._observer.container_started(
            session=session_id,
            service=service_name,
            container=container.id[:12],
            image=service.image,
            seconds=seconds,
            respawn=respawn,
            pooled=isinstance(container, HandedOut),
            call=call.record() if call is not None else None,
        )
        log.info(
            "container_started",
            extra={
                **fields,
                "container": container.id[:12],
                "container_name": container.name,
                "sequence": sequence,
                "pooled": isinstance(container, HandedOut),
                # Its handshake was done while it waited in the pool: none at this call.
                "greeted": isinstance(container, HandedOut) and container.greeting is not None,
                **(
                    {"workspace": copy.branch, "workspace_spare": copy.spared}
                    if copy is not None
                    else {}
                ),
            },
        )
        return container

    async def _start_container(
        self,
        service_name: str,
        service: Service,
        *,
        session_id: str,
        sequence: int,
        pins: PinSet | None,
        mounts: tuple[MountSpec, ...],
        account: Account,
        fields: dict[str, Any],
        greeted: bool,
        call: CallRef | None,
        session: SessionRecord | None,
        grant_mounts: tuple[MountSpec, ...] | None,
        gate: Gate | None,
    ) -> Container:
        """The container itself, from the warm pool or fresh; owns ``pins``; its server runs
        once ``gate`` returned (:data:`~reactor_fabric.runtime.base.Gate`)."""
        child = self._child_grant(service_name, service, session, call, grant_mounts)
        container: Container | None = None
        if self.pool is not None and child is None:
            if gate is not None and self.pool.ready_by_service().get(service_name, 0):
                # A pooled container has nothing left to start beside the copy, and its take
                # sets off a refill that would share the two cores with it: the copy first.
                await gate()
            # A started one from the warm pool, the session's mounts attached (owns the pins
            # unless it has none that fits).
            container = await self.pool.take(
                service_name,
                service,
                account=account,
                mounts=mounts,
                pins=pins,
                fields=fields,
                greeted=greeted,
                gate=gate,
            )
        if container is None:
            try:
                # Refused here, before anything is made, if the runtime cannot do what the
                # service needs (its secrets, its egress proxy).
                spec = container_spec_for(
                    service_name,
                    service,
                    session_id=session_id,
                    identity=self.identity,
                    capabilities=self.runtime.capabilities,
                    mounts=mounts,
                    account=account,
                    sequence=sequence,
                    child_token=child.token if child is not None else None,
                )
            except BaseException:
                if pins is not None:
                    pins.close()
                raise
            if child is not None:
                child = replace(child, container_name=spec.name)
                self.grant_child(child)
            try:
                container = await self.runtime.spawn(spec, pins, gate=gate)  # owns the pins
            except BaseException:
                if child is not None:
                    self.revoke_child(child.container_name)
                raise
        return container

    async def _isolate(
        self,
        service_name: str,
        pins: PinSet,
        mounts: tuple[MountSpec, ...],
        *,
        session_id: str,
        sequence: int,
        call: CallRef | None,
        session: SessionRecord | None,
        account: Account,
        agent: bool,
    ) -> tuple[PinSet, tuple[MountSpec, ...], TaskCopy]:
        """The copy an isolated call's container works on, in the project's place (pins
        consumed: handed over in the result, or closed). It starts from the call's ``base``
        only for an ``agent`` (its run_task's argument; another server's ``base`` is its
        own), else from the working tree."""
        try:
            workspaces = self._workspaces()
        except BaseException:
            pins.close()
            raise
        facts = TaskFacts(
            service=service_name,
            task=(call.task or call.name or "") if call is not None else "",
            session=session_id,
            call=str(call.id) if call is not None else "-",
            trace=session.trace_id if session is not None else "",
        )
        base = call.base if call is not None and agent else None
        call_id = call.id if call is not None else None
        name = f"{session_id}-{sequence}"
        return await workspaces.make(
            name,
            pins,
            mounts,
            base=base,
            facts=facts,
            call=call_id,
            account=(account.uid, account.gid),
        )

    def _workspaces(self) -> TaskWorkspaces:
        if self.workspaces is None:
            raise WorkspaceRefused(
                "this orchestrator has no directory for workspaces (see its start-up log)",
                reason=WORKSPACE_FAILED,
            )
        return self.workspaces

    async def check_image(self, name: str, service: Service) -> None:
        """At every container start with a lock: the image's id against the locked one.
        Enforce raises SecurityViolation (image_changed); warn reports the drift."""
        if self._settings.lock is None or self._settings.lock_mode == "off":
            return
        try:
            image_id = await self.runtime.image_id(service.image)
        except FabricError:
            return  # the engine cannot say: the start itself will fail and say why
        refusal = self._image_checked(name, service, image_id)
        if refusal is not None:
            raise refusal

    async def prepare_start(
        self, mounts: tuple[MountSpec, ...], *, guard_git: bool = False
    ) -> tuple[PinSet | None, Account, tuple[MountSpec, ...]]:
        """Validate the session's mounts again and pin them for one container start; choose
        the account the server runs as (see :mod:`reactor_fabric.policy.accounts`); the
        container's mounts: the session's, and with ``guard_git`` the read-only binds of their
        Git directories (:mod:`reactor_fabric.policy.git_guard`).

        Resource handling: the pins are the caller's to hand to :meth:`Runtime.spawn` (which
        releases them); if this call is cancelled, pins made by its thread are closed here.
        """
        if not mounts:
            await trio.lowlevel.checkpoint()
            return None, UNPRIVILEGED, ()
        made: list[tuple[PinSet, Account, tuple[MountSpec, ...]]] = []

        def prepare() -> None:
            # Both touch the file system or NSS, which may be slow: in a thread.
            pins, guards = self.mount_policy.pin(mounts, guard_git=guard_git)
            try:
                first = pins.for_target(mounts[0].target)
                uid, gid = server_ids(
                    first_mount_owner=first.owner if first is not None else None,
                    orchestrator=orchestrator_ids(),
                )
                made.append((pins, account_named(uid, gid), (*mounts, *guards)))
            except BaseException:
                pins.close()
                raise

        try:
            # Not abandonable: the thread is short (a few opens) and what it makes must be
            # closed by us, so we wait for it even when cancelled.
            await trio.to_thread.run_sync(prepare)
        except BaseException:
            for pins, _account, _mounts in made:
                pins.close()
            raise
        return made[0]

    async def validate_mounts(
        self, mounts: object, roots: tuple[str, ...] | None = None
    ) -> tuple[MountSpec, ...]:
        """A session's requested mounts, validated against the mount policy (at admission);
        ``roots``: a signed-in user's allowed roots instead of the orchestrator's."""
        if mounts == []:
            await trio.lowlevel.checkpoint()
            return ()
        # Resolving paths touches the file system (which may be slow, e.g. NFS): in a thread.
        return await trio.to_thread.run_sync(self.mount_policy.validate, mounts, roots)

    # --- agents' child sessions -------------------------------------------------------------

    def _child_grant(
        self,
        service_name: str,
        service: Service,
        session: SessionRecord | None,
        call: CallRef | None,
        mounts: tuple[MountSpec, ...] | None = None,
    ) -> ChildGrant | None:
        """The grant of an agent's child session, if it gets one (it uses services, the
        runtime can give its container the socket, and the depth limit leaves it some); its
        container's name is set once the spec names it. Its sessions' containers get
        ``mounts`` (an isolated task's copy), else the session's."""
        if session is None or not service.uses or not self.runtime.capabilities.child_sessions:
            return None
        depth = session.depth + 1
        services = self.child_services(service, depth)
        if not services:
            return None
        return ChildGrant(
            token=secrets.token_urlsafe(32),
            container_name="",
            agent=service_name,
            parent_session=session.id,
            parent_call=call,
            trace_id=session.trace_id,
            mounts=session.mounts if mounts is None else mounts,
            services=services,
            depth=depth,
            user=session.client.user if session.client is not None else None,
            groups=session.client.groups if session.client is not None else (),
        )

    def child_services(self, agent: Service, depth: int) -> tuple[str, ...]:
        """What a child session at ``depth`` of an ``agent`` may use: the suite's services the
        agent ``uses``, other agents only while ``depth`` is below the depth limit (so that
        agents cannot start agents without bound). Empty: the agent gets no child session."""
        services = self.services
        max_depth = self._settings.max_agent_depth
        return tuple(
            name
            for name in agent.uses
            if name in services
            and (services[name].service_type != "llm_agent" or depth < max_depth)
        )

    def grant_child(self, grant: ChildGrant) -> None:
        """Open child sessions to the relay of the container ``grant.container_name`` (until
        :meth:`revoke_child`); its token is redacted from every log and record meanwhile."""
        SECRET_VALUES.register([grant.token])
        self.child_grants[grant.container_name] = grant

    def revoke_child(self, container_name: str) -> None:
        """No new child session for that container (idempotent); those open end with it."""
        grant = self.child_grants.pop(container_name, None)
        if grant is not None:
            SECRET_VALUES.forget([grant.token])

    # --- a running container, its end -------------------------------------------------------

    async def exit_status(
        self, live: LiveContainer, fields: dict[str, Any]
    ) -> tuple[int | None, bool]:
        """(exit code, out of memory) of a container whose output ended on its own, once its
        stderr reader has logged the last lines (bounded: they explain the exit); (None, False)
        if the engine cannot tell."""
        with trio.move_on_after(STDERR_DRAIN_SECONDS):
            await live.stderr_done.wait()
        try:
            status = await self.runtime.exit_status(live.container.id)
        except FabricError as exc:
            log.warning("container_inspect_failed", extra={**fields, "reason": exc.reason})
            return None, False
        live.exit_code = status.exit_code
        return status.exit_code, status.oom_killed

    async def memory_usage(self, live: LiveContainer) -> int | None:
        """The container's memory in use (bytes), from the engine; None if it cannot tell."""
        try:
            return await self.runtime.memory_usage(live.container.id)
        except FabricError as exc:
            # Unreadable: no decision on it (the lifecycle measures again after the next call).
            log.info("container_stats_failed", extra={"reason": exc.reason})
            return None

    async def remove(
        self, live: LiveContainer, fields: dict[str, Any], *, forget: Callable[[], object]
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
        self.revoke_child(container.name)
        deferred = False
        try:
            with trio.move_on_at(self._registry.teardown_deadline()) as scope:
                scope.shield = True
                if live.stop_graceful:
                    with trio.move_on_after(STDIN_CLOSE_GRACE_SECONDS):
                        await _close_stdin_and_wait(live)
                await container.aclose()
                await self.runtime.remove(
                    container.id, grace=STOP_GRACE_SECONDS if live.stop_graceful else None
                )
            # The teardown's bound passed first (a burst of sessions ending queues its removals
            # behind a busy engine): the sweeper removes what is left, next (sweeper.py).
            deferred = scope.cancelled_caught
            if deferred:
                self.deferred.defer(container.id)
        finally:
            copy = self.copies.pop(container.id, None)
            if copy is not None:
                # Nothing writes the copy any more: what the task changed becomes a branch.
                live.workspace = await self._workspaces().finish(copy)
            forget()
            record = self._registry.containers.get(container.id)
            self._registry.container_removed(container.id)
            if record is not None:
                self._observer.container_stopped(
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


def audit_call(
    observer: Observer,
    record: SessionRecord,
    call: ToolCall | ToolCallDone,
    *,
    service: str,
    live: LiveContainer | None,
) -> None:
    """One finished tool call of a session (either endpoint's) into the audit trail and the
    metrics; ``live`` is the container that served it, if one still runs."""
    record.tool_calls += 1
    observer.tool_call(
        call,
        session=record.id,
        endpoint=record.endpoint,
        service=service,
        container=live.container.id[:12] if live is not None else None,
        client=record.client,
        trace_id=record.trace_id,
        parent=record.parent.record() if record.parent is not None else None,
    )


class ContainerHost:
    """The orchestrator as one session's driver sees it (:class:`.driver.SessionHost`): the
    session's containers started with its mounts, audited under its record."""

    def __init__(
        self,
        record: SessionRecord,
        *,
        starter: ContainerStarter,
        registry: SessionRegistry,
        observer: Observer,
        max_message_bytes: int,
        compute_limiter: trio.CapacityLimiter,
    ) -> None:
        self._record = record
        self._starter = starter
        self._registry = registry
        self.observer = observer
        self.max_message_bytes = max_message_bytes
        self.compute_limiter = compute_limiter

    @property
    def stopping(self) -> trio.Event:
        return self._registry.stopping

    def teardown_deadline(self) -> float:
        return self._registry.teardown_deadline()

    async def start(
        self,
        key: BackendKey,
        *,
        respawn: bool,
        fields: dict[str, Any],
        greeted: bool = False,
        call: CallRef | None = None,
    ) -> Container:
        service = self._starter.services.get(key.service)
        # The machines ask only for services of the suite (admission checked the relay's).
        assert service is not None, key
        return await self._starter.start(
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
        return await self._starter.exit_status(live, fields)

    async def remove(
        self, live: LiveContainer, fields: dict[str, Any], forget: Callable[[], object]
    ) -> None:
        await self._starter.remove(live, fields, forget=forget)

    async def memory_usage(self, live: LiveContainer) -> int | None:
        return await self._starter.memory_usage(live)

    def works_on_copy(self, container: Container) -> bool:
        return container.id in self._starter.copies

    def audit(self, call: ToolCallDone, *, service: str, live: LiveContainer | None) -> None:
        audit_call(self.observer, self._record, call, service=service, live=live)
