"""Pinning a validated mount source, so that the engine mounts exactly what was checked.

Validation (:mod:`.mounts`) resolves a path string. Docker resolves the string again when it
starts the container, so whoever can change a component of the path in between (a symlink swap
in a project directory, a rename in ``/tmp``) could have any directory mounted — ``/run`` with
the Docker socket, another user's home. A pin closes that window:

1. **Walk, do not resolve.** The validated path has no symlinks and no ``..`` (it is the
   resolved one), so it is opened from ``/`` one component at a time with
   ``O_PATH | O_NOFOLLOW``. Any symlink met on the way means the path changed since it was
   validated: refused with ``mount_changed``. The descriptor at the end *is* the validated
   object, whatever happens to the path afterwards.
2. **Mount the descriptor, not the path.** The engine is told to mount ``/proc/PID/fd/N`` (our
   descriptor's magic link), which the kernel resolves to the object the descriptor holds, not
   to anything a path now names. See :mod:`reactor_fabric.runtime.docker_payload` for how Docker
   is made to do that (a ``local`` volume bound to the descriptor: the daemon mounts it in its
   own mount namespace, where a bind from our descriptor is allowed).
3. **Check what the container got.** After start, the runtime compares the device and inode of
   the container's mount with the pin's (:meth:`Pin.matches`) before any client message is
   relayed; on a mismatch the container is removed and the session gets ``mount_changed``.

Resource handling: a :class:`PinSet` owns its descriptors. It is handed to the runtime beside
the container spec (``Runtime.spawn(spec, pins)``: the spec is plain data), which releases it
once no engine call can resolve ``/proc/PID/fd/N`` any more — also when a cancelled start still
runs in a worker thread, because a descriptor number closed too early could be reused by
another session's pin. :meth:`PinSet.close` is idempotent and thread-safe.

Error handling: every refusal is a :class:`~reactor_fabric.SecurityViolation` (-32004):
``mount_changed`` (a component became a symlink or vanished), ``mount_not_permitted`` (the
orchestrator's own user may not open or read it), ``docker_socket_forbidden`` (the object is the
Docker socket under another name, e.g. a hard link).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .._errors import SecurityViolation
from .._reasons import (
    DOCKER_SOCKET_FORBIDDEN,
    GIT_DIR_UNGUARDABLE,
    MOUNT_CHANGED,
    MOUNT_NOT_PERMITTED,
)
from .git_guard import GIT_DIR, guard_target, inside_git_dir, needs_guard
from .mount_spec import MountSpec

# O_PATH: a descriptor that names an object without opening it for I/O (no read permission on
# the object needed, no side effects such as a FIFO blocking), which is all a mount needs.
_WALK_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Pin:
    """One pinned mount source: our descriptor and the identity of what it holds."""

    target: str
    path: str  # the validated (resolved) path the descriptor was opened from
    fd: int
    device: int
    inode: int
    owner: tuple[int, int]  # (uid, gid) of the pinned object: who the server may run as
    # Mounted read-only: the container's view of it is checked to be so (a read-only session
    # mount, a project's .git guarded by policy/git_guard.py).
    read_only: bool = False

    @property
    def engine_source(self) -> str:
        """What the engine is told to mount: this process's magic link to the descriptor."""
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def matches(self, found: os.stat_result) -> bool:
        """Whether ``found`` (the container's view of the mount) is the pinned object."""
        return (found.st_dev, found.st_ino) == (self.device, self.inode)

    def refusal(self, found: os.stat_result, *, writable: bool) -> SecurityViolation | None:
        """Why the container's view of this mount (``found``, and whether the container may
        write there) is not what was pinned, if it is not: another object, or a read-only
        mount (a ``:ro`` one, a guarded ``.git``) the engine mounted writable."""
        if not self.matches(found):
            return SecurityViolation(
                f"the container did not get the directory that was validated for {self.target!r}",
                reason=MOUNT_CHANGED,
                path=self.path,
                target=self.target,
            )
        if self.read_only and writable:
            return SecurityViolation(
                f"the container got {self.target!r} writable, which must be read-only",
                reason=MOUNT_CHANGED,
                path=self.path,
                target=self.target,
            )
        return None


