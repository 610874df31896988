"""Mounts for containers started before their session: the warm pool's staging area.

A session's mounts must normally exist when its container is created. A pooled container is
created before anyone asks for it, so it gets, at each allowed mount target (``/workspace``,
``/projects``), a read-only bind of an empty directory of its own here, with ``rslave``
propagation: a mount the orchestrator later makes *on the host* below that directory appears
inside the running container, and nothing the container does travels back. When the container
is handed to a session, each of the session's pinned directories is attached there
(:meth:`StagingArea.attach`), checked from the host by device and inode through
``/proc/PID/root`` exactly as a fresh container's mounts are, and detached again when the
container goes (:meth:`StagingArea.release`).

Layout and guarantees::

    /run/reactor-fabric/staging/         root-owned, 0700: no other user reaches a session's
    └── <instance>/                      directory through here; one per orchestrator, a mount
        ├── owner.json                   point of its own in a peer group of its own (shared)
        └── <token>/                     one pooled container, never reused
            └── <n>/                     what the container sees at allowed target n

- **Race-free.** The session's directory is the pinned descriptor's object (see
  :mod:`reactor_fabric.policy.pinning`), cloned by descriptor and attached onto a descriptor
  (:mod:`.host_mounts`): no path is resolved between validation and mount. Mount points below a
  target are made component by component without following links, in directories only root
  can write, which the container sees read-only.
- **Isolated.** A container's binds are rooted at its own ``<token>/<n>``: propagation reaches
  a slave mount only below its root, so a mount for one container never appears in another.
- **Read-only means read-only from the first instant.** The copy is made read-only before it
  is attached (a bind followed by a remount would propagate writable). A writable project's
  ``.git`` goes onto the copy read-only before the copy is attached (Linux 6.15+; older
  kernels give such sessions fresh containers), so both appear in the container at once.
- **Private copies.** A copy of a shared mount is its source's peer: it is made private before
  anything else, so nothing mounted onto it reaches the host's tree, and nothing the host
  mounts later below the project reaches the container.
- **Never reused.** A token's directories are removed with its container; a token is never
  given out twice.

Privilege: mounting on the host needs root in the engine's mount namespace. Without it
:meth:`StagingArea.open` raises :class:`StagingUnavailable` and the pool serves only sessions
without mounts. If the engine lives in another mount namespace, nothing propagates: the first
hand-out sees the empty directory instead of the session's and raises
:class:`PropagationMissing`, after which the pool stops using the staging area.

Every method blocks (file system, mount table): callers run them in a worker thread.

Resource handling: :meth:`StagingArea.release` detaches every mount below a token before it
removes anything, and removes only what this area created (empty directories, the empty files
it made as mount points); if a mount cannot be detached, nothing below it is touched.
:meth:`StagingArea.close` releases every token and the area itself. An area left by an
orchestrator that died is cleaned by the next one's :meth:`StagingArea.open`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .._errors import SecurityViolation
from .._reasons import (
    MOUNT_CHANGED,
    MOUNT_NOT_PERMITTED,
    NOT_ROOT,
    PROPAGATION_MISSING,
    STAGING_DIRECTORY,
)
from ..policy.git_guard import GIT_DIR, guard_target
from ..policy.mount_spec import MountSpec
from ..policy.mounts import is_within
from ..policy.owner import owner_is_gone, read_owner_file
from ..policy.pinning import Pin, PinSet
from . import host_mounts

log = logging.getLogger(__name__)

STAGING_PARENT = "/run/reactor-fabric/staging"
_OWNER_FILE = "owner.json"
_DIRECTORY_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


class StagingUnavailable(Exception):
    """The staging area cannot be used here (``reason`` says why); mounts are not pooled."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PropagationMissing(StagingUnavailable):
    """A mount made on the host did not appear in the container (the engine lives in another
    mount namespace): the staging area is of no use to this orchestrator."""


class NotStageable(Exception):
    """These mounts cannot be attached to a pooled container (e.g. a file where the container
    has a directory): the session gets a fresh container instead."""


@dataclass(frozen=True)
class StagedMount:
    """Where a session mount goes in the staging area: which target and the path below it."""

    index: int
    below: tuple[str, ...]


class Staging(Protocol):
    """What the warm pool needs of a staging area (the real one: :class:`StagingArea`)."""

    def prepare(self, token: int) -> tuple[MountSpec, ...]: ...

    def placement(
        self, mounts: Sequence[MountSpec]
    ) -> list[tuple[MountSpec, StagedMount]] | None: ...

    def attach(self, token: int, mounts: Sequence[MountSpec], pins: PinSet, pid: int) -> None: ...

    def release(self, token: int) -> None: ...

    def close(self) -> None: ...


