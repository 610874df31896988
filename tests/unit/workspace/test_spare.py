"""A spare copy brought up to date is the copy a task would have had without it: entry for entry,
byte for byte, directory for directory — whatever the client did to the project between the
spare and the task — and a file is kept from the spare only when nothing could have written it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reactor_fabric import WorkspaceRefused
from reactor_fabric._reasons import WORKSPACE_TOO_LARGE
from reactor_fabric.workspace import Bounds, Workspace, begin, files, prepare, record
from reactor_fabric.workspace.spare import RACY_NS, Spare, make_spare, refresh
from reactor_fabric.workspace.task import remove, settle

from .test_task import BOUNDS, BRANCH, FACTS, git, never, owner_of, pinned, repo, show

__all__ = ["repo"]  # (the fixture, from test_task)


def spare_of(project: Path, directory: Path, *, aged: bool = True) -> Spare:
    """A spare of ``project`` at ``directory``; ``aged``: as if made long after its files
    last changed (a test's files are seconds old: every one of them would be racy)."""
    with pinned(project) as fd:
        begun = begin(fd, owner_of(project), str(directory), base=None, bounds=BOUNDS)
        spare = make_spare(begun, never)
    return dataclasses.replace(spare, begun_ns=spare.begun_ns + 10 * RACY_NS) if aged else spare


@contextlib.contextmanager
def refreshed(
    project: Path,
    spare: Spare,
    directory: Path,
    *,
    bounds: Bounds = BOUNDS,
    cancelled: Callable[[], bool] = never,
) -> Iterator[Workspace]:
    with pinned(project) as fd:
        begun = begin(
            fd, owner_of(project), str(directory), base=None, bounds=bounds, spare=spare.directory
        )
        workspace = refresh(begun, spare, cancelled)
        try:
            settle(workspace, bounds=bounds, cancelled=cancelled)
            yield workspace
        finally:
            remove(workspace.directory)


@contextlib.contextmanager
def fresh(project: Path, directory: Path) -> Iterator[Workspace]:
    with pinned(project) as fd:
        workspace = prepare(
            fd, owner_of(project), str(directory), base=None, bounds=BOUNDS, cancelled=never
        )
        try:
            yield workspace
        finally:
            remove(workspace.directory)


def tree_of(directory: Path) -> dict[str, object]:
    """Every path below ``directory``: a file's bytes and executable bit, a link's text, or
    ``"dir"`` (so an empty directory left behind counts)."""
    found: dict[str, object] = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_symlink():
            found[name] = ("link", os.readlink(path))
        elif path.is_dir():
            found[name] = "dir"
        else:
            found[name] = (path.read_bytes(), os.access(path, os.X_OK))
    return found


def inode(path: Path) -> int:
    return os.lstat(path).st_ino


def _edit_keeping_size_and_mtime(project: Path) -> None:
    target = project / "README.md"
    before = target.stat()
    target.write_text("HELLO\n")  # (same size)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))


def _file_becomes_directory(project: Path) -> None:
    (project / "README.md").unlink()
    (project / "README.md").mkdir()
    (project / "README.md" / "part.md").write_text("now a directory\n")


def _directory_becomes_file(project: Path) -> None:
    shutil.rmtree(project / "src")
    (project / "src").write_text("now a file\n")


def _link_retargeted(project: Path) -> None:
    (project / "link").unlink()
    (project / "link").symlink_to("run.sh")


def _newly_ignored(project: Path) -> None:
    (project / ".gitignore").write_text("build/\n*.log\nnotes.txt\n")


def _head_moved(project: Path) -> None:
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "the working tree, committed")


def _directory_for_a_link(project: Path) -> None:
    os.rename(project / "src", project.parent / "src-elsewhere")
    (project / "src").symlink_to(project.parent / "src-elsewhere")


