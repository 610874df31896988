"""An isolated call's answer waits for its workspace to be recorded, then names the work (pure:
the fabric endpoint's machine, event by event, and the answers' shape)."""

from __future__ import annotations

import json
from typing import Any

from reactor_fabric._reasons import CALL_DONE, EXITED, ORCHESTRATOR_STOPPING
from reactor_fabric.protocol.events import (
    Action,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendStarted,
    ClientFrame,
    ClientGone,
    Shutdown,
    StartBackend,
    StopBackend,
    ToBackend,
    ToolCallDone,
    WorkspaceRecorded,
)
from reactor_fabric.protocol.fabric_server import FabricServer
from reactor_fabric.protocol.lifecycle import Lifecycle
from reactor_fabric.protocol.session import SessionMachine
from reactor_fabric.protocol.settings import RelaySettings
from reactor_fabric.protocol.workspace_answers import with_workspace, workspace_text
from tests.messages import INITIALIZE, request
from tests.unit.protocol.test_fabric_lifecycles import (
    answer,
    call,
    fed,
    per_call_session,
    sent,
    started_keys,
)
from tests.unit.protocol.test_fabric_server import Clock, msg, to_client

INITIALIZE_FRAME = json.dumps(INITIALIZE).encode()
RECORDED = {
    "mode": "isolated",
    "branch": "reactor-fabric/time/20261129T120000Z-abc123",
    "base": "1" * 40,
    "commit": "2" * 40,
    "files_changed": 2,
    "insertions": 7,
    "deletions": 1,
}


def isolated_call(server: FabricServer, clock: Clock, request_id: int) -> tuple[BackendKey, Any]:
    """A call whose per-call container works on a copy: started, greeted, sent the call."""
    [key] = started_keys(call(server, clock, request_id))
    [handshake] = sent(fed(server, clock, BackendStarted(key, workspace=True)), key)
    greeted = msg(id=handshake["id"], result={"capabilities": {}, "serverInfo": {}})
    [_initialized, request] = sent(fed(server, clock, BackendLine(key, greeted)), key)
    return key, request


def stops(actions: list[Action]) -> list[StopBackend]:
    return [a for a in actions if isinstance(a, StopBackend)]


def test_an_isolated_calls_answer_waits_for_its_workspace_then_names_the_branch() -> None:
    server, clock = per_call_session()
    key, request = isolated_call(server, clock, 7)
    answered = answer(server, clock, key, request)
    # Nothing for the client yet, no record: the container is stopped and its copy recorded.
    assert to_client(answered) == []
    assert not [a for a in answered if isinstance(a, ToolCallDone)]
    assert [(s.reason, s.graceful, s.report_workspace) for s in stops(answered)] == [
        (CALL_DONE, True, True)
    ]
    recorded = fed(server, clock, WorkspaceRecorded(key, RECORDED))
    [reply] = to_client(recorded)
    assert reply["id"] == 7
    assert reply["result"]["structuredContent"] == {"workspace": RECORDED}
    assert [c["text"] for c in reply["result"]["content"]] == [
        f"from {key.seq}",
        "Workspace: the task's changes are on branch "
        "reactor-fabric/time/20261129T120000Z-abc123 (commit 222222222222, from 111111111111: "
        "2 files changed, +7 -1).",
    ]
    [done] = [a for a in recorded if isinstance(a, ToolCallDone)]
    assert done.call.outcome == "ok"
    # get_status and the status page show the branch under the container that made it.
    [served] = server.table.served.records(0.0)
    assert (served["state"], served["workspace_branch"]) == ("ended", RECORDED["branch"])
    # Recorded once: a second report (there is none) would find nothing held.
    assert fed(server, clock, WorkspaceRecorded(key, RECORDED)) == []


