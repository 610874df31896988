"""Socket stdio: a container's stdin and stdout as one Unix socket to the orchestrator.

Attached through the engine, every message crosses two more processes each way (the engine's
container shim and the engine itself, which frames stdout for the attach connection). With
socket stdio the container starts with a small static program of ours (``fabric-stdio``,
:file:`stdio_helper/fabric-stdio.c`) in front of the image's own entrypoint and command: it
connects to a socket the orchestrator listens on, makes the connection its stdin and stdout and
replaces itself with the server (``exec``). From then on the server's messages go to the
orchestrator with no engine process on the way. stderr still comes through the engine's attach
(it is off the request path).

Layout and guarantees::

    /run/reactor-fabric/stdio/           0700, ours (root: here; else $XDG_RUNTIME_DIR/...)
    └── <instance>-<random>/             0700: one per orchestrator
        ├── owner.json                   who made it; the next orchestrator removes it once
        │                                that process is gone
        ├── fabric-stdio                 our copy of the program, 0755; each container gets it
        │                                read-only at HELPER_TARGET
        └── <n>.sock                     one container's socket, 0666, read-only at
                                         SOCKET_TARGET; unlinked once it has connected

- **Only that container can connect.** A socket is reached on the host only through
  directories that are ours and closed to everyone else (checked component by component, so
  a directory another user planted or linked is refused), and in a container only through its
  own bind of that one socket. The first connection is accepted; the orchestrator then closes
  the listener and unlinks the path, so the socket can never be connected again — not by the
  server, not by anything it starts.
- **The server runs as it would without us.** ``fabric-stdio`` replaces itself with the
  image's entrypoint and command (the container's spec overrides them exactly as the engine
  would: :func:`wrapped_command`) before the server runs, so PID, user, working directory and
  environment are unchanged.
- **Nothing is added to the image**, and no mount of a client's shadows these targets: they
  are not below any allowed mount target.

Every function here blocks (file system); callers run them in a worker thread.

Resource handling: :meth:`StdioArea.listen` returns a listener whose path the caller unlinks
(:meth:`PendingStdio.close`) once the container connected or failed; :meth:`StdioArea.close`
removes the area. An area left by an orchestrator that died is removed by the next one's
:meth:`StdioArea.open`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import posixpath
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._reasons import HELPER_MISSING, NO_COMMAND, PATH_LENGTH, STDIO_DIRECTORY
from ..policy.owner import owner_is_gone, read_owner_file

log = logging.getLogger(__name__)

HELPER_TARGET = "/.reactor-fabric/fabric-stdio"
# What a held ``fabric-stdio`` waits for before it runs the server (fabric-stdio.c's GO).
GO = b"G"
SOCKET_TARGET = "/.reactor-fabric/stdio.sock"
# A container with an egress allowlist: its proxy's socket (see runtime/egress_proxy.py).
EGRESS_SOCKET_TARGET = "/.reactor-fabric/egress.sock"
# Connections waiting for the proxy to take them (each is one client connection in the container).
EGRESS_BACKLOG = 64
HELPER_ENV = "REACTOR_FABRIC_STDIO_HELPER"
BUNDLED_HELPER = Path(__file__).parent / "stdio_helper" / "fabric-stdio"
_HELPER_NAME = "fabric-stdio"
_OWNER_FILE = "owner.json"
# sockaddr_un's sun_path holds 108 bytes, the terminating NUL included.
_MAX_SOCKET_PATH = 107
# An area directory with no owner file this long is a leftover, not one being made.
ORPHAN_AGE = 60.0


class StdioUnavailable(Exception):
    """Socket stdio cannot be used here (``reason`` says why): stdio goes through the engine."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def default_parent(euid: int, environ: Mapping[str, str]) -> str:
    """Where areas live: ``/run`` for root, else the user's runtime directory (or ``/tmp``)."""
    if euid == 0:
        return "/run/reactor-fabric/stdio"
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        return posixpath.join(runtime, "reactor-fabric", "stdio")
    return f"/tmp/reactor-fabric-{euid}/stdio"  # noqa: S108 - checked: private_directory


def wrapped_command(
    image_entrypoint: Sequence[str] | None,
    image_command: Sequence[str] | None,
    spec_command: Sequence[str] | None,
    *,
    egress_port: int | None = None,
    hold: bool = False,
) -> list[str]:
    """The container's entrypoint with ``fabric-stdio`` in front of what the engine would run.

    ``egress_port``: ``fabric-stdio`` also listens on the container's ``127.0.0.1`` at that
    port and forwards each connection to EGRESS_SOCKET_TARGET (the egress proxy). ``hold``:
    once connected, it runs the program only after the orchestrator sent :data:`GO` (see
    :meth:`~.docker.DockerRuntime.spawn`'s ``gate``).

    The engine runs the image's entrypoint followed by the spec's command, or by the image's
    command when the spec gives none. Raises StdioUnavailable when that is nothing (the
    engine would refuse such a container too, so it is started the usual way and refused).
    """
    command = list(spec_command) if spec_command is not None else list(image_command or ())
    program = [*(image_entrypoint or ()), *command]
    if not program:
        raise StdioUnavailable("the image has no command to run", reason=NO_COMMAND)
    egress = ["--egress", str(egress_port), EGRESS_SOCKET_TARGET] if egress_port is not None else []
    return [HELPER_TARGET, *egress, *(["--hold"] if hold else []), SOCKET_TARGET, *program]


