"""Errors as real clients show them, on the real engine.

Every refusal the orchestrator makes (a refused mount, an unknown service, no room for another
session) and its shutdown with a call in flight must reach each client as the JSON-RPC error
with the documented code and ``data.reason`` — the error of the request the client made, not a
closed connection, an HTTP status the client takes for an auth prompt, or a 45 s timeout. The
assertions are on what each client *reports*: its driver prints what its SDK raised. The
error's message must say what happened in words, since many clients print nothing else.

Clients: the Python SDK 1.x over WebSocket and over Streamable HTTP, the Python SDK 2.x over
Streamable HTTP, the TypeScript SDK over WebSocket (Node's own WebSocket) and over Streamable
HTTP, and the stdio bridge launched by the Python SDK 2.x stdio client.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import (
    LineProcess,
    Orchestrator,
    bridged_client,
    orchestrator,
    orchestrator_fixture,
    python2_client,
    python_client,
    ts_client,
    write_suite,
)

pytestmark = pytest.mark.integration


Launch = Callable[[Orchestrator, str, str], LineProcess]


def sdk1_ws(running: Orchestrator, service: str, query: str) -> LineProcess:
    return python_client(f"{running.ws_url}/mcp/{service}{query}")


def sdk1_http(running: Orchestrator, service: str, query: str) -> LineProcess:
    return python_client(f"{running.http_url}/mcp/{service}{query}")


def sdk2_http(running: Orchestrator, service: str, query: str) -> LineProcess:
    return python2_client(f"{running.http_url}/mcp/{service}{query}")


def ts_ws(running: Orchestrator, service: str, query: str) -> LineProcess:
    return ts_client(f"{running.ws_url}/mcp/{service}{query}")


def ts_http(running: Orchestrator, service: str, query: str) -> LineProcess:
    return ts_client(f"{running.http_url}/mcp/{service}{query}")


def bridge(running: Orchestrator, service: str, query: str) -> LineProcess:
    mount = ["--mount", query.partition("mount=")[2]] if "mount=" in query else ["--no-mount"]
    return bridged_client(running.ws_url, "--service", service, *mount)


LAUNCHERS: dict[str, Launch] = {
    "sdk1-ws": sdk1_ws,
    "sdk1-http": sdk1_http,
    "sdk2-http": sdk2_http,
    "ts-ws": ts_ws,
    "ts-http": ts_http,
    "bridge-sdk2-stdio": bridge,
}


def reported(answer: dict[str, Any]) -> tuple[int, str | None]:
    """The code and reason the client reported (it must have reported a JSON-RPC error)."""
    assert not answer["ok"], answer
    assert "error" in answer, f"the client did not get the JSON-RPC error: {answer}"
    error = answer["error"]
    return error["code"], (error.get("data") or {}).get("reason")


def shown(answer: dict[str, Any]) -> str:
    """The one line a user of the client reads: the error's message as its SDK gives it
    (Python's ``str(exc)``, the TypeScript SDK's ``error.message``), never its data."""
    return str(answer["error"]["message"])


def initialize_error(
    launch: Launch, running: Orchestrator, service: str, query: str
) -> tuple[int, str | None, str]:
    """The code, reason and message line of the error the client reports for initialize."""
    client = launch(running, service, query)
    try:
        answer = client.ask({"op": "initialize"}, timeout=60)
        return (*reported(answer), shown(answer))
    finally:
        client.close()


fabric = orchestrator_fixture(scope="module")


@pytest.mark.parametrize("client", sorted(LAUNCHERS))
def test_a_refused_mount_is_reported_by_the_client_as_32004_with_its_reason(
    fabric: Orchestrator, client: str
) -> None:
    code, reason, line = initialize_error(
        LAUNCHERS[client], fabric, "time", "?mount=/etc:/workspace"
    )
    assert (code, reason) == (-32004, "mount_outside_allowed_roots")
    # What was refused, and why, on the line a message-only client prints.
    assert "Security Violation: '/etc'" in line, line
    assert "is outside the allowed mount roots" in line, line


@pytest.mark.parametrize("client", sorted(LAUNCHERS))
def test_an_unknown_service_is_reported_by_the_client_as_32005(
    fabric: Orchestrator, client: str
) -> None:
    code, reason, line = initialize_error(LAUNCHERS[client], fabric, "no-such-service", "")
    assert (code, reason) == (-32005, "service_not_found")
    assert "Service Not Found: no service named 'no-such-service'" in line, line


@pytest.mark.parametrize("client", sorted(LAUNCHERS))
def test_a_full_orchestrator_is_reported_by_the_client_as_too_many_sessions(
    tmp_path: Path, project_root: Path, client: str
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)], max_sessions=1)
    with orchestrator(suite, tmp_path / "o.log") as running:
        holder = python_client(f"{running.ws_url}/mcp/time")
        try:
            assert holder.ask({"op": "initialize"})["ok"]
            code, reason, line = initialize_error(LAUNCHERS[client], running, "time", "")
            assert (code, reason) == (-32002, "too_many_sessions")
            assert "Too Many Sessions: " in line, line
            assert "Container Start Failure" not in line, line
        finally:
            holder.close()


@pytest.mark.parametrize("client", sorted(LAUNCHERS))
def test_a_call_in_flight_when_the_orchestrator_stops_is_answered_orchestrator_stopping(
    tmp_path: Path, project_root: Path, client: str
) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    with orchestrator(suite, tmp_path / "o.log", expect_clean_exit=False) as running:
        caller = LAUNCHERS[client](running, "everything", "")
        try:
            assert caller.ask({"op": "initialize"})["ok"]
            caller.send(
                {
                    "op": "call",
                    "name": "trigger-long-running-operation",
                    "arguments": {"duration": 120, "steps": 120},
                    "report_progress": True,
                }
            )
            first = caller.read_json()
            assert first.get("op") == "progress", first  # the call runs in its container
            running.process.send_signal(signal.SIGTERM)
            answer = caller.read_json(timeout=30)
            while answer.get("op") == "progress":
                answer = caller.read_json(timeout=30)
            assert reported(answer) == (-32002, "orchestrator_stopping")
            assert "Orchestrator Stopping: the orchestrator is stopping" in shown(answer)
            assert running.process.wait(timeout=30) == 0
        finally:
            caller.close()
