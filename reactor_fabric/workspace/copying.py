"""An isolated task's copy of the project, made in two steps so that its container can start
meanwhile (see :mod:`reactor_fabric.trio.workspaces`).

:func:`begin` checks what can be checked at once (a repository, a ``base`` that names a
commit) and makes the copy's directory, empty (it can be pinned and mounted from then on).
:func:`fill` reads what goes into the copy — the client's working tree as the client has it
(tracked files with their uncommitted changes, untracked files that are not ignored; ignored
files and nested repositories are left out), or the tree of the ``base`` — and writes the
files into it. The working tree's uncommitted blobs are read back from the copy before the
task can change it and held in memory, and its base's tree is not read yet: both wait for
:func:`~.task.settle`, which runs while the task's container starts (writing the blobs and
reading the tree took a fifth of a 10,000-file copy's start: scripts/bench-workspace.py).
:func:`prepare` is all three at once. The copy has no ``.git``: the task never reaches the
client's hooks, config, refs or objects.

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
    settle,
    tree_entries,
)

# The most bytes of uncommitted blobs a copy holds in memory from its fill to its settle (a
# fraction of a second: its container's start); more than that are written before the start.
HELD_BYTES = 32 << 20
# git's empty blob in either format: never taken to be in the repository (an index entry of
# ``git add -N`` names it without it having to be there).
_EMPTY_BLOBS = frozenset(
    (
        "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",
        "473a0f4c3be8a93681a267e3b1e9a7dcda1185436fe141f7749120a303721813",
    )
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
    """:func:`begin`, :func:`fill` and :func:`~.task.settle` at once."""
    begun = begin(project_fd, owner, directory, base=base, bounds=bounds, copy_owner=copy_owner)
    workspace = fill(begun, cancelled)
    try:
        settle(workspace, bounds=bounds, cancelled=cancelled)
    except BaseException:
        remove(begun.directory)
        raise
    return workspace


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
    meanwhile: nothing, it waits for this); the workspace the task works on, to be settled
    (:func:`~.task.settle`). ``helper`` copies half of a large working tree beside this thread
    (:mod:`.helper`). On failure or when ``cancelled()``, the directory is removed before the
    error goes up."""
    try:
        # (a base's tree is what the copy is made of: read now; the working tree's base's
        # tree is needed only by the recording)
        listings = read_listings(begun, tree=begun.base is not None)
        staged: frozenset[str] = frozenset()
        with opened_target(begun) as target_fd:
            making = Making(target_fd, begun.budget(), begun.copy_owner, begun.deadline, cancelled)
            if listings.working_tree is not None:
                paths, gitlinks, staged = wanted(*listings.working_tree)
                copied = copy_paths(paths, begun.project_fd, begun.algorithm, making, helper=helper)
                start = copied | gitlinks
            else:
                assert listings.base_entries is not None  # (read: tree=True)
                start = _check_out(begun.git(), listings.base_entries, making)
        return finished(begun, listings, start, staged)
    except BaseException:
        remove(begun.directory)
        raise


@dataclass(frozen=True)
class Listings:
    """What git says goes into a copy: the working tree's two listings (``ls-files --stage``
    and ``ls-files --others --exclude-standard``; None when the copy is the base's tree), the
    commit it starts from (None in a repository without one) and that commit's tree (None:
    not read yet)."""

    working_tree: tuple[bytes, bytes] | None
    base: str | None
    base_entries: dict[bytes, Entry] | None


def read_listings(begun: Begun, *, known: Listings | None = None, tree: bool = True) -> Listings:
    """The listings of :class:`Listings`; the base's tree is ``known``'s when its base is the
    same commit (a tree is read once: a commit's tree never changes), else read only when
    ``tree``."""
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
        base_entries: dict[bytes, Entry] | None = None
        if known is not None and known.base == base:
            base_entries = known.base_entries
        if base_entries is None and tree:
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


def finished(
    begun: Begun, listings: Listings, start: dict[bytes, Entry], staged: frozenset[str]
) -> Workspace:
    """The workspace whose copy holds ``start``, with the blobs of its files that may not be
    in the repository yet — neither in the index (``staged``: the blob ids it lists, which
    ``git add`` wrote) nor in the base's tree, when read — read back from the copy and held
    for :func:`~.task.settle` (before the task can change them: for the working tree's
    commit); written now instead when they are more than :data:`HELD_BYTES`."""
    workspace = Workspace(
        directory=begun.directory,
        project_fd=begun.project_fd,
        owner=begun.owner,
        algorithm=begun.algorithm,
        base=listings.base,
        base_entries=listings.base_entries,
        start=start,
    )
    if listings.base_entries is not None and workspace.start_is_base:
        return workspace
    known = set(staged - _EMPTY_BLOBS)
    if listings.base_entries is not None:
        known.update(entry.oid for entry in listings.base_entries.values())
    new: dict[str, bytes] = {}  # (one path per blob)
    for path, entry in start.items():
        if entry.mode != MODE_GITLINK and entry.oid not in known:
            new.setdefault(entry.oid, path)
    if not new:
        return workspace
    size = 0
    for path in new.values():
        stamp = start[path].stamp
        size += stamp[1] if stamp is not None else 0
    if size <= HELD_BYTES:
        workspace.held = list(_blob_commands(workspace, list(new.values())))
    else:
        fast_import(
            workspace.git(), framed(_blob_commands(workspace, list(new.values()))), begun.deadline
        )
    return workspace


# --- making the copy -------------------------------------------------------------------------


@dataclass(frozen=True)
class Making:
    """A copy being made: where to, within what, owned by whom, until when."""

    target_fd: int
    budget: Budget
    owner: Ownership | None
    deadline: float
    cancelled: Cancelled


def wanted(
    staged: bytes, untracked: bytes
) -> tuple[dict[bytes, None], dict[bytes, Entry], frozenset[str]]:
    """The working tree's paths to copy, in git's order, its submodules' entries (never
    copied) and the blob ids its index lists, from its two listings."""
    gitlinks: dict[bytes, Entry] = {}
    paths: dict[bytes, None] = {}
    blobs: set[str] = set()
    for mode, oid, path in listed(staged, LS_FILES_OID):
        if mode == MODE_GITLINK:
            gitlinks[path] = Entry(MODE_GITLINK, oid)
        else:
            paths[path] = None  # an unmerged path is listed once per stage: copied once
            blobs.add(oid)
    for path in untracked.split(b"\0"):
        if path and not path.endswith(b"/"):  # a nested repository: not copied
            paths[path] = None
    return paths, gitlinks, frozenset(blobs)


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


def _blob_commands(workspace: Workspace, paths: list[bytes]) -> Iterator[bytes]:
    """fast-import's commands writing the blobs of ``paths`` (files of the copy, as made)."""
    copy_fd = os.open(workspace.directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with Directories(copy_fd) as copy:
            for path in paths:
                yield b"blob\n" + b"".join(file_data(copy, path, workspace.start[path].mode))
    finally:
        os.close(copy_fd)
