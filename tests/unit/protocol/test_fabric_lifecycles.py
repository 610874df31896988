"""Container lifecycles on the fabric endpoint, event by event (pure: no container, no socket):
``fresh_per_call`` (a container of its own for every call, removed when the call ends) and
``smart_refresh`` (replaced between calls once it served its calls, reached its age or uses more
memory than its threshold)."""

from __future__ import annotations

import json
from typing import Any

from reactor_fabric._errors import ContainerStartFailure
from reactor_fabric._reasons import (
    CALL_DONE,
    NOT_NEEDED,
    ORCHESTRATOR_STOPPING,
    REFRESH_AGE,
    REFRESH_CALLS,
    REFRESH_MEMORY,
    SESSION_ENDED,
    TOO_MANY_PER_CALL_CONTAINERS,
)
from reactor_fabric.protocol.events import (
    Action,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendMeasured,
    BackendStarted,
    BackendStartFailed,
    CallRef,
    ClientFrame,
    ClientGone,
    Log,
    MeasureBackend,
    Shutdown,
    StartBackend,
    StopBackend,
    Tick,
    ToBackend,
    ToClient,
)
from reactor_fabric.protocol.fabric_roster import MAX_PER_CALL_CONTAINERS
from reactor_fabric.protocol.fabric_server import FabricServer, Lifecycle
from reactor_fabric.protocol.served import MAX_CALLS_EACH, MAX_ENDED, MAX_ID_CHARS
from reactor_fabric.protocol.tool_calls import ToolCallDone
from tests.unit.protocol.test_fabric_server import Clock, msg, session, to_client

PER_CALL = {"time": Lifecycle("fresh_per_call")}


def fed(server: FabricServer, clock: Clock, event: Any) -> list[Action]:
    return server.handle(event, clock.now)


def call(server: FabricServer, clock: Clock, request_id: object, **extra: Any) -> list[Action]:
    params = {"name": "time__get_current_time", "arguments": {"n": request_id}, **extra}
    return fed(server, clock, ClientFrame(msg(id=request_id, method="tools/call", params=params)))


def started_keys(actions: list[Action]) -> list[BackendKey]:
    return [a.key for a in actions if isinstance(a, StartBackend)]


def stopped(actions: list[Action]) -> list[tuple[BackendKey, str]]:
    return [(a.key, a.reason) for a in actions if isinstance(a, StopBackend)]


def sent(actions: list[Action], key: BackendKey) -> list[dict[str, Any]]:
    return [json.loads(a.data) for a in actions if isinstance(a, ToBackend) and a.key == key]


def ready(server: FabricServer, clock: Clock, key: BackendKey) -> list[dict[str, Any]]:
    """The backend started and answered the machine's handshake: what it was then sent."""
    [handshake] = sent(fed(server, clock, BackendStarted(key)), key)
    assert handshake["method"] == "initialize"
    answer = msg(id=handshake["id"], result={"capabilities": {}, "serverInfo": {}})
    return sent(fed(server, clock, BackendLine(key, answer)), key)


def answer(
    server: FabricServer, clock: Clock, key: BackendKey, request: dict[str, Any]
) -> list[Action]:
    result = {"content": [{"type": "text", "text": f"from {key.seq}"}]}
    return fed(server, clock, BackendLine(key, msg(id=request["id"], result=result)))


def one_call(
    server: FabricServer, clock: Clock, request_id: int
) -> tuple[BackendKey, list[Action]]:
    """A call to a fresh backend, answered: its backend and what the answer did."""
    [key] = started_keys(call(server, clock, request_id))
    [_initialized, request] = ready(server, clock, key)
    return key, answer(server, clock, key, request)


def per_call_session(**options: Any) -> tuple[FabricServer, Clock]:
    clock = Clock()
    options.setdefault("lifecycles", PER_CALL)
    return session(clock=clock, exposure="all", **options), clock


