"""Socket stdio's area and decisions, without an engine (see runtime/stdio_sockets.py)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from reactor_fabric import ContainerStartFailure
from reactor_fabric.runtime.docker import DockerRuntime
from reactor_fabric.runtime.engines import engine_is_local
from reactor_fabric.runtime.stdio_sockets import (
    HELPER_TARGET,
    ORPHAN_AGE,
    SOCKET_TARGET,
    PendingStdio,
    StdioArea,
    StdioUnavailable,
    default_parent,
    private_directory,
    remove_stale_areas,
    wrapped_command,
)

ALIVE = {"reactor-fabric.owner-host": "here", "reactor-fabric.owner-pid": str(os.getpid())}
STRANGER = 54321

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")


def _own_start() -> str:
    stat_line = Path(f"/proc/{os.getpid()}/stat").read_text()
    return stat_line.rpartition(")")[2].split()[19]


def _owner() -> dict[str, str]:
    return {**ALIVE, "reactor-fabric.owner-start": _own_start()}


def _open(helper: Path, parent: Path, name: str = "inst") -> StdioArea:
    """An area of a live orchestrator on host "here", with the test's program."""
    return StdioArea.open(
        name, owner=_owner(), this_host="here", helper=str(helper), parent=str(parent)
    )


@pytest.fixture
def helper(tmp_path: Path) -> Path:
    program = tmp_path / "fabric-stdio-build"
    program.write_bytes(b"\x7fELF not really")
    program.chmod(0o755)
    return program


# --- what the container runs --------------------------------------------------------------


def test_the_helper_goes_in_front_of_the_image_entrypoint_and_command() -> None:
    assert wrapped_command(["node", "server.js"], ["/workspace"], None) == [
        HELPER_TARGET,
        SOCKET_TARGET,
        "node",
        "server.js",
        "/workspace",
    ]


def test_a_spec_command_replaces_the_image_command_but_not_its_entrypoint() -> None:
    wrapped = wrapped_command(["node", "server.js"], ["/workspace"], ["/projects"])
    assert wrapped[2:] == ["node", "server.js", "/projects"]


def test_an_empty_spec_command_runs_the_entrypoint_alone() -> None:
    assert wrapped_command(["mcp-server-time"], ["--x"], [])[2:] == ["mcp-server-time"]


def test_an_image_with_only_a_command_runs_that_command() -> None:
    assert wrapped_command(None, ["python", "-m", "srv"], None)[2:] == ["python", "-m", "srv"]


def test_nothing_to_run_is_not_wrapped() -> None:
    with pytest.raises(StdioUnavailable) as caught:
        wrapped_command(None, None, None)
    assert caught.value.reason == "no_command"


# --- where the area may live ----------------------------------------------------------------


def test_root_keeps_its_areas_in_run_and_users_in_their_runtime_directory() -> None:
    assert default_parent(0, {}) == "/run/reactor-fabric/stdio"
    assert default_parent(1000, {"XDG_RUNTIME_DIR": "/run/user/1000"}) == (
        "/run/user/1000/reactor-fabric/stdio"
    )
    assert default_parent(1000, {"XDG_RUNTIME_DIR": "relative"}) == (
        "/tmp/reactor-fabric-1000/stdio"
    )


def test_only_an_engine_on_this_machine_gets_sockets() -> None:
    assert engine_is_local("unix:///var/run/docker.sock", {})
    assert engine_is_local(None, {})
    assert engine_is_local(None, {"DOCKER_HOST": "unix:///run/podman/podman.sock"})
    assert not engine_is_local(None, {"DOCKER_HOST": "tcp://10.0.0.5:2376"})
    assert not engine_is_local("ssh://me@there", {})


def test_the_runtime_says_attach_for_a_remote_engine_and_nothing_before_its_first_start() -> None:
    assert DockerRuntime(base_url="tcp://10.0.0.2:2375").capabilities.stdio == "attach"
    assert DockerRuntime(
        base_url="unix:///var/run/docker.sock", socket_stdio=False
    ).capabilities.stdio == ("attach")
    assert DockerRuntime(base_url="unix:///var/run/docker.sock").capabilities.stdio == ""


def test_a_private_directory_is_made_0700(tmp_path: Path) -> None:
    private_directory(str(tmp_path / "a" / "stdio"), os.geteuid())
    assert stat.S_IMODE((tmp_path / "a" / "stdio").stat().st_mode) == 0o700


def test_a_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    opened = tmp_path / "open"
    opened.mkdir()
    opened.chmod(0o777)  # not sticky: anyone could swap what is below
    with pytest.raises(StdioUnavailable) as caught:
        private_directory(str(opened / "stdio"), os.geteuid())
    assert caught.value.reason == "stdio_directory"


