"""A container's gate on the real engine (runtime/base.py's Gate): while an isolated task's copy
is filled, its container is created — and with socket stdio started, its ``fabric-stdio`` held —
and its server runs only once the copy is whole; a copy that fails removes the container before
its server ever ran. Then through the orchestrator: an isolated service's server finds the whole
copy, in a fresh container and in a pooled one, and a session's second task on its spare copy
brought up to date.

The server is the probe image, told to count its /workspace's files at its first instruction
(``PROBE_AT_START``); the gate fills the mounted directory itself, and asks the engine whether
the container runs meanwhile.
"""

from __future__ import annotations

import functools
import secrets
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest
import trio

from reactor_fabric import ContainerStartFailure, Service, WorkspaceRefused
from reactor_fabric.policy.accounts import UNPRIVILEGED
from reactor_fabric.policy.container_parts.ownership import LABEL_SESSION
from reactor_fabric.policy.container_spec import container_spec_for
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.pinning import pin_mounts
from reactor_fabric.runtime.docker import DockerRuntime
from tests.fakes import EVERY_CAPABILITY
from tests.integration.harness import (
    Orchestrator,
    build_test_image,
    containers_of,
    git_repo,
    give_to_client,
    orchestrator,
    wait_until,
    write_suite,
)
from tests.integration.test_bounds_e2e import websocket
from tests.integration.test_docker_api_stdio import TEST_IDENTITY, StdioPeer
from tests.integration.test_security_e2e import mount_of
from tests.messages import request

FILES = 2000


@pytest.fixture(scope="module")
def probe_image() -> str:
    return build_test_image("probe")


def probe_spec(project: Path, image: str) -> Any:
    # Its first instructions: count the copy's files, then leave a mark that it ran.
    environment = {"PROBE_AT_START": "/workspace", "PROBE_MARK": "/workspace/.probe-ran"}
    project.chmod(0o777)  # (the mark: the server runs as nobody)
    return container_spec_for(
        "probe",
        Service(image=image, pull="never", network="none", env=environment),
        session_id=secrets.token_hex(8),
        identity=TEST_IDENTITY,
        mounts=(MountSpec(str(project), "/workspace"),),
        account=UNPRIVILEGED,
        capabilities=EVERY_CAPABILITY,
    )


def fill(project: Path) -> None:
    for index in range(FILES):
        (project / f"f{index}.txt").write_text(f"{index}\n")


def running(client: docker.DockerClient, spec: Any) -> list[bool]:
    """Whether each container of the spec's session runs, as the engine says."""
    return [
        c.attrs["State"]["Running"]
        for c in containers_of(client, session=spec.labels[LABEL_SESSION])
    ]


@pytest.mark.parametrize("stdio", ["socket", "attach"])
async def test_the_server_starts_on_the_whole_copy_and_the_container_is_made_meanwhile(
    tmp_path: Path, probe_image: str, docker_client: docker.DockerClient, stdio: str
) -> None:
    project = tmp_path / "copy"
    project.mkdir()
    spec = probe_spec(project, probe_image)
    seen: list[list[bool]] = []

    async def gate() -> None:
        # The container exists already (and runs, held, with socket stdio); then the copy.
        seen.append(await trio.to_thread.run_sync(running, docker_client, spec))
        await trio.to_thread.run_sync(fill, project)

    engine = DockerRuntime(socket_stdio=stdio == "socket", stdio_parent=str(tmp_path / "s"))
    try:
        container = await engine.spawn(spec, pin_mounts(spec.mounts), gate=gate)
        try:
            assert container.socket_stdio == (stdio == "socket")
            with trio.fail_after(60):
                peer = StdioPeer(container)
                await peer.send({"jsonrpc": "2.0", "id": 1, "method": "at_start"})
                assert (await peer.response(1))["result"] == {"files": FILES}
        finally:
            await container.aclose()
            await engine.remove(container.id)
    finally:
        await engine.close()
    assert (project / ".probe-ran").exists()
    # Socket stdio: started and held during the copy; the engine's attach: created, not started.
    assert seen == [[stdio == "socket"]]


async def test_a_gate_that_fails_removes_the_container_before_its_server_ran(
    tmp_path: Path, probe_image: str, docker_client: docker.DockerClient
) -> None:
    project = tmp_path / "copy"
    project.mkdir()
    spec = probe_spec(project, probe_image)
    refusal = WorkspaceRefused("the copy could not be made", reason="workspace_too_large")

    async def gate() -> None:
        assert await trio.to_thread.run_sync(running, docker_client, spec) == [True]
        raise refusal

    engine = DockerRuntime(stdio_parent=str(tmp_path / "s"))
    try:
        with pytest.raises(WorkspaceRefused) as caught:
            await engine.spawn(spec, pin_mounts(spec.mounts), gate=gate)
    finally:
        await engine.close()
    assert caught.value is refusal
    assert not containers_of(docker_client, session=spec.labels[LABEL_SESSION])
    assert not (project / ".probe-ran").exists()  # held, given up: the server never ran


