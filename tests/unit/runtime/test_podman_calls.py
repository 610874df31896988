"""What the Docker runtime asks of a Podman engine that it asks differently of Docker.

A fake engine client records the calls (and fails where told); the real engine runs the same
paths in ``make test-podman``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactor_fabric import ContainerStartFailure
from reactor_fabric.policy.container_parts.confinement import ConfinementPart
from reactor_fabric.policy.container_parts.lifecycle import LifecyclePart
from reactor_fabric.policy.container_parts.program import ProgramPart
from reactor_fabric.policy.container_parts.resources import ResourcesPart
from reactor_fabric.policy.container_parts.secrets import SecretsPart
from reactor_fabric.policy.container_spec import ContainerSpec
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.pinning import Pin, PinSet
from reactor_fabric.runtime import docker_operations
from reactor_fabric.runtime.docker import DockerRuntime
from reactor_fabric.runtime.docker_errors import container_gone
from reactor_fabric.runtime.engine_api import EngineError, NotFound
from reactor_fabric.runtime.engines import identify
from tests.unit.runtime.test_engines import PODMAN_VERSION


def api_error(status: int, message: str) -> EngineError:
    # As the client makes them: the engine's message is the explanation.
    return EngineError(status, message)


class FakeClient:
    """The engine client (engine_api.EngineClient), as far as creating and removing
    containers goes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.volumes: dict[str, dict[str, Any]] = {}
        self.fail_create = False
        self.exiting = 0  # how many force-removes meet a container still exiting
        self.process_ending = 0  # how many inspects meet the container's process ending
        self.inspect_error = ""  # another 500 every inspect answers
        self.inspects = 0
        self.container_mounts: list[dict[str, Any]] = []
        self.still_running = 0  # how many inspects still say the container runs

    def create_volume(self, volume: dict[str, Any]) -> None:
        self.calls.append(("create_volume", volume["Name"]))
        if volume["Name"] in self.volumes:
            raise api_error(409, f"volume with name {volume['Name']} already exists")
        self.volumes[volume["Name"]] = volume

    def create_container(self, body: dict[str, Any], *, name: str | None = None) -> str:
        self.calls.append(("create_container", name))
        if self.fail_create:
            raise api_error(500, "no such image")
        self.created = body
        return "c0ffee"

    def inspect_container(self, container: str) -> dict[str, Any]:
        self.inspects += 1
        if self.inspect_error:
            raise api_error(500, self.inspect_error)
        if self.process_ending:
            self.process_ending -= 1
            # Podman 4.3, seen at a session's end in the integration tests.
            raise api_error(500, "read /proc/25606/cgroup: no such process")
        if self.still_running:
            self.still_running -= 1
            return {"Mounts": [], "State": {"Running": True, "Pid": 42, "ExitCode": 0}}
        return {
            "Mounts": self.container_mounts,
            "State": {"Running": False, "Pid": 0, "ExitCode": 3, "OOMKilled": False},
        }

    def remove_container(self, container: str) -> None:
        self.calls.append(("remove_container", container))
        if self.exiting:
            self.exiting -= 1
            raise api_error(500, "cannot remove container: container state improper")

    def remove_volume(self, name: str) -> None:
        self.calls.append(("remove_volume", name))
        if self.volumes.pop(name, None) is None:
            raise NotFound(404, "no such volume")

    def update_container(self, container: str, body: dict[str, Any]) -> None:
        self.calls.append(("update_container", body))

    def request(self, method: str, path: str, *, body: Any = None, versioned: bool = True) -> None:
        self.calls.append((method, (path, body, versioned)))


def on(engine: str, client: FakeClient) -> DockerRuntime:
    runtime = DockerRuntime(engine="podman" if engine == "podman" else "docker")
    runtime._engine._connect = lambda: client  # type: ignore[method-assign,assignment,return-value]
    if engine == "podman":
        runtime._identified(identify(PODMAN_VERSION))
    return runtime