def private_directory(path: str, euid: int) -> str:
    """Make ``path`` (and missing parents) and check that only ``euid`` (and root) can change
    what it holds; return its real path, which callers use from then on.

    Walked component by component from ``/`` without following a link: every directory is
    root's or ``euid``'s and writable by nobody else (unless sticky, like ``/tmp``, where
    nobody else can replace what is ours), and the last is ``euid``'s, mode 0700. A link is
    followed only where root alone can have made it or can change it (owned by root, in a
    directory of root's that nobody else can write: ``/var/run`` → ``/run``); any other link is
    refused. Checking the resolved path is not enough: a path kept *through* a link is looked up
    again by everyone who uses it later (the engine binds by path at every container create),
    and the link's owner can repoint it between our check and their lookup. The real path
    returned holds no link, and nobody else can replace any of its components. Raises
    StdioUnavailable otherwise."""
    if not path.startswith("/"):
        raise StdioUnavailable(f"{path} is not an absolute path", reason=STDIO_DIRECTORY)
    try:
        return _walk_private(path, euid)
    except OSError as exc:
        raise StdioUnavailable(
            f"cannot make the stdio directory {path}: {exc}", reason=STDIO_DIRECTORY
        ) from exc


# Links followed in one walk at most (the kernel's own limit for a path lookup).
_MAX_LINKS = 40


def _walk_private(path: str, euid: int) -> str:
    pending = [part for part in path.split("/") if part not in ("", ".")]
    current = "/"
    _check_directory(current, os.lstat(current), euid, last=False)
    links = 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            # ``current`` is a checked real directory: its parent is checked already too.
            current = posixpath.dirname(current)
            continue
        candidate = posixpath.join(current, name)
        try:
            found = os.lstat(candidate)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
                os.mkdir(candidate, 0o700)
            found = os.lstat(candidate)
        if stat.S_ISLNK(found.st_mode):
            holder = os.lstat(current)
            if found.st_uid != 0 or holder.st_uid != 0 or holder.st_mode & 0o022:
                raise StdioUnavailable(
                    f"{candidate} is a link (uid {found.st_uid}) that someone other than root "
                    "could change; only a real directory is used for the stdio sockets",
                    reason=STDIO_DIRECTORY,
                )
            links += 1
            if links > _MAX_LINKS:
                raise StdioUnavailable(f"too many links in {path}", reason=STDIO_DIRECTORY)
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending[:0] = [part for part in target.split("/") if part not in ("", ".")]
            continue
        _check_directory(candidate, found, euid, last=False)
        current = candidate
    # Where the walk ended (after a "..", a directory checked only as one above): ours, 0700.
    _check_directory(current, os.lstat(current), euid, last=True)
    return current


def _check_directory(path: str, found: os.stat_result, euid: int, *, last: bool) -> None:
    """A directory of root's or ``euid``'s that nobody else can change (the last: ours, 0700)."""
    if not stat.S_ISDIR(found.st_mode):
        raise StdioUnavailable(f"{path} is not a directory", reason=STDIO_DIRECTORY)
    if found.st_uid not in (0, euid) or (last and found.st_uid != euid):
        raise StdioUnavailable(
            f"{path} belongs to another user (uid {found.st_uid})", reason=STDIO_DIRECTORY
        )
    open_to_others = found.st_mode & (0o077 if last else 0o022)
    if open_to_others and (last or not found.st_mode & stat.S_ISVTX):
        raise StdioUnavailable(
            f"{path} is open to other users (mode {stat.S_IMODE(found.st_mode):04o})",
            reason=STDIO_DIRECTORY,
        )