def test_a_call_whose_container_has_no_copy_is_answered_at_once() -> None:
    server, clock = per_call_session()
    [key] = started_keys(call(server, clock, 1))
    [handshake] = sent(fed(server, clock, BackendStarted(key)), key)
    greeted = msg(id=handshake["id"], result={"capabilities": {}, "serverInfo": {}})
    [_initialized, request] = sent(fed(server, clock, BackendLine(key, greeted)), key)
    answered = answer(server, clock, key, request)
    [reply] = to_client(answered)
    assert "structuredContent" not in reply["result"]
    assert [s.report_workspace for s in stops(answered)] == [False]


def test_an_error_answer_carries_its_workspace_in_its_data() -> None:
    server, clock = per_call_session()
    key, request = isolated_call(server, clock, 3)
    error = {"code": -32603, "message": "boom", "data": {"reason": "x"}}
    assert to_client(fed(server, clock, BackendLine(key, msg(id=request["id"], error=error)))) == []
    unchanged = {**RECORDED, "commit": None, "branch": None, "files_changed": 0}
    [reply] = to_client(fed(server, clock, WorkspaceRecorded(key, unchanged)))
    assert reply["error"]["data"] == {"reason": "x", "workspace": unchanged}
    assert reply["error"]["message"] == "boom"


def test_a_recording_that_failed_is_said_and_the_calls_own_outcome_kept() -> None:
    server, clock = per_call_session()
    key, request = isolated_call(server, clock, 4)
    answer(server, clock, key, request)
    [reply] = to_client(fed(server, clock, WorkspaceRecorded(key, None, "git fast-import failed")))
    workspace = reply["result"]["structuredContent"]["workspace"]
    assert workspace["error"] == "git fast-import failed"
    assert (workspace["branch"], workspace["commit"]) == (None, None)
    assert reply["result"]["content"][-1]["text"] == (
        "Workspace: the task's changes were not recorded: git fast-import failed"
    )
    assert "isError" not in reply["result"]


def test_a_session_ending_while_a_workspace_is_recorded_answers_the_call_and_ignores_it() -> None:
    server, clock = per_call_session()
    key, request = isolated_call(server, clock, 5)
    answer(server, clock, key, request)
    ended = fed(server, clock, Shutdown(ORCHESTRATOR_STOPPING))
    [reply] = [r for r in to_client(ended) if r.get("id") == 5]
    assert reply["error"]["data"]["reason"] == ORCHESTRATOR_STOPPING
    assert fed(server, clock, WorkspaceRecorded(key, RECORDED)) == []


def test_a_client_gone_while_a_workspace_is_recorded_gets_nothing_more() -> None:
    server, clock = per_call_session()
    key, request = isolated_call(server, clock, 6)
    answer(server, clock, key, request)
    gone = fed(server, clock, ClientGone())
    assert to_client(gone) == []
    assert [(s.key, s.reason) for s in stops(gone)] == []  # already stopping
    assert fed(server, clock, WorkspaceRecorded(key, RECORDED)) == []


def test_an_isolated_container_that_exits_before_answering_is_stopped_without_holding() -> None:
    server, clock = per_call_session()
    key, _request = isolated_call(server, clock, 8)
    exited = fed(server, clock, BackendExited(key, 1))
    [reply] = to_client(exited)
    assert reply["id"] == 8
    assert "error" in reply
    assert [(s.reason, s.report_workspace) for s in stops(exited)] == [(EXITED, False)]


def test_two_isolated_calls_at_once_are_held_and_released_each_by_its_own_container() -> None:
    server, clock = per_call_session()
    first, first_request = isolated_call(server, clock, 1)
    second, second_request = isolated_call(server, clock, 2)
    answer(server, clock, second, second_request)
    answer(server, clock, first, first_request)
    other = {**RECORDED, "branch": "reactor-fabric/time/other"}
    [reply_first] = to_client(fed(server, clock, WorkspaceRecorded(first, other)))
    [reply_second] = to_client(fed(server, clock, WorkspaceRecorded(second, RECORDED)))
    assert reply_first["id"] == 1
    assert reply_first["result"]["structuredContent"]["workspace"]["branch"].endswith("other")
    assert reply_second["id"] == 2
    assert reply_second["result"]["structuredContent"]["workspace"] == RECORDED


