"""The WebSocket endpoint's rules, over real loopback sockets (hypercorn + trio-websocket), with
the in-memory backend behind it: origins, subprotocols, frame types, sizes, health counters."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url
from wsproto.events import AcceptConnection, Ping, RejectConnection, TextMessage

from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.runtime.memory import MemoryEngine, open_memory_engine
from reactor_fabric.trio.fabric import Fabric
from reactor_fabric.trio.serve import Listening, bind_listener, serve_orchestrator
from tests.fakes import INITIALIZE, RawWebSocket, request, scripted_mcp_server


@asynccontextmanager
async def served(
    root: Path, *, max_message: str = "16m", origins: tuple[str, ...] = ()
) -> AsyncIterator[tuple[str, MemoryEngine, Fabric]]:
    suite = Suite(
        version="1.0",
        orchestrator=Orchestrator(
            allowed_mount_roots=[str(root)],
            max_message_size=max_message,
            allowed_origins=list(origins),
        ),
        mcp_services={"svc": Service(image="fake/svc:1")},
    )
    async with open_memory_engine(scripted_mcp_server) as engine:
        fabric = Fabric(suite, engine=engine, network="none")
        with bind_listener("127.0.0.1", 0) as listener:
            async with trio.open_nursery() as nursery:
                listening: Listening = await nursery.start(serve_orchestrator, fabric, listener)
                yield listening.ws_url, engine, fabric
                nursery.cancel_scope.cancel()
        assert engine.alive == []


async def hear(ws: WebSocketConnection) -> dict[str, object]:
    with trio.fail_after(10):
        message = await ws.get_message()
    decoded: dict[str, object] = json.loads(message)
    return decoded


async def test_a_session_over_a_real_websocket_relays_and_counts_in_healthz(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (url, engine, fabric):
        async with open_websocket_url(f"{url}/mcp/svc", subprotocols=["mcp"]) as ws:
            assert ws.subprotocol == "mcp"
            await ws.send_message(json.dumps(INITIALIZE))
            answer = await hear(ws)
            assert answer["id"] == 1
            assert (fabric.session_count, fabric.container_count) == (1, 1)
            host, port = url.removeprefix("ws://").split(":")
            status, body = await http_get(host, int(port), "/healthz")
            assert status == 200
            assert (body["sessions"], body["containers"]) == (1, 1)
        # The server learns of the close over a real socket: there is no event to wait on.
        with trio.fail_after(10):
            while engine.alive:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert fabric.session_count == 0


async def test_no_subprotocol_is_chosen_when_the_client_offers_none(tmp_path: Path) -> None:
    async with (
        served(tmp_path) as (url, _engine, _fabric),
        open_websocket_url(f"{url}/mcp/svc") as ws,
    ):
        assert ws.subprotocol is None
        await ws.send_message(json.dumps(INITIALIZE))
        assert (await hear(ws))["id"] == 1


async def test_a_binary_frame_closes_the_connection_with_1003(tmp_path: Path) -> None:
    async with served(tmp_path) as (url, _engine, _fabric):
        ws, accepted = await RawWebSocket.connect(f"{url}/mcp/svc")
        try:
            assert isinstance(accepted, AcceptConnection)
            await ws.send_text(json.dumps(INITIALIZE))
            event = await ws.next_event()
            assert isinstance(event, TextMessage), event
            await ws.send_bytes(b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}')
            with trio.fail_after(10):
                assert await ws.close_code() == 1003
        finally:
            await ws.aclose()


async def test_an_oversize_message_closes_the_connection_with_1009(tmp_path: Path) -> None:
    async with served(tmp_path, max_message="4k") as (url, _engine, _fabric):
        ws, _accepted = await RawWebSocket.connect(f"{url}/mcp/svc")
        try:
            await ws.send_text(json.dumps(INITIALIZE))
            assert isinstance(await ws.next_event(), TextMessage)
            big = json.dumps(
                request(2, "tools/call", {"name": "echo", "arguments": {"x": "y" * 8192}})
            )
            await ws.send_text(big)
            with trio.fail_after(10):
                assert await ws.close_code() == 1009
        finally:
            await ws.aclose()


async def test_a_foreign_origin_is_refused_with_http_403_before_anything_starts(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (url, engine, _fabric):
        ws, answer = await RawWebSocket.connect(
            f"{url}/mcp/svc", headers=[(b"origin", b"https://evil.example")]
        )
        await ws.aclose()
        assert isinstance(answer, RejectConnection)
        assert answer.status_code == 403
        assert engine.spawned == []


async def test_loopback_and_listed_origins_are_accepted(tmp_path: Path) -> None:
    async with served(tmp_path, origins=("https://app.example.com",)) as (url, _engine, _fabric):
        for origin in (b"http://localhost:5173", b"https://app.example.com"):
            async with open_websocket_url(
                f"{url}/mcp/svc", extra_headers=[(b"origin", origin)]
            ) as ws:
                await ws.send_message(json.dumps(INITIALIZE))
                assert (await hear(ws))["id"] == 1


async def test_an_unknown_service_is_answered_with_32005_and_the_connection_closed(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (url, engine, _fabric):
        ws, _accepted = await RawWebSocket.connect(f"{url}/mcp/nope")
        try:
            await ws.send_text(json.dumps(INITIALIZE))
            answer = await ws.next_event()
            assert json.loads(answer.data)["error"]["code"] == -32005
            with trio.fail_after(10):
                assert await ws.close_code() == 1008
        finally:
            await ws.aclose()
        assert engine.spawned == []


async def test_a_websocket_outside_mcp_paths_is_refused(tmp_path: Path) -> None:
    async with served(tmp_path) as (url, _engine, _fabric):
        ws, answer = await RawWebSocket.connect(f"{url}/elsewhere")
        await ws.aclose()
        assert isinstance(answer, RejectConnection)


async def http_get(host: str, port: int, path: str) -> tuple[int, dict[str, object]]:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_binding_a_port_in_use_raises_oserror() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="in use"):
            bind_listener("127.0.0.1", taken.getsockname()[1])


async def test_the_server_sends_websocket_pings_for_keepalive(tmp_path: Path) -> None:
    async with served(tmp_path) as (url, _engine, _fabric):
        ws, _accepted = await RawWebSocket.connect(f"{url}/mcp/svc")
        try:
            with trio.fail_after(30):  # the ping interval is 20 s
                while True:
                    data = await ws.stream.receive_some(65536)
                    ws.ws.receive_data(data or None)
                    if any(isinstance(event, Ping) for event in ws.ws.events()):
                        break
        finally:
            await ws.aclose()
