"""A copy helper: a process of the orchestrator's own that copies half of a large copy on the
machine's other core.

Why a process: a copy is a loop of system calls, one thread's work; two threads of one
interpreter copying at once spend more time handing its lock over than they save (see
:func:`~.files.copy_listed`), while a second process copies beside the first at full speed
(10,000 files here: 130 ms in two processes against 240 in one). A task's whole copy is on its
start's path (a project no spare was made of: :mod:`reactor_fabric.trio.spares`), so it is
worth one long-lived process per orchestrator, started with its workspaces' area.

The helper runs :func:`~.files.copy_listed` on descriptors it is handed (``SCM_RIGHTS``): the
project's pinned directory and the copy's, never a path of its own to resolve, with the same
checks (every path checked, no link followed, the bounds). It runs as the orchestrator does,
with nothing of its environment but ``PATH`` (no token, no key). One copy at a time: a copy
that finds it busy, or still starting, copies all its files itself. The copy's bounds stay the
copy's: each half may take half of its bytes (:meth:`CopyHelper.copy`).

Protocol (a stream socket pair, each message a 4-byte length then JSON): first the helper's
``{"ready": true}`` once its imports are done; then per copy the request ``{"algorithm",
"owner", "files", "bytes", "paths"}`` (paths as latin-1 text: any bytes) with the two
descriptors, and the reply ``{"entries": [null | [mode, oid, ino, size, mtime_ns,
ctime_ns]]}`` in the request's order, or ``{"error": "too_large" | "unsafe" | "os", "detail"}``.

Resource handling: the caller waits for the reply up to the copy's deadline, asking its
``cancelled()`` meanwhile; past either, or on any protocol error, the helper is killed and
waited for (nothing of it writes into the copy after that) and a new one started at once. A
helper that failed leaves its half to the copy's thread, which removes what it made of it
first; a cancelled copy raises as it would alone. :meth:`CopyHelper.close` kills it.
Blocking, in the copy's worker thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .files import (
    Budget,
    Directories,
    Entry,
    Ownership,
    TooLarge,
    UnsafePath,
    check_path,
    copy_listed,
)

# A copy of fewer files than this is not split (the hand-over costs a few milliseconds).
MIN_FILES = 2000
# A helper that failed this many times in a row (it cannot start, say) is not started again:
# copies are then made in one thread, as without it.
MAX_FAILURES = 3
_LENGTH = struct.Struct("!I")
_MAX_MESSAGE = 256 << 20  # a reply of the most files a copy may have is far below this
_POLL_SECONDS = 0.05  # how often a wait for the reply asks whether the copy was cancelled
_CLOSE_WAIT_SECONDS = 5.0
# The helper's program (not ``-m`` this module: its package has imported it already).
_MAIN = (
    f"import socket, sys; from {__name__} import serve; "
    "serve(socket.socket(fileno=int(sys.argv[1])))"
)
_READ_SECONDS = 60.0  # the most reading a reply may take once it began (a copy without deadline)


class HelperFailed(OSError):
    """The helper died, said something it should not have, or took too long."""


class CopyHelper:
    """The orchestrator's copy helper (started at once; again after a failure, at the next
    copy)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._closed = False
        self._ready = False  # (it said so: its imports done)
        self._failures = 0  # in a row; at MAX_FAILURES it is not started again
        with self._lock:
            self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-c", _MAIN, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours

    def copy(
        self,
        source_fd: int,
        paths: list[bytes],
        target_fd: int,
        *,
        algorithm: str,
        budget: Budget,
        owner: Ownership | None,
        deadline: float,
        cancelled: Callable[[], bool],
        copy_here: Callable[[list[bytes], Budget], dict[bytes, Entry]],
    ) -> dict[bytes, Entry]:
        """Copy ``paths`` as :func:`~.files.copy_listed` would — the second half by the
        helper, the first meanwhile by ``copy_here`` (copy_listed in this thread, within the
        budget it is given) — and take their files from ``budget``. All by ``copy_here`` when
        the copy is small, the helper busy, closed or not reachable (it is started again).
        The bound stays the copy's: each half may take half its bytes; should one take more
        (a project near the bound, its large files on one side), the copy is made again by
        ``copy_here`` alone, within all of it. Raises what copy_listed raises, or
        ``InterruptedError`` when cancelled; a helper that fails meanwhile (it is started
        again) leaves its half to ``copy_here``."""
        if (
            len(paths) < MIN_FILES
            or len(paths) > budget.files  # (too large: copy_here says so, at the bound)
            or not self._lock.acquire(blocking=False)
        ):
            return copy_here(paths, budget)
        try:
            if self._closed or not self._is_ready():
                return copy_here(paths, budget)
            half = len(paths) // 2
            theirs = Budget(budget.files, budget.bytes // 2)
            ours = Budget(budget.files, budget.bytes - theirs.bytes)
            try:
                self._send(source_fd, target_fd, paths[half:], algorithm, theirs, owner)
            except HelperFailed:  # (it never had the whole request: it copied nothing)
                return copy_here(paths, budget)
            try:
                entries = copy_here(paths[:half], ours)
                reply = self._receive(deadline, cancelled)
                entries |= _entries(paths[half:], reply)
            except HelperFailed:
                # Its half made here instead, what it made of it removed (it is gone first).
                self._kill(failed=True)
                _remove_listed(target_fd, paths[half:])
                entries |= copy_here(paths[half:], _left(budget, entries))
            except TooLarge:
                # A half over its share: made again here, alone, within the whole budget.
                self._kill(failed=False)
                _remove_listed(target_fd, paths)
                return copy_here(paths, budget)
            except BaseException:
                self._kill(failed=False)  # (before the copy's directory is removed under it)
                raise
            else:
                self._failures = 0
            _take(budget, entries)
            return entries
        finally:
            self._lock.release()

    def wait_ready(self, seconds: float) -> bool:
        """Whether the helper is ready for a copy, waiting up to ``seconds`` for it to say so
        (a copy does not wait: one that finds it still starting is made in one thread)."""
        with self._lock:
            return not self._closed and self._is_ready(seconds)

    def _is_ready(self, seconds: float = 0.0) -> bool:
        """Whether the helper is ready for a copy: started (again, if it failed: then not
        yet), and its greeting read within ``seconds``."""
        if self._socket is None:
            if self._failures < MAX_FAILURES:
                with contextlib.suppress(OSError):
                    self._start()
            return False
        if self._ready:
            return True
        ready, _, _ = select.select([self._socket], [], [], seconds)
        if not ready:
            return False
        try:
            self._socket.settimeout(_READ_SECONDS)
            greeting = receive_message(self._socket)
        except (OSError, ValueError):
            greeting = None
        finally:
            if self._socket is not None:
                self._socket.settimeout(None)
        if greeting != {"ready": True}:
            self._kill()  # (it could not start: tried again, MAX_FAILURES times in a row)
            return False
        self._ready = True
        return True

    def _send(  # noqa: PLR0917
        self,
        source_fd: int,
        target_fd: int,
        paths: list[bytes],
        algorithm: str,
        budget: Budget,
        owner: Ownership | None,
    ) -> None:
        request = {
            "algorithm": algorithm,
            "owner": None if owner is None else [owner.uid, owner.gid],
            "files": budget.files,
            "bytes": budget.bytes,
            "paths": b"\0".join(paths).decode("latin-1"),
        }
        assert self._socket is not None
        try:
            send_message(self._socket, request, fds=[source_fd, target_fd])
        except OSError as exc:
            self._kill()
            raise HelperFailed(f"the copy helper could not be asked: {exc}") from exc

    def _receive(self, deadline: float, cancelled: Callable[[], bool]) -> dict[str, Any]:
        assert self._socket is not None
        while True:
            if cancelled():
                raise InterruptedError("cancelled")
            left = deadline - time.monotonic()
            if left <= 0:
                raise HelperFailed("the copy helper took longer than the copy may")
            ready, _, _ = select.select([self._socket], [], [], min(left, _POLL_SECONDS))
            if ready:
                break
        try:
            self._socket.settimeout(min(max(0.0, deadline - time.monotonic()), _READ_SECONDS))
            reply: dict[str, Any] = receive_message(self._socket)
        except (OSError, ValueError) as exc:
            raise HelperFailed(f"the copy helper failed: {exc}") from exc
        finally:
            self._socket.settimeout(None)
        return reply

    def _kill(self, *, again: bool = True, failed: bool = True) -> None:
        """The helper killed and waited for; ``again``: a new one started at once (ready, its
        imports done, by the next copy), or at the next copy if it cannot be now — unless it
        ``failed`` MAX_FAILURES times in a row (a cancelled copy is not its failure)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._ready = False
        self._failures += failed
        if again and not self._closed and self._failures < MAX_FAILURES:
            with contextlib.suppress(OSError):
                self._start()

    def close(self) -> None:
        """Kill the helper (the orchestrator's end); copies after this copy alone. A copy
        still using it (none should be) is waited for a few seconds, then fails."""
        acquired = self._lock.acquire(timeout=_CLOSE_WAIT_SECONDS)
        try:
            self._closed = True
            self._kill(again=False, failed=False)
        finally:
            if acquired:
                self._lock.release()


def _remove_listed(target_fd: int, paths: list[bytes]) -> None:
    """Remove what of ``paths`` is below ``target_fd`` (a failed helper's half: files and
    links it made; the directories stay, for the copy of the same paths to use again)."""
    with Directories(target_fd) as copy:
        for path in paths:
            parts = check_path(path)
            parent = copy.get(parts)
            if parent is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(parts[-1], dir_fd=parent)


def _left(budget: Budget, spent: dict[bytes, Entry]) -> Budget:
    """What ``budget`` leaves once ``spent``'s files are taken from it."""
    left = Budget(budget.files, budget.bytes)
    _take(left, spent)
    return left


def _take(budget: Budget, entries: dict[bytes, Entry]) -> None:
    """Take ``entries``' files from ``budget`` (each its size: a link's, its text's length)."""
    for entry in entries.values():
        budget.take(entry.stamp[1] if entry.stamp is not None else 0)


def _entries(paths: list[bytes], reply: dict[str, Any]) -> dict[bytes, Entry]:
    """The helper's half's entries (TooLarge: it found its half over its share)."""
    error = reply.get("error")
    if error == "too_large":
        raise TooLarge(reply.get("detail", "bytes"))
    if error == "unsafe":
        raise UnsafePath(str(reply.get("detail", "")).encode("latin-1"))
    if error is not None:
        raise OSError(f"the copy helper: {reply.get('detail', error)}")
    listed = reply.get("entries")
    if not isinstance(listed, list) or len(listed) != len(paths):
        raise HelperFailed("the copy helper's reply does not match its request")
    entries: dict[bytes, Entry] = {}
    for path, found in zip(paths, listed, strict=True):
        if found is None:
            continue
        mode, oid, *stamp = found
        ino, size, mtime_ns, ctime_ns = (int(value) for value in stamp)
        entries[path] = Entry(int(mode), str(oid), (ino, size, mtime_ns, ctime_ns))
    return entries


# --- the messages ---------------------------------------------------------------------------


def send_message(sock: socket.socket, message: dict[str, Any], *, fds: Sequence[int] = ()) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    header = _LENGTH.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(data)


def receive_message(sock: socket.socket, *, fds: int = 0) -> Any:
    """One message (and, with ``fds``, that many descriptors sent with its header)."""
    received: list[int] = []
    if fds:
        header, received, _flags, _address = socket.recv_fds(sock, _LENGTH.size, fds)
    else:
        header = sock.recv(_LENGTH.size, socket.MSG_WAITALL)
    try:
        message = json.loads(_body(sock, header))
    except BaseException:
        for fd in received:
            os.close(fd)
        raise
    return (message, received) if fds else message


def _body(sock: socket.socket, header: bytes) -> bytes:
    """The message whose length ``header`` gives (ValueError: closed, or too long)."""
    if len(header) != _LENGTH.size:
        raise ValueError("the other end closed")
    (length,) = _LENGTH.unpack(header)
    if length > _MAX_MESSAGE:
        raise ValueError(f"a message of {length} bytes")
    data = bytearray()
    while len(data) < length:
        chunk = sock.recv(min(length - len(data), 1 << 20))
        if not chunk:
            raise ValueError("the other end closed mid-message")
        data += chunk
    return bytes(data)


# --- the helper's side ----------------------------------------------------------------------


def serve(sock: socket.socket) -> None:
    """Say it is ready, then copy what is asked, one request after the other, until the
    orchestrator closes its end (or kills this process)."""
    send_message(sock, {"ready": True})
    while True:
        try:
            request, fds = receive_message(sock, fds=2)
        except ValueError:
            return  # (closed: the orchestrator's end)
        try:
            send_message(sock, _copy(request, fds))
        finally:
            for fd in fds:
                os.close(fd)


def _copy(request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    if len(fds) != 2:
        return {"error": "os", "detail": "the two directories were not sent"}
    source_fd, target_fd = fds
    owner = request["owner"]
    paths = request["paths"].encode("latin-1").split(b"\0") if request["paths"] else []
    try:
        entries = copy_listed(
            source_fd,
            paths,
            target_fd,
            algorithm=request["algorithm"],
            budget=Budget(request["files"], request["bytes"]),
            owner=None if owner is None else Ownership(*owner),
            cancelled=lambda: False,  # (a cancelled copy kills this process)
        )
    except TooLarge as exc:
        return {"error": "too_large", "detail": str(exc)}
    except UnsafePath as exc:
        return {"error": "unsafe", "detail": bytes(exc.args[0]).decode("latin-1")}
    except OSError as exc:
        return {"error": "os", "detail": str(exc)}
    return {"entries": [_listed(entries.get(path)) for path in paths]}


def _listed(entry: Entry | None) -> list[Any] | None:
    if entry is None or entry.stamp is None:
        return None
    return [entry.mode, entry.oid, *entry.stamp]
