"""No container writes the user's .git: which containers get it read-only, and the guard mounts
pinned beneath each writable mount (real directories, files and links in tmp_path)."""

from __future__ import annotations

import os
from contextlib import closing
from pathlib import Path

import pytest

from reactor_fabric import SecurityViolation
from reactor_fabric.config.structs import Security, Service
from reactor_fabric.policy.git_guard import guards_git
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.mounts import MountPolicy
from reactor_fabric.policy.pinning import PinSet, pin_git_guards, pin_mounts
from tests.leaks import descriptors_of


def service(**fields: object) -> Service:
    return Service(image="x", **fields)  # type: ignore[arg-type]


def test_every_service_gets_the_projects_git_read_only_unless_its_suite_entry_says_otherwise() -> (
    None
):
    assert guards_git(service(), child_session=False)
    assert not guards_git(service(security=Security(git_writable=True)), child_session=False)


def test_an_agents_child_session_gets_git_read_only_even_from_a_service_that_may_write_it() -> None:
    assert guards_git(service(security=Security(git_writable=True)), child_session=True)


def test_an_agent_gets_git_read_only_whatever_its_entry_says() -> None:
    agent = service(service_type="llm_agent", security=Security(git_writable=True))
    assert guards_git(agent, child_session=False)


def repository(path: Path) -> Path:
    (path / ".git" / "hooks").mkdir(parents=True)
    (path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return path


def guarded(mounts: list[MountSpec]) -> tuple[PinSet, tuple[MountSpec, ...]]:
    pins = pin_mounts(mounts)
    try:
        return pins, pin_git_guards(pins, mounts)
    except BaseException:
        pins.close()
        raise


def test_a_writable_projects_git_directory_is_pinned_as_a_read_only_mount_over_itself(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path / "project")
    pins, guards = guarded([MountSpec(str(project), "/workspace")])
    with closing(pins):
        assert guards == (
            MountSpec(str(project / ".git"), "/workspace/.git", read_only=True, git_guard=True),
        )
        pin = pins.for_target("/workspace/.git")
        assert pin is not None
        assert pin.read_only
        assert pin.matches(os.stat(project / ".git"))
        # The pin holds the Git directory beneath the pinned project, whatever the path says.
        (project / ".git").rename(project / "aside")
        (project / ".git").mkdir()
        assert pin.matches(os.stat(pin.engine_source))


def test_a_worktrees_git_file_is_guarded_too(tmp_path: Path) -> None:
    project = tmp_path / "worktree"
    project.mkdir()
    (project / ".git").write_text("gitdir: /elsewhere/.git/worktrees/wt\n")
    pins, guards = guarded([MountSpec(str(project), "/workspace")])
    with closing(pins):
        assert [g.target for g in guards] == ["/workspace/.git"]


def test_no_git_directory_read_only_mounts_and_a_mount_already_at_git_need_no_guard(
    tmp_path: Path,
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    repo = repository(tmp_path / "repo")
    other = repository(tmp_path / "other")
    for mounts in (
        [MountSpec(str(plain), "/workspace")],
        [MountSpec(str(repo), "/workspace", read_only=True)],
        [
            MountSpec(str(repo), "/workspace"),
            MountSpec(str(other / ".git"), "/workspace/.git", read_only=True),
        ],
    ):
        pins, guards = guarded(mounts)
        pins.close()
        assert guards == ()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: (p / ".git").symlink_to(p / "real-git"), "its .git is a symlink"),
        (lambda p: os.mkfifo(p / ".git"), "its .git is not a directory or a file"),
    ],
)
def test_a_git_entry_a_container_could_replace_is_refused_not_served_writable(
    tmp_path: Path, make: object, why: str
) -> None:
    project = tmp_path / "project"
    (project / "real-git").mkdir(parents=True)
    make(project)  # type: ignore[operator]
    with pytest.raises(SecurityViolation) as caught:
        guarded([MountSpec(str(project), "/workspace")])
    assert caught.value.reason == "git_dir_unguardable"
    assert why in str(caught.value)
    # Nothing stays open: the project's pin, the entry looked at.
    for path in (project, project / ".git", project / "real-git"):
        assert descriptors_of(path) == []


def test_a_bare_repository_or_a_path_inside_git_is_refused_writable(tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    (bare / "objects").mkdir(parents=True)
    (bare / "refs").mkdir()
    (bare / "HEAD").write_text("ref: refs/heads/main\n")
    hooks = repository(tmp_path / "repo") / ".git" / "hooks"
    for source in (bare, hooks):
        with pytest.raises(SecurityViolation) as caught:
            guarded([MountSpec(str(source), "/workspace")])
        assert caught.value.reason == "git_dir_unguardable"
    # Read-only, either is served.
    for source in (bare, hooks):
        pins, guards = guarded([MountSpec(str(source), "/workspace", read_only=True)])
        pins.close()
        assert guards == ()


def test_the_mount_policy_guards_only_when_asked_and_closes_its_pins_on_a_refusal(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path / "project")
    policy = MountPolicy([str(tmp_path)], docker_sockets=())
    mounts = policy.validate([{"source": str(project), "target": "/workspace"}])
    pins, guards = policy.pin(mounts)
    pins.close()
    assert guards == ()
    pins, guards = policy.pin(mounts, guard_git=True)
    pins.close()
    assert [g.target for g in guards] == ["/workspace/.git"]
    (project / ".git").rename(project / "real")
    (project / ".git").symlink_to(project / "real")
    with pytest.raises(SecurityViolation):
        policy.pin(mounts, guard_git=True)
    assert descriptors_of(project) == []
