"""Validation of the bind mounts a client asks for.

A client declares mounts in ``fabric/registerClient`` (``{"source", "target", "readOnly"}``) or
in the URL (``?mount=SRC:TARGET[:ro]``). Nothing reaches Docker unless every mount passes:

Every path is refused before any work is done with it when it is over 4096 bytes (PATH_MAX).

- ``source``: a string, absolute, no NUL; resolved (symlinks, ``..``) and then inside one of the
  resolved ``allowed_mount_roots``, compared by path components (``/home2`` is not in ``/home``);
  it must exist; it must not be, or contain, a container engine's socket (Docker's, Podman's,
  containerd's: whoever reaches one runs containers as the engine's user).
- ``target``: a string, absolute, no NUL, no ``..``; not ``/`` and not inside a system directory
  (``/proc``, ``/sys``, ``/dev``, ``/etc``, ``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/boot``,
  ``/run``, ``/var/run``, …); under one of the ``allowed_mount_targets`` (default ``/workspace``,
  ``/projects``) or equal to the source's own path (given or resolved), so that a mount never
  shadows the service's files; two mounts cannot share a target.
- ``readOnly``: a boolean when present.

Any violation raises :class:`~reactor_fabric.SecurityViolation` (-32004) naming the offending
path in ``data``. Validation happens when a session begins; :meth:`MountPolicy.pin` repeats
it and pins the sources before every container start (see :mod:`.pinning`).

The only I/O of validation is path resolution, done through an injectable ``realpath`` so the
rules are tested against real symlinks in temporary directories; callers run it in a thread.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._errors import SecurityViolation
from .._reasons import (
    DOCKER_SOCKET_FORBIDDEN,
    MOUNT_MALFORMED,
    MOUNT_OUTSIDE_ALLOWED_ROOTS,
    MOUNT_PATH_TOO_LONG,
    MOUNT_SOURCE_INVALID,
    MOUNT_SOURCE_MISSING,
    MOUNT_SOURCE_NOT_ABSOLUTE,
    MOUNT_TARGET_DUPLICATE,
    MOUNT_TARGET_FORBIDDEN,
    MOUNT_TARGET_INVALID,
    MOUNT_TARGET_NOT_ABSOLUTE,
    MOUNT_TARGET_NOT_ALLOWED,
    TOO_MANY_MOUNTS,
)
from ..config.structs import DEFAULT_MOUNT_TARGETS
from .mount_spec import MountSpec
from .pinning import PinSet, identities, pin_git_guards, pin_mounts

MAX_MOUNTS = 32
# Linux's PATH_MAX: a longer path cannot name anything, and resolving it is wasted work.
MAX_PATH_BYTES = 4096

FORBIDDEN_TARGETS = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/run",
    "/var/run",
    "/var/lib/docker",
)
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
# Where rootful Podman's API service listens (a rootless one: see rootless_podman_socket).
PODMAN_ROOTFUL_SOCKET = "/run/podman/podman.sock"
# The other engines' sockets on a host: rootful Podman's API service, and containerd (the one
# dockerd runs, and a standalone one). Any of them is a way to the host as root.
OTHER_ENGINE_SOCKETS = (
    PODMAN_ROOTFUL_SOCKET,
    "/var/run/podman/podman.sock",
    "/run/containerd/containerd.sock",
    "/var/run/docker/containerd/containerd.sock",
)


def is_within(path: str, root: str) -> bool:
    """Whether normalised absolute ``path`` is ``root`` or below it, by whole components."""
    root = root.rstrip("/")
    if not root:
        return True  # the file-system root contains everything
    return path == root or path.startswith(root + "/")


def parse_query_mount(text: str) -> dict[str, Any]:
    """``SRC:TARGET[:ro|:rw]`` (already URL-decoded) into the registerClient mount shape."""
    value = text
    parts = value.split(":")
    read_only = False
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        read_only = parts[2] == "ro"
        parts = parts[:2]
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise SecurityViolation(
            f"mount {value!r} is not SOURCE:TARGET[:ro]",
            reason=MOUNT_MALFORMED,
            mount=value,
        )
    return {"source": parts[0], "target": parts[1], "readOnly": read_only}


def rootless_podman_socket(environ: Mapping[str, str], uid: int) -> str:
    """Where the rootless Podman API service of user ``uid`` listens."""
    runtime_dir = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    return posixpath.join(runtime_dir, "podman", "podman.sock")


def docker_socket_paths(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Where a container engine's socket may live: the usual places of Docker's, Podman's and
    containerd's, this user's rootless Podman's (where ``--runtime podman`` would reach it),
    and ``DOCKER_HOST`` and ``CONTAINER_HOST`` (Podman's variable) when they name a socket."""
    env = os.environ if environ is None else environ
    extra: list[str] = []
    for variable in ("DOCKER_HOST", "CONTAINER_HOST"):
        host = env.get(variable, "")
        if host.startswith("unix://"):
            extra.append(host.removeprefix("unix://"))
    rootless = rootless_podman_socket(env, os.getuid())
    if rootless.startswith("/"):
        extra.append(rootless)
    return DOCKER_SOCKETS + OTHER_ENGINE_SOCKETS + tuple(extra)


