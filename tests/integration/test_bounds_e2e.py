"""Bounds on the real engine: what clients and servers can do to the orchestrator, and cannot.

Each test is a fault that was found in the relay: clients that leave while their container is
being created, a client that stops reading while the orchestrator is asked to stop, a server
request nobody answers, one-shot HTTP clients that never end their session, a server whose
stderr has a huge line or never stops talking.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import socket
from pathlib import Path
from typing import Any

import docker
import pytest
import trio
from wsproto.events import AcceptConnection

from tests.http_client import HttpClient, WebSocketClient
from tests.integration.harness import (
    Orchestrator,
    build_test_image,
    containers_of,
    orchestrator,
    python_client,
    text_of,
    wait_until,
    write_suite,
)
from tests.messages import INITIALIZE, INITIALIZED, request

pytestmark = pytest.mark.integration


def host_port(running: Orchestrator) -> tuple[str, int]:
    host, port = running.http_url.removeprefix("http://").split(":")
    return host, int(port)


async def websocket(running: Orchestrator, path: str, *, rcvbuf: int | None = None) -> Any:
    sock = trio.socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect(host_port(running))
    ws, answer = await WebSocketClient.connect(
        trio.SocketStream(sock),
        path,
        headers=[(b"authorization", f"Bearer {running.token}".encode())] if running.token else [],
    )
    assert isinstance(answer, AcceptConnection), answer
    return ws


def test_clients_that_leave_while_their_container_is_created_leave_no_container(
    tmp_path: Path, project_root: Path, docker_client: docker.DockerClient
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    with orchestrator(suite, tmp_path / "o.log") as running:

        async def cycles() -> None:
            for _ in range(40):
                ws = await websocket(running, "/mcp/time")
                await ws.send_json(request(1, "fabric/registerClient", {"mounts": []}))
                await ws.hear()  # the container is being created now...
                await ws.aclose()  # ...and the client is gone

        trio.run(cycles)
        # Removed by their sessions (by name, once the create returns), not left for minutes
        # to the sweeper, nor for the shutdown.
        wait_until(
            lambda: not containers_of(docker_client, instance=running.instance),
            timeout=60,
            what="the abandoned containers to be removed",
        )


def test_sigterm_ends_the_orchestrator_while_a_client_does_not_read(
    tmp_path: Path, project_root: Path
) -> None:
    # The client is cut off by the shutdown's bound, not by the write timeout (which would end
    # its connection first when the engine buffers less than Docker does: Podman's conmon).
    suite = write_suite(
        tmp_path / "suite.yaml", [str(project_root)], limits={"client_write_timeout": "10m"}
    )
    with orchestrator(suite, tmp_path / "o.log", expect_clean_exit=False) as running:

        async def stop_while_stuck() -> int:
            ws = await websocket(running, "/mcp/everything", rcvbuf=4096)
            await ws.send_json(INITIALIZE)
            await ws.hear()
            await ws.send_json(INITIALIZED)
            big = "x" * 200_000

            async def flood() -> None:
                # Far more than the socket buffers hold: sending blocks once the relay stops
                # reading us, which is the point; the end of the orchestrator breaks it.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    for request_id in range(2, 60):
                        arguments = {"name": "echo", "arguments": {"message": big}}
                        await ws.send_json(request(request_id, "tools/call", arguments))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                await trio.sleep(2)  # the answers pile up: we never read them
                running.process.send_signal(signal.SIGTERM)
                # The shutdown bound is 10 s; it used to hang here for minutes.
                code = await trio.to_thread.run_sync(lambda: running.process.wait(timeout=60))
                nursery.cancel_scope.cancel()
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await ws.aclose()
            return code

        assert trio.run(stop_while_stuck) == 0
        forced = [e for e in running.logs() if e["event"] == "shutdown_forced"]
        assert forced, "the stuck client should have been cut off at the graceful bound"


def test_a_server_request_nobody_answers_does_not_hold_the_container_past_its_idle_timeout(
    tmp_path: Path, project_root: Path, docker_client: docker.DockerClient
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)], timeouts={"everything": "4s"})
    with orchestrator(suite, tmp_path / "o.log") as running:

        async def never_answer() -> None:
            ws = await websocket(running, "/mcp/everything")
            with_roots = {**INITIALIZE["params"], "capabilities": {"roots": {"listChanged": True}}}
            await ws.send_json(request(1, "initialize", with_roots))
            assert (await ws.hear())["id"] == 1
            await ws.send_json(INITIALIZED)
            with trio.fail_after(30):
                while True:  # the server asks for our roots; we never answer
                    message = await ws.hear()
                    if message.get("method") == "roots/list":
                        break
            # Gone after the request expired (4 s) and the idle timeout (4 s), while the client
            # stays connected — not after 600 s. (Docker has no event to wait on here.)
            await trio.to_thread.run_sync(
                functools.partial(
                    wait_until,
                    lambda: not containers_of(docker_client, instance=running.instance),
                    timeout=30,
                    what="the container to go although the server's request is unanswered",
                )
            )
            await ws.aclose()

        trio.run(never_answer)
        expired = [e for e in running.logs() if e["event"] == "server_request_expired"]
        assert expired


def test_an_http_session_its_client_never_ends_goes_at_the_idle_timeout(
    tmp_path: Path, project_root: Path, docker_client: docker.DockerClient
) -> None:
    # What `claude mcp list`, the Inspector CLI and mcp-remote do: initialize, use, leave
    # without DELETE.
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)], timeouts={"time": "3s"})
    with orchestrator(suite, tmp_path / "o.log") as running:

        async def one_shot() -> None:
            client = HttpClient(
                await trio.open_tcp_stream(*host_port(running)), headers=running.auth_header
            )
            reply = await client.request("POST", "/mcp/time", INITIALIZE)
            assert reply.status == 200
            await client.aclose()

        trio.run(one_shot)
        assert containers_of(docker_client, instance=running.instance)
        wait_until(
            lambda: not containers_of(docker_client, instance=running.instance),
            timeout=30,
            what="the abandoned HTTP session's container to go",
        )
        wait_until(
            lambda: any(e["event"] == "http_session_expired" for e in running.logs()),
            timeout=30,
            what="the HTTP session to expire",
        )


@pytest.fixture(scope="module")
def misbehaving_image() -> str:
    return build_test_image("misbehaving")


def misbehaving_suite(path: Path, root: Path, image: str, **config: int) -> Path:
    return write_suite(
        path, [str(root)], test_services={"noisy": {"image": image, "config": config}}
    )


def test_a_stderr_line_far_over_64_kib_is_cut_in_the_log_and_the_server_serves(
    tmp_path: Path, project_root: Path, misbehaving_image: str
) -> None:
    suite = misbehaving_suite(
        tmp_path / "suite.yaml", project_root, misbehaving_image, stderr_line=300_000
    )
    with orchestrator(suite, tmp_path / "o.log") as running:
        client = python_client(f"{running.ws_url}/mcp/noisy")
        try:
            assert client.ask({"op": "initialize"})["ok"]
            answer = client.ask(
                {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
            )
            assert answer["ok"], answer
            assert "UTC" in text_of(answer)
        finally:
            client.close()
        [long_line] = [
            e for e in running.logs() if e["event"] == "container_stderr" and "LLLL" in e["line"]
        ]
        assert long_line["truncated_bytes"] > 200_000


def test_a_server_that_floods_stderr_neither_stalls_the_relay_nor_the_log(
    tmp_path: Path, project_root: Path, misbehaving_image: str
) -> None:
    suite = misbehaving_suite(
        tmp_path / "suite.yaml", project_root, misbehaving_image, stderr_flood=300_000
    )
    with orchestrator(suite, tmp_path / "o.log") as running:
        client = python_client(f"{running.ws_url}/mcp/noisy")
        try:
            assert client.ask({"op": "initialize"})["ok"]
            for _ in range(5):
                answer = client.ask(
                    {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
                )
                assert answer["ok"], answer
        finally:
            client.close()
    logged = [e for e in running.logs() if e["event"] == "container_stderr"]
    suppressed = sum(
        e.get("lines", 0) for e in running.logs() if e["event"] == "container_stderr_suppressed"
    ) + sum(e.get("suppressed_before", 0) for e in logged)
    # Most of the flood is counted, not written: the log stays readable.
    assert len(logged) < 50_000
    assert suppressed > 0
    json.dumps(logged[:1])
