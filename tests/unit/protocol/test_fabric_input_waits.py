"""A backend's question to a 2026-07-28 client, event by event (pure): the client's call is
answered ``input_required``, waits in its container, and goes on when the client retries it
with the answer — whatever the service's lifecycle."""

from __future__ import annotations

import json
import math
from typing import Any

from reactor_fabric._reasons import (
    CALL_DONE,
    CLIENT_DID_NOT_ANSWER,
    INPUT_WAIT_EXPIRED,
    INPUT_WAIT_OVER,
    REFRESH_CALLS,
)
from reactor_fabric.protocol.answers import MAX_SERVER_REQUESTS
from reactor_fabric.protocol.events import (
    Action,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendStarted,
    ClientFrame,
    StartBackend,
    StopBackend,
    Tick,
    ToBackend,
)
from reactor_fabric.protocol.fabric_server import FabricServer, Lifecycle
from reactor_fabric.protocol.input_waits import INPUT_WAIT_SECONDS
from reactor_fabric.protocol.tool_calls import ToolCallDone
from tests.settings import fabric_server
from tests.unit.protocol.test_fabric_server import CATALOG, CLOCKS, Clock, msg, to_client

PER_CALL = {"time": Lifecycle("fresh_per_call")}
ELICIT = {"message": "Which zone?", "requestedSchema": {"type": "object", "properties": {}}}
ACCEPTED = {"action": "accept", "content": {"zone": "UTC"}}


def envelope(*capabilities: str) -> dict[str, Any]:
    """The 2026-07-28 envelope a stateless client puts in every request's _meta."""
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {c: {} for c in capabilities},
    }


def stateless(lifecycles: dict[str, Lifecycle] | None = None) -> tuple[FabricServer, Clock]:
    """A 2026-07-28 client's session: it never sends initialize."""
    clock = Clock()
    server = fabric_server(
        CATALOG,
        session_id="s1",
        version="9",
        now=clock.now,
        exposure="all",
        lifecycles=PER_CALL if lifecycles is None else lifecycles,
        # (writes to backends are not reported here, as the driver would: no stall rule)
        stall_timeout=math.inf,
    )
    CLOCKS[server] = clock
    return server, clock


def fed(server: FabricServer, clock: Clock, event: Any) -> list[Action]:
    return server.handle(event, clock.now)


def call(
    server: FabricServer, clock: Clock, request_id: object, *offers: str, **extra: Any
) -> list[Action]:
    params = {
        "name": "time__get_current_time",
        "arguments": {},
        "_meta": envelope(*offers),
        **extra,
    }
    return fed(server, clock, ClientFrame(msg(id=request_id, method="tools/call", params=params)))


def sent(actions: list[Action], key: BackendKey) -> list[dict[str, Any]]:
    return [json.loads(a.data) for a in actions if isinstance(a, ToBackend) and a.key == key]


def stopped(actions: list[Action]) -> list[tuple[BackendKey, str]]:
    return [(a.key, a.reason) for a in actions if isinstance(a, StopBackend)]


def started(server: FabricServer, clock: Clock, actions: list[Action]) -> tuple[BackendKey, int]:
    """The backend a call started, greeted by the machine: its key and the call's id there."""
    [key] = [a.key for a in actions if isinstance(a, StartBackend)]
    [handshake] = sent(fed(server, clock, BackendStarted(key)), key)
    answer = msg(id=handshake["id"], result={"capabilities": {}, "serverInfo": {}})
    [_initialized, request] = sent(fed(server, clock, BackendLine(key, answer)), key)
    return key, request["id"]


def asks(
    server: FabricServer, clock: Clock, key: BackendKey, backend_id: object, **params: Any
) -> list[Action]:
    question = msg(id=backend_id, method="elicitation/create", params=params or ELICIT)
    return fed(server, clock, BackendLine(key, question))


def retry(
    server: FabricServer, clock: Clock, request_id: object, state: object, responses: Any
) -> list[Action]:
    extra = {"requestState": state, "inputResponses": responses}
    return call(server, clock, request_id, "elicitation", **extra)


def answers(
    server: FabricServer, clock: Clock, key: BackendKey, call_id: int, text: str = "12:00"
) -> list[Action]:
    result = {"content": [{"type": "text", "text": text}]}
    return fed(server, clock, BackendLine(key, msg(id=call_id, result=result)))


