"""The orchestrator's HTTP routes over its own server (memory streams, no sockets)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from reactor_fabric._errors import DockerUnavailable
from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.policy.container_parts.context import RuntimeCapabilities
from reactor_fabric.runtime.base import Runtime
from reactor_fabric.trio.app import FabricApp
from reactor_fabric.trio.http_server import HttpLimits, serve_connection
from reactor_fabric.trio.serve import Fabric, assemble
from reactor_fabric.trio.streamable_http import HttpSessions
from tests.fakes import AnsweringRuntime, UnreachableRuntime
from tests.http_client import HttpClient, Reply
from tests.unit.observe.test_observer import CLIENT, call

SUITE = Suite(
    version="1.0",
    orchestrator=Orchestrator(allowed_mount_roots=["/tmp"]),
    mcp_services={"time": Service(image="reactor-fabric/mcp-server-time:x")},
)


async def get(runtime: Runtime | Fabric, path: str, method: str = "GET") -> Reply:
    """One request to the app of ``runtime``'s orchestrator (or of that orchestrator)."""
    fabric = (
        runtime
        if isinstance(runtime, Fabric)
        else assemble(suite=SUITE, runtime=runtime, network="bridge")
    )
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


async def test_healthz_says_how_containers_stdio_reaches_us_once_it_is_known() -> None:
    assert "stdio" not in (await get(AnsweringRuntime(), "/healthz")).json()  # no start yet

    class SocketRuntime(AnsweringRuntime):
        capabilities = RuntimeCapabilities(stdio="socket")

    assert (await get(SocketRuntime(), "/healthz")).json()["stdio"] == "socket"


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


class SlowRuntime(AnsweringRuntime):
    """An engine that takes half a second to answer a ping (or to fail it), counting pings."""

    def __init__(self, *, fails: bool = False) -> None:
        self.pings = 0
        self.fails = fails

    async def ping(self, *, time_bound: float | None = None) -> str:
        self.pings += 1
        await trio.sleep(0.5)
        if self.fails:
            raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")
        return "99.0-fake"


async def healthz_many_times(app: FabricApp, count: int) -> list[Reply]:
    """``count`` GET /healthz at once, each on a connection of its own."""
    replies: list[Reply] = []

    async def one() -> None:
        client_side, server_side = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_connection, server_side, app, HttpLimits())
            client = HttpClient(client_side)
            replies.append(await client.request("GET", "/healthz"))
            await client.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return replies


@pytest.mark.parametrize("fails", [False, True], ids=["answering", "unreachable"])
async def test_a_flood_of_healthz_requests_pings_the_engine_once_a_second_at_most(
    autojump_clock: trio.testing.MockClock, fails: bool
) -> None:
    # /healthz is open without the token: a loop of requests must not become a loop of
    # engine calls (each a thread and an API call, the engine's load every session shares).
    runtime = SlowRuntime(fails=fails)
    fabric = assemble(suite=SUITE, runtime=runtime, network="bridge")
    app = FabricApp(fabric, HttpSessions(fabric))
    replies = await healthz_many_times(app, 50)  # all while one ping is in flight
    assert runtime.pings == 1
    assert {reply.status for reply in replies} == ({503} if fails else {200})
    assert {reply.json()["docker"] for reply in replies} == ({"unavailable"} if fails else {"ok"})
    await trio.sleep(0.4)  # 0.9 s after the first ping began, 0.4 s after it answered
    await healthz_many_times(app, 10)
    assert runtime.pings == 1
    await trio.sleep(0.7)  # the answer is 1.1 s old: asked again
    await healthz_many_times(app, 10)
    assert runtime.pings == 2


async def test_healthz_pings_again_when_the_caller_of_the_ping_in_flight_left(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = SlowRuntime()
    fabric = assemble(suite=SUITE, runtime=runtime, network="bridge")
    app = FabricApp(fabric, HttpSessions(fabric))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app.engine.state)
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()  # mid-ping: no answer to reuse
    [reply] = await healthz_many_times(app, 1)
    assert reply.status == 200
    assert runtime.pings == 2


async def test_unknown_paths_are_404() -> None:
    reply = await get(AnsweringRuntime(), "/nope")
    assert reply.status == 404
    assert reply.json()["path"] == "/nope"


async def test_operator_views_include_the_calls_held_for_the_next_batch() -> None:
    fabric = assemble(suite=SUITE, runtime=AnsweringRuntime(), network="bridge")
    fabric.observer.defer_audit(lambda: None)  # a batch is gathering: nothing taken yet
    fabric.observer.tool_call(
        call(request_id=7, service="time"), session="s", endpoint="relay", service="time",
        container="c1", client=CLIENT, trace_id="f" * 32,
    )  # fmt: skip
    reply = await get(fabric, "/api/calls")
    assert [c["request_id"] for c in reply.json()["calls"]] == [7]
    fabric.observer.tool_call(
        call(request_id=8, service="time"), session="s", endpoint="relay", service="time",
        container="c1", client=CLIENT, trace_id="f" * 32,
    )  # fmt: skip
    metrics = (await get(fabric, "/metrics")).body.decode()
    counted = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("reactor_fabric_tool_calls_total{")
    ]
    assert sum(counted) == 2.0