class PinSet:
    """The pins of one container start, by mount target."""

    def __init__(self, pins: Iterable[Pin] = ()) -> None:
        self._pins = {pin.target: pin for pin in pins}
        self._lock = threading.Lock()
        self._closed = False

    def add(self, pin: Pin) -> None:
        with self._lock:
            if self._closed:
                os.close(pin.fd)
                raise RuntimeError("a closed PinSet takes no more pins")
            self._pins[pin.target] = pin

    def __len__(self) -> int:
        return len(self._pins)

    def for_target(self, target: str) -> Pin | None:
        return self._pins.get(target)

    @property
    def pins(self) -> tuple[Pin, ...]:
        return tuple(self._pins.values())

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def close(self) -> None:
        """Close every descriptor, once (later calls do nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for pin in self._pins.values():
            # Already closed (EBADF) cannot be: nothing else closes our descriptors.
            with contextlib.suppress(OSError):
                os.close(pin.fd)


def open_beneath_root(path: str) -> int:
    """A descriptor for the symlink-free absolute ``path``, opened component by component.

    Raises SecurityViolation if a component is a symlink, missing, not a directory (when it is
    not the last one) or not accessible to this process.
    """
    components = [part for part in path.split("/") if part]
    if path != "/" + "/".join(components) or any(part in (".", "..") for part in components):
        raise SecurityViolation(f"{path!r} is not a resolved path", reason=MOUNT_CHANGED, path=path)
    current = os.open("/", _WALK_FLAGS | os.O_DIRECTORY)
    for depth in range(1, len(components) + 1):
        try:
            following = _open_component(current, path, components, depth)
        finally:
            os.close(current)
        current = following
    return current


def _open_component(directory: int, path: str, components: list[str], depth: int) -> int:
    """Open ``components[depth - 1]`` below ``directory``: never a symlink, a directory unless
    it is the last component."""
    component = "/" + "/".join(components[:depth])
    try:
        opened = os.open(components[depth - 1], _WALK_FLAGS, dir_fd=directory)
    except OSError as exc:
        raise _refusal(path, component, exc) from exc
    mode = os.fstat(opened).st_mode
    problem = None
    if stat.S_ISLNK(mode):
        # With O_PATH | O_NOFOLLOW the kernel hands us the link itself: the path was resolved
        # without one, so somebody put it there since.
        problem = "a component is now a symlink"
    elif depth < len(components) and not stat.S_ISDIR(mode):
        problem = "a component is no longer a directory"
    if problem is None:
        return opened
    os.close(opened)
    raise SecurityViolation(
        f"{path!r} changed after it was validated: {problem}",
        reason=MOUNT_CHANGED,
        path=path,
        component=component,
    )


def _refusal(path: str, component: str, exc: OSError) -> SecurityViolation:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return SecurityViolation(
            f"the orchestrator's user may not open {component!r}",
            reason=MOUNT_NOT_PERMITTED,
            path=path,
            component=component,
        )
    return SecurityViolation(
        f"{path!r} changed after it was validated ({os.strerror(exc.errno or 0)} at {component!r})",
        reason=MOUNT_CHANGED,
        path=path,
    )


def pin_mounts(mounts: Sequence[MountSpec], *, forbidden: Iterable[tuple[int, int]] = ()) -> PinSet:
    """Pin every mount's (validated, resolved) source; all of them or none.

    ``forbidden`` are (device, inode) pairs that may never be mounted whatever their name: the
    container engines' sockets.
    """
    refused = set(forbidden)
    pins = PinSet()
    try:
        for mount in mounts:
            pin = _pin_one(mount)
            pins.add(pin)
            if (pin.device, pin.inode) in refused:
                raise SecurityViolation(  # noqa: TRY301 - the pins made so far must be closed
                    f"{mount.source!r} is a container engine's socket, which is never mountable",
                    reason=DOCKER_SOCKET_FORBIDDEN,
                    path=mount.source,
                )
    except BaseException:
        pins.close()
        raise
    return pins


def _pin_one(mount: MountSpec) -> Pin:
    fd = open_beneath_root(mount.source)
    try:
        found = os.fstat(fd)
        _check_readable(mount.source, fd, found)
    except BaseException:
        os.close(fd)
        raise
    return Pin(
        mount.target,
        mount.source,
        fd,
        found.st_dev,
        found.st_ino,
        (found.st_uid, found.st_gid),
        read_only=mount.read_only,
    )


def pin_git_guards(pins: PinSet, mounts: Sequence[MountSpec]) -> tuple[MountSpec, ...]:
    """Pin the ``.git`` of each writable mount in ``mounts`` (already pinned in ``pins``) and
    add it to ``pins``; the read-only mounts that put each over itself (see
    :mod:`.git_guard`). Opened beneath the mount's own descriptor, never through a link: the
    container gets the very Git directory of the directory it gets.

    Raises SecurityViolation ``git_dir_unguardable`` for a Git directory that cannot be kept
    read-only (a symlink, a mount of or inside one), leaving ``pins`` to the caller to close.
    """
    session = tuple(mounts)
    guards: list[MountSpec] = []
    for mount in session:
        if not needs_guard(mount, session):
            continue
        pin = pins.for_target(mount.target)
        if pin is None:
            continue  # (pin_mounts pinned every mount: cannot be)
        if inside_git_dir(mount.source):
            raise _unguardable(mount, "it is inside a Git directory")
        if not stat.S_ISDIR(os.fstat(pin.fd).st_mode):
            continue  # a file: nothing below it
        if _is_bare_repository(pin.fd):
            raise _unguardable(mount, "it is a Git repository's directory (a bare repository)")
        try:
            fd = os.open(GIT_DIR, _WALK_FLAGS, dir_fd=pin.fd)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _unguardable(mount, f"its .git cannot be opened ({exc.strerror})") from exc
        found = os.fstat(fd)
        if not (stat.S_ISDIR(found.st_mode) or stat.S_ISREG(found.st_mode)):
            os.close(fd)
            what = "a symlink" if stat.S_ISLNK(found.st_mode) else "not a directory or a file"
            raise _unguardable(mount, f"its .git is {what}, which a container could replace")
        guard = MountSpec(
            f"{mount.source.rstrip('/')}/{GIT_DIR}",
            guard_target(mount),
            read_only=True,
            git_guard=True,
        )
        pins.add(
            Pin(
                guard.target,
                guard.source,
                fd,
                found.st_dev,
                found.st_ino,
                (found.st_uid, found.st_gid),
                read_only=True,
            )
        )
        guards.append(guard)
    return tuple(guards)


def _is_bare_repository(directory: int) -> bool:
    """Whether ``directory`` looks like a Git directory as git itself tells one: a ``HEAD``
    file beside ``objects`` and ``refs`` directories."""
    kinds = {"HEAD": stat.S_ISREG, "objects": stat.S_ISDIR, "refs": stat.S_ISDIR}
    for name, is_kind in kinds.items():
        try:
            found = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except OSError:
            return False
        if not is_kind(found.st_mode):
            return False
    return True


def _unguardable(mount: MountSpec, why: str) -> SecurityViolation:
    return SecurityViolation(
        f"{mount.source!r} cannot be given to this service writable with its Git directory kept "
        f"read-only: {why}. Mount it read-only (:ro), or use a service whose suite entry lets "
        "it write Git (security.git_writable)",
        reason=GIT_DIR_UNGUARDABLE,
        path=mount.source,
    )


def _check_readable(path: str, fd: int, found: os.stat_result) -> None:
    """Refuse an object this process's (real) user may not read: a session must not see what
    the user who runs the orchestrator could not (another user's 0700 home), even though the
    engine, as root, could mount it. ``O_PATH`` needed no permission on the object itself, so
    it is checked here, on the pinned object (through our descriptor's magic link), not on a
    path that could change meanwhile. Always true for root, whose sessions act for root.
    """
    wanted = os.R_OK | os.X_OK if stat.S_ISDIR(found.st_mode) else os.R_OK
    if not os.access(f"/proc/self/fd/{fd}", wanted):
        raise SecurityViolation(
            f"the orchestrator's user may not read {path!r}",
            reason=MOUNT_NOT_PERMITTED,
            path=path,
        )


def identities(paths: Iterable[str]) -> frozenset[tuple[int, int]]:
    """(device, inode) of each path that exists (missing ones are skipped)."""
    found: set[tuple[int, int]] = set()
    for path in paths:
        try:
            result = os.stat(path)
        except OSError:
            continue
        found.add((result.st_dev, result.st_ino))
    return frozenset(found)
