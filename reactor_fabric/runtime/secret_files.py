"""Secrets delivered as files: memory-backed host directories bound at ``/run/secrets``.

A service's file secrets are written once per (service, server account) into a directory of
the host's shared memory (``/dev/shm``, a tmpfs: never on a disk, the engine's included) and
that directory is bound read-only into each of the service's containers at
:data:`~reactor_fabric.config.secrets.SECRETS_DIR`. Every container of a service — a
session's, a pooled one made before any session, the catalog probe's — gets the same files,
so the warm pool needs nothing of its own.

Why not the engine's own means: Docker's secrets need a swarm, Podman's ``file`` driver keeps
them on disk, a file copied into a container lands in its writable layer (on disk; a tmpfs of
the container is mounted only at start, over it), and writing it after the start races the
server reading it. A bind from the host's memory exists before the server's first
instruction and is gone when the orchestrator ends. It needs the engine on this machine (a
Unix socket): with a remote engine a file secret is refused (``as: env`` still works).

Layout::

    /dev/shm/reactor-fabric-secrets-XXXX/   the orchestrator's, 0700: no other host user
    └── <service>-<uid>-<gid>/              0500, owned by the server's account
        └── NAME                            0400, owned by the server's account

Ownership: the server's account (the spec's numeric user). An orchestrator that is not root
can give files only to itself, so such a service's servers run as the orchestrator's user
(see ContainerIdentity.secrets_account). Blocking: callers run it in a worker thread.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

from .._errors import ContainerStartFailure
from .._reasons import SECRET_UNAVAILABLE
from ..policy.container_parts.ownership import LABEL_SERVICE
from ..policy.container_spec import ContainerSpec

SHARED_MEMORY = "/dev/shm"  # noqa: S108 - a tmpfs on every Linux host
TMPFS = "tmpfs"


def file_system_type(path: str) -> str | None:
    """The type of the file system ``path`` is on, from /proc/self/mounts (longest match)."""
    best, kind = "", None
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind


def numeric_user(user: str | None) -> tuple[int, int] | None:
    """``"uid:gid"`` or ``"uid"`` (gid = uid) as numbers; None for a name."""
    if user is None:
        return None
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        return None
    return int(uid), int(gid or uid)


def _refused(spec: ContainerSpec, why: str) -> ContainerStartFailure:
    service = spec.labels.get(LABEL_SERVICE, "")
    return ContainerStartFailure(
        f"service {service!r}: its file secrets cannot be delivered: {why}",
        reason=SECRET_UNAVAILABLE,
        service=service,
    )


class SecretFiles:
    """The orchestrator's directory of file secrets; :meth:`directory_for` a spec's."""

    def __init__(self, parent: str = SHARED_MEMORY) -> None:
        self._parent = parent
        self._lock = threading.Lock()
        self._root: Path | None = None
        self._made: set[str] = set()

    def directory_for(self, spec: ContainerSpec) -> str:
        """The host directory holding ``spec``'s file secrets, made on first use (owned by the
        server's account, the files 0400). Raises ContainerStartFailure
        (``secret_unavailable``) when they cannot be given to that account."""
        ids = numeric_user(spec.user)
        if ids is None:
            raise _refused(
                spec,
                f"the server's user {spec.user!r} is a name; give a numeric user (uid:gid) "
                "or remove user:",
            )
        uid, gid = ids
        if os.geteuid() != 0 and uid != os.geteuid():
            raise _refused(
                spec,
                f"the orchestrator (uid {os.geteuid()}, not root) can give a file only to "
                f"its own user, and the server runs as {uid}; remove user: or use as: env",
            )
        name = f"{spec.labels.get(LABEL_SERVICE, 'service')}-{uid}-{gid}"
        with self._lock:
            root = self._open_root(spec)
            directory = root / name
            if name not in self._made:
                try:
                    self._write(directory, spec, uid, gid)
                except OSError as exc:
                    raise _refused(spec, f"cannot write them: {exc.strerror or exc}") from None
                self._made.add(name)
        return str(directory)

    def _open_root(self, spec: ContainerSpec) -> Path:
        if self._root is None:
            kind = file_system_type(self._parent)
            if kind != TMPFS:
                raise _refused(spec, f"{self._parent} is not memory-backed (it is {kind})")
            self._root = Path(tempfile.mkdtemp(prefix="reactor-fabric-secrets-", dir=self._parent))
        return self._root

    @staticmethod
    def _write(directory: Path, spec: ContainerSpec, uid: int, gid: int) -> None:
        if directory.exists():  # a write that failed half-way: start again
            shutil.rmtree(directory)
        directory.mkdir(mode=0o700)
        for secret in spec.secret_files:
            fd = os.open(
                directory / secret.name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o400,
            )
            try:
                os.write(fd, secret.value.encode())
                os.fchmod(fd, 0o400)  # whatever the umask
                if (uid, gid) != (os.geteuid(), os.getegid()):
                    os.fchown(fd, uid, gid)
            finally:
                os.close(fd)
        if (uid, gid) != (os.geteuid(), os.getegid()):
            os.chown(directory, uid, gid)
        directory.chmod(0o500)

    def close(self) -> None:
        """Remove every secret file (the orchestrator is stopping)."""
        with self._lock:
            root, self._root = self._root, None
            self._made.clear()
        if root is not None:
            for directory in root.iterdir():
                directory.chmod(0o700)  # a 0500 directory's entries cannot be removed
            shutil.rmtree(root, ignore_errors=True)
