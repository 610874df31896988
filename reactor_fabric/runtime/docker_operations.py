"""What a worker thread asks of the Docker engine: each operation in docker-py's calls.

Every function here takes a docker-py client and blocks on the engine; :mod:`.docker` runs each
through :class:`~.docker_calls.DockerCalls` (a worker thread, a time bound, errors translated),
so none is called on the trio thread. They hold what differs between engines: Podman's named
volumes for pinned mounts, its own API for a CPU weight, its answers that come a moment early
and are asked again (bounded: :data:`REMOVE_RETRIES`, :data:`INSPECT_RETRIES`). A container's
create payload is built in :mod:`.docker_payload`; what an engine's error means is decided in
:mod:`.docker_errors`.

Resource handling: what an operation makes and then fails on, it removes before it raises —
a create's volumes, a probe's container; a removal removes the container's volumes too; the
attach's socket is handed out standalone (:func:`detach_socket`), closed by its new owner.

Error handling: engine errors are raised as docker-py raises them (the caller translates them),
except where the answer means there is nothing to do (a container or volume already gone),
and a volume that cannot be removed is logged (``volume_remove_failed``), not raised: it must
not hide the error of the start or removal it cleans up after.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import docker
import docker.errors
import docker.types

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
    SocketSources,
    create_kwargs,
    host_config_kwargs,
    podman_pinned_volumes,
    socket_stdio_entrypoint,
)

# Logged under the Docker runtime's name, as before its modules were split (operators filter
# the log by it).
log = logging.getLogger("reactor_fabric.runtime.docker")

REMOVE_RETRIES = 3
REMOVE_RETRY_PAUSE = 0.1
INSPECT_RETRIES = 3


def create_container(
    client: docker.APIClient,
    spec: ContainerSpec,
    pins: PinSet | None,
    *,
    podman: bool,
    secrets: Callable[[], docker.types.Mount] | None = None,
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
            client.create_volume(**volume)
            made[target] = volume
        secrets_bind = secrets() if secrets is not None else None
        entrypoint: list[str] | None = None
        if sockets is not None:
            config = client.inspect_image(spec.image)["Config"] or {}  # type: ignore[no-untyped-call]
            entrypoint = socket_stdio_entrypoint(
                config, spec, egress=sockets.egress is not None, hold=hold
            )
        host_config = client.create_host_config(
            **host_config_kwargs(
                spec, pins, named_volumes=volumes, secrets=secrets_bind, sockets=sockets
            )
        )
        result: dict[str, Any] = client.create_container(
            **create_kwargs(spec, host_config, entrypoint=entrypoint)
        )
        return str(result["Id"])
    except BaseException:
        remove_volumes(client, made)
        raise


def undo_create(
    client: docker.APIClient, spec: ContainerSpec, pins: PinSet | None, *, podman: bool
) -> None:
    """Remove what a create of ``spec`` may have made, whether or not the engine answered it:
    the container (its name finds it either way) and, on Podman, its pinned mounts' volumes."""
    remove_quietly(client, spec.name, named_volumes=podman)
    remove_volumes(client, podman_pinned_volumes(spec, pins) if podman else {})