CHANGES: dict[str, Callable[[Path], object]] = {
    "nothing": lambda project: None,
    "an edit of the same size with its mtime put back": _edit_keeping_size_and_mtime,
    "a file deleted": lambda project: (project / "run.sh").unlink(),
    "a new untracked file": lambda project: (project / "src" / "new.py").write_text("new\n"),
    "a file newly ignored": _newly_ignored,
    "a file made executable": lambda project: (project / "README.md").chmod(0o755),
    "a file that became a directory": _file_becomes_directory,
    "a directory that became a file": _directory_becomes_file,
    "a symlink pointed elsewhere": _link_retargeted,
    "HEAD moved": _head_moved,
    "a directory swapped for a link to it": _directory_for_a_link,
    "a file staged and changed again": lambda project: (
        (project / "notes.txt").write_text("staged\n"),
        git(project, "add", "notes.txt"),
        (project / "notes.txt").write_text("changed after staging\n"),
    ),
}


@pytest.fixture
def project(repo: Path) -> Path:
    """The fixture's repository with uncommitted work of each kind and a symlink."""
    (repo / "README.md").write_text("hello, uncommitted\n")
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "deep").mkdir()
    (repo / "docs" / "deep" / "guide.md").write_text("guide\n")
    (repo / "link").symlink_to("README.md")
    (repo / "debug.log").write_text("ignored\n")
    return repo


@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_a_refreshed_spare_is_the_copy_a_fresh_one_would_be(
    project: Path, tmp_path: Path, change: str
) -> None:
    spare = spare_of(project, tmp_path / "spare")
    CHANGES[change](project)
    with (
        refreshed(project, spare, tmp_path / "task") as taken,
        fresh(project, tmp_path / "fresh") as made,
    ):
        assert tree_of(Path(taken.directory)) == tree_of(Path(made.directory))
        assert [(p, e.mode, e.oid) for p, e in taken.start.items()] == [
            (p, e.mode, e.oid) for p, e in made.start.items()
        ]
        assert (taken.base, taken.base_entries) == (made.base, made.base_entries)
        assert not (tmp_path / "spare").exists()  # (moved: it is the task's copy)


def test_what_did_not_change_is_kept_from_the_spare_and_what_changed_is_copied_again(
    project: Path, tmp_path: Path
) -> None:
    spare = spare_of(project, tmp_path / "spare")
    before = {name: inode(tmp_path / "spare" / name) for name in ("docs/deep/guide.md", "link")}
    _edit_keeping_size_and_mtime(project)
    with refreshed(project, spare, tmp_path / "task") as taken:
        copy = Path(taken.directory)
        assert {name: inode(copy / name) for name in before} == before  # the spare's own files
        assert (copy / "README.md").read_text() == "HELLO\n"


def test_a_spare_of_another_object_format_keeps_nothing_and_is_still_the_fresh_copy(
    project: Path, tmp_path: Path
) -> None:
    """A spare kept after its session is found by the project's device and inode: should the
    project be removed and another repository, in sha256, made there with the same inode, the
    spare's blob ids are not this repository's: every file is copied again."""
    spare = spare_of(project, tmp_path / "spare")
    foreign = dataclasses.replace(spare, algorithm="sha256")
    with (
        refreshed(project, foreign, tmp_path / "task") as taken,
        fresh(project, tmp_path / "fresh") as made,
    ):
        # Copied again (its times are the new copy's; its inode may be the old one's again).
        assert all(taken.start[path].stamp != entry.stamp for path, entry in spare.entries.items())
        assert tree_of(Path(taken.directory)) == tree_of(Path(made.directory))
        assert [(p, e.mode, e.oid) for p, e in taken.start.items()] == [
            (p, e.mode, e.oid) for p, e in made.start.items()
        ]


def test_a_spare_s_size_is_its_files_bytes(project: Path, tmp_path: Path) -> None:
    spare = spare_of(project, tmp_path / "spare")
    on_disk = sum(
        os.lstat(path).st_size for path in (tmp_path / "spare").rglob("*") if not path.is_dir()
    )
    assert spare.size == on_disk > 0


