"""Socket stdio on the real engine: a container's stdin and stdout as its own Unix socket.

What a server in the container can do with that socket (nothing but be the server), what the
host keeps of it (nothing once connected), and what happens when it cannot be used (a clear
refusal, or stdio through the engine as before).
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

import docker
import pytest
import trio

from reactor_fabric import ContainerStartFailure, Service
from reactor_fabric.policy.container_parts.ownership import LABEL_SESSION
from reactor_fabric.policy.container_spec import container_spec_for
from reactor_fabric.runtime.docker import DockerRuntime
from reactor_fabric.runtime.docker_container import DockerContainer
from reactor_fabric.runtime.stdio_sockets import HELPER_TARGET, SOCKET_TARGET
from tests.fakes import EVERY_CAPABILITY
from tests.integration.harness import build_test_image, containers_of
from tests.integration.test_docker_api_stdio import TEST_IDENTITY, StdioPeer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def probe_image() -> str:
    return build_test_image("probe")


def _spec(image: str) -> Any:
    return container_spec_for(
        "probe",
        Service(image=image, pull="never", network="none"),
        session_id=secrets.token_hex(8),
        identity=TEST_IDENTITY,
        capabilities=EVERY_CAPABILITY,
    )


async def _ask(peer: StdioPeer, number: int, method: str, path: str) -> dict[str, Any]:
    await peer.send({"jsonrpc": "2.0", "id": number, "method": method, "params": {"path": path}})
    return (await peer.response(number))["result"]  # type: ignore[no-any-return]


def _area_files(parent: Path) -> list[str]:
    return sorted(str(path.relative_to(parent)) for path in parent.rglob("*"))


async def _remove_all(engine: DockerRuntime, containers: list[DockerContainer]) -> None:
    with trio.CancelScope(shield=True):
        for container in containers:
            await container.aclose()
            await engine.remove(container.id)
        await engine.close()


async def test_a_server_cannot_reconnect_its_stdio_socket_replace_the_helper_or_see_another(
    tmp_path: Path, probe_image: str
) -> None:
    parent = tmp_path / "stdio"
    engine = DockerRuntime(stdio_parent=str(parent))
    first = second = None
    try:
        first = await engine.spawn(_spec(probe_image))
        second = await engine.spawn(_spec(probe_image))
        assert first.socket_stdio
        assert second.socket_stdio
        with trio.fail_after(60):
            peer = StdioPeer(first)
            # Its socket no longer listens: nothing in the container can open a second stdio.
            again = await _ask(peer, 1, "connect", SOCKET_TARGET)
            assert "ConnectionRefusedError" in (again["error"] or ""), again
            # Our program cannot be changed, nor the socket opened as a file.
            written = await _ask(peer, 2, "write", HELPER_TARGET)
            assert "Read-only file system" in (written["error"] or ""), written
            opened = await _ask(peer, 3, "write", SOCKET_TARGET)
            assert "No such device or address" in (opened["error"] or ""), opened
            # It sees its own two binds, and nothing of the other container's.
            seen = await _ask(peer, 4, "look", os.path.dirname(SOCKET_TARGET))
            assert seen["entries"] == sorted(
                os.path.basename(p) for p in (HELPER_TARGET, SOCKET_TARGET)
            )
            # The other container still answers on its own socket.
            other = await _ask(StdioPeer(second), 1, "look", "/")
            assert other["error"] is None
        # On the host, both sockets were unlinked once connected: the area holds our program
        # and who made it, in directories only we can enter.
        [area] = list(parent.iterdir())
        assert _area_files(area) == ["fabric-stdio", "owner.json"]
        for directory in (parent, area):
            mode = directory.stat().st_mode
            assert stat.S_IMODE(mode) == 0o700, oct(mode)
    finally:
        await _remove_all(engine, [c for c in (first, second) if c is not None])
    assert _area_files(parent) == []  # the area goes with the runtime


async def test_a_container_whose_stdio_never_connects_is_refused_with_its_exit_and_removed(
    tmp_path: Path, probe_image: str, docker_client: docker.DockerClient
) -> None:
    # A "helper" that exits as fabric-stdio does when it cannot connect.
    never = tmp_path / "never-connects"
    never.write_text("#!/bin/sh\necho 'fabric-stdio: connect: refused' >&2\nexit 70\n")
    never.chmod(0o755)
    parent = tmp_path / "stdio"
    engine = DockerRuntime(stdio_parent=str(parent), stdio_helper=str(never))
    spec = _spec(probe_image)
    refused: ContainerStartFailure | None = None
    try:
        with trio.fail_after(60):
            try:
                unexpected = await engine.spawn(spec)
            except ContainerStartFailure as exc:
                refused = exc
            else:  # not refused: the test fails below, leaving nothing behind
                await _remove_all(engine, [unexpected])
    finally:
        await engine.close()
    assert refused is not None, "a container whose stdio never connected was handed out"
    assert refused.reason == "stdio_not_connected"
    assert refused.to_jsonrpc_error()["data"]["exit_code"] == 70
    assert not containers_of(docker_client, session=spec.labels[LABEL_SESSION])
    assert _area_files(parent) == []


async def test_without_the_helper_stdio_goes_through_the_engine_and_the_log_says_why_once(
    tmp_path: Path, probe_image: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = DockerRuntime(
        stdio_parent=str(tmp_path / "stdio"), stdio_helper=str(tmp_path / "missing")
    )
    containers: list[DockerContainer] = []
    try:
        with caplog.at_level(logging.WARNING, logger="reactor_fabric.runtime.docker"):
            for _ in range(2):
                # Kept one by one: the finally removes those made before a failure.
                containers.append(await engine.spawn(_spec(probe_image)))  # noqa: PERF401
        for container in containers:
            assert not container.socket_stdio
            with trio.fail_after(60):
                answer = await _ask(StdioPeer(container), 1, "look", "/")
            assert answer["error"] is None
            assert ".reactor-fabric" not in answer["entries"]
    finally:
        await _remove_all(engine, containers)
    said = [r for r in caplog.records if r.getMessage() == "socket_stdio_unavailable"]
    assert len(said) == 1
    assert said[0].reason == "helper_missing"  # type: ignore[attr-defined]


async def test_a_container_whose_socket_cannot_be_made_gets_stdio_through_the_engine(
    tmp_path: Path, probe_image: str, caplog: pytest.LogCaptureFixture
) -> None:
    parent = tmp_path / "stdio"
    engine = DockerRuntime(stdio_parent=str(parent))
    containers: list[DockerContainer] = []
    try:
        containers.append(await engine.spawn(_spec(probe_image)))
        # Someone removes the area under the running orchestrator (a cleaner of /tmp).
        [area] = list(parent.iterdir())
        for path in area.iterdir():
            path.unlink()
        area.rmdir()
        with caplog.at_level(logging.WARNING, logger="reactor_fabric.runtime.docker"):
            containers.append(await engine.spawn(_spec(probe_image)))
        assert [c.socket_stdio for c in containers] == [True, False]
        for container in containers:
            with trio.fail_after(60):
                assert (await _ask(StdioPeer(container), 1, "look", "/"))["error"] is None
    finally:
        await _remove_all(engine, containers)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("socket_stdio")]
    assert said == ["socket_stdio_failed"]