class MountPolicy:
    """The allowlist of one orchestrator: which host paths may be mounted where."""

    def __init__(
        self,
        allowed_roots: Iterable[str],
        *,
        allowed_targets: Iterable[str] = DEFAULT_MOUNT_TARGETS,
        realpath: Callable[[str], str] = os.path.realpath,
        exists: Callable[[str], bool] = os.path.exists,
        docker_sockets: Sequence[str] | None = None,
    ) -> None:
        self._realpath = realpath
        self._exists = exists
        self._docker_sockets = docker_sockets
        # Roots are resolved too: an allowed "/home" that is a symlink to "/data/home" allows
        # what lies under "/data/home", which is where sources resolve to.
        self.allowed_roots = tuple(dict.fromkeys(realpath(root) for root in allowed_roots))
        self.allowed_targets = tuple(posixpath.normpath(target) for target in allowed_targets)
        sockets = docker_socket_paths() if docker_sockets is None else docker_sockets
        self._sockets = tuple(
            dict.fromkeys(path for s in sockets for path in (posixpath.normpath(s), realpath(s)))
        )

    def with_roots(self, allowed_roots: Iterable[str]) -> MountPolicy:
        """The same policy with other roots (a signed-in user's: see .user_policy); resolves
        them, so blocking, like :meth:`validate`."""
        return MountPolicy(
            allowed_roots,
            allowed_targets=self.allowed_targets,
            realpath=self._realpath,
            exists=self._exists,
            docker_sockets=self._docker_sockets,
        )

    def validate(self, mounts: object, roots: Iterable[str] | None = None) -> tuple[MountSpec, ...]:
        """Check every requested mount; the resolved, allowed mounts or SecurityViolation.
        ``roots``: other allowed roots than this policy's (a signed-in user's)."""
        if roots is not None:
            return self.with_roots(roots).validate(mounts)
        if not isinstance(mounts, list):
            raise SecurityViolation(
                "mounts must be a list of {source, target, readOnly} objects",
                reason=MOUNT_MALFORMED,
            )
        if len(mounts) > MAX_MOUNTS:
            raise SecurityViolation(
                f"at most {MAX_MOUNTS} mounts are allowed, got {len(mounts)}",
                reason=TOO_MANY_MOUNTS,
            )
        checked: list[MountSpec] = []
        for index, mount in enumerate(mounts):
            checked.append(self._validate_one(mount, index))
        targets = [mount.target for mount in checked]
        for target in targets:
            if targets.count(target) > 1:
                raise SecurityViolation(
                    f"two mounts share the target {target!r}",
                    reason=MOUNT_TARGET_DUPLICATE,
                    path=target,
                )
        return tuple(checked)

    def pin(
        self, mounts: Sequence[MountSpec], *, guard_git: bool = False
    ) -> tuple[PinSet, tuple[MountSpec, ...]]:
        """Validate a session's mounts again and pin their sources, just before a container start.

        Runs at every spawn (respawns included). A source is the path resolved when the session
        began; pinning walks it without following anything, so it fails (``mount_changed``)
        unless the path still resolves to itself — no need to resolve it again first. The
        container then gets exactly the pinned object. ``guard_git``: each writable mount's
        ``.git`` is pinned too, and the read-only mounts that put it over itself are returned
        to be added to the container's (:mod:`.git_guard`); raises ``git_dir_unguardable``
        for one that cannot be. Blocking file-system work: callers use a thread.
        """
        pins = pin_mounts(mounts, forbidden=identities(self._sockets))
        if not guard_git:
            return pins, ()
        try:
            return pins, pin_git_guards(pins, mounts)
        except BaseException:
            pins.close()
            raise

    def _validate_one(self, mount: object, index: int) -> MountSpec:
        if not isinstance(mount, dict):
            raise SecurityViolation(
                f"mount #{index} must be an object with source and target",
                reason=MOUNT_MALFORMED,
                index=index,
            )
        source = _path_field(mount, "source", index)
        target = _path_field(mount, "target", index)
        read_only = mount.get("readOnly", False)
        if not isinstance(read_only, bool):
            raise SecurityViolation(
                f"mount #{index}: readOnly must be true or false",
                reason=MOUNT_MALFORMED,
                index=index,
            )
        unknown = set(mount) - {"source", "target", "readOnly"}
        if unknown:
            raise SecurityViolation(
                f"mount #{index}: unknown field(s) {', '.join(sorted(unknown))}",
                reason=MOUNT_MALFORMED,
                index=index,
            )
        resolved = self._check_source(source)
        checked_target = _check_target(target)
        same_path = checked_target in (posixpath.normpath(source), resolved)
        under_targets = any(is_within(checked_target, t) for t in self.allowed_targets)
        if not same_path and not under_targets:
            # Anywhere else, a mount could shadow the service's own files (its command in /opt,
            # /usr/local/bin, its entrypoint's directory), which must come from the suite only.
            raise SecurityViolation(
                f"target {target!r} is not under the allowed mount targets "
                f"({', '.join(self.allowed_targets) or 'none'}) nor the source's own path",
                reason=MOUNT_TARGET_NOT_ALLOWED,
                path=target,
                allowed_targets=list(self.allowed_targets),
            )
        return MountSpec(resolved, checked_target, read_only, check_in_image=not under_targets)

    def _check_source(self, source: str) -> str:
        try:
            resolved = self._realpath(source)
        except OSError as exc:
            # A component replaced half-way (a symlink read just after it was removed) makes
            # realpath itself fail: a client racing us, not our failure.
            raise SecurityViolation(
                f"{source!r} changed while it was being resolved ({exc.strerror})",
                reason=MOUNT_SOURCE_MISSING,
                path=source,
            ) from exc
        for socket_path in self._sockets:
            if is_within(socket_path, resolved):
                raise SecurityViolation(
                    f"{source!r} is or contains a container engine's socket, which is never "
                    "mountable",
                    reason=DOCKER_SOCKET_FORBIDDEN,
                    path=source,
                )
        if not any(is_within(resolved, root) for root in self.allowed_roots):
            raise SecurityViolation(
                f"{source!r} (resolved: {resolved!r}) is outside the allowed mount roots",
                reason=MOUNT_OUTSIDE_ALLOWED_ROOTS,
                path=source,
                resolved=resolved,
                allowed_roots=list(self.allowed_roots),
            )
        if not self._exists(resolved):
            raise SecurityViolation(
                f"{source!r} does not exist on the host",
                reason=MOUNT_SOURCE_MISSING,
                path=source,
            )
        return resolved


