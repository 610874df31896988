"""The warm pool: started, idle containers, handed to sessions instead of starting one.

A service with ``warm: N`` keeps N containers started (a ``fresh_per_call`` one more while it is
called often: its pool follows its calls of the last minute), their MCP server running and
waiting on stdin with no handshake done: the session's own first message is the first thing
the server sees. A session takes one at its container start (:meth:`WarmPool.take`, called by
:meth:`~reactor_fabric.trio.containers.ContainerStarter.start`, so speculative starts after
``fabric/registerClient`` and the fabric endpoint's lazy starts take from it too); the pool
refills in the background. What to start, hand out and remove — refills and their back-off,
early output, image changes, which mounts fit, the account of a container — is decided by the
pure :class:`~reactor_fabric.protocol.warm_pool.WarmPoolMachine`: this module feeds it what
happens (:meth:`WarmPool._handle`), a Tick at its deadline, and does what it says.

A pooled container serves one session and is then removed like any other; it is never
returned. Sessions with mounts get one only where the staging area works
(:mod:`reactor_fabric.runtime.staging`: the orchestrator runs as root, in the engine's mount
namespace); elsewhere they get a fresh container, and the log says why once.

Ownership tree::

    serve_orchestrator (root nursery)
    └── WarmPool.run
        ├── _watch_stopping        on shutdown: no more starts, pooled containers removed
        ├── _check_images          one per image check the machine asks for
        ├── _start(token)          one per pooled start
        ├── _watch(entry)          one per ready container: reads its output until it is
        │                          claimed (then the session reads) or removed
        └── _discard(entry)        one per pooled container removed without serving anyone

Resource handling: every pooled container is in ``_entries`` from the moment its spawn returns
until it is handed out or removed; when :meth:`WarmPool.run` ends (shutdown, cancellation) it
removes all of them and closes the staging area, shielded and bounded by the teardown deadline.
A container handed out belongs to its session: its :meth:`Container.aclose` detaches the
session's mounts from the staging area, and the session removes it.

Error handling: a failed pooled start is logged and backed off (see the machine); nothing here
fails a session except what a fresh start would fail it with (a refused mount). A bug in one
of the pool's tasks is logged (``pool_task_failed``) and contained: it never reaches the
orchestrator's root nursery.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from .. import __version__
from .._errors import FabricError
from .._reasons import RUNTIME
from ..config.structs import Service, Suite
from ..observe.metrics import Metrics
from ..policy.accounts import UNPRIVILEGED, Account
from ..policy.container_parts.isolation import resolved_isolation
from ..policy.container_parts.ownership import ContainerIdentity
from ..policy.container_parts.resources import DEFAULT_CPU_SHARES
from ..policy.container_spec import pooled_spec_for
from ..policy.mount_spec import MountSpec
from ..policy.owner import hostname
from ..policy.pinning import PinSet
from ..protocol.framing import FramingError
from ..protocol.pool_greeting import (
    GREETING_SECONDS,
    INITIALIZED,
    Greeted,
    Greeting,
    GreetingFailed,
    initialize_request,
)
from ..protocol.settings import Pooling
from ..protocol.warm_pool import (
    WarmPoolMachine,
)
from ..protocol.warm_pool_events import (
    ENDED_REASONS,
    Action,
    CheckImages,
    Claim,
    EarlyOutput,
    Event,
    GreetPooled,
    HandOut,
    ImageChanged,
    ImagesChecked,
    Missed,
    OutputEnd,
    OutputEnded,
    PooledGreeted,
    PooledGreetingFailed,
    RemovePooled,
    Shutdown,
    StagingLost,
    StartFailed,
    StartPooled,
    StartSucceeded,
    Take,
    Tick,
    Watched,
)
from ..runtime.base import Container, Gate, Runtime
from ..runtime.staging import (
    NotStageable,
    PropagationMissing,
    Staging,
    StagingArea,
    StagingUnavailable,
)
from .live_container import READ_CHUNK, LiveContainer, read_stderr
from .pooled import HandedOut

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pooled:
    token: int
    service: str
    container: Container
    staged: bool
    fields: dict[str, Any]
    pid: int = 0
    early_stdout: bytearray = field(default_factory=bytearray)
    watching: trio.CancelScope = field(default_factory=trio.CancelScope)
    watched: trio.Event = field(default_factory=trio.Event)
    watcher: bool = False  # a _watch task was started for it (it sets `watched` when done)
    live: LiveContainer | None = None  # while watched: its stderr's last lines
    greeting: bytes | None = None  # greeted (fresh_per_call): its InitializeResult
    full_weight: bool = False  # its CPU weight is being (or was) restored already


class WarmPool:
    """The pooled containers of one orchestrator (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        services: Mapping[str, Service],
        pooling: Pooling,
        *,
        identity: ContainerIdentity,
        staging: Staging | None,
        stopping: trio.Event,
        teardown_deadline: Callable[[], float],
        metrics: Metrics,
        refused: Collection[str] = (),
    ) -> None:
        self._runtime = runtime
        self._services = services
        self._identity = identity
        self._staging = staging
        # Under gVisor a mount made on the host once the container runs is not reliably seen in
        # it (policy/container_parts/isolation.py): such a service's pooled containers serve
        # sessions without mounts only.
        capabilities = runtime.capabilities
        self._unstageable = frozenset(
            name
            for name, service in services.items()
            if resolved_isolation(service, capabilities) == "gvisor"
        )
        self._stopping = stopping
        self._teardown_deadline = teardown_deadline
        self._metrics = metrics
        # A service refused (for its secrets) gets no pooled container: each start would fail.
        self.machine = WarmPoolMachine(
            pooling.without(refused), initial_shape=UNPRIVILEGED, stages_mounts=staging is not None
        )
        self._entries: dict[int, _Pooled] = {}
        self._discarding: dict[int, _Pooled] = {}
        # Taken by a session whose start has not registered it yet (see container_ids).
        self._handing_out: dict[int, _Pooled] = {}
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None

    # --- what exists ------------------------------------------------------------------------

    @property
    def staging(self) -> Staging | None:
        return self._staging

    def container_ids(self) -> set[str]:
        """Pooled containers this pool knows (the sweeper leaves them alone): ready, being
        removed, or being handed to a session (which registers it before its next checkpoint
        after :meth:`take` returns)."""
        entries = (*self._entries.values(), *self._discarding.values(), *self._handing_out.values())
        return {entry.container.id for entry in entries}

    def ready_by_service(self) -> dict[str, int]:
        return {name: self.machine.ready(name) for name in self.machine.services}

    # --- running ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pools filled until the orchestrator stops; then remove what is pooled.

        Reports started at once: serving does not wait for the pool to fill.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._watch_stopping)
                task_status.started()
                await self._keep_filled()
        finally:
            with trio.move_on_at(self._teardown_deadline()) as scope:
                scope.shield = True
                await self._remove_everything()

    async def _keep_filled(self) -> None:
        """Feed the machine a Tick at its deadline (image checks, back-offs ending) until it
        stops; every other event is fed where it happens (see :meth:`_handle`)."""
        machine = self.machine
        self._handle(Tick())  # the first image check and the first starts
        while not machine.stopping:
            deadline = machine.deadline
            if deadline is not None and trio.current_time() >= deadline:
                self._handle(Tick())
                continue
            changed = self._changed
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await changed.wait()

    def _handle(self, event: Event) -> list[Action]:
        """Feed ``event`` to the machine and do what it says about pooled containers; the
        answers to a session (Claim, HandOut, Missed) are returned to the caller with the rest."""
        actions = self.machine.handle(event, trio.current_time())
        for action in actions:
            match action:
                case StartPooled():
                    assert self._nursery is not None
                    self._nursery.start_soon(_contained, self._start, action)
                case RemovePooled(token=token, reason=reason):
                    entry = self._entries.get(token)
                    if entry is not None:
                        self._discard_soon(entry, reason)
                case CheckImages(services=services):
                    assert self._nursery is not None
                    self._nursery.start_soon(_contained, self._check_images, services)
                case ImageChanged(service=name):
                    image = self._services[name].image
                    log.info("pool_image_changed", extra={"service": name, "image": image})
                case Claim() | HandOut() | Missed():
                    pass  # the session's (see take)
                case GreetPooled():
                    pass  # the watch that follows its start greets it (see _start)
        self._wake()  # the deadline may have moved
        return actions

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def _watch_stopping(self) -> None:
        await self._stopping.wait()
        self._handle(Shutdown())

    async def _check_images(self, services: tuple[str, ...]) -> None:
        """The engine's image id of each service (None when it cannot tell now: the engine is
        away, and its starts fail and back off meanwhile), reported to the machine."""
        runtime = self._runtime
        images: list[tuple[str, str | None]] = []
        try:
            for name in services:
                image_id: str | None = None
                with contextlib.suppress(FabricError):
                    image_id = await runtime.image_id(self._services[name].image)
                images.append((name, image_id))
        finally:
            # Even when cancelled half-way: the machine schedules the next check.
            self._handle(ImagesChecked(tuple(images)))

    # --- one pooled container ---------------------------------------------------------------

    async def _start(self, action: StartPooled) -> None:
        name = action.service
        service = self._services[name]
        fields: dict[str, Any] = {"service": name, "pool_token": action.token}
        staging = self._staging if action.staged else None
        account = action.shape if isinstance(action.shape, Account) else UNPRIVILEGED
        try:
            binds: tuple[MountSpec, ...] = ()
            if staging is not None:
                binds = await trio.to_thread.run_sync(staging.prepare, action.token)
            spec = pooled_spec_for(
                name,
                service,
                token=action.token,
                identity=self._identity,
                capabilities=self._runtime.capabilities,
                staging=binds,
                account=account,
            )
            began = trio.current_time()
            container = await self._runtime.spawn(spec)
        except (FabricError, OSError) as exc:
            await self._release_staging(action.token)
            log.warning("pooled_start_failed", extra={**fields, "detail": str(exc)})
            self._handle(StartFailed(action.token))
            return
        except BaseException:
            await self._release_staging(action.token)
            raise
        # From here on the container is in _entries: whatever happens, it is removed.
        entry = _Pooled(action.token, name, container, staged=bool(binds), fields=fields)
        self._entries[action.token] = entry
        try:
            if binds:
                entry.pid = await self._runtime.main_pid(container.id)
        except FabricError as exc:
            log.warning("pooled_start_failed", extra={**fields, "detail": str(exc)})
            self._handle(StartFailed(action.token, created=True))
            return
        greet = any(isinstance(a, GreetPooled) for a in self._handle(StartSucceeded(action.token)))
        if action.token not in self._entries:
            return  # no longer wanted (an image change, a stop): being removed
        log.info(
            "pooled_container_ready",
            extra={
                **fields,
                "container": container.id[:12],
                "container_name": container.name,
                "seconds": round(trio.current_time() - began, 3),
            },
        )
        assert self._nursery is not None
        entry.watcher = True
        self._nursery.start_soon(_contained, self._watch, entry, greet)

    async def _watch(self, entry: _Pooled, greet: bool = False) -> None:
        """Read an idle container's output: stderr to the log, stdout kept for the session
        and reported to the machine; first, with ``greet``, its greeting (see
        :mod:`~reactor_fabric.protocol.pool_greeting`). Ends when the container is claimed or
        removed (cancelled), fails its greeting or its output ends."""
        live = entry.live = LiveContainer(0, entry.container)
        ended: OutputEnd | None = None
        try:
            with entry.watching:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read_stderr, live, entry.fields)
                    if not greet or await self._greet(entry):
                        ended = await self._read_early_stdout(entry)
                    if ended != "exited":
                        nursery.cancel_scope.cancel()
                    # else its stderr ends too: the reader logs the last lines, which say why
            if ended is not None:
                self._handle(OutputEnded(entry.token, ended))
        finally:
            entry.watched.set()

    async def _greet(self, entry: _Pooled) -> bool:
        """The pool's MCP handshake with a per-call service's container (bounded in time and
        bytes: the decisions are :class:`Greeting`'s); whether it is ready for a call (else
        the machine removes it). What it wrote after its answer is kept for the session."""
        outcome = await _greeting(entry.container)
        if isinstance(outcome, GreetingFailed):
            log.warning(
                "pooled_greeting_failed",
                extra={**entry.fields, "why": outcome.reason, "detail": outcome.detail},
            )
            self._handle(PooledGreetingFailed(entry.token, outcome.reason))
            return False
        entry.greeting = outcome.result
        entry.early_stdout += outcome.rest
        self._handle(PooledGreeted(entry.token))
        if entry.token not in self._entries:
            return False  # no longer wanted (an image change, a stop): being removed
        log.info("pooled_container_greeted", extra=entry.fields)
        # Greeted, its server has loaded and waits idle on its stdin: its weight no longer
        # yields anything to anyone, and restored now (in the background) the call that takes
        # it runs at full weight from its first instruction, not after an engine call.
        self._restore_cpu_weight_soon(entry, entry.fields)
        if outcome.rest:
            return entry.token not in self._removed(EarlyOutput(entry.token, len(outcome.rest)))
        return True

    async def _read_early_stdout(self, entry: _Pooled) -> OutputEnd | None:
        """How its output ended; None when the machine removed it for what it wrote."""
        stdout = entry.container.stdout
        try:
            while data := await stdout.receive_some(READ_CHUNK):
                entry.early_stdout += data
                if entry.token in self._removed(EarlyOutput(entry.token, len(data))):
                    return None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except FramingError:
            return "output_invalid"  # its output cannot be trusted: not handed out
        return "exited"

    def _removed(self, event: Event) -> set[int]:
        """Feed ``event``; the pooled containers the machine removed for it."""
        return {a.token for a in self._handle(event) if isinstance(a, RemovePooled)}

    def _discard_soon(self, entry: _Pooled, reason: str) -> None:
        self._entries.pop(entry.token, None)
        self._discarding[entry.token] = entry
        entry.watching.cancel()
        assert self._nursery is not None
        self._nursery.start_soon(_contained, self._discard, entry, reason)

    async def _discard(self, entry: _Pooled, reason: str) -> None:
        """Remove a pooled container nobody was given (shielded, bounded)."""
        try:
            with trio.move_on_at(self._teardown_deadline()) as scope:
                scope.shield = True
                if entry.watcher:
                    await entry.watched.wait()
                if reason in ENDED_REASONS:
                    tail = list(entry.live.stderr_tail) if entry.live is not None else []
                    log.warning(
                        "pooled_container_ended",
                        extra={**entry.fields, "why": reason, "stderr_tail": tail},
                    )
                await entry.container.aclose()
                await self._runtime.remove(entry.container.id)
                if entry.staged:
                    await self._release_staging(entry.token)
        finally:
            self._discarding.pop(entry.token, None)
            log.info(
                "pooled_container_removed",
                extra={
                    "service": entry.service,
                    "pool_token": entry.token,
                    "container": entry.container.id[:12],
                    "why": reason,
                },
            )

    async def _release_staging(self, token: int) -> None:
        if self._staging is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._staging.release, token)

    async def _remove_everything(self) -> None:
        """The pool's last step: every pooled container removed, the staging area closed."""
        self.machine.handle(Shutdown(), trio.current_time())
        entries = [*self._entries.values(), *self._discarding.values()]
        self._entries.clear()
        async with trio.open_nursery() as nursery:
            for entry in entries:
                nursery.start_soon(entry.container.aclose)
                nursery.start_soon(self._runtime.remove, entry.container.id)
        if self._staging is not None:
            await trio.to_thread.run_sync(self._staging.close)

    # --- sessions ---------------------------------------------------------------------------

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
        """A ready pooled container of ``service_name`` for a session, its mounts attached and
        checked; None when there is none that fits (the caller starts a fresh one).
        ``greeted``: the session takes a container the pool greeted (the fabric endpoint's
        per-call backends), and does no handshake with it then (see :class:`HandedOut`).
        ``gate``: what the mounts must hold is still being made (an isolated task's copy):
        a container taken gets them once the gate returned (if it raises, the container is
        discarded and the error goes up).

        Resource handling: ``pins`` stay the caller's when this returns None; otherwise (a
        container, or an exception) they were released here. A container returned is the
        caller's, as one from :meth:`Runtime.spawn` would be.

        Error handling: raises only what a fresh start would raise for the same mounts
        (SecurityViolation ``mount_changed``), the container then removed.
        """
        placeable = (
            bool(mounts) and self._staging is not None and service_name not in self._unstageable
        )
        if placeable:
            assert self._staging is not None
            placeable = self._staging.placement(mounts) is not None
        claim: Claim | None = None
        take = Take(service_name, account, bool(mounts), placeable, greeted=greeted)
        for action in self._handle(take):
            match action:
                case Claim():
                    claim = action
                    self._metrics.pool_takes.labels(service_name, "hit").inc()
                case Missed(outcome=outcome) if outcome != "not_pooled":
                    self._metrics.pool_takes.labels(service_name, outcome).inc()
        if claim is None:
            return None
        entry = self._entries.pop(claim.token)
        self._handing_out[entry.token] = entry
        try:
            return await self._hand_out(entry, mounts, pins, fields, gate)
        finally:
            del self._handing_out[entry.token]

    async def _hand_out(
        self,
        entry: _Pooled,
        mounts: tuple[MountSpec, ...],
        pins: PinSet | None,
        fields: dict[str, Any],
        gate: Gate | None,
    ) -> Container | None:
        try:
            entry.watching.cancel()
            try:
                await entry.watched.wait()
            finally:
                # Its output is all reported: the machine says whether it may serve.
                handed = any(isinstance(a, HandOut) for a in self._handle(Watched(entry.token)))
            if not handed:
                self._discard_later(entry)
                return None
            if gate is not None:
                await gate()
            if mounts:
                assert self._staging is not None
                assert pins is not None
                await trio.to_thread.run_sync(
                    self._staging.attach, entry.token, mounts, pins, entry.pid
                )
        except (NotStageable, OSError) as exc:
            log.warning("pooled_mounts_failed", extra={**fields, "detail": str(exc)})
            self._discard_later(entry)
            return None
        except PropagationMissing as exc:
            self._stop_staging(exc)
            self._discard_later(entry)
            return None
        except BaseException:
            if pins is not None:
                pins.close()
            # Inline (shielded, bounded): this may be a cancellation of everything.
            await self._discard(entry, "not_handed_out")
            raise
        if pins is not None:
            pins.close()  # the mounts hold the directories now
        # Its server now works for a session: the CPU weight of any other container (in the
        # background: an engine call is not worth a session's wait; a few ms at weight 2 are).
        self._restore_cpu_weight_soon(entry, fields)
        staging = self._staging if entry.staged else None
        return HandedOut(
            entry.token, entry.container, bytes(entry.early_stdout), staging, entry.greeting
        )

    def _restore_cpu_weight_soon(self, entry: _Pooled, fields: dict[str, Any]) -> None:
        if entry.full_weight:
            return
        entry.full_weight = True
        assert self._nursery is not None
        self._nursery.start_soon(_contained, self._restore_cpu_weight, entry, fields)

    async def _restore_cpu_weight(self, entry: _Pooled, fields: dict[str, Any]) -> None:
        try:
            await self._runtime.set_cpu_shares(entry.container.id, DEFAULT_CPU_SHARES)
        except FabricError as exc:
            # Gone already (a short session), or the engine away: it only runs at low weight.
            log.info("pooled_cpu_weight_not_restored", extra={**fields, "reason": exc.reason})

    def _discard_later(self, entry: _Pooled) -> None:
        """Remove, in the background, a container taken from the pool but not handed out."""
        self._discarding[entry.token] = entry
        assert self._nursery is not None
        self._nursery.start_soon(_contained, self._discard, entry, "not_handed_out")

    def _stop_staging(self, exc: PropagationMissing) -> None:
        _say_mounts_unavailable(exc)
        self._staging = None
        self._handle(StagingLost())


