"""Isolated tasks' copies on the trio side: begun when an isolated call's container starts,
filled while the container is made, recorded as a branch and removed when it is removed
(``workspace: isolated``; the copies themselves: :mod:`reactor_fabric.workspace`).

Layout::

    /dev/shm/reactor-fabric/workspaces/   root's, 0700 (see default_parent; orchestrator.
    └── <instance>/                       workspaces.directory): no other user reaches a copy
        ├── owner.json                    which orchestrator's (an area whose orchestrator died
        ├── <container name>/             is removed by the next one to start)
        │                                 one task's copy, the container account's, 0700
        └── spare-<n>/                    a session's spare copy (no container has it)

Memory-backed by default where the machine has a tmpfs /dev/shm (on a virtual machine's disk
10,000 small files take seconds, in memory a few hundred milliseconds); a copy takes memory up
to ``orchestrator.workspaces.max_size`` while its task runs, and ``orchestrator.workspaces.
directory`` puts the copies on a disk instead.

The start does not wait for the copy before the container is made: :meth:`TaskWorkspaces.make`
checks what it can at once (a repository, a base that exists), makes the copy's directory and
pins it in the project's place, and fills it in a thread of its own
(:class:`~.background_thread.BackgroundThread`) while the engine creates — and, with socket
stdio, starts — the container; :meth:`TaskCopy.filled` is the container's gate
(:data:`~reactor_fabric.runtime.base.Gate`): its server runs once the copy is whole. So a task
waits for its copy only as long as the copy takes beyond the container's own start.

A task from the working tree starts on a spare copy where there is one (:mod:`.spares`: its
session's, begun ahead, or one an earlier session on the project left): moved to the task's
name and brought up to date instead of the whole project copied.

Resource handling: a copy handed out with its container's start is the caller's: if the start
is cancelled or fails, :meth:`TaskWorkspaces.discard` stops the filling, waits for its thread
(shielded, bounded by the copy's own deadline) and removes the copy before the error goes up.
:meth:`TaskWorkspaces.finish` runs at the container's removal, shielded and bounded on its own
(a shutdown waits for the task's work to be recorded rather than lose it), records, audits and
removes the copy, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from .._errors import FabricError, WorkspaceRefused
from .._reasons import WORKSPACE_FAILED
from ..config.structs import Workspaces
from ..observe.observer import Observer
from ..policy.mount_spec import MountSpec
from ..policy.owner import hostname, owner_is_gone, read_owner_file
from ..policy.pinning import Pin, PinSet, pin_mounts
from ..workspace import (
    Begun,
    Bounds,
    Recorded,
    TaskFacts,
    Workspace,
    begin,
    branch_name,
    fill,
    record,
    settle,
)
from ..workspace import remove as remove_copy
from ..workspace.helper import CopyHelper
from ..workspace.spare import refresh
from .background_thread import STOP_MARGIN_SECONDS, BackgroundThread
from .spares import SpareRecipe, Spares

log = logging.getLogger(__name__)

T = TypeVar("T")

ROOT_PARENT = "/var/lib/reactor-fabric/workspaces"
# Memory-backed, where the machine has it: copying 10,000 small files into a tmpfs takes a
# tenth of what it takes on a virtual machine's disk (scripts/bench-workspace.py; there is no
# copy-on-write on ext4), and a copy lives only while its task runs.
MEMORY_PARENT = "/dev/shm/reactor-fabric/workspaces"  # noqa: S108 (checked: own_directory)
_OWNER_FILE = "owner.json"
# The most a task's recording may take at its container's removal, beyond which the copy is
# removed unrecorded (the answer says so); each git step is bounded by Bounds.step_seconds.
RECORD_SECONDS = 300.0


def default_parent(environ: dict[str, str] | None = None) -> str:
    """Where the areas live when the suite does not say (``orchestrator.workspaces.
    directory``): root's, in memory (/dev/shm, when it is a tmpfs) or under /var/lib; else the
    user's state directory."""
    if os.geteuid() == 0:
        return MEMORY_PARENT if _is_tmpfs("/dev/shm") else ROOT_PARENT  # noqa: S108
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return posixpath.join(state, "reactor-fabric", "workspaces")


def _is_tmpfs(path: str) -> bool:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            return any(line.split()[1] == path and line.split()[2] == "tmpfs" for line in mounts)
    except OSError:
        return False


