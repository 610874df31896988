"""An isolated task's copy of the project, made in two steps so that its container can start
meanwhile (see :mod:`reactor_fabric.trio.workspaces`).

:func:`begin` checks what can be checked at once (a repository, a ``base`` that names a
commit) and makes the copy's directory, empty (it can be pinned and mounted from then on).
:func:`fill` reads what goes into the copy — the client's working tree as the client has it
(tracked files with their uncommitted changes, untracked files that are not ignored; ignored
files and nested repositories are left out), or the tree of the ``base`` — writes the files
into it, and the working tree's uncommitted blobs into the repository (before the task can
change them, as ``git stash create`` writes its objects: unreachable until a branch holds
them). :func:`prepare` is both at once. The copy has no
``.git``: the task never reaches the client's hooks, config, refs or objects.

Blocking, in a worker thread; ``cancelled`` is polled between files. Each step cleans up what
it made when it fails: the directory is removed before the error goes up (:func:`fill`'s too).

Errors: :class:`~reactor_fabric.WorkspaceRefused` with ``workspace_not_a_repository``,
``workspace_base_unknown``, ``workspace_too_large`` or ``workspace_failed``;
``InterruptedError`` when cancelled.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

from .._errors import WorkspaceRefused
from .._reasons import WORKSPACE_BASE_UNKNOWN, WORKSPACE_TOO_LARGE
from .files import (
    CHUNK,
    MODE_GITLINK,
    Budget,
    Directories,
    Entry,
    Ownership,
    SourceStamp,
    TooLarge,
    UnsafePath,
    check_path,
    copy_listed,
    write_file,
)
from .git import Git, RepositoryOwner
from .helper import CopyHelper
from .naming import valid_base
from .task import (
    LS_FILES_OID,
    Bounds,
    Cancelled,
    Workspace,
    commit_of,
    fast_import,
    file_data,
    framed,
    listed,
    object_format,
    refused,
    remove,
    run_git,
    tree_entries,
)


@dataclass
class Begun:
    """A copy begun: its directory made, empty, and where :func:`fill` takes its files from."""

    directory: str
    project_fd: int = field(repr=False)
    owner: RepositoryOwner
    algorithm: str
    # The commit a client's base names (resolved: it exists); None: the working tree.
    base: str | None
    copy_owner: Ownership | None
    bounds: Bounds
    deadline: float

    def git(self) -> Git:
        return Git(self.project_fd, self.owner)

    def budget(self) -> Budget:
        return Budget(self.bounds.max_files, self.bounds.max_bytes)


def prepare(
    project_fd: int,
    owner: tuple[int, int],
    directory: str,
    *,
    base: str | None,
    bounds: Bounds,
    cancelled: Cancelled,
    copy_owner: tuple[int, int] | None = None,
) -> Workspace:
    """:func:`begin` and :func:`fill` at once."""
    begun = begin(project_fd, owner, directory, base=base, bounds=bounds, copy_owner=copy_owner)
    return fill(begun, cancelled)


def begin(
    project_fd: int,
    owner: tuple[int, int],
    directory: str,
    *,
    base: str | None,
    bounds: Bounds,
    copy_owner: tuple[int, int] | None = None,
    spare: str | None = None,
) -> Begun:
    """Check that a copy can be made of the project held by ``project_fd`` (a pin's
    descriptor), owned by ``owner`` (uid, gid) — a repository with its ``.git`` at its top;
    ``base``, when given, a commit of it — and make the copy's directory at ``directory``
    (new, empty; ``copy_owner``'s: the account the task's container runs as, default
    ``owner``). Quick (two git processes at most): what is refused here is refused before
    any container is made. Both steps share one deadline (``bounds.step_seconds`` from now).
    ``spare``: the directory of a spare copy made for the same project and ``copy_owner``
    (:mod:`.spare`), moved to ``directory`` instead of an empty one made."""
    if spare is not None and base is not None:
        raise ValueError("a spare copy is of the working tree, not of a base")
    repository_owner = RepositoryOwner.of(*owner)
    git = Git(project_fd, repository_owner)
    deadline = time.monotonic() + bounds.step_seconds
    algorithm = object_format(git, deadline)
    base_commit = None
    if base is not None:
        if not valid_base(base):
            raise WorkspaceRefused(
                f"base {base!r} is not a branch, tag or commit name (letters, digits, '._/-')",
                reason=WORKSPACE_BASE_UNKNOWN,
            )
        base_commit = commit_of(git, base, deadline, required=True)
    ids = Ownership(*(copy_owner or owner)) if os.geteuid() == 0 else None
    if spare is not None:
        os.rename(spare, directory)  # (in one area: root's, entered by no one else)
        return Begun(
            directory, project_fd, repository_owner, algorithm, None, ids, bounds, deadline
        )
    os.mkdir(directory, 0o700)
    try:
        if ids is not None:
            os.chown(directory, ids.uid, ids.gid)
    except BaseException:
        remove(directory)
        raise
    return Begun(
        directory=directory,
        project_fd=project_fd,
        owner=repository_owner,
        algorithm=algorithm,
        base=base_commit,
        copy_owner=ids,
        bounds=bounds,
        deadline=deadline,
    )


def fill(begun: Begun, cancelled: Cancelled, *, helper: CopyHelper | None = None) -> Workspace:
    """Read what goes into the copy — the working tree as the client has it now, or the
    base's tree — and write it into its directory (whatever the task's container does there
    meanwhile: nothing, it waits for this); the workspace the task works on. ``helper``
    copies half of a large working tree beside this thread (:mod:`.helper`). On failure or
    when ``cancelled()``, the directory is removed before the error goes up."""
    try:
        listings = read_listings(begun)
        with opened_target(begun) as target_fd:
            making = Making(target_fd, begun.budget(), begun.copy_owner, begun.deadline, cancelled)
            if listings.working_tree is not None:
                paths, gitlinks = wanted(*listings.working_tree)
                copied = copy_paths(paths, begun.project_fd, begun.algorithm, making, helper=helper)
                start = copied | gitlinks
            else:
                start = _check_out(begun.git(), listings.base_entries, making)
        return finished(begun, listings, start)
    except BaseException:
        remove(begun.directory)
        raise


@dataclass(frozen=True)
class Listings:
    """What git says goes into a copy: the working tree's two listings (``ls-files --stage``
    and ``ls-files --others --exclude-standard``; None when the copy is the base's tree), the
    commit it starts from (None in a repository without one) and that commit's tree."""

    working_tree: tuple[bytes, bytes] | None
    base: str | None
    base_entries: dict[bytes, Entry]


