"""Mount validation: every rule, against real paths and symlinks in a temporary directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reactor_fabric import SecurityViolation
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.mounts import (
    MountPolicy,
    docker_socket_paths,
    is_within,
    parse_query_mount,
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """allowed/ (the root) with a project, a link out to outside/, and a sibling allowed2/."""
    (tmp_path / "allowed" / "project" / "src").mkdir(parents=True)
    (tmp_path / "allowed2").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "allowed" / "escape").symlink_to(tmp_path / "outside")
    (tmp_path / "allowed" / "inner-link").symlink_to(tmp_path / "allowed" / "project")
    (tmp_path / "link-to-allowed").symlink_to(tmp_path / "allowed")
    return tmp_path


def policy(
    tree: Path,
    *roots: str,
    sockets: tuple[str, ...] = (),
    targets: tuple[str, ...] = ("/w", "/workspace", "/projects"),
) -> MountPolicy:
    return MountPolicy(
        roots or (str(tree / "allowed"),), allowed_targets=targets, docker_sockets=sockets
    )


def violation(policy: MountPolicy, mounts: object) -> SecurityViolation:
    with pytest.raises(SecurityViolation) as caught:
        policy.validate(mounts)
    assert caught.value.to_jsonrpc_error()["code"] == -32004
    return caught.value


def test_a_mount_inside_an_allowed_root_is_resolved_and_accepted(tree: Path) -> None:
    mounts = policy(tree).validate(
        [{"source": str(tree / "allowed" / "project"), "target": "/workspace", "readOnly": True}]
    )
    assert mounts == (MountSpec(str(tree / "allowed" / "project"), "/workspace", True),)


def test_the_root_itself_may_be_mounted(tree: Path) -> None:
    [mount] = policy(tree).validate([{"source": str(tree / "allowed"), "target": "/w"}])
    assert mount.source == str(tree / "allowed")
    assert mount.read_only is False


def test_a_symlink_inside_the_root_pointing_inside_is_followed_and_accepted(tree: Path) -> None:
    [mount] = policy(tree).validate(
        [{"source": str(tree / "allowed" / "inner-link"), "target": "/w"}]
    )
    assert mount.source == str(tree / "allowed" / "project")


def test_a_symlink_escaping_the_root_is_refused(tree: Path) -> None:
    error = violation(policy(tree), [{"source": str(tree / "allowed" / "escape"), "target": "/w"}])
    assert error.reason == "mount_outside_allowed_roots"
    assert error.detail["resolved"] == str(tree / "outside")
    assert error.detail["path"] == str(tree / "allowed" / "escape")


def test_dot_dot_is_resolved_before_the_check(tree: Path) -> None:
    sneaky = f"{tree}/allowed/project/../../outside"
    assert violation(policy(tree), [{"source": sneaky, "target": "/w"}]).reason == (
        "mount_outside_allowed_roots"
    )


def test_containment_is_by_path_component_not_string_prefix(tree: Path) -> None:
    error = violation(policy(tree), [{"source": str(tree / "allowed2"), "target": "/w"}])
    assert error.reason == "mount_outside_allowed_roots"
    assert is_within("/home/a", "/home")
    assert not is_within("/home2", "/home")
    assert is_within("/home", "/home/")


def test_allowed_roots_are_resolved_too(tree: Path) -> None:
    # The root is given through a symlink; sources resolve to the real directory.
    [mount] = policy(tree, str(tree / "link-to-allowed")).validate(
        [{"source": str(tree / "allowed" / "project"), "target": "/w"}]
    )
    assert mount.source == str(tree / "allowed" / "project")


@pytest.mark.parametrize(
    ("mount", "reason"),
    [
        ({"source": "relative/path", "target": "/w"}, "mount_source_not_absolute"),
        ({"source": "{allowed}/project", "target": "workspace"}, "mount_target_not_absolute"),
        ({"source": "{allowed}/pro\0ject", "target": "/w"}, "mount_source_invalid"),
        ({"source": "{allowed}/project", "target": "/w\0x"}, "mount_target_invalid"),
        ({"source": "", "target": "/w"}, "mount_malformed"),
        ({"target": "/w"}, "mount_malformed"),
        ({"source": "{allowed}/project", "target": "/w", "readOnly": "yes"}, "mount_malformed"),
        ({"source": "{allowed}/project", "target": "/w", "mode": "rw"}, "mount_malformed"),
        ({"source": "{allowed}/missing", "target": "/w"}, "mount_source_missing"),
    ],
    ids=[
        "relative-source",
        "relative-target",
        "nul-source",
        "nul-target",
        "empty-source",
        "no-source",
        "readonly-not-bool",
        "unknown-field",
        "missing-source",
    ],
)
def test_malformed_mounts_are_refused_with_a_reason(
    tree: Path, mount: dict[str, object], reason: str
) -> None:
    filled = {
        k: v.format(allowed=tree / "allowed") if isinstance(v, str) else v for k, v in mount.items()
    }
    assert violation(policy(tree), [filled]).reason == reason


@pytest.mark.parametrize(
    "target",
    [
        "/",
        "/proc",
        "/proc/self",
        "/sys/fs",
        "/dev",
        "/etc",
        "/etc/passwd",
        "/usr/local",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64",
        "/boot",
        "/run",
        "/var/run",
        "/var/run/docker.sock",
        "/workspace/../etc",
        "//",
        "/usr/",
    ],
)
def test_system_paths_are_forbidden_targets(tree: Path, target: str) -> None:
    error = violation(
        policy(tree), [{"source": str(tree / "allowed" / "project"), "target": target}]
    )
    assert error.reason == "mount_target_forbidden"
    assert error.detail["path"] == target


@pytest.mark.parametrize(
    "target", ["/workspace", "/home/user/project", "/data", "/var/tmp/x", "/usr2", "/etcetera"]
)
def test_targets_under_a_configured_prefix_are_allowed(tree: Path, target: str) -> None:
    [mount] = policy(tree, targets=(target,)).validate(
        [{"source": str(tree / "allowed" / "project"), "target": target}]
    )
    assert mount.target == target


@pytest.mark.parametrize("target", ["/workspace", "/workspace/sub", "/projects/app", "/projects"])
def test_by_default_mounts_go_under_workspace_or_projects(tree: Path, target: str) -> None:
    default = MountPolicy([str(tree / "allowed")], docker_sockets=())
    [mount] = default.validate([{"source": str(tree / "allowed" / "project"), "target": target}])
    assert mount.target == target


@pytest.mark.parametrize(
    "target",
    [
        "/opt/mcp/bin",  # the bundled Python servers' own commands
        "/opt",
        "/app",  # a common entrypoint directory
        "/home/node",  # the Node images' home
        "/srv",
        "/workspace2",  # a prefix is matched by whole components
        "/tmp",
    ],
)
def test_targets_that_could_shadow_the_service_are_refused(tree: Path, target: str) -> None:
    default = MountPolicy([str(tree / "allowed")], docker_sockets=())
    error = violation(default, [{"source": str(tree / "allowed" / "project"), "target": target}])
    assert error.reason == "mount_target_not_allowed"
    assert error.detail["allowed_targets"] == ["/workspace", "/projects"]


def test_a_mount_may_use_its_sources_own_path_as_given_or_resolved(tree: Path) -> None:
    default = MountPolicy([str(tree / "allowed")], docker_sockets=())
    project = str(tree / "allowed" / "project")
    link = str(tree / "allowed" / "inner-link")
    for source, target in ((project, project), (link, link), (link, project)):
        [mount] = default.validate([{"source": source, "target": target}])
        assert (mount.source, mount.target) == (project, target)
    # ...but not another allowed path.
    other = str(tree / "allowed2")
    error = violation(default, [{"source": project, "target": other}])
    assert error.reason == "mount_target_not_allowed"


def test_only_a_same_path_target_outside_the_allowed_targets_is_checked_in_the_image(
    tree: Path,
) -> None:
    default = MountPolicy([str(tree / "allowed")], docker_sockets=())
    project = str(tree / "allowed" / "project")
    [same_path] = default.validate([{"source": project, "target": project}])
    [under_prefix] = default.validate([{"source": project, "target": "/workspace"}])
    assert same_path.check_in_image
    assert not under_prefix.check_in_image
    # A same-path mount that is also under an allowed target needs no check either.
    [both] = MountPolicy([str(tree)], allowed_targets=[str(tree)], docker_sockets=()).validate(
        [{"source": project, "target": project}]
    )
    assert not both.check_in_image


def test_the_docker_socket_is_never_mountable_even_inside_an_allowed_root(tree: Path) -> None:
    socket_dir = tree / "allowed" / "run"
    socket_dir.mkdir()
    (socket_dir / "docker.sock").touch()
    sockets = (str(socket_dir / "docker.sock"),)
    for source in (socket_dir / "docker.sock", socket_dir):
        error = violation(policy(tree, sockets=sockets), [{"source": str(source), "target": "/w"}])
        assert error.reason == "docker_socket_forbidden"


def test_a_symlink_to_the_docker_socket_is_refused(tree: Path) -> None:
    real = tree / "outside" / "docker.sock"
    real.touch()
    (tree / "allowed" / "sock-link").symlink_to(real)
    error = violation(
        policy(tree, sockets=(str(real),)),
        [{"source": str(tree / "allowed" / "sock-link"), "target": "/w"}],
    )
    assert error.reason == "docker_socket_forbidden"


def test_two_mounts_cannot_share_a_target(tree: Path) -> None:
    source = str(tree / "allowed" / "project")
    error = violation(
        policy(tree), [{"source": source, "target": "/w"}, {"source": source, "target": "/w/"}]
    )
    assert error.reason == "mount_target_duplicate"


def test_mounts_must_be_a_list_of_objects(tree: Path) -> None:
    assert violation(policy(tree), {"source": "/x"}).reason == "mount_malformed"
    assert violation(policy(tree), ["/x:/y"]).reason == "mount_malformed"
    assert policy(tree).validate([]) == ()


def test_too_many_mounts_are_refused(tree: Path) -> None:
    many = [{"source": str(tree / "allowed"), "target": f"/m{i}"} for i in range(33)]
    assert violation(policy(tree), many).reason == "too_many_mounts"


def test_an_outside_source_is_refused_before_its_existence_is_revealed(tree: Path) -> None:
    assert violation(policy(tree), [{"source": "/nonexistent/secret", "target": "/w"}]).reason == (
        "mount_outside_allowed_roots"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/a/b:/w", {"source": "/a/b", "target": "/w", "readOnly": False}),
        ("/a/b:/w:ro", {"source": "/a/b", "target": "/w", "readOnly": True}),
        ("/a/b:/w:rw", {"source": "/a/b", "target": "/w", "readOnly": False}),
    ],
)
def test_query_mounts_are_parsed(text: str, expected: dict[str, object]) -> None:
    assert parse_query_mount(text) == expected


@pytest.mark.parametrize("text", ["/a/b", "/a:/b:/c:ro", ":/w", "/a:", "/a:/b:xx"])
def test_malformed_query_mounts_are_security_violations(text: str) -> None:
    with pytest.raises(SecurityViolation, match="SOURCE:TARGET"):
        parse_query_mount(text)


def test_the_default_policy_knows_the_standard_docker_socket_paths() -> None:
    default = MountPolicy(["/var"], realpath=os.path.normpath, exists=lambda _: True)
    with pytest.raises(SecurityViolation) as caught:
        default.validate([{"source": "/var/run", "target": "/w"}])
    assert caught.value.reason == "docker_socket_forbidden"


@pytest.mark.parametrize("field", ["source", "target"])
def test_a_path_over_path_max_is_refused_before_it_is_resolved(tree: Path, field: str) -> None:
    resolved: list[str] = []

    def realpath(path: str) -> str:
        resolved.append(path)
        return os.path.realpath(path)

    policy = MountPolicy([str(tree)], realpath=realpath)
    resolved.clear()
    mount = {"source": str(tree), "target": "/workspace"}
    mount[field] = mount[field] + "/" + "a" * 5000
    with pytest.raises(SecurityViolation) as caught:
        policy.validate([mount])
    assert caught.value.reason == "mount_path_too_long"
    assert resolved == []


@pytest.mark.parametrize(
    "source",
    [
        "/run/podman",  # rootful Podman's API socket
        "/run/containerd",  # containerd's, which dockerd itself drives
        "/run/user/1000/podman",  # a rootless Podman's, under XDG_RUNTIME_DIR
        "/srv/engines",  # whatever CONTAINER_HOST names
    ],
)
def test_other_container_engines_sockets_are_never_mountable(source: str) -> None:
    sockets = docker_socket_paths(
        {"XDG_RUNTIME_DIR": "/run/user/1000", "CONTAINER_HOST": "unix:///srv/engines/p.sock"}
    )
    policy = MountPolicy(
        ["/"], realpath=os.path.normpath, exists=lambda _: True, docker_sockets=sockets
    )
    with pytest.raises(SecurityViolation) as caught:
        policy.validate([{"source": source, "target": "/workspace"}])
    assert caught.value.reason == "docker_socket_forbidden"
    assert "p.sock" not in str(caught.value)  # which engine runs here is not told
