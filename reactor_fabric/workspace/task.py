"""An isolated task's workspace, from the copy it starts on to the branch its work becomes.

:func:`prepare` makes the copy: the client's working tree as the client has it (tracked files
with their uncommitted changes, untracked files that are not ignored; ignored files and nested
repositories are left out), or, given a ``base``, the tree of that branch or commit. The copy
has no ``.git``: the task never reaches the client's hooks, config, refs or objects.

:func:`record` turns what the task changed into commits on a new branch of the client's
repository — first the working tree's uncommitted state when it differed from the base, then
the task's changes — with ``git fast-import`` writing objects and the one new ref, nothing
else: the client's HEAD, index, working tree and other refs are untouched. Nothing changed,
nothing committed (no branch). The blobs of the working tree's uncommitted files are written
into the repository when the copy is made (before the task can change them), as
``git stash create`` writes its objects: unreachable until the branch holds them.

:func:`remove` deletes the copy.

Git runs as :mod:`.git` says (the repository's owner, nothing of its configuration executed),
files are read and written as :mod:`.files` says (by descriptor, no link followed).

Blocking, in a worker thread; ``cancelled`` is polled between files and steps. Every function
cleans up what it made when it fails (a copy half made is removed before the error goes up).

Errors: :class:`~reactor_fabric.WorkspaceRefused` with ``workspace_not_a_repository``,
``workspace_base_unknown``, ``workspace_too_large`` or ``workspace_failed``;
``InterruptedError`` when cancelled.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

from .._errors import WorkspaceRefused
from .._reasons import (
    WORKSPACE_BASE_UNKNOWN,
    WORKSPACE_FAILED,
    WORKSPACE_NOT_A_REPOSITORY,
    WORKSPACE_TOO_LARGE,
)
from .files import (
    CHUNK,
    MODE_GITLINK,
    Budget,
    Directories,
    Entry,
    Ownership,
    TooLarge,
    UnsafePath,
    blob_hasher,
    check_path,
    copy_listed,
    opened,
    walk,
    write_file,
)
from .git import Git, GitFailed, RepositoryOwner
from .naming import AUTHOR_EMAIL, AUTHOR_NAME, TaskFacts, task_message, valid_base
from .naming import working_tree_message as tree_message

Cancelled = Callable[[], bool]


@dataclass(frozen=True)
class Bounds:
    """``orchestrator.workspaces``: what one task's copy may hold, and how long each step may
    take."""

    max_files: int
    max_bytes: int
    step_seconds: float = 120.0


@dataclass
class Workspace:
    """A task's copy and what it started from. ``directory`` is the copy (the task's mount
    source); ``start`` its entries when made; ``base`` the commit it started from (None in a
    repository without commits), ``base_entries`` that commit's tree."""

    directory: str
    project_fd: int = field(repr=False)
    owner: RepositoryOwner
    algorithm: str
    base: str | None
    base_entries: dict[bytes, Entry] = field(repr=False)
    start: dict[bytes, Entry] = field(repr=False)

    @functools.cached_property
    def start_is_base(self) -> bool:
        """Whether the task starts from the base's tree itself (no working tree's commit)."""
        return _tree(self.start) == _tree(self.base_entries)

    def git(self) -> Git:
        return Git(self.project_fd, self.owner)