def test_every_call_of_a_per_call_service_runs_in_a_fresh_container_removed_when_it_ends() -> None:
    server, clock = per_call_session()
    keys = []
    for request_id in (1, 2, 3):
        actions = call(server, clock, request_id)
        [start] = [a for a in actions if isinstance(a, StartBackend)]
        assert start.respawn is False  # each is a container of its own, not a respawn
        [_initialized, request] = ready(server, clock, start.key)
        assert request["method"] == "tools/call"
        answered = answer(server, clock, start.key, request)
        [reply] = to_client(answered)
        assert reply["id"] == request_id
        assert reply["result"]["content"][0]["text"] == f"from {start.key.seq}"
        # Answered first, recorded naming its container, then the container goes.
        assert isinstance(answered[0], ToClient)
        [done] = [a for a in answered if isinstance(a, ToolCallDone)]
        assert done.seq == start.key.seq
        [stop] = [a for a in answered if isinstance(a, StopBackend)]
        assert answered.index(done) < answered.index(stop)
        assert stopped(answered) == [(start.key, CALL_DONE)]
        assert [a.graceful for a in answered if isinstance(a, StopBackend)] == [True]
        keys.append(start.key)
    assert len(set(keys)) == 3
    assert server.all_backends == {}
    assert server.backends == {}


def test_a_per_call_container_the_pool_greeted_gets_its_call_at_once_with_no_handshake() -> None:
    server, clock = per_call_session()
    [start] = [a for a in call(server, clock, 7) if isinstance(a, StartBackend)]
    # Any container will do, a greeted one too; the audit names the call it serves.
    assert start.greeted is True
    assert start.call == CallRef(7, "tools/call", "get_current_time")
    actions = fed(server, clock, BackendStarted(start.key, greeting=b'{"capabilities":{}}'))
    [request] = sent(actions, start.key)  # no initialize, no notifications/initialized
    assert request["method"] == "tools/call"
    assert request["params"]["arguments"] == {"n": 7}
    [note] = [a for a in actions if isinstance(a, Log)]
    assert note.event == "backend_greeted_by_pool"
    [reply] = to_client(answer(server, clock, start.key, request))
    assert reply["id"] == 7
    assert server.all_backends == {}


def test_a_per_call_container_not_greeted_by_the_pool_is_greeted_by_the_router() -> None:
    server, clock = per_call_session()
    [key] = started_keys(call(server, clock, 1))
    [handshake] = sent(fed(server, clock, BackendStarted(key)), key)
    assert handshake["method"] == "initialize"
    [initialized, request] = ready_after(server, clock, key, handshake)
    assert initialized["method"] == "notifications/initialized"
    assert request["method"] == "tools/call"


def test_a_service_reused_by_its_session_never_asks_for_a_greeted_container() -> None:
    server, clock = per_call_session(lifecycles={})
    [start] = [a for a in call(server, clock, 1) if isinstance(a, StartBackend)]
    assert start.greeted is False
    assert start.call is None


def ready_after(
    server: FabricServer, clock: Clock, key: BackendKey, handshake: dict[str, Any]
) -> list[dict[str, Any]]:
    answer = msg(id=handshake["id"], result={"capabilities": {}, "serverInfo": {}})
    return sent(fed(server, clock, BackendLine(key, answer)), key)


def test_concurrent_calls_of_a_per_call_service_run_in_separate_containers_at_once() -> None:
    server, clock = per_call_session()
    [first] = started_keys(call(server, clock, 1, _meta={"progressToken": "p1"}))
    [second] = started_keys(call(server, clock, 2, _meta={"progressToken": "p2"}))
    assert first != second
    [_, request_1] = ready(server, clock, first)
    [_, request_2] = ready(server, clock, second)
    assert request_1["params"]["arguments"] == {"n": 1}
    assert request_2["params"]["arguments"] == {"n": 2}
    assert request_2["params"]["_meta"] == {"progressToken": "p2"}
    # The second one's progress reaches the client as it is; its answer ends only its call.
    progress = msg(method="notifications/progress", params={"progressToken": "p2", "progress": 1})
    [note] = to_client(fed(server, clock, BackendLine(second, progress)))
    assert note["params"]["progressToken"] == "p2"
    answered = answer(server, clock, second, request_2)
    assert [r["id"] for r in to_client(answered)] == [2]
    assert stopped(answered) == [(second, CALL_DONE)]
    assert set(server.all_backends) == {first}
    answered = answer(server, clock, first, request_1)
    assert [r["id"] for r in to_client(answered)] == [1]
    assert stopped(answered) == [(first, CALL_DONE)]