def test_a_per_call_containers_question_becomes_input_required_and_the_retry_reaches_it() -> None:
    server, clock = stateless()
    key, call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    asked = asks(server, clock, key, "b-7")
    [reply] = to_client(asked)
    assert reply["id"] == 1
    result = reply["result"]
    assert result["resultType"] == "input_required"
    assert result["inputRequests"] == {"q1": {"method": "elicitation/create", "params": ELICIT}}
    assert isinstance(result["requestState"], str)
    # The call waits in its container: nothing is stopped, the call's record says so.
    assert stopped(asked) == []
    [done] = [a.call for a in asked if isinstance(a, ToolCallDone)]
    assert done.outcome == "input_required"

    resumed = retry(server, clock, 2, result["requestState"], {"q1": ACCEPTED})
    # The answer goes to the same container, under the id it asked with.
    assert sent(resumed, key) == [{"jsonrpc": "2.0", "id": "b-7", "result": ACCEPTED}]
    assert to_client(resumed) == []
    finished = answers(server, clock, key, call_id)
    [final] = to_client(finished)
    assert final["id"] == 2
    assert final["result"]["resultType"] == "complete"
    assert final["result"]["content"] == [{"type": "text", "text": "12:00"}]
    [record] = [a.call for a in finished if isinstance(a, ToolCallDone)]
    assert record.outcome == "ok"
    assert record.seq == key.seq  # the retry's record names the container that served it
    # Then, its call over, the per-call container goes.
    assert stopped(finished) == [(key, CALL_DONE)]
    assert server.all_backends == {}


def test_a_backend_greeted_for_a_stateless_client_is_told_it_may_ask() -> None:
    server, clock = stateless(lifecycles={})
    [key] = [a.key for a in call(server, clock, 1, "elicitation") if isinstance(a, StartBackend)]
    [handshake] = sent(fed(server, clock, BackendStarted(key)), key)
    capabilities = handshake["params"]["capabilities"]
    assert "elicitation" in capabilities
    assert "sampling" in capabilities


def test_a_call_whose_client_did_not_offer_elicitation_gets_the_question_refused() -> None:
    server, clock = stateless()
    key, _call_id = started(server, clock, call(server, clock, 1, "sampling"))
    asked = asks(server, clock, key, 5)
    assert to_client(asked) == []
    [refusal] = sent(asked, key)
    assert refusal["id"] == 5
    assert refusal["error"]["code"] == -32601
    assert "does not offer elicitation/create" in refusal["error"]["message"]


def test_a_wait_not_resumed_in_time_removes_the_per_call_container_and_a_late_retry_says_so() -> (
    None
):
    server, clock = stateless()
    key, _call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    [reply] = to_client(asks(server, clock, key, 5))
    state = reply["result"]["requestState"]
    assert server.deadline == clock.now + INPUT_WAIT_SECONDS
    clock.now += INPUT_WAIT_SECONDS
    expired = fed(server, clock, Tick())
    assert stopped(expired) == [(key, INPUT_WAIT_EXPIRED)]
    assert server.all_backends == {}
    [late] = to_client(retry(server, clock, 2, state, {"q1": ACCEPTED}))
    assert late["error"]["code"] == -32600
    assert late["error"]["data"]["reason"] == INPUT_WAIT_OVER
    assert f"did not retry within {INPUT_WAIT_SECONDS:g} s" in late["error"]["message"]


def test_a_request_state_is_good_for_one_retry() -> None:
    server, clock = stateless()
    key, _call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    [reply] = to_client(asks(server, clock, key, 5))
    state = reply["result"]["requestState"]
    assert sent(retry(server, clock, 2, state, {"q1": ACCEPTED}), key)
    [again] = to_client(retry(server, clock, 3, state, {"q1": ACCEPTED}))
    assert again["error"]["data"]["reason"] == INPUT_WAIT_OVER
    assert "good for one retry" in again["error"]["message"]


def test_an_unknown_request_state_resumes_nothing() -> None:
    server, clock = stateless()
    [reply] = to_client(retry(server, clock, 1, "rf-forged", {"q1": ACCEPTED}))
    assert reply["error"]["data"]["reason"] == INPUT_WAIT_OVER
    assert server.all_backends == {}  # nothing was started for it


def test_a_retry_that_names_another_tool_is_refused_and_the_call_still_waits() -> None:
    server, clock = stateless()
    key, call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    [reply] = to_client(asks(server, clock, key, 5))
    state = reply["result"]["requestState"]
    params = {
        "name": "time__convert_time",
        "arguments": {},
        "_meta": envelope("elicitation"),
        "requestState": state,
        "inputResponses": {"q1": ACCEPTED},
    }
    wrong = fed(server, clock, ClientFrame(msg(id=2, method="tools/call", params=params)))
    [refused] = to_client(wrong)
    assert refused["error"]["code"] == -32602
    assert sent(wrong, key) == []
    resumed = retry(server, clock, 3, state, {"q1": ACCEPTED})
    assert sent(resumed, key) == [{"jsonrpc": "2.0", "id": 5, "result": ACCEPTED}]
    [final] = to_client(answers(server, clock, key, call_id))
    assert final["id"] == 3


def test_an_answer_that_came_while_the_call_waited_is_the_retrys_answer() -> None:
    server, clock = stateless()
    key, call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    [reply] = to_client(asks(server, clock, key, 5))
    # The server gave up asking and answered the call meanwhile: kept for the retry.
    assert to_client(answers(server, clock, key, call_id, text="no zone")) == []
    resumed = retry(server, clock, 2, reply["result"]["requestState"], {"q1": ACCEPTED})
    [final] = [r for r in to_client(resumed) if r.get("id") == 2]
    assert final["result"]["content"] == [{"type": "text", "text": "no zone"}]
    assert stopped(resumed) == [(key, CALL_DONE)]