def test_a_result_with_structured_content_keeps_it_beside_the_workspace() -> None:
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [], "structuredContent": {"turns": 3}, "isError": True},
    }
    named = with_workspace(message, RECORDED, None)
    assert named["result"]["structuredContent"] == {"turns": 3, "workspace": RECORDED}
    assert named["result"]["isError"] is True
    assert message["result"]["structuredContent"] == {"turns": 3}  # not changed in place


def test_an_answer_of_no_known_shape_is_passed_on_as_it_is() -> None:
    odd = {"jsonrpc": "2.0", "id": 1, "result": {"structuredContent": [1, 2]}}
    named = with_workspace(odd, RECORDED, None)
    assert named["result"]["structuredContent"] == [1, 2]
    assert named["result"]["content"][0]["type"] == "text"
    strange = {"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "m", "data": "text"}}
    assert with_workspace(strange, RECORDED, None) == strange


def test_the_text_says_when_nothing_changed_and_when_the_repository_had_no_commit() -> None:
    nothing = {**RECORDED, "branch": None, "commit": None}
    assert workspace_text(nothing) == (
        "Workspace: the task changed nothing (no branch; it started from 111111111111)."
    )
    unborn = {**RECORDED, "base": None}
    assert "from an empty repository:" in workspace_text(unborn)
    failed = with_workspace({"result": {}}, None, None)
    assert json.loads(json.dumps(failed))["result"]["structuredContent"]["workspace"]["error"]


def test_a_call_cancelled_while_its_answer_is_held_is_not_answered_after_its_cancel() -> None:
    # (found by exploring the fabric machine: the held answer went out after the cancel)
    server, clock = per_call_session()
    key, request = isolated_call(server, clock, 9)
    answer(server, clock, key, request)
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}}
    cancelled = fed(server, clock, ClientFrame(json.dumps(note).encode()))
    assert to_client(cancelled) == []
    [done] = [a for a in cancelled if isinstance(a, ToolCallDone)]
    assert done.call.outcome == "cancelled"
    recorded = fed(server, clock, WorkspaceRecorded(key, RECORDED))
    assert to_client(recorded) == []
    assert not [a for a in recorded if isinstance(a, ToolCallDone)]
    # The branch is still the container's, on the status page (and in the audit's record).
    [served] = server.table.served.records(0.0)
    assert served["workspace_branch"] == RECORDED["branch"]


def test_a_relayed_call_cancelled_while_its_answer_is_held_is_not_answered_either() -> None:
    settings = RelaySettings(lifecycle=Lifecycle("fresh_per_call"), isolated=True)
    machine = SessionMachine(settings, service_name="svc", now=0.0)
    [start] = [a for a in machine.handle(ClientFrame(INITIALIZE_FRAME), 0.0)
               if isinstance(a, StartBackend)]  # fmt: skip
    key = start.key
    wrote = machine.handle(BackendStarted(key, workspace=True), 0.0)
    assert [json.loads(a.data)["method"] for a in wrote if isinstance(a, ToBackend)] == [
        "initialize"
    ]
    greeted = msg(id=1, result={"capabilities": {}, "serverInfo": {}})
    assert [r["id"] for r in to_client(machine.handle(BackendLine(key, greeted), 0.0))] == [1]
    call_frame = json.dumps(request(2, "tools/call", {"name": "t"})).encode()
    machine.handle(ClientFrame(call_frame), 0.0)
    answered = machine.handle(BackendLine(key, msg(id=2, result={"content": []})), 0.0)
    assert to_client(answered) == []  # held for the workspace
    assert [s.report_workspace for s in stops(answered)] == [True]
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
    cancelled = machine.handle(ClientFrame(json.dumps(note).encode()), 0.0)
    assert to_client(cancelled) == []
    [done] = [a for a in cancelled if isinstance(a, ToolCallDone)]
    assert done.call.outcome == "cancelled"
    assert to_client(machine.handle(WorkspaceRecorded(key, RECORDED), 0.0)) == []
