"""Pinning mount sources: real directories, symlinks, sockets and permissions in tmp_path."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from reactor_fabric import SecurityViolation
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.mounts import MountPolicy
from reactor_fabric.policy.pinning import PinSet, identities, open_beneath_root, pin_mounts
from tests.leaks import descriptors_of


def refusal(path: Path | str) -> SecurityViolation:
    with pytest.raises(SecurityViolation) as caught:
        os.close(open_beneath_root(str(path)))
    assert caught.value.to_jsonrpc_error()["code"] == -32004
    return caught.value


def test_a_pin_holds_the_directory_that_was_validated_even_after_the_path_is_swapped(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "decoy").mkdir()
    pins = pin_mounts([MountSpec(str(project), "/workspace")])
    [pin] = pins.pins
    expected = os.stat(project)
    assert (pin.device, pin.inode) == (expected.st_dev, expected.st_ino)
    project.rename(tmp_path / "aside")
    project.symlink_to(tmp_path / "decoy")
    # What the engine will be told to mount still leads to the validated directory.
    assert pin.matches(os.stat(pin.engine_source))
    assert not pin.matches(os.stat(project))
    assert pin.engine_source == f"/proc/{os.getpid()}/fd/{pin.fd}"
    pins.close()


def test_a_component_that_became_a_symlink_is_refused_as_changed(tmp_path: Path) -> None:
    (tmp_path / "real" / "project").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    error = refusal(tmp_path / "link" / "project")
    assert error.reason == "mount_changed"
    assert error.detail["component"] == str(tmp_path / "link")


def test_a_last_component_that_is_a_symlink_is_refused_as_changed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "project").symlink_to(tmp_path / "real")
    assert refusal(tmp_path / "project").reason == "mount_changed"


def test_a_path_that_vanished_is_refused_as_changed(tmp_path: Path) -> None:
    assert refusal(tmp_path / "gone").reason == "mount_changed"


def test_a_component_that_became_a_file_is_refused_as_changed(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert refusal(tmp_path / "file" / "below").reason == "mount_changed"


@pytest.mark.parametrize("path", ["relative", "/a/../b", "/a/./b", "/a//b", "/a/"])
def test_only_resolved_absolute_paths_are_walked(path: str) -> None:
    assert refusal(path).reason == "mount_changed"


def test_a_file_may_be_pinned(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    pins = pin_mounts([MountSpec(str(tmp_path / "config.json"), "/config.json", True)])
    [pin] = pins.pins
    assert pin.matches(os.stat(tmp_path / "config.json"))
    pins.close()


def test_the_docker_socket_under_another_name_is_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        (tmp_path / "innocent").hardlink_to(sock_path)
        with pytest.raises(SecurityViolation) as caught:
            pin_mounts(
                [MountSpec(str(tmp_path / "innocent"), "/x")],
                forbidden=identities([str(sock_path), str(tmp_path / "missing")]),
            )
        assert caught.value.reason == "docker_socket_forbidden"
        assert descriptors_of(tmp_path / "innocent") == []
    finally:
        server.close()


def test_pins_are_all_or_nothing_a_later_refusal_closes_the_earlier_pins(tmp_path: Path) -> None:
    (tmp_path / "first").mkdir()
    with pytest.raises(SecurityViolation):
        pin_mounts([MountSpec(str(tmp_path / "first"), "/a"), MountSpec(str(tmp_path / "x"), "/b")])
    assert descriptors_of(tmp_path / "first") == []


def test_closing_a_pin_set_closes_its_descriptors_once(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    pins = pin_mounts([MountSpec(str(tmp_path / "a"), "/a")])
    assert len(descriptors_of(tmp_path / "a")) == 1
    pins.close()
    pins.close()
    assert pins.closed
    assert descriptors_of(tmp_path / "a") == []
    empty = PinSet()
    empty.close()
    assert len(empty) == 0


def test_a_directory_the_orchestrators_user_may_not_enter_is_refused_as_not_permitted() -> None:
    # Root may enter anything: as root, the walk runs in a child that became nobody.
    with tempfile.TemporaryDirectory() as scratch:
        Path(scratch).chmod(0o755)
        private = Path(scratch) / "private"
        (private / "project").mkdir(parents=True)
        private.chmod(0o700 if os.geteuid() == 0 else 0o000)
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through its exit status
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                open_beneath_root(str(private / "project"))
            except SecurityViolation as exc:
                if exc.reason == "mount_not_permitted" and exc.detail["component"] == str(
                    private / "project"
                ):
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        private.chmod(0o700)
        assert os.waitstatus_to_exitcode(status) == 0


def test_a_directory_the_orchestrators_user_may_enter_but_not_read_is_refused() -> None:
    """Another user's 0700 home is reachable with O_PATH (only its parent is searched), and
    root's engine would mount it: the pin refuses it for a user who could not list it."""
    with tempfile.TemporaryDirectory() as scratch:
        Path(scratch).chmod(0o755)
        private = Path(scratch) / "home-of-someone-else"
        private.mkdir()
        (private / "secret").write_text("x")
        if os.geteuid() == 0:
            os.chown(private, 4001, 4001)
            private.chmod(0o700)
        else:
            private.chmod(0o000)
        try:
            code = _as_nobody(lambda: pin_mounts([MountSpec(str(private), "/workspace")]))
        finally:
            private.chmod(0o700)
        assert code == "mount_not_permitted"