def test_a_sticky_directory_open_to_all_like_tmp_is_fine_above(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    private_directory(str(sticky / "stdio"), os.geteuid())


def test_a_leaf_left_open_is_refused(tmp_path: Path) -> None:
    leaf = tmp_path / "stdio"
    leaf.mkdir(mode=0o755)
    leaf.chmod(0o755)
    with pytest.raises(StdioUnavailable):
        private_directory(str(leaf), os.geteuid())


@needs_root
def test_a_directory_another_user_planted_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "reactor-fabric-0"
    planted.mkdir(mode=0o700)
    os.chown(planted, STRANGER, STRANGER)
    with pytest.raises(StdioUnavailable) as caught:
        private_directory(str(planted / "stdio"), os.geteuid())
    assert "another user" in str(caught.value)


@needs_root
def test_a_link_to_another_users_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, STRANGER, STRANGER)
    (tmp_path / "reactor-fabric-0").symlink_to(theirs)
    with pytest.raises(StdioUnavailable):
        private_directory(str(tmp_path / "reactor-fabric-0"), os.geteuid())


@needs_root
def test_a_link_another_user_planted_is_refused_even_when_it_leads_to_a_directory_of_ours(
    tmp_path: Path,
) -> None:
    # The attack: a link of a stranger's, in a sticky directory, to a place where our private
    # directory is made. Its resolved path checks out; the link can be repointed later.
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = shared / "reactor-fabric-0"
    planted.symlink_to(shared)
    os.lchown(planted, STRANGER, STRANGER)
    with pytest.raises(StdioUnavailable) as caught:
        private_directory(str(planted / "stdio"), os.geteuid())
    assert caught.value.reason == "stdio_directory"
    assert "is a link" in str(caught.value)


def test_a_link_only_root_could_have_made_is_followed_and_the_real_path_returned(
    tmp_path: Path, helper: Path
) -> None:
    # Like /var/run -> /run: a link in a directory nobody else can write (here: this user's
    # tmp_path, 0700; the test runs as root in CI, and a non-root run needs the link to be
    # root's, so it only checks the plain case).
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "alias").symlink_to(real)
    if os.geteuid() == 0:
        assert private_directory(str(tmp_path / "alias" / "stdio"), 0) == str(real / "stdio")
        area = _open(helper, tmp_path / "alias" / "p")
        try:
            assert area.root.startswith(str(real / "p") + "/")
            assert os.path.realpath(area.helper) == area.helper
        finally:
            area.close()
    else:
        with pytest.raises(StdioUnavailable):
            private_directory(str(tmp_path / "alias" / "stdio"), os.geteuid())
    assert private_directory(str(real / "a" / ".." / "b"), os.geteuid()) == str(real / "b")


def test_a_path_that_ends_going_back_up_is_checked_where_it_ends(tmp_path: Path) -> None:
    # "open/sub/.." ends in "open": checked as the directory itself (ours, 0700), not only as
    # one above it.
    opened = tmp_path / "open"
    (opened / "sub").mkdir(parents=True, mode=0o700)
    opened.chmod(0o750)
    with pytest.raises(StdioUnavailable) as caught:
        private_directory(str(opened / "sub" / ".."), os.geteuid())
    assert "open to other users" in str(caught.value)


def test_a_relative_directory_is_refused() -> None:
    with pytest.raises(StdioUnavailable) as caught:
        private_directory("relative/stdio", os.geteuid())
    assert caught.value.reason == "stdio_directory"


