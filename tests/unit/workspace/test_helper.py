"""The copy helper copies half of a large copy in a process of its own: the copy is the one a
single thread makes, entry for entry; its failures, a cancellation and the bounds are the
copy's; it is never left running under a copy being removed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reactor_fabric import WorkspaceRefused
from reactor_fabric._reasons import WORKSPACE_TOO_LARGE
from reactor_fabric.workspace import Bounds, Workspace, begin, files, fill, helper, prepare
from reactor_fabric.workspace.copying import Making, copy_paths
from reactor_fabric.workspace.helper import CopyHelper
from reactor_fabric.workspace.task import remove

from .test_spare import tree_of
from .test_task import BOUNDS, git, never, owner_of, pinned

FILES = 60


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A repository of FILES files in a few directories, a link and an untracked file."""
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for index in range(FILES):
        path = repo / f"d{index % 4}" / f"e{index % 3}" / f"f{index}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {index}\n" * (index + 1))
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "link").symlink_to("run.sh")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "files")
    (repo / "untracked.txt").write_text("not committed\n")
    return repo


@contextlib.contextmanager
def started_helper(
    monkeypatch: pytest.MonkeyPatch, program: str | None = None
) -> Iterator[CopyHelper]:
    """A helper that splits copies of a few files already (``program``: run instead of the
    helper's own), closed at the block's end."""
    monkeypatch.setattr(helper, "MIN_FILES", 4)
    if program is not None:
        monkeypatch.setattr(helper, "_MAIN", program)
    started = CopyHelper()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def copy_helper(monkeypatch: pytest.MonkeyPatch) -> Iterator[CopyHelper]:
    with started_helper(monkeypatch) as started:
        assert started.wait_ready(30)
        yield started


@contextlib.contextmanager
def one_thread_copy(project: Path, directory: Path) -> Iterator[Workspace]:
    """The copy of ``project`` made without a helper (what a split copy must equal)."""
    with pinned(project) as fd:
        alone = prepare(
            fd, owner_of(project), str(directory), base=None, bounds=BOUNDS, cancelled=never
        )
    try:
        yield alone
    finally:
        remove(alone.directory)


def assert_same_copy(made: Workspace, alone: Workspace) -> None:
    """Entry for entry (mode, blob id), and file for file."""
    assert tree_of(Path(made.directory)) == tree_of(Path(alone.directory))
    assert [(p, e.mode, e.oid) for p, e in made.start.items()] == [
        (p, e.mode, e.oid) for p, e in alone.start.items()
    ]


@contextlib.contextmanager
def filled(
    project: Path,
    directory: Path,
    *,
    with_helper: CopyHelper | None,
    bounds: Bounds = BOUNDS,
    cancelled: Callable[[], bool] = never,
) -> Iterator[Workspace]:
    with pinned(project) as fd:
        begun = begin(fd, owner_of(project), str(directory), base=None, bounds=bounds)
        workspace = fill(begun, cancelled, helper=with_helper)
        try:
            yield workspace
        finally:
            remove(workspace.directory)


def helper_process(copy_helper: CopyHelper) -> subprocess.Popen[bytes] | None:
    return copy_helper._process


def test_a_copy_split_with_the_helper_is_the_copy_one_thread_makes(
    project: Path, tmp_path: Path, copy_helper: CopyHelper
) -> None:
    with (
        filled(project, tmp_path / "split", with_helper=copy_helper) as split,
        one_thread_copy(project, tmp_path / "alone") as alone,
    ):
        assert_same_copy(split, alone)
        # The stamps are the copy's own files' (what the recording compares against).
        for path, entry in split.start.items():
            info = os.lstat(Path(split.directory) / os.fsdecode(path))
            assert entry.stamp == files.stamp_of(info)
    assert helper_process(copy_helper) is not None  # (still there for the next copy)


def test_the_helper_s_half_counts_in_the_copy_s_bounds(
    project: Path, tmp_path: Path, copy_helper: CopyHelper
) -> None:
    listed = FILES + 3  # (run.sh, link, untracked.txt)
    too_few = Bounds(max_files=listed - 1, max_bytes=64 << 20, step_seconds=60)
    with (
        pytest.raises(WorkspaceRefused) as refused,
        filled(project, tmp_path / "copy", with_helper=copy_helper, bounds=too_few),
    ):
        pass
    assert refused.value.reason == WORKSPACE_TOO_LARGE
    assert not (tmp_path / "copy").exists()
    enough = Bounds(max_files=listed, max_bytes=64 << 20, step_seconds=60)
    with filled(project, tmp_path / "copy", with_helper=copy_helper, bounds=enough) as made:
        assert len(made.start) == listed


def test_a_copy_near_its_bytes_bound_with_its_large_files_on_one_side_is_made_whole_or_refused(
    project: Path, tmp_path: Path, copy_helper: CopyHelper
) -> None:
    """Each half may take half the bytes: a project within the bound whose large file is in
    the helper's half is copied again by the thread alone, within all of it; one over it is
    refused. Never more than the bound in the copies' directory."""
    (project / "untracked.txt").write_bytes(b"x" * 30_000)  # (the last path: the helper's)
    with one_thread_copy(project, tmp_path / "alone") as alone:
        total = sum(entry.stamp[1] for entry in alone.start.values() if entry.stamp is not None)
        exactly = Bounds(max_files=1000, max_bytes=total, step_seconds=60)
        with filled(project, tmp_path / "copy", with_helper=copy_helper, bounds=exactly) as made:
            assert_same_copy(made, alone)
    short = Bounds(max_files=1000, max_bytes=total - 1, step_seconds=60)
    with (
        pytest.raises(WorkspaceRefused) as refused,
        filled(project, tmp_path / "over", with_helper=copy_helper, bounds=short),
    ):
        pass
    assert refused.value.reason == WORKSPACE_TOO_LARGE
    assert not (tmp_path / "over").exists()