@pytest.fixture(autouse=True)
def no_pause_between_removals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_operations, "REMOVE_RETRY_PAUSE", 0.0)


@pytest.fixture
def pinned(tmp_path: Path) -> Iterator[tuple[ContainerSpec, PinSet]]:
    """A spec with one mount, and its pin (a descriptor of a real directory)."""
    project = tmp_path / "project"
    project.mkdir()
    fd = os.open(project, os.O_PATH)
    found = os.fstat(fd)
    pin = Pin("/workspace", str(project), fd, found.st_dev, found.st_ino, (1234, 5678))
    spec = ContainerSpec(
        lifecycle=LifecyclePart("rf-git-0123456789ab-0", {"reactor-fabric.managed": "true"}),
        program=ProgramPart(
            image="reactor-fabric/mcp-server-git:x",
            command=None,
            pull="missing",
            user=None,
            environment={},
        ),
        mounts=(MountSpec(source=str(project), target="/workspace", read_only=True),),
        network="none",
        resources=ResourcesPart(memory_bytes=1 << 28, nano_cpus=10**9, pids_limit=64),
        confinement=ConfinementPart(),
        secrets=SecretsPart(),
    )
    pins = PinSet([pin])
    yield spec, pins
    pins.close()


async def test_on_podman_a_pinned_mount_is_a_named_volume_bound_to_the_descriptor(
    pinned: tuple[ContainerSpec, PinSet],
) -> None:
    spec, pins = pinned
    client = FakeClient()
    assert await on("podman", client)._create(spec, pins) == "c0ffee"
    [(name, volume)] = client.volumes.items()
    assert name == "rf-git-0123456789ab-0-m0"
    pin = pins.for_target("/workspace")
    assert pin is not None
    # The pinned object's owner, so that Podman does not chown the user's directory; read-only
    # at the source (gVisor's gofer binds the source as it is).
    assert volume["DriverOpts"] == {
        "type": "none",
        "o": "bind,ro,uid=1234,gid=5678",
        "device": pin.engine_source,
    }
    assert volume["Labels"]["reactor-fabric.pinned-volume-of"] == spec.name
    [mount] = client.created["HostConfig"]["Mounts"]
    assert (mount["Type"], mount["Source"], mount["Target"]) == ("volume", name, "/workspace")
    assert mount["ReadOnly"] is True  # (and in the container's mount too)
    assert client.calls[:2] == [("create_volume", name), ("create_container", spec.name)]


async def test_on_docker_a_pinned_mount_stays_an_anonymous_volume(
    pinned: tuple[ContainerSpec, PinSet],
) -> None:
    client = FakeClient()
    await on("docker", client)._create(*pinned)
    assert client.volumes == {}
    [mount] = client.created["HostConfig"]["Mounts"]
    assert mount["Source"] is None
    assert mount["VolumeOptions"]["DriverConfig"]["Options"]["o"] == "bind,ro"


async def test_on_podman_a_create_that_fails_removes_the_volumes_it_made(
    pinned: tuple[ContainerSpec, PinSet],
) -> None:
    client = FakeClient()
    client.fail_create = True
    with pytest.raises(ContainerStartFailure, match="no such image"):
        await on("podman", client)._create(*pinned)
    assert client.volumes == {}
    assert client.calls[-1] == ("remove_volume", "rf-git-0123456789ab-0-m0")


async def test_on_podman_removing_retries_a_container_still_exiting_and_removes_its_volumes(
    pinned: tuple[ContainerSpec, PinSet],
) -> None:
    client = FakeClient()
    runtime = on("podman", client)
    await runtime._create(*pinned)
    client.container_mounts = [
        {"Type": "volume", "Name": "rf-git-0123456789ab-0-m0"},
        {"Type": "volume", "Name": "someone-elses"},  # not ours: left alone
        {"Type": "bind", "Source": "/tmp"},
    ]
    client.exiting = 2
    await runtime.remove("c0ffee")
    removals = [call for call in client.calls if call[0].startswith("remove")]
    assert removals == [
        ("remove_container", "c0ffee"),
        ("remove_container", "c0ffee"),
        ("remove_container", "c0ffee"),
        ("remove_volume", "rf-git-0123456789ab-0-m0"),
    ]
    assert client.volumes == {}