def test_the_clients_cancellation_removes_the_container_of_its_call_only() -> None:
    server, clock = per_call_session()
    [first] = started_keys(call(server, clock, 1))
    [second] = started_keys(call(server, clock, 2))
    ready(server, clock, first)
    ready(server, clock, second)
    cancel = msg(method="notifications/cancelled", params={"requestId": 1})
    actions = fed(server, clock, ClientFrame(cancel))
    assert stopped(actions) == [(first, CALL_DONE)]
    [done] = [a for a in actions if isinstance(a, ToolCallDone)]
    assert done.call.outcome == "cancelled"
    assert set(server.all_backends) == {second}


def test_a_call_cancelled_while_its_container_starts_removes_it_once_started() -> None:
    server, clock = per_call_session()
    [key] = started_keys(call(server, clock, 1))
    cancel = msg(method="notifications/cancelled", params={"requestId": 1})
    # Not stopped yet: the driver could not stop what it has not started.
    assert stopped(fed(server, clock, ClientFrame(cancel))) == []
    actions = fed(server, clock, BackendStarted(key))
    assert stopped(actions) == [(key, NOT_NEEDED)]
    assert sent(actions, key) == []  # not even greeted
    assert server.all_backends == {}


def test_a_per_call_container_dying_mid_call_answers_its_call_and_spares_the_others() -> None:
    server, clock = per_call_session()
    [first] = started_keys(call(server, clock, 1))
    [second] = started_keys(call(server, clock, 2))
    ready(server, clock, first)
    [_, request_2] = ready(server, clock, second)
    actions = fed(server, clock, BackendExited(first, 1))
    [error] = to_client(actions)
    assert error["id"] == 1
    assert error["error"]["data"]["reason"] == "container_exited"
    assert set(server.all_backends) == {second}
    assert [r["id"] for r in to_client(answer(server, clock, second, request_2))] == [2]


def test_shutdown_answers_every_per_call_call_and_the_clients_leaving_stops_every_container() -> (
    None
):
    server, clock = per_call_session()
    keys = [started_keys(call(server, clock, i))[0] for i in (1, 2)]
    ready(server, clock, keys[0])
    twin = server.clone()
    errors = to_client(fed(server, clock, Shutdown(ORCHESTRATOR_STOPPING)))
    assert {e["id"] for e in errors} == {1, 2}
    assert {e["error"]["data"]["reason"] for e in errors} == {ORCHESTRATOR_STOPPING}
    actions = fed(twin, clock, ClientGone())
    assert sorted(stopped(actions)) == [(k, SESSION_ENDED) for k in keys]


def test_one_call_past_the_per_call_bound_is_refused_and_one_ending_makes_room() -> None:
    server, clock = per_call_session()
    keys = [started_keys(call(server, clock, i))[0] for i in range(MAX_PER_CALL_CONTAINERS)]
    actions = call(server, clock, "over")
    assert started_keys(actions) == []
    [refusal] = to_client(actions)
    assert refusal["id"] == "over"
    assert refusal["error"]["code"] == -32600
    assert refusal["error"]["data"]["reason"] == TOO_MANY_PER_CALL_CONTAINERS
    [_, request] = ready(server, clock, keys[0])
    answer(server, clock, keys[0], request)
    assert len(started_keys(call(server, clock, "now"))) == 1


