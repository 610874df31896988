"""The Docker runtime on the real engine: each bundled service answers MCP through it, and its
resource guarantees hold (nothing left behind by a failed or cancelled start).

This goes through exactly the path the relay uses: ContainerSpec from the suite → create with
stdio attached before start → Docker's multiplexed stream split into stdout and stderr → line
framing.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import docker
import pytest
import trio

from reactor_fabric import ContainerStartFailure, Service, load_suite
from reactor_fabric.policy.container_parts.ownership import LABEL_SESSION, ContainerIdentity
from reactor_fabric.policy.container_spec import container_spec_for
from reactor_fabric.protocol.framing import LineSplitter
from reactor_fabric.runtime.base import Container
from reactor_fabric.runtime.docker import DockerRuntime
from tests.fakes import EVERY_CAPABILITY
from tests.integration.harness import assert_confined_by_effect
from tests.messages import INITIALIZE, request

REPO = Path(__file__).resolve().parents[2]
SUITE = load_suite(REPO / "claude-mcp-suite.yaml")
# Not a live orchestrator's identity: the sweeper of a running orchestrator leaves these alone
# (other host), and every test removes its own containers.
TEST_IDENTITY = ContainerIdentity(
    instance_id="integration-test",
    owner_host="integration-test",
    owner_pid=0,
    owner_start="",
    default_network="bridge",
)
EXPECTED_TOOL = {
    "time": "get_current_time",
    "git": "git_log",
    "filesystem": "list_directory",
    "everything": "echo",
}


class StdioPeer:
    """Speaks newline-delimited JSON-RPC over a spawned container's attached stream."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.lines = LineSplitter(max_line=16 * 1024 * 1024)
        self.ready: list[bytes] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self.container.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def response(self, request_id: int) -> dict[str, Any]:
        """The response to `request_id`; answers the server's own requests (roots) on the way."""
        while True:
            while not self.ready:
                data = await self.container.stdout.receive_some(65536)
                assert data, "the container closed its stdout before answering"
                self.ready += self.lines.feed(bytes(data))
            message = json.loads(self.ready.pop(0))
            if message.get("id") == request_id and "method" not in message:
                return message  # type: ignore[no-any-return]
            if message.get("method") == "roots/list":
                await self.send({"jsonrpc": "2.0", "id": message["id"], "result": {"roots": []}})


def assert_confined(inspected: dict[str, Any]) -> None:
    """A server's container: the engine's record (a read-only root file system, a user that is
    not root, not privileged, nothing added), and what the kernel enforces on its processes
    (see assert_confined_by_effect: engines report dropped capabilities differently)."""
    host = inspected["HostConfig"]
    assert host["ReadonlyRootfs"] is True, host
    user = inspected["Config"]["User"]
    assert user.partition(":")[0] not in ("", "0", "root"), user
    assert not host["CapAdd"], host["CapAdd"]
    assert host["Privileged"] is False
    # The session's messages are not stored by the engine (its default json-file log would).
    assert host["LogConfig"]["Type"] == "none", host["LogConfig"]
    assert_confined_by_effect(inspected["State"]["Pid"])


@pytest.mark.parametrize("service_name", sorted(EXPECTED_TOOL))
async def test_each_bundled_service_answers_tools_list_through_the_docker_api_confined(
    service_name: str, docker_client: docker.DockerClient
) -> None:
    session_id = secrets.token_hex(8)
    spec = container_spec_for(
        service_name,
        SUITE.mcp_services[service_name],
        session_id=session_id,
        identity=TEST_IDENTITY,
        capabilities=EVERY_CAPABILITY,
    )
    engine = DockerRuntime()
    container = await engine.spawn(spec)
    try:
        # stdin and stdout are the container's own socket, not the engine's attach.
        assert container.socket_stdio
        with trio.fail_after(60):
            peer = StdioPeer(container)
            # Roots offered: the filesystem server asks for them (answered in response()).
            await peer.send(
                request(1, "initialize", {**INITIALIZE["params"], "capabilities": {"roots": {}}})
            )
            initialized = await peer.response(1)
            assert "serverInfo" in initialized["result"], initialized
            await peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await peer.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            tools = (await peer.response(2))["result"]["tools"]
            assert EXPECTED_TOOL[service_name] in {tool["name"] for tool in tools}
        inspected = docker_client.api.inspect_container(container.id)
        assert_confined(inspected)
        assert inspected["Config"]["Labels"][LABEL_SESSION] == session_id
    finally:
        with trio.CancelScope(shield=True):
            await container.aclose()
            await engine.remove(container.id)
            await engine.close()
    assert (
        docker_client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={session_id}"})
        == []
    )