async def open_warm_pool(
    runtime: Runtime,
    suite: Suite,
    pooling: Pooling,
    *,
    identity: ContainerIdentity,
    stopping: trio.Event,
    teardown_deadline: Callable[[], float],
    metrics: Metrics,
    refused: Collection[str] = (),
) -> WarmPool | None:
    """The warm pool of ``suite``'s services, as ``pooling`` (the settings') says, None if no
    service keeps one; with a staging area for sessions' mounts where the runtime and the
    orchestrator's privileges allow it (else the log says once why sessions with mounts get
    fresh containers). ``refused``: the services refused for their secrets (none of them is
    pooled)."""
    if not any(pooling.targets.values()):
        return None
    staging: StagingArea | None = None
    if runtime.capabilities.mounts_on_host_reach_containers:
        owner = {k: v for k, v in identity.labels().items() if k.startswith("reactor-fabric.owner")}
        try:
            staging = await trio.to_thread.run_sync(
                lambda: StagingArea.open(
                    identity.instance_id,
                    suite.orchestrator.allowed_mount_targets,
                    owner=owner,
                    this_host=hostname(),
                )
            )
        except StagingUnavailable as exc:
            _say_mounts_unavailable(exc)
    else:
        log.info("pool_mounts_unavailable", extra={"reason": RUNTIME, "runtime": runtime.name})
    return WarmPool(
        runtime,
        suite.mcp_services,
        pooling,
        identity=identity,
        staging=staging,
        stopping=stopping,
        teardown_deadline=teardown_deadline,
        metrics=metrics,
        refused=refused,
    )


