"""The Docker runtime: containers through the Docker Engine API (Docker's, or Podman's).

:class:`DockerRuntime` meets :class:`~.base.Runtime`: it starts a container (:meth:`spawn`:
pull, our sockets, create, attach, start, stdio connected, pinned mounts checked), answers what
the rest of the product asks of one (exit status, PID, memory, CPU weight), removes it, and
lists those labelled as ours. It decides what is asked and in which order; the rest is in its
parts:

- :mod:`.docker_calls` — every engine call in a worker thread, bounded in time and in
  parallelism, abandoned work undone;
- :mod:`.docker_operations` — what each call asks of the engine (and Podman's differences);
  :mod:`.docker_pin_check` — the pinned mounts checked through ``/proc``;
- :mod:`.docker_payload` — the container spec as the create payload (pure);
- :mod:`.docker_errors` — what the engine's failures mean, as the product's errors (pure);
- :mod:`.docker_sockets` — the sockets of ours a container gets (socket stdio, egress proxy,
  fabric socket); :mod:`.docker_container` — a started container's streams.

A spawned container's stdin and stdout are a Unix socket of its own to us (the engine is not on
the relay's path), its stderr a hijacked HTTP connection to the engine, attached *before* the
container starts (so no early output is lost); where socket stdio cannot be used, all three go
over the attach. Either way a container looks like any other runtime's.

Error handling: every failure is one of the product's errors — DockerUnavailable (-32001) when
the engine is not reached or does not answer in time, ContainerStartFailure (-32002) for
anything about one container or image, SecurityViolation for a mount refused — translated at
each call (:mod:`.docker_errors`). Removal never raises (it runs in ``finally`` blocks).

Resource handling: a start that fails or is cancelled removes what it made, also a create still
running in an abandoned thread (by the name the spec gave it); the spec's pins are released
once no engine call can resolve them; :meth:`DockerRuntime.close` waits, bounded, for
abandoned threads before it closes the client and removes the socket area.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

import trio

from .._errors import ContainerStartFailure, FabricError, SecurityViolation
from .._reasons import IMAGE_NOT_FOUND, MOUNT_TARGET_IN_IMAGE, STDIO_NOT_CONNECTED
from .._sockets import LeanSocketStream
from ..policy.container_parts.context import RuntimeCapabilities
from ..policy.container_parts.ownership import LABEL_MANAGED
from ..policy.container_spec import ContainerSpec
from ..policy.pinning import PinSet
from .base import ContainerExit, Gate, ManagedContainer
from .child_sockets import ChildSockets
from .docker_calls import (
    ABANDONED_WORK_BOUND,
    DOCKER_CALL_TIMEOUT,
    DOCKER_PULL_TIMEOUT,
    DOCKER_QUEUE_TIMEOUT,
    DockerCalls,
)
from .docker_container import OUTPUT_BUFFER_BYTES, DockerContainer
from .docker_operations import (
    attach_socket,
    create_container,
    inspect_container,
    memory_stats,
    paths_in_image,
    remove_quietly,
    runtime_honoured,
    settled_state,
    stop_and_remove,
    undo_create,
    update_cpu_shares,
)
from .docker_payload import EngineMount, secrets
from .docker_pin_check import verify_mounts
from .docker_sockets import ContainerSockets, DockerSockets
from .egress_proxy import EgressProxy
from .engine_api import EngineClient, ImageNotFound
from .engines import EngineIdentity, EngineName, engine_is_local, identify
from .gvisor_runtime import GvisorRuntime
from .secret_files import SecretFiles
from .stdio_sockets import GO

log = logging.getLogger(__name__)


class DockerRuntime:
    """A Docker engine reached through its Engine API (:mod:`.engine_api`) in worker threads.

    ``base_url`` defaults to the environment (``DOCKER_HOST``, else the local socket). The client
    is created lazily, so an orchestrator can start (and report an unhealthy engine) while the
    engine is down, and reconnects once it is back. ``engine`` is the engine the operator chose
    (see :mod:`.engines`); once it answers, :attr:`identity` and :attr:`name` say which one it
    is — Podman serves the same API.
    """

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
        gvisor_runtime: str = "runsc",
    ) -> None:
        self._base_url = base_url
        # gVisor's runtime as the engine registered it: known once the engine first answered
        # (its /info, at each connection), checked at the start (verify_isolation).
        self.gvisor = GvisorRuntime(gvisor_runtime)
        self.name: str = engine
        self.selected: EngineName = engine
        self.identity: EngineIdentity | None = None
        self._engine = DockerCalls(
            base_url,
            call_timeout=call_timeout,
            queue_timeout=queue_timeout,
            max_parallel_calls=max_parallel_calls,
            identified=self._identified,
            runtimes=self.gvisor.listed,
        )
        self._max_frame = max_frame_bytes
        # (image id, path) → whether the image has something at path (see paths_in_image).
        self._image_paths: dict[tuple[str, str], bool] = {}
        # Creates that cancellations abandoned, undone when their threads ended.
        self.abandoned_creates_removed = 0
        # File secrets are bound from this machine's memory: only a local engine sees them.
        self._engine_is_local = engine_is_local(base_url, os.environ)
        self._secret_files = SecretFiles()
        # Containers with an egress allowlist: served while whoever runs the orchestrator runs
        # it (EgressProxy.run); without it, such a service is refused (egress_unavailable).
        self.egress = EgressProxy()
        # Agent containers' fabric sockets (their child sessions), served while whoever runs
        # the orchestrator runs them (ChildSockets.run).
        self.children = ChildSockets()
        # Socket stdio (see stdio_sockets): wanted, and only where the engine reaches our files.
        self.sockets = DockerSockets(
            wanted=socket_stdio and self._engine_is_local,
            parent=stdio_parent,
            helper=stdio_helper,
            connect_bound=call_timeout,
            egress=self.egress,
            children=self.children,
            exit_status=self.exit_status,
        )

    @property
    def capabilities(self) -> RuntimeCapabilities:
        """Stdio through a socket of its own once the socket stdio area is open (``attach``
        when it is not wanted or could not be opened, ``""`` before the first start); egress
        and child sessions through sockets in that area (see :mod:`.docker_sockets`); file
        secrets from this machine's memory, so only with a local engine; and mounts made on
        this host below a bind source with slave propagation appear in the container (the warm
        pool's staging area) — when the engine shares our mount namespace, which the first
        hand-out checks."""
        return RuntimeCapabilities(
            stdio=self.sockets.stdio,
            egress_missing=self.sockets.egress_missing(),
            file_secrets_missing=""
            if self._engine_is_local
            else (
                "file secrets need the engine on this machine (a Unix socket); with a remote "
                "engine use as: env"
            ),
            child_sessions=True,
            mounts_on_host_reach_containers=True,
            gvisor_runtime=self.gvisor.wanted if self.gvisor.found else "",
            gvisor_missing=self.gvisor.missing(),
        )

    async def verify_isolation(self, image: str, labels: dict[str, str]) -> None:
        """Check that the engine honours gVisor's runtime when a container names it: one
        container of ``image`` (local) created, asked and removed, never started. An engine that
        lists the runtime but runs such a container under another (Podman 4: its compatible
        API drops the runtime a container names) has no gVisor for the orchestrator: its
        services asking for it are refused (``isolation_unavailable``), never run under runc."""
        if not self.gvisor.found:
            return

        def check(client: EngineClient) -> str:
            return runtime_honoured(
                client, image, self.gvisor.wanted, labels, podman=self.on_podman
            )

        self.gvisor.ran_under(await self._engine.call("create", check), str(self.identity))

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

    async def ping(self, *, time_bound: float | None = None) -> str:
        """The engine's version; raises DockerUnavailable if it does not answer."""

        def version(client: EngineClient) -> str:
            identity = identify(client.version())
            self._identified(identity)
            return identity.version

        return await self._engine.call("ping", version, time_bound=time_bound)

    async def image_id(self, image: str) -> str | None:
        """The id of ``image`` as the engine has it now; None when it does not have it."""

        def inspect(client: EngineClient) -> str | None:
            try:
                found = client.inspect_image(image)
            except ImageNotFound:
                return None
            return str(found["Id"])

        return await self._engine.call("inspect", inspect)

    async def spawn(
        self, spec: ContainerSpec, pins: PinSet | None = None, *, gate: Gate | None = None
    ) -> DockerContainer:
        """Create the container, attach its stdio, start it (see the module's resource notes).

        With socket stdio, the container's socket listens before the create, and the container
        is handed out only once its ``fabric-stdio`` connected; the socket's path is unlinked
        whatever happened (ContainerStartFailure ``stdio_not_connected`` if it never did).

        Pinned mounts (``pins``) are checked once the container runs: each must be the
        pinned object, by device and inode, or the container is removed and SecurityViolation
        (``mount_changed``) raised. The pins are released once the start can no longer use
        them — by the start's own thread if a cancellation abandoned it.

        ``gate`` (see :data:`~.base.Gate`): with socket stdio the container starts at once, its
        ``fabric-stdio`` held (``--hold``) until the gate returned and the mounts were checked,
        then sent GO; with the engine's attach, the start itself waits for the gate. Either
        way the server's first instruction comes after the gate.
        """
        handed_to_start = False
        held: ContainerSockets | None = None
        try:
            if spec.pull == "always":
                await self._pull(spec.image)
            held = await self.sockets.listen(spec)
            hold = gate is not None and held.stdio is not None
            try:
                await self._refuse_targets_in_image(spec)
                container_id = await self._create(spec, pins, held, hold=hold)
            except ContainerStartFailure as exc:
                if exc.reason != IMAGE_NOT_FOUND or spec.pull != "missing":
                    raise
                await self._pull(spec.image)
                await self._refuse_targets_in_image(spec)
                container_id = await self._create(spec, pins, held, hold=hold)
            stdio = held.stdio
            container: DockerContainer | None = None
            try:
                stream = await self._attach(container_id, stderr_only=stdio is not None)
                container = DockerContainer(
                    container_id,
                    spec.name,
                    stream,
                    max_frame=self._max_frame,
                    max_buffered=OUTPUT_BUFFER_BYTES,
                    socket_stdio=stdio is not None,
                )
                handed_to_start = True
                self.sockets.serve(held, container_id, spec)
                if gate is not None and not hold:
                    await gate()  # nothing can hold the server but the start itself
                await self._engine.call(
                    "start",
                    lambda client: client.start(container_id),
                    release=pins.close if pins is not None else None,
                )
                connection = None
                if stdio is not None:
                    connection = await self.sockets.accept_stdio(stdio, container_id)
                    container.connected(connection)
                if pins is not None and len(pins):
                    await self._engine.call(
                        "verify", lambda c: verify_mounts(c, container_id, pins)
                    )
                if hold:
                    assert gate is not None
                    assert connection is not None
                    await _run_held(connection, gate)
            except BaseException:
                with trio.CancelScope(shield=True):
                    if container is not None:
                        await container.aclose()
                    await self.remove(container_id)
                raise
            return container
        finally:
            if held is not None:
                held.close()  # the stdio socket connected or not; those never served
            if pins is not None and not handed_to_start:
                pins.close()

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

        Asked of a container created from the image and never started, removed at once (see
        :func:`.docker_operations.paths_in_image`); nothing of the image runs.
        """

        def probe(client: EngineClient) -> frozenset[str]:
            return paths_in_image(
                client, image, paths, labels=labels, probe_name=probe_name, known=self._image_paths
            )

        def remove_probe(client: EngineClient, _result: frozenset[str] | None) -> None:
            remove_quietly(client, probe_name)

        return await self._engine.call("probe", probe, if_abandoned=remove_probe)

    async def _create(
        self,
        spec: ContainerSpec,
        pins: PinSet | None = None,
        sockets: ContainerSockets | None = None,
        *,
        hold: bool = False,
    ) -> str:
        """Create the container (its id), given ``sockets`` it has of ours (``hold``: its
        ``fabric-stdio`` waits for GO); a create that a cancellation abandoned is undone by its
        own thread, by the spec's name."""
        sources = self.sockets.sources(sockets) if sockets is not None else None
        secrets = functools.partial(self._secrets_mount, spec) if spec.secret_files else None

        def create(client: EngineClient) -> str:
            # on_podman is read here, in the thread: the first call is what identifies the engine.
            return create_container(
                client, spec, pins, podman=self.on_podman, secrets=secrets, sockets=sources,
                hold=hold,
            )  # fmt: skip

        def remove_by_name(client: EngineClient, _created: str | None) -> None:
            # Whether or not the engine answered, it may have made the container: the name
            # finds it either way.
            undo_create(client, spec, pins, podman=self.on_podman)
            self.abandoned_creates_removed += 1
            log.info("abandoned_container_removed", extra={"container_name": spec.name})

        return await self._engine.call("create", create, if_abandoned=remove_by_name)

    def _secrets_mount(self, spec: ContainerSpec) -> EngineMount:
        """The service's file secrets, read-only at /run/secrets (see :mod:`.secret_files`;
        only with a local engine, which the composer asked of :attr:`capabilities`)."""
        [mount] = secrets(self._secret_files.directory_for(spec)).mounts
        return mount

    async def _attach(self, container_id: str, *, stderr_only: bool = False) -> LeanSocketStream:
        def attach(client: EngineClient) -> socket.socket:
            return attach_socket(client, container_id, stderr_only=stderr_only)

        def close_socket(_client: EngineClient, sock: socket.socket | None) -> None:
            if sock is not None:
                sock.close()

        sock = await self._engine.call("attach", attach, if_abandoned=close_socket)
        try:
            return LeanSocketStream(sock)
        except BaseException:
            sock.close()
            raise

    async def _pull(self, image: str) -> None:
        last = image.rsplit("/", maxsplit=1)[-1]
        repository, tag = (image.rsplit(":", 1)) if ":" in last else (image, "latest")
        await self._engine.call(
            "pull",
            lambda client: client.pull(repository, tag, timeout=DOCKER_PULL_TIMEOUT),
            time_bound=DOCKER_PULL_TIMEOUT,
        )

    async def main_pid(self, container_id: str) -> int:
        """The host PID of the container's first process (0 when it does not run)."""

        def inspect(client: EngineClient) -> int:
            state: dict[str, Any] = inspect_container(client, container_id)["State"]
            return int(state.get("Pid") or 0) if state.get("Running") else 0

        return await self._engine.call("inspect", inspect)

    async def memory_usage(self, container_id: str) -> int | None:
        """Memory in use from the stats API (Docker's and Podman's compat one alike): usage
        less the page cache, as ``docker stats`` shows it; None without a figure."""
        return await self._engine.call("stats", lambda c: memory_stats(c, container_id))

    async def set_cpu_shares(self, container_id: str, shares: int) -> None:
        """Change a running container's CPU weight."""

        def update(client: EngineClient) -> None:
            podman_version: str | None = None
            if self.on_podman:
                identity = self.identity
                podman_version = identity.version if identity is not None else "4.0.0"
            update_cpu_shares(client, container_id, shares, podman_version=podman_version)

        await self._engine.call("update", update)

    async def exit_status(self, container_id: str) -> ContainerExit:
        """Exit code and OOM flag of a container that has stopped (or None if still running).

        Asked when the container's output ended: its process has exited then, or is about to,
        and an engine may report it a moment later (Podman does), so a container still said to
        run is asked again (:func:`.docker_operations.settled_state`).
        """

        def inspect(client: EngineClient) -> ContainerExit:
            state = settled_state(client, container_id)
            running = bool(state.get("Running"))
            return ContainerExit(
                exit_code=None if running else int(state.get("ExitCode", -1)),
                oom_killed=bool(state.get("OOMKilled")),
                error=str(state.get("Error") or ""),
            )

        return await self._engine.call("inspect", inspect)

    async def remove(self, container: str, *, grace: float | None = None) -> None:
        """Stop (SIGTERM, then SIGKILL after ``grace`` s; at once if None) and remove.

        Error handling: never raises for a container that is already gone; logs and swallows
        engine errors, since removal runs in ``finally`` blocks whose own error must win.
        """

        def stop_then_remove(client: EngineClient) -> None:
            stop_and_remove(client, container, grace=grace, named_volumes=self.on_podman)

        self.egress.stop(container)
        self.children.stop(container)
        try:
            await self._engine.call("remove", stop_then_remove)
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

        def listing(client: EngineClient) -> list[ManagedContainer]:
            found = client.containers(labels=filters)
            return [
                ManagedContainer(
                    id=str(item["Id"]),
                    name=str((item.get("Names") or ["?"])[0]).lstrip("/"),
                    labels=dict(item.get("Labels") or {}),
                    created=float(item.get("Created") or 0),
                )
                for item in found
            ]

        return await self._engine.call("list", listing)

    @property
    def abandoned_calls(self) -> int:
        """Worker threads still running after trio stopped waiting for them."""
        return self._engine.abandoned_calls

    async def settle(self, bound: float = ABANDONED_WORK_BOUND) -> bool:
        """Wait until abandoned threads have finished (and cleaned up); False if ``bound`` passed.

        The wait is abandonable itself: a caller's deadline (a shutdown's) wins over ``bound``.
        """
        return await self._engine.settle(bound)

    async def close(self) -> None:
        """Wait (bounded) for abandoned threads, then close the client and remove the socket
        stdio area."""
        await self._engine.close()
        await self.sockets.close()
        await trio.to_thread.run_sync(self._secret_files.close)


async def _run_held(connection: LeanSocketStream, gate: Gate) -> None:
    """Let a held container's server run (``fabric-stdio --hold``): once ``gate`` returned,
    the byte GO on its stdio connection (whose stdin has no other writer yet).
    ContainerStartFailure (``stdio_not_connected``) if the container ended meanwhile."""
    await gate()
    try:
        await connection.send_all(GO)
    except trio.BrokenResourceError as exc:
        raise ContainerStartFailure(
            "the container ended while it waited for what its server needs (before its "
            "server ran): see its stderr",
            reason=STDIO_NOT_CONNECTED,
        ) from exc
