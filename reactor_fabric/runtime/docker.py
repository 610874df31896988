"""The Docker runtime: the only module that talks to the Docker Engine API.

docker-py is synchronous, so every API call runs in a worker thread (never on the trio thread),
bounded in time (30 s by default, the product's contract) and in parallelism (a capacity
limiter). Errors are translated here, at the boundary, into the product's exception tree:
connection problems and time-outs become :class:`~reactor_fabric.DockerUnavailable` (-32001),
everything about a particular container or image becomes
:class:`~reactor_fabric.ContainerStartFailure` (-32002).

A spawned container's stdin and stdout are a Unix socket of its own to us (:mod:`.stdio_sockets`:
the engine is not on the relay's path), its stderr a hijacked HTTP connection to the engine,
attached *before* the container starts (so no early output is lost); both are handed to trio as
:class:`~reactor_fabric._sockets.LeanSocketStream` objects: relay I/O never hops to a thread.
Where socket stdio cannot be used, all three go over the attach, on which Docker multiplexes
stdout and stderr; they are split here (:mod:`.docker_framing`, :mod:`.demux`), so a container
looks like any other runtime's either way.

Resource handling: a call that is cancelled (or times out) while its thread runs is *abandoned*:
trio stops waiting, but the thread goes on. Such a thread cleans up after itself when it ends —
an abandoned create removes the container by the name the spec gave it (the engine may have made
it even if the call failed), an abandoned attach closes its socket — and :meth:`close` waits,
bounded, for abandoned threads, so shutdown never races them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import docker
import docker.errors
import docker.types
import requests.exceptions
import trio

from .._errors import ContainerStartFailure, DockerUnavailable, FabricError, SecurityViolation
from .._reasons import (
    ATTACH_UNSUPPORTED,
    DOCKER_TIMEOUT,
    DOCKER_UNAVAILABLE,
    IMAGE_NOT_FOUND,
    MOUNT_TARGET_IN_IMAGE,
    MOUNT_UNVERIFIABLE,
    SECRET_UNAVAILABLE,
    STDIO_NOT_CONNECTED,
    engine_call_failed,
)
from .._sockets import LeanSocketStream
from ..config.secrets import SECRETS_DIR
from ..policy.container_spec import (
    EGRESS_PROXY_PORT,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_SERVICE,
    ContainerSpec,
    refuse_egress,
    refuse_unavailable_secrets,
)
from ..policy.mount_spec import MountSpec
from ..policy.owner import hostname
from ..policy.pinning import Pin, PinSet
from ..protocol.egress import Allowlist
from .base import ContainerExit, ManagedContainer
from .child_sockets import CHILD_BACKLOG, CHILD_SOCKET_TARGET, ChildSockets
from .demux import Demultiplexer
from .docker_framing import DockerFrameDecoder
from .egress_proxy import EgressProxy
from .engines import EngineIdentity, EngineName, identify
from .secret_files import SecretFiles
from .stdio_sockets import (
    EGRESS_BACKLOG,
    EGRESS_SOCKET_TARGET,
    HELPER_TARGET,
    SOCKET_TARGET,
    PendingStdio,
    StdioArea,
    StdioUnavailable,
    wrapped_command,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

DOCKER_CALL_TIMEOUT = 30.0
# How long a call may wait for one of the max_parallel_calls slots before it begins (its own
# bound starts when it begins): a burst of sessions queues here behind a busy engine, and each
# call is then judged on the engine's answer, not on the queue ahead of it.
DOCKER_QUEUE_TIMEOUT = 300.0
# Pulling an image legitimately takes longer than an API call.
DOCKER_PULL_TIMEOUT = 600.0
# How long close() waits for threads that cancellations abandoned.
ABANDONED_WORK_BOUND = 35.0
# While a container's fabric-stdio has not connected, how often to ask whether it ended.
STDIO_CONNECT_POLL = 0.5
# On Podman, the named volumes of a container's pinned mounts: labelled with its name, and named
# NAME-mI (see podman_pinned_volumes).
LABEL_PINNED_VOLUME_OF = "reactor-fabric.pinned-volume-of"
_PINNED_VOLUME_NAME = re.compile(r"rf-[a-z0-9_.-]+-m[0-9]+")
# Stdout bytes read on the stderr reader's behalf, and stderr bytes, that may wait in memory.
OUTPUT_BUFFER_BYTES = 256 * 1024


class _NotRun(Exception):
    pass


class _Operation:
    """One worker-thread call, whether trio stopped waiting for it, and what it left behind."""

    __slots__ = ("abandoned", "client", "done", "lock", "result", "started")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = False
        self.done = False
        self.abandoned = False
        self.client: docker.APIClient | None = None
        self.result: Any = None

    def finish(self, client: docker.APIClient | None, result: object) -> bool:
        """Mark the call done (in its thread); whether trio had stopped waiting for it."""
        with self.lock:
            self.done = True
            self.client = client
            self.result = result
            return self.abandoned


@dataclass
class _ExtraSockets:
    """A container's sockets besides its stdio's, until their servers own them: its egress
    proxy's, its fabric socket (an agent's child sessions)."""

    egress: PendingStdio | None = None
    child: PendingStdio | None = None

    def close(self) -> None:
        for pending in (self.egress, self.child):
            if pending is not None:
                pending.close()
        self.egress = self.child = None


class DockerRuntime:
    """A Docker engine reached through docker-py in worker threads.

    ``base_url`` defaults to the environment (``DOCKER_HOST``, else the local socket). The client
    is created lazily, so an orchestrator can start (and report an unhealthy engine) while the
    engine is down, and reconnects once it is back. ``engine`` is the engine the operator chose
    (see :mod:`.engines`); once it answers, :attr:`identity` and :attr:`name` say which one it
    is — Podman serves the same API.
    """

    # A mount made on this host below a bind source with slave propagation appears in the
    # container (the warm pool's staging area) — when the engine shares our mount namespace,
    # which the first hand-out checks.
    mounts_on_host_reach_containers = True

    def __init__(
        self,
        base_url: str | None = None,
        *,
        call_timeout: float = DOCKER_CALL_TIMEOUT,
        queue_timeout: float = DOCKER_QUEUE_TIMEOUT,
        max_parallel_calls: int = 16,
        max_frame_bytes: int = 16 * 1024 * 1024,
        engine: EngineName = "docker",
        socket_stdio: bool = True,
        stdio_parent: str | None = None,
        stdio_helper: str | None = None,
    ) -> None:
        self._base_url = base_url
        self.name: str = engine
        self.selected: EngineName = engine
        self.identity: EngineIdentity | None = None
        self._call_timeout = call_timeout
        self._queue_timeout = queue_timeout
        self._limiter = trio.CapacityLimiter(max_parallel_calls)
        self._client: docker.APIClient | None = None
        self._client_lock = threading.Lock()
        self._max_frame = max_frame_bytes
        # (image id, path) → whether the image has something at path (see paths_in_image).
        self._image_paths: dict[tuple[str, str], bool] = {}
        # Threads trio stopped waiting for that have not finished yet, and creates undone so.
        self._abandoned = 0
        self.abandoned_creates_removed = 0
        self._abandoned_done = threading.Condition()
        # Socket stdio (see stdio_sockets): wanted, and only where the engine reaches our files.
        self._want_socket_stdio = socket_stdio and engine_is_local(base_url, os.environ)
        self._stdio_parent = stdio_parent
        self._stdio_helper = stdio_helper
        self._stdio_area: StdioArea | None = None
        self._stdio_opened = False
        self._stdio_lock = trio.Lock()
        # File secrets are bound from this machine's memory: only a local engine sees them.
        self._engine_is_local = engine_is_local(base_url, os.environ)
        self._secret_files = SecretFiles()
        # Containers with an egress allowlist: served while whoever runs the orchestrator runs
        # it (EgressProxy.run); without it, such a service is refused (egress_unavailable).
        self.egress = EgressProxy()
        # Agent containers' fabric sockets (their child sessions), served while whoever runs
        # the orchestrator runs them (ChildSockets.run).
        self.children = ChildSockets()

    @property
    def stdio(self) -> str:
        """``socket`` once the socket stdio area is open, ``attach`` when it is not wanted or
        could not be opened, ``""`` before the first start (see :class:`~.base.Runtime`)."""
        if not self._want_socket_stdio:
            return "attach"
        if not self._stdio_opened:
            return ""
        return "attach" if self._stdio_area is None else "socket"

    # --- plumbing -------------------------------------------------------------------------

    def _connect(self) -> docker.APIClient:
        # Runs in a worker thread: "auto" asks the engine for its API version, so one client
        # works with old engines (20.10 speaks 1.41) and new ones (which refuse old versions).
        with self._client_lock:
            if self._client is None:
                kwargs: dict[str, Any] = docker.utils.kwargs_from_env()  # type: ignore[attr-defined]
                if self._base_url is not None:
                    kwargs["base_url"] = self._base_url
                client = docker.APIClient(
                    version="auto", timeout=max(1, int(self._call_timeout)), **kwargs
                )
                self._identified(identify(client.version()))
                self._client = client
            return self._client

    @property
    def on_podman(self) -> bool:
        """Whether the engine is Podman (as it said, else as chosen): a few calls differ."""
        return self.name == "podman"

    def _identified(self, identity: EngineIdentity) -> None:
        """Note what the engine says it is (logged when first known, or when it changed)."""
        if identity == self.identity:
            return
        self.identity, self.name = identity, identity.name
        log.info(
            "container_engine",
            extra={
                "engine": identity.name,
                "engine_version": identity.version,
                "api_version": identity.api_version,
                "selected": self.selected,
            },
        )
        if identity.name != self.selected:
            log.warning(
                "container_engine_not_as_selected",
                extra={"selected": self.selected, "engine": identity.name},
            )

    async def _call(
        self,
        action: str,
        fn: Callable[[docker.APIClient], T],
        *,
        time_bound: float | None = None,
        if_abandoned: Callable[[docker.APIClient, T | None], None] | None = None,
        release: Callable[[], None] | None = None,
    ) -> T:
        """Run ``fn(client)`` in a thread; translate errors; give up after the time bound.

        If trio stops waiting (cancellation, or the bound), the thread runs on; when it ends it
        calls ``if_abandoned(client, result or None)`` to undo what it did. ``release`` is
        called once ``fn`` can no longer run: when it has ended (in its thread, abandoned or
        not), or at once if the thread never began it.
        """
        # The default bound counts from when the call begins in its thread (a slot may take a
        # while under a burst: DOCKER_QUEUE_TIMEOUT); an explicit time_bound is the caller's
        # whole wait (a health check must answer within it, queue or not).
        bound = self._call_timeout if time_bound is None else time_bound
        queued = time_bound is None and self._queue_timeout > bound
        operation = _Operation()
        scope = trio.CancelScope(
            deadline=trio.current_time() + (self._queue_timeout if queued else bound)
        )
        trio_token = trio.lowlevel.current_trio_token()

        def bound_from_now() -> None:  # (in trio's thread)
            scope.deadline = min(scope.deadline, trio.current_time() + bound)

        def in_thread() -> T:
            with operation.lock:
                if operation.abandoned:
                    raise _NotRun  # trio gave up before the thread began: nothing to undo
                operation.started = True
            if queued:
                with contextlib.suppress(trio.RunFinishedError):
                    trio_token.run_sync_soon(bound_from_now)
            result: T | None = None
            client: docker.APIClient | None = None
            try:
                client = self._connect()
                result = fn(client)
                return result
            finally:
                if release is not None:
                    release()
                if operation.finish(client, result):
                    self._undo(action, operation, if_abandoned)

        try:
            with scope:
                try:
                    result: T = await trio.to_thread.run_sync(
                        in_thread, abandon_on_cancel=True, limiter=self._limiter
                    )
                except FabricError:
                    raise
                except trio.Cancelled:
                    self._abandon(action, operation, if_abandoned)
                    raise
                except Exception as exc:
                    raise translate_docker_error(exc, action) from exc
                return result
            began = operation.started
            self._abandon(action, operation, if_abandoned)
        finally:
            if release is not None and self._never_ran(operation):
                release()
        if queued and not began:
            raise DockerUnavailable(
                f"the Docker engine is busy: {action} waited {self._queue_timeout:g} s for one "
                f"of the {self._limiter.total_tokens:g} calls it may have at once",
                reason=DOCKER_TIMEOUT,
                action=action,
            )
        raise DockerUnavailable(
            f"the Docker engine did not answer {action} within {bound:g} s",
            reason=DOCKER_TIMEOUT,
            action=action,
        )

    def _abandon(
        self,
        action: str,
        operation: _Operation,
        if_abandoned: Callable[[docker.APIClient, Any], None] | None,
    ) -> None:
        """trio stopped waiting for ``operation``: whatever it did must be undone, once.

        Either its thread still runs (it undoes its work when it ends), or it has already
        ended and trio never took its result (the cancellation won the race with the thread's
        answer): then nobody else knows the result, so a thread of its own undoes it now.
        """
        with operation.lock:
            if operation.abandoned:
                return  # already abandoned (a timeout reaches here twice), or never ran
            operation.abandoned = True
            if not operation.started:
                return  # the thread will find it abandoned and not run the call
            ended = operation.done
            with self._abandoned_done:
                self._abandoned += 1
        if ended:
            threading.Thread(
                target=self._undo,
                args=(action, operation, if_abandoned),
                name=f"reactor-fabric-undo-{action}",
                daemon=True,
            ).start()

    def _undo(
        self,
        action: str,
        operation: _Operation,
        if_abandoned: Callable[[docker.APIClient, Any], None] | None,
    ) -> None:
        try:
            if if_abandoned is not None and operation.client is not None:
                if_abandoned(operation.client, operation.result)
        except Exception as exc:  # noqa: BLE001 - a cleanup of last resort
            log.error("abandoned_cleanup_failed", extra={"action": action, "detail": str(exc)})
        finally:
            self._abandoned_finished()

    @staticmethod
    def _never_ran(operation: _Operation) -> bool:
        """True if the thread has not begun the call, and now never will."""
        with operation.lock:
            if operation.started:
                return False
            operation.abandoned = True  # a thread that begins late finds this and does nothing
            return True

    def _abandoned_finished(self) -> None:
        with self._abandoned_done:
            self._abandoned -= 1
            self._abandoned_done.notify_all()

    @property
    def abandoned_calls(self) -> int:
        """Worker threads still running after trio stopped waiting for them."""
        with self._abandoned_done:
            return self._abandoned

    # --- API ------------------------------------------------------------------------------

    async def ping(self, *, time_bound: float | None = None) -> str:
        """The engine's version; raises DockerUnavailable if it does not answer."""

        def version(client: docker.APIClient) -> str:
            identity = identify(client.version())
            self._identified(identity)
            return identity.version

        return await self._call("ping", version, time_bound=time_bound)

    async def image_id(self, image: str) -> str | None:
        """The id of ``image`` as the engine has it now; None when it does not have it."""

        def inspect(client: docker.APIClient) -> str | None:
            try:
                found = client.inspect_image(image)  # type: ignore[no-untyped-call]
            except docker.errors.ImageNotFound:
                return None
            return str(found["Id"])

        return await self._call("inspect", inspect)

    async def spawn(self, spec: ContainerSpec, pins: PinSet | None = None) -> DockerContainer:
        """Create the container, attach its stdio, start it (see the module's resource notes).

        With socket stdio, the container's socket listens before the create, and the container
        is handed out only once its ``fabric-stdio`` connected; the socket's path is unlinked
        whatever happened (ContainerStartFailure ``stdio_not_connected`` if it never did).

        Pinned mounts (``pins``) are checked once the container runs: each must be the
        pinned object, by device and inode, or the container is removed and SecurityViolation
        (``mount_changed``) raised. The pins are released once the start can no longer use
        them — by the start's own thread if a cancellation abandoned it.
        """
        refuse_unavailable_secrets(spec)
        handed_to_start = False
        pending: PendingStdio | None = None
        extra = _ExtraSockets()
        try:
            if spec.pull == "always":
                await self._pull(spec.image)
            pending = await self._listen_for_stdio(spec)
            extra.egress = await self._listen_for_egress(spec, pending)
            extra.child = await self._listen_for_child(spec, pending)
            try:
                await self._refuse_targets_in_image(spec)
                container_id = await self._create(spec, pins, pending, extra)
            except ContainerStartFailure as exc:
                if exc.reason != IMAGE_NOT_FOUND or spec.pull != "missing":
                    raise
                await self._pull(spec.image)
                await self._refuse_targets_in_image(spec)
                container_id = await self._create(spec, pins, pending, extra)
            container: DockerContainer | None = None
            try:
                stream = await self._attach(container_id, stderr_only=pending is not None)
                container = DockerContainer(
                    container_id,
                    spec.name,
                    stream,
                    max_frame=self._max_frame,
                    max_buffered=OUTPUT_BUFFER_BYTES,
                    socket_stdio=pending is not None,
                )
                handed_to_start = True
                self._serve_extra(extra, container_id, spec)
                await self._call(
                    "start",
                    lambda c: c.start(container_id),
                    release=pins.close if pins is not None else None,
                )
                if pending is not None:
                    container.connected(await self._accept_stdio(pending, container_id))
                if pins is not None and len(pins):
                    await self._call("verify", lambda c: verify_mounts(c, container_id, pins))
            except BaseException:
                with trio.CancelScope(shield=True):
                    if container is not None:
                        await container.aclose()
                    await self.remove(container_id)
                raise
            return container
        finally:
            if pending is not None:
                pending.close()  # connected or not, nothing may connect any more
            extra.close()  # those never served
            if pins is not None and not handed_to_start:
                pins.close()

    async def _listen_for_stdio(self, spec: ContainerSpec) -> PendingStdio | None:
        """A socket for this container's stdio, or None to relay stdio through the engine.

        The area is opened on the first spawn (it is named after the instance the spec's labels
        carry); if it cannot be, the log says why once and every container uses the engine.
        """
        if not self._want_socket_stdio:
            return None
        async with self._stdio_lock:
            if not self._stdio_opened:
                self._stdio_area = await trio.to_thread.run_sync(self._open_stdio_area, spec.labels)
                # Only now: `stdio` must not say "attach" while the area is being made.
                self._stdio_opened = True
        area = self._stdio_area
        if area is None:
            return None
        try:
            return await trio.to_thread.run_sync(area.listen)
        except OSError as exc:
            # Our directory is damaged (removed by a cleaner of /tmp, a full disk): this
            # container's stdio goes through the engine; the next one tries again.
            log.warning("socket_stdio_failed", extra={"directory": area.root, "detail": str(exc)})
            return None

    async def _listen_for_egress(
        self, spec: ContainerSpec, stdio: PendingStdio | None
    ) -> PendingStdio | None:
        """The socket of this container's egress proxy when its service has an allowlist;
        ContainerStartFailure (``egress_unavailable``) where it cannot have one: the container
        reaches the proxy through ``fabric-stdio``, so only with socket stdio, and only while
        the proxy runs. Refused rather than started with a network, or without the one
        destination it needs."""
        if spec.egress is None:
            return None
        area = self._stdio_area
        if stdio is None or area is None:
            refuse_egress(
                spec,
                "its proxy is reached through socket stdio, which this engine does not have (a "
                "remote engine, or the fabric-stdio helper missing: see the log's "
                "socket_stdio_unavailable)",
            )
        if not self.egress.running:
            refuse_egress(spec, "the egress proxy does not run in this process")
        assert area is not None  # refused above otherwise
        return await trio.to_thread.run_sync(
            functools.partial(area.listen, backlog=EGRESS_BACKLOG, suffix=".egress.sock")
        )

    def _serve_extra(self, extra: _ExtraSockets, container_id: str, spec: ContainerSpec) -> None:
        """Serve the container's egress proxy and fabric socket from now on (connections wait
        in their backlogs until it starts); each server owns its socket from here, and stops
        at the container's removal."""
        if extra.egress is not None and spec.egress is not None:
            self.egress.serve(
                container_id,
                spec.labels.get(LABEL_SERVICE, ""),
                Allowlist.of(spec.egress),
                extra.egress.listener,
                extra.egress.path,
            )
            extra.egress = None
        if extra.child is not None:
            self.children.serve(container_id, spec.name, extra.child.listener, extra.child.path)
            extra.child = None

    async def _listen_for_child(
        self, spec: ContainerSpec, stdio: PendingStdio | None
    ) -> PendingStdio | None:
        """The socket of an agent container's child session, when its spec asks for one and
        the stdio area and the fabric sockets are there; None otherwise: the agent then runs
        without the suite's services (its relay finds no socket), which the log says."""
        if not spec.child_fabric:
            return None
        area = self._stdio_area
        if stdio is None or area is None or not self.children.running:
            log.warning(
                "child_fabric_unavailable",
                extra={
                    "service": spec.labels.get(LABEL_SERVICE, ""),
                    "detail": "no socket stdio here"
                    if stdio is None or area is None
                    else "the fabric sockets are not served in this process",
                },
            )
            return None
        return await trio.to_thread.run_sync(
            functools.partial(area.listen, backlog=CHILD_BACKLOG, suffix=".fabric.sock")
        )

    def _open_stdio_area(self, labels: dict[str, str]) -> StdioArea | None:
        owner = {k: v for k, v in labels.items() if k.startswith("reactor-fabric.owner")}
        instance = labels.get(LABEL_INSTANCE) or f"pid-{os.getpid()}"
        try:
            area = StdioArea.open(
                instance,
                owner=owner,
                this_host=hostname(),
                helper=self._stdio_helper,
                parent=self._stdio_parent,
            )
        except StdioUnavailable as exc:
            log.warning(
                "socket_stdio_unavailable",
                extra={"reason": exc.reason, "detail": str(exc), "stdio": "engine"},
            )
            return None
        log.info("socket_stdio", extra={"directory": area.root})
        return area

    async def _accept_stdio(self, pending: PendingStdio, container_id: str) -> LeanSocketStream:
        """The container's stdio connection, once its ``fabric-stdio`` connected.

        It connects as soon as the container runs; while it has not, the container is asked
        now and then whether it ended (a program that cannot start) — bounded by the API
        call time-out in all.
        """
        with trio.move_on_after(self._call_timeout):
            while True:
                with trio.move_on_after(STDIO_CONNECT_POLL):
                    await trio.lowlevel.wait_readable(pending.listener)
                try:
                    connection, _address = pending.listener.accept()
                except (BlockingIOError, ConnectionAbortedError):
                    # Nothing to take yet (or a connection that gave up): did it end?
                    ended = await self.exit_status(container_id)
                    if ended.exit_code is not None:
                        raise ContainerStartFailure(
                            "the container ended before its stdio connected "
                            f"(exit code {ended.exit_code}): see its stderr",
                            reason=STDIO_NOT_CONNECTED,
                            exit_code=ended.exit_code,
                        ) from None
                    continue
                except OSError as exc:
                    raise ContainerStartFailure(
                        f"the container's stdio socket failed: {exc}",
                        reason=STDIO_NOT_CONNECTED,
                    ) from exc
                try:
                    connection.setblocking(False)
                    return LeanSocketStream(connection)
                except BaseException:
                    connection.close()
                    raise
        raise ContainerStartFailure(
            f"the container's stdio did not connect within {self._call_timeout:g} s",
            reason=STDIO_NOT_CONNECTED,
        )

    async def _refuse_targets_in_image(self, spec: ContainerSpec) -> None:
        """A mount allowed only at its source's own path must not land on anything the image
        has: it would hide the service's own files (its command, its libraries) behind the
        client's. Raises SecurityViolation (``mount_target_in_image``)."""
        targets = [mount.target for mount in spec.mounts if mount.check_in_image]
        if not targets:
            return
        found = await self.paths_in_image(spec.image, targets, spec.labels, f"{spec.name}-probe")
        if found:
            target = min(found)
            raise SecurityViolation(
                f"mount target {target!r} exists in the image {spec.image}: a mount there "
                "would hide the service's own files; mount under an allowed mount target "
                "(e.g. /workspace) instead",
                reason=MOUNT_TARGET_IN_IMAGE,
                path=target,
            )

    async def paths_in_image(
        self, image: str, paths: Sequence[str], labels: dict[str, str], probe_name: str
    ) -> frozenset[str]:
        """Which of ``paths`` exist in ``image`` (remembered per image id and path).

        Asked of a container created from the image and never started (the engine's archive
        API answers 200 or 404 for a path), removed at once; it carries ``labels``, so the
        sweeper finds it if we die meanwhile. Nothing of the image runs.
        """

        def probe(client: docker.APIClient) -> frozenset[str]:
            image_id = str(client.inspect_image(image)["Id"])  # type: ignore[no-untyped-call]
            unknown = [path for path in paths if (image_id, path) not in self._image_paths]
            if unknown:
                created = client.create_container(
                    image=image,
                    name=probe_name,
                    labels=labels,
                    entrypoint=["/reactor-fabric-probe-never-started"],
                    network_disabled=True,
                    host_config=client.create_host_config(network_mode="none"),
                )
                url = f"{client.base_url}/v{client.api_version}/containers/{created['Id']}/archive"
                try:
                    for path in unknown:
                        answer = client.head(url, params={"path": path})
                        if answer.status_code not in (200, 404):
                            answer.raise_for_status()
                        self._image_paths[(image_id, path)] = answer.status_code == 200
                finally:
                    client.remove_container(created["Id"], force=True, v=True)
            return frozenset(path for path in paths if self._image_paths[(image_id, path)])

        def remove_probe(client: docker.APIClient, _result: frozenset[str] | None) -> None:
            _remove_quietly(client, probe_name)

        return await self._call("probe", probe, if_abandoned=remove_probe)

    async def _create(
        self,
        spec: ContainerSpec,
        pins: PinSet | None = None,
        stdio: PendingStdio | None = None,
        extra: _ExtraSockets | None = None,
    ) -> str:
        area = self._stdio_area
        egress = extra.egress if extra is not None else None
        child = extra.child if extra is not None else None

        def create(client: docker.APIClient) -> str:
            # Podman ignores a volume's driver options in a container's create: its pinned
            # mounts are named volumes, made first (see podman_pinned_volumes).
            volumes = podman_pinned_volumes(spec, pins) if self.on_podman else {}
            made: dict[str, dict[str, Any]] = {}  # only these are ours to remove on failure
            try:
                for target, volume in volumes.items():
                    client.create_volume(**volume)
                    made[target] = volume
                kwargs = host_config_kwargs(spec, pins, named_volumes=volumes)
                if spec.secret_files:
                    kwargs["mounts"].append(self._secrets_mount(spec))
                entrypoint: list[str] | None = None
                if stdio is not None and area is not None:
                    config = client.inspect_image(spec.image)["Config"] or {}  # type: ignore[no-untyped-call]
                    entrypoint = wrapped_command(
                        config.get("Entrypoint"),
                        config.get("Cmd"),
                        spec.command,
                        egress_port=EGRESS_PROXY_PORT if egress is not None else None,
                    )
                    kwargs["mounts"] += stdio_mounts(area.helper, stdio.path)
                    if egress is not None:
                        kwargs["mounts"].append(
                            docker.types.Mount(
                                target=EGRESS_SOCKET_TARGET,
                                source=egress.path,
                                type="bind",
                                read_only=True,
                            )
                        )
                    if child is not None:
                        kwargs["mounts"].append(
                            docker.types.Mount(
                                target=CHILD_SOCKET_TARGET,
                                source=child.path,
                                type="bind",
                                read_only=True,
                            )
                        )
                host_config = client.create_host_config(**kwargs)
                return _create_container(client, spec, host_config, entrypoint=entrypoint)
            except BaseException:
                _remove_volumes(client, made)
                raise

        def remove_by_name(client: docker.APIClient, _created: str | None) -> None:
            # Whether or not the engine answered, it may have made the container: the name
            # finds it either way.
            _remove_quietly(client, spec.name, named_volumes=self.on_podman)
            _remove_volumes(client, podman_pinned_volumes(spec, pins) if self.on_podman else {})
            self.abandoned_creates_removed += 1
            log.info("abandoned_container_removed", extra={"container_name": spec.name})

        return await self._call("create", create, if_abandoned=remove_by_name)

    def _secrets_mount(self, spec: ContainerSpec) -> docker.types.Mount:
        """The service's file secrets, read-only at /run/secrets (see :mod:`.secret_files`)."""
        if not self._engine_is_local:
            service = spec.labels.get(LABEL_SERVICE, "")
            raise ContainerStartFailure(
                f"service {service!r}: file secrets need the engine on this machine (a Unix "
                "socket); with a remote engine use as: env",
                reason=SECRET_UNAVAILABLE,
                service=service,
            )
        source = self._secret_files.directory_for(spec)
        return docker.types.Mount(target=SECRETS_DIR, source=source, type="bind", read_only=True)

    async def _attach(self, container_id: str, *, stderr_only: bool = False) -> LeanSocketStream:
        stdio = 0 if stderr_only else 1
        params = {"stdin": stdio, "stdout": stdio, "stderr": 1, "stream": 1}

        def attach(client: docker.APIClient) -> socket.socket:
            raw = client.attach_socket(container_id, params=params)
            return detach_socket(raw)

        def close_socket(_client: docker.APIClient, sock: socket.socket | None) -> None:
            if sock is not None:
                sock.close()

        sock = await self._call("attach", attach, if_abandoned=close_socket)
        try:
            return LeanSocketStream(sock)
        except BaseException:
            sock.close()
            raise

    async def _pull(self, image: str) -> None:
        last = image.rsplit("/", maxsplit=1)[-1]
        repository, tag = (image.rsplit(":", 1)) if ":" in last else (image, "latest")
        await self._call(
            "pull", lambda c: c.pull(repository, tag=tag), time_bound=DOCKER_PULL_TIMEOUT
        )

    async def main_pid(self, container_id: str) -> int:
        """The host PID of the container's first process (0 when it does not run)."""

        def inspect(client: docker.APIClient) -> int:
            state: dict[str, Any] = inspect_container(client, container_id)["State"]
            return int(state.get("Pid") or 0) if state.get("Running") else 0

        return await self._call("inspect", inspect)

    async def memory_usage(self, container_id: str) -> int | None:
        """Memory in use from the stats API (Docker's and Podman's compat one alike): usage
        less the page cache (cgroup v1 ``total_inactive_file``/``cache``, v2
        ``inactive_file``), as ``docker stats`` shows it; None without a figure."""

        def stats(client: docker.APIClient) -> int | None:
            # one_shot: a single sample, without waiting a second for the next one (API 1.41).
            report: Any = client.stats(container_id, stream=False, one_shot=True)
            return memory_in_use(report)

        return await self._call("stats", stats)

    async def set_cpu_shares(self, container_id: str, shares: int) -> None:
        """Change a running container's CPU weight."""

        def update(client: docker.APIClient) -> None:
            if not self.on_podman:
                client.update_container(container_id, cpu_shares=shares)
                return
            # Podman 4 has no Docker-style update; its own API has (and changes the cgroup).
            identity = self.identity
            version = identity.version if identity is not None else "4.0.0"
            response = client.post(
                f"{client.base_url}/v{version}/libpod/containers/{container_id}/update",
                json={"cpu": {"shares": shares}},
                timeout=client.timeout,
            )
            if response.status_code >= 400:
                raise docker.errors.APIError(response.text.strip(), response=response)

        await self._call("update", update)

    async def exit_status(self, container_id: str) -> ContainerExit:
        """Exit code and OOM flag of a container that has stopped (or None if still running)."""

        def inspect(client: docker.APIClient) -> ContainerExit:
            state: dict[str, Any] = inspect_container(client, container_id)["State"]
            running = bool(state.get("Running"))
            return ContainerExit(
                exit_code=None if running else int(state.get("ExitCode", -1)),
                oom_killed=bool(state.get("OOMKilled")),
                error=str(state.get("Error") or ""),
            )

        return await self._call("inspect", inspect)

    async def remove(self, container: str, *, grace: float | None = None) -> None:
        """Stop (SIGTERM, then SIGKILL after ``grace`` s; at once if None) and remove.

        Error handling: never raises for a container that is already gone; logs and swallows
        engine errors, since removal runs in ``finally`` blocks whose own error must win.
        """

        def stop_and_remove(client: docker.APIClient) -> None:
            if grace is not None:
                try:
                    client.stop(container, timeout=max(0, round(grace)))
                except docker.errors.APIError as exc:
                    if container_gone(exc):
                        return
                    # Not running, or being removed already: removal below decides.
            _remove_quietly(client, container, named_volumes=self.on_podman)

        self.egress.stop(container)
        self.children.stop(container)
        try:
            await self._call("remove", stop_and_remove)
        except FabricError as exc:
            log.error(
                "container_remove_failed",
                extra={"container": container[:64], "reason": exc.reason, "detail": str(exc)},
            )

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[ManagedContainer]:
        """Containers (running or not) labelled as managed by Reactor-Fabric."""
        filters = [f"{LABEL_MANAGED}=true"]
        filters += [f"{key}={value}" for key, value in (extra_labels or {}).items()]

        def listing(client: docker.APIClient) -> list[ManagedContainer]:
            found: list[dict[str, Any]] = client.containers(all=True, filters={"label": filters})
            return [
                ManagedContainer(
                    id=str(item["Id"]),
                    name=str((item.get("Names") or ["?"])[0]).lstrip("/"),
                    labels=dict(item.get("Labels") or {}),
                    created=float(item.get("Created") or 0),
                )
                for item in found
            ]

        return await self._call("list", listing)

    async def settle(self, bound: float = ABANDONED_WORK_BOUND) -> bool:
        """Wait until abandoned threads have finished (and cleaned up); False if ``bound`` passed.

        The wait is abandonable itself: a caller's deadline (a shutdown's) wins over ``bound``.
        """

        def wait_for_abandoned() -> bool:
            with self._abandoned_done:
                return self._abandoned_done.wait_for(lambda: self._abandoned == 0, bound)

        if not self.abandoned_calls:
            await trio.lowlevel.checkpoint()
            return True
        return await trio.to_thread.run_sync(wait_for_abandoned, abandon_on_cancel=True)

    async def close(self) -> None:
        """Wait (bounded) for abandoned threads, then close the client and remove the socket
        stdio area."""
        await self.settle()
        client, self._client = self._client, None
        if client is not None:
            await trio.to_thread.run_sync(client.close)
        area, self._stdio_area = self._stdio_area, None
        if area is not None:
            await trio.to_thread.run_sync(area.close)
        await trio.to_thread.run_sync(self._secret_files.close)


