"""The Streamable HTTP endpoint, driven through the ASGI app in-process (no sockets), with the
in-memory backend: sessions, answers, streams, expiry and every refusal."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.runtime.memory import MemoryEngine, open_memory_engine
from reactor_fabric.trio.app import FabricApp
from reactor_fabric.trio.fabric import Fabric
from reactor_fabric.trio.streamable_http import HttpSessions
from tests.fakes import INITIALIZE, INITIALIZED, request, scripted_mcp_server

BOTH = "application/json, text/event-stream"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[dict[str, Any]]:
        """The JSON-RPC messages of an SSE body."""
        return [
            json.loads(line[len(b"data: ") :])
            for line in self.body.splitlines()
            if line.startswith(b"data: ")
        ]

    @property
    def session(self) -> str:
        return self.headers["mcp-session-id"]


class Http:
    def __init__(self, app: FabricApp, engine: MemoryEngine, sessions: HttpSessions) -> None:
        self.app = app
        self.engine = engine
        self.sessions = sessions

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        accept: str = BOTH,
        disconnect: trio.Event | None = None,
        on_body: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> Reply:
        raw = (
            body
            if isinstance(body, bytes)
            else (json.dumps(body).encode() if body is not None else b"")
        )
        all_headers = {
            "host": "127.0.0.1:8765",
            "accept": accept,
            "content-type": "application/json",
            **(headers or {}),
        }
        path, _, query = path.partition("?")
        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "query_string": query.encode(),
            "headers": [(k.encode(), v.encode()) for k, v in all_headers.items()],
        }
        sent: list[dict[str, Any]] = []
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": raw, "more_body": False}
            if disconnect is None:
                await trio.sleep_forever()
            else:
                await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if on_body is not None and message.get("body"):
                await on_body(message["body"])

        await self.app(scope, receive, send)
        start = sent[0]
        return Reply(
            start["status"],
            {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]),
        )

    async def post(
        self, body: Any, *, session: str | None = None, path: str = "/mcp/svc", **kwargs: Any
    ) -> Reply:
        headers = kwargs.pop("headers", {})
        if session is not None:
            headers["mcp-session-id"] = session
        return await self.request("POST", path, body, headers=headers, **kwargs)


@asynccontextmanager
async def endpoint(root: Path, **orchestrator: Any) -> AsyncIterator[Http]:
    suite = Suite(
        version="1.0",
        orchestrator=Orchestrator(allowed_mount_roots=[str(root)], **orchestrator),
        mcp_services={"svc": Service(image="fake/svc:1", timeout="1m")},
    )
    async with open_memory_engine(scripted_mcp_server) as engine:
        fabric = Fabric(suite, engine=engine, network="none")
        sessions = HttpSessions(fabric)
        async with trio.open_nursery() as nursery:
            await nursery.start(sessions.run)
            yield Http(FabricApp(fabric, sessions), engine, sessions)
            for session in list(sessions.by_id.values()):
                await sessions.terminate(session)
            nursery.cancel_scope.cancel()
        assert engine.alive == []


async def open_session(http: Http) -> str:
    reply = await http.post(INITIALIZE)
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["result"]["serverInfo"]["name"] == "scripted"
    accepted = await http.post(INITIALIZED, session=reply.session)
    assert accepted.status == 202
    return reply.session


async def test_initialize_starts_a_session_whose_id_comes_back_in_a_header(
    tmp_path: Path,
) -> None:
    async with endpoint(tmp_path) as http:
        session = await open_session(http)
        assert len(session) == 32
        assert [spec.labels["reactor-fabric.session"] for spec in http.engine.spawned] == [session]


async def test_a_request_whose_response_comes_first_is_answered_as_plain_json(
    tmp_path: Path,
) -> None:
    async with endpoint(tmp_path) as http:
        session = await open_session(http)
        reply = await http.post(request(2, "tools/list"), session=session)
        assert reply.status == 200
        assert reply.headers["content-type"] == "application/json"
        assert reply.json()["id"] == 2


async def test_messages_before_the_response_turn_the_answer_into_an_sse_stream(
    tmp_path: Path,
) -> None:
    async with endpoint(tmp_path) as http:
        session = await open_session(http)
        reply = await http.post(
            request(
                2,
                "tools/call",
                {"name": "progress", "arguments": {}, "_meta": {"progressToken": "t"}},
            ),
            session=session,
        )
        assert reply.status == 200
        assert reply.headers["content-type"] == "text/event-stream"
        events = reply.events()
        assert [e.get("method") for e in events] == [
            "notifications/progress",
            "notifications/progress",
            None,
        ]
        assert events[-1]["id"] == 2
        assert len(http.engine.spawned) == 1


async def test_a_client_accepting_only_json_gets_json_answers(tmp_path: Path) -> None:
    async with endpoint(tmp_path) as http:
        session = await open_session(http)
        reply = await http.post(
            request(3, "tools/list"), session=session, accept="application/json"
        )
        assert reply.headers["content-type"] == "application/json"
        assert reply.json()["id"] == 3


async def test_register_client_over_http_mounts_and_answers_with_the_session_id(
    tmp_path: Path,
) -> None:
    async with endpoint(tmp_path) as http:
        mount = {"source": str(tmp_path), "target": "/workspace", "readOnly": True}
        reply = await http.post(request(1, "fabric/registerClient", {"mounts": [mount]}))
        assert reply.status == 200
        assert reply.json()["result"]["sessionId"] == reply.session
        await trio.testing.wait_all_tasks_blocked()
        [spec] = http.engine.spawned
        assert spec.mounts[0].source == str(tmp_path)


async def test_query_mounts_apply_to_http_sessions(tmp_path: Path) -> None:
    async with endpoint(tmp_path) as http:
        reply = await http.post(INITIALIZE, path=f"/mcp/svc?mount={tmp_path}:/data:ro")
        assert reply.status == 200
        [spec] = http.engine.spawned
        assert (spec.mounts[0].target, spec.mounts[0].read_only) == ("/data", True)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (
            request(1, "fabric/registerClient", {"mounts": [{"source": "/etc", "target": "/w"}]}),
            403,
            -32004,
        ),
        (b'[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', 400, -32600),
        (b"{oops", 400, -32700),
    ],
    ids=["refused-mount", "batch", "not-json"],
)
async def test_a_refused_first_message_gets_a_meaningful_status_and_no_container(
    tmp_path: Path, body: Any, status: int, code: int
) -> None:
    async with endpoint(tmp_path) as http:
        reply = await http.post(body)
        assert reply.status == status
        assert reply.json()["error"]["code"] == code
        assert http.engine.spawned == []


async def test_an_unknown_service_is_404_with_32005(tmp_path: Path) -> None:
    async with endpoint(tmp_path) as http:
        reply = await http.post(INITIALIZE, path="/mcp/nope")
        assert reply.status == 404
        assert reply.json()["error"]["code"] == -32005


async def test_an_unknown_session_id_is_404(tmp_path: Path) -> None:
    async with endpoint(tmp_path) as http:
        reply = await http.post(request(2, "tools/list"), session="0" * 32)
        assert reply.status == 404


async def test_delete_ends_the_session_and_removes_its_container(tmp_path: Path) -> None:
    async with endpoint(tmp_path) as http:
        session = await open_session(http)
        assert len(http.engine.alive) == 1
        reply = await http.request("DELETE", "/mcp/svc", headers={"mcp-session-id": session})
        assert reply.status == 204
        assert http.engine.alive == []
        assert (await http.post(request(2, "tools/list"), session=session)).status == 404


async def test_a_stateless_request_on_the_bare_url_is_told_to_use_a_session_url(
    tmp_path: Path,
) -> None:
    async with endpoint(tmp_path) as http:
        reply = await http.post(request(1, "server/discover"))
        assert reply.status == 400
        error = reply.json()["error"]
        assert error["data"]["reason"] == "stateless_needs_session_url"
        assert "/mcp/svc/<your-key>" in error["data"]["detail"]
        assert http.engine.spawned == []


async def test_requests_to_one_keyed_url_share_one_session_and_container(tmp_path: Path) -> None:
    async with endpoint(tmp_path) as http:
        for request_id in (1, 2, 3):
            reply = await http.post(
                request(request_id, "tools/call", {"name": "echo", "arguments": {"n": request_id}}),
                path="/mcp/svc/agent-7",
            )
            assert reply.status == 200
        assert len(http.engine.spawned) == 1
        other = await http.post(request(1, "tools/list"), path="/mcp/svc/agent-8")
        assert other.status == 200
        assert len(http.engine.spawned) == 2


async def test_a_server_request_without_a_streaming_post_goes_to_the_get_stream(
    tmp_path: Path,
) -> None:
    async with endpoint(tmp_path) as http:
        session = await open_session(http)
        chunks_in, chunks = trio.open_memory_channel[bytes](10)
        stop, answered = trio.Event(), trio.Event()
        results: list[Reply] = []

        async def listen() -> None:
            await http.request(
                "GET",
                "/mcp/svc",
                headers={"mcp-session-id": session},
                accept="text/event-stream",
                disconnect=stop,
                on_body=chunks_in.send,
            )

        async def ask() -> None:
            # Answered as JSON, so the server's roots/list request cannot ride on this POST.
            results.append(
                await http.post(
                    request(5, "tools/call", {"name": "ask"}),
                    session=session,
                    accept="application/json",
                )
            )
            answered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen)
            nursery.start_soon(ask)
            chunk = await chunks.receive()
            asked = json.loads(chunk.partition(b"data: ")[2])
            assert asked["method"] == "roots/list"
            reply = {"jsonrpc": "2.0", "id": asked["id"], "result": {"roots": []}}
            assert (await http.post(reply, session=session)).status == 202
            await answered.wait()
            stop.set()
        assert results[0].json()["id"] == 5


async def test_origin_host_accept_content_type_size_and_version_are_checked(
    tmp_path: Path,
) -> None:
    async with endpoint(tmp_path, max_message_size="2k") as http:
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
        assert http.engine.spawned == []


async def test_an_http_session_without_activity_expires_with_its_container(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with endpoint(tmp_path) as http:
        session = await open_session(http)
        await trio.sleep(601)
        assert http.engine.alive == []
        assert (await http.post(request(2, "tools/list"), session=session)).status == 404