def test_a_readable_directory_is_pinned_with_its_owner(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    if os.geteuid() == 0:
        os.chown(project, 4001, 4002)
    pins = pin_mounts([MountSpec(str(project), "/workspace")])
    try:
        [pin] = pins.pins
        found = os.stat(project)
        assert pin.owner == (found.st_uid, found.st_gid)
    finally:
        pins.close()


def _as_nobody(action: Callable[[], object]) -> str:
    """Run ``action`` in a child that is an ordinary user (nobody, if we are root); the refusal
    reason it raised, or "ok"."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        outcome = "crashed"
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            action()
            outcome = "ok"
        except SecurityViolation as exc:
            outcome = exc.reason
        finally:
            os.write(writer, outcome.encode())
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as report:
        outcome = report.read()
    os.waitpid(child, 0)
    return outcome


def test_pinning_again_refuses_a_source_that_now_resolves_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "allowed" / "project").mkdir(parents=True)
    (tmp_path / "allowed" / "other").mkdir()
    mounts = MountPolicy([str(tmp_path / "allowed")]).validate(
        [{"source": str(tmp_path / "allowed" / "project"), "target": "/workspace"}]
    )
    (tmp_path / "allowed" / "project").rename(tmp_path / "allowed" / "aside")
    (tmp_path / "allowed" / "project").symlink_to(tmp_path / "allowed" / "other")
    with pytest.raises(SecurityViolation) as caught:
        MountPolicy([str(tmp_path / "allowed")]).pin(mounts)
    assert caught.value.reason == "mount_changed"


def test_a_path_changing_while_it_is_resolved_is_a_refusal_not_a_crash(tmp_path: Path) -> None:
    def racing_realpath(path: str) -> str:
        if path.endswith("project"):
            raise FileNotFoundError(2, "No such file or directory")  # a link read as it went
        return os.path.realpath(path)

    policy = MountPolicy([str(tmp_path)], realpath=racing_realpath, docker_sockets=())
    with pytest.raises(SecurityViolation) as caught:
        policy.validate([{"source": str(tmp_path / "project"), "target": "/workspace"}])
    assert caught.value.reason == "mount_source_missing"
    with pytest.raises(SecurityViolation) as caught:
        policy.pin((MountSpec(str(tmp_path / "project"), "/w"),))
    assert caught.value.reason == "mount_changed"