@dataclass(frozen=True)
class Recorded:
    """What :func:`record` made: the branch and its commits (``commit`` None: nothing changed,
    no branch), and the task's change as counted between its commit and its parent."""

    branch: str | None
    base: str | None
    commit: str | None
    working_tree_commit: str | None = None
    files_changed: int = 0
    insertions: int = 0
    deletions: int = 0
    diff_sha256: str | None = None


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
    """Make the copy at ``directory`` (a new directory, made here) of the project held by
    ``project_fd`` (a pin's descriptor), owned by ``owner`` (uid, gid): the working tree, or
    the tree of ``base``. The project's own ``.git`` must be at its top. The copy's files
    belong to ``copy_owner`` (the account the task's container runs as; default ``owner``)."""
    repository_owner = RepositoryOwner.of(*owner)
    git = Git(project_fd, repository_owner)
    deadline = time.monotonic() + bounds.step_seconds
    algorithm = _object_format(git, deadline)
    if base is not None and not valid_base(base):
        raise WorkspaceRefused(
            f"base {base!r} is not a branch, tag or commit name (letters, digits, '._/-')",
            reason=WORKSPACE_BASE_UNKNOWN,
        )
    with ThreadPoolExecutor(2, thread_name_prefix="workspace-git") as listings:
        # The working tree's listings (two git processes) while the base is read here: they
        # are independent, and the machines have two cores. (Leaving the block waits for them;
        # each git process is killed at the deadline.)
        listed = (
            None
            if base is not None
            else (
                listings.submit(_run, git, ["ls-files", "-z", "--stage"], deadline),
                listings.submit(
                    _run, git, ["ls-files", "-z", "--others", "--exclude-standard"], deadline
                ),
            )
        )
        base_commit = _commit_of(git, base or "HEAD", deadline, required=base is not None)
        base_entries = _tree_entries(git, base_commit, deadline) if base_commit else {}
        working_tree = None if listed is None else (listed[0].result(), listed[1].result())
    ids = Ownership(*(copy_owner or owner)) if os.geteuid() == 0 else None
    os.mkdir(directory, 0o700)
    try:
        if ids is not None:
            os.chown(directory, ids.uid, ids.gid)
        target_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            budget = Budget(bounds.max_files, bounds.max_bytes)
            making = _Making(target_fd, budget, ids, deadline, cancelled)
            if working_tree is not None:
                start = _copy_working_tree(*working_tree, project_fd, algorithm, making)
            else:
                start = _check_out(git, base_entries, making)
        finally:
            os.close(target_fd)
        workspace = Workspace(
            directory=directory,
            project_fd=project_fd,
            owner=repository_owner,
            algorithm=algorithm,
            base=base_commit,
            base_entries=base_entries,
            start=start,
        )
        if not workspace.start_is_base:
            # Before the task can change them: the uncommitted files' blobs, into the
            # repository, for the working tree's commit.
            _write_blobs(workspace, _new_blobs(workspace.start, base_entries), deadline)
    except BaseException:
        remove(directory)
        raise
    return workspace


def record(
    workspace: Workspace,
    facts: TaskFacts,
    branch: str,
    *,
    bounds: Bounds,
    cancelled: Cancelled,
    now: float | None = None,
) -> Recorded:
    """Record what the task changed in its copy as commits on ``branch`` (a new branch of the
    client's repository); nothing changed: nothing written, ``commit`` None. Call it once no
    container can write the copy any more."""
    deadline = time.monotonic() + bounds.step_seconds
    final = _final_entries(workspace, bounds, deadline, cancelled)
    if _tree(final) == _tree(workspace.start):
        return Recorded(branch=None, base=workspace.base, commit=None)
    git = workspace.git()
    when = int(now if now is not None else time.time())
    ref = f"refs/heads/{branch}"
    _fast_import(git, _framed(_import_stream(workspace, final, facts, ref, when)), deadline)
    commit = _commit_of(git, ref, deadline, required=False)
    if commit is None:
        raise _refused(f"git fast-import wrote no branch {branch!r}")
    working_tree_commit = None
    if not workspace.start_is_base:
        working_tree_commit = _commit_of(git, f"{commit}^", deadline, required=False)
    files, insertions, deletions = _numstat(git, commit, deadline)
    return Recorded(
        branch=branch,
        base=workspace.base,
        commit=commit,
        working_tree_commit=working_tree_commit,
        files_changed=files,
        insertions=insertions,
        deletions=deletions,
        diff_sha256=_diff_sha256(git, commit, deadline),
    )