def test_a_question_asked_while_the_call_waited_comes_in_the_next_round() -> None:
    server, clock = stateless()
    key, call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    [first] = to_client(asks(server, clock, key, 5))
    assert to_client(asks(server, clock, key, 6, message="And the date?")) == []
    resumed = retry(server, clock, 2, first["result"]["requestState"], {"q1": ACCEPTED})
    assert sent(resumed, key) == [{"jsonrpc": "2.0", "id": 5, "result": ACCEPTED}]
    [second] = to_client(resumed)
    assert second["id"] == 2
    assert second["result"]["resultType"] == "input_required"
    assert list(second["result"]["inputRequests"]) == ["q2"]
    assert second["result"]["requestState"] != first["result"]["requestState"]
    resumed = retry(server, clock, 3, second["result"]["requestState"], {"q2": ACCEPTED})
    assert sent(resumed, key) == [{"jsonrpc": "2.0", "id": 6, "result": ACCEPTED}]
    [final] = to_client(answers(server, clock, key, call_id))
    assert final["id"] == 3


def test_a_question_left_unanswered_by_the_retry_is_asked_again() -> None:
    server, clock = stateless()
    key, _call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    [first] = to_client(asks(server, clock, key, 5))
    resumed = retry(server, clock, 2, first["result"]["requestState"], {"q9": ACCEPTED})
    assert sent(resumed, key) == []
    [again] = to_client(resumed)
    assert list(again["result"]["inputRequests"]) == ["q1"]


def test_a_container_that_ends_while_its_call_waits_tells_the_late_retry_why() -> None:
    server, clock = stateless()
    key, _call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    [reply] = to_client(asks(server, clock, key, 5))
    fed(server, clock, BackendExited(key, exit_code=137, oom_killed=False, stderr=()))
    [late] = to_client(retry(server, clock, 2, reply["result"]["requestState"], {}))
    assert late["error"]["data"]["reason"] == INPUT_WAIT_OVER
    assert "its container ended (container_exited)" in late["error"]["message"]


def test_a_shared_container_with_two_calls_in_flight_cannot_ask_a_stateless_client() -> None:
    server, clock = stateless(lifecycles={})
    key, _first = started(server, clock, call(server, clock, 1, "elicitation"))
    second = sent(call(server, clock, 2, "elicitation"), key)
    assert [r["method"] for r in second] == ["tools/call"]
    asked = asks(server, clock, key, 5)
    assert to_client(asked) == []
    [refusal] = sent(asked, key)
    assert refusal["error"]["code"] == -32601
    assert "2 calls in flight" in refusal["error"]["message"]


def test_a_shared_container_whose_call_is_not_resumed_in_time_is_told_and_serves_on() -> None:
    server, clock = stateless(lifecycles={})
    key, call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    to_client(asks(server, clock, key, 5))
    clock.now += INPUT_WAIT_SECONDS
    expired = fed(server, clock, Tick())
    assert stopped(expired) == []
    refusal, cancel = sent(expired, key)
    assert refusal["id"] == 5
    assert refusal["error"]["data"]["reason"] == CLIENT_DID_NOT_ANSWER
    assert cancel["method"] == "notifications/cancelled"
    assert cancel["params"]["requestId"] == call_id
    assert server.backends["time"].key == key
    assert [r["method"] for r in sent(call(server, clock, 2), key)] == ["tools/call"]


def test_a_retiring_container_is_not_removed_while_its_call_waits() -> None:
    server, clock = stateless(lifecycles={"time": Lifecycle("smart_refresh", max_calls=1)})
    key, call_id = started(server, clock, call(server, clock, 1, "elicitation"))
    [reply] = to_client(asks(server, clock, key, 5))
    # The next call retires it (one call each) and starts another: the waiting one stays.
    other = call(server, clock, 2)
    assert [a.key for a in other if isinstance(a, StartBackend)] != [key]
    assert stopped(other) == []
    assert key in server.all_backends
    resumed = retry(server, clock, 3, reply["result"]["requestState"], {"q1": ACCEPTED})
    assert sent(resumed, key) == [{"jsonrpc": "2.0", "id": 5, "result": ACCEPTED}]
    finished = answers(server, clock, key, call_id)
    assert [r["id"] for r in to_client(finished)] == [3]
    assert stopped(finished) == [(key, REFRESH_CALLS)]


def test_questions_of_waiting_calls_count_with_the_sessions_other_requests_to_the_client() -> None:
    server, clock = stateless()
    keys = []
    for request_id in range(1, 5):
        key, _call_id = started(server, clock, call(server, clock, request_id, "elicitation"))
        keys.append(key)
    for n in range(MAX_SERVER_REQUESTS):
        asks(server, clock, keys[0], f"b{n}")
    assert server.router.exchanges.waits.questions() == MAX_SERVER_REQUESTS
    [refusal] = sent(asks(server, clock, keys[1], "one-more"), keys[1])
    assert refusal["error"]["code"] == -32006
