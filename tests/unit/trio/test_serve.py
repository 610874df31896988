"""The orchestrator over real loopback sockets (the in-memory runtime behind it): what needs the
kernel — the connection cap, file descriptors, and a shutdown bounded even when a client does
not read."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trio.testing

from reactor_fabric.config.structs import Limits
from reactor_fabric.policy.container_parts.ownership import LABEL_SESSION
from reactor_fabric.runtime.memory import MemoryRuntime, open_memory_runtime
from reactor_fabric.trio.serve import (
    Orchestrator,
    assemble,
    bind_listener,
    serve_orchestrator,
)
from tests.fakes import scripted_mcp_server
from tests.http_client import HttpClient, WebSocketClient
from tests.messages import INITIALIZE, INITIALIZED, request
from tests.served import suite_for


@asynccontextmanager
async def running(
    root: Path, *, limits: Limits | None = None
) -> AsyncIterator[tuple[Orchestrator, MemoryRuntime, trio.Nursery]]:
    suite = suite_for(root, limits=limits)
    async with open_memory_runtime(scripted_mcp_server) as runtime:
        fabric = assemble(suite, runtime=runtime, network="none")
        with bind_listener("127.0.0.1", 0) as listener:
            async with trio.open_nursery() as nursery:
                orchestrator: Orchestrator = await nursery.start(
                    serve_orchestrator, fabric, listener
                )
                yield orchestrator, runtime, nursery
                nursery.cancel_scope.cancel()
        assert runtime.alive == []


async def tcp(orchestrator: Orchestrator) -> trio.SocketStream:
    host, port = orchestrator.http_url.removeprefix("http://").split(":")
    return await trio.open_tcp_stream(host, int(port))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_connections_beyond_the_cap_get_503_and_room_comes_back(tmp_path: Path) -> None:
    async with running(tmp_path, limits=Limits(max_connections=3)) as (orchestrator, _rt, _n):
        idle = [await tcp(orchestrator) for _ in range(3)]
        with trio.fail_after(10):
            while orchestrator.connections.open < 3:  # the server has taken them
                await orchestrator.fabric.registry.changed.wait()
        refused = HttpClient(await tcp(orchestrator))
        with trio.fail_after(10):
            reply = await refused.request("GET", "/healthz")
        assert reply.status == 503
        await refused.aclose()
        await idle.pop().aclose()
        with trio.fail_after(10):
            while True:  # the freed slot is noticed when the server reads the EOF
                client = HttpClient(await tcp(orchestrator))
                reply = await client.request("GET", "/healthz")
                await client.aclose()
                if reply.status == 200:
                    break
        for stream in idle:
            await stream.aclose()


async def test_many_sessions_and_requests_leave_no_file_descriptor_behind(tmp_path: Path) -> None:
    async with running(tmp_path) as (orchestrator, runtime, _nursery):
        before = open_fds()
        for round_number in range(20):
            ws, _ = await WebSocketClient.connect(await tcp(orchestrator), "/mcp/svc")
            await ws.send_json(INITIALIZE)
            assert (await ws.hear())["id"] == 1
            await ws.close()
            await ws.aclose()
            client = HttpClient(await tcp(orchestrator))
            opened = await client.request("POST", "/mcp/svc", INITIALIZE)
            assert opened.status == 200, round_number
            await client.request("DELETE", "/mcp/svc", headers={"mcp-session-id": opened.session})
            await client.aclose()
        with trio.fail_after(10):
            await orchestrator.wait_until_idle()  # the server has seen the last EOFs
        assert runtime.alive == []
        assert open_fds() <= before


async def test_a_stop_answers_requests_in_flight_and_closes_sessions_normally(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as (orchestrator, runtime, _nursery):
        ws, _ = await WebSocketClient.connect(await tcp(orchestrator), "/mcp/svc")
        await ws.send_json(INITIALIZE)
        await ws.hear()
        await ws.send_json(INITIALIZED)
        hold = {"name": "hold", "arguments": {}}
        await ws.send_json(request(2, "tools/call", hold))
        http = HttpClient(await tcp(orchestrator))
        opened = await http.request("POST", "/mcp/svc", INITIALIZE)
        await http.send_request(
            "POST", "/mcp/svc", request(5, "tools/call", hold),
            headers={"mcp-session-id": opened.session},
        )  # fmt: skip
        with trio.fail_after(15):
            # Both calls run: each server said so (over HTTP, on the POST's SSE stream).
            assert (await ws.hear())["params"]["data"] == "holding"
            head = await http.read_head()
            assert head.headers["content-type"] == "text/event-stream"
            first_event = await http.read_chunk()
            assert first_event is not None
            assert b"holding" in first_event
        orchestrator.stop()
        with trio.fail_after(15):
            answer = await ws.hear()
            assert answer["id"] == 2
            assert answer["error"]["data"]["reason"] == "orchestrator_stopping"
            assert await ws.close_code() == 1000
            body = b""
            while (chunk := await http.read_chunk()) is not None:
                body += chunk
        events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith(b"data: ")]
        assert [(e["id"], e["error"]["data"]["reason"]) for e in events] == [
            (5, "orchestrator_stopping")
        ]
        await ws.aclose()
        await http.aclose()
        with trio.fail_after(15):
            await orchestrator.wait_until_idle()
        assert runtime.alive == []


async def test_a_stop_ends_even_when_a_client_does_not_read(tmp_path: Path) -> None:
    # The bound is 2 s; a stop that waited for this client would never end (hypercorn's sends
    # could not be cancelled: such a stop hung for minutes). 30 s only tells "ends" from "hangs".
    limits = Limits(shutdown_timeout="2s", buffer_to_client="64k")
    async with open_memory_runtime(scripted_mcp_server) as runtime:
        fabric = assemble(suite_for(tmp_path, limits=limits), runtime=runtime, network="none")
        with bind_listener("127.0.0.1", 0) as listener, trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                orchestrator: Orchestrator = await nursery.start(
                    serve_orchestrator, fabric, listener
                )
                sock = trio.socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                await sock.connect(listener.getsockname())
                stuck, _ = await WebSocketClient.connect(trio.SocketStream(sock), "/mcp/svc")
                await stuck.send_json(INITIALIZE)
                await stuck.hear()
                flood = {"name": "notify", "arguments": {"count": 5000, "size": 1000}}
                await stuck.send_json(request(2, "tools/call", flood))
                # The session's server (the catalog's probe of the service may still run).
                [server] = [
                    s
                    for s in runtime.alive
                    if s.spec.labels[LABEL_SESSION] in fabric.registry.sessions
                ]
                with trio.fail_after(10):
                    # Stuck: the relay stopped reading its container, whose stdout filled up,
                    # because its writes to us do not move (we never read).
                    while server.stdout.buffered < runtime.output_capacity:
                        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
                orchestrator.stop()
                # serve_orchestrator returns; the nursery ends.
            await stuck.aclose()
    assert runtime.alive == []
    assert fabric.registry.sessions == {}