@dataclass
class PendingStdio:
    """A container's socket, listening until its ``fabric-stdio`` connects."""

    listener: socket.socket
    path: str

    def close(self) -> None:
        """Stop listening and unlink the path: nothing can connect any more."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.listener.close()


class StdioArea:
    """One orchestrator's socket stdio directory (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.helper = posixpath.join(root, _HELPER_NAME)
        self._tokens = itertools.count(1)
        # Sockets are bound through a descriptor of the area (/proc/self/fd/N/…): a bind then
        # needs no path that fits sockaddr_un's 108 bytes, wherever the area lives, and lands in
        # the directory this descriptor holds even if the path were swapped meanwhile.
        self._directory = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        held = f"/proc/self/fd/{self._directory}"
        self._bind_base = held if os.path.isdir(held) else root

    @classmethod
    def open(
        cls,
        instance_id: str,
        *,
        owner: dict[str, str],
        this_host: str,
        helper: str | None = None,
        parent: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> StdioArea:
        """Make this orchestrator's area (removing areas of orchestrators that died), or raise
        StdioUnavailable."""
        euid = os.geteuid()
        source = helper or environ.get(HELPER_ENV) or str(BUNDLED_HELPER)
        if not os.access(source, os.X_OK):
            raise StdioUnavailable(
                f"{source} is missing (scripts/build-stdio-helper builds it)",
                reason=HELPER_MISSING,
            )
        # From here on only the real path: one kept through a link could be repointed.
        parent = private_directory(parent or default_parent(euid, environ), euid)
        remove_stale_areas(parent, this_host=this_host)
        # The instance's name, and a random part: two runtimes of one process (or replicas
        # sharing an instance id) each get an area of their own.
        root = posixpath.join(parent, f"{instance_id}-{secrets.token_hex(4)}")
        try:
            os.mkdir(root, 0o700)
        except OSError as exc:
            raise StdioUnavailable(f"cannot make {root}: {exc}", reason=STDIO_DIRECTORY) from exc
        try:
            area = cls(root)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rmdir(root)  # ours, just made, still empty
            raise StdioUnavailable(f"cannot open {root}: {exc}", reason=STDIO_DIRECTORY) from exc
        if len(posixpath.join(area._bind_base, "999999999.sock")) > _MAX_SOCKET_PATH:
            area.close()  # no /proc, and too deep a path for a socket address
            raise StdioUnavailable(f"{root} is too long for a socket path", reason=PATH_LENGTH)
        try:
            with open(posixpath.join(root, _OWNER_FILE), "x", encoding="utf-8") as file:
                json.dump(owner, file)
            shutil.copyfile(source, area.helper)
            os.chmod(area.helper, 0o755)  # noqa: S103 - any uid in a container runs it
        except OSError as exc:
            area.close()
            raise StdioUnavailable(
                f"cannot copy {source} into {root}: {exc}", reason=STDIO_DIRECTORY
            ) from exc
        return area

    def listen(self, *, backlog: int = 1, suffix: str = ".sock") -> PendingStdio:
        """A new socket for one container, listening for exactly one connection (``backlog``:
        more, for the egress proxy's socket, named ``<n>.egress.sock``)."""
        name = f"{next(self._tokens)}{suffix}"
        path = posixpath.join(self.root, name)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(posixpath.join(self._bind_base, name))
            # Any uid in the container may connect: it is the container's own socket, reached
            # only through this area (0700) or through the container's bind.
            os.chmod(name, 0o666, dir_fd=self._directory)  # noqa: S103
            listener.listen(backlog)
            listener.setblocking(False)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            listener.close()
            raise
        return PendingStdio(listener, path)

    def close(self) -> None:
        """Remove the area (sockets still listening stop being reachable by path)."""
        if self._directory >= 0:
            os.close(self._directory)
            self._directory = -1
        _remove_area(self.root)


def _remove_area(root: str) -> None:
    """Remove an area: it holds files (sockets, our program, owner.json) and, at most, empty
    directories: an engine that (re)starts a container whose socket was already unlinked
    makes the missing bind source as a directory."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        path = posixpath.join(root, name)
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.rmdir(path)  # only ever empty: never a tree walk in a shared place
            else:
                os.unlink(path)
    try:
        os.rmdir(root)
    except OSError as exc:
        log.warning("stdio_area_not_removed", extra={"directory": root, "detail": str(exc)})


def _is_leftover(root: str, now: float) -> bool:
    """A directory older than ORPHAN_AGE (one with no owner file is then not being made)."""
    try:
        found = os.lstat(root)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and now - found.st_mtime > ORPHAN_AGE


def remove_stale_areas(parent: str, *, this_host: str, now: float | None = None) -> int:
    """Remove the areas of orchestrators on this host that are gone; how many.

    An area without a readable owner is being made (for the moment between its ``mkdir`` and
    the owner file) or was half removed: it is removed once ORPHAN_AGE has passed.
    """
    removed = 0
    now = time.time() if now is None else now
    for name in os.listdir(parent):
        root = posixpath.join(parent, name)
        owner = read_owner_file(posixpath.join(root, _OWNER_FILE))
        if owner is None:
            stale, extra = _is_leftover(root, now), {"detail": "no owner"}
        else:
            stale, extra = owner_is_gone(owner, this_host=this_host), {}
        if stale:
            _remove_area(root)
            removed += 1
            log.info("stdio_area_removed", extra={"directory": root, **extra})
    return removed