def test_a_file_changed_just_before_the_spare_was_made_is_copied_again_whatever_its_stamp(
    project: Path, tmp_path: Path
) -> None:
    """git's "racily clean" case: a write in the same tick of the file system's clock as the
    copy leaves the file's stamp as it was recorded. Forged here (the stamp recorded is the
    one after the write): a spare begun within RACY_NS of the file's last change does not
    trust it."""
    spare = spare_of(project, tmp_path / "spare", aged=False)
    (project / "README.md").write_text("written in the same tick\n")
    forged = dict(spare.sources)
    forged[b"README.md"] = files.source_stamp(os.lstat(project / "README.md"))
    with refreshed(project, dataclasses.replace(spare, sources=forged), tmp_path / "task") as taken:
        assert (Path(taken.directory) / "README.md").read_text() == "written in the same tick\n"


def test_the_uncommitted_work_a_refreshed_copy_starts_from_is_on_the_task_s_branch(
    project: Path, tmp_path: Path
) -> None:
    """The spare wrote nothing into the repository; the task that takes it writes the blobs
    of its starting point (the client may have changed them since the spare was made)."""
    spare = spare_of(project, tmp_path / "spare")
    (project / "notes.txt").write_text("changed after the spare\n")
    with refreshed(project, spare, tmp_path / "task") as taken:
        (Path(taken.directory) / "src" / "app.py").write_text("print('task')\n")
        result = record(taken, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert result.working_tree_commit is not None
    assert show(project, result.working_tree_commit, "notes.txt") == "changed after the spare\n"
    assert show(project, result.working_tree_commit, "README.md") == "hello, uncommitted\n"
    assert show(project, BRANCH, "src/app.py") == "print('task')\n"


def test_a_project_grown_over_the_bounds_is_refused_and_the_spare_removed(
    project: Path, tmp_path: Path
) -> None:
    spare = spare_of(project, tmp_path / "spare")
    (project / "big.txt").write_bytes(b"x" * 4096)
    small = dataclasses.replace(BOUNDS, max_bytes=4096)
    with (
        pytest.raises(WorkspaceRefused) as refused,
        refreshed(project, spare, tmp_path / "task", bounds=small),
    ):
        pass
    assert refused.value.reason == WORKSPACE_TOO_LARGE
    assert not (tmp_path / "task").exists()
    assert not (tmp_path / "spare").exists()


def test_a_cancelled_refresh_stops_and_leaves_nothing_behind(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spare = spare_of(project, tmp_path / "spare")
    monkeypatch.setattr(files, "CANCEL_EVERY", 1)
    monkeypatch.setattr("reactor_fabric.workspace.spare.CANCEL_EVERY", 1)
    with (
        pytest.raises(InterruptedError),
        refreshed(project, spare, tmp_path / "task", cancelled=lambda: True),
    ):
        pass
    assert not (tmp_path / "task").exists()


def test_a_cancelled_spare_leaves_nothing_behind(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "CANCEL_EVERY", 1)
    with pinned(project) as fd:
        begun = begin(fd, owner_of(project), str(tmp_path / "spare"), base=None, bounds=BOUNDS)
        with pytest.raises(InterruptedError):
            make_spare(begun, lambda: True)
    assert not (tmp_path / "spare").exists()


def test_a_spare_is_of_the_working_tree_never_of_a_base(project: Path, tmp_path: Path) -> None:
    spare = spare_of(project, tmp_path / "spare")
    with pinned(project) as fd, pytest.raises(ValueError, match="not of a base"):
        begin(
            fd,
            owner_of(project),
            str(tmp_path / "task"),
            base="feature",
            bounds=BOUNDS,
            spare=spare.directory,
        )
    assert (tmp_path / "spare").exists()  # (untouched: its owner removes it)
