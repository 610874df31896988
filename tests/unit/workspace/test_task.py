"""A task's workspace on a real git repository: the copy it starts on, the branch its work
becomes, and the client's repository untouched by both — also when the repository's own
configuration, or the task, tries to make the orchestrator run something or read something."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reactor_fabric import WorkspaceRefused
from reactor_fabric._reasons import (
    WORKSPACE_BASE_UNKNOWN,
    WORKSPACE_NOT_A_REPOSITORY,
    WORKSPACE_TOO_LARGE,
)
from reactor_fabric.workspace import (
    Bounds,
    TaskFacts,
    Workspace,
    begin,
    copying,
    files,
    fill,
    prepare,
    record,
)
from reactor_fabric.workspace.task import remove, settle

BOUNDS = Bounds(max_files=10_000, max_bytes=64 << 20, step_seconds=60)
FACTS = TaskFacts(
    service="reviewer", task="Fix the greeting", session="s-1", call="7", trace="t" * 32
)
BRANCH = "reactor-fabric/reviewer/20261129T080000Z-abc123"


def git(repo: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=check,
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(repo.parent),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "Client",
            "GIT_AUTHOR_EMAIL": "client@example.com",
            "GIT_COMMITTER_NAME": "Client",
            "GIT_COMMITTER_EMAIL": "client@example.com",
        },
    )
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with two commits, a branch, an ignore rule and uncommitted work."""
    project = tmp_path / "project"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    (project / "README.md").write_text("hello\n")
    (project / "run.sh").write_text("#!/bin/sh\necho run\n")
    (project / "run.sh").chmod(0o755)
    (project / ".gitignore").write_text("build/\n*.log\n")
    (project / "src").mkdir()
    (project / "src" / "app.py").write_text("print('hi')\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "first")
    git(project, "branch", "feature")
    (project / "src" / "app.py").write_text("print('hello')\n")
    git(project, "commit", "-q", "-am", "second")
    return project


@contextlib.contextmanager
def pinned(project: Path) -> Iterator[int]:
    fd = os.open(project, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        yield fd
    finally:
        os.close(fd)


def owner_of(project: Path) -> tuple[int, int]:
    info = project.stat()
    return info.st_uid, info.st_gid


def never() -> bool:
    return False


@contextlib.contextmanager
def workspace_of(
    project: Path, tmp_path: Path, *, base: str | None = None, bounds: Bounds = BOUNDS
) -> Iterator[Workspace]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    with pinned(project) as fd:
        workspace = prepare(
            fd,
            owner_of(project),
            str(tmp_path / "copy"),
            base=base,
            bounds=bounds,
            cancelled=never,
        )
        try:
            yield workspace
        finally:
            remove(workspace.directory)


def state_of(project: Path) -> dict[str, object]:
    """What the task must never change: HEAD, the index, the refs, the working tree."""
    return {
        "head": (project / ".git" / "HEAD").read_text(),
        "index": (project / ".git" / "index").read_bytes(),
        "refs": git(project, "for-each-ref", "--format=%(refname) %(objectname)"),
        "tree": {
            str(p.relative_to(project)): p.read_bytes() if p.is_file() else None
            for p in sorted(project.rglob("*"))
            if ".git" not in p.relative_to(project).parts
        },
    }


def files_of(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): (
            os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
        )
        for p in sorted(directory.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


def show(project: Path, revision: str, path: str) -> str:
    return git(project, "show", f"{revision}:{path}")


def test_the_copy_is_the_working_tree_as_the_client_has_it_without_ignored_files_or_git(
    repo: Path, tmp_path: Path
) -> None:
    (repo / "README.md").write_text("hello, uncommitted\n")
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.bin").write_bytes(b"\0" * 10)
    (repo / "debug.log").write_text("noise\n")
    with workspace_of(repo, tmp_path) as workspace:
        copy = Path(workspace.directory)
        assert files_of(copy) == {
            ".gitignore": b"build/\n*.log\n",
            "README.md": b"hello, uncommitted\n",
            "notes.txt": b"untracked\n",
            "run.sh": b"#!/bin/sh\necho run\n",
            "src/app.py": b"print('hello')\n",
        }
        assert not (copy / ".git").exists()
        assert (copy / "run.sh").stat().st_mode & stat.S_IXUSR
        assert workspace.base == git(repo, "rev-parse", "HEAD").strip()
        assert not workspace.start_is_base


def test_a_task_that_changes_nothing_leaves_no_branch_and_the_repository_as_it_was(
    repo: Path, tmp_path: Path
) -> None:
    (repo / "README.md").write_text("uncommitted\n")
    before = state_of(repo)
    with workspace_of(repo, tmp_path) as workspace:
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert (result.branch, result.commit) == (None, None)
    assert state_of(repo) == before


def test_the_task_s_work_is_a_commit_on_a_new_branch_over_one_of_the_uncommitted_state(
    repo: Path, tmp_path: Path
) -> None:
    (repo / "README.md").write_text("hello, uncommitted\n")
    (repo / "notes.txt").write_text("untracked\n")
    before = state_of(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    with workspace_of(repo, tmp_path) as workspace:
        copy = Path(workspace.directory)
        (copy / "src" / "app.py").write_text("print('changed by the task')\n")
        (copy / "src" / "new.py").write_text("x = 1\n")
        (copy / "run.sh").unlink()
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert result.branch == BRANCH
    assert result.base == head
    assert git(repo, "rev-parse", BRANCH).strip() == result.commit
    # The first commit: the working tree as the client had it, on top of HEAD.
    assert result.working_tree_commit == git(repo, "rev-parse", f"{BRANCH}^").strip()
    assert git(repo, "rev-parse", f"{BRANCH}^^").strip() == head
    assert show(repo, f"{BRANCH}^", "README.md") == "hello, uncommitted\n"
    assert show(repo, f"{BRANCH}^", "notes.txt") == "untracked\n"
    # The second: the task's changes only.
    changed = git(repo, "diff", "--name-status", f"{BRANCH}^", BRANCH).split("\n")
    assert sorted(filter(None, changed)) == ["A\tsrc/new.py", "D\trun.sh", "M\tsrc/app.py"]
    assert (result.files_changed, result.insertions, result.deletions) == (3, 2, 3)
    message = git(repo, "log", "-1", "--format=%B", BRANCH)
    assert message.startswith("reviewer: Fix the greeting\n")
    assert "Reactor-Fabric-Session: s-1\n" in message
    assert "Reactor-Fabric-Call: 7\n" in message
    patch = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
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
            BRANCH,
        ],
        capture_output=True,
        check=True,
    ).stdout

    assert result.diff_sha256 == hashlib.sha256(patch).hexdigest()
    # HEAD, the index, the working tree and every other ref: as they were.
    after = state_of(repo)
    refs_after = after.pop("refs")
    refs_before = before.pop("refs")
    assert after == before
    assert str(refs_after).replace(f"refs/heads/{BRANCH} {result.commit}\n", "") == refs_before


@contextlib.contextmanager
def filled(project: Path, tmp_path: Path) -> Iterator[Workspace]:
    """A task's copy as its container gets it: filled, not settled yet."""
    with pinned(project) as fd:
        begun = begin(fd, owner_of(project), str(tmp_path / "copy"), base=None, bounds=BOUNDS)
        workspace = fill(begun, never)
        try:
            yield workspace
        finally:
            remove(workspace.directory)


def has_object(repo: Path, oid: str) -> bool:
    found = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", oid], check=False)
    return found.returncode == 0


def test_the_uncommitted_work_is_recorded_as_copied_though_the_task_changed_it_before_settling(
    repo: Path, tmp_path: Path
) -> None:
    (repo / "README.md").write_text("hello, uncommitted\n")
    (repo / "notes.txt").write_text("untracked\n")
    with filled(repo, tmp_path) as workspace:
        # The start waits for neither the base's tree nor the blobs: they are held.
        assert (workspace.base_entries, workspace.settled) == (None, False)
        uncommitted = workspace.start[b"README.md"].oid
        assert not has_object(repo, uncommitted)
        copy = Path(workspace.directory)
        (copy / "README.md").write_text("rewritten by the task at once\n")
        (copy / "notes.txt").unlink()
        settle(workspace, bounds=BOUNDS, cancelled=never)
        assert workspace.settled
        assert has_object(repo, uncommitted)
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert show(repo, f"{BRANCH}^", "README.md") == "hello, uncommitted\n"
    assert show(repo, f"{BRANCH}^", "notes.txt") == "untracked\n"
    assert show(repo, BRANCH, "README.md") == "rewritten by the task at once\n"
    assert "notes.txt" not in git(repo, "ls-tree", "--name-only", BRANCH)
    assert result.working_tree_commit is not None


def test_a_recording_settles_what_was_not_settled(repo: Path, tmp_path: Path) -> None:
    (repo / "README.md").write_text("hello, uncommitted\n")
    with filled(repo, tmp_path) as workspace:
        (Path(workspace.directory) / "README.md").write_text("the task's\n")
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert show(repo, f"{BRANCH}^", "README.md") == "hello, uncommitted\n"
    assert show(repo, BRANCH, "README.md") == "the task's\n"
    assert result.files_changed == 1


def test_uncommitted_blobs_over_what_may_be_held_are_written_before_the_task_starts(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(copying, "HELD_BYTES", 10)
    (repo / "README.md").write_text("more than ten bytes, uncommitted\n")
    with filled(repo, tmp_path) as workspace:
        assert workspace.held == []
        assert has_object(repo, workspace.start[b"README.md"].oid)
        (Path(workspace.directory) / "README.md").write_text("the task's\n")
        record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert show(repo, f"{BRANCH}^", "README.md") == "more than ten bytes, uncommitted\n"


def test_blobs_the_index_holds_are_not_held_and_an_intent_to_add_empty_file_is(
    repo: Path, tmp_path: Path
) -> None:
    (repo / "notes.txt").write_text("staged\n")
    git(repo, "add", "notes.txt")
    (repo / "empty.txt").write_text("")
    git(repo, "add", "-N", "empty.txt")
    for loose in (repo / ".git" / "objects").glob("e6/9de29bb2d1d6434b8b29ae775ad8c2e48c5391"):
        loose.unlink()  # (git add -N may write the empty blob, and need not)
    with filled(repo, tmp_path) as workspace:
        held = b"".join(workspace.held)
        assert b"staged\n" not in held  # (in the repository: git add wrote it)
        assert held.count(b"blob\n") == 1  # the empty blob, all the same
        (Path(workspace.directory) / "notes.txt").write_text("the task's\n")
        record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert show(repo, f"{BRANCH}^", "notes.txt") == "staged\n"
    assert show(repo, f"{BRANCH}^", "empty.txt") == ""
    assert show(repo, BRANCH, "notes.txt") == "the task's\n"


def test_a_clean_working_tree_gives_one_commit_on_top_of_head(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    with workspace_of(repo, tmp_path) as workspace:
        assert workspace.start_is_base
        (Path(workspace.directory) / "README.md").write_text("edited\n")
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert result.working_tree_commit is None
    assert git(repo, "rev-parse", f"{BRANCH}^").strip() == head
    assert (result.files_changed, result.insertions, result.deletions) == (1, 1, 1)


def test_a_task_on_a_base_starts_from_that_branch_and_its_commit_sits_on_it(
    repo: Path, tmp_path: Path
) -> None:
    (repo / "README.md").write_text("uncommitted, not for this task\n")
    feature = git(repo, "rev-parse", "feature").strip()
    with workspace_of(repo, tmp_path, base="feature") as workspace:
        copy = Path(workspace.directory)
        assert (copy / "src" / "app.py").read_text() == "print('hi')\n"  # feature's
        assert (copy / "README.md").read_text() == "hello\n"
        assert (copy / "run.sh").stat().st_mode & stat.S_IXUSR
        (copy / "src" / "app.py").write_text("print('on feature')\n")
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert result.base == feature
    assert git(repo, "rev-parse", f"{BRANCH}^").strip() == feature
    assert show(repo, BRANCH, "src/app.py") == "print('on feature')\n"


@pytest.mark.parametrize(
    "base", ["nope", "-c", "--output=/tmp/x", "main..feature", "HEAD@{1}", "main^", "a b", ""]
)
def test_a_base_that_names_no_branch_or_is_not_a_plain_name_is_refused(
    repo: Path, tmp_path: Path, base: str
) -> None:
    with pytest.raises(WorkspaceRefused) as refused, workspace_of(repo, tmp_path, base=base):
        pass
    assert refused.value.reason == WORKSPACE_BASE_UNKNOWN
    assert not (tmp_path / "copy").exists()


def test_a_project_that_is_not_a_repository_is_refused_with_what_to_do(tmp_path: Path) -> None:
    project = tmp_path / "plain"
    project.mkdir()
    (project / "a.txt").write_text("a\n")
    with pytest.raises(WorkspaceRefused) as refused, workspace_of(project, tmp_path):
        pass
    assert refused.value.reason == WORKSPACE_NOT_A_REPOSITORY
    assert "workspace: shared" in str(refused.value)
    assert "git init" in str(refused.value)


def test_a_subdirectory_of_a_repository_is_not_a_repository_of_its_own(
    repo: Path, tmp_path: Path
) -> None:
    with pytest.raises(WorkspaceRefused) as refused, workspace_of(repo / "src", tmp_path):
        pass
    assert refused.value.reason == WORKSPACE_NOT_A_REPOSITORY


@pytest.mark.parametrize(
    ("bounds", "what"),
    [
        (Bounds(max_files=3, max_bytes=1 << 20), "files"),
        (Bounds(max_files=99, max_bytes=20), "bytes"),
    ],
)
def test_a_project_over_the_bounds_is_refused_and_nothing_is_left_behind(
    repo: Path, tmp_path: Path, bounds: Bounds, what: str
) -> None:
    with pytest.raises(WorkspaceRefused) as refused, workspace_of(repo, tmp_path, bounds=bounds):
        pass
    assert refused.value.reason == WORKSPACE_TOO_LARGE
    assert f"more {what}" in str(refused.value)
    assert not (tmp_path / "copy").exists()


def test_a_cancelled_copy_stops_and_leaves_nothing_behind(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "CANCEL_EVERY", 1)  # (the fixture's project has a few files)
    asked = 0

    def cancelled() -> bool:
        nonlocal asked
        asked += 1
        return asked > 2

    with pinned(repo) as fd, pytest.raises(InterruptedError):
        prepare(
            fd,
            owner_of(repo),
            str(tmp_path / "copy"),
            base=None,
            bounds=BOUNDS,
            cancelled=cancelled,
        )
    assert not (tmp_path / "copy").exists()


# --- the repository's configuration never runs --------------------------------------------


def plant_programs(repo: Path, marker: Path) -> None:
    """Every program a repository's configuration can name, each leaving ``marker`` if run."""
    script = repo.parent / "evil.sh"
    script.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\ncat\n')
    script.chmod(0o755)
    hooks = repo / ".git" / "hooks"
    for hook in (
        "reference-transaction",
        "post-commit",
        "pre-commit",
        "post-checkout",
        "pre-auto-gc",
        "post-index-change",
    ):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    included = repo.parent / "included.gitconfig"
    included.write_text(f"[core]\n\tfsmonitor = {script}\n")
    for key, value in [
        ("core.fsmonitor", str(script)),
        ("core.hooksPath", str(hooks)),
        ("filter.evil.clean", str(script)),
        ("filter.evil.smudge", str(script)),
        ("filter.evil.process", str(script)),
        ("filter.evil.required", "true"),
        ("diff.evil.textconv", str(script)),
        ("diff.evil.command", str(script)),
        ("diff.external", str(script)),
        ("core.pager", str(script)),
        ("gpg.program", str(script)),
        ("commit.gpgSign", "true"),
        ("core.alternateRefsCommand", str(script)),
        ("include.path", str(included)),
        ("gc.auto", "1"),
    ]:
        git(repo, "config", key, value)
    (repo / ".gitattributes").write_text("* filter=evil diff=evil\n")


def test_nothing_the_repository_configures_runs_when_its_copy_is_made_and_recorded(
    repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    plant_programs(repo, marker)
    (repo / "notes.txt").write_text("untracked\n")
    with workspace_of(repo, tmp_path) as workspace:
        copy = Path(workspace.directory)
        (copy / "README.md").write_text("changed\n")
        (copy / "more.txt").write_text("new\n")
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert result.commit is not None
    assert not marker.exists(), marker.read_text()
    # The content went in as it was, no filter applied.
    assert show(repo, BRANCH, "more.txt") == "new\n"


def test_nothing_runs_from_a_base_either(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    plant_programs(repo, marker)
    with workspace_of(repo, tmp_path, base="feature") as workspace:
        (Path(workspace.directory) / "README.md").write_text("changed\n")
        record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert not marker.exists(), marker.read_text()


# --- links and special files, both ways ----------------------------------------------------


def test_a_symlink_in_the_project_is_copied_as_a_link_never_as_what_it_points_to(
    repo: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    (repo / "innocent.txt").symlink_to(secret)
    (repo / "linked-dir").symlink_to(tmp_path)
    with workspace_of(repo, tmp_path) as workspace:
        copy = Path(workspace.directory)
        assert os.readlink(copy / "innocent.txt") == str(secret)
        assert os.readlink(copy / "linked-dir") == str(tmp_path)
        assert b"host secret" not in b"".join(
            p.read_bytes() for p in copy.rglob("*") if p.is_file() and not p.is_symlink()
        )


def test_what_a_task_links_or_leaves_as_a_fifo_is_recorded_as_a_link_or_left_out(
    repo: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    with workspace_of(repo, tmp_path) as workspace:
        copy = Path(workspace.directory)
        (copy / "steal").symlink_to(secret)
        (copy / "src" / "dir-link").symlink_to("/etc")
        os.mkfifo(copy / "pipe")
        (copy / ".git").mkdir()  # a task's own repository: never recorded
        (copy / ".git" / "config").write_text("[core]\n\tfsmonitor = /bin/false\n")
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    tree = git(repo, "ls-tree", "-r", BRANCH)
    assert "120000 blob" in tree.split("steal")[0].splitlines()[-1]
    assert show(repo, BRANCH, "steal") == str(secret)
    assert show(repo, BRANCH, "src/dir-link") == "/etc"
    paths = [line.split("\t", 1)[1] for line in tree.splitlines()]
    assert "pipe" not in paths
    assert not [path for path in paths if path.startswith(".git/")]
    assert result.files_changed == 2


def test_what_a_task_builds_into_ignored_paths_is_not_recorded(repo: Path, tmp_path: Path) -> None:
    with workspace_of(repo, tmp_path) as workspace:
        copy = Path(workspace.directory)
        (copy / "build").mkdir()
        (copy / "build" / "app.bin").write_bytes(b"\x7fELF")
        (copy / "trace.log").write_text("noise\n")
        (copy / "kept.txt").write_text("kept\n")
        record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert git(repo, "ls-tree", "-r", "--name-only", BRANCH).split() == [
        ".gitignore",
        "README.md",
        "kept.txt",
        "run.sh",
        "src/app.py",
    ]


def test_names_git_finds_awkward_make_the_round_trip(repo: Path, tmp_path: Path) -> None:
    names = ['quote"d.txt', "new\nline.txt", "back\\slash.txt", "spa ce.txt", "ünï.txt"]
    for name in names:
        (repo / name).write_text(name)
    with workspace_of(repo, tmp_path) as workspace:
        copy = Path(workspace.directory)
        for name in names:
            assert (copy / name).read_text() == name
            (copy / name).write_text(name + " changed")
        record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    listed = git(repo, "ls-tree", "-r", "-z", "--name-only", BRANCH).split("\0")
    assert set(names) <= set(listed)


def test_a_repository_without_commits_gets_a_root_commit(tmp_path: Path) -> None:
    project = tmp_path / "fresh"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    (project / "a.txt").write_text("a\n")
    with workspace_of(project, tmp_path) as workspace:
        assert workspace.base is None
        (Path(workspace.directory) / "b.txt").write_text("b\n")
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert result.base is None
    assert git(project, "rev-list", "--count", BRANCH).strip() == "2"
    assert git(project, "rev-parse", "--verify", "-q", "HEAD", check=False) == ""


def test_a_sha256_repository_works_the_same(tmp_path: Path) -> None:
    project = tmp_path / "sha256"
    project.mkdir()
    git(project, "init", "-q", "-b", "main", "--object-format=sha256")
    (project / "a.txt").write_text("a\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "one")
    with workspace_of(project, tmp_path) as workspace:
        assert workspace.algorithm == "sha256"
        (Path(workspace.directory) / "a.txt").write_text("changed\n")
        result = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    assert result.commit is not None
    assert len(result.commit) == 64
    assert show(project, BRANCH, "a.txt") == "changed\n"


def theirs(base: Path, files: dict[str, str]) -> Path:
    """A repository of another user's (4242:4343) with ``files`` committed, below ``base``,
    which they can reach (the test skips where it cannot switch users: not root)."""
    if os.geteuid() != 0:
        pytest.skip("switching to the owner needs root")
    for parent in [base, *base.parents]:
        with contextlib.suppress(OSError):
            parent.chmod(parent.stat().st_mode | 0o011)  # the owner reaches its project
    project = base / "theirs"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    for name, text in files.items():
        (project / name).write_text(text)
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "one")
    subprocess.run(["chown", "-R", "4242:4343", str(project)], check=True)
    return project


def test_the_copy_and_the_branch_belong_to_the_project_s_owner(tmp_path: Path) -> None:
    project = theirs(tmp_path, {"a.txt": "a\n"})
    with workspace_of(project, tmp_path) as workspace:
        copy = Path(workspace.directory)
        assert (copy.stat().st_uid, (copy / "a.txt").stat().st_uid) == (4242, 4242)
        (copy / "a.txt").write_text("changed\n")
        record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
    ref = project / ".git" / "refs" / "heads" / BRANCH
    assert ref.stat().st_uid == 4242
    owners = {p.stat().st_uid for p in (project / ".git" / "objects").rglob("*") if p.is_file()}
    assert owners == {4242}


def test_new_files_are_sorted_by_the_copys_ignore_rules_where_the_owner_cannot_reach_the_copy(
    tmp_path: Path,
) -> None:
    """As in the orchestrator: the copy is in root's 0700 area and belongs to the container's
    account, not to the repository's owner, as whom git runs (it cannot reach the copy by path,
    and check-ignore needs one)."""
    project = theirs(tmp_path, {".gitignore": "build/\n", "a.txt": "a\n"})
    area = tmp_path / "area"
    area.mkdir(mode=0o700)  # root's, closed: as the orchestrator's
    with pinned(project) as fd:
        workspace = prepare(
            fd, (4242, 4343), str(area / "copy"), base=None, bounds=BOUNDS, cancelled=never,
            copy_owner=(4545, 4545),
        )  # fmt: skip
        copy = Path(workspace.directory)
        try:
            (copy / "new.txt").write_text("new\n")
            (copy / "build").mkdir()
            (copy / "build" / "out.o").write_bytes(b"\0")
            (copy / "docs").mkdir()
            (copy / "docs" / ".gitignore").write_text("*.tmp\n")
            (copy / "docs" / "draft.tmp").write_text("scratch\n")
            (copy / "docs" / "guide.md").write_text("# Guide\n")
            recorded = record(workspace, FACTS, BRANCH, bounds=BOUNDS, cancelled=never)
        finally:
            remove(workspace.directory)
    assert recorded.commit is not None
    listed = git(project, "-c", "safe.directory=*", "ls-tree", "-r", "--name-only", BRANCH)
    assert listed.split() == [
        ".gitignore",
        "a.txt",
        "docs/.gitignore",
        "docs/guide.md",
        "new.txt",
    ]
    assert not list(Path(tempfile.gettempdir()).glob("reactor-fabric-ignore-*"))  # scratch gone


def test_a_concurrent_swap_of_a_directory_for_a_symlink_is_never_followed(
    repo: Path, tmp_path: Path
) -> None:
    """A client (or anyone who can write the project) swaps src/ for a link to a secret
    directory while copies are made: no copy ever holds the secret."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "app.py").write_text("host secret\n")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.rename(repo / "src", repo / "src.real")
                os.symlink(secrets, repo / "src")
                os.unlink(repo / "src")
                os.rename(repo / "src.real", repo / "src")

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for attempt in range(30):
            with workspace_of(repo, tmp_path / str(attempt)) as workspace:
                for path in Path(workspace.directory).rglob("*"):
                    if path.is_file() and not path.is_symlink():
                        assert b"host secret" not in path.read_bytes()
    finally:
        stop.set()
        swapper.join()
