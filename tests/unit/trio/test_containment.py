"""A failure inside one session stays inside it, on every transport.

A bug is injected into one session (a runtime step that raises an exception nobody expects,
not a product error): that session's client is told, with the JSON-RPC error answering what it
had asked, and its connection closes; the orchestrator keeps serving; another session that was
running goes on, and a new one starts; nothing leaks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from wsproto.events import CloseConnection

from reactor_fabric import FabricError
from reactor_fabric.policy.container_spec import ContainerSpec
from reactor_fabric.protocol.events import Action, ClientFrame, Event
from reactor_fabric.protocol.jsonrpc import Peek
from reactor_fabric.protocol.session import SessionMachine
from reactor_fabric.trio.session import _Progress, _tell_client_of_crash, serve_session
from tests.fakes import MemoryClient
from tests.messages import INITIALIZE, INITIALIZED, request
from tests.served import Served, served


class InjectedBug(RuntimeError):
    pass


def doomed(marker: Path) -> Any:
    """Only the containers of the session that mounts ``marker``."""

    def matches(spec: ContainerSpec) -> bool:
        return any(mount.source == str(marker) for mount in spec.mounts)

    return matches


def call(request_id: int) -> dict[str, Any]:
    return request(request_id, "tools/call", {"name": "echo", "arguments": {"n": request_id}})


async def start_bystander(http: Served) -> Any:
    """A WebSocket session that is running when the other one fails."""
    ws, _ = await http.websocket()
    await ws.send_json(INITIALIZE)
    assert (await ws.hear())["id"] == 1
    await ws.send_json(INITIALIZED)
    return ws


async def still_serving(http: Served, bystander: Any) -> None:
    await bystander.send_json(call(7))
    assert (await bystander.hear())["id"] == 7
    fresh = await http.post(INITIALIZE)
    assert fresh.status == 200
    assert fresh.json()["result"]["serverInfo"]["name"] == "scripted"
    await http.http("DELETE", "/mcp/svc", headers={"mcp-session-id": fresh.session})
    await bystander.aclose()


@pytest.mark.parametrize("step", ["create", "exit_status"])
async def test_a_bug_in_a_websocket_session_is_told_to_its_client_and_hurts_nobody_else(
    tmp_path: Path, step: str
) -> None:
    marker = tmp_path / "doomed"
    marker.mkdir()
    async with served(tmp_path) as http:
        bystander = await start_bystander(http)
        http.runtime.fault(step, error=InjectedBug("injected"), only=doomed(marker))
        ws, _ = await http.websocket(f"/mcp/svc?mount={marker}:/workspace")
        await ws.send_json(INITIALIZE)
        if step == "exit_status":  # the bug strikes when its container dies
            assert "result" in await ws.hear()
            await ws.send_json(request(2, "tools/call", {"name": "crash", "arguments": {}}))
        answer = await ws.hear()
        assert answer["id"] == (1 if step == "create" else 2)
        assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (
            -32002,
            "internal_error",
        )
        event = await ws.next_event()
        assert isinstance(event, CloseConnection)
        assert event.code == 1011
        await ws.aclose()
        http.runtime.clear_faults()
        await still_serving(http, bystander)


@pytest.mark.parametrize("step", ["create", "exit_status"])
async def test_a_bug_in_an_http_session_is_told_to_its_client_and_hurts_nobody_else(
    tmp_path: Path, step: str
) -> None:
    marker = tmp_path / "doomed"
    marker.mkdir()
    async with served(tmp_path) as http:
        bystander = await start_bystander(http)
        http.runtime.fault(step, error=InjectedBug("injected"), only=doomed(marker))
        path = f"/mcp/svc?mount={marker}:/workspace"
        if step == "create":
            reply = await http.post(INITIALIZE, path=path)
            expected_id = 1
        else:
            opened = await http.post(INITIALIZE, path=path)
            crash = request(2, "tools/call", {"name": "crash", "arguments": {}})
            reply = await http.post(crash, session=opened.session)
            expected_id = 2
        assert reply.status == 200
        answer = reply.json() if reply.headers["content-type"] == "application/json" else None
        if answer is None:
            [answer] = [e for e in reply.events() if e.get("id") == expected_id]
        assert answer["id"] == expected_id
        assert answer["error"]["data"]["reason"] == "internal_error"
        http.runtime.clear_faults()
        await trio.testing.wait_all_tasks_blocked()
        await still_serving(http, bystander)


@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_a_bug_in_the_machine_on_a_clients_request_answers_it_and_ends_only_that_session(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    transport: str,
) -> None:
    # Over HTTP the POST's own task hands the message to the machine (DeliversDirectly); a
    # bug there must still be the session's crash, told to its client, as over WebSocket
    # (where the session's reader task meets it).
    handle = SessionMachine.handle

    def buggy(self: SessionMachine, event: Event, now: float) -> list[Action]:
        if isinstance(event, ClientFrame) and b"machine_bug" in event.frame:
            raise InjectedBug("a bug in the machine")
        return handle(self, event, now)

    monkeypatch.setattr(SessionMachine, "handle", buggy)
    doomed_call = request(2, "tools/call", {"name": "machine_bug", "arguments": {}})
    async with served(tmp_path) as http:
        bystander = await start_bystander(http)
        if transport == "http":
            opened = await http.post(INITIALIZE)
            await http.post(INITIALIZED, session=opened.session)
            with trio.fail_after(30):  # (a crash lost in the POST's task would hang it)
                reply = await http.post(doomed_call, session=opened.session)
            # The machine never took the request; the crash answers it all the same, as it
            # answers every request the session owed, and the session is gone.
            assert reply.status == 200
            answer = reply.json()
            assert (answer["id"], answer["error"]["code"]) == (2, -32002)
            assert answer["error"]["data"]["reason"] == "internal_error"
            gone = await http.post(request(3, "tools/list"), session=opened.session)
            assert gone.status == 404
        else:
            ws, _ = await http.websocket()
            await ws.send_json(INITIALIZE)
            assert (await ws.hear())["id"] == 1
            await ws.send_json(INITIALIZED)
            await ws.send_json(doomed_call)
            answer = await ws.hear()
            assert (answer["id"], answer["error"]["code"]) == (2, -32002)
            assert answer["error"]["data"]["reason"] == "internal_error"
            event = await ws.next_event()
            assert isinstance(event, CloseConnection)
            assert (event.code, event.reason) == (1011, "internal error")
            await ws.aclose()
        assert "a bug in the machine" in caplog.text  # (the crash, logged with its cause)
        await trio.testing.wait_all_tasks_blocked()
        await still_serving(http, bystander)


@pytest.mark.parametrize("taken", [True, False], ids=["request_taken", "notification"])
async def test_a_bug_in_the_machine_answers_each_request_once_and_no_notification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: bool
) -> None:
    # A request the machine took before failing is among the answers it owes (answered once,
    # not again as the message it failed on); a notification it failed on is owed nothing.
    handle = SessionMachine.handle

    def buggy(self: SessionMachine, event: Event, now: float) -> list[Action]:
        if isinstance(event, ClientFrame) and b"machine_bug" in event.frame:
            if taken:
                handle(self, event, now)  # (the machine has the request in flight now)
            raise InjectedBug("a bug in the machine")
        return handle(self, event, now)

    monkeypatch.setattr(SessionMachine, "handle", buggy)
    doomed = (
        request(2, "tools/call", {"name": "machine_bug", "arguments": {}})
        if taken
        else {"jsonrpc": "2.0", "method": "notifications/machine_bug"}
    )
    async with served(tmp_path) as http:
        ws, _ = await http.websocket()
        await ws.send_json(INITIALIZE)
        assert (await ws.hear())["id"] == 1
        await ws.send_json(INITIALIZED)
        await ws.send_json(doomed)
        if taken:
            answer = await ws.hear()
            assert (answer["id"], answer["error"]["data"]["reason"]) == (2, "internal_error")
        event = await ws.next_event()
        assert isinstance(event, CloseConnection)
        assert event.code == 1011
        await ws.aclose()


async def test_a_bug_in_a_session_over_a_plain_channel_ends_only_that_session(
    tmp_path: Path,
) -> None:
    # The transport-free path (what the stdio bridge's WebSocket and any future transport
    # share): serve_session itself contains the failure.
    marker = tmp_path / "doomed"
    marker.mkdir()
    async with served(tmp_path) as http:
        http.runtime.fault("create", error=InjectedBug("injected"), only=doomed(marker))
        client = MemoryClient()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_session, http.fabric, client, "svc", [f"{marker}:/workspace"])
            await client.say(INITIALIZE)
            answer = await client.hear()
            assert answer["error"]["data"]["reason"] == "internal_error"
        assert client.closed_with == (1011, "internal error")


class _OwedFramesBug:
    """A session driver with a second bug: listing what it owes fails too."""

    async def run(self, first_frame: bytes, first: object) -> None:
        raise NotImplementedError

    def owed_frames(self, error: FabricError) -> list[bytes]:
        raise InjectedBug("a second bug")


class _BrokenChannel(MemoryClient):
    """A channel whose send fails with something no transport should raise."""

    async def send(self, frame: bytes, message: Peek | None = None, *, more: bool = False) -> None:
        raise InjectedBug("the channel broke")


async def test_a_second_bug_while_telling_the_client_of_a_crash_is_logged_not_hidden(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = MemoryClient()
    progress = _Progress(first_request_id=1, driver=_OwedFramesBug())
    with caplog.at_level(logging.INFO, logger="reactor_fabric.trio.session"):
        await _tell_client_of_crash(client, progress, "s-1")
    [logged] = [r for r in caplog.records if r.getMessage() == "session_crash_answers_failed"]
    assert logged.levelno == logging.ERROR
    assert logged.exc_info is not None
    assert str(logged.exc_info[1]) == "a second bug"
    # Still contained: the first request is answered, and the connection closes.
    answer = await client.hear()
    assert (answer["id"], answer["error"]["data"]["reason"]) == (1, "internal_error")
    assert client.closed_with == (1011, "internal error")


async def test_a_channel_that_fails_to_take_a_crash_answer_is_logged_and_still_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _BrokenChannel()
    with caplog.at_level(logging.INFO, logger="reactor_fabric.trio.session"):
        await _tell_client_of_crash(client, _Progress(first_request_id=1), "s-1")
    [logged] = [r for r in caplog.records if r.getMessage() == "session_crash_untold"]
    assert logged.levelno == logging.ERROR
    assert logged.exc_info is not None
    assert str(logged.exc_info[1]) == "the channel broke"
    assert client.closed_with == (1011, "internal error")


async def test_a_client_gone_before_the_crash_answer_is_only_noted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = MemoryClient()
    await client.close(1000)
    with caplog.at_level(logging.INFO, logger="reactor_fabric.trio.session"):
        await _tell_client_of_crash(client, _Progress(first_request_id=1), "s-1")
    [logged] = [r for r in caplog.records if r.getMessage() == "session_crash_untold"]
    assert (logged.levelno, logged.exc_info) == (logging.INFO, None)