async def _contained(work: Callable[..., Awaitable[None]], *args: Any) -> None:
    """Run one of the pool's tasks so that a bug in it is logged, not raised into the
    orchestrator's root nursery (the pool and every session go on; what the task held is
    removed when the pool stops)."""
    try:
        await work(*args)
    except* Exception as failure:
        log.error("pool_task_failed", exc_info=failure)


def _say_mounts_unavailable(exc: StagingUnavailable) -> None:
    """The one log line that says why sessions with mounts get fresh containers."""
    log.warning(
        "pool_mounts_unavailable",
        extra={
            "reason": exc.reason,
            "detail": str(exc),
            "effect": "sessions with mounts get a fresh container",
        },
    )


async def _greeting(container: Container) -> Greeted | GreetingFailed:
    """Greet ``container``'s server (its stdin and stdout are the pool's until it is handed
    out); the outcome, within GREETING_SECONDS."""
    greeting = Greeting()
    outcome: Greeted | GreetingFailed = greeting.expired()  # unless it is done in time
    with trio.move_on_after(GREETING_SECONDS):
        try:
            await container.stdin.send_all(initialize_request(__version__))
            answer: Greeted | GreetingFailed | None = None
            while answer is None:
                data = await container.stdout.receive_some(READ_CHUNK)
                answer = greeting.feed(bytes(data)) if data else greeting.ended()
            if isinstance(answer, Greeted):
                await container.stdin.send_all(INITIALIZED)
            outcome = answer
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            outcome = greeting.ended()
        except FramingError as exc:
            outcome = GreetingFailed("greeting_invalid", str(exc))
    return outcome
