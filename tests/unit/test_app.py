"""The orchestrator's HTTP routes over its own server (memory streams, no sockets)."""

from __future__ import annotations

import trio

from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.runtime.base import Runtime
from reactor_fabric.trio.app import FabricApp
from reactor_fabric.trio.fabric import Fabric
from reactor_fabric.trio.http_server import HttpLimits, serve_connection
from reactor_fabric.trio.streamable_http import HttpSessions
from tests.fakes import AnsweringRuntime, UnreachableRuntime
from tests.http_client import HttpClient, Reply

SUITE = Suite(
    version="1.0",
    orchestrator=Orchestrator(allowed_mount_roots=["/tmp"]),
    mcp_services={"time": Service(image="reactor-fabric/mcp-server-time:x")},
)


async def get(runtime: Runtime, path: str, method: str = "GET") -> Reply:
    fabric = Fabric(suite=SUITE, runtime=runtime, network="bridge")
    app = FabricApp(fabric, HttpSessions(fabric))
    client_side, server_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, HttpLimits())
        client = HttpClient(client_side)
        reply = await client.request(method, path)
        await client.aclose()
    return reply


async def test_healthz_is_200_with_docker_ok_when_the_engine_answers() -> None:
    reply = await get(AnsweringRuntime(), "/healthz")
    assert reply.status == 200
    body = reply.json()
    assert body["status"] == "ok"
    assert body["docker"] == "ok"
    assert body["docker_version"] == "99.0-fake"
    assert (body["sessions"], body["containers"]) == (0, 0)
    assert body["version"]


async def test_healthz_is_503_with_the_reason_when_the_engine_is_unreachable() -> None:
    reply = await get(UnreachableRuntime(), "/healthz")
    assert reply.status == 503
    assert reply.json()["docker"] == "unavailable"
    assert "cannot reach" in reply.json()["docker_error"]


async def test_healthz_answers_head_without_a_body() -> None:
    reply = await get(AnsweringRuntime(), "/healthz", method="HEAD")
    assert (reply.status, reply.body) == (200, b"")


async def test_healthz_refuses_other_methods_with_405() -> None:
    reply = await get(AnsweringRuntime(), "/healthz", method="POST")
    assert reply.status == 405
    assert reply.headers["allow"] == "GET, HEAD"


async def test_unknown_paths_are_404() -> None:
    reply = await get(AnsweringRuntime(), "/nope")
    assert reply.status == 404
    assert reply.json()["path"] == "/nope"