def test_a_per_call_container_asking_the_client_is_kept_until_the_client_answers() -> None:
    server, clock = per_call_session(client_capabilities={"sampling": {}})
    [key] = started_keys(call(server, clock, 1))
    [_, request] = ready(server, clock, key)
    ask = msg(id="s1", method="sampling/createMessage", params={"messages": [], "maxTokens": 1})
    [asked] = to_client(fed(server, clock, BackendLine(key, ask)))
    # The call is answered while its question waits: the container stays for the answer.
    assert stopped(answer(server, clock, key, request)) == []
    reply = msg(id=asked["id"], result={"role": "assistant", "content": {}, "model": "m"})
    assert stopped(fed(server, clock, ClientFrame(reply))) == [(key, CALL_DONE)]


def test_a_per_call_containers_list_changed_is_not_asked_again() -> None:
    server, clock = per_call_session()
    [key] = started_keys(call(server, clock, 1))
    ready(server, clock, key)
    changed = msg(method="notifications/tools/list_changed")
    assert sent(fed(server, clock, BackendLine(key, changed)), key) == []


def test_a_smart_refresh_container_is_replaced_between_calls_after_max_calls() -> None:
    server, clock = per_call_session(lifecycles={"time": Lifecycle("smart_refresh", max_calls=2)})
    [first] = started_keys(call(server, clock, 1))
    [_, request] = ready(server, clock, first)
    assert stopped(answer(server, clock, first, request)) == []
    # The second call reuses it, and once answered it goes: it served its two.
    actions = call(server, clock, 2)
    assert started_keys(actions) == []
    [request] = sent(actions, first)
    answered = answer(server, clock, first, request)
    assert [r["id"] for r in to_client(answered)] == [2]
    assert "error" not in to_client(answered)[0]
    assert stopped(answered) == [(first, REFRESH_CALLS)]
    # The third starts a fresh one, greeted by the machine; the client sees only its answer.
    [second] = started_keys(call(server, clock, 3))
    assert second != first
    [_, request] = ready(server, clock, second)
    assert [r["id"] for r in to_client(answer(server, clock, second, request))] == [3]


def test_a_smart_refresh_container_is_never_replaced_under_a_call_in_flight() -> None:
    server, clock = per_call_session(lifecycles={"time": Lifecycle("smart_refresh", max_calls=1)})
    [first] = started_keys(call(server, clock, 1))
    [_, request_1] = ready(server, clock, first)
    # The next call goes to a fresh container; the first is kept for its call in flight.
    actions = call(server, clock, 2)
    [second] = started_keys(actions)
    assert stopped(actions) == []
    assert sent(actions, first) == []
    answered = answer(server, clock, first, request_1)
    assert [r["id"] for r in to_client(answered)] == [1]
    assert stopped(answered) == [(first, REFRESH_CALLS)]
    [_, request_2] = ready(server, clock, second)
    assert request_2["params"]["arguments"] == {"n": 2}


def test_a_smart_refresh_container_older_than_max_age_is_replaced_at_the_next_call() -> None:
    server, clock = per_call_session(lifecycles={"time": Lifecycle("smart_refresh", max_age=60)})
    [first] = started_keys(call(server, clock, 1))
    [_, request] = ready(server, clock, first)
    answer(server, clock, first, request)
    clock.now += 59
    actions = call(server, clock, 2)
    assert started_keys(actions) == []  # younger than its age: reused
    [request] = sent(actions, first)
    answer(server, clock, first, request)
    clock.now += 1
    actions = call(server, clock, 3)
    [second] = started_keys(actions)
    assert stopped(actions) == [(first, REFRESH_AGE)]
    assert second != first


def test_a_reused_service_keeps_one_container_for_every_call() -> None:
    server, clock = per_call_session(lifecycles={})
    [key] = started_keys(call(server, clock, 1))
    [_, request] = ready(server, clock, key)
    assert stopped(answer(server, clock, key, request)) == []
    actions = call(server, clock, 2)
    assert started_keys(actions) == []
    assert [r["method"] for r in sent(actions, key)] == ["tools/call"]


# --- smart_refresh by memory and by age, between calls -------------------------------------------

MEMORY = {"time": Lifecycle("smart_refresh", memory_threshold=1000)}


def due(server: FabricServer) -> float | None:
    return server.deadline


