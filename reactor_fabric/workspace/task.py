"""An isolated task's workspace, from the copy it starts on to the branch its work becomes.

:class:`Workspace` is the copy and what it started from (made by :mod:`.copying`), and this
module reads the client's repository for both (its object format, a base's commit and tree,
``git fast-import``).

:func:`record` turns what the task changed into commits on a new branch of the client's
repository — first the working tree's uncommitted state when it differed from the base, then
the task's changes — with ``git fast-import`` writing objects and the one new ref, nothing
else: the client's HEAD, index, working tree and other refs are untouched. Nothing changed,
nothing committed (no branch); the working tree's uncommitted blobs are in the repository
already (:func:`settle` wrote them, while the task's container started).

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
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from .._errors import WorkspaceRefused
from .._reasons import (
    WORKSPACE_BASE_UNKNOWN,
    WORKSPACE_FAILED,
    WORKSPACE_NOT_A_REPOSITORY,
    WORKSPACE_TOO_LARGE,
)
from .files import (
    CHUNK,
    MODE_FILE,
    MODE_GITLINK,
    MODE_SYMLINK,
    Budget,
    Directories,
    Entry,
    Found,
    Ownership,
    TooLarge,
    blob_hasher,
    check_path,
    opened,
    walk,
    write_file,
)
from .git import Git, GitFailed, RepositoryOwner
from .naming import AUTHOR_EMAIL, AUTHOR_NAME, TaskFacts, task_message
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
    repository without commits), ``base_entries`` that commit's tree — None until
    :func:`settle` reads it. ``held``: fast-import's commands for the working tree's
    uncommitted blobs, read from the copy before the task could change it and kept in memory
    until :func:`settle` writes them (a task's start does not wait for either: see
    :func:`.copying.fill`)."""

    directory: str
    project_fd: int = field(repr=False)
    owner: RepositoryOwner
    algorithm: str
    base: str | None
    base_entries: dict[bytes, Entry] | None = field(repr=False)
    start: dict[bytes, Entry] = field(repr=False)
    held: list[bytes] = field(default_factory=list, repr=False)

    @property
    def settled(self) -> bool:
        return self.base_entries is not None and not self.held

    @functools.cached_property
    def start_is_base(self) -> bool:
        """Whether the task starts from the base's tree itself (no working tree's commit);
        asked once settled."""
        assert self.base_entries is not None, "settle() reads the base's tree"
        return same_tree(self.start, self.base_entries)

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
    settle(workspace, bounds=bounds, cancelled=cancelled)
    deadline = time.monotonic() + bounds.step_seconds
    final = _final_entries(workspace, bounds, deadline, cancelled)
    if same_tree(final, workspace.start):
        return Recorded(branch=None, base=workspace.base, commit=None)
    git = workspace.git()
    when = int(now if now is not None else time.time())
    ref = f"refs/heads/{branch}"
    fast_import(git, framed(_import_stream(workspace, final, facts, ref, when)), deadline)
    commit = commit_of(git, ref, deadline, required=False)
    if commit is None:
        raise refused(f"git fast-import wrote no branch {branch!r}")
    working_tree_commit = None
    if not workspace.start_is_base:
        working_tree_commit = commit_of(git, f"{commit}^", deadline, required=False)
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


def settle(workspace: Workspace, *, bounds: Bounds, cancelled: Cancelled) -> None:
    """What a task's start did not wait for, done while its container starts (or at the
    latest by :func:`record`): the base's tree read, and the working tree's uncommitted blobs
    — held in memory since the copy was made, so that what the task does to its copy is not
    them — written into the repository (unreachable until a branch holds them, as ``git
    stash create`` writes its objects). Done once: a workspace settled is left as it is."""
    deadline = time.monotonic() + bounds.step_seconds
    if workspace.base_entries is None:
        if cancelled():
            raise InterruptedError("cancelled")
        base = workspace.base
        workspace.base_entries = tree_entries(workspace.git(), base, deadline) if base else {}
    if workspace.held:
        if cancelled():
            raise InterruptedError("cancelled")
        fast_import(workspace.git(), framed(workspace.held), deadline)
        workspace.held = []


