"""What a worker thread asks of the Docker engine: each operation in the Engine API's calls.

Every function here takes an :class:`~.engine_api.EngineClient` and blocks on the engine;
:mod:`.docker` runs each through :class:`~.docker_calls.DockerCalls` (a worker thread, a time
bound, errors translated), so none is called on the trio thread. They hold what differs between
engines: Podman's named volumes for pinned mounts, its own API for a CPU weight, its answers
that come a moment early and are asked again (bounded: :data:`REMOVE_RETRIES`,
:data:`INSPECT_RETRIES`). A container's create payload is built in :mod:`.docker_payload`; what
an engine's error means is decided in :mod:`.docker_errors`.

Resource handling: what an operation makes and then fails on, it removes before it raises —
a create's volumes, a probe's container; a removal removes the container's volumes too; the
attach's socket is handed out standalone (:func:`detach_socket`), closed by its new owner.

Error handling: engine errors are raised as the client raises them (the caller translates them),
except where the answer means there is nothing to do (a container or volume already gone),
and a volume that cannot be removed is logged (``volume_remove_failed``), not raised: it must
not hide the error of the start or removal it cleans up after.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from .._errors import ContainerStartFailure
from .._reasons import ATTACH_UNSUPPORTED
from ..policy.container_spec import ContainerSpec
from ..policy.pinning import PinSet
from .docker_errors import (
    container_gone,
    explain,
    podman_process_ending,
    podman_still_exiting,
    removal_in_progress,
)
from .docker_payload import (
    PINNED_VOLUME_NAME,
    EngineMount,
    SocketSources,
    container_config,
    host_config,
    output,
    podman_pinned_volumes,
    socket_stdio_entrypoint,
)
from .engine_api import AttachNotHandedOver, EngineClient, EngineError, NotFound

# Logged under the Docker runtime's name, as before its modules were split (operators filter
# the log by it).
log = logging.getLogger("reactor_fabric.runtime.docker")

REMOVE_RETRIES = 3
REMOVE_RETRY_PAUSE = 0.1
INSPECT_RETRIES = 3
# How long a container whose output ended may still be reported running before its exit is
# given as unknown, and the pause between two looks (see settled_state).
EXIT_SETTLE_SECONDS = 2.0
EXIT_SETTLE_PAUSE = 0.05


def create_container(
    client: EngineClient,
    spec: ContainerSpec,
    pins: PinSet | None,
    *,
    podman: bool,
    secrets: Callable[[], EngineMount] | None = None,
    sockets: SocketSources | None = None,
    hold: bool = False,
) -> str:
    """Create the container of ``spec``; its id.

    On Podman (``podman``) the pinned mounts' named volumes are made first, and removed again
    if anything after fails (only those made here: a name taken already is someone else's).
    ``secrets`` gives the file secrets' bind, once the volumes are made. With ``sockets``
    (socket stdio) the image's entrypoint and command are asked of the engine, to be run
    behind ``fabric-stdio`` (``hold``: which waits for the orchestrator's GO to run them).
    """
    # Podman ignores a volume's driver options in a container's create: its pinned mounts
    # are named volumes, made first (see podman_pinned_volumes).
    volumes = podman_pinned_volumes(spec, pins) if podman else {}
    made: dict[str, dict[str, Any]] = {}  # only these are ours to remove on failure
    try:
        for target, volume in volumes.items():
            client.create_volume(volume)
            made[target] = volume
        secrets_bind = secrets() if secrets is not None else None
        entrypoint: list[str] | None = None
        if sockets is not None:
            config = client.inspect_image(spec.image).get("Config") or {}
            entrypoint = socket_stdio_entrypoint(
                config, spec, egress=sockets.egress is not None, hold=hold
            )
        host = host_config(spec, pins, named_volumes=volumes, secrets=secrets_bind, sockets=sockets)
        return client.create_container(
            container_config(spec, host, entrypoint=entrypoint), name=spec.name
        )
    except BaseException:
        remove_volumes(client, made)
        raise


def undo_create(
    client: EngineClient, spec: ContainerSpec, pins: PinSet | None, *, podman: bool
) -> None:
    """Remove what a create of ``spec`` may have made, whether or not the engine answered it:
    the container (its name finds it either way) and, on Podman, its pinned mounts' volumes."""
    remove_quietly(client, spec.name, named_volumes=podman)
    remove_volumes(client, podman_pinned_volumes(spec, pins) if podman else {})


def paths_in_image(
    client: EngineClient,
    image: str,
    paths: Sequence[str],
    *,
    labels: dict[str, str],
    probe_name: str,
    known: MutableMapping[tuple[str, str], bool],
) -> frozenset[str]:
    """Which of ``paths`` exist in ``image``; ``known`` remembers each (image id, path).

    Asked of a container created from the image and never started (the engine's archive API
    answers 200 or 404 for a path), removed at once; it carries ``labels``, so the sweeper
    finds it if we die meanwhile. Nothing of the image runs.
    """
    image_id = str(client.inspect_image(image)["Id"])
    unknown = [path for path in paths if (image_id, path) not in known]
    if unknown:
        created = client.create_container(
            {
                "Image": image,
                "Labels": labels,
                "Entrypoint": ["/reactor-fabric-probe-never-started"],
                "NetworkDisabled": True,
                "HostConfig": {"NetworkMode": "none"},
            },
            name=probe_name,
        )
        try:
            for path in unknown:
                known[(image_id, path)] = client.path_exists(created, path)
        finally:
            client.remove_container(created)
    return frozenset(path for path in paths if known[(image_id, path)])


def attach_socket(client: EngineClient, container_id: str, *, stderr_only: bool) -> socket.socket:
    """The container's attach connection (stdin, stdout and stderr, or stderr alone) as a
    standalone non-blocking socket."""
    stdio = "0" if stderr_only else "1"
    params = {"stdin": stdio, "stdout": stdio, "stderr": "1", "stream": "1"}
    try:
        sock = client.attach_socket(container_id, params)
    except AttachNotHandedOver as exc:
        raise ContainerStartFailure(
            f"the engine cannot attach the container's stdio as a stream: {exc}",
            reason=ATTACH_UNSUPPORTED,
        ) from None
    sock.setblocking(False)
    return sock


def update_cpu_shares(
    client: EngineClient, container_id: str, shares: int, *, podman_version: str | None
) -> None:
    """Change a running container's CPU weight; on Podman (``podman_version``: its version)
    through its own API, since Podman 4 has no Docker-style update (its own changes the
    cgroup)."""
    if podman_version is None:
        client.update_container(container_id, {"CpuShares": shares})
        return
    client.request(
        "POST",
        f"/v{podman_version}/libpod/containers/{container_id}/update",
        body={"cpu": {"shares": shares}},
        versioned=False,
    )


def memory_stats(client: EngineClient, container_id: str) -> int | None:
    """The container's memory in use, from one stats sample (see :func:`memory_in_use`)."""
    return memory_in_use(client.stats_once(container_id))


def memory_in_use(report: Any) -> int | None:
    """The memory in use of one stats report (Docker's and Podman's compat one alike): usage
    less the page cache (cgroup v1 ``total_inactive_file``/``cache``, v2 ``inactive_file``), as
    ``docker stats`` shows it; None without a figure."""
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


def inspect_container(client: EngineClient, container_id: str) -> dict[str, Any]:
    """The engine's inspect of a container, asked again when Podman trips over the container's
    process ending at that moment (REMOVE_RETRY_PAUSE apart, INSPECT_RETRIES in all)."""
    for attempt in range(INSPECT_RETRIES):
        try:
            found: dict[str, Any] = client.inspect_container(container_id)
        except EngineError as exc:
            if podman_process_ending(exc) and attempt + 1 < INSPECT_RETRIES:
                time.sleep(REMOVE_RETRY_PAUSE)
                continue
            raise
        return found
    raise AssertionError("unreachable: the last attempt returns or raises")


def settled_state(client: EngineClient, container_id: str) -> dict[str, Any]:
    """The ``State`` of a container whose output ended: its process has exited then, or is
    about to, and an engine may report it a moment later (Podman does), so one still said to
    run is asked again, :data:`EXIT_SETTLE_PAUSE` apart, for up to
    :data:`EXIT_SETTLE_SECONDS`."""
    state: dict[str, Any] = inspect_container(client, container_id)["State"]
    settled_by = time.monotonic() + EXIT_SETTLE_SECONDS
    while state.get("Running") and time.monotonic() < settled_by:
        time.sleep(EXIT_SETTLE_PAUSE)
        state = inspect_container(client, container_id)["State"]
    return state


def stop_and_remove(
    client: EngineClient, container: str, *, grace: float | None, named_volumes: bool
) -> None:
    """Stop the container (SIGTERM, then SIGKILL after ``grace`` s; none if None) and remove
    it; gone is fine."""
    if grace is not None:
        try:
            client.stop(container, grace=max(0, round(grace)))
        except EngineError as exc:
            if container_gone(exc):
                return
            # Not running, or being removed already: removal below decides.
    remove_quietly(client, container, named_volumes=named_volumes)


def remove_quietly(client: EngineClient, container: str, *, named_volumes: bool = False) -> None:
    """Remove a container (and, with ``named_volumes``, Podman's volumes that carried its
    pinned mounts); gone is fine."""
    volumes = _pinned_volume_names(client, container) if named_volumes else []
    for attempt in range(REMOVE_RETRIES):
        try:
            # v=True: the anonymous volumes that carry pinned mounts go with the container.
            client.remove_container(container)
        except EngineError as exc:
            if container_gone(exc):
                break
            if removal_in_progress(exc):
                return  # whoever removes it, removes its volumes
            if podman_still_exiting(exc) and attempt + 1 < REMOVE_RETRIES:
                time.sleep(REMOVE_RETRY_PAUSE)
                continue
            raise
        break
    for name in volumes:
        _remove_volume_quietly(client, name)


def _pinned_volume_names(client: EngineClient, container: str) -> list[str]:
    """The named volumes of ours a container uses (Podman's pinned mounts; none on Docker)."""
    try:
        mounts = client.inspect_container(container).get("Mounts") or []
    except EngineError:
        return []  # gone (or going): an abandoned create's own cleanup names them
    return [
        str(mount["Name"])
        for mount in mounts
        if mount.get("Type") == "volume" and PINNED_VOLUME_NAME.fullmatch(str(mount.get("Name")))
    ]


def remove_volumes(client: EngineClient, volumes: dict[str, dict[str, Any]]) -> None:
    """Remove these volumes (``POST /volumes/create`` bodies by target); gone is fine."""
    for volume in volumes.values():
        _remove_volume_quietly(client, volume["Name"])


def _remove_volume_quietly(client: EngineClient, name: str) -> None:
    try:
        client.remove_volume(name)
    except NotFound:
        return
    except EngineError as exc:
        log.warning("volume_remove_failed", extra={"volume": name, "detail": explain(exc)})


def runtime_honoured(
    client: EngineClient, image: str, runtime: str, labels: dict[str, str], *, podman: bool
) -> str:
    """The runtime the engine gives a container of ``image`` that names ``runtime``: created
    (never started: nothing of it runs), asked, removed. Podman's Docker-compatible inspect
    says "oci" whatever the runtime is: its own API says which (and Podman 4 drops the runtime
    a container names through the compatible API: runc it is)."""
    container_id = client.create_container(
        {
            "Image": image,
            "Cmd": ["true"],
            "Labels": labels,
            "NetworkDisabled": True,
            "HostConfig": {"Runtime": runtime, "NetworkMode": "none", **output()},
        }
    )
    try:
        if podman:
            answer = client.request(
                "GET", f"/v4.0.0/libpod/containers/{container_id}/json", versioned=False
            )
            return str((answer.json() or {}).get("OCIRuntime") or "")
        inspected = inspect_container(client, container_id)
        return str((inspected.get("HostConfig") or {}).get("Runtime") or "")
    finally:
        remove_quietly(client, container_id)