def paths_in_image(
    client: docker.APIClient,
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
    image_id = str(client.inspect_image(image)["Id"])  # type: ignore[no-untyped-call]
    unknown = [path for path in paths if (image_id, path) not in known]
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
                known[(image_id, path)] = answer.status_code == 200
        finally:
            client.remove_container(created["Id"], force=True, v=True)
    return frozenset(path for path in paths if known[(image_id, path)])


def attach_socket(
    client: docker.APIClient, container_id: str, *, stderr_only: bool
) -> socket.socket:
    """The container's attach connection (stdin, stdout and stderr, or stderr alone) as a
    standalone non-blocking socket."""
    stdio = 0 if stderr_only else 1
    params = {"stdin": stdio, "stdout": stdio, "stderr": 1, "stream": 1}
    return detach_socket(client.attach_socket(container_id, params=params))


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


def update_cpu_shares(
    client: docker.APIClient, container_id: str, shares: int, *, podman_version: str | None
) -> None:
    """Change a running container's CPU weight; on Podman (``podman_version``: its version)
    through its own API, since Podman 4 has no Docker-style update (its own changes the
    cgroup)."""
    if podman_version is None:
        client.update_container(container_id, cpu_shares=shares)
        return
    response = client.post(
        f"{client.base_url}/v{podman_version}/libpod/containers/{container_id}/update",
        json={"cpu": {"shares": shares}},
        timeout=client.timeout,
    )
    if response.status_code >= 400:
        raise docker.errors.APIError(response.text.strip(), response=response)


def memory_stats(client: docker.APIClient, container_id: str) -> int | None:
    """The container's memory in use, from one stats sample (see :func:`memory_in_use`)."""
    # one_shot: a single sample, without waiting a second for the next one (API 1.41).
    report: Any = client.stats(container_id, stream=False, one_shot=True)
    return memory_in_use(report)


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


def inspect_container(client: docker.APIClient, container_id: str) -> dict[str, Any]:
    """The engine's inspect of a container, asked again when Podman trips over the container's
    process ending at that moment (REMOVE_RETRY_PAUSE apart, INSPECT_RETRIES in all)."""
    for attempt in range(INSPECT_RETRIES):
        try:
            found: dict[str, Any] = client.inspect_container(container_id)
        except docker.errors.APIError as exc:
            if podman_process_ending(exc) and attempt + 1 < INSPECT_RETRIES:
                time.sleep(REMOVE_RETRY_PAUSE)
                continue
            raise
        return found
    raise AssertionError("unreachable: the last attempt returns or raises")


def stop_and_remove(
    client: docker.APIClient, container: str, *, grace: float | None, named_volumes: bool
) -> None:
    """Stop the container (SIGTERM, then SIGKILL after ``grace`` s; none if None) and remove
    it; gone is fine."""
    if grace is not None:
        try:
            client.stop(container, timeout=max(0, round(grace)))
        except docker.errors.APIError as exc:
            if container_gone(exc):
                return
            # Not running, or being removed already: removal below decides.
    remove_quietly(client, container, named_volumes=named_volumes)


def remove_quietly(
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
            if removal_in_progress(exc):
                return  # whoever removes it, removes its volumes
            if podman_still_exiting(exc) and attempt + 1 < REMOVE_RETRIES:
                time.sleep(REMOVE_RETRY_PAUSE)
                continue
            raise
        break
    for name in volumes:
        _remove_volume_quietly(client, name)


def _pinned_volume_names(client: docker.APIClient, container: str) -> list[str]:
    """The named volumes of ours a container uses (Podman's pinned mounts; none on Docker)."""
    try:
        mounts = client.inspect_container(container).get("Mounts") or []
    except docker.errors.APIError:
        return []  # gone (or going): an abandoned create's own cleanup names them
    return [
        str(mount["Name"])
        for mount in mounts
        if mount.get("Type") == "volume" and PINNED_VOLUME_NAME.fullmatch(str(mount.get("Name")))
    ]


def remove_volumes(client: docker.APIClient, volumes: dict[str, dict[str, Any]]) -> None:
    """Remove these volumes (``create_volume`` arguments by target); gone is fine."""
    for volume in volumes.values():
        _remove_volume_quietly(client, volume["name"])


def _remove_volume_quietly(client: docker.APIClient, name: str) -> None:
    try:
        client.remove_volume(name, force=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        log.warning("volume_remove_failed", extra={"volume": name, "detail": explain(exc)})


def runtime_honoured(
    client: docker.APIClient, image: str, runtime: str, labels: dict[str, str], *, podman: bool
) -> str:
    """The runtime the engine gives a container of ``image`` that names ``runtime``: created
    (never started: nothing of it runs), asked, removed. Podman's Docker-compatible inspect
    says "oci" whatever the runtime is: its own API says which (and Podman 4 drops the runtime
    a container names through the compatible API: runc it is)."""
    created = client.create_container(
        image,
        command=["true"],
        labels=labels,
        network_disabled=True,
        host_config=client.create_host_config(
            runtime=runtime,
            network_mode="none",
            log_config=docker.types.LogConfig(type="none", config={}),
        ),
    )
    container_id = str(created["Id"])
    try:
        if podman:
            answer = client.get(f"{client.base_url}/v4.0.0/libpod/containers/{container_id}/json")
            answer.raise_for_status()
            return str(answer.json().get("OCIRuntime") or "")
        inspected = inspect_container(client, container_id)
        return str((inspected.get("HostConfig") or {}).get("Runtime") or "")
    finally:
        remove_quietly(client, container_id)