def measured(actions: list[Action]) -> list[BackendKey]:
    return [a.key for a in actions if isinstance(a, MeasureBackend)]


def test_a_smart_refresh_container_is_measured_after_each_call_never_under_one_in_flight() -> None:
    server, clock = per_call_session(lifecycles=MEMORY)
    actions = call(server, clock, 1)
    [first] = started_keys(actions)
    assert measured(actions) == []
    handshake = sent(fed(server, clock, BackendStarted(first)), first)
    ack = msg(id=handshake[0]["id"], result={"capabilities": {}, "serverInfo": {}})
    actions = fed(server, clock, BackendLine(first, ack))
    [_initialized, request] = sent(actions, first)
    assert measured(actions) == []  # its call is in flight
    answered = answer(server, clock, first, request)
    # Answered first, then measured: the figure never holds an answer back.
    assert measured(answered) == [first]
    assert isinstance(answered[0], ToClient)
    assert fed(server, clock, BackendMeasured(first, 999)) == []
    # Not measured again before another call could have grown it.
    assert measured(fed(server, clock, Tick())) == []
    [request] = sent(call(server, clock, 2), first)
    assert measured(answer(server, clock, first, request)) == [first]


def test_a_smart_refresh_container_over_its_memory_threshold_is_replaced_before_the_next_call() -> (
    None
):
    server, clock = per_call_session(lifecycles=MEMORY)
    first, answered = one_call(server, clock, 1)
    assert measured(answered) == [first]
    # Over, with nothing in flight: removed at once, and says why.
    actions = fed(server, clock, BackendMeasured(first, 1001))
    assert stopped(actions) == [(first, REFRESH_MEMORY)]
    assert [a.graceful for a in actions if isinstance(a, StopBackend)] == [True]
    [log] = [a for a in actions if isinstance(a, Log)]
    assert log.event == "container_refreshed"
    assert log.fields["memory"] == 1001
    assert log.fields["threshold"] == 1000
    assert not [a for a in actions if isinstance(a, Log) and a.event == "backend_failed"]
    # The next call is served by a fresh container, greeted by the machine; no error.
    actions = call(server, clock, 2)
    [second] = started_keys(actions)
    assert second != first
    [start] = [a for a in actions if isinstance(a, StartBackend)]
    assert start.respawn is True
    [_initialized, request] = ready(server, clock, second)
    [reply] = to_client(answer(server, clock, second, request))
    assert reply["id"] == 2
    assert "error" not in reply


def test_a_call_sent_while_its_container_is_measured_waits_for_the_figure() -> None:
    server, clock = per_call_session(lifecycles=MEMORY)
    first, _ = one_call(server, clock, 1)
    twin = server.clone()
    # Under: the call that waited goes to the container it was meant for.
    actions = call(server, clock, 2)
    assert sent(actions, first) == []
    assert started_keys(actions) == []
    actions = fed(server, clock, BackendMeasured(first, 10))
    [request] = sent(actions, first)
    assert request["params"]["arguments"] == {"n": 2}
    assert stopped(actions) == []
    # Over: it goes to a fresh container instead, the measured one is removed, and the client
    # sees its answer only; the audit record names the container that served it.
    actions = call(twin, clock, 2)
    actions = fed(twin, clock, BackendMeasured(first, 5000))
    [second] = started_keys(actions)
    assert sent(actions, first) == []
    assert stopped(actions) == [(first, REFRESH_MEMORY)]
    [_initialized, request] = ready(twin, clock, second)
    assert request["params"]["arguments"] == {"n": 2}
    answered = answer(twin, clock, second, request)
    [reply] = to_client(answered)
    assert reply["id"] == 2
    assert reply["result"]["content"][0]["text"] == f"from {second.seq}"
    [done] = [a for a in answered if isinstance(a, ToolCallDone)]
    assert done.seq == second.seq