# A container's first process is briefly not inspectable by its own uid: between the runtime's
# switch to that user and its exec, the kernel marks it non-dumpable (EACCES on /proc/PID/root).
# On a loaded machine that window is wide enough to hit; the check is retried through it.
VERIFY_ATTEMPTS = 20
VERIFY_RETRY_SECONDS = 0.05


def verify_mounts(
    client: docker.APIClient,
    container_id: str,
    pins: PinSet,
    *,
    stat: Callable[[str], os.stat_result] = os.stat,
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Check, from the host, that each pinned target in the container is the pinned object.

    Looks through ``/proc/PID/root`` of the container's first process, so it needs the
    orchestrator and the engine in one PID namespace, and the right to look into that process
    (root, or the container's own uid); otherwise the container is refused as unverifiable.
    Permission refused is retried for up to a second (see :data:`VERIFY_ATTEMPTS`): never
    a mismatch, which is final. A container that already stopped is not checked: no client
    message can reach it, and its exit is reported as any other.
    """
    for attempt in range(VERIFY_ATTEMPTS):
        state: dict[str, Any] = inspect_container(client, container_id)["State"]
        pid = int(state.get("Pid") or 0)
        if not state.get("Running") or pid <= 0:
            return
        try:
            _verify_pins(pid, pins, stat, statvfs)
        except _NotInspectableYet as not_yet:
            if attempt + 1 == VERIFY_ATTEMPTS:
                raise _unverifiable(not_yet.pin, not_yet.error) from not_yet.error
            sleep(VERIFY_RETRY_SECONDS)
        else:
            return


class _NotInspectableYet(Exception):
    def __init__(self, pin: Pin, error: OSError) -> None:
        super().__init__(str(error))
        self.pin = pin
        self.error = error


def _verify_pins(
    pid: int,
    pins: PinSet,
    stat: Callable[[str], os.stat_result],
    statvfs: Callable[[str], os.statvfs_result],
) -> None:
    """Raises _NotInspectableYet (permission refused: retry) or SecurityViolation."""
    for pin in pins.pins:
        path = f"/proc/{pid}/root{pin.target}"
        try:
            found = stat(path)
            writable = pin.read_only and not statvfs(path).f_flag & os.ST_RDONLY
        except PermissionError as exc:
            raise _NotInspectableYet(pin, exc) from exc
        except OSError as exc:
            raise _unverifiable(pin, exc) from exc
        refused = pin.refusal(found, writable=writable)
        if refused is not None:
            raise refused


def _unverifiable(pin: Pin, exc: OSError) -> SecurityViolation:
    return SecurityViolation(
        f"the mount at {pin.target!r} could not be checked ({exc.strerror}); "
        "the orchestrator must share the engine's PID namespace and may need to run as "
        "the container's user",
        reason=MOUNT_UNVERIFIABLE,
        path=pin.path,
        target=pin.target,
    )


def _create_container(
    client: docker.APIClient,
    spec: ContainerSpec,
    host_config: Any,
    *,
    entrypoint: list[str] | None = None,
) -> str:
    """Create the container; with ``entrypoint`` (socket stdio), that is the whole program
    (``fabric-stdio`` in front of the image's entrypoint and command) and stdin stays closed
    on the engine's side."""
    result: dict[str, Any] = client.create_container(
        image=spec.image,
        command=spec.command if entrypoint is None else None,
        entrypoint=entrypoint,
        name=spec.name,
        environment=spec.environment,
        labels=spec.labels,
        user=spec.user,
        # docker-py adds StdinOnce: closing our side of stdin closes the server's stdin, which
        # is how MCP asks a stdio server to shut down. With socket stdio it is our socket's.
        stdin_open=entrypoint is None,
        tty=False,
        network_disabled=spec.network == "none",
        host_config=host_config,
    )
    return str(result["Id"])


# Podman answers a force-remove that meets a container exiting on its own with this (HTTP 500)
# instead of removing it; asked again a moment later, it does.
_PODMAN_EXITING = "container state improper"
REMOVE_RETRIES = 3
REMOVE_RETRY_PAUSE = 0.1


def _remove_quietly(
    client: docker.APIClient, container: str, *, named_volumes: bool = False
) -> None:
    """Remove a container (and, with ``named_volumes``, Podman's volumes that carried its
    pinned mounts); gone is fine."""
    volumes = _pinned_volume_names(client, container) if named_volumes else []
    for attempt in range(REMOVE_RETRIES):
        try:
            # v=True: the anonymous volumes that carry pinned mounts go with the container.
            client.remove_container(container, force=True, v=True)
        except docker.errors.APIError as exc:
            if container_gone(exc):
                break
            if exc.status_code == 409:
                return  # "removal already in progress": whoever removes it, removes its volumes
            exiting = _PODMAN_EXITING in str(exc.explanation or "")
            if exc.status_code == 500 and exiting and attempt + 1 < REMOVE_RETRIES:
                time.sleep(REMOVE_RETRY_PAUSE)
                continue
            raise
        break
    for name in volumes:
        _remove_volume_quietly(client, name)


# Podman 4 answers an inspect that meets the container's process exiting with this (HTTP 500:
# "read /proc/PID/cgroup: no such process") instead of its state; asked again, it reports the
# exit. Seen in the integration tests, at a session's end.
_PODMAN_PROCESS_GONE = "no such process"
INSPECT_RETRIES = 3


def inspect_container(client: docker.APIClient, container_id: str) -> dict[str, Any]:
    """The engine's inspect of a container, asked again when Podman trips over the container's
    process ending at that moment (REMOVE_RETRY_PAUSE apart, INSPECT_RETRIES in all)."""
    for attempt in range(INSPECT_RETRIES):
        try:
            found: dict[str, Any] = client.inspect_container(container_id)
        except docker.errors.APIError as exc:
            exiting = _PODMAN_PROCESS_GONE in str(exc.explanation or "")
            if exc.status_code == 500 and exiting and attempt + 1 < INSPECT_RETRIES:
                time.sleep(REMOVE_RETRY_PAUSE)
                continue
            raise
        return found
    raise AssertionError("unreachable: the last attempt returns or raises")


def container_gone(exc: docker.errors.APIError) -> bool:
    """Whether the engine said the container does not exist: Docker with 404, Podman also with
    500 "no such container" when the container went while it looked (a removal racing)."""
    if isinstance(exc, docker.errors.NotFound):
        return True
    return exc.status_code == 500 and "no such container" in str(exc.explanation or "")


def podman_pinned_volumes(spec: ContainerSpec, pins: PinSet | None) -> dict[str, dict[str, Any]]:
    """The named volumes that carry a spec's pinned mounts (``pins``) on Podman, by target: the
    ``create_volume`` arguments of each.

    Why named volumes: Podman ignores the driver options of a volume declared in a container's
    create (the container would get an empty volume; the pin check refuses it). Each is bound
    to our descriptor like Docker's anonymous one, and named after its container (``NAME-mI``)
    so that whoever removes the container finds them. ``uid``/``gid`` are the pinned object's
    own: without them Podman changes the owner of the volume's root — the user's directory —
    to the container's user on first use. Read-only comes from the container's mount, since
    Podman drops ``ro`` from the options next to ``uid``.
    """
    if pins is None:
        return {}
    volumes: dict[str, dict[str, Any]] = {}
    for index, mount in enumerate(spec.mounts):
        pin = pins.for_target(mount.target)
        if pin is None:
            continue
        uid, gid = pin.owner
        volumes[mount.target] = {
            "name": f"{spec.name}-m{index}",
            "driver": "local",
            "driver_opts": {
                "type": "none",
                "o": f"bind,uid={uid},gid={gid}",
                "device": pin.engine_source,
            },
            "labels": {**spec.labels, LABEL_PINNED_VOLUME_OF: spec.name},
        }
    return volumes


def _pinned_volume_names(client: docker.APIClient, container: str) -> list[str]:
    """The named volumes of ours a container uses (Podman's pinned mounts; none on Docker)."""
    try:
        mounts = client.inspect_container(container).get("Mounts") or []
    except docker.errors.APIError:
        return []  # gone (or going): an abandoned create's own cleanup names them
    return [
        str(mount["Name"])
        for mount in mounts
        if mount.get("Type") == "volume" and _PINNED_VOLUME_NAME.fullmatch(str(mount.get("Name")))
    ]


def _remove_volumes(client: docker.APIClient, volumes: dict[str, dict[str, Any]]) -> None:
    for volume in volumes.values():
        _remove_volume_quietly(client, volume["name"])


def _remove_volume_quietly(client: docker.APIClient, name: str) -> None:
    try:
        client.remove_volume(name, force=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        log.warning("volume_remove_failed", extra={"volume": name, "detail": _explain(exc)})


class _SocketStdin:
    __slots__ = ("_stream",)

    def __init__(self, stream: LeanSocketStream) -> None:
        self._stream = stream

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def send_eof(self) -> None:
        await self._stream.send_eof()


class DockerContainer:
    """A started Docker container: stdin, stdout and stderr.

    Attached through the engine, all three share the attach connection, split here. With
    ``socket_stdio`` the attach carries stderr only, and stdin and stdout are the container's
    own socket (:meth:`connected`, before the container is handed out).
    """

    def __init__(
        self,
        container_id: str,
        name: str,
        stream: LeanSocketStream,
        *,
        max_frame: int,
        max_buffered: int,
        socket_stdio: bool = False,
    ) -> None:
        self._id = container_id
        self._name = name
        self._stream = stream
        self._stdio: LeanSocketStream | None = None
        self._stdin = _SocketStdin(stream)
        decoder = DockerFrameDecoder(max_frame=max_frame)
        self._demux = Demultiplexer(
            stream, decoder.feed, max_buffered=max_buffered, stderr_only=socket_stdio
        )
        self._stdout: trio.abc.ReceiveStream = self._demux.stdout

    def connected(self, stdio: LeanSocketStream) -> None:
        """The container's stdio socket connected: it is now stdin and stdout."""
        self._stdio = stdio
        self._stdin = _SocketStdin(stdio)
        self._stdout = stdio

    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str:
        return self._name

    @property
    def socket_stdio(self) -> bool:
        """Whether stdin and stdout bypass the engine (see :mod:`.stdio_sockets`)."""
        return self._stdio is not None

    @property
    def stdin(self) -> _SocketStdin:
        return self._stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> trio.abc.ReceiveStream:
        return self._demux.stderr

    @property
    def stderr_dropped(self) -> int:
        return self._demux.stderr_dropped

    async def aclose(self) -> None:
        self._demux.close()  # readers waiting for the stdout reader get EOF, not a hang
        try:
            if self._stdio is not None:
                await self._stdio.aclose()
        finally:
            await self._stream.aclose()


def stdio_mounts(helper: str, socket_path: str) -> list[docker.types.Mount]:
    """The two binds socket stdio adds: our program and the container's socket, read-only.

    A socket bound read-only can still be connected (connecting is not writing to the file
    system); nothing in the container can replace either.
    """
    return [
        docker.types.Mount(target=HELPER_TARGET, source=helper, type="bind", read_only=True),
        docker.types.Mount(target=SOCKET_TARGET, source=socket_path, type="bind", read_only=True),
    ]


def engine_is_local(base_url: str | None, environ: Mapping[str, str]) -> bool:
    """Whether the engine is on this machine (a Unix socket): only then can a container be
    given a socket of ours by path."""
    address = base_url if base_url is not None else environ.get("DOCKER_HOST", "unix://")
    return address.startswith(("unix://", "/"))


def host_config_kwargs(
    spec: ContainerSpec,
    pins: PinSet | None = None,
    *,
    named_volumes: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``HostConfig`` of a spec: mounts as structured objects (``pins``: the mounts'
    sources pinned), limits and safe defaults (``named_volumes``: the volumes made for pinned
    mounts, by target; see :func:`podman_pinned_volumes`)."""
    security_opt = ["no-new-privileges:true"] if spec.no_new_privileges else []
    named = named_volumes or {}
    return {
        "mounts": [_mount(spec, mount, pins, named.get(mount.target)) for mount in spec.mounts],
        "network_mode": spec.network,
        "mem_limit": spec.memory_bytes,
        # Equal to the memory limit: no swap on top of it, so the limit means what it says.
        "memswap_limit": spec.memory_bytes,
        "nano_cpus": spec.nano_cpus,
        "pids_limit": spec.pids_limit,
        "cap_drop": ["ALL"],
        "cap_add": list(spec.cap_add) or None,
        "security_opt": security_opt,
        "read_only": spec.read_only_rootfs,
        "tmpfs": spec.tmpfs or None,
        "cpu_shares": spec.cpu_shares,
        "init": True,  # a real PID 1 that forwards signals and reaps zombies
        "auto_remove": False,  # we remove explicitly, after reading the exit code
        # The engine keeps no copy of what the server writes: its stdout is the session's
        # messages (a file's contents, a diff), which the engine's default driver (json-file,
        # no size limit) would store on the host's disk for the container's life, and encode
        # and write once more per message while the session waits. The orchestrator reads both
        # streams itself (stdout over the container's socket or the attach, stderr over the
        # attach) and logs stderr, bounded.
        "log_config": {"type": "none", "config": {}},
    }


def _mount(
    spec: ContainerSpec,
    mount: MountSpec,
    pins: PinSet | None,
    named: dict[str, Any] | None = None,
) -> docker.types.Mount:
    """A pinned mount as a ``local`` volume bound to our descriptor; else a plain bind.

    Why a volume: runc binds mount sources from inside the container's new mount namespace,
    where a bind from a descriptor of the host's namespace is refused (EINVAL). The ``local``
    volume driver mounts in the daemon's own (the host's) namespace — ``mount --bind
    /proc/PID/fd/N`` there follows the descriptor, not a path — and the container then gets a
    bind of that volume, whose path under the engine's data root nobody else can change.
    """
    if named is not None:  # Podman: the volume is made already
        return docker.types.Mount(
            target=mount.target,
            source=named["name"],
            type="volume",
            read_only=mount.read_only,
            no_copy=True,
        )
    pin = pins.for_target(mount.target) if pins is not None else None
    if pin is None:
        return docker.types.Mount(
            target=mount.target,
            source=mount.source,
            type="bind",
            read_only=mount.read_only,
            propagation=mount.propagation,
        )
    return docker.types.Mount(
        target=mount.target,
        source=None,  # anonymous: removed with the container (v=True)
        type="volume",
        # Read-only at the source, since Docker allows no read-only anonymous volume; a bind
        # of a read-only mount is read-only, and the container cannot remount it (no caps).
        driver_config=docker.types.DriverConfig(
            "local",
            {
                "type": "none",
                "o": "bind,ro" if mount.read_only else "bind",
                "device": pin.engine_source,
            },
        ),
        # Never copy the image's files at the target into the user's directory.
        no_copy=True,
        labels=spec.labels,
    )


def detach_socket(raw: Any) -> socket.socket:
    """A standalone socket for the hijacked attach connection docker-py returns.

    docker-py hands back the socket wrapped in HTTP response objects that close it when garbage
    collected; a duplicate of the file descriptor outlives them.
    """
    inner = getattr(raw, "_sock", raw)
    if not isinstance(inner, socket.socket):
        raise ContainerStartFailure(
            "the Docker connection is not a socket that can be relayed",
            reason=ATTACH_UNSUPPORTED,
            kind=type(raw).__name__,
        )
    duplicate = socket.socket(fileno=os.dup(inner.fileno()))
    response = getattr(raw, "_response", None)
    if response is not None:
        response.close()
    else:
        raw.close()
    duplicate.setblocking(False)
    return duplicate


_CONNECTION_ERRORS = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    ConnectionError,
    socket.timeout,
    FileNotFoundError,
)


def translate_docker_error(exc: BaseException, action: str) -> FabricError:
    """Map a docker-py / transport exception into the product's error tree."""
    if isinstance(exc, docker.errors.ImageNotFound) or (
        isinstance(exc, docker.errors.NotFound) and action in ("create", "pull")
    ):
        return ContainerStartFailure(
            f"image not found: {_explain(exc)}", reason=IMAGE_NOT_FOUND, action=action
        )
    if isinstance(exc, docker.errors.APIError):
        return ContainerStartFailure(
            f"Docker refused to {action}: {_explain(exc)}",
            reason=engine_call_failed(action),
            action=action,
            status=exc.status_code,
        )
    if isinstance(exc, _CONNECTION_ERRORS) or (
        isinstance(exc, docker.errors.DockerException) and _looks_like_connection(exc)
    ):
        return DockerUnavailable(
            f"cannot reach the Docker engine ({action}): {exc}",
            reason=DOCKER_UNAVAILABLE,
            action=action,
        )
    return ContainerStartFailure(
        f"Docker {action} failed: {exc}", reason=engine_call_failed(action), action=action
    )


def _looks_like_connection(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("connection", "socket", "refused", "no such file"))


def _explain(exc: docker.errors.APIError) -> str:
    explanation: object = exc.explanation
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return _said_once(str(explanation or exc))


def _said_once(text: str) -> str:
    """``text`` without an engine's repetition of itself: Docker wraps an error in its own
    words ("no such image: X: No such image: X"), and a user reads it on one line."""
    parts = text.split(": ")
    half, odd = divmod(len(parts), 2)
    if not odd and half and [p.lower() for p in parts[:half]] == [p.lower() for p in parts[half:]]:
        return ": ".join(parts[:half])
    return text


def memory_in_use(report: Any) -> int | None:
    """The memory in use of one stats report (see :meth:`DockerRuntime.memory_usage`)."""
    memory = report.get("memory_stats") if isinstance(report, dict) else None
    if not isinstance(memory, dict):
        return None
    usage = memory.get("usage")
    if not isinstance(usage, int) or isinstance(usage, bool):
        return None
    details = memory.get("stats")
    cache = 0
    if isinstance(details, dict):
        for name in ("total_inactive_file", "inactive_file", "cache"):
            value = details.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                cache = value
                break
    return usage - cache if cache <= usage else usage  # (a report that does not add up: usage)