def _path_field(mount: dict[str, Any], field: str, index: int) -> str:
    value = mount.get(field)
    if not isinstance(value, str) or not value:
        raise SecurityViolation(
            f"mount #{index}: {field} must be a non-empty string",
            reason=MOUNT_MALFORMED,
            index=index,
        )
    if len(value.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise SecurityViolation(
            f"mount #{index}: {field} is longer than {MAX_PATH_BYTES} bytes",
            reason=MOUNT_PATH_TOO_LONG,
            path=value[:256] + "…",
        )
    if "\0" in value:
        raise SecurityViolation(
            f"mount #{index}: {field} contains a NUL character",
            reason=MOUNT_SOURCE_INVALID if field == "source" else MOUNT_TARGET_INVALID,
            path=value.replace("\0", "\\0"),
        )
    if not value.startswith("/"):
        raise SecurityViolation(
            f"mount #{index}: {field} {value!r} is not an absolute path",
            reason=MOUNT_SOURCE_NOT_ABSOLUTE if field == "source" else MOUNT_TARGET_NOT_ABSOLUTE,
            path=value,
        )
    return value


def _check_target(target: str) -> str:
    if ".." in target.split("/"):
        raise SecurityViolation(
            f"target {target!r} must not contain '..'",
            reason=MOUNT_TARGET_FORBIDDEN,
            path=target,
        )
    normalised = posixpath.normpath(target)
    if normalised == "/" or normalised.startswith("//"):
        raise SecurityViolation(
            "the container's root '/' cannot be a mount target",
            reason=MOUNT_TARGET_FORBIDDEN,
            path=target,
        )
    for forbidden in FORBIDDEN_TARGETS:
        if is_within(normalised, forbidden):
            raise SecurityViolation(
                f"target {target!r} is inside the system directory {forbidden!r}",
                reason=MOUNT_TARGET_FORBIDDEN,
                path=target,
            )
    return normalised
