"""The WebSocket endpoint over the orchestrator's own server, on memory streams, with the
in-memory runtime: handshake rules, frame rules, the close handshake, bounds and timeouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing
from wsproto.events import AcceptConnection, CloseConnection, Ping, RejectConnection, TextMessage

from reactor_fabric.config.structs import Limits
from tests.http_client import WebSocketClient
from tests.messages import INITIALIZE, request
from tests.served import served


async def test_a_session_relays_and_chooses_the_mcp_subprotocol_when_offered(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as http:
        ws, accepted = await http.websocket(subprotocols=["mcp"])
        assert isinstance(accepted, AcceptConnection)
        assert accepted.subprotocol == "mcp"
        await ws.send_json(INITIALIZE)
        assert (await ws.hear())["id"] == 1
        assert (http.fabric.registry.session_count, http.fabric.registry.container_count) == (1, 1)
        assert isinstance(await ws.close(), CloseConnection)
        await ws.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert http.runtime.alive == []
        assert http.fabric.registry.session_count == 0


async def test_no_subprotocol_is_chosen_when_the_client_offers_none(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        ws, accepted = await http.websocket()
        assert accepted.subprotocol is None
        await ws.send_json(INITIALIZE)
        assert (await ws.hear())["id"] == 1
        await ws.aclose()


async def test_a_binary_frame_closes_the_connection_with_1003(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        ws, _ = await http.websocket()
        await ws.send_json(INITIALIZE)
        await ws.hear()
        await ws.send_bytes(b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}')
        assert await ws.close_code() == 1003
        await ws.aclose()


@pytest.mark.parametrize("fragmented", [False, True])
async def test_an_oversize_message_closes_the_connection_with_1009(
    tmp_path: Path, fragmented: bool
) -> None:
    async with served(tmp_path, max_message_size="4k") as http:
        ws, _ = await http.websocket()
        await ws.send_json(INITIALIZE)
        await ws.hear()
        if fragmented:
            for _ in range(5):
                await ws._send(TextMessage(data="y" * 1024, message_finished=False))
        else:
            await ws.send_json(request(2, "tools/call", {"name": "echo", "x": "y" * 8192}))
        assert await ws.close_code() == 1009
        await ws.aclose()


async def test_a_text_frame_that_is_not_utf8_closes_with_1007(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        ws, _ = await http.websocket()
        await ws.send_json(INITIALIZE)
        await ws.hear()
        # A masked text frame (mask 0) whose payload is not UTF-8.
        await ws.send_raw(b"\x81\x82\x00\x00\x00\x00\xff\xfe")
        assert await ws.close_code() == 1007
        await ws.aclose()


async def test_deep_json_is_answered_with_32700_and_the_session_goes_on(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        ws, _ = await http.websocket()
        await ws.send_json(INITIALIZE)
        await ws.hear()
        deep = '{"jsonrpc":"2.0","id":2,"method":"x","params":' + "[" * 100_000 + "]" * 100_000
        await ws.send_text(deep + "}")
        answer = await ws.hear()
        assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (
            -32700,
            "json_too_deep",
        )
        await ws.send_json(request(3, "tools/list"))
        assert (await ws.hear())["id"] == 3
        await ws.aclose()


@pytest.mark.parametrize(
    "header",
    [(b"origin", b"https://evil.example"), (b"host", b"evil.example:8765")],
    ids=["origin", "host"],
)
async def test_a_foreign_origin_or_host_is_refused_with_403_before_anything_starts(
    tmp_path: Path, header: tuple[bytes, bytes]
) -> None:
    async with served(tmp_path) as http:
        if header[0] == b"host":
            ws, answer = await WebSocketClient.connect(
                http.connect(), "/mcp/svc", host="evil.example"
            )
        else:
            ws, answer = await http.websocket(headers=[header])
        await ws.aclose()
        assert isinstance(answer, RejectConnection)
        assert answer.status_code == 403
        assert http.runtime.spawned == []


async def test_loopback_and_listed_origins_are_accepted(tmp_path: Path) -> None:
    async with served(tmp_path, allowed_origins=["https://app.example.com"]) as http:
        for origin in (b"http://localhost:5173", b"https://app.example.com"):
            ws, accepted = await http.websocket(headers=[(b"origin", origin)])
            assert isinstance(accepted, AcceptConnection)
            await ws.send_json(INITIALIZE)
            assert (await ws.hear())["id"] == 1
            await ws.aclose()


async def test_a_websocket_outside_mcp_paths_is_refused(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        for path in ("/elsewhere", "/mcp/", "/mcp/svc/extra"):
            ws, answer = await http.websocket(path)
            await ws.aclose()
            assert isinstance(answer, RejectConnection)
            assert answer.status_code == 404


@pytest.mark.parametrize(
    ("target", "first", "code", "reason"),
    [
        ("/mcp/nope", INITIALIZE, -32005, "service_not_found"),
        ("/mcp/svc?mount=/etc:/workspace", INITIALIZE, -32004, "mount_outside_allowed_roots"),
        ("/mcp/svc", request(1, "fabric/registerClient", {}), -32600, "register_without_mounts"),
    ],
    ids=["unknown-service", "refused-mount", "bad-register"],
)
async def test_a_refusal_is_an_error_frame_then_a_normal_close_that_waits_for_the_client(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    target: str,
    first: dict[str, object],
    code: int,
    reason: str,
) -> None:
    async with served(tmp_path) as http:
        ws, _ = await http.websocket(target)
        await ws.send_json(first)
        answer = await ws.hear()
        assert answer["id"] == 1
        assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (code, reason)
        event = await ws.next_event()
        assert isinstance(event, CloseConnection)
        assert event.code == 1000  # normal: clients deliver the error instead of failing
        # The server keeps TCP open for the client's close frame (Node reports 1006 and drops
        # the last message otherwise)...
        with trio.move_on_after(2) as waited:
            await ws.stream.receive_some(1)
        assert waited.cancelled_caught
        # ...and closes once it came.
        await ws._send(event.response())
        assert await ws.stream.receive_some(1) == b""
        await ws.aclose()
        assert http.runtime.spawned == []


async def test_a_client_that_never_answers_our_close_is_cut_once_the_handshake_bound_passed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path) as http:
        ws, _ = await http.websocket("/mcp/nope")
        await ws.send_json(INITIALIZE)
        assert (await ws.hear())["error"]["data"]["reason"] == "service_not_found"
        assert isinstance(await ws.next_event(), CloseConnection)
        # The client never answers the close: the server gives up and closes TCP (without the
        # bound this read would never end: fail_after only keeps a broken build from hanging).
        with trio.fail_after(3600):
            assert await ws.stream.receive_some(1) == b""
        await ws.aclose()


async def test_the_server_pings_for_keepalive(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path) as http:
        ws, _ = await http.websocket()
        await ws.send_json(INITIALIZE)
        await ws.hear()
        with trio.fail_after(25):
            event = await ws.next_event(answer_pings=False)
        assert isinstance(event, Ping)
        await ws.aclose()


async def test_a_connection_that_sends_no_first_message_is_closed_in_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path, limits=Limits(first_message_timeout="10s")) as http:
        ws, _ = await http.websocket()
        assert http.fabric.registry.pending_connections == 1
        with trio.fail_after(15):
            assert await ws.close_code() == 1008
        await ws.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert http.fabric.registry.pending_connections == 0


async def test_connections_waiting_for_their_first_message_are_capped(tmp_path: Path) -> None:
    async with served(tmp_path, limits=Limits(max_pending_connections=2)) as http:
        waiting = [(await http.websocket())[0] for _ in range(2)]
        ws, answer = await http.websocket()
        assert isinstance(answer, RejectConnection)
        assert answer.status_code == 503
        await ws.aclose()
        # Once one of them speaks, there is room again.
        await waiting[0].send_json(INITIALIZE)
        await waiting[0].hear()
        ws, answer = await http.websocket()
        assert isinstance(answer, AcceptConnection)
        for client in (*waiting, ws):
            await client.aclose()


async def test_a_client_that_stops_reading_stalls_only_itself_then_is_dropped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    limits = Limits(buffer_to_client="8k", client_write_timeout="5s")
    async with served(tmp_path, limits=limits) as http:
        stuck, _ = await http.websocket(lockstep=True)  # nothing is buffered between us
        await stuck.send_json(INITIALIZE)
        await stuck.hear()
        # Ask for far more than the bound, and never read it.
        flood = {"name": "notify", "arguments": {"count": 200, "size": 1000}}
        await stuck.send_json(request(2, "tools/call", flood))
        healthy, _ = await http.websocket()
        await healthy.send_json(INITIALIZE)
        assert (await healthy.hear())["id"] == 1  # another session is not affected
        await trio.sleep(10)
        # The stuck client's writes did not move for 5 s: its connection and session are gone.
        assert http.fabric.registry.session_count == 1
        [left] = http.runtime.alive
        assert left.spec.labels["reactor-fabric.session"] != ""
        await healthy.send_json(request(2, "tools/list"))
        assert (await healthy.hear())["id"] == 2
        await stuck.aclose()
        await healthy.aclose()


async def test_a_client_closing_first_gets_its_close_answered_and_the_container_goes(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as http:
        ws, _ = await http.websocket()
        await ws.send_json(INITIALIZE)
        await ws.hear()
        answer = await ws.close(1000)
        assert isinstance(answer, CloseConnection)
        assert answer.code == 1000
        assert await ws.stream.receive_some(1) == b""  # then the server closed TCP
        await ws.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert http.runtime.alive == []


async def test_a_same_path_mount_onto_something_the_image_has_is_refused_at_its_start(
    tmp_path: Path,
) -> None:
    project = tmp_path / "opt-tools"
    project.mkdir()
    async with served(tmp_path) as http:
        # The image has a directory at the very path the client mounts its own directory at.
        http.runtime.image_files["fake/svc:1"] = {str(project)}
        ws, _ = await http.websocket(f"/mcp/svc?mount={project}:{project}")
        await ws.send_json(INITIALIZE)
        answer = await ws.hear()
        assert answer["error"]["code"] == -32004
        assert answer["error"]["data"]["reason"] == "mount_target_in_image"
        assert http.runtime.alive == []
        await ws.aclose()
        # Under an allowed target, nothing in the image is ever shadowed: that start goes on.
        ws, _ = await http.websocket(f"/mcp/svc?mount={project}:/workspace")
        await ws.send_json(INITIALIZE)
        assert (await ws.hear())["result"]
        await ws.aclose()


async def test_a_call_under_an_id_in_flight_is_refused_never_runs_and_the_first_is_audited_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with served(tmp_path) as http:
        ws, _ = await http.websocket()
        await ws.send_json(INITIALIZE)
        await ws.hear()
        await ws.send_json(request(2, "tools/call", {"name": "wait", "arguments": {"seconds": 10}}))
        await ws.send_json(request(2, "tools/call", {"name": "echo", "arguments": {"x": 1}}))
        refusal = await ws.hear()  # at once: the first call takes 10 s
        assert (refusal["id"], refusal["error"]["code"]) == (2, -32600)
        assert refusal["error"]["data"]["reason"] == "duplicate_request_id"
        assert await ws.hear() == {"jsonrpc": "2.0", "id": 2, "result": {"content": []}}
        [server] = http.runtime.alive
        calls = [json.loads(line) for line in server.stdin_lines if b'"tools/call"' in line]
        assert [call["params"]["name"] for call in calls] == ["wait"]  # echo never reached it
        records = [event.record for event in http.fabric.observer.calls]
        assert [(r["request_id"], r["tool"], r["outcome"], r["error_reason"]) for r in records] == [
            (2, "echo", "error", "duplicate_request_id"),
            (2, "wait", "ok", None),
        ]
        await ws.aclose()