class WorkspaceArea:
    """This orchestrator's directory of copies (blocking: call from a worker thread)."""

    def __init__(self, root: str) -> None:
        self.root = root

    @classmethod
    def open(
        cls, instance_id: str, *, owner: dict[str, str], this_host: str, parent: str
    ) -> WorkspaceArea:
        """Make this orchestrator's area, removing those of orchestrators on this host that
        are gone (their copies are what a crash left)."""
        own_directory(parent)
        remove_stale_areas(parent, this_host=this_host)
        root = posixpath.join(parent, instance_id)
        os.mkdir(root, 0o700)
        with open(posixpath.join(root, _OWNER_FILE), "x", encoding="utf-8") as file:
            json.dump(owner, file)
        return cls(root)

    def directory(self, name: str) -> str:
        """Where a copy named ``name`` (a container's name: ours, no separators) is made."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a copy's name: {name!r}")
        return posixpath.join(self.root, name)

    def close(self) -> None:
        """Remove the area and whatever copy is left in it."""
        shutil.rmtree(self.root, ignore_errors=True)


def own_directory(path: str) -> None:
    """Make ``path`` (absolute) a directory of this user's that no one else can enter: every
    component that is missing is made 0700; the last must then be a real directory (no link),
    this user's, with no access for group or others — else OSError. Why so strict: the default
    parent is under /dev/shm, which every local user may write: one who made
    ``/dev/shm/reactor-fabric`` first (or a link there) would otherwise own the copies."""
    if not posixpath.isabs(path):
        raise OSError(f"the workspaces' directory must be an absolute path: {path!r}")
    me = os.geteuid()
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = posixpath.join(current, part)
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, 0o700)
        # Each step: a real directory of root's or ours, which others may not rename things
        # in (not writable by them, or sticky as /dev/shm and /tmp are).
        found = os.lstat(current)
        shared = found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX
        if not stat.S_ISDIR(found.st_mode) or found.st_uid not in (0, me) or shared:
            raise OSError(f"{current} is not a directory only root or this user controls")
    found = os.lstat(path)
    if found.st_uid != me:
        raise OSError(f"{path} is not this orchestrator's user's")
    if found.st_mode & 0o077:
        os.chmod(path, 0o700, follow_symlinks=False)  # ours: closed to everyone else


def remove_stale_areas(parent: str, *, this_host: str) -> int:
    """Remove the areas of orchestrators on this host that are gone; how many."""
    removed = 0
    for name in os.listdir(parent):
        root = posixpath.join(parent, name)
        owner = read_owner_file(posixpath.join(root, _OWNER_FILE))
        if owner is None or not owner_is_gone(owner, this_host=this_host):
            continue  # not an area, one being made, or a live orchestrator's
        shutil.rmtree(root, ignore_errors=True)
        removed += 1
        log.info("workspace_area_removed", extra={"directory": root})
    return removed


async def run_interruptible(work: Callable[[Callable[[], bool]], T]) -> T:
    """``work(cancelled)`` in a worker thread, waited for even when cancelled: ``cancelled()``
    says whether this task was cancelled meanwhile (:func:`trio.from_thread.check_cancelled`),
    and the work, polling it, cleans up what it made and raises ``InterruptedError``, upon
    which the cancellation goes on. A result that came as the cancellation did is returned:
    the caller owns it, and its next checkpoint raises the Cancelled."""
    try:
        return await trio.to_thread.run_sync(work, _cancelled)
    except InterruptedError:
        await trio.lowlevel.checkpoint()  # (the cancellation that interrupted it)
        raise


def _cancelled() -> bool:
    try:
        trio.from_thread.check_cancelled()
    except trio.Cancelled:
        return True
    return False


@dataclass
class TaskCopy:
    """One task's copy while its container starts and runs: what :meth:`TaskWorkspaces.
    finish` records."""

    begun: Begun
    filling: BackgroundThread[Workspace]
    facts: TaskFacts
    branch: str
    session: str
    call: Any  # the call's id (str | int | None)
    # What the session's next task from the working tree may start on: a spare copy of this
    # one's project, made once its container started (None: this task has a base).
    next_spare: SpareRecipe | None = None
    spared: bool = False  # it was made from a spare
    workspace: Workspace | None = None  # once filled
    # What the start did not wait for (the base's tree, the held blobs: workspace.settle),
    # done once the copy is complete, beside the server's start; None before.
    settling: BackgroundThread[None] | None = None

    async def filled(self) -> None:
        """Once the copy is complete (the gate of the task's container: its server runs only
        then); raises why it could not be made (WorkspaceRefused, or InterruptedError when it
        was stopped). Then its settling begins."""
        try:
            workspace = self.workspace = await self.filling.result()
        except InterruptedError:
            raise
        except OSError as exc:
            raise WorkspaceRefused(
                f"the copy of the project could not be made: {exc.strerror or exc}",
                reason=WORKSPACE_FAILED,
            ) from exc
        if self.settling is None:
            bounds = self.begun.bounds
            self.settling = BackgroundThread(
                lambda stopped: settle(workspace, bounds=bounds, cancelled=stopped),
                name=f"reactor-fabric workspace settle {self.branch}",
            )


class TaskWorkspaces:
    """Copies for the isolated calls' containers of one orchestrator."""

    def __init__(
        self,
        area: WorkspaceArea,
        bounds: Workspaces,
        observer: Observer,
        *,
        helper: CopyHelper | None = None,
    ) -> None:
        self.area = area
        # Copies half of a large whole copy on the other core (None: each copy is one thread's).
        self.helper = helper
        self.bounds = Bounds(max_files=bounds.max_files, max_bytes=bounds.max_size_bytes)
        self._observer = observer
        self.spares = Spares(area.directory, bounds)

    async def make(
        self,
        name: str,
        pins: PinSet,
        mounts: tuple[MountSpec, ...],
        *,
        base: str | None,
        facts: TaskFacts,
        call: Any,
        account: tuple[int, int],
    ) -> tuple[PinSet, tuple[MountSpec, ...], TaskCopy]:
        """The copy of the session's one writable mount, for the container ``name``, its files
        ``account``'s (uid, gid: whom the container runs as): the pins and mounts to start it
        with (the copy in the project's place, pinned) and the copy — its directory made and
        pinned, its files still being filled in (:meth:`TaskCopy.filled`, the container's
        gate). ``pins`` are consumed (closed on failure, or handed over in the result)."""
        try:
            project = _the_writable_mount(mounts)
            pin = pins.for_target(project.target)
            assert pin is not None, project  # every mount is pinned
            project_fd = os.dup(pin.fd)
        except BaseException:
            pins.close()
            raise
        directory = self.area.directory(name)
        recipe = SpareRecipe(facts.session, account, (pin.device, pin.inode), pin.owner)
        spare = self.spares.take(recipe) if base is None else None

        def work() -> tuple[Begun, Pin]:
            # Short (a git process or two, or a rename): not interrupted, waited for if
            # cancelled.
            try:
                begun = begin(
                    project_fd, pin.owner, directory, base=base, bounds=self.bounds,
                    copy_owner=account, spare=spare.directory if spare is not None else None,
                )  # fmt: skip
            except BaseException:
                if spare is not None:
                    remove_copy(spare.directory)  # (when it was not moved)
                raise
            try:
                copied = MountSpec(directory, project.target, check_in_image=project.check_in_image)
                [copy_pin] = pin_mounts([copied]).pins
            except BaseException:
                remove_copy(directory)
                raise
            return begun, copy_pin

        try:
            begun, copy_pin = await trio.to_thread.run_sync(work)
        except BaseException:
            os.close(project_fd)
            pins.close()
            if spare is not None:  # (cancelled before its thread ran: the spare is still there)
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(remove_copy, spare.directory)
            raise
        # The project's own pin is the workspace's descriptor now (dup'd); the container
        # gets the copy at the project's target, the other mounts as they were.
        handed = PinSet([*(p for p in pins.pins if p.target != project.target), copy_pin])
        os.close(pin.fd)  # (the dup is the workspace's)
        replaced = tuple(
            MountSpec(directory, m.target, check_in_image=m.check_in_image) if m is project else m
            for m in mounts
        )
        branch = branch_name(facts.service, time.time(), _short_id())
        filling = BackgroundThread(
            (lambda stopped: fill(begun, stopped, helper=self.helper))
            if spare is None
            else (lambda stopped: refresh(begun, spare, stopped)),
            name=f"reactor-fabric workspace {name}",
        )
        copy = TaskCopy(begun, filling, facts, branch, facts.session, call)
        copy.next_spare = recipe if base is None else None
        copy.spared = spare is not None
        return handed, replaced, copy

    def make_spare_after(self, task: TaskCopy) -> None:
        """Begin the spare copy ``task``'s session's next task from the working tree will take
        (unless one is made or being made): called once the task's container started, so that
        its copy and the spare do not share the two cores."""
        if task.next_spare is not None:
            self.spares.begin(task.next_spare, task.begun.project_fd)

    async def finish(self, task: TaskCopy) -> tuple[dict[str, Any] | None, str | None]:
        """Record what the task changed (its container is gone), audit it, remove the copy:
        ``structuredContent.workspace``, or None and why nothing was recorded. Shielded and
        bounded (RECORD_SECONDS); never raises but Cancelled of an outer scope after it."""
        recorded: Recorded | None = None
        failure: str | None = "the copy was never complete"
        workspace = task.workspace
        with trio.CancelScope(shield=True):
            with trio.move_on_after(RECORD_SECONDS) as bounded:
                try:
                    if task.settling is not None:
                        # (its error, if any, is the recording's: record settles what is left)
                        await task.settling.wait()
                    if workspace is not None:
                        recorded = await run_interruptible(
                            lambda cancelled: record(
                                workspace,
                                task.facts,
                                task.branch,
                                bounds=self.bounds,
                                cancelled=cancelled,
                            )
                        )
                except FabricError as exc:
                    failure = str(exc)
                except OSError as exc:
                    failure = f"the copy could not be read: {exc.strerror or exc}"
            if bounded.cancelled_caught:
                failure = f"recording took longer than {RECORD_SECONDS:g} s"
            await self._remove(task)
        self._observer.workspace(
            session=task.session,
            service=task.facts.service,
            call=task.call,
            recorded=recorded,
            failure=failure if recorded is None else None,
        )
        fields = {"session": task.session, "service": task.facts.service}
        if recorded is None:
            log.warning("workspace_not_recorded", extra={**fields, "detail": failure})
            return None, failure
        log.info(
            "workspace_recorded",
            extra={**fields, "branch": recorded.branch, "commit": recorded.commit},
        )
        return summary(recorded), None

    async def discard(self, task: TaskCopy) -> None:
        """Its container never started: the copy goes, unrecorded (shielded)."""
        with trio.CancelScope(shield=True):
            await self._remove(task)

    async def _remove(self, task: TaskCopy) -> None:
        """Stop the filling and the settling if they still run, then close the project's
        descriptor and remove the copy. Each stops within files or steps (or at its git step's
        deadline, which bounds the wait); should one outlive that, the descriptor is left open
        rather than closed under it (its number could be reused for another repository while
        it writes)."""
        bound = self.bounds.step_seconds + STOP_MARGIN_SECONDS
        for work in (task.filling, task.settling):
            if work is not None and not await work.stop(bound):
                log.error("workspace_fill_stuck", extra={"directory": task.begun.directory})
                return
        with contextlib.suppress(OSError):
            os.close(task.begun.project_fd)
        await trio.to_thread.run_sync(remove_copy, task.begun.directory)


async def open_workspaces(
    instance_id: str,
    owner: dict[str, str],
    bounds: Workspaces,
    observer: Observer,
    *,
    parent: str | None = None,
) -> TaskWorkspaces | None:
    """This orchestrator's copies, in an area of its own under ``parent`` (default:
    :func:`default_parent`; those of orchestrators that died removed); None, logged, when the
    area cannot be made (isolated calls are then refused with ``workspace_failed``)."""
    parent = parent or bounds.directory or default_parent()
    try:
        area = await trio.to_thread.run_sync(
            lambda: WorkspaceArea.open(
                instance_id, owner=owner, this_host=hostname(), parent=parent
            )
        )
    except OSError as exc:
        log.error("workspaces_unavailable", extra={"directory": parent, "detail": str(exc)})
        return None
    try:
        helper = await trio.to_thread.run_sync(CopyHelper)
    except OSError as exc:  # (copies are made all in one thread)
        log.warning("workspace_copy_helper_not_started", extra={"detail": str(exc)})
        helper = None
    log.info("workspaces", extra={"directory": area.root})
    return TaskWorkspaces(area, bounds, observer, helper=helper)


async def close_workspaces(workspaces: TaskWorkspaces) -> None:
    """Remove the area (shielded): every container is gone, so is every task's copy; the
    spares' threads are stopped first."""
    with trio.CancelScope(shield=True):
        await workspaces.spares.close()
        if workspaces.helper is not None:
            await trio.to_thread.run_sync(workspaces.helper.close)
        await trio.to_thread.run_sync(workspaces.area.close)


def summary(recorded: Recorded) -> dict[str, Any]:
    """``structuredContent.workspace`` of a recorded task."""
    return {
        "mode": "isolated",
        "branch": recorded.branch,
        "base": recorded.base,
        "commit": recorded.commit,
        "files_changed": recorded.files_changed,
        "insertions": recorded.insertions,
        "deletions": recorded.deletions,
    }


def _the_writable_mount(mounts: Sequence[MountSpec]) -> MountSpec:
    writable = [m for m in mounts if not m.read_only and not m.git_guard]
    if len(writable) != 1:
        raise WorkspaceRefused(
            "an isolated task works on a copy of one writable mount, and this session has "
            f"{len(writable)}; give the session one writable project (others read-only), or "
            "use workspace: shared",
            reason=WORKSPACE_FAILED,
        )
    return writable[0]


def _short_id() -> str:
    return secrets.token_hex(4)