async def test_a_missing_image_is_a_container_start_failure_and_leaves_nothing(
    docker_client: docker.DockerClient,
) -> None:
    session_id = secrets.token_hex(8)
    spec = container_spec_for(
        "ghost",
        Service(image="reactor-fabric/does-not-exist:0", pull="never"),
        session_id=session_id,
        identity=TEST_IDENTITY,
        capabilities=EVERY_CAPABILITY,
    )
    engine = DockerRuntime()
    try:
        with pytest.raises(ContainerStartFailure) as caught:
            await engine.spawn(spec)
    finally:
        await engine.close()
    assert caught.value.reason == "image_not_found"
    assert caught.value.to_jsonrpc_error()["code"] == -32002
    assert (
        docker_client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={session_id}"})
        == []
    )


def _everything_spec(session_id: str, **overrides: Any) -> Any:
    service = SUITE.mcp_services["everything"]
    return container_spec_for(
        "everything",
        Service(**{**{f: getattr(service, f) for f in service.__struct_fields__}, **overrides}),
        session_id=session_id,
        identity=TEST_IDENTITY,
        capabilities=EVERY_CAPABILITY,
    )


async def test_a_spawn_cancelled_during_create_leaves_no_container_once_the_create_completes(
    docker_client: docker.DockerClient,
) -> None:
    # Cancel the spawn at several points of the create call; whatever the engine did in its
    # worker thread, the container (found by its name) must be gone afterwards.
    engine = DockerRuntime()
    try:
        for delay in (0.0, 0.005, 0.02, 0.05, 0.1, 0.2):
            session_id = secrets.token_hex(8)
            spec = _everything_spec(session_id)
            with trio.move_on_after(delay):
                container = await engine.spawn(spec)
                # Started before the cancellation: the caller's to release, and a release
                # the same deadline could cut short would leave it (shielded, as the
                # orchestrator's own releases are).
                with trio.CancelScope(shield=True):
                    await container.aclose()
                    await engine.remove(container.id)
            with trio.fail_after(60):
                assert await engine.settle()  # an abandoned thread cleans up when it ends
            assert (
                docker_client.containers.list(
                    all=True, filters={"label": f"{LABEL_SESSION}={session_id}"}
                )
                == []
            ), f"a container was left after cancelling at {delay} s"
        # At least one cancellation fell while the create ran in its thread.
        assert engine.abandoned_creates_removed > 0
    finally:
        await engine.close()


async def test_stdout_and_stderr_arrive_on_their_own_streams(
    docker_client: docker.DockerClient,
) -> None:
    session_id = secrets.token_hex(8)
    spec = _everything_spec(session_id)
    engine = DockerRuntime()
    container = await engine.spawn(spec)
    try:
        with trio.fail_after(60):
            peer = StdioPeer(container)
            await peer.send(INITIALIZE)
            assert "serverInfo" in (await peer.response(1))["result"]
            await container.stdin.send_eof()
            # Both streams read to their end at once (stderr is read along with stdout).
            stderr = b""
            async with trio.open_nursery() as nursery:

                async def drain_stdout() -> None:
                    while await container.stdout.receive_some(65536):
                        pass

                nursery.start_soon(drain_stdout)
                while chunk := await container.stderr.receive_some(65536):
                    stderr += chunk
            assert b"\n" in stderr  # the everything server logs its start on stderr...
            assert not stderr.lstrip().startswith(b"{")  # ...and no JSON-RPC there
            status = await engine.exit_status(container.id)
            assert status.exit_code is not None
    finally:
        with trio.CancelScope(shield=True):
            await container.aclose()
            await engine.remove(container.id)
            await engine.close()
