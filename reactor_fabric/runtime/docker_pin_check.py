"""The check, from the host, that a started container's pinned mounts are the pinned objects.

A pinned mount (:mod:`reactor_fabric.policy.pinning`) is bound from a descriptor; once the
container runs, each pinned target, seen through ``/proc/PID/root`` of the container's first
process, must be the very object pinned (device and inode, read-only where it must be:
:meth:`~reactor_fabric.policy.pinning.Pin.refusal`) before any client message reaches it.

Needs the orchestrator and the engine in one PID namespace, and the right to look into that
process (root, or the container's own uid). Under gVisor the engine's "first process" is the
sandbox (``runsc-sandbox``, chrooted to an empty directory), and the container's files are
served to it by its gofer (``runsc-gofer``, root, a child of the same parent, the engine's
shim): its root is the container's view of the host's files, and that is where the targets are
looked at (:func:`files_process`). It blocks (the engine's inspect, ``stat``): the
Docker runtime runs it in a worker thread, as any engine call (:mod:`.docker_calls`).

Error handling: a mismatch (another object, or writable where it must not be) is
SecurityViolation (``mount_changed``), final; a target that cannot be looked at is
SecurityViolation (``mount_unverifiable``), after permission refused was retried for up to a
second (:data:`VERIFY_ATTEMPTS`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .._errors import SecurityViolation
from .._reasons import MOUNT_UNVERIFIABLE
from ..policy.pinning import Pin, PinSet
from .docker_operations import inspect_container
from .engine_api import EngineClient

# A container's first process is briefly not inspectable by its own uid: between the runtime's
# switch to that user and its exec, the kernel marks it non-dumpable (EACCES on /proc/PID/root).
# On a loaded machine that window is wide enough to hit; the check is retried through it.
VERIFY_ATTEMPTS = 20
VERIFY_RETRY_SECONDS = 0.05


def verify_mounts(
    client: EngineClient,
    container_id: str,
    pins: PinSet,
    *,
    stat: Callable[[str], os.stat_result] = os.stat,
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Check, from the host, that each pinned target in the container is the pinned object.

    Looks through ``/proc/PID/root`` of the container's first process; otherwise the container
    is refused as unverifiable. Permission refused is retried for up to a second (see
    :data:`VERIFY_ATTEMPTS`): never a mismatch, which is final. A container that already
    stopped is not checked: no client message can reach it, and its exit is reported as any
    other.
    """
    for attempt in range(VERIFY_ATTEMPTS):
        state: dict[str, Any] = inspect_container(client, container_id)["State"]
        pid = int(state.get("Pid") or 0)
        if not state.get("Running") or pid <= 0:
            return
        try:
            _verify_pins(files_process(pid), pins, stat, statvfs)
        except _NotInspectableYet as not_yet:
            if attempt + 1 == VERIFY_ATTEMPTS:
                raise _unverifiable(not_yet.pin, not_yet.error) from not_yet.error
            sleep(VERIFY_RETRY_SECONDS)
        else:
            return


SANDBOX = "runsc-sandbox"
GOFER = "runsc-gofer"


def files_process(pid: int, proc: str = "/proc") -> int:
    """The process whose root shows the container's mounts: ``pid`` itself, or, when ``pid`` is
    a gVisor sandbox, its gofer — the one root process named ``runsc-gofer`` among the children
    of the sandbox's parent (a process another user starts cannot be one). A sandbox whose
    gofer is not found is answered with its own pid (its root has no targets: unverifiable)."""
    if _argv0(proc, pid) != SANDBOX:
        return pid
    parent = _parent(proc, pid)
    gofers = []
    for entry in os.listdir(proc):
        if entry.isdigit() and int(entry) != pid:
            candidate = int(entry)
            if (
                _parent(proc, candidate) == parent
                and _argv0(proc, candidate) == GOFER
                and _uid(proc, candidate) == 0
            ):
                gofers.append(candidate)
    return gofers[0] if len(gofers) == 1 else pid


def _argv0(proc: str, pid: int) -> str:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read(256).split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        return ""


def _parent(proc: str, pid: int) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as stat_file:
            # pid (comm) state ppid …; comm may hold spaces and parentheses: after the last ')'.
            return int(stat_file.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _uid(proc: str, pid: int) -> int | None:
    try:
        return os.stat(f"{proc}/{pid}").st_uid
    except OSError:
        return None


class _NotInspectableYet(Exception):
    def __init__(self, pin: Pin, error: OSError) -> None:
        super().__init__(str(error))
        self.pin = pin
        self.error = error


def _verify_pins(
    pid: int,
    pins: PinSet,
    stat: Callable[[str], os.stat_result],
    statvfs: Callable[[str], os.statvfs_result],
) -> None:
    """Raises _NotInspectableYet (permission refused: retry) or SecurityViolation."""
    for pin in pins.pins:
        path = f"/proc/{pid}/root{pin.target}"
        try:
            found = stat(path)
            writable = pin.read_only and not statvfs(path).f_flag & os.ST_RDONLY
        except PermissionError as exc:
            raise _NotInspectableYet(pin, exc) from exc
        except OSError as exc:
            raise _unverifiable(pin, exc) from exc
        refused = pin.refusal(found, writable=writable)
        if refused is not None:
            raise refused


def _unverifiable(pin: Pin, exc: OSError) -> SecurityViolation:
    return SecurityViolation(
        f"the mount at {pin.target!r} could not be checked ({exc.strerror}); "
        "the orchestrator must share the engine's PID namespace and may need to run as "
        "the container's user",
        reason=MOUNT_UNVERIFIABLE,
        path=pin.path,
        target=pin.target,
    )