def test_an_unsafe_path_in_the_helper_s_half_is_refused(
    project: Path, tmp_path: Path, copy_helper: CopyHelper
) -> None:
    paths = [b"run.sh", b"link", b"d0/e0/f0.txt", b"d1/.git/config"]
    target = tmp_path / "copy"
    target.mkdir()
    with pinned(project) as source_fd, pinned(target) as target_fd:
        making = Making(target_fd, files.Budget(100, 1 << 20), None, float("inf"), never)
        with pytest.raises(WorkspaceRefused, match="cannot hold"):
            copy_paths(paths, source_fd, "sha1", making, helper=copy_helper)
    assert not (target / "d1").exists()


# A helper that dies in the middle of its half: it made some of its files, and never answers.
DYING_HELPER = """
import socket, sys
from reactor_fabric.workspace import files, helper
sock = socket.socket(fileno=int(sys.argv[1]))
helper.send_message(sock, {"ready": True})
request, (source, target) = helper.receive_message(sock, fds=2)
paths = request["paths"].encode("latin-1").split(b"\\0")[:5]
files.copy_listed(source, paths, target, algorithm="sha1", budget=files.Budget(99, 1 << 20),
                  owner=None, cancelled=lambda: False)
raise SystemExit(9)
"""


def test_a_helper_dying_mid_copy_leaves_its_half_to_the_copy_s_thread_and_a_new_one_starts(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with started_helper(monkeypatch, DYING_HELPER) as dying:
        assert dying.wait_ready(30)
        first = helper_process(dying)
        assert first is not None
        with (
            filled(project, tmp_path / "split", with_helper=dying) as split,
            one_thread_copy(project, tmp_path / "alone") as alone,
        ):
            assert_same_copy(split, alone)
        assert first.poll() is not None  # (it died — or was killed, dying — and was waited for)
        second = helper_process(dying)
        assert second is not None  # (a new one)
        assert second.pid != first.pid


def test_a_helper_still_starting_is_not_waited_for(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    never_ready = "import time; time.sleep(60)"
    with started_helper(monkeypatch, never_ready) as slow:
        with filled(project, tmp_path / "copy", with_helper=slow) as made:
            assert len(made.start) == FILES + 3  # (all of it here)
        assert not slow.wait_ready(0)


def test_a_helper_that_cannot_start_is_given_up_after_a_few_tries(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with started_helper(monkeypatch, "raise SystemExit(3)") as broken:
        for attempt in range(helper.MAX_FAILURES + 2):
            broken.wait_ready(5)  # (its end closed: it failed, and is started again)
            with filled(project, tmp_path / f"copy{attempt}", with_helper=broken) as made:
                assert len(made.start) == FILES + 3
        assert helper_process(broken) is None  # (not started again)


def test_a_helper_gone_before_it_is_asked_leaves_the_whole_copy_to_its_thread(
    project: Path, tmp_path: Path, copy_helper: CopyHelper
) -> None:
    first = helper_process(copy_helper)
    assert first is not None
    first.kill()
    first.wait()
    with filled(project, tmp_path / "copy", with_helper=copy_helper) as made:
        assert len(made.start) == FILES + 3


def test_a_cancelled_copy_kills_the_helper_and_leaves_nothing(
    project: Path, tmp_path: Path, copy_helper: CopyHelper
) -> None:
    asked = 0

    def cancelled_after_a_while() -> bool:
        nonlocal asked
        asked += 1
        return asked > 1  # (the thread's half began; the helper was asked already)

    running = helper_process(copy_helper)
    with (
        pytest.raises(InterruptedError),
        filled(
            project, tmp_path / "copy", with_helper=copy_helper, cancelled=cancelled_after_a_while
        ),
    ):
        pass
    assert not (tmp_path / "copy").exists()
    assert running is not None
    assert running.poll() is not None  # killed and waited for: nothing writes there any more
    again = helper_process(copy_helper)
    assert again is not None  # (a new one, ready for the next copy)
    assert again.poll() is None


def test_a_busy_helper_leaves_a_second_copy_to_its_own_thread(
    project: Path, tmp_path: Path, copy_helper: CopyHelper
) -> None:
    in_first = threading.Event()
    release = threading.Event()
    results: list[int] = []

    def slow() -> bool:
        in_first.set()
        release.wait(10)
        return False

    def first() -> None:
        with filled(project, tmp_path / "first", with_helper=copy_helper, cancelled=slow) as made:
            results.append(len(made.start))

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert in_first.wait(10)
        with filled(project, tmp_path / "second", with_helper=copy_helper) as made:
            assert len(made.start) == FILES + 3  # (copied here: the helper is the first's)
    finally:
        release.set()
        thread.join(10)
    assert results == [FILES + 3]


def test_a_closed_helper_is_gone_and_copies_are_made_without_it(
    project: Path, tmp_path: Path, copy_helper: CopyHelper
) -> None:
    running = helper_process(copy_helper)
    copy_helper.close()
    assert running is not None
    assert running.poll() is not None
    with filled(project, tmp_path / "copy", with_helper=copy_helper) as made:
        assert len(made.start) == FILES + 3
    assert helper_process(copy_helper) is None  # (not started again)
