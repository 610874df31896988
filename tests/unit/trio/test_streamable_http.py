"""The Streamable HTTP endpoint over the orchestrator's own server, on memory streams, with the
in-memory runtime: sessions, answers, streams, expiry, bounds, and every refusal as clients see
it (HTTP 200 with the JSON-RPC error, 4xx only for HTTP-level faults)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from reactor_fabric.config.structs import Limits, Profile, Service
from reactor_fabric.runtime.memory import _PipeSender
from reactor_fabric.trio import streamable_http
from reactor_fabric.trio.channel import Handover
from reactor_fabric.trio.http_channel import FrameQueue, HttpChannel
from tests.fakes import until
from tests.http_client import HttpClient, Reply
from tests.messages import INITIALIZE, INITIALIZED, request
from tests.served import Served, served


async def open_session(http: Served) -> str:
    reply = await http.post(INITIALIZE)
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["result"]["serverInfo"]["name"] == "scripted"
    accepted = await http.post(INITIALIZED, session=reply.session)
    assert accepted.status == 202
    return reply.session


def call(request_id: int, tool: str, **arguments: Any) -> dict[str, Any]:
    return request(request_id, "tools/call", {"name": tool, "arguments": arguments})


async def test_initialize_starts_a_session_whose_id_comes_back_in_a_header(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as http:
        session = await open_session(http)
        assert len(session) == 32
        assert [spec.labels["reactor-fabric.session"] for spec in http.runtime.spawned] == [session]


async def test_a_request_whose_response_comes_first_is_answered_as_plain_json(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as http:
        session = await open_session(http)
        reply = await http.post(request(2, "tools/list"), session=session)
        assert reply.status == 200
        assert reply.headers["content-type"] == "application/json"
        assert reply.json()["id"] == 2


@pytest.mark.parametrize("sockets", [False, True], ids=["memory", "socket"])
async def test_messages_before_the_response_turn_the_answer_into_an_sse_stream(
    tmp_path: Path, sockets: bool
) -> None:
    async with served(tmp_path, sockets=sockets) as http:
        session = await open_session(http)
        progress = request(
            2, "tools/call", {"name": "progress", "arguments": {}, "_meta": {"progressToken": "t"}}
        )
        reply = await http.post(progress, session=session)
        assert reply.status == 200
        assert reply.headers["content-type"] == "text/event-stream"
        events = reply.events()
        assert [e.get("method") for e in events] == [
            "notifications/progress",
            "notifications/progress",
            None,
        ]
        assert events[-1]["id"] == 2
        assert len(http.runtime.spawned) == 1


@pytest.mark.parametrize("sockets", [False, True], ids=["memory", "socket"])
async def test_requests_on_one_kept_alive_connection_are_answered_in_turn(
    tmp_path: Path, sockets: bool
) -> None:
    async with served(tmp_path, sockets=sockets) as http:
        session = await open_session(http)
        client = HttpClient(http.connect())
        try:
            for request_id in range(2, 6):
                reply = await client.request(
                    "POST", "/mcp/svc", call(request_id, "echo", n=request_id),
                    headers={"mcp-session-id": session},
                )  # fmt: skip
                assert reply.json()["id"] == request_id
        finally:
            await client.aclose()


async def test_a_client_accepting_only_json_gets_json_answers(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        session = await open_session(http)
        reply = await http.post(
            request(3, "tools/list"), session=session, accept="application/json"
        )
        assert reply.headers["content-type"] == "application/json"
        assert reply.json()["id"] == 3


async def test_register_client_over_http_mounts_and_answers_with_the_session_id(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as http:
        mount = {"source": str(tmp_path), "target": "/workspace", "readOnly": True}
        reply = await http.post(request(1, "fabric/registerClient", {"mounts": [mount]}))
        assert reply.status == 200
        assert reply.json()["result"]["sessionId"] == reply.session
        await until(lambda: bool(http.runtime.spawned), what="the container created")
        [spec] = http.runtime.spawned
        assert spec.mounts[0].source == str(tmp_path)


async def test_query_mounts_apply_to_http_sessions(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        reply = await http.post(INITIALIZE, path=f"/mcp/svc?mount={tmp_path}:/projects/data:ro")
        assert reply.status == 200
        [spec] = http.runtime.spawned
        assert (spec.mounts[0].target, spec.mounts[0].read_only) == ("/projects/data", True)


@pytest.mark.parametrize(
    ("body", "path", "code", "reason"),
    [
        (
            request(1, "fabric/registerClient", {"mounts": [{"source": "/etc", "target": "/w"}]}),
            "/mcp/svc",
            -32004,
            "mount_outside_allowed_roots",
        ),
        (INITIALIZE, "/mcp/svc?mount=/etc:/workspace", -32004, "mount_outside_allowed_roots"),
        (INITIALIZE, "/mcp/nope", -32005, "service_not_found"),
        (request(1, "server/discover"), "/mcp/svc", -32600, "stateless_needs_session_url"),
        (request(1, "tools/list"), "/mcp/svc", -32600, "session_required"),
    ],
    ids=["refused-mount", "refused-query-mount", "unknown-service", "stateless", "no-session"],
)
async def test_a_refusal_is_the_json_rpc_error_with_status_200_and_nothing_starts(
    tmp_path: Path, body: dict[str, Any], path: str, code: int, reason: str
) -> None:
    # Clients start OAuth on 401/403 and read 404 as "session terminated"; with 200 they show
    # the error (see protocol-notes.md).
    async with served(tmp_path) as http:
        reply = await http.post(body, path=path)
        assert reply.status == 200
        assert reply.headers["content-type"] == "application/json"
        answer = reply.json()
        assert answer["id"] == 1
        assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (code, reason)
        assert http.runtime.spawned == []


async def test_a_full_orchestrator_refuses_a_session_with_200_and_too_many_sessions(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, max_sessions=1) as http:
        await open_session(http)
        reply = await http.post(INITIALIZE)
        assert reply.status == 200
        assert reply.json()["error"]["data"]["reason"] == "too_many_sessions"


@pytest.mark.parametrize(
    ("body", "code", "reason"),
    [
        (b'[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', -32600, "batch_not_supported"),
        (b"{oops", -32700, "invalid_json"),
        (b'{"jsonrpc":"2.0","id":"\xff","method":"initialize"}', -32700, "invalid_utf8"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"s":"\xc3"}}', -32700, "invalid_utf8"),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"x","params":'
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}",
            -32700,
            "json_too_deep",
        ),
    ],
    ids=["batch", "not-json", "bad-utf8-id", "bad-utf8-params", "100k-deep"],
)
async def test_a_body_that_is_not_one_json_rpc_message_is_400_and_the_session_goes_on(
    tmp_path: Path, body: bytes, code: int, reason: str
) -> None:
    async with served(tmp_path) as http:
        session = await open_session(http)
        reply = await http.post(body, session=session)
        assert reply.status == 400
        error = reply.json()["error"]
        assert (error["code"], error["data"]["reason"]) == (code, reason)
        assert (await http.post(call(9, "echo"), session=session)).json()["id"] == 9


async def test_a_request_reusing_the_id_of_one_in_flight_is_refused_and_the_first_answered(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path) as http:
        session = await open_session(http)
        first = HttpClient(http.connect())
        await first.send_request(
            "POST", "/mcp/svc", call(5, "wait", seconds=1), headers={"mcp-session-id": session}
        )
        await trio.testing.wait_all_tasks_blocked()
        again = await http.post(call(5, "echo"), session=session)
        assert again.status == 400
        assert again.json()["error"]["data"]["reason"] == "duplicate_request_id"
        answer = await first.read_head()
        assert answer.status == 200
        await first.aclose()


async def test_an_id_still_in_flight_after_its_post_hung_up_is_refused_by_the_session_too(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # No POST waits on the id any more, but the server still runs the call: the session's
    # machine refuses the second one, with the same error.
    async with served(tmp_path) as http:
        session = await open_session(http)
        first = HttpClient(http.connect())
        await first.send_request(
            "POST", "/mcp/svc", call(5, "wait", seconds=10), headers={"mcp-session-id": session}
        )
        await trio.testing.wait_all_tasks_blocked()
        await first.aclose()  # hang up before the answer
        again = await http.post(call(5, "echo"), session=session)
        assert again.json()["id"] == 5
        assert again.json()["error"]["data"]["reason"] == "duplicate_request_id"
        await trio.sleep(11)  # the first call's answer has come
        [server] = http.runtime.alive
        calls = [json.loads(line) for line in server.stdin_lines if b'"tools/call"' in line]
        assert [c["params"]["name"] for c in calls] == ["wait"]
        records = [event.record for event in http.fabric.observer.calls]
        assert [(r["request_id"], r["tool"], r["outcome"]) for r in records] == [
            (5, "echo", "error"),
            (5, "wait", "ok"),
        ]


async def test_an_unknown_session_id_is_404(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        reply = await http.post(request(2, "tools/list"), session="0" * 32)
        assert reply.status == 404


async def test_delete_ends_the_session_and_removes_its_container(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        session = await open_session(http)
        assert len(http.runtime.alive) == 1
        reply = await http.http("DELETE", "/mcp/svc", headers={"mcp-session-id": session})
        assert reply.status == 204
        assert http.runtime.alive == []
        assert (await http.post(request(2, "tools/list"), session=session)).status == 404


async def test_requests_to_one_keyed_url_share_one_session_and_container(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        for request_id in (1, 2, 3):
            reply = await http.post(call(request_id, "echo", n=request_id), path="/mcp/svc/agent-7")
            assert reply.status == 200
        assert len(http.runtime.spawned) == 1
        other = await http.post(request(1, "tools/list"), path="/mcp/svc/agent-8")
        assert other.status == 200
        assert len(http.runtime.spawned) == 2


async def test_register_racing_delete_on_one_keyed_url_leaves_the_orchestrator_serving(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as http:
        register = request(1, "fabric/registerClient", {"mounts": []})
        # A registered session is not the key-only DELETE's to end (refused, or not there
        # yet); an initialized one with the same URL is.
        for first, path in ((register, "/mcp/svc/raced"), (INITIALIZE, "/mcp/svc/raced-init")):
            for _ in range(5):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(functools.partial(http.post, first, path=path))
                    nursery.start_soon(http.http, "DELETE", path)
                await trio.testing.wait_all_tasks_blocked()
        # Still serving, and every session of the race is over or usable.
        assert (await http.post(call(2, "echo"), path="/mcp/svc/after")).status == 200


async def test_a_server_request_without_a_streaming_post_goes_to_the_get_stream(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as http:
        session = await open_session(http)
        listener = HttpClient(http.connect())
        await listener.send_request(
            "GET", "/mcp/svc", headers={"mcp-session-id": session}, accept="text/event-stream"
        )
        head = await listener.read_head()
        assert head.headers["content-type"] == "text/event-stream"
        results: list[Reply] = []
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                # Answered as JSON, so the server's roots/list request cannot ride on this POST.
                reply = await http.post(call(5, "ask"), session=session, accept="application/json")
                results.append(reply)

            nursery.start_soon(ask)
            chunk = await listener.read_chunk()
            assert chunk is not None
            asked = json.loads(chunk.partition(b"data: ")[2])
            assert asked["method"] == "roots/list"
            answer = {"jsonrpc": "2.0", "id": asked["id"], "result": {"roots": []}}
            assert (await http.post(answer, session=session)).status == 202
        assert results[0].json()["id"] == 5
        await listener.aclose()


async def test_the_answer_to_a_post_whose_client_left_is_dropped_not_parked(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path) as http:
        session = await open_session(http)
        channel = http.sessions.by_id[session].channel
        for request_id in range(2, 12):
            client = HttpClient(http.connect())
            await client.send_request(
                "POST", "/mcp/svc", call(request_id, "wait", seconds=5),
                headers={"mcp-session-id": session},
            )  # fmt: skip
            await trio.testing.wait_all_tasks_blocked()
            await client.aclose()  # hang up before the answer
        await trio.sleep(6)  # every answer has come
        assert channel.backlog.bytes == 0
        assert not channel.busy
        # A GET stream opened now gets none of them.
        listener = HttpClient(http.connect())
        await listener.send_request(
            "GET", "/mcp/svc", headers={"mcp-session-id": session}, accept="text/event-stream"
        )
        await listener.read_head()
        with trio.move_on_after(1) as nothing:
            await listener.read_chunk()
        assert nothing.cancelled_caught
        await listener.aclose()


@pytest.mark.parametrize("sockets", [False, True], ids=["memory", "socket"])
async def test_a_client_hanging_up_during_a_streamed_answer_ends_that_post_and_nothing_else(
    tmp_path: Path, sockets: bool
) -> None:
    async with served(tmp_path, sockets=sockets) as http:
        session = await open_session(http)
        channel = http.sessions.by_id[session].channel
        client = HttpClient(http.connect())
        await client.send_request(
            "POST", "/mcp/svc", call(2, "hold"), headers={"mcp-session-id": session}
        )
        head = await client.read_head()
        assert head.headers["content-type"] == "text/event-stream"
        assert b"holding" in (await client.read_chunk() or b"")
        assert channel.busy  # the POST waits for the rest of its answer
        await client.aclose()  # hang up while the tool still runs
        await until(lambda: not channel.busy, what="the POST noticed its client left")
        # The session goes on for the client's other requests.
        reply = await http.post(call(3, "echo", said="still here"), session=session)
        assert reply.json()["id"] == 3
        assert "still here" in reply.json()["result"]["content"][0]["text"]


async def test_messages_for_a_get_stream_nobody_opened_are_bounded_in_bytes(
    tmp_path: Path,
) -> None:
    limits = Limits(buffer_to_client="4k")
    async with served(tmp_path, limits=limits) as http:
        session = await open_session(http)
        channel = http.sessions.by_id[session].channel
        reply = await http.post(
            call(2, "notify", count=100, size=500), session=session, accept="application/json"
        )
        assert reply.json()["id"] == 2  # the answer is not stuck behind the notifications
        assert channel.backlog.bytes <= 4096 + 1024
        assert channel.dropped > 90


async def test_origin_host_accept_content_type_size_and_version_are_checked(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, max_message_size="2k") as http:
        assert (
            await http.post(INITIALIZE, headers={"origin": "https://evil.example"})
        ).status == 403
        assert (await http.post(INITIALIZE, headers={"host": "evil.example:8765"})).status == 403
        assert (await http.post(INITIALIZE, accept="text/html")).status == 406
        assert (await http.post(INITIALIZE, headers={"content-type": "text/plain"})).status == 415
        big = request(1, "initialize", {"pad": "x" * 4096})
        assert (await http.post(big)).status == 413
        bad_version = await http.post(INITIALIZE, headers={"mcp-protocol-version": "1999-01-01"})
        assert bad_version.status == 400
        assert bad_version.json()["error"]["data"]["reason"] == "unsupported_protocol_version"
        assert http.runtime.spawned == []


async def test_an_http_session_without_traffic_ends_at_its_services_idle_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path, idle_timeout="30s") as http:
        session = await open_session(http)
        await trio.sleep(29)
        assert http.fabric.registry.session_count == 1
        await trio.sleep(2)
        assert http.runtime.alive == []
        assert http.fabric.registry.session_count == 0
        assert (await http.post(request(2, "tools/list"), session=session)).status == 404


async def test_a_request_longer_than_the_idle_timeout_keeps_its_http_session(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path, idle_timeout="30s") as http:
        session = await open_session(http)
        answer = await http.post(call(2, "wait", seconds=100), session=session)
        assert answer.status == 200
        assert answer.json()["result"] == {"content": []}
        assert http.fabric.registry.session_count == 1
        await trio.sleep(31)  # then, left alone, it ends
        assert http.fabric.registry.session_count == 0


async def test_an_open_get_stream_keeps_the_http_session_but_not_its_idle_container(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path, idle_timeout="30s") as http:
        session = await open_session(http)
        listener = HttpClient(http.connect())
        await listener.send_request(
            "GET", "/mcp/svc", headers={"mcp-session-id": session}, accept="text/event-stream"
        )
        await listener.read_head()
        await trio.sleep(120)
        assert http.runtime.alive == []  # the container went at its idle timeout
        assert http.fabric.registry.session_count == 1  # the session stays while the client listens
        assert (await http.post(call(2, "echo"), session=session)).json()["id"] == 2
        await listener.aclose()


async def test_a_mount_sent_as_a_header_is_judged_as_the_query_one_and_keeps_the_url_plain(
    tmp_path: Path,
) -> None:
    # Claude Code drops an error's message when the URL has a query: the header form gives the
    # same session with a plain URL, so the refusal's words reach the user.
    (tmp_path / "b").mkdir()
    async with served(tmp_path) as http:
        refused = await http.post(INITIALIZE, headers={"X-Reactor-Fabric-Mount": "/etc:/workspace"})
        error = refused.json()["error"]
        assert (error["code"], error["data"]["reason"]) == (-32004, "mount_outside_allowed_roots")
        assert http.runtime.spawned == []
        two = f"{tmp_path}:/workspace:ro, {tmp_path / 'b'}:/projects/b"
        reply = await http.post(INITIALIZE, headers={"X-Reactor-Fabric-Mount": two})
        assert reply.status == 200
        [spec] = http.runtime.spawned
        assert [(m.target, m.read_only) for m in spec.mounts] == [
            ("/workspace", True),
            ("/projects/b", False),
        ]


async def test_a_keyed_url_tells_its_owner_by_the_mounts_of_header_and_query_alike(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine").mkdir()
    async with served(tmp_path) as http:
        mine = {"X-Reactor-Fabric-Mount": f"{tmp_path / 'mine'}:/workspace"}
        path = "/mcp/svc/agent-9"
        assert (await http.post(call(1, "echo"), path=path, headers=mine)).status == 200
        # The same URL without the header is another client's request.
        assert key_in_use(await http.post(call(2, "echo"), path=path))
        assert "result" in (await http.post(call(3, "echo"), path=path, headers=mine)).json()


async def test_a_keyed_url_belongs_to_its_first_client_other_mounts_are_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "theirs").mkdir()
    async with served(tmp_path) as http:
        mine = f"/mcp/svc/agent-7?mount={tmp_path / 'mine'}:/workspace"
        assert (await http.post(call(1, "echo"), path=mine)).status == 200
        # Another client picks the same key with its own project: not silently joined.
        for path in (
            f"/mcp/svc/agent-7?mount={tmp_path / 'theirs'}:/workspace",
            "/mcp/svc/agent-7",
        ):
            reply = await http.post(call(2, "echo"), path=path)
            assert reply.status == 200
            error = reply.json()["error"]
            assert (error["code"], error["data"]["reason"]) == (-32004, "session_key_in_use")
        # Nor by a second registration declaring other mounts.
        mount = {"source": str(tmp_path / "theirs"), "target": "/workspace"}
        reply = await http.post(request(3, "fabric/registerClient", {"mounts": [mount]}), path=mine)
        assert reply.json()["error"]["data"]["reason"] == "session_key_in_use"
        # The owner goes on, in its one container with its own mount.
        assert "result" in (await http.post(call(4, "echo"), path=mine)).json()
        [spec] = http.runtime.spawned
        assert spec.mounts[0].source == str(tmp_path / "mine")


def key_in_use(reply: Reply, status: int = 200) -> bool:
    """Whether the reply is the -32004 session_key_in_use refusal, with that HTTP status."""
    error = reply.json().get("error", {})
    refused = (error.get("code"), error.get("data", {}).get("reason"))
    return reply.status == status and refused == (-32004, "session_key_in_use")


async def test_a_keyed_session_registered_in_its_body_is_reached_by_its_id_not_its_key_alone(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine").mkdir()
    async with served(tmp_path) as http:
        mount = {"source": str(tmp_path / "mine"), "target": "/workspace"}
        registered = await http.post(
            request(1, "fabric/registerClient", {"mounts": [mount]}), path="/mcp/svc/agent-7"
        )
        session = registered.json()["result"]["sessionId"]
        # Without ?mount= the URL looks like the owner's (its mounts are in no URL): the key
        # alone does not reach the session, for any method.
        assert key_in_use(await http.post(call(2, "echo"), path="/mcp/svc/agent-7"))
        assert key_in_use(await http.post(INITIALIZE, path="/mcp/svc/agent-7"))
        listen = await http.http("GET", "/mcp/svc/agent-7", accept="text/event-stream")
        assert key_in_use(listen, 409)
        assert key_in_use(await http.http("DELETE", "/mcp/svc/agent-7"), 409)
        # The owner, with the id its registration was answered with, goes on in its container.
        owned = await http.post(call(3, "echo", n=3), path="/mcp/svc/agent-7", session=session)
        assert "result" in owned.json()
        [spec] = http.runtime.spawned
        assert spec.mounts[0].source == str(tmp_path / "mine")
        assert http.fabric.registry.session_count == 1
        deleted = await http.http("DELETE", "/mcp/svc/agent-7", headers={"mcp-session-id": session})
        assert deleted.status == 204


async def test_get_and_delete_on_a_keyed_url_with_other_mounts_are_refused_and_end_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "theirs").mkdir()
    async with served(tmp_path) as http:
        mine = f"/mcp/svc/agent-7?mount={tmp_path / 'mine'}:/workspace"
        theirs = f"/mcp/svc/agent-7?mount={tmp_path / 'theirs'}:/workspace"
        assert "result" in (await http.post(call(1, "echo"), path=mine)).json()
        for path in (theirs, "/mcp/svc/agent-7"):
            assert key_in_use(await http.http("DELETE", path), 409)
            listen = await http.http("GET", path, accept="text/event-stream")
            assert key_in_use(listen, 409)
        assert len(http.runtime.alive) == 1
        assert "result" in (await http.post(call(2, "echo"), path=mine)).json()
        assert (await http.http("DELETE", mine)).status == 204  # the owner's URL ends it
        assert http.runtime.alive == []


async def test_a_keyed_fabric_url_refuses_requests_with_other_tools_or_profile(
    tmp_path: Path,
) -> None:
    services = {"alpha": Service(image="fake/alpha:1"), "beta": Service(image="fake/beta:1")}
    profiles = {"a": Profile(services=["alpha"]), "b": Profile(services=["beta"])}
    async with served(tmp_path, learn_catalog=True, services=services, profiles=profiles) as http:
        owner = "/mcp/fabric/agent-7?tools=all&profile=a"
        first = await http.post(call(1, "alpha__echo", x=1), path=owner)
        assert json.loads(first.json()["result"]["content"][0]["text"]) == {"x": 1}
        for other in (
            "/mcp/fabric/agent-7",
            "/mcp/fabric/agent-7?tools=discover&profile=a",
            "/mcp/fabric/agent-7?tools=all",
            "/mcp/fabric/agent-7?tools=all&profile=b",
        ):
            assert key_in_use(await http.post(call(2, "beta__echo"), path=other)), other
        again = await http.post(call(3, "alpha__echo", x=3), path=owner)
        assert json.loads(again.json()["result"]["content"][0]["text"]) == {"x": 3}
        assert http.fabric.registry.session_count == 1
        assert [spec.image for spec in http.runtime.spawned] == ["fake/alpha:1"]
        assert (await http.http("DELETE", owner)).status == 204


async def test_a_posted_message_reaches_the_session_from_its_post_not_through_its_inbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While the session waits for its client with nothing queued, a POST's handler hands it
    # the message itself: one task hand-off fewer per call (the answers are the same).
    queued: list[object] = []
    put, hand_over = FrameQueue.put, HttpChannel.hand_over

    async def spied_put(self: FrameQueue[Any], frame: Any) -> bool:
        queued.append(frame)
        return await put(self, frame)

    def spied_hand_over(self: HttpChannel, handover: Handover) -> None:
        queued.append(handover)
        hand_over(self, handover)

    monkeypatch.setattr(FrameQueue, "put", spied_put)
    monkeypatch.setattr(HttpChannel, "hand_over", spied_hand_over)
    async with served(tmp_path) as http:
        session = await open_session(http)
        queued.clear()
        for request_id in range(2, 6):
            reply = await http.post(call(request_id, "echo", n=request_id), session=session)
            assert reply.json()["id"] == request_id
            assert json.loads(reply.json()["result"]["content"][0]["text"]) == {"n": request_id}
        assert queued == []


async def test_requests_a_client_has_in_flight_together_are_left_to_the_stdin_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lone POST's line is written at once by its own task; while other requests of the
    # client's are in flight (a burst), the lines are left to the stdin's writer task, which
    # writes what is queued together (one write, not one per POST).
    at_once: list[bytes] = []
    send_if_idle = _PipeSender.send_if_idle

    def spied(self: _PipeSender, data: bytes) -> int | None:
        at_once.append(data)
        return send_if_idle(self, data)

    monkeypatch.setattr(_PipeSender, "send_if_idle", spied)
    async with served(tmp_path) as http:
        session = await open_session(http)
        at_once.clear()
        alone = await http.post(call(2, "echo", n=2), session=session)
        assert alone.json()["id"] == 2
        assert len(at_once) == 1
        at_once.clear()
        replies: dict[int, Reply] = {}

        async def post(request_id: int) -> None:
            replies[request_id] = await http.post(
                call(request_id, "wait", seconds=0.2), session=session
            )

        async with trio.open_nursery() as nursery:
            for request_id in range(3, 9):
                nursery.start_soon(post, request_id)
        assert sorted(replies) == list(range(3, 9))
        assert all(reply.json()["id"] == n for n, reply in replies.items())
        assert len(at_once) <= 1  # (the first, if it was alone when it came)


async def test_a_lone_response_is_written_by_the_task_that_delivers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over a socket, a POST whose response comes alone is answered by the task that delivers
    # the response (the connection's handler task does not wake for it: no _answer); one
    # whose answer streams is handed back and answered as before.
    answered_by_handler: list[object] = []
    answer = streamable_http._answer

    async def spied(exchange: Any, waiter: Any, *args: Any, **kwargs: Any) -> None:
        answered_by_handler.append(waiter.request_id)
        await answer(exchange, waiter, *args, **kwargs)

    monkeypatch.setattr(streamable_http, "_answer", spied)
    async with served(tmp_path, sockets=True) as http:
        client = HttpClient(http.connect())
        reply = await client.request("POST", "/mcp/svc", INITIALIZE)
        session = reply.session
        headers = {"mcp-session-id": session}
        assert (
            await client.request("POST", "/mcp/svc", INITIALIZED, headers=headers)
        ).status == 202
        for request_id in range(2, 6):
            reply = await client.request(
                "POST", "/mcp/svc", call(request_id, "echo", n=request_id), headers=headers
            )
            assert reply.headers["content-type"] == "application/json"
            assert reply.json()["id"] == request_id
        assert answered_by_handler == []
        progress = request(
            6, "tools/call", {"name": "progress", "arguments": {}, "_meta": {"progressToken": "t"}}
        )
        reply = await client.request("POST", "/mcp/svc", progress, headers=headers)
        assert reply.headers["content-type"] == "text/event-stream"
        assert reply.events()[-1]["id"] == 6
        assert answered_by_handler == [6]
        reply = await client.request("POST", "/mcp/svc", call(7, "echo", n=7), headers=headers)
        assert reply.json()["id"] == 7
        assert answered_by_handler == [6]
        await client.aclose()


async def post_waiting(
    http: Served, session: str, *, seconds: float
) -> tuple[HttpClient, HttpChannel]:
    """A client on a connection of its own whose POST (a call of ``seconds``) waits for its
    answer; and the session's channel."""
    channel = http.sessions.by_id[session].channel
    client = HttpClient(http.connect())
    await client.send_request(
        "POST", "/mcp/svc", call(2, "wait", seconds=seconds), headers={"mcp-session-id": session}
    )
    await until(lambda: channel.busy, what="the POST waits for its answer")
    return client, channel


