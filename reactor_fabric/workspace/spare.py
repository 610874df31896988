"""A spare copy: the working tree copied ahead of a task, and brought up to date by the task
that takes it.

Why: copying a project of 10,000 files takes 250-350 ms on two cores, as long as the rest of a
container's start, and a session's tasks copy the same project again and again (implement →
review → test). Bringing a spare up to date costs git's two listings and a ``stat`` per file,
plus copying what changed since the spare was made (scripts/bench-workspace.py).

A file of the spare is kept when the project's file at its path has the very stamp it had
when it was copied (device, inode, size, modification and change times, mode; taken before it
was read) and its last change was well before the spare was begun (:data:`RACY_NS`, git's
"racily clean" rule: a write in the same tick of the file system's clock as the copy would
leave the stamp as it was). Its change time cannot be set by anyone, so such a file was not
written since. Everything else is copied again, what the working tree no longer lists is
removed, with the directories no listed path needs: the result is the copy :func:`~.copying.
fill` would make, entry for entry (tested against it).

A spare lives only in the orchestrator's own area (root's, 0700): no container saw it before
a task takes it. Blocking, in a worker thread; ``cancelled`` is polled between files; on
failure the directory is removed before the error goes up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .copying import (
    Begun,
    Listings,
    Making,
    copy_paths,
    finished,
    opened_target,
    read_listings,
    too_large,
    wanted,
)
from .files import (
    CANCEL_EVERY,
    Directories,
    Entry,
    SourceStamp,
    TooLarge,
    source_stamp,
)
from .task import Cancelled, Workspace, remove

# A file changed less than this before the spare was begun is copied again whatever its stamp.
RACY_NS = 2_000_000_000
_CTIME = 4  # (SourceStamp's change time)


@dataclass(frozen=True)
class Spare:
    """A spare copy of the working tree: its directory, its files' entries, the stamps their
    sources had, when it was begun (``time.time_ns()``, before git listed anything), and what
    git listed then (the tree of HEAD then, read again only if HEAD moved)."""

    directory: str
    entries: dict[bytes, Entry] = field(repr=False)
    sources: dict[bytes, SourceStamp] = field(repr=False)
    begun_ns: int
    listings: Listings = field(repr=False)
    algorithm: str = "sha1"  # the repository's object format (its entries' blob ids)

    @property
    def size(self) -> int:
        """The bytes of its files (what it holds of the memory of the copies' directory)."""
        return sum(entry.stamp[1] for entry in self.entries.values() if entry.stamp is not None)


def make_spare(begun: Begun, cancelled: Cancelled) -> Spare:
    """Copy the working tree into ``begun``'s directory (no base: a spare is of the working
    tree), recording its sources' stamps, and read HEAD's tree (made ahead of any task: the
    task that takes it reads that tree only if HEAD moved). Nothing is written into the
    repository: the task that takes it holds its blobs (:func:`refresh`)."""
    if begun.base is not None:
        raise ValueError("a spare copy is of the working tree, not of a base")
    try:
        begun_ns = time.time_ns()
        listings = read_listings(begun)
        assert listings.working_tree is not None  # (no base)
        paths, _submodules, _staged = wanted(*listings.working_tree)
        sources: dict[bytes, SourceStamp] = {}
        with opened_target(begun) as target_fd:
            making = Making(target_fd, begun.budget(), begun.copy_owner, begun.deadline, cancelled)
            entries = copy_paths(paths, begun.project_fd, begun.algorithm, making, sources)
    except BaseException:
        remove(begun.directory)
        raise
    return Spare(begun.directory, entries, sources, begun_ns, listings, begun.algorithm)


def refresh(begun: Begun, spare: Spare, cancelled: Cancelled) -> Workspace:
    """The workspace of a task whose copy is ``spare``, moved to ``begun``'s directory
    (:func:`~.copying.begin` with ``spare=``) and brought up to the working tree as the
    client has it now; what :func:`~.copying.fill` returns, for a copy made faster."""
    try:
        known = spare.listings if spare.algorithm == begun.algorithm else None
        # (HEAD's tree: the spare's when HEAD did not move, else read by settle())
        listings = read_listings(begun, known=known, tree=False)
        assert listings.working_tree is not None  # (no base)
        paths, submodules, staged = wanted(*listings.working_tree)
        with opened_target(begun) as target_fd:
            making = Making(target_fd, begun.budget(), begun.copy_owner, begun.deadline, cancelled)
            # (a spare of a repository in another object format — its project's directory
            # removed, another made with the same inode — keeps nothing: its ids are not ids)
            same_format = spare.algorithm == begun.algorithm
            kept = _unchanged(begun.project_fd, paths, spare, making) if same_format else {}
            _clear(target_fd, spare.entries, kept)
            copied = copy_paths(
                (path for path in paths if path not in kept),
                begun.project_fd,
                begun.algorithm,
                making,
            )
        start: dict[bytes, Entry] = {}
        for path in paths:  # (in git's order, as fill's)
            entry = kept.get(path) or copied.get(path)
            if entry is not None:
                start[path] = entry
        return finished(begun, listings, start | submodules, staged)
    except BaseException:
        remove(begun.directory)
        raise


def _unchanged(
    project_fd: int, paths: Iterable[bytes], spare: Spare, making: Making
) -> dict[bytes, Entry]:
    """The spare's entries of ``paths`` whose source is as it was copied, counted in the
    copy's budget."""
    threshold = spare.begun_ns - RACY_NS
    kept: dict[bytes, Entry] = {}
    with Directories(project_fd) as sources:
        for index, path in enumerate(paths):
            if not index % CANCEL_EVERY and making.cancelled():
                raise InterruptedError("cancelled")
            recorded = spare.sources.get(path)
            if recorded is None or recorded[_CTIME] >= threshold:
                continue
            parts = path.split(b"/")  # (a path of the spare's: checked when it was copied)
            parent = sources.get(parts)
            if parent is None:
                continue
            try:
                info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            except OSError:
                continue
            if source_stamp(info) != recorded:
                continue
            try:
                making.budget.take(info.st_size)
            except TooLarge as exc:
                raise too_large(exc, making.budget) from exc
            kept[path] = spare.entries[path]
    return kept


def _clear(target_fd: int, entries: dict[bytes, Entry], kept: dict[bytes, Entry]) -> None:
    """Remove from the copy the spare's files not kept, then the directories no kept file is
    in, deepest first (the copy makes again those it needs: a directory may have become a
    file, or a file a directory)."""
    stale = [path for path in entries if path not in kept]
    if not stale:
        return
    needed = _with_ancestors({path.rpartition(b"/")[0] for path in kept})
    unneeded = _with_ancestors({path.rpartition(b"/")[0] for path in stale}) - needed
    with Directories(target_fd) as copy:
        for path in stale:
            parts = path.split(b"/")  # (the spare's own paths: checked when it was made)
            parent = copy.get(parts)
            assert parent is not None  # the spare's: nothing else changed it
            os.unlink(parts[-1], dir_fd=parent)
        for directory in sorted(unneeded, key=lambda d: d.count(b"/"), reverse=True):
            parts = directory.split(b"/")
            parent = copy.get(parts)
            assert parent is not None
            os.rmdir(parts[-1], dir_fd=parent)


def _with_ancestors(directories: set[bytes]) -> set[bytes]:
    """``directories`` (``b""``: the top, left out) and every directory above them: of
    ``a/b/c``, ``a/b`` and ``a``."""
    found: set[bytes] = set()
    for directory in directories:
        step = directory
        while step and step not in found:
            found.add(step)
            step = step.rpartition(b"/")[0]
    return found