class StagingArea:
    """One orchestrator's staging area (see the module docstring)."""

    def __init__(self, root: str, targets: Sequence[str], *, nested: bool = False) -> None:
        self.root = root
        # Whether a mount can be put onto a detached one before it is attached (Linux 6.15+):
        # what a guarded .git needs to appear together with its project (see attach).
        self.nested = nested
        # A target inside another would put one staging bind inside another: keep the outer.
        normal = sorted({posixpath.normpath(t) for t in targets})
        self.targets = tuple(
            t for t in normal if not any(o != t and is_within(t, o) for o in normal)
        )
        self._lock = threading.Lock()
        # token → what this area created for it, in creation order (removed in reverse).
        self._created: dict[int, list[tuple[str, bool]]] = {}

    # --- the area -----------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        instance_id: str,
        targets: Sequence[str],
        *,
        owner: dict[str, str],
        this_host: str,
        parent: str = STAGING_PARENT,
    ) -> StagingArea:
        """Make this orchestrator's area (cleaning areas of orchestrators that died), or raise
        StagingUnavailable."""
        if os.geteuid() != 0:
            raise StagingUnavailable(
                "mounting into started containers needs the orchestrator to run as root",
                reason=NOT_ROOT,
            )
        try:
            _make_private_directory(parent)
            remove_stale_areas(parent, this_host=this_host)
            root = posixpath.join(parent, instance_id)
            os.mkdir(root, 0o700)
        except OSError as exc:
            raise StagingUnavailable(
                f"cannot make the staging directory: {exc}", reason=STAGING_DIRECTORY
            ) from exc
        try:
            with open(posixpath.join(root, _OWNER_FILE), "x", encoding="utf-8") as file:
                json.dump(owner, file)
            host_mounts.make_shared_mount(root)
            # The descriptor-based mount calls exist (Linux 5.12+)?
            probe_fd = os.open(root, _DIRECTORY_FLAGS)
            try:
                os.close(host_mounts.clone_tree(probe_fd))
            finally:
                os.close(probe_fd)
            nested = _can_mount_on_detached(root)
        except OSError as exc:
            _remove_area(root)
            raise StagingUnavailable(
                f"cannot mount in the staging area: {exc}", reason=MOUNT_NOT_PERMITTED
            ) from exc
        return cls(root, targets, nested=nested)

    def close(self) -> None:
        """Release every token, then the area itself."""
        with self._lock:
            tokens = list(self._created)
        for token in tokens:
            self.release(token)
        _remove_area(self.root)

    # --- one pooled container -----------------------------------------------------------------

    def prepare(self, token: int) -> tuple[MountSpec, ...]:
        """Directories for pooled container ``token``; the binds its container is created with."""
        base = posixpath.join(self.root, str(token))
        created: list[tuple[str, bool]] = []
        with self._lock:
            if token in self._created:
                raise ValueError(f"staging token {token} was used before")
            self._created[token] = created
        os.mkdir(base, 0o700)
        created.append((base, True))
        binds = []
        for index, target in enumerate(self.targets):
            directory = posixpath.join(base, str(index))
            os.mkdir(directory, 0o755)
            created.append((directory, True))
            binds.append(MountSpec(directory, target, read_only=True, propagation="rslave"))
        return tuple(binds)

    def placement(self, mounts: Sequence[MountSpec]) -> list[tuple[MountSpec, StagedMount]] | None:
        """Where each of a session's mounts goes, or None if they cannot go into a pooled
        container: a target not under an allowed target (only allowed as the source's own
        path, checked against the image at create time), or one target inside another."""
        # A guarded .git rides on its project's mount (attach puts it there first): it is not
        # placed by itself; a kernel that cannot nest before attaching takes no guard here.
        guards = [mount for mount in mounts if mount.git_guard]
        if guards and not self.nested:
            return None
        own = [mount for mount in mounts if not mount.git_guard]
        carriers = {guard_target(mount) for mount in own}
        if any(guard.target not in carriers for guard in guards):
            return None
        placed = []
        for mount in sorted(own, key=lambda m: m.target):
            if mount.check_in_image:
                return None
            if any(o is not mount and is_within(mount.target, o.target) for o in own):
                return None
            for index, target in enumerate(self.targets):
                if is_within(mount.target, target):
                    below = tuple(p for p in mount.target[len(target) :].split("/") if p)
                    placed.append((mount, StagedMount(index, below)))
                    break
            else:
                return None
        return placed

    def attach(
        self,
        token: int,
        mounts: Sequence[MountSpec],
        pins: PinSet,
        pid: int,
        *,
        stat_in_container: Callable[[str], os.stat_result] = os.stat,
        statvfs_in_container: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        """Mount the session's pinned directories into pooled container ``token`` (whose first
        process is ``pid``) and check that it sees them.

        Raises NotStageable (nothing of the session's was made visible), PropagationMissing, or
        SecurityViolation ``mount_changed``; on any failure :meth:`release` undoes what was
        done. The pins stay the caller's.
        """
        placement = self.placement(mounts)
        if placement is None:
            raise NotStageable("these mounts do not fit a pooled container")
        base = posixpath.join(self.root, str(token))
        with self._lock:
            created = self._created[token]
        guards = {mount.target: mount for mount in mounts if mount.git_guard}
        for mount, staged in placement:
            pin = pins.for_target(mount.target)
            if pin is None:
                raise NotStageable(f"no pin for {mount.target!r}")
            guard = guards.get(guard_target(mount))
            guard_pin = pins.for_target(guard.target) if guard is not None else None
            if guard is not None and guard_pin is None:
                raise NotStageable(f"no pin for {guard.target!r}")
            is_directory = stat.S_ISDIR(os.fstat(pin.fd).st_mode)
            if not is_directory and not staged.below:
                raise NotStageable(f"{mount.source!r} is not a directory")
            point = self._mount_point(base, staged, is_directory, created)
            try:
                tree = host_mounts.clone_tree(pin.fd)
                try:
                    # Private: a copy of a shared mount (a systemd host's / is one) is its
                    # source's peer. A guard put onto it would be mounted over the user's own
                    # .git on the host too, and mounts made later below the project on the
                    # host would appear in the container.
                    host_mounts.set_attributes(tree, read_only=mount.read_only, private=True)
                    if guard_pin is not None:
                        # Onto the detached copy, before it is attached: the container sees
                        # the project and its read-only .git appear in one step, never the
                        # .git writable for an instant.
                        _guard_git(tree, guard_pin)
                    host_mounts.move_tree(tree, point)
                finally:
                    os.close(tree)
            finally:
                os.close(point)
        self._verify(
            base,
            placement,
            pins,
            pid,
            stat_in_container=stat_in_container,
            statvfs_in_container=statvfs_in_container,
        )

    def release(self, token: int) -> None:
        """Detach every mount below ``token`` and remove its directories (idempotent)."""
        with self._lock:
            created = self._created.pop(token, None)
        if created is None:
            return
        base = posixpath.join(self.root, str(token))
        if not _detach_all(base):
            log.error("staging_release_failed", extra={"token": token, "directory": base})
            return
        for path, is_directory in reversed(created):
            with contextlib.suppress(FileNotFoundError):
                if is_directory:
                    os.rmdir(path)
                else:
                    os.unlink(path)

    # --- helpers ------------------------------------------------------------------------------

    def _mount_point(
        self,
        base: str,
        staged: StagedMount,
        is_directory: bool,
        created: list[tuple[str, bool]],
    ) -> int:
        """An ``O_PATH`` descriptor of the mount point for ``staged``, made as needed, one
        component at a time, never through a link."""
        path = posixpath.join(base, str(staged.index))
        current = os.open(path, _DIRECTORY_FLAGS)
        try:
            for depth, name in enumerate(staged.below, start=1):
                last = depth == len(staged.below)
                path = posixpath.join(path, name)
                if last and not is_directory:
                    fd = os.open(
                        name,
                        os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW,
                        0o644,
                        dir_fd=current,
                    )
                    os.close(fd)
                    created.append((path, False))
                    following = os.open(
                        name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current
                    )
                else:
                    try:
                        os.mkdir(name, 0o755, dir_fd=current)
                        created.append((path, True))
                    except FileExistsError:
                        pass  # made for another mount of this session
                    following = os.open(name, _DIRECTORY_FLAGS, dir_fd=current)
                os.close(current)
                current = following
        except BaseException:
            os.close(current)
            raise
        return current

    def _verify(
        self,
        base: str,
        placement: list[tuple[MountSpec, StagedMount]],
        pins: PinSet,
        pid: int,
        *,
        stat_in_container: Callable[[str], os.stat_result],
        statvfs_in_container: Callable[[str], os.statvfs_result],
    ) -> None:
        # The guarded .git directories first: a project's view is checked below.
        guarded = {guard_target(mount) for mount, _staged in placement}
        for guard in (pin for pin in pins.pins if pin.target in guarded):
            path = f"/proc/{pid}/root{guard.target}"
            refused = guard.refusal(
                stat_in_container(path),
                writable=not statvfs_in_container(path).f_flag & os.ST_RDONLY,
            )
            if refused is not None:
                raise refused
        for mount, staged in placement:
            pin = pins.for_target(mount.target)
            assert pin is not None  # attach checked
            found = stat_in_container(f"/proc/{pid}/root{mount.target}")
            if pin.matches(found):
                continue
            staging = os.stat(posixpath.join(base, str(staged.index), *staged.below))
            if (found.st_dev, found.st_ino) == (staging.st_dev, staging.st_ino):
                raise PropagationMissing(
                    "a mount made on the host does not reach the container (is the engine in "
                    "another mount namespace?)",
                    reason=PROPAGATION_MISSING,
                )
            raise SecurityViolation(
                f"the container did not get the directory that was validated for {mount.target!r}",
                reason=MOUNT_CHANGED,
                path=pin.path,
                target=mount.target,
            )


def _guard_git(tree: int, guard: Pin) -> None:
    """Put a read-only copy of the pinned Git directory ``guard`` over the ``.git`` of the
    detached project mount ``tree`` (opened beneath it, never through a link, and checked to
    be the pinned one)."""
    git = os.open(GIT_DIR, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tree)
    try:
        if not guard.matches(os.fstat(git)):
            raise SecurityViolation(
                f"{guard.path!r} changed after it was pinned",
                reason=MOUNT_CHANGED,
                path=guard.path,
            )
        copy = host_mounts.clone_tree(guard.fd)
        try:
            host_mounts.set_attributes(copy, read_only=True, private=True)
            host_mounts.move_tree(copy, git)
        finally:
            os.close(copy)
    finally:
        os.close(git)


def _can_mount_on_detached(root: str) -> bool:
    """Whether this kernel puts a mount onto a detached one (Linux 6.15+; EINVAL before):
    tried once with copies of the area's own directory, which vanish when closed."""
    probe = posixpath.join(root, ".nested-probe")
    os.mkdir(probe, 0o700)
    try:
        source = os.open(root, _DIRECTORY_FLAGS)
        try:
            tree = host_mounts.clone_tree(source)
            try:
                # Private, or the probe's mount would propagate to the area itself (its peer).
                host_mounts.set_attributes(tree, read_only=True, private=True)
                inner = os.open(".nested-probe", _DIRECTORY_FLAGS, dir_fd=tree)
                try:
                    copy = host_mounts.clone_tree(source)
                    try:
                        host_mounts.move_tree(copy, inner)
                    except OSError:
                        return False
                    finally:
                        os.close(copy)
                finally:
                    os.close(inner)
            finally:
                os.close(tree)
        finally:
            os.close(source)
    finally:
        os.rmdir(probe)
    return True


def _make_private_directory(path: str) -> None:
    """``path`` (made as needed) must be a real directory, root's, writable by root only."""
    os.makedirs(path, 0o700, exist_ok=True)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0 or found.st_mode & 0o077:
        raise StagingUnavailable(
            f"{path} must be a directory owned by root with mode 0700",
            reason=STAGING_DIRECTORY,
        )


def _detach_all(directory: str) -> bool:
    """Detach every mount point at or below ``directory``; whether none is left."""
    for point in host_mounts.mount_points_below(directory):
        try:
            host_mounts.detach(point)
        except OSError as exc:
            log.error("staging_detach_failed", extra={"path": point, "detail": str(exc)})
    return not host_mounts.mount_points_below(directory)


def _remove_area(root: str) -> None:
    """Detach everything in an area, then remove what is left of it: only empty directories
    and empty files (all an area holds once nothing is mounted)."""
    if not _detach_all(root):
        log.error("staging_release_failed", extra={"directory": root})
        return
    for directory, subdirectories, files in os.walk(root, topdown=False):
        for name in files:
            path = posixpath.join(directory, name)
            with contextlib.suppress(OSError):
                if name == _OWNER_FILE or os.lstat(path).st_size == 0:
                    os.unlink(path)
        for name in subdirectories:
            with contextlib.suppress(OSError):
                os.rmdir(posixpath.join(directory, name))
    with contextlib.suppress(OSError):
        os.rmdir(root)


def remove_stale_areas(parent: str, *, this_host: str) -> int:
    """Remove the areas of orchestrators on this host that are gone; how many."""
    removed = 0
    for name in os.listdir(parent):
        root = posixpath.join(parent, name)
        owner = read_owner_file(posixpath.join(root, _OWNER_FILE))
        if owner is None:
            continue  # not an area, or one being made: leave it
        if owner_is_gone(owner, this_host=this_host):
            _remove_area(root)
            removed += 1
            log.info("staging_area_removed", extra={"directory": root})
    return removed