async def test_a_container_that_never_stops_exiting_is_reported_not_removed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FakeClient()
    client.exiting = 10
    await on("podman", client).remove("c0ffee")
    errors = [r.message for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["container_remove_failed"]


async def test_on_podman_the_cpu_weight_is_changed_through_its_own_api() -> None:
    client = FakeClient()
    await on("podman", client).set_cpu_shares("c0ffee", 1024)
    assert client.calls == [
        (
            "POST",
            ("/v4.3.1/libpod/containers/c0ffee/update", {"cpu": {"shares": 1024}}, False),
        )
    ]
    docker_client = FakeClient()
    await on("docker", docker_client).set_cpu_shares("c0ffee", 1024)
    assert docker_client.calls == [("update_container", {"CpuShares": 1024})]


async def test_a_volume_name_taken_already_fails_the_start_and_that_volume_is_left_alone(
    pinned: tuple[ContainerSpec, PinSet],
) -> None:
    spec, pins = pinned
    client = FakeClient()
    client.volumes["rf-git-0123456789ab-0-m0"] = {"Name": "someone else's"}
    with pytest.raises(ContainerStartFailure):
        await on("podman", client)._create(spec, pins)
    assert client.volumes == {"rf-git-0123456789ab-0-m0": {"Name": "someone else's"}}
    assert ("create_container", spec.name) not in client.calls


async def test_a_container_podman_says_does_not_exist_is_gone_not_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FakeClient()

    def vanished(container: str) -> None:
        client.calls.append(("remove_container", container))
        raise api_error(500, "container c0ffee does not exist in database: no such container")

    client.remove_container = vanished  # type: ignore[method-assign]
    await on("podman", client).remove("c0ffee")
    assert [r.message for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert client.calls == [("remove_container", "c0ffee")]
    assert not container_gone(api_error(500, "container state improper"))
    assert container_gone(NotFound(404, "gone"))


async def test_on_podman_an_inspect_that_meets_the_process_ending_is_asked_again() -> None:
    client = FakeClient()
    client.process_ending = 2
    ended = await on("podman", client).exit_status("c0ffee")
    assert ended.exit_code == 3
    assert client.inspects == 3


async def test_an_inspect_that_keeps_meeting_the_process_ending_fails_as_the_engine_refusing() -> (
    None
):
    client = FakeClient()
    client.process_ending = 10
    with pytest.raises(ContainerStartFailure) as raised:
        await on("podman", client).exit_status("c0ffee")
    assert client.inspects == docker_operations.INSPECT_RETRIES
    assert raised.value.reason == "inspect_failed"
    assert "no such process" in str(raised.value)


async def test_another_engine_error_on_inspect_is_not_asked_again() -> None:
    client = FakeClient()
    client.inspect_error = "internal libpod error"
    with pytest.raises(ContainerStartFailure):
        await on("podman", client).main_pid("c0ffee")
    assert client.inspects == 1


async def test_an_exit_the_engine_reports_a_moment_late_is_waited_for_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Asked once a container's output ended, Podman may still say it runs: asked again, its
    # exit code comes; a container that really goes on running is reported so, in bounded time.
    monkeypatch.setattr(docker_operations, "EXIT_SETTLE_PAUSE", 0.0)
    client = FakeClient()
    client.still_running = 3
    ended = await on("podman", client).exit_status("c0ffee")
    assert (ended.exit_code, client.inspects) == (3, 4)
    monkeypatch.setattr(docker_operations, "EXIT_SETTLE_SECONDS", 0.05)
    monkeypatch.setattr(docker_operations, "EXIT_SETTLE_PAUSE", 0.01)
    client.still_running = 10**6
    assert (await on("docker", client).exit_status("c0ffee")).exit_code is None
