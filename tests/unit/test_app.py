"""The ASGI app's HTTP routes, driven directly (no sockets)."""

from __future__ import annotations

import json
from typing import Any

from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.runtime.base import ContainerBackend
from reactor_fabric.trio.app import FabricApp
from reactor_fabric.trio.fabric import Fabric
from reactor_fabric.trio.streamable_http import HttpSessions
from tests.fakes import AnsweringEngine, UnreachableEngine

SUITE = Suite(
    version="1.0",
    orchestrator=Orchestrator(allowed_mount_roots=["/tmp"]),
    mcp_services={"time": Service(image="reactor-fabric/mcp-server-time:x")},
)


async def get(engine: ContainerBackend, path: str, method: str = "GET") -> tuple[int, Any]:
    fabric = Fabric(suite=SUITE, engine=engine, network="bridge")
    app = FabricApp(fabric, HttpSessions(fabric))
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method, "headers": [], "query_string": b""}
    await app(scope, receive, send)
    status = sent[0]["status"]
    body = sent[1]["body"]
    return status, json.loads(body) if body else None


async def test_healthz_is_200_with_docker_ok_when_the_engine_answers() -> None:
    status, body = await get(AnsweringEngine(), "/healthz")
    assert status == 200
    assert body["status"] == "ok"
    assert body["docker"] == "ok"
    assert body["docker_version"] == "99.0-fake"
    assert body["sessions"] == 0
    assert body["containers"] == 0
    assert body["version"]


async def test_healthz_is_503_with_the_reason_when_the_engine_is_unreachable() -> None:
    status, body = await get(UnreachableEngine(), "/healthz")
    assert status == 503
    assert body["docker"] == "unavailable"
    assert "cannot reach" in body["docker_error"]


async def test_healthz_answers_head_without_a_body() -> None:
    status, body = await get(AnsweringEngine(), "/healthz", method="HEAD")
    assert (status, body) == (200, None)


async def test_healthz_refuses_other_methods_with_405() -> None:
    status, _ = await get(AnsweringEngine(), "/healthz", method="POST")
    assert status == 405


async def test_unknown_paths_are_404() -> None:
    status, body = await get(AnsweringEngine(), "/nope")
    assert status == 404
    assert body["path"] == "/nope"