async def test_a_container_that_ends_while_held_is_a_start_failure_with_its_reason(
    tmp_path: Path, probe_image: str, docker_client: docker.DockerClient
) -> None:
    project = tmp_path / "copy"
    project.mkdir()
    spec = probe_spec(project, probe_image)

    def kill() -> None:
        [container] = containers_of(docker_client, session=spec.labels[LABEL_SESSION])
        container.kill()
        wait_until(lambda: running(docker_client, spec) == [False], timeout=30, what="its end")

    async def gate() -> None:
        await trio.to_thread.run_sync(kill)  # killed (OOM, an operator) during the copy

    engine = DockerRuntime(stdio_parent=str(tmp_path / "s"))
    try:
        with pytest.raises(ContainerStartFailure) as caught:
            await engine.spawn(spec, pin_mounts(spec.mounts), gate=gate)
    finally:
        await engine.close()
    assert caught.value.reason == "stdio_not_connected"
    assert caught.value.to_jsonrpc_error()["code"] == -32002
    assert not containers_of(docker_client, session=spec.labels[LABEL_SESSION])
    assert not (project / ".probe-ran").exists()


async def logged(running: Orchestrator, event: str, *, count: int = 1) -> None:
    """Until ``running`` logged ``event`` ``count`` times (a minute at most)."""
    await trio.to_thread.run_sync(
        functools.partial(
            wait_until,
            lambda: sum(e["event"] == event for e in running.logs()) >= count,
            timeout=60,
            what=f"{event} logged {count} time(s)",
        )
    )


def client_repository(root: Path) -> Path:
    """A repository of FILES committed files, an ordinary user's (as a client's checkout)."""
    project = git_repo(root / "app", ["the client's commit"])
    for index in range(FILES):
        (project / f"f{index}.txt").write_text(f"{index}\n")
    subprocess.run(["git", "-C", str(project), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@x", "commit",
         "-q", "-m", "many"],
        check=True,
    )  # fmt: skip
    return give_to_client(project)


@pytest.mark.parametrize("warm", [0, 1], ids=["fresh", "pooled"])
def test_an_isolated_services_server_finds_the_whole_copy_fresh_or_pooled(
    tmp_path: Path, project_root: Path, probe_image: str, warm: int
) -> None:
    project = client_repository(project_root)
    service = {
        "image": probe_image,
        "container_strategy": "fresh_per_call",
        "workspace": "isolated",
        "warm": warm,
        "env": {"PROBE_AT_START": "/workspace"},
    }
    suite = write_suite(
        tmp_path / "suite.yaml", [str(project_root)], test_services={"probe": service}
    )

    async def one_session(running: Orchestrator) -> None:
        ws = await websocket(running, "/mcp/probe")
        await ws.send_json(request(1, "fabric/registerClient", mount_of(project)))
        assert "result" in await ws.hear()
        await ws.send_json(request(2, "look"))
        entries = (await ws.hear())["result"]["entries"]
        assert len(entries) == FILES + 1  # and log.txt: the whole copy, at the first request
        # The spare the first call's start began, made: the next call starts on it, or the
        # next session's first (it is kept after the session).
        await logged(running, "workspace_spare_made")
        if not warm:
            await ws.send_json(request(3, "at_start"))
            # (a container per call: this one's server started on the whole copy too)
            assert (await ws.hear())["result"]["files"] == FILES + 1
        await ws.aclose()

    async def scenario(running: Orchestrator) -> None:
        if warm:
            # The pool keeps containers of the account last asked for: the first session, the
            # project owner's, is served fresh and switches it.
            await logged(running, "pooled_container_ready")
            await one_session(running)
            await logged(running, "pooled_container_ready", count=2)
            await logged(running, "session_ended")  # (its spare kept: the next one takes it)
        await one_session(running)

    with orchestrator(suite, tmp_path / "o.log") as running:
        trio.run(scenario, running)
        logs = running.logs()
    started = [e for e in logs if e["event"] == "container_started"]
    assert started[-1]["pooled"] is bool(warm)
    # A session's task asked for at once copies the project whole (its spare is begun a
    # second after the session opened); the next one starts on the spare the first one's
    # start began, brought up to date: the whole copy all the same — the session's next
    # task (fresh), or the next session's first (pooled: the spare kept after the first
    # session, taken by the second at its start).
    spared = [e["workspace_spare"] for e in started if "workspace_spare" in e]
    assert spared == [False, True]
    kept_taken = sum(e["event"] == "workspace_spare_kept_taken" for e in logs)
    assert kept_taken == (1 if warm else 0)
