"""Sessions end to end over the in-memory backend: handshake, relay, idle, crashes, leaks.

Deterministic: no sleeps; time-based behaviour runs on trio's autojump clock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from reactor_fabric import ContainerStartFailure, DockerUnavailable, SecurityViolation
from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.runtime.memory import Fault, MemoryRuntime, Server, open_memory_runtime
from reactor_fabric.trio import containers as containers_module
from reactor_fabric.trio.serve import Fabric, assemble
from reactor_fabric.trio.session import serve_session
from tests.fakes import (
    INITIALIZE,
    INITIALIZED,
    GoneMidAnswer,
    MemoryClient,
    request,
    scripted_mcp_server,
    until,
)
from tests.leaks import cancel_at_every_step, cancelled_after


def suite(
    root: Path,
    *,
    timeout: str = "1m",
    max_sessions: int = 8,
    max_message: str = "16m",
    service: dict[str, Any] | None = None,
) -> Suite:
    return Suite(
        version="1.0",
        orchestrator=Orchestrator(
            allowed_mount_roots=[str(root)],
            max_sessions=max_sessions,
            max_message_size=max_message,
        ),
        mcp_services={"svc": Service(image="fake/svc:1", timeout=timeout, **(service or {}))},
    )


class Harness:
    def __init__(self, client: MemoryClient, engine: MemoryRuntime, fabric: Fabric) -> None:
        self.client = client
        self.engine = engine
        self.fabric = fabric

    async def handshake(self) -> dict[str, Any]:
        await self.client.say(INITIALIZE)
        answer = await self.client.hear()
        await self.client.say(INITIALIZED)
        return answer

    async def call(self, request_id: int, tool: str, **arguments: Any) -> dict[str, Any]:
        await self.client.say(
            request(request_id, "tools/call", {"name": tool, "arguments": arguments})
        )
        return await self.client.hear()


@asynccontextmanager
async def running_session(
    root: Path,
    *,
    server: Server = scripted_mcp_server,
    service: str = "svc",
    query_mounts: tuple[str, ...] = (),
    idle_timeout: str = "1m",
    max_message: str = "16m",
    service_fields: dict[str, Any] | None = None,
) -> AsyncIterator[Harness]:
    async with open_memory_runtime(server) as engine:
        fabric = assemble(
            suite(root, timeout=idle_timeout, max_message=max_message, service=service_fields),
            runtime=engine,
            network="none",
        )
        client = MemoryClient()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_session, fabric, client, service, list(query_mounts))
            yield Harness(client, engine, fabric)
            await client.leave()
        # The session has ended: nothing may be left of it.
        assert engine.alive == []
        assert fabric.registry.sessions == {}
        assert fabric.registry.container_count == 0


async def test_register_client_as_a_method_is_answered_with_the_session_id_and_mounts(
    tmp_path: Path,
) -> None:
    (tmp_path / "repo").mkdir()
    async with running_session(tmp_path) as h:
        mount = {"source": str(tmp_path / "repo"), "target": "/workspace", "readOnly": True}
        await h.client.say(request(7, "fabric/registerClient", {"mounts": [mount]}))
        answer = await h.client.hear()
        assert answer["id"] == 7
        assert len(answer["result"]["sessionId"]) == 32
        assert answer["result"]["mounts"] == [mount]
        await h.handshake()
        [spec] = h.engine.spawned
        assert [(m.source, m.target, m.read_only) for m in spec.mounts] == [
            (str(tmp_path / "repo"), "/workspace", True)
        ]
        assert spec.labels["reactor-fabric.session"] == answer["result"]["sessionId"]


async def test_register_client_as_a_tool_call_is_answered_with_structured_content(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path) as h:
        mount = {"source": str(tmp_path), "target": "/workspace"}
        await h.client.say(
            request(
                1, "tools/call", {"name": "fabric/registerClient", "arguments": {"mounts": [mount]}}
            )
        )
        answer = await h.client.hear()
        result = answer["result"]
        assert result["isError"] is False
        assert result["structuredContent"]["mounts"] == [{**mount, "readOnly": False}]
        assert result["content"][0]["type"] == "text"
        assert result["structuredContent"]["sessionId"] in result["content"][0]["text"]


async def test_the_container_starts_right_after_register_before_the_next_message(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path) as h:
        await h.client.say(request(1, "fabric/registerClient", {"mounts": []}))
        await h.client.hear()
        await trio.testing.wait_all_tasks_blocked()
        assert len(h.engine.alive) == 1  # started while the client prepares its initialize


async def test_a_first_message_that_is_not_register_is_forwarded_byte_for_byte(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path, query_mounts=(f"{tmp_path}:/workspace:ro",)) as h:
        raw = (
            b'{"id": 1,  "jsonrpc":"2.0", "method":"initialize", "params": '
            b'{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x"}}}'
        )
        await h.client.say(raw)
        answer = await h.client.hear()
        assert answer["result"]["serverInfo"]["name"] == "scripted"
        [container] = h.engine.alive
        assert container.stdin_lines[0] == raw
        [spec] = h.engine.spawned
        assert [(m.target, m.read_only) for m in spec.mounts] == [("/workspace", True)]


async def test_server_discover_first_is_forwarded_and_its_error_passes_through(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path) as h:
        await h.client.say(request(1, "server/discover"))
        answer = await h.client.hear()
        assert answer["error"]["code"] == -32601  # the server's own answer, untouched


@pytest.mark.parametrize(
    ("first", "code", "reason"),
    [
        (b"{not json", -32700, "invalid_json"),
        (b'[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', -32600, "batch_not_supported"),
        (b'"hello"', -32600, "not_an_object"),
        (b'{"jsonrpc":"2.0","id":1,"result":{}}', -32600, "unexpected_response"),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"fabric/registerClient"}',
            -32600,
            "register_without_mounts",
        ),
    ],
    ids=["not-json", "batch", "not-an-object", "a-response", "register-without-mounts"],
)
async def test_a_malformed_first_message_is_answered_then_closed_and_nothing_starts(
    tmp_path: Path, first: bytes, code: int, reason: str
) -> None:
    async with running_session(tmp_path) as h:
        await h.client.say(first)
        answer = await h.client.hear()
        assert answer["error"]["code"] == code
        assert answer["error"]["data"]["reason"] == reason
        await trio.testing.wait_all_tasks_blocked()
        assert h.client.closed_with is not None
        assert h.engine.spawned == []


async def test_an_unknown_service_is_answered_with_32005_then_closed(tmp_path: Path) -> None:
    async with running_session(tmp_path, service="nope") as h:
        await h.client.say(INITIALIZE)
        answer = await h.client.hear()
        assert answer["id"] == 1
        assert answer["error"]["code"] == -32005
        assert answer["error"]["message"].startswith("Service Not Found: ")
        assert answer["error"]["data"]["reason"] == "service_not_found"
        assert h.engine.spawned == []


@pytest.mark.parametrize(
    ("mount", "reason"),
    [
        ({"source": "/etc", "target": "/workspace"}, "mount_outside_allowed_roots"),
        ({"source": "{root}", "target": "/etc"}, "mount_target_forbidden"),
        ({"source": "relative", "target": "/w"}, "mount_source_not_absolute"),
    ],
    ids=["outside-roots", "forbidden-target", "relative-source"],
)
async def test_a_refused_mount_is_answered_with_32004_and_nothing_starts(
    tmp_path: Path, mount: dict[str, str], reason: str
) -> None:
    mount = {key: value.format(root=tmp_path) for key, value in mount.items()}
    async with running_session(tmp_path) as h:
        await h.client.say(request(1, "fabric/registerClient", {"mounts": [mount]}))
        answer = await h.client.hear()
        assert answer["error"]["code"] == -32004
        assert answer["error"]["data"]["reason"] == reason
        assert answer["error"]["data"]["path"]
        assert h.engine.spawned == []


async def test_a_refused_query_mount_is_answered_with_32004(tmp_path: Path) -> None:
    async with running_session(tmp_path, query_mounts=("/etc:/workspace",)) as h:
        await h.client.say(INITIALIZE)
        answer = await h.client.hear()
        assert answer["error"]["code"] == -32004
        assert h.engine.spawned == []


async def test_requests_and_responses_are_relayed_and_stderr_never_reaches_the_client(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path) as h:
        await h.handshake()
        answer = await h.call(2, "echo", text="héllo")
        assert json.loads(answer["result"]["content"][0]["text"]) == {"text": "héllo"}
        await trio.testing.wait_all_tasks_blocked()
        assert h.client.from_relay.statistics().current_buffer_used == 0  # no stderr line


async def test_a_frame_with_raw_newlines_is_compacted_into_one_stdin_line(tmp_path: Path) -> None:
    async with running_session(tmp_path) as h:
        await h.handshake()
        await h.client.say(b'{"jsonrpc": "2.0",\n "id": 5,\r\n "method": "tools/list"}')
        assert (await h.client.hear())["id"] == 5
        [container] = h.engine.alive
        assert container.stdin_lines[-1] == b'{"jsonrpc":"2.0","id":5,"method":"tools/list"}'


async def test_a_batch_after_the_handshake_gets_an_error_and_is_not_forwarded(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path) as h:
        await h.handshake()
        await h.client.say(b'[{"jsonrpc":"2.0","id":9,"method":"tools/list"}]')
        answer = await h.client.hear()
        assert answer["error"]["code"] == -32600
        assert answer["error"]["data"]["reason"] == "batch_not_supported"
        [container] = h.engine.alive
        assert all(not line.startswith(b"[") for line in container.stdin_lines)


async def test_progress_notifications_and_server_requests_pass_through(tmp_path: Path) -> None:
    async with running_session(tmp_path) as h:
        await h.handshake()
        await h.client.say(
            request(
                3,
                "tools/call",
                {"name": "progress", "arguments": {}, "_meta": {"progressToken": "p1"}},
            )
        )
        assert (await h.client.hear())["params"]["progress"] == 1
        assert (await h.client.hear())["params"]["progress"] == 2
        assert (await h.client.hear())["id"] == 3
        await h.client.say(request(4, "tools/call", {"name": "ask", "arguments": {}}))
        asked = await h.client.hear()
        assert asked["method"] == "roots/list"
        await h.client.say({"jsonrpc": "2.0", "id": asked["id"], "result": {"roots": []}})
        assert (await h.client.hear())["id"] == 4


async def test_an_idle_container_is_removed_and_the_next_message_resumes_transparently(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_session(tmp_path, idle_timeout="30s") as h:
        first = await h.handshake()
        [old] = h.engine.alive
        await trio.sleep(31)
        assert h.engine.alive == []  # torn down...
        assert h.client.closed_with is None  # ...but the client stays connected
        answer = await h.call(2, "echo", n=1)
        assert json.loads(answer["result"]["content"][0]["text"]) == {"n": 1}
        [new] = h.engine.alive
        assert new.id != old.id
        # The fresh server saw the recorded handshake first, under the relay's own id.
        replayed = [json.loads(line) for line in new.stdin_lines[:2]]
        assert replayed[0]["method"] == "initialize"
        assert replayed[0]["id"] == "reactor-fabric-replay-1"
        assert replayed[0]["params"] == INITIALIZE["params"]
        assert replayed[1] == INITIALIZED
        # ...and the client never saw the replayed response.
        await trio.testing.wait_all_tasks_blocked()
        assert h.client.from_relay.statistics().current_buffer_used == 0
        assert first["id"] == 1


async def test_a_stateless_client_resumes_after_idle_with_nothing_replayed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_session(tmp_path, idle_timeout="10s") as h:
        assert (await h.call(1, "echo", a=1))["id"] == 1
        await trio.sleep(11)
        assert h.engine.alive == []
        assert (await h.call(2, "echo", a=2))["id"] == 2
        [new] = h.engine.alive
        assert [json.loads(line)["id"] for line in new.stdin_lines] == [2]


async def test_each_call_to_a_per_call_service_runs_in_its_own_container_removed_after_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fields = {"container_strategy": "fresh_per_call"}
    async with running_session(tmp_path, service_fields=fields) as h:
        await h.handshake()
        for n in range(3):
            answer = await h.call(2 + n, "echo", n=n)
            assert json.loads(answer["result"]["content"][0]["text"]) == {"n": n}
            # gone after its call, before the next one
            removed = n + 1
            await until(
                lambda: len(h.engine.removals) == removed and h.engine.alive == [],  # noqa: B023
                what="its container gone",
            )
        assert len(set(h.engine.removals)) == 3
        assert h.fabric.registry.container_count == 0
        servers = list(h.engine.servers.values())
        assert len(servers) == 3
        for server in servers[1:]:  # the client's handshake replayed before the call
            methods = [json.loads(line).get("method") for line in server.stdin_lines]
            assert methods == ["initialize", "notifications/initialized", "tools/call"]


async def test_a_smart_refresh_container_over_its_memory_threshold_serves_no_further_call(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fields = {"container_strategy": "smart_refresh", "memory_threshold": "1m"}
    async with running_session(tmp_path, service_fields=fields) as h:
        await h.handshake()
        [first] = h.engine.alive
        await h.call(2, "echo", n=1)
        await trio.testing.wait_all_tasks_blocked()
        assert h.engine.alive == [first]  # under the threshold (no figure yet: kept)
        h.engine.memory[first.id] = 2 << 20
        await h.call(3, "echo", n=2)  # measured after this call: over
        await until(lambda: first not in h.engine.alive, what="the container replaced")
        answer = await h.call(4, "echo", n=3)
        assert json.loads(answer["result"]["content"][0]["text"]) == {"n": 3}
        [second] = h.engine.alive
        assert second.id != first.id
        assert json.loads(second.stdin_lines[0])["method"] == "initialize"  # replayed first


async def test_a_container_is_not_torn_down_while_a_request_is_in_flight(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_session(tmp_path, idle_timeout="10s") as h:
        await h.handshake()
        await h.client.say(request(2, "tools/call", {"name": "wait", "arguments": {"seconds": 50}}))
        await trio.sleep(40)
        assert len(h.engine.alive) == 1
        assert (await h.client.hear())["id"] == 2
        await trio.sleep(11)
        assert h.engine.alive == []


async def test_a_container_that_dies_answers_in_flight_requests_with_32002_and_respawns(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path) as h:
        await h.handshake()
        await h.client.say(request(2, "tools/call", {"name": "wait", "arguments": {}}))
        await h.client.say(request(3, "tools/call", {"name": "crash", "arguments": {}}))
        errors = {}
        for _ in range(2):
            answer = await h.client.hear()
            errors[answer["id"]] = answer["error"]
        assert set(errors) == {2, 3}
        data = errors[2]["data"]
        assert errors[2]["code"] == -32002
        assert data["reason"] == "container_exited"
        assert data["exit_code"] == 3
        assert "fatal: asked to crash" in data["stderr"]
        await trio.testing.wait_all_tasks_blocked()
        assert h.engine.alive == []
        # The next message gets a fresh container with the session restored.
        assert (await h.call(4, "echo"))["id"] == 4
        assert len(h.engine.spawned) == 2


async def test_a_server_message_over_the_size_limit_replaces_the_container_with_a_reason(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path, max_message="64k") as h:
        await h.handshake()
        answer = await h.call(2, "flood", pieces=2)
        assert answer["error"]["code"] == -32002
        assert answer["error"]["data"]["reason"] == "container_output_invalid"
        assert "could not be relayed" in answer["error"]["data"]["detail"]
        assert "65536" in answer["error"]["data"]["detail"]  # the limit, in bytes
        await trio.testing.wait_all_tasks_blocked()
        assert h.engine.alive == []
        assert (await h.call(3, "echo"))["id"] == 3  # a fresh container serves the next one


async def test_a_relayed_calls_outcome_is_handed_to_the_audit_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The answer goes out first; reading what it says is left to the audit's own time (with
    # the audit batched, off the answer's path), never done by the driver on the way.
    handed: list[int] = []

    def audit_call(*args: Any, **_kwargs: Any) -> None:
        handed.append(args[2].held_bytes)

    monkeypatch.setattr(containers_module, "audit_call", audit_call)
    async with running_session(tmp_path) as h:
        await h.handshake()
        assert "result" in await h.call(2, "echo")
        await trio.testing.wait_all_tasks_blocked()
    assert len(handed) == 1
    assert handed[0] > 0  # the answer's bytes, still held: its outcome not read yet


async def test_a_container_replaced_for_its_output_is_recorded_as_removed_for_that_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_session(tmp_path, max_message="64k") as h:
        await h.handshake()
        with caplog.at_level(logging.INFO, logger="reactor_fabric.trio.containers"):
            # (answered first: when the line breaks nothing is owed, so no answer goes out
            # between the machine's stop and the driver noticing the output ended)
            assert (await h.call(2, "flood", pieces=2, late=True))["result"] == {"content": []}
            await trio.testing.wait_all_tasks_blocked()
        removed = [r for r in caplog.records if r.getMessage() == "container_removed"]
        assert [r.__dict__["why"] for r in removed] == ["container_output_invalid"]


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (
            ContainerStartFailure("no such image", reason="image_not_found"),
            -32002,
            "image_not_found",
        ),
        (
            DockerUnavailable("socket refused", reason="docker_unavailable"),
            -32001,
            "docker_unavailable",
        ),
    ],
)
async def test_a_failed_start_answers_the_waiting_request_and_the_next_one_retries(
    tmp_path: Path, error: Exception, code: int, reason: str
) -> None:
    async with running_session(tmp_path) as h:
        h.engine.fault("create", error=error)
        await h.client.say(INITIALIZE)
        answer = await h.client.hear()
        assert answer["id"] == 1
        assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (code, reason)
        h.engine.clear_faults()
        assert "result" in await h.handshake()


async def test_the_session_cap_refuses_new_sessions_with_a_clear_error(tmp_path: Path) -> None:
    async with open_memory_runtime(scripted_mcp_server) as engine:
        fabric = assemble(suite(tmp_path, max_sessions=1), runtime=engine, network="none")
        first, second = MemoryClient(), MemoryClient()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_session, fabric, first, "svc", [])
            nursery.start_soon(serve_session, fabric, second, "svc", [])
            await first.say(INITIALIZE)
            await first.hear()
            await second.say(INITIALIZE)
            refused = await second.hear()
            assert refused["error"]["data"]["reason"] == "too_many_sessions"
            await trio.testing.wait_all_tasks_blocked()
            assert second.closed_with == (
                1000,
                "too_many_sessions",
            )  # normal: clients read the error
            await first.leave()
        assert engine.alive == []


async def test_two_sessions_get_two_containers_with_their_own_mounts(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with open_memory_runtime(scripted_mcp_server) as engine:
        fabric = assemble(suite(tmp_path), runtime=engine, network="none")
        clients = [MemoryClient(), MemoryClient()]
        async with trio.open_nursery() as nursery:
            for client, name in zip(clients, "ab", strict=True):
                nursery.start_soon(serve_session, fabric, client, "svc", [])
                await client.say(
                    request(
                        1,
                        "fabric/registerClient",
                        {"mounts": [{"source": str(tmp_path / name), "target": "/workspace"}]},
                    )
                )
                await client.hear()
            await until(lambda: len(engine.spawned) == 2, what="both containers created")
            sources = sorted(spec.mounts[0].source for spec in engine.spawned)
            assert sources == [str(tmp_path / "a"), str(tmp_path / "b")]
            assert len({spec.labels["reactor-fabric.session"] for spec in engine.spawned}) == 2
            for client in clients:
                await client.leave()
        assert engine.alive == []


async def test_a_client_leaving_removes_its_container(tmp_path: Path) -> None:
    async with running_session(tmp_path) as h:
        await h.handshake()
        [container] = h.engine.alive
    assert container.removed


async def test_a_client_gone_mid_answer_ends_the_relay_session_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_memory_runtime(scripted_mcp_server) as engine:
        fabric = assemble(suite(tmp_path), runtime=engine, network="none")
        client = GoneMidAnswer()
        with caplog.at_level(logging.INFO, logger="reactor_fabric.trio.session"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_session, fabric, client, "svc", [])
                await client.say(INITIALIZE)
                await client.hear()
                await client.say(INITIALIZED)
                client.gone = True
                await client.say(request(2, "tools/call", {"name": "echo", "arguments": {}}))
            # serve_session returned on its own: the answer it could not deliver ended it.
        assert client.failed_sends == 1
        assert engine.alive == []
        assert fabric.registry.sessions == {}
        events = [record.getMessage() for record in caplog.records]
        assert "session_ended" in events
        assert "session_crashed" not in events


async def test_a_client_gone_before_its_refusal_ends_the_session_without_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_memory_runtime(scripted_mcp_server) as engine:
        fabric = assemble(suite(tmp_path), runtime=engine, network="none")
        client = GoneMidAnswer()
        client.gone = True
        with caplog.at_level(logging.INFO, logger="reactor_fabric.trio.session"):
            await serve_session(
                fabric, client, "nope", [], first_frame=json.dumps(INITIALIZE).encode()
            )
        assert client.failed_sends == 1
        events = [record.getMessage() for record in caplog.records]
        assert "session_refused" in events
        assert "session_crashed" not in events


async def _scenario(h: Harness) -> None:
    await h.client.say(request(1, "fabric/registerClient", {"mounts": []}))
    await h.client.hear()
    await h.handshake()
    await h.call(2, "echo")
    await h.client.say(request(3, "tools/call", {"name": "crash", "arguments": {}}))
    await h.client.hear()
    await h.call(4, "echo")


async def _slow_scenario(h: Harness) -> None:
    """The same, on an engine that takes its time, through a stdin pipe that is nearly full."""
    h.engine.fault("create", delay=2.0)
    h.engine.fault("remove", delay=1.0)
    h.engine.fault("exit_status", delay=0.5)
    await _scenario(h)
    await h.call(5, "echo", payload="x" * 5000)  # more than the stdin pipe holds at once


@pytest.mark.parametrize("scenario", [_scenario, _slow_scenario], ids=["prompt", "slow-engine"])
async def test_cancelling_a_session_at_every_step_of_its_life_leaks_no_task_or_container(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    scenario: Callable[[Harness], Awaitable[None]],
) -> None:
    abandoned_creates = 0

    async def run(steps: int) -> int:
        nonlocal abandoned_creates
        async with open_memory_runtime(scripted_mcp_server, stdin_capacity=1024) as engine:
            fabric = assemble(suite(tmp_path), runtime=engine, network="none")
            client = MemoryClient()

            async def work() -> None:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(serve_session, fabric, client, "svc", [])
                    await scenario(Harness(client, engine, fabric))
                    await client.leave()

            left = await cancelled_after(steps, work)
            # A create the cancellation abandoned completes later, then removes itself.
            await trio.sleep(10)
            assert engine.alive == [], f"a container leaked after cancelling at step {steps}"
            assert fabric.registry.sessions == {}
            assert fabric.registry.containers == {}
            abandoned_creates += engine.abandoned_creates
        return left

    assert await cancel_at_every_step(run) > 100
    if scenario is _slow_scenario:
        # Some cancellation did land while a create was in flight.
        assert abandoned_creates > 0


async def test_a_respawn_refuses_a_project_that_became_a_symlink_and_the_session_goes_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "elsewhere").mkdir()
    mount = f"{project}:/workspace"
    async with running_session(tmp_path, idle_timeout="10s", query_mounts=(mount,)) as h:
        assert (await h.call(1, "echo", a=1))["id"] == 1
        await trio.sleep(11)
        assert h.engine.alive == []
        # Swapped while no container ran: the next start must not mount what it names now.
        project.rename(tmp_path / "aside")
        project.symlink_to(tmp_path / "elsewhere")
        refused = await h.call(2, "echo", a=2)
        assert refused["error"]["code"] == -32004
        assert refused["error"]["data"]["reason"] == "mount_changed"
        assert len(h.engine.spawned) == 1  # refused before anything was created
        project.unlink()
        (tmp_path / "aside").rename(project)
        assert (await h.call(3, "echo", a=3))["id"] == 3
        # Every start had its own pins, and each was released after its start.
        pins = h.engine.pins_given
        assert len(pins) == 2
        assert all(p is not None and p.closed for p in pins)


async def test_a_container_that_did_not_get_its_pinned_mounts_is_answered_with_32004(
    tmp_path: Path,
) -> None:
    (tmp_path / "project").mkdir()
    mount = f"{tmp_path / 'project'}:/workspace"
    async with running_session(tmp_path, query_mounts=(mount,)) as h:
        h.engine.fault(
            "verify", error=SecurityViolation("not the pinned directory", reason="mount_changed")
        )
        refused = await h.call(1, "echo")
        assert refused["error"]["code"] == -32004
        assert refused["error"]["data"]["reason"] == "mount_changed"
        assert h.engine.alive == []  # the container that got the wrong mount is gone
        h.engine.clear_faults()
        assert (await h.call(2, "echo"))["id"] == 2


async def test_a_removal_the_teardown_bound_cuts_short_is_logged_as_deferred_not_done(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # (A burst of sessions ending queues its removals behind a busy engine: the last ones pass
    # the teardown's bound, and the sweeper removes them next. The log must not say they are
    # gone.)
    fields = {"container_strategy": "fresh_per_call"}
    caplog.set_level(logging.INFO, logger="reactor_fabric.trio.containers")
    async with open_memory_runtime(scripted_mcp_server) as engine:
        engine.faults["remove"] = Fault(delay=60.0)  # longer than the teardown's bound
        fabric = assemble(
            suite(tmp_path, timeout="1m", max_message="16m", service=fields),
            runtime=engine,
            network="none",
        )
        client = MemoryClient()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_session, fabric, client, "svc", [])
            harness = Harness(client, engine, fabric)
            await harness.handshake()
            await harness.call(2, "echo", n=1)
            with trio.fail_after(120):  # (the clock jumps: the bound is 15 s)
                while fabric.registry.container_count:  # noqa: ASYNC110 - no event for it
                    await trio.sleep(1)
            await client.leave()
        events = [record.msg for record in caplog.records]
        assert "container_removal_deferred" in events
        assert "container_removed" not in events
        assert len(engine.alive) == 1  # still there: the sweeper's to remove, next
        assert fabric.starter.deferred.take() == [engine.alive[0].id]


async def test_lines_written_partly_at_once_and_partly_by_the_writer_arrive_whole_and_in_order(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The stdin pipe holds 1 KiB: a 5 KB call is taken partly by the reader's task at once and
    # the rest by the writer task, while the calls behind it queue for that writer; a small
    # call sent while the writer is idle is written whole at once.
    async with open_memory_runtime(scripted_mcp_server, stdin_capacity=1024) as engine:
        fabric = assemble(suite(tmp_path, timeout="10m"), runtime=engine, network="none")
        client = MemoryClient()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_session, fabric, client, "svc", [])
            h = Harness(client, engine, fabric)
            await h.handshake()
            # Small calls (written at once, whole) between large ones (in parts).
            payloads = {n: f"{n}:" + "x" * (5000 + n if n % 2 else 10) for n in range(1, 9)}
            for n in range(10, 14):  # one at a time: the writer idle at each
                assert (await h.call(n, "echo", a="x" * (5000 if n % 2 else 10)))["id"] == n
            for n, payload in payloads.items():
                args = {"name": "echo", "arguments": {"payload": payload}}
                await client.say(request(n, "tools/call", args))
            answers = {}
            for _ in payloads:
                answer = await client.hear()
                answers[answer["id"]] = json.loads(answer["result"]["content"][0]["text"])
            assert answers == {n: {"payload": p} for n, p in payloads.items()}  # lines whole
            # Every byte was reported written, those written at once included: nothing counts
            # as stalled in the container's stdin past its bound, so the container stays.
            await trio.sleep(130)  # (the stall bound is 120 s; the idle timeout is much longer)
            assert len(engine.alive) == 1
            assert (await h.call(9, "echo", a=9))["id"] == 9
            assert len(engine.spawned) == 1
            await client.leave()
    assert engine.alive == []
