"""A container spec as the Docker engine's create payload: pure translation, one part each.

:class:`~reactor_fabric.policy.container_spec.ContainerSpec` says what a container must be, one
part per service option; this module says how Docker's Engine API (and Podman's compatible one)
is asked for each part, in one function named after it (:data:`PART_REALISATIONS`), which
returns its :class:`Fragment` of the payload (the Engine API's container configuration, its
``HostConfig``, its ``Mounts``), as ``POST /containers/create`` takes them:

- :func:`lifecycle` (name, labels), :func:`program` (image, program, user, environment),
  :func:`mounts` (the spec's; pinned ones as volumes: :func:`spec_mount`), :func:`network`,
  :func:`resources`, :func:`confinement`, :func:`secrets` (the secrets' directory),
  :func:`egress` (its proxy's socket), :func:`child_session` (the agent's fabric socket),
  :func:`isolation` (the engine's runtime: gVisor's or the default);
- what every container gets whatever its spec: our stdio sockets (:func:`stdio_mounts`),
  :func:`supervision`, :func:`output`;
- :func:`container_config` and :func:`host_config` put the fragments together;
  :func:`socket_stdio_entrypoint` is the program when socket stdio puts ``fabric-stdio`` in
  front of the image's own; :func:`podman_pinned_volumes` the named volumes Podman needs for
  pinned mounts.

Pure: no I/O, no trio, no engine: plain JSON-ready values, as the Engine API documents them
(a unit test checks them against what docker-py, which sent them before, makes of the same
arguments). The calls that send it are in :mod:`.docker_operations`; which engine is asked, and
when, in :mod:`.docker`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..config.secrets import SECRETS_DIR
from ..policy.container_parts.child_session import CHILD_SOCKET_TARGET
from ..policy.container_parts.egress import EGRESS_PROXY_PORT
from ..policy.container_spec import ContainerSpec
from ..policy.mount_spec import MountSpec
from ..policy.pinning import PinSet
from .stdio_sockets import EGRESS_SOCKET_TARGET, HELPER_TARGET, SOCKET_TARGET, wrapped_command

# On Podman, the named volumes of a container's pinned mounts: labelled with its name, and named
# NAME-mI (see podman_pinned_volumes).
LABEL_PINNED_VOLUME_OF = "reactor-fabric.pinned-volume-of"
PINNED_VOLUME_NAME = re.compile(r"rf-[a-z0-9_.-]+-m[0-9]+")

# One entry of HostConfig.Mounts, as the Engine API takes it (Target, Source, Type, ReadOnly,
# BindOptions or VolumeOptions).
EngineMount = dict[str, Any]


@dataclass(frozen=True)
class SocketSources:
    """Where on this host a socket-stdio container's sockets of ours are: the ``fabric-stdio``
    program, its stdio socket, and (when its spec has them) its egress proxy's socket and its
    fabric socket (an agent's child session)."""

    helper: str
    stdio: str
    egress: str | None = None
    child: str | None = None


@dataclass(frozen=True)
class Fragment:
    """What one part asks of the engine: its keys of the container's configuration, of its
    ``HostConfig``, and its mounts."""

    create: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    mounts: list[EngineMount] = field(default_factory=list)


def container_config(
    spec: ContainerSpec, host: dict[str, Any], *, entrypoint: list[str] | None = None
) -> dict[str, Any]:
    """The body of ``POST /containers/create`` (its name goes in the query: ``spec.name``);
    with ``entrypoint`` (socket stdio), that is the whole program (``fabric-stdio`` in front
    of the image's entrypoint and command) and stdin stays closed on the engine's side."""
    stdin = entrypoint is None
    config = {
        **program(spec, entrypoint=entrypoint).create,
        **lifecycle(spec).create,
        # StdinOnce: closing our side of stdin closes the server's stdin, which is how MCP
        # asks a stdio server to shut down. With socket stdio it is our socket's.
        "OpenStdin": stdin,
        "StdinOnce": stdin,
        "AttachStdin": stdin,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        **network(spec).create,
        "HostConfig": host,
    }
    # The engine takes an absent key for its default; null is not the same for all of them.
    return {key: value for key, value in config.items() if value is not None}


def lifecycle(spec: ContainerSpec) -> Fragment:
    """The container's labels (its name is the create's query)."""
    return Fragment(create={"Labels": spec.labels})


def program(spec: ContainerSpec, *, entrypoint: list[str] | None = None) -> Fragment:
    """The image, its command (or with socket stdio the whole program, ``entrypoint``), the
    user and the whole environment (the parts' variables: ContainerSpec.environment)."""
    return Fragment(
        create={
            "Image": spec.image,
            "Cmd": list(spec.command) if spec.command is not None and entrypoint is None else None,
            "Entrypoint": entrypoint,
            "Env": [f"{name}={value}" for name, value in spec.environment.items()],
            "User": spec.user,
        }
    )


def socket_stdio_entrypoint(
    image_config: Mapping[str, Any], spec: ContainerSpec, *, egress: bool, hold: bool = False
) -> list[str]:
    """The program of a socket-stdio container: ``fabric-stdio`` in front of what the image
    (its ``Config``, as the engine inspects it) and the spec would run; with ``egress``, it
    also forwards the proxy's port in the container to the egress socket; with ``hold``, it
    waits for the orchestrator's GO before it runs the server."""
    return wrapped_command(
        image_config.get("Entrypoint"),
        image_config.get("Cmd"),
        spec.command,
        egress_port=EGRESS_PROXY_PORT if egress else None,
        hold=hold,
    )


def host_config(
    spec: ContainerSpec,
    pins: PinSet | None = None,
    *,
    named_volumes: dict[str, dict[str, Any]] | None = None,
    secrets: EngineMount | None = None,
    sockets: SocketSources | None = None,
) -> dict[str, Any]:
    """The ``HostConfig`` of a spec: mounts as structured objects (``pins``: the mounts'
    sources pinned; ``named_volumes``: the volumes made for them on Podman, by target, see
    :func:`podman_pinned_volumes`; ``secrets``: the file secrets' bind; ``sockets``: ours),
    limits and safe defaults."""
    config = {
        "Mounts": all_mounts(
            spec, pins, named_volumes=named_volumes, secrets=secrets, sockets=sockets
        ),
        **network(spec).host,
        **resources(spec).host,
        **confinement(spec).host,
        **isolation(spec).host,
        **supervision(),
        **output(),
    }
    return {key: value for key, value in config.items() if value is not None}


def all_mounts(
    spec: ContainerSpec,
    pins: PinSet | None = None,
    *,
    named_volumes: dict[str, dict[str, Any]] | None = None,
    secrets: EngineMount | None = None,
    sockets: SocketSources | None = None,
) -> list[EngineMount]:
    """Every mount of the container, in this order: the spec's, the secrets' directory (its
    bind, from :func:`secrets`), then our sockets (stdio's, the egress proxy's, the fabric
    socket)."""
    found = mounts(spec, pins, named_volumes=named_volumes).mounts
    if secrets is not None:
        found.append(secrets)
    if sockets is not None:
        found += stdio_mounts(sockets.helper, sockets.stdio)
        found += egress(spec, sockets.egress).mounts
        found += child_session(spec, sockets.child).mounts
    return found


def mounts(
    spec: ContainerSpec,
    pins: PinSet | None = None,
    *,
    named_volumes: dict[str, dict[str, Any]] | None = None,
) -> Fragment:
    """The spec's own mounts (see :func:`spec_mount`)."""
    named = named_volumes or {}
    return Fragment(
        mounts=[spec_mount(spec, mount, pins, named.get(mount.target)) for mount in spec.mounts]
    )


def spec_mount(
    spec: ContainerSpec,
    mount: MountSpec,
    pins: PinSet | None,
    named: dict[str, Any] | None = None,
) -> EngineMount:
    """A pinned mount as a ``local`` volume bound to our descriptor; else a plain bind.

    Why a volume: runc binds mount sources from inside the container's new mount namespace,
    where a bind from a descriptor of the host's namespace is refused (EINVAL). The ``local``
    volume driver mounts in the daemon's own (the host's) namespace — ``mount --bind
    /proc/PID/fd/N`` there follows the descriptor, not a path — and the container then gets a
    bind of that volume, whose path under the engine's data root nobody else can change.
    """
    if named is not None:  # Podman: the volume is made already
        return volume_mount(mount.target, named["Name"], read_only=mount.read_only)
    pin = pins.for_target(mount.target) if pins is not None else None
    if pin is None:
        return bind_mount(
            mount.target, mount.source, read_only=mount.read_only, propagation=mount.propagation
        )
    # Read-only at the source, since Docker allows no read-only anonymous volume; a bind of a
    # read-only mount is read-only, and the container cannot remount it (no caps).
    options = {
        "type": "none",
        "o": "bind,ro" if mount.read_only else "bind",
        "device": pin.engine_source,
    }
    return volume_mount(
        mount.target,
        None,  # anonymous: removed with the container (v=True)
        read_only=False,  # (Docker refuses a read-only anonymous volume: the bind is ro)
        labels=spec.labels,
        driver=("local", options),
    )


def bind_mount(
    target: str, source: str, *, read_only: bool, propagation: str | None = None
) -> EngineMount:
    """A bind of ``source`` (a host path) at ``target``."""
    found: EngineMount = {
        "Target": target,
        "Source": source,
        "Type": "bind",
        "ReadOnly": read_only,
    }
    if propagation is not None:
        found["BindOptions"] = {"Propagation": propagation}
    return found


def volume_mount(
    target: str,
    name: str | None,
    *,
    read_only: bool,
    labels: dict[str, str] | None = None,
    driver: tuple[str, dict[str, str]] | None = None,
) -> EngineMount:
    """A volume at ``target``: named, or anonymous (``name`` None) made by ``driver`` with its
    options. The image's files at the target are never copied into it (``NoCopy``): the volume
    is the user's directory."""
    options: dict[str, Any] = {"NoCopy": True}
    if labels:
        options["Labels"] = labels
    if driver is not None:
        options["DriverConfig"] = {"Name": driver[0], "Options": driver[1]}
    return {
        "Target": target,
        "Source": name,
        "Type": "volume",
        "ReadOnly": read_only,
        "VolumeOptions": options,
    }


def secrets(directory: str | None) -> Fragment:
    """The service's file secrets (``directory``: see :mod:`.secret_files`; None: it has
    none), read-only at /run/secrets: the secrets part (its variables are in :func:`program`'s
    environment)."""
    if directory is None:
        return Fragment()
    return Fragment(mounts=[bind_mount(SECRETS_DIR, directory, read_only=True)])


def stdio_mounts(helper: str, socket_path: str) -> list[EngineMount]:
    """The two binds socket stdio adds: our program and the container's socket, read-only.

    A socket bound read-only can still be connected (connecting is not writing to the file
    system); nothing in the container can replace either.
    """
    return [
        bind_mount(HELPER_TARGET, helper, read_only=True),
        bind_mount(SOCKET_TARGET, socket_path, read_only=True),
    ]


def egress(spec: ContainerSpec, path: str | None) -> Fragment:
    """The container's egress proxy socket (``path``, where it listens), which
    ``fabric-stdio`` forwards the proxy's port in the container to (see :mod:`.egress_proxy`;
    the variables naming the proxy are in the environment, the port in
    :func:`socket_stdio_entrypoint`)."""
    if spec.egress is None or path is None:
        return Fragment()
    return Fragment(mounts=[bind_mount(EGRESS_SOCKET_TARGET, path, read_only=True)])


def child_session(spec: ContainerSpec, path: str | None) -> Fragment:
    """An agent container's fabric socket (``path``), where its relay reaches its child
    session (see :mod:`.child_sockets`)."""
    if spec.child_session is None or path is None:
        return Fragment()
    return Fragment(mounts=[bind_mount(CHILD_SOCKET_TARGET, path, read_only=True)])


def network(spec: ContainerSpec) -> Fragment:
    """The container's network (``none`` for one without, or whose egress is proxied)."""
    return Fragment(
        create={"NetworkDisabled": spec.network == "none"},
        host={"NetworkMode": spec.network},
    )


def resources(spec: ContainerSpec) -> Fragment:
    """Memory (no swap on top), CPU and process limits, and the CPU weight."""
    return Fragment(
        host={
            "Memory": spec.memory_bytes,
            # Equal to the memory limit: no swap on top of it, so the limit means what it says.
            "MemorySwap": spec.memory_bytes,
            "NanoCpus": spec.nano_cpus,
            "PidsLimit": spec.pids_limit,
            "CpuShares": spec.cpu_shares,
        }
    )


def confinement(spec: ContainerSpec) -> Fragment:
    """What the server may do in its container: no capability but those the suite adds, no
    new privileges (unless relaxed), a read-only root with its tmpfs."""
    return Fragment(
        host={
            "CapDrop": ["ALL"],
            "CapAdd": list(spec.cap_add) or None,
            "SecurityOpt": ["no-new-privileges:true"] if spec.no_new_privileges else [],
            "ReadonlyRootfs": spec.read_only_rootfs,
            "Tmpfs": dict(spec.tmpfs) or None,
        }
    )


def isolation(spec: ContainerSpec) -> Fragment:
    """The engine's runtime the container runs under: gVisor's (``runsc``, as the engine has it
    registered) when the spec says so, else the engine's default."""
    return Fragment(host={"Runtime": spec.runtime} if spec.runtime is not None else {})


def supervision() -> dict[str, Any]:
    """Who looks after the container's processes and its removal."""
    return {
        "Init": True,  # a real PID 1 that forwards signals and reaps zombies
        # (and no AutoRemove, the engine's default: we remove explicitly, after reading the
        # exit code)
    }


def output() -> dict[str, Any]:
    """What the engine keeps of the server's output: nothing.

    Its stdout is the session's messages (a file's contents, a diff), which the engine's
    default driver (json-file, no size limit) would store on the host's disk for the
    container's life, and encode and write once more per message while the session waits. The
    orchestrator reads both streams itself (stdout over the container's socket or the attach,
    stderr over the attach) and logs stderr, bounded.
    """
    return {"LogConfig": {"Type": "none", "Config": {}}}


def podman_pinned_volumes(spec: ContainerSpec, pins: PinSet | None) -> dict[str, dict[str, Any]]:
    """The named volumes that carry a spec's pinned mounts (``pins``) on Podman, by target: the
    ``POST /volumes/create`` body of each.

    Why named volumes: Podman ignores the driver options of a volume declared in a container's
    create (the container would get an empty volume; the pin check refuses it). Each is bound
    to our descriptor like Docker's anonymous one, and named after its container (``NAME-mI``)
    so that whoever removes the container finds them. ``uid``/``gid`` are the pinned object's
    own: without them Podman changes the owner of the volume's root — the user's directory —
    to the container's user on first use. A read-only mount is read-only at the source too
    (``ro``), as Docker's is: the container's ``ro`` alone is runc's remount, which gVisor's
    gofer does not make (its bind of the source is what the pin check sees), and the kernel,
    not only the runtime, then keeps the writes out.
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
            "Name": f"{spec.name}-m{index}",
            "Driver": "local",
            "DriverOpts": {
                "type": "none",
                "o": f"bind,{'ro,' if mount.read_only else ''}uid={uid},gid={gid}",
                "device": pin.engine_source,
            },
            "Labels": {**spec.labels, LABEL_PINNED_VOLUME_OF: spec.name},
        }
    return volumes


# Each part of a ContainerSpec, by its field's name, and the one function that realises it
# here (tests/unit/test_container_parts.py checks that every part has one).
PART_REALISATIONS: Final = {
    "lifecycle": lifecycle,
    "program": program,
    "mounts": mounts,
    "network": network,
    "resources": resources,
    "confinement": confinement,
    "secrets": secrets,
    "egress": egress,
    "child_session": child_session,
    "isolation": isolation,
}
