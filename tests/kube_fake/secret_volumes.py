"""A pod's ``secret`` volumes, as the kubelet sets them up: the payload (which keys, at which
paths, with which modes), written in memory, owned per the pod's ``fsGroup``.

What the kubelet does (pkg/volume/secret, pkg/volume/util/atomic_writer.go,
pkg/volume/volume_linux.go), and the fake with it:

- The payload (``MakePayload``): every key of the Secret as a file named by the key, or only
  the ``items`` (key → path, each with its own ``mode`` or the volume's ``defaultMode``, 0644
  unless given). A missing Secret, or an item naming a key the Secret lacks, fails the mount
  (``secret "x" not found``, ``references non-existent secret key: K``) unless the volume is
  ``optional``: the pod stays ContainerCreating and the kubelet tries again.
- The volume is a tmpfs (a memory emptyDir): the fake writes it below the host's shared memory
  (``/dev/shm``, a tmpfs, never a disk, the engine's included) and binds it into the container,
  read-only (the kubelet mounts Secret volumes read-only whatever the mount says).
- The atomic writer's layout: the files in a ``..<timestamp>`` directory (0755), a ``..data``
  symlink to it, and one symlink per top-level path (``NAME -> ..data/NAME``); the volume's
  root is the tmpfs's (1777). The kubelet writes as root: files are root's.
- With an ``fsGroup`` (``SetVolumeOwnership``, read-only volume): every entry is given the
  group; files get ``mode | 0440``, directories ``mode | 0550`` and set-group-ID.

The fake cannot give files to root when it does not run as root: it then keeps them its own
(and gives the group only where it may).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Final

from reactor_fabric.runtime.secret_files import SHARED_MEMORY, TMPFS, file_system_type

DEFAULT_MODE: Final = 0o644  # SecretVolumeSourceDefaultMode
PLUGIN_DIR: Final = "kubernetes.io~secret"
_READ_ONLY_MASK: Final = 0o440  # volume_linux.go's roMask
_EXEC_MASK: Final = 0o110


class VolumeSetupError(Exception):
    """``MountVolume.SetUp failed``: the pod waits in ContainerCreating, retried later."""


@dataclass(frozen=True)
class FileProjection:
    path: str
    data: bytes = b""
    mode: int = DEFAULT_MODE


def payload(source: Mapping[str, Any], data: Mapping[str, bytes] | None) -> list[FileProjection]:
    """The files of a ``secret`` volume whose Secret holds ``data`` (None: no such Secret).

    Error handling: raises VolumeSetupError as the kubelet's secret plugin fails SetUp.
    """
    name = source.get("secretName", "")
    optional = bool(source.get("optional"))
    default_mode = source.get("defaultMode", DEFAULT_MODE)
    if data is None:
        if not optional:
            raise VolumeSetupError(f'secret "{name}" not found')
        data = {}
    items = source.get("items") or []
    if not items:
        return [FileProjection(key, value, default_mode) for key, value in sorted(data.items())]
    files = []
    for item in items:
        key = item["key"]
        if key not in data:
            if optional:
                continue
            raise VolumeSetupError(f"references non-existent secret key: {key}")
        files.append(FileProjection(item["path"], data[key], item.get("mode", default_mode)))
    return files


class SecretVolumes:
    """The host side of the pods' secret volumes: ``<root>/<pod uid>/volumes/...``, below
    shared memory. Blocking: the kubelet calls it in a worker thread."""

    def __init__(self, parent: str = SHARED_MEMORY) -> None:
        self._parent = parent
        self._root: Path | None = None
        self._lock = threading.Lock()

    def _open_root(self) -> Path:
        with self._lock:
            if self._root is None:
                kind = file_system_type(self._parent)
                if kind != TMPFS:
                    # The fake's own failure (raised at its exit): a secret never goes to a disk.
                    raise RuntimeError(f"{self._parent} is not memory-backed (it is {kind})")
                self._root = Path(tempfile.mkdtemp(prefix="kube-fake-volumes-", dir=self._parent))
            return self._root

    def directory(self, pod_uid: str, volume: str) -> Path:
        return self._open_root() / pod_uid / "volumes" / PLUGIN_DIR / volume

    def set_up(
        self, pod_uid: str, volume: str, files: list[FileProjection], fs_group: int | None
    ) -> Path:
        """Write ``files`` as the volume ``volume`` of pod ``pod_uid``; its host directory."""
        directory = self.directory(pod_uid, volume)
        if directory.exists():  # a set-up that failed half-way: again, from nothing
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        directory.chmod(0o1777)  # a tmpfs's root
        stamp = datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
        data_dir = Path(tempfile.mkdtemp(prefix=stamp, dir=directory))
        data_dir.chmod(0o755)
        for projection in files:
            target = data_dir / projection.path
            for parent in reversed(target.relative_to(data_dir).parents[:-1]):
                (data_dir / parent).mkdir(mode=0o755, exist_ok=True)
            fd = os.open(
                target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                os.write(fd, projection.data)
                os.fchmod(fd, projection.mode)  # the mode as given, whatever the umask
            finally:
                os.close(fd)
        (directory / "..data").symlink_to(data_dir.name)
        for top in sorted({PurePosixPath(p.path).parts[0] for p in files}):
            (directory / top).symlink_to(f"..data/{top}")
        if fs_group is not None:
            _set_ownership(directory, fs_group)
        return directory

    def tear_down(self, pod_uid: str) -> None:
        """Remove every volume of pod ``pod_uid`` (its container is gone)."""
        with self._lock:
            root = self._root
        if root is not None:
            shutil.rmtree(root / pod_uid, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            root, self._root = self._root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _set_ownership(directory: Path, fs_group: int) -> None:
    """SetVolumeOwnership for a read-only volume: the group on everything (symlinks too,
    not followed), read for the group, and set-group-ID directories."""
    for path in [directory, *sorted(directory.rglob("*"))]:
        info = path.lstat()
        # Not root, and not a member: the fake keeps its own group.
        with contextlib.suppress(PermissionError):
            os.lchown(path, -1, fs_group)
        if stat.S_ISLNK(info.st_mode):
            continue
        mask = _READ_ONLY_MASK
        if stat.S_ISDIR(info.st_mode):
            mask |= stat.S_ISGID | _EXEC_MASK
        path.chmod(stat.S_IMODE(info.st_mode) | mask)