def remove(directory: str) -> None:
    """Delete a copy (whatever a task made of it: links are removed, never followed)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)


# --- reading the repository ------------------------------------------------------------------


def _refused(message: str, reason: str = WORKSPACE_FAILED) -> WorkspaceRefused:
    return WorkspaceRefused(message, reason=reason)


def _run(git: Git, args: list[str], deadline: float, **options: object) -> bytes:
    try:
        return git.run(args, deadline=deadline, **options)  # type: ignore[arg-type]
    except GitFailed as exc:
        raise _refused(str(exc)) from exc


def _object_format(git: Git, deadline: float) -> str:
    """The repository's hash (sha1 or sha256); refused if the project is no repository's top."""
    try:
        out = git.run(
            ["rev-parse", "--is-bare-repository", "--show-object-format"], deadline=deadline
        )
    except GitFailed as exc:
        raise _refused(
            "the project is not a git repository (no .git at its top): isolated tasks work on "
            "a copy handed back as a branch; use workspace: shared for this service, or run "
            "git init in the project",
            WORKSPACE_NOT_A_REPOSITORY,
        ) from exc
    bare, algorithm = out.decode().split()
    if bare != "false" or algorithm not in ("sha1", "sha256"):
        raise _refused(
            f"the project's .git is not a work tree's ({bare}, {algorithm})",
            WORKSPACE_NOT_A_REPOSITORY,
        )
    return algorithm


def _commit_of(git: Git, name: str, deadline: float, *, required: bool) -> str | None:
    """The commit ``name`` names; None if there is none (HEAD with no commit yet), or, when
    ``required`` (a client's base), refused with ``workspace_base_unknown``."""
    out = git.run(
        ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{name}^{{commit}}"],
        deadline=deadline,
        ok={1: True, 128: not required},
    )
    commit = out.decode().strip()
    if commit:
        return commit
    if required:
        raise _refused(
            f"base {name!r} is not a branch, tag or commit of the project's repository",
            WORKSPACE_BASE_UNKNOWN,
        )
    return None


# Where the object id is in a record's head: ls-tree's "mode type oid", ls-files'
# "mode oid stage".
LS_TREE_OID, LS_FILES_OID = 2, 1


def _listed(out: bytes, oid_column: int) -> Iterator[tuple[int, str, bytes]]:
    """(mode, object id, path) of each record of ``ls-tree -z`` or ``ls-files -z --stage``
    ("<head>\t<path>")."""
    for record_ in out.split(b"\0"):
        if not record_:
            continue
        head, _, path = record_.partition(b"\t")
        fields = head.split(b" ")
        yield int(fields[0], 8), fields[oid_column].decode(), path


def _tree_entries(git: Git, commit: str, deadline: float) -> dict[bytes, Entry]:
    out = _run(git, ["ls-tree", "-r", "-z", "--full-tree", commit], deadline)
    return {path: Entry(mode, oid) for mode, oid, path in _listed(out, LS_TREE_OID)}


def _tree(entries: dict[bytes, Entry]) -> dict[bytes, tuple[int, str]]:
    return {path: (entry.mode, entry.oid) for path, entry in entries.items()}


def _new_blobs(start: dict[bytes, Entry], base: dict[bytes, Entry]) -> list[bytes]:
    known = {entry.oid for entry in base.values()}
    return [
        path
        for path, entry in start.items()
        if entry.mode != MODE_GITLINK and entry.oid not in known
    ]


# --- making the copy -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Making:
    """A copy being made: where to, within what, owned by whom, until when."""

    target_fd: int
    budget: Budget
    owner: Ownership | None
    deadline: float
    cancelled: Cancelled


def _copy_working_tree(
    staged: bytes, untracked: bytes, project_fd: int, algorithm: str, making: _Making
) -> dict[bytes, Entry]:
    """Copy what ``ls-files --stage`` (``staged``) and ``ls-files --others
    --exclude-standard`` (``untracked``) list: the working tree as the client has it."""
    budget = making.budget
    gitlinks: dict[bytes, Entry] = {}
    paths: dict[bytes, None] = {}
    for mode, oid, path in _listed(staged, LS_FILES_OID):
        if mode == MODE_GITLINK:
            gitlinks[path] = Entry(MODE_GITLINK, oid)
        else:
            paths[path] = None  # an unmerged path is listed once per stage: copied once
    for path in untracked.split(b"\0"):
        if path and not path.endswith(b"/"):  # a nested repository: not copied
            paths[path] = None
    try:
        copied = copy_listed(
            project_fd,
            paths,
            making.target_fd,
            algorithm=algorithm,
            budget=budget,
            owner=making.owner,
            cancelled=making.cancelled,
        )
    except TooLarge as exc:
        raise _too_large(exc, budget) from exc
    except UnsafePath as exc:
        raise _refused(f"the project lists a path git cannot hold: {exc}") from exc
    return copied | gitlinks


def _too_large(exc: TooLarge, budget: Budget) -> WorkspaceRefused:
    what = "files" if str(exc) == "files" else "bytes"
    return _refused(
        f"the project has more {what} to copy than orchestrator.workspaces allows "
        "(ignored files are not copied: a .gitignore for build output helps); raise "
        "orchestrator.workspaces.max_size or max_files, or use workspace: shared",
        WORKSPACE_TOO_LARGE,
    )


def _check_out(git: Git, entries: dict[bytes, Entry], making: _Making) -> dict[bytes, Entry]:
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
                raise _refused(f"git cat-file: {header!r} for {entry.oid}")
            size = int(header[2])
            try:
                budget.take(size)
            except TooLarge as exc:
                raise _too_large(exc, budget) from exc
            try:
                parts = check_path(path)
            except UnsafePath as exc:
                raise _refused(f"the base holds a path git cannot check out: {exc}") from exc
            stamp = write_file(
                targets, parts, entry.mode, _read_exactly(child.stdout, size), owner=owner
            )
            if child.stdout.read(1) != b"\n":
                raise _refused("git cat-file: a blob without its newline")
            start[path] = Entry(entry.mode, entry.oid, stamp)
        writer.join(1.0)
    return start


def _read_exactly(stream: IO[bytes], size: int) -> Iterator[bytes]:
    left = size
    while left:
        chunk = stream.read(min(CHUNK, left))
        if not chunk:
            raise _refused("git cat-file: a blob cut short")
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
                for chunk in (b"blob\n", *_data(copy, path, workspace.start[path].mode))
            )
            _fast_import(workspace.git(), _framed(commands), deadline)
    finally:
        os.close(copy_fd)


