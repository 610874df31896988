"""The copy's primitives: which paths a work tree may hold, blob ids as git computes them, and a
file copied while it changes."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from reactor_fabric.workspace import files
from reactor_fabric.workspace.files import (
    MAX_DEPTH,
    MAX_PATH_BYTES,
    UnsafePath,
    blob_id,
    check_path,
)


@pytest.mark.parametrize(
    "path",
    [
        b"",
        b"/etc/passwd",
        b"a//b",
        b"a/",
        b"./a",
        b"a/./b",
        b"../a",
        b"a/../../b",
        b"..",
        b".git",
        b".git/config",
        b"a/.git/hooks/pre-commit",
        b"a/.GIT/config",
        b"a/.Git",
        b"a\0b",
        b"x" * (MAX_PATH_BYTES + 1),
        b"/".join([b"d"] * (MAX_DEPTH + 1)),
    ],
)
def test_a_path_that_could_leave_the_tree_or_reach_a_git_directory_is_refused(path: bytes) -> None:
    with pytest.raises(UnsafePath):
        check_path(path)


@pytest.mark.parametrize(
    "path",
    [
        b"a",
        b".gitignore",
        b"src/.gitattributes",
        b".github/workflows/ci.yml",
        b"x.git/y",
        b"a/.git.bak",
        b"..a/b...",
        b"/".join([b"d"] * MAX_DEPTH),
    ],
)
def test_a_path_a_work_tree_may_hold_is_split_into_its_components(path: bytes) -> None:
    assert check_path(path) == path.split(b"/")


@pytest.mark.parametrize("algorithm", ["sha1", "sha256"])
def test_a_blob_id_is_the_one_git_computes(algorithm: str, tmp_path: Path) -> None:
    data = b"hello\n" * 1000 + b"\0binary"
    (tmp_path / "f").write_bytes(data)
    flags = [] if algorithm == "sha1" else ["--object-format=sha256"]
    subprocess.run(["git", "init", "-q", *flags, str(tmp_path / "r")], check=True)
    out = subprocess.run(
        ["git", "-C", str(tmp_path / "r"), "hash-object", str(tmp_path / "f")],
        check=True,
        capture_output=True,
    )
    assert blob_id(algorithm, data) == out.stdout.decode().strip()


def test_a_file_that_shrinks_while_it_is_copied_is_copied_again_with_its_new_size(
    tmp_path: Path,
) -> None:
    # As if it had been 100 bytes longer when opened: the first pass ends short, the second
    # starts again from the start of both files.
    data = b"0123456789" * 50
    (tmp_path / "source").write_bytes(data)
    source = os.open(tmp_path / "source", os.O_RDONLY)
    target = os.open(tmp_path / "target", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        oid = files._copy_content(source, target, "sha1", len(data) + 100)
    finally:
        os.close(source)
        os.close(target)
    assert (tmp_path / "target").read_bytes() == data
    assert oid == blob_id("sha1", data)


def test_a_file_that_keeps_changing_is_not_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every pass ends short (its size read again is always larger than what can be read).
    (tmp_path / "source").write_bytes(b"x" * 10)
    monkeypatch.setattr(os, "fstat", lambda _fd: os.stat_result((0,) * 6 + (1000,) + (0,) * 3))
    source = os.open(tmp_path / "source", os.O_RDONLY)
    target = os.open(tmp_path / "target", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="kept changing") as caught:
            files._copy_content(source, target, "sha1", 1000)
    finally:
        os.close(source)
        os.close(target)
    assert caught.value.errno == errno.EAGAIN


def test_a_copy_asks_whether_it_was_cancelled_as_it_goes_and_stops_when_it_was(
    tmp_path: Path,
) -> None:
    (tmp_path / "source").mkdir()
    (tmp_path / "target").mkdir()
    paths = []
    for index in range(100):
        (tmp_path / "source" / f"f{index}").write_bytes(b"x" * index)
        paths.append(f"f{index}".encode())
    asked = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) > 2

    source = os.open(tmp_path / "source", os.O_PATH | os.O_DIRECTORY)
    target = os.open(tmp_path / "target", os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(InterruptedError):
            files.copy_listed(
                source,
                paths,
                target,
                algorithm="sha1",
                budget=files.Budget(1000, 1 << 20),
                owner=None,
                cancelled=cancelled,
            )
    finally:
        os.close(source)
        os.close(target)
    # Asked before the first file and every CANCEL_EVERY files: cancelled at the third time.
    assert len(list((tmp_path / "target").iterdir())) == 2 * files.CANCEL_EVERY