def read_listings(begun: Begun, *, known: Listings | None = None) -> Listings:
    """The listings of :class:`Listings`; the base's tree is ``known``'s when its base is the
    same commit (a tree is read once: a commit's tree never changes)."""
    git, deadline = begun.git(), begun.deadline
    with ThreadPoolExecutor(2, thread_name_prefix="workspace-git") as listings:
        # The working tree's listings (two git processes) while the base is read here: they
        # are independent, and the machines have two cores. (Leaving the block waits for
        # them; each git process is killed at the deadline.)
        pending = (
            None
            if begun.base is not None
            else (
                listings.submit(run_git, git, ["ls-files", "-z", "--stage"], deadline),
                listings.submit(
                    run_git, git, ["ls-files", "-z", "--others", "--exclude-standard"], deadline
                ),
            )
        )
        base = begun.base or commit_of(git, "HEAD", deadline, required=False)
        if known is not None and known.base == base:
            base_entries = known.base_entries
        else:
            base_entries = tree_entries(git, base, deadline) if base else {}
        working_tree = None if pending is None else (pending[0].result(), pending[1].result())
    return Listings(working_tree, base, base_entries)


@contextlib.contextmanager
def opened_target(begun: Begun) -> Iterator[int]:
    """The copy's directory, by descriptor (never through a link)."""
    target_fd = os.open(begun.directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        yield target_fd
    finally:
        os.close(target_fd)


def finished(begun: Begun, listings: Listings, start: dict[bytes, Entry]) -> Workspace:
    """The workspace whose copy holds ``start``; the working tree's uncommitted blobs written
    into the repository (before the task can change them: for the working tree's commit)."""
    workspace = Workspace(
        directory=begun.directory,
        project_fd=begun.project_fd,
        owner=begun.owner,
        algorithm=begun.algorithm,
        base=listings.base,
        base_entries=listings.base_entries,
        start=start,
    )
    if not workspace.start_is_base:
        _write_blobs(workspace, _new_blobs(start, listings.base_entries), begun.deadline)
    return workspace


def _new_blobs(start: dict[bytes, Entry], base: dict[bytes, Entry]) -> list[bytes]:
    known = {entry.oid for entry in base.values()}
    return [
        path
        for path, entry in start.items()
        if entry.mode != MODE_GITLINK and entry.oid not in known
    ]


# --- making the copy -------------------------------------------------------------------------


@dataclass(frozen=True)
class Making:
    """A copy being made: where to, within what, owned by whom, until when."""

    target_fd: int
    budget: Budget
    owner: Ownership | None
    deadline: float
    cancelled: Cancelled


def wanted(staged: bytes, untracked: bytes) -> tuple[dict[bytes, None], dict[bytes, Entry]]:
    """The working tree's paths to copy, in git's order, and its submodules' entries (never
    copied), from its two listings."""
    gitlinks: dict[bytes, Entry] = {}
    paths: dict[bytes, None] = {}
    for mode, oid, path in listed(staged, LS_FILES_OID):
        if mode == MODE_GITLINK:
            gitlinks[path] = Entry(MODE_GITLINK, oid)
        else:
            paths[path] = None  # an unmerged path is listed once per stage: copied once
    for path in untracked.split(b"\0"):
        if path and not path.endswith(b"/"):  # a nested repository: not copied
            paths[path] = None
    return paths, gitlinks


def copy_paths(
    paths: Iterable[bytes],
    project_fd: int,
    algorithm: str,
    making: Making,
    sources: dict[bytes, SourceStamp] | None = None,
    *,
    helper: CopyHelper | None = None,
) -> dict[bytes, Entry]:
    """Copy ``paths`` of the working tree (:func:`~.files.copy_listed`; half of them by
    ``helper``, when given and the copy is large), its errors told as the task's."""

    def copy_here(listed: Iterable[bytes], budget: Budget = making.budget) -> dict[bytes, Entry]:
        return copy_listed(
            project_fd,
            listed,
            making.target_fd,
            algorithm=algorithm,
            budget=budget,
            owner=making.owner,
            cancelled=making.cancelled,
            stamps=sources,
        )

    try:
        if helper is None:
            return copy_here(paths)
        return helper.copy(
            project_fd,
            list(paths),
            making.target_fd,
            algorithm=algorithm,
            budget=making.budget,
            owner=making.owner,
            deadline=making.deadline,
            cancelled=making.cancelled,
            copy_here=copy_here,
        )
    except TooLarge as exc:
        raise too_large(exc, making.budget) from exc
    except UnsafePath as exc:
        raise refused(f"the project lists a path git cannot hold: {exc}") from exc


def too_large(exc: TooLarge, budget: Budget) -> WorkspaceRefused:
    what = "files" if str(exc) == "files" else "bytes"
    return refused(
        f"the project has more {what} to copy than orchestrator.workspaces allows "
        "(ignored files are not copied: a .gitignore for build output helps); raise "
        "orchestrator.workspaces.max_size or max_files, or use workspace: shared",
        WORKSPACE_TOO_LARGE,
    )


def _check_out(git: Git, entries: dict[bytes, Entry], making: Making) -> dict[bytes, Entry]:
    """Write ``entries`` (a commit's tree) into the copy from the object database, raw (no
    filter, no attribute applied): ``cat-file --batch``, one object after the other."""
    start = {path: entry for path, entry in entries.items() if entry.mode == MODE_GITLINK}
    wanted = [(path, entry) for path, entry in entries.items() if entry.mode != MODE_GITLINK]
    if not wanted:
        return start
    request = b"".join(entry.oid.encode() + b"\n" for _path, entry in wanted)
    owner, budget = making.owner, making.budget
    with (
        Directories(making.target_fd, make=True, owner=owner) as targets,
        git.process(["cat-file", "--batch"], deadline=making.deadline, stdin=True) as child,
    ):
        assert child.stdin is not None
        assert child.stdout is not None
        writer = threading.Thread(target=_feed, args=(child.stdin, request), daemon=True)
        writer.start()
        for path, entry in wanted:
            if making.cancelled():
                raise InterruptedError("cancelled")
            header = child.stdout.readline(256).split()
            if len(header) != 3 or header[1] != b"blob":
                raise refused(f"git cat-file: {header!r} for {entry.oid}")
            size = int(header[2])
            try:
                budget.take(size)
            except TooLarge as exc:
                raise too_large(exc, budget) from exc
            try:
                parts = check_path(path)
            except UnsafePath as exc:
                raise refused(f"the base holds a path git cannot check out: {exc}") from exc
            stamp = write_file(
                targets, parts, entry.mode, _read_exactly(child.stdout, size), owner=owner
            )
            if child.stdout.read(1) != b"\n":
                raise refused("git cat-file: a blob without its newline")
            start[path] = Entry(entry.mode, entry.oid, stamp)
        writer.join(1.0)
    return start


def _read_exactly(stream: IO[bytes], size: int) -> Iterator[bytes]:
    left = size
    while left:
        chunk = stream.read(min(CHUNK, left))
        if not chunk:
            raise refused("git cat-file: a blob cut short")
        left -= len(chunk)
        yield chunk


def _feed(stream: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(OSError):
        stream.write(data)
        stream.close()


def _write_blobs(workspace: Workspace, paths: list[bytes], deadline: float) -> None:
    """Write the blobs of ``paths`` (files of the copy, as made) into the repository."""
    if not paths:
        return
    copy_fd = os.open(workspace.directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with Directories(copy_fd) as copy:
            commands = (
                chunk
                for path in paths
                for chunk in (b"blob\n", *file_data(copy, path, workspace.start[path].mode))
            )
            fast_import(workspace.git(), framed(commands), deadline)
    finally:
        os.close(copy_fd)