def remove(directory: str) -> None:
    """Delete a copy (whatever a task made of it: links are removed, never followed)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)


# --- reading the repository ------------------------------------------------------------------


def refused(message: str, reason: str = WORKSPACE_FAILED) -> WorkspaceRefused:
    return WorkspaceRefused(message, reason=reason)


def run_git(git: Git, args: list[str], deadline: float, **options: object) -> bytes:
    try:
        return git.run(args, deadline=deadline, **options)  # type: ignore[arg-type]
    except GitFailed as exc:
        raise refused(str(exc)) from exc


def object_format(git: Git, deadline: float) -> str:
    """The repository's hash (sha1 or sha256); refused if the project is no repository's top."""
    try:
        out = git.run(
            ["rev-parse", "--is-bare-repository", "--show-object-format"], deadline=deadline
        )
    except GitFailed as exc:
        raise refused(
            "the project is not a git repository (no .git at its top): isolated tasks work on "
            "a copy handed back as a branch; use workspace: shared for this service, or run "
            "git init in the project",
            WORKSPACE_NOT_A_REPOSITORY,
        ) from exc
    bare, algorithm = out.decode().split()
    if bare != "false" or algorithm not in ("sha1", "sha256"):
        raise refused(
            f"the project's .git is not a work tree's ({bare}, {algorithm})",
            WORKSPACE_NOT_A_REPOSITORY,
        )
    return algorithm


def commit_of(git: Git, name: str, deadline: float, *, required: bool) -> str | None:
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
        raise refused(
            f"base {name!r} is not a branch, tag or commit of the project's repository",
            WORKSPACE_BASE_UNKNOWN,
        )
    return None


# Where the object id is in a record's head: ls-tree's "mode type oid", ls-files'
# "mode oid stage".
LS_TREE_OID, LS_FILES_OID = 2, 1


def listed(out: bytes, oid_column: int) -> Iterator[tuple[int, str, bytes]]:
    """(mode, object id, path) of each record of ``ls-tree -z`` or ``ls-files -z --stage``
    ("<head>\t<path>")."""
    for record_ in out.split(b"\0"):
        if not record_:
            continue
        head, _, path = record_.partition(b"\t")
        fields = head.split(b" ")
        yield int(fields[0], 8), fields[oid_column].decode(), path


def tree_entries(git: Git, commit: str, deadline: float) -> dict[bytes, Entry]:
    out = run_git(git, ["ls-tree", "-r", "-z", "--full-tree", commit], deadline)
    return {path: Entry(mode, oid) for mode, oid, path in listed(out, LS_TREE_OID)}


def same_tree(one: dict[bytes, Entry], other: dict[bytes, Entry]) -> bool:
    """Whether two trees hold the same paths with the same modes and blobs (their files'
    stamps aside; stops at the first difference)."""
    if len(one) != len(other):
        return False
    for path, entry in one.items():
        found = other.get(path)
        if found is None or (found.mode, found.oid) != (entry.mode, entry.oid):
            return False
    return True


def framed(commands: Iterable[bytes]) -> Iterator[bytes]:
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
            raise refused(
                f"the task left more {exc} in its copy than orchestrator.workspaces allows: "
                "its changes were not recorded",
                WORKSPACE_TOO_LARGE,
            ) from exc
        start = workspace.start
        new = [path for path in found if path not in start]
        ignored = _ignored(workspace, copy_fd, new, found, deadline)
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


def _ignored(
    workspace: Workspace,
    copy_fd: int,
    paths: list[bytes],
    found: dict[bytes, Found],
    deadline: float,
) -> set[bytes]:
    """Which of ``paths`` (new in the copy) git's ignore rules ignore: the copy's .gitignore
    files and the repository's own rules (info/exclude, core.excludesFile), as ``git
    check-ignore`` reads them.

    Git does not run in the copy: it runs as the repository's owner, who cannot reach the copy
    by path (it is in the orchestrator's 0700 area, and the container's account's), and git
    needs the path of its work tree, not only a descriptor. It runs in a scratch tree that
    holds the copy's .gitignore files and nothing else (:func:`_ignore_rules`); the paths it is
    asked about need not exist for their rules to match."""
    if not paths:
        return set()
    rules = [
        path
        for path, seen in found.items()
        if path.rpartition(b"/")[2] == b".gitignore" and seen.mode != MODE_SYMLINK
    ]
    with _ignore_rules(copy_fd, rules, workspace.owner) as scratch_fd:
        git = Git(
            scratch_fd,
            workspace.owner,
            git_dir=f"/proc/self/fd/{workspace.project_fd}/.git",
            extra_fds=(workspace.project_fd,),
        )
        out = run_git(
            git,
            ["check-ignore", "--no-index", "-z", "--stdin"],
            deadline,
            input=b"".join(path + b"\0" for path in paths),
            ok={1: True},  # none ignored
        )
    return {path for path in out.split(b"\0") if path}


# The most the copy's .gitignore files may hold, together, for the recording to read them.
MAX_IGNORE_RULES_BYTES = 16 << 20


@contextlib.contextmanager
def _ignore_rules(copy_fd: int, rules: list[bytes], owner: RepositoryOwner) -> Iterator[int]:
    """A scratch tree holding the copy's .gitignore files ``rules`` at their paths, the
    repository owner's, under the system's temporary directory (which the owner can reach:
    /tmp is open to every user and sticky); its descriptor, for the length of the block, then
    removed. Written while its top is still the orchestrator's alone (0700, a name no one
    else can take: mkdtemp), handed to the owner only then; read from the copy by descriptor,
    no link followed. WorkspaceRefused (``workspace_too_large``) beyond
    MAX_IGNORE_RULES_BYTES."""
    ids = (
        Ownership(owner.uid, owner.gid) if owner.uid is not None and owner.gid is not None else None
    )
    scratch = tempfile.mkdtemp(prefix="reactor-fabric-ignore-")
    try:
        scratch_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            left = MAX_IGNORE_RULES_BYTES
            with (
                Directories(copy_fd) as copy,
                Directories(scratch_fd, make=True, owner=ids) as tree,
            ):
                for path in rules:
                    with opened(copy, path, MODE_FILE) as (size, chunks):
                        left -= size
                        if left < 0:
                            raise refused(
                                "the task's .gitignore files hold more than "
                                f"{MAX_IGNORE_RULES_BYTES >> 20} MiB: its changes were not "
                                "recorded",
                                WORKSPACE_TOO_LARGE,
                            )
                        write_file(tree, check_path(path), MODE_FILE, chunks, owner=ids)
            if ids is not None:
                os.chown(scratch, ids.uid, ids.gid, follow_symlinks=False)
            yield scratch_fd
        finally:
            os.close(scratch_fd)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _hash(copy: Directories, path: bytes, mode: int, algorithm: str) -> str:
    try:
        with opened(copy, path, mode) as (size, chunks):
            hasher = blob_hasher(algorithm, size)
            for chunk in chunks:
                hasher.update(chunk)
    except OSError as exc:
        raise refused(f"{path!r} of the copy could not be read: {exc}") from exc
    return hasher.hexdigest()


# --- writing the branch ----------------------------------------------------------------------


def file_data(copy: Directories, path: bytes, mode: int) -> Iterator[bytes]:
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
            assert workspace.base_entries is not None  # (settled)
            entries = (*workspace.start.values(), *workspace.base_entries.values())
            known = {entry.oid for entry in entries}
            for path, entry in sorted(final.items()):
                if entry.oid in known or entry.mode == MODE_GITLINK:
                    yield b"M %o %s %s\n" % (entry.mode, entry.oid.encode(), _quoted(path))
                else:
                    yield b"M %o inline %s\n" % (entry.mode, _quoted(path))
                    yield from file_data(copy, path, entry.mode)
    finally:
        os.close(copy_fd)


def fast_import(git: Git, chunks: Iterable[bytes], deadline: float) -> None:
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
        raise refused(f"git fast-import: exit status {status}: {(detail or [''])[0][:300]}")


def _numstat(git: Git, commit: str, deadline: float) -> tuple[int, int, int]:
    out = run_git(
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
        raise refused(f"git diff-tree: exit status {status}")
    return hasher.hexdigest()