def test_a_call_cancelled_while_its_container_is_measured_is_never_sent() -> None:
    server, clock = per_call_session(lifecycles=MEMORY)
    first, _ = one_call(server, clock, 1)
    call(server, clock, 2)
    cancel = msg(method="notifications/cancelled", params={"requestId": 2})
    fed(server, clock, ClientFrame(cancel))
    actions = fed(server, clock, BackendMeasured(first, 5000))
    assert started_keys(actions) == []  # nothing waits for a fresh one
    assert stopped(actions) == [(first, REFRESH_MEMORY)]
    assert to_client(actions) == []


def test_a_smart_refresh_container_of_unknown_memory_is_kept_and_the_log_says_so() -> None:
    server, clock = per_call_session(lifecycles=MEMORY)
    first, _ = one_call(server, clock, 1)
    actions = fed(server, clock, BackendMeasured(first, None))
    assert stopped(actions) == []
    [log] = [a for a in actions if isinstance(a, Log)]
    assert log.event == "container_memory_unknown"
    assert log.fields == {"backend": "time", "sequence": first.seq}
    # Kept, and measured again after its next call.
    actions = call(server, clock, 2)
    assert started_keys(actions) == []
    [request] = sent(actions, first)
    assert measured(answer(server, clock, first, request)) == [first]


def test_a_figure_for_a_container_stopped_meanwhile_changes_nothing() -> None:
    server, clock = per_call_session(lifecycles=MEMORY)
    first, _ = one_call(server, clock, 1)
    fed(server, clock, BackendExited(first, 1))
    assert fed(server, clock, BackendMeasured(first, 5000)) == []
    assert server.all_backends == {}


def test_an_idle_smart_refresh_container_is_retired_when_it_reaches_its_age() -> None:
    lifecycles = {"time": Lifecycle("smart_refresh", max_age=60)}
    server, clock = per_call_session(lifecycles=lifecycles)
    started_at = clock.now
    first, answered = one_call(server, clock, 1)
    assert stopped(answered) == []
    # Its age is a deadline of the machine's, as the relay's: not the next event's business.
    assert server.deadline == started_at + 60
    clock.now = started_at + 60
    actions = fed(server, clock, Tick())
    assert stopped(actions) == [(first, REFRESH_AGE)]
    assert server.backends == {}
    assert due(server) is None
    [second] = started_keys(call(server, clock, 2))
    assert second != first


def test_a_smart_refresh_container_reaching_its_age_under_a_call_finishes_it_first() -> None:
    lifecycles = {"time": Lifecycle("smart_refresh", max_age=60)}
    server, clock = per_call_session(lifecycles=lifecycles)
    started_at = clock.now
    [first] = started_keys(call(server, clock, 1))
    [_initialized, request] = ready(server, clock, first)
    assert server.deadline is None  # a call in flight: no age deadline (nothing else due)
    clock.now = started_at + 61
    answered = answer(server, clock, first, request)
    [reply] = to_client(answered)
    assert reply["id"] == 1
    assert stopped(answered) == [(first, REFRESH_AGE)]


# --- which container served which call (get_status; /api/sessions shows the same) ------------


def status_of(server: FabricServer, clock: Clock, request_id: object) -> dict[str, Any]:
    msg_ = msg(id=request_id, method="tools/call", params={"name": "get_status", "arguments": {}})
    [status] = to_client(fed(server, clock, ClientFrame(msg_)))
    result: dict[str, Any] = status["result"]["structuredContent"]
    return result


def served_call(
    server: FabricServer, clock: Clock, request_id: object, *, name: str | None = None
) -> tuple[BackendKey | None, list[Action]]:
    """A call answered by its backend: a fresh one (named ``rf-time-SEQ``, started a second
    after it was asked for) when it starts one, the current one otherwise."""
    actions = call(server, clock, request_id)
    keys = started_keys(actions)
    if keys:
        [key] = keys
        clock.now += 1
        started = fed(server, clock, BackendStarted(key, container=f"rf-time-{key.seq}"))
        [handshake] = sent(started, key)
        reply = msg(id=handshake["id"], result={"capabilities": {}, "serverInfo": {}})
        [_initialized, request] = sent(fed(server, clock, BackendLine(key, reply)), key)
    else:
        [key] = [backend.key for backend in server.backends.values()]
        [request] = sent(actions, key)
    clock.now += 1
    return key, answer(server, clock, key, request)