@pytest.fixture
def two_local_users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    """A victim and an attacker: local users made for the test, removed after it."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("making local users needs root and useradd")
    names = [f"rf-victim-{secrets.token_hex(3)}", f"rf-attacker-{secrets.token_hex(3)}"]
    made: list[str] = []
    try:
        for name in names:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                check=True,
                capture_output=True,
            )
            made.append(name)
        yield pwd.getpwnam(names[0]), pwd.getpwnam(names[1])
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def unprotected_symlinks() -> Iterator[None]:
    """fs.protected_symlinks at 0 for the test, where the machine lets us; restored after.
    Where it cannot be changed and is 1, the kernel refuses the link itself: the area must
    be refused all the same."""
    knob = Path("/proc/sys/fs/protected_symlinks")
    before = knob.read_text() if knob.exists() else None
    with contextlib.suppress(OSError):
        knob.write_text("0")
    try:
        yield
    finally:
        if before is not None:
            with contextlib.suppress(OSError):
                knob.write_text(before)


def _as_user(user: pwd.struct_passwd, action: Callable[[], str]) -> str:
    """Run ``action`` in a child process with ``user``'s uid and gid; what it returned."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child execs
        pid = os.fork()  # nothing, calls os functions only, and ends with _exit
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            result = action()
        except BaseException as exc:
            result = f"{type(exc).__name__}: {getattr(exc, 'reason', '')}: {exc}"
        os.write(write, result.encode()[:60_000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        text = answer.read().decode()
    os.waitpid(pid, 0)
    return text


def test_another_local_user_cannot_plant_a_link_where_a_users_orchestrator_keeps_its_sockets(
    two_local_users: tuple[pwd.struct_passwd, pwd.struct_passwd],
    unprotected_symlinks: None,
) -> None:
    # The attack, as it happens: a user's orchestrator with no XDG_RUNTIME_DIR (cron,
    # su, a unit with User=) keeps its area below /tmp/reactor-fabric-UID. Another user plants
    # that name first, as a link to a sticky directory where the victim's own private
    # directory then gets made. Before the fix the area was kept through the link; the engine
    # would bind fabric-stdio by that path at every container create, after the attacker had
    # repointed it to a program of theirs.
    victim, attacker = two_local_users
    shared = Path(tempfile.mkdtemp(prefix="rf-shared-", dir="/tmp"))
    planted = Path(f"/tmp/reactor-fabric-{victim.pw_uid}")
    try:
        shared.chmod(0o1777)
        program = shared / "fabric-stdio-build"
        program.write_bytes(b"\x7fELF not really")
        program.chmod(0o755)
        assert default_parent(victim.pw_uid, {}) == f"{planted}/stdio"
        planted.symlink_to(shared)
        os.lchown(planted, attacker.pw_uid, attacker.pw_gid)

        def open_area() -> str:
            area = StdioArea.open(
                "victim", owner=_owner(), this_host="here", helper=str(program), environ={}
            )
            return f"opened: {area.helper}"

        outcome = _as_user(victim, open_area)
        assert outcome.startswith("StdioUnavailable: stdio_directory:"), outcome
    finally:
        with contextlib.suppress(OSError):
            planted.unlink()
        shutil.rmtree(shared, ignore_errors=True)


# --- the area -----------------------------------------------------------------------------


def test_an_area_holds_our_program_and_its_owner(tmp_path: Path, helper: Path) -> None:
    area = _open(helper, tmp_path / "p")
    try:
        assert stat.S_IMODE(os.stat(area.root).st_mode) == 0o700
        copied = Path(area.helper)
        assert copied.read_bytes() == helper.read_bytes()
        assert stat.S_IMODE(copied.stat().st_mode) == 0o755
        assert json.loads((Path(area.root) / "owner.json").read_text()) == _owner()
    finally:
        area.close()
    assert not Path(area.root).exists()


def test_a_missing_program_means_no_area(tmp_path: Path) -> None:
    with pytest.raises(StdioUnavailable) as caught:
        StdioArea.open(
            "inst",
            owner=_owner(),
            this_host="here",
            helper=str(tmp_path / "none"),
            parent=str(tmp_path / "p"),
        )
    assert caught.value.reason == "helper_missing"
    assert not (tmp_path / "p").exists()


def test_the_program_can_come_from_the_environment(tmp_path: Path, helper: Path) -> None:
    area = StdioArea.open(
        "inst",
        owner=_owner(),
        this_host="here",
        parent=str(tmp_path / "p"),
        environ={"REACTOR_FABRIC_STDIO_HELPER": str(helper)},
    )
    try:
        # The variable's program, not the bundled one (which the checkout may have built).
        assert Path(area.helper).read_bytes() == helper.read_bytes()
    finally:
        area.close()


def test_a_socket_takes_one_connection_and_none_once_closed(tmp_path: Path, helper: Path) -> None:
    area = _open(helper, tmp_path / "p")
    try:
        pending = area.listen()
        assert stat.S_IMODE(os.stat(pending.path).st_mode) == 0o666
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(pending.path)
            connection, _ = pending.listener.accept()
            connection.close()
        pending.close()
        assert not os.path.exists(pending.path)
        with socket.socket(socket.AF_UNIX) as late, pytest.raises(FileNotFoundError):
            late.connect(pending.path)
        following = area.listen()
        following.close()
        assert following.path != pending.path  # never the same socket twice
    finally:
        area.close()
    assert not Path(area.root).exists()


def test_a_dead_orchestrators_area_is_removed_and_a_live_ones_kept(
    tmp_path: Path, helper: Path
) -> None:
    parent = tmp_path / "p"
    live = _open(helper, parent, "live")
    dead = StdioArea.open(
        "dead",
        owner={**_owner(), "reactor-fabric.owner-start": "1"},  # that PID, another process
        this_host="here",
        helper=str(helper),
        parent=str(parent),
    )
    dead.listen().listener.close()  # its path left behind, as by a crash
    elsewhere = StdioArea.open(
        "elsewhere",
        owner={**_owner(), "reactor-fabric.owner-host": "other"},
        this_host="here",
        helper=str(helper),
        parent=str(parent),
    )
    fresh = _open(helper, parent, "fresh")
    try:
        left = sorted(name.rpartition("-")[0] for name in os.listdir(parent))
        assert left == ["elsewhere", "fresh", "live"]
    finally:
        for area in (live, elsewhere, fresh):
            area.close()


def test_an_area_deeper_than_a_socket_address_holds_still_gets_its_sockets(
    tmp_path: Path, helper: Path
) -> None:
    # sockaddr_un holds 108 bytes; the area is bound through a descriptor of its own, and the
    # container reaches its socket through a bind, by a short path.
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    area = _open(helper, deep)
    try:
        pending = area.listen()
        assert len(pending.path) > 108
        assert stat.S_ISSOCK(os.stat(pending.path).st_mode)
        assert stat.S_IMODE(os.stat(pending.path).st_mode) == 0o666
        directory = os.open(os.path.dirname(pending.path), os.O_PATH | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(f"/proc/self/fd/{directory}/{os.path.basename(pending.path)}")
                connection, _ = pending.listener.accept()
                connection.close()
        finally:
            os.close(directory)
        pending.close()
        assert not os.path.exists(pending.path)
    finally:
        area.close()
    assert not Path(area.root).exists()


def test_two_areas_of_one_instance_are_apart(tmp_path: Path, helper: Path) -> None:
    areas = [_open(helper, tmp_path) for _ in range(2)]
    try:
        assert areas[0].root != areas[1].root
    finally:
        for area in areas:
            area.close()


def test_an_area_holding_a_directory_the_engine_made_for_a_missing_socket_is_removed(
    tmp_path: Path, helper: Path
) -> None:
    # An engine (re)starting a container whose socket is gone makes the bind source as an
    # empty directory; closing the area must not leave it (and the area) behind.
    area = _open(helper, tmp_path)
    (Path(area.root) / "1.sock").mkdir()
    area.close()
    assert not Path(area.root).exists()


def test_an_ownerless_leftover_is_removed_once_old_and_kept_while_it_may_be_in_the_making(
    tmp_path: Path, helper: Path
) -> None:
    leftover = tmp_path / "integration-test"
    (leftover / "1.sock").mkdir(parents=True)
    (leftover / "fabric-stdio").write_bytes(b"old")
    made = leftover.stat().st_mtime
    assert remove_stale_areas(str(tmp_path), this_host="here", now=made + 1) == 0
    assert leftover.exists()
    assert remove_stale_areas(str(tmp_path), this_host="here", now=made + ORPHAN_AGE + 1) == 1
    assert not leftover.exists()


def test_a_leftover_of_an_earlier_run_does_not_keep_the_next_from_its_area(
    tmp_path: Path, helper: Path
) -> None:
    # What CI met: an area of the same instance name, left behind, made every later
    # runtime of that name fall back to the engine.
    (tmp_path / "inst" / "1.sock").mkdir(parents=True)
    area = _open(helper, tmp_path)
    try:
        assert Path(area.helper).exists()
    finally:
        area.close()


class _ListenerOutOfDescriptors(socket.socket):
    def accept(self) -> tuple[socket.socket, Any]:
        raise OSError(errno.EMFILE, "Too many open files")


async def test_a_socket_that_cannot_take_its_connection_is_a_start_failure_not_a_crash(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "1.sock")
    listener = _ListenerOutOfDescriptors(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.setblocking(False)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)  # readable now: the accept is what fails
    try:
        with pytest.raises(ContainerStartFailure) as caught:
            await DockerRuntime().sockets.accept_stdio(PendingStdio(listener, path), "c0ffee")
        assert caught.value.reason == "stdio_not_connected"
        assert "Too many open files" in str(caught.value)
    finally:
        client.close()
        listener.close()


async def test_the_runtime_says_nothing_while_its_area_is_being_made_then_socket(
    tmp_path: Path, helper: Path
) -> None:
    runtime = DockerRuntime(
        base_url="unix:///var/run/docker.sock", stdio_parent=str(tmp_path), stdio_helper=str(helper)
    )
    opening = threading.Event()
    go_on = threading.Event()
    real_open = runtime.sockets._open_stdio_area

    def slow_open(labels: dict[str, str]) -> StdioArea | None:
        opening.set()
        go_on.wait(10)
        return real_open(labels)

    runtime.sockets._open_stdio_area = slow_open  # type: ignore[method-assign]
    spec = SimpleNamespace(labels={})
    listening: list[PendingStdio | None] = []

    async def first_start() -> None:
        listening.append(await runtime.sockets._listen_for_stdio(spec))  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_start)
        await trio.to_thread.run_sync(opening.wait, 10)
        assert (
            runtime.capabilities.stdio == ""
        )  # not "attach": that would be a false alarm on /healthz
        go_on.set()
    assert runtime.capabilities.stdio == "socket"
    [pending] = listening
    assert pending is not None
    pending.close()
    await runtime.close()