@pytest.mark.parametrize("sockets", [False, True], ids=["memory", "socket"])
async def test_a_post_waiting_when_its_session_is_deleted_is_told_the_session_ended(
    tmp_path: Path, sockets: bool
) -> None:
    async with served(tmp_path, sockets=sockets) as http:
        session = await open_session(http)
        client, _channel = await post_waiting(http, session, seconds=30)
        deleted = await http.http("DELETE", "/mcp/svc", headers={"mcp-session-id": session})
        assert deleted.status == 204
        reply = await client.read_reply()
        assert reply.status == 404
        assert reply.json()["id"] == 2
        assert reply.json()["error"]["data"]["reason"] == "session_ended"
        await client.aclose()


@pytest.mark.parametrize("sockets", [False, True], ids=["memory", "socket"])
async def test_a_client_hanging_up_before_its_plain_answer_abandons_only_that_post(
    tmp_path: Path, sockets: bool
) -> None:
    async with served(tmp_path, sockets=sockets) as http:
        session = await open_session(http)
        client, channel = await post_waiting(http, session, seconds=0.5)
        await client.aclose()
        await until(lambda: not channel.busy, what="the POST noticed its client left")
        await trio.sleep(0.6)  # its answer comes, for nobody: dropped, not parked
        assert channel.backlog.bytes == 0
        reply = await http.post(call(3, "echo", said="still here"), session=session)
        assert reply.json()["id"] == 3