def test_get_status_shows_five_containers_for_five_per_call_calls_each_with_its_call() -> None:
    server, clock = per_call_session()
    for request_id in range(1, 6):
        served_call(server, clock, request_id)
    shown = status_of(server, clock, 99)["recent_containers"]
    assert [(c["sequence"], c["container"]) for c in shown] == [
        (seq, f"rf-time-{seq}") for seq in range(1, 6)
    ]
    for request_id, container in enumerate(shown, start=1):
        assert container["server"] == "time"
        assert container["lifecycle"] == "fresh_per_call"
        assert (container["state"], container["stop_reason"]) == ("ended", CALL_DONE)
        assert container["calls"] == 1
        assert container["recent_calls"] == [
            {"id": request_id, "method": "tools/call", "name": "get_current_time"}
        ]
        # Asked for, started a second later, ended once its call was answered a second after.
        assert container["ended"] - container["started"] == 1.0


def test_get_status_shows_a_per_call_container_running_while_its_call_is_in_flight() -> None:
    server, clock = per_call_session()
    [key] = started_keys(call(server, clock, "a"))
    [starting] = status_of(server, clock, 98)["recent_containers"]
    assert (starting["state"], starting["container"], starting["started"]) == (
        "starting",
        None,
        None,
    )
    fed(server, clock, BackendStarted(key, container="rf-time-pool-x-3"))
    [running] = status_of(server, clock, 99)["recent_containers"]
    assert (running["state"], running["container"]) == ("running", "rf-time-pool-x-3")
    assert running["recent_calls"] == [
        {"id": "a", "method": "tools/call", "name": "get_current_time"}
    ]


def test_get_status_shows_which_calls_each_smart_refresh_container_took_before_its_refresh() -> (
    None
):
    server, clock = per_call_session(lifecycles={"time": Lifecycle("smart_refresh", max_calls=2)})
    for request_id in (1, 2, 3):
        served_call(server, clock, request_id)
    first, second = status_of(server, clock, 99)["recent_containers"]
    assert (first["state"], first["stop_reason"], first["calls"]) == ("ended", REFRESH_CALLS, 2)
    assert [c["id"] for c in first["recent_calls"]] == [1, 2]
    assert (second["state"], second["stop_reason"], second["calls"]) == ("running", None, 1)
    assert [c["id"] for c in second["recent_calls"]] == [3]
    assert second["lifecycle"] == "smart_refresh"


def test_what_get_status_keeps_of_past_containers_and_calls_is_bounded() -> None:
    server, clock = per_call_session()
    for request_id in range(MAX_ENDED + 10):
        served_call(server, clock, request_id)
    shown = status_of(server, clock, "s")["recent_containers"]
    assert [c["sequence"] for c in shown] == list(range(11, MAX_ENDED + 11))  # the newest
    # A reused container keeps its newest calls only, and counts them all; a long id is cut.
    server, clock = per_call_session(lifecycles={})
    for request_id in range(MAX_CALLS_EACH + 5):
        served_call(server, clock, request_id)
    served_call(server, clock, "x" * 10_000)
    [container] = status_of(server, clock, "s")["recent_containers"]
    assert container["calls"] == MAX_CALLS_EACH + 6
    ids = [c["id"] for c in container["recent_calls"]]
    assert ids == [*range(6, MAX_CALLS_EACH + 5), "x" * MAX_ID_CHARS]


def test_a_per_call_container_that_failed_to_start_is_shown_ended_with_why() -> None:
    server, clock = per_call_session()
    [key] = started_keys(call(server, clock, 1))
    failure = ContainerStartFailure("no such image", reason="start_failed")
    fed(server, clock, BackendStartFailed(key, failure))
    [container] = status_of(server, clock, 2)["recent_containers"]
    assert (container["state"], container["stop_reason"]) == ("ended", "start_failed")
