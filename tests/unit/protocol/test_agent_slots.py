"""orchestrator.agents: agent calls in flight, per session and in all, event by event (pure: the
shared count and both session machines, no container, no socket)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from reactor_fabric._errors import CONTAINER_START_FAILURE, ContainerStartFailure
from reactor_fabric._reasons import AGENT_BUSY, ORCHESTRATOR_STOPPING
from reactor_fabric.config.structs import Agents, Service
from reactor_fabric.protocol.agent_slots import ORCHESTRATOR, SESSION, AgentLimits, AgentSlots
from reactor_fabric.protocol.answers import SessionLimits
from reactor_fabric.protocol.events import (
    Action,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendStartFailed,
    ClientFrame,
    ClientGone,
    Shutdown,
    StartBackend,
    StopBackend,
    ToBackend,
    ToClient,
)
from reactor_fabric.protocol.fabric_server import FabricServer, Lifecycle
from reactor_fabric.protocol.session import SessionMachine
from reactor_fabric.protocol.settings import RelaySettings
from tests.messages import INITIALIZE, INITIALIZED, request
from tests.served import served
from tests.settings import fabric_server
from tests.unit.protocol.test_fabric_lifecycles import answer, ready, sent, started_keys, stopped
from tests.unit.protocol.test_fabric_server import CATALOG, Clock, msg, to_client
from tests.unit.protocol.test_session_machine import PER_CALL, Run, call, response

# "time" plays the agent (llm_agent, fresh_per_call); "git" an ordinary tool service.
AGENT = "time"
LIFECYCLES = {AGENT: Lifecycle("fresh_per_call")}


def fabric_session(slots: AgentSlots, session_id: str) -> tuple[FabricServer, Clock]:
    clock = Clock()
    server = fabric_server(
        CATALOG,
        session_id=session_id,
        version="9",
        exposure="all",
        now=clock.now,
        lifecycles=LIFECYCLES,
        agents={AGENT},
        agent_slots=slots,
    )
    initialize = msg(
        id=0,
        method="initialize",
        params={"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
    )
    server.handle(ClientFrame(initialize), clock.now)
    return server, clock


def agent_call(server: FabricServer, clock: Clock, request_id: object) -> list[Action]:
    params = {"name": "time__get_current_time", "arguments": {}}
    frame = msg(id=request_id, method="tools/call", params=params)
    return server.handle(ClientFrame(frame), clock.now)


def tool_call(server: FabricServer, request_id: object) -> list[Action]:
    params = {"name": "git__git_log", "arguments": {}}
    return server.handle(ClientFrame(msg(id=request_id, method="tools/call", params=params)), 0)


def busy(actions: list[Action]) -> dict[str, Any]:
    """The one answer of a refused call: its error, the call started nothing."""
    assert [a for a in actions if isinstance(a, StartBackend)] == []
    [reply] = to_client(actions)
    error: dict[str, Any] = reply["error"]
    return error


def slots(total: int = 4, per_session: int = 2) -> AgentSlots:
    return AgentSlots(AgentLimits(total, per_session))


# --- the decision ----------------------------------------------------------------------------


def test_the_defaults_are_four_agent_calls_in_all_and_two_per_session() -> None:
    assert AgentLimits() == AgentLimits(4, 2)
    assert Agents() == Agents(max_concurrent=4, max_concurrent_per_session=2)


def test_a_session_under_both_limits_may_take_one_more_agent_call() -> None:
    shared = slots()
    shared.hold("other", 1)
    assert shared.refusal("mine", 1, AGENT) is None


def test_a_session_at_its_own_limit_is_refused_naming_the_session_and_its_limit() -> None:
    refusal = slots().refusal("mine", 2, AGENT)
    assert refusal is not None
    assert (refusal.code, refusal.reason) == (CONTAINER_START_FAILURE, AGENT_BUSY)
    assert refusal.detail == {"service": AGENT, "limit": 2, "scope": SESSION}
    assert refusal.to_jsonrpc_error()["message"].startswith("Agents Busy: this session")


def test_the_orchestrators_limit_counts_every_other_sessions_calls() -> None:
    shared = slots(total=3)
    shared.hold("a", 2)
    shared.hold("mine", 1)
    refusal = shared.refusal("mine", 1, AGENT)
    assert refusal is not None
    assert refusal.detail["scope"] == ORCHESTRATOR
    assert refusal.detail["limit"] == 3


def test_a_session_counts_its_own_calls_as_it_sees_them_now_not_as_last_reported() -> None:
    shared = slots(total=3, per_session=3)
    shared.hold("mine", 2)  # reported before one of them ended
    shared.hold("a", 1)
    assert shared.refusal("mine", 1, AGENT) is None


def test_a_session_that_leaves_or_reports_none_holds_nothing() -> None:
    shared = slots()
    shared.hold("a", 2)
    shared.hold("b", 1)
    shared.hold("b", 0)
    shared.leave("a")
    assert shared.held == {}
    assert shared.total == 0


# --- the fabric endpoint ---------------------------------------------------------------------


def test_a_fabric_session_over_its_limit_is_answered_agent_busy_at_once_and_starts_nothing() -> (
    None
):
    shared = slots(per_session=2)
    server, clock = fabric_session(shared, "s1")
    agent_call(server, clock, 1)
    agent_call(server, clock, 2)
    refused = agent_call(server, clock, 3)
    error = busy(refused)
    assert error["code"] == -32002
    assert error["data"]["reason"] == AGENT_BUSY
    assert (error["data"]["scope"], error["data"]["limit"]) == (SESSION, 2)
    # Counted in the metrics by code and reason, as every error answered.
    [answer_action] = [a for a in refused if isinstance(a, ToClient)]
    assert answer_action.error == (-32002, AGENT_BUSY)
    assert shared.held == {"s1": 2}


def test_a_second_session_is_refused_by_the_orchestrators_limit_while_another_holds_it() -> None:
    shared = slots(total=2, per_session=2)
    first, clock = fabric_session(shared, "s1")
    second, _ = fabric_session(shared, "s2")
    agent_call(first, clock, 1)
    agent_call(first, clock, 2)
    error = busy(agent_call(second, clock, 1))
    assert (error["data"]["scope"], error["data"]["limit"]) == (ORCHESTRATOR, 2)


def test_calls_of_other_services_are_never_counted_nor_refused() -> None:
    shared = slots(total=1, per_session=1)
    server, clock = fabric_session(shared, "s1")
    agent_call(server, clock, 1)
    assert started_keys(tool_call(server, 2)) != []
    assert shared.held == {"s1": 1}


def held_call(shared: AgentSlots) -> tuple[FabricServer, Clock, BackendKey, dict[str, Any]]:
    """A session whose one agent call is in flight in its ready container."""
    server, clock = fabric_session(shared, "s1")
    [key] = started_keys(agent_call(server, clock, 1))
    [_initialized, request] = ready(server, clock, key)
    assert shared.held == {"s1": 1}
    return server, clock, key, request


def test_an_answered_agent_call_frees_its_slot() -> None:
    shared = slots()
    server, clock, key, request = held_call(shared)
    answer(server, clock, key, request)
    assert shared.held == {}


def test_an_agent_call_answered_with_an_error_frees_its_slot() -> None:
    shared = slots()
    server, clock, key, request = held_call(shared)
    failed = msg(id=request["id"], error={"code": -32603, "message": "no"})
    server.handle(BackendLine(key, failed), clock.now)
    assert shared.held == {}


def test_a_cancelled_agent_call_frees_its_slot_and_its_container_is_told_then_removed() -> None:
    shared = slots()
    server, clock, key, request = held_call(shared)
    cancel = msg(method="notifications/cancelled", params={"requestId": 1})
    actions = server.handle(ClientFrame(cancel), clock.now)
    assert shared.held == {}
    # The adapter hears the cancellation (an agent stops its CLI), then its container goes.
    [told] = sent(actions, key)
    assert told["method"] == "notifications/cancelled"
    assert told["params"]["requestId"] == request["id"]
    [stop] = [a for a in actions if isinstance(a, StopBackend)]
    told_at = next(i for i, a in enumerate(actions) if isinstance(a, ToBackend))
    assert told_at < actions.index(stop)
    assert stopped(actions) == [(key, "call_done")]


def test_an_agent_call_cancelled_while_its_container_starts_frees_its_slot() -> None:
    shared = slots()
    server, clock = fabric_session(shared, "s1")
    agent_call(server, clock, 1)
    cancel = msg(method="notifications/cancelled", params={"requestId": 1})
    server.handle(ClientFrame(cancel), clock.now)
    assert shared.held == {}


def test_an_agent_calls_container_exiting_frees_its_slot() -> None:
    shared = slots()
    server, clock, key, _request = held_call(shared)
    server.handle(BackendExited(key, 1), clock.now)
    assert shared.held == {}


def test_an_agent_calls_container_failing_to_start_frees_its_slot() -> None:
    shared = slots()
    server, clock = fabric_session(shared, "s1")
    [key] = started_keys(agent_call(server, clock, 1))
    failure = ContainerStartFailure("no image", reason="image_not_found")
    server.handle(BackendStartFailed(key, failure), clock.now)
    assert shared.held == {}


def test_the_client_going_away_frees_every_slot_of_its_session_and_removes_its_containers() -> None:
    shared = slots()
    server, clock, key, _request = held_call(shared)
    actions = server.handle(ClientGone(), clock.now)
    assert shared.held == {}
    assert stopped(actions) == [(key, "session_ended")]


def test_the_session_ending_frees_every_slot_of_its_session() -> None:
    shared = slots()
    server, clock, _key, _request = held_call(shared)
    server.handle(Shutdown(ORCHESTRATOR_STOPPING), clock.now)
    assert shared.held == {}


def test_a_freed_slot_takes_the_next_call() -> None:
    shared = slots(per_session=1)
    server, clock, key, request = held_call(shared)
    busy(agent_call(server, clock, 2))
    answer(server, clock, key, request)
    assert started_keys(agent_call(server, clock, 3)) != []


# --- the relay -------------------------------------------------------------------------------


def relay(shared: AgentSlots, session_id: str = "r1") -> Run:
    run = Run(lifecycle=PER_CALL)
    settings = RelaySettings(
        limits=SessionLimits(replay_timeout=30.0), idle_timeout=60.0, lifecycle=PER_CALL
    )
    run.machine = SessionMachine(
        settings, service_name="svc", now=0.0, session_id=session_id, agent_slots=shared
    )
    run.handshake()
    return run


def relay_error(actions: list[Action]) -> dict[str, Any]:
    assert [a for a in actions if isinstance(a, ToBackend | StartBackend)] == []
    [reply] = [json.loads(a.frame) for a in actions if isinstance(a, ToClient)]
    error: dict[str, Any] = reply["error"]
    return error


def test_a_relay_session_over_its_limit_is_answered_agent_busy_and_nothing_is_written() -> None:
    shared = slots(per_session=1)
    run = relay(shared)
    run.client(call(2))
    refused = run.client(call(3))
    error = relay_error(refused)
    assert (error["code"], error["data"]["reason"]) == (-32002, AGENT_BUSY)
    assert (error["data"]["scope"], error["data"]["limit"]) == (SESSION, 1)
    [reply] = [a for a in refused if isinstance(a, ToClient)]
    assert reply.error == (-32002, AGENT_BUSY)
    assert shared.held == {"r1": 1}


def test_a_relay_session_is_refused_by_the_orchestrators_limit_another_session_holds() -> None:
    shared = slots(total=1)
    run = relay(shared, "r1")
    run.client(call(2))
    other = relay(shared, "r2")
    error = relay_error(other.client(call(2)))
    assert error["data"]["scope"] == ORCHESTRATOR


def test_a_relay_agent_call_frees_its_slot_when_answered() -> None:
    shared = slots()
    run = relay(shared)
    run.client(call(2))
    assert shared.held == {"r1": 1}
    run.server(0, response(2))
    assert shared.held == {}


def test_a_relay_agent_call_frees_its_slot_when_cancelled_and_the_cancel_reaches_it() -> None:
    shared = slots()
    run = relay(shared)
    run.client(call(2))
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
    run.client(cancel)
    assert shared.held == {}
    assert run.written(0)[-1] == cancel


def test_a_relay_agent_call_frees_its_slot_when_its_container_exits() -> None:
    shared = slots()
    run = relay(shared)
    run.client(call(2))
    run.do(BackendExited(BackendKey("svc", 0), 1))
    assert shared.held == {}


def test_a_relay_agent_call_frees_its_slot_when_the_client_goes() -> None:
    shared = slots()
    run = relay(shared)
    run.client(call(2))
    run.do(ClientGone())
    assert shared.held == {}


def test_a_relay_agent_call_frees_its_slot_when_the_session_ends() -> None:
    shared = slots()
    run = relay(shared)
    run.client(call(2))
    run.do(Shutdown(ORCHESTRATOR_STOPPING))
    assert shared.held == {}


# --- served: the orchestrator's sessions share one count ---------------------------------------


async def test_sessions_of_one_orchestrator_share_its_limit_and_a_session_that_ends_frees_it(
    tmp_path: Path,
) -> None:
    services = {"svc": Service(image="fake/svc:1", timeout="1m", service_type="llm_agent")}
    limits = Agents(max_concurrent=1, max_concurrent_per_session=1)
    async with served(tmp_path, services=services, agents=limits) as http:
        first, _ = await http.websocket()
        await first.send_json(INITIALIZE)
        await first.hear()
        await first.send_json(INITIALIZED)
        await first.send_json(request(2, "tools/call", {"name": "hold", "arguments": {}}))
        assert (await first.hear())["method"] == "notifications/message"  # it runs
        # The same session: its own limit.
        await first.send_json(request(3, "tools/call", {"name": "echo", "arguments": {}}))
        refused = await first.hear()
        assert refused["id"] == 3
        assert (refused["error"]["data"]["reason"], refused["error"]["data"]["scope"]) == (
            AGENT_BUSY,
            SESSION,
        )
        # Another session: the orchestrator's.
        second, _ = await http.websocket()
        await second.send_json(INITIALIZE)
        await second.hear()
        await second.send_json(request(2, "tools/call", {"name": "echo", "arguments": {}}))
        refused = await second.hear()
        assert refused["error"]["data"]["scope"] == ORCHESTRATOR
        # The first client goes away mid-call: its slot is free, the second may call.
        await first.aclose()
        with trio.fail_after(30):
            while len(http.fabric.registry.sessions) > 1:
                await http.fabric.registry.changed.wait()  # (set whenever a session ends)
        assert http.fabric.registry.agent_slots.held == {}
        await second.send_json(request(3, "tools/call", {"name": "echo", "arguments": {}}))
        answered = await second.hear()
        assert answered["id"] == 3
        assert "result" in answered
        await second.aclose()
    metrics = http.fabric.observer.metrics
    assert metrics.errors.labels(code="-32002", reason=AGENT_BUSY)._value.get() == 2