def _framed(commands: Iterable[bytes]) -> Iterator[bytes]:
    yield b"feature done\n"
    yield from commands
    yield b"done\n"


# --- reading the copy back -------------------------------------------------------------------


def _final_entries(
    workspace: Workspace, bounds: Bounds, deadline: float, cancelled: Cancelled
) -> dict[bytes, Entry]:
    """The copy's entries now: unchanged files (same stamp) keep their ids, the others are
    hashed; new paths that the copy's ignore rules ignore are left out (build output)."""
    copy_fd = os.open(workspace.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            found = walk(
                copy_fd, budget=Budget(bounds.max_files, bounds.max_bytes), cancelled=cancelled
            )
        except TooLarge as exc:
            raise _refused(
                f"the task left more {exc} in its copy than orchestrator.workspaces allows: "
                "its changes were not recorded",
                WORKSPACE_TOO_LARGE,
            ) from exc
        start = workspace.start
        new = [path for path in found if path not in start]
        ignored = _ignored(workspace, copy_fd, new, deadline)
        final: dict[bytes, Entry] = {}
        with Directories(copy_fd) as copy:
            for path, seen in found.items():
                if path in ignored:
                    continue
                before = start.get(path)
                if before is not None and before.stamp == seen.stamp and before.mode == seen.mode:
                    final[path] = before
                else:
                    oid = _hash(copy, path, seen.mode, workspace.algorithm)
                    final[path] = Entry(seen.mode, oid)
        # A submodule: not in the copy, not the task's to change.
        final |= {path: entry for path, entry in start.items() if entry.mode == MODE_GITLINK}
        return final
    finally:
        os.close(copy_fd)


def _ignored(workspace: Workspace, copy_fd: int, paths: list[bytes], deadline: float) -> set[bytes]:
    """Which of ``paths`` (new in the copy) git's ignore rules ignore: the copy's .gitignore
    files and the repository's info/exclude, as ``git check-ignore`` reads them."""
    if not paths:
        return set()
    git = Git(
        copy_fd,
        workspace.owner,
        git_dir=f"/proc/self/fd/{workspace.project_fd}/.git",
        extra_fds=(workspace.project_fd,),
    )
    out = _run(
        git,
        ["check-ignore", "--no-index", "-z", "--stdin"],
        deadline,
        input=b"".join(path + b"\0" for path in paths),
        ok={1: True},  # none ignored
    )
    return {path for path in out.split(b"\0") if path}


def _hash(copy: Directories, path: bytes, mode: int, algorithm: str) -> str:
    try:
        with opened(copy, path, mode) as (size, chunks):
            hasher = blob_hasher(algorithm, size)
            for chunk in chunks:
                hasher.update(chunk)
    except OSError as exc:
        raise _refused(f"{path!r} of the copy could not be read: {exc}") from exc
    return hasher.hexdigest()


# --- writing the branch ----------------------------------------------------------------------


def _data(copy: Directories, path: bytes, mode: int) -> Iterator[bytes]:
    """fast-import's ``data <n>`` and the content of a file of the copy."""
    with opened(copy, path, mode) as (size, chunks):
        yield b"data %d\n" % size
        yield from chunks
    yield b"\n"


def _quoted(path: bytes) -> bytes:
    """A path as fast-import reads it: C-style quoted when it must be."""
    if not any(c in path for c in (b"\n", b'"', b"\\")) and not path.startswith(b'"'):
        return path
    escaped = path.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\n", b"\\n")
    return b'"' + escaped + b'"'


def _identity(when: int) -> bytes:
    return f"{AUTHOR_NAME} <{AUTHOR_EMAIL}> {when} +0000".encode()


def _commit(ref: str, mark: int, message: bytes, parent: bytes | None, when: int) -> bytes:
    identity = _identity(when)
    head = b"commit %s\nmark :%d\nauthor %s\ncommitter %s\ndata %d\n%s\n" % (
        ref.encode(),
        mark,
        identity,
        identity,
        len(message),
        message,
    )
    if parent is not None:
        head += b"from " + parent + b"\n"
    return head + b"deleteall\n"


def _import_stream(
    workspace: Workspace, final: dict[bytes, Entry], facts: TaskFacts, ref: str, when: int
) -> Iterator[bytes]:
    parent = workspace.base.encode() if workspace.base is not None else None
    if not workspace.start_is_base:
        yield _commit(ref, 1, tree_message(facts), parent, when)
        for path, entry in sorted(workspace.start.items()):
            yield b"M %o %s %s\n" % (entry.mode, entry.oid.encode(), _quoted(path))
        parent = b":1"
    yield _commit(ref, 2, task_message(facts), parent, when)
    copy_fd = os.open(workspace.directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with Directories(copy_fd) as copy:
            entries = (*workspace.start.values(), *workspace.base_entries.values())
            known = {entry.oid for entry in entries}
            for path, entry in sorted(final.items()):
                if entry.oid in known or entry.mode == MODE_GITLINK:
                    yield b"M %o %s %s\n" % (entry.mode, entry.oid.encode(), _quoted(path))
                else:
                    yield b"M %o inline %s\n" % (entry.mode, _quoted(path))
                    yield from _data(copy, path, entry.mode)
    finally:
        os.close(copy_fd)


def _fast_import(git: Git, chunks: Iterable[bytes], deadline: float) -> None:
    """Feed ``chunks`` to ``git fast-import`` (which writes the objects, and the ref a
    ``commit`` names, only if the whole stream arrives: ``feature done``)."""
    args = ["fast-import", "--quiet", "--done"]
    with git.process(args, deadline=deadline, stdin=True) as child:
        assert child.stdin is not None
        assert child.stderr is not None
        try:
            for chunk in chunks:
                child.stdin.write(chunk)
            child.stdin.close()
        except BrokenPipeError:
            pass  # it stopped reading: its status and stderr say why
        stderr = child.stderr.read(4096)
        status = child.wait()
    if status != 0:
        detail = stderr.decode("utf-8", "replace").strip().splitlines()
        raise _refused(f"git fast-import: exit status {status}: {(detail or [''])[0][:300]}")


def _numstat(git: Git, commit: str, deadline: float) -> tuple[int, int, int]:
    out = _run(
        git,
        [
            "diff-tree",
            "--root",
            "-r",
            "-z",
            "--numstat",
            "--no-renames",
            "--no-ext-diff",
            "--no-textconv",
            commit,
        ],
        deadline,
    )
    # -z --numstat: "<commit>\0" first, then "added\tdeleted\tpath\0" per file.
    files = insertions = deletions = 0
    for record_ in out.split(b"\0"):
        fields = record_.split(b"\t")
        if len(fields) != 3:
            continue
        files += 1
        if fields[0] != b"-":  # a binary file: no lines counted
            insertions += int(fields[0])
            deletions += int(fields[1])
    return files, insertions, deletions


def _diff_sha256(git: Git, commit: str, deadline: float) -> str:
    """SHA-256 of the task's change as ``git diff-tree -p --binary`` prints it (streamed)."""
    hasher = hashlib.sha256()
    args = [
        "diff-tree",
        "--root",
        "-r",
        "-p",
        "--binary",
        "--no-renames",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
        "--no-commit-id",
        commit,
    ]
    with git.process(args, deadline=deadline) as child:
        assert child.stdout is not None
        while chunk := child.stdout.read(CHUNK):
            hasher.update(chunk)
        status = child.wait()
    if status != 0:
        raise _refused(f"git diff-tree: exit status {status}")
    return hasher.hexdigest()
