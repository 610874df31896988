"""The warm pool's greeting of a per-call service's pooled container (pure): what it sends,
and what it makes of every answer — the answer, an error, garbage, too much, nothing."""

from __future__ import annotations

import json

import msgspec
import pytest

from reactor_fabric.protocol.events import BackendStarted
from reactor_fabric.protocol.mcp import CLIENT_VERSION
from reactor_fabric.protocol.pool_greeting import (
    GREETING_ID,
    INITIALIZED,
    MAX_GREETING_BYTES,
    Greeted,
    Greeting,
    GreetingFailed,
    initialize_request,
)
from tests.unit.protocol.test_fabric_lifecycles import (
    call,
    fed,
    per_call_session,
    sent,
    started_keys,
)

RESULT = {"protocolVersion": CLIENT_VERSION, "capabilities": {"tools": {}}, "serverInfo": {}}


def line(message: object) -> bytes:
    return json.dumps(message).encode() + b"\n"


ANSWER = line({"jsonrpc": "2.0", "id": GREETING_ID, "result": RESULT})


def test_the_greeting_is_the_routers_initialize_offering_roots_sampling_and_elicitation() -> None:
    request = json.loads(initialize_request("9.9"))
    assert initialize_request("9.9").endswith(b"\n")
    assert request["method"] == "initialize"
    params = request["params"]
    assert params["protocolVersion"] == CLIENT_VERSION
    assert set(params["capabilities"]) == {"roots", "sampling", "elicitation"}
    # The same client, version and protocol as the fabric router's own handshake.
    server, clock = per_call_session()
    [key] = started_keys(call(server, clock, 1))
    [own] = sent(fed(server, clock, BackendStarted(key)), key)
    assert own["params"]["clientInfo"] == {**params["clientInfo"], "version": "9"}
    assert own["params"]["protocolVersion"] == params["protocolVersion"]
    assert json.loads(INITIALIZED) == {"jsonrpc": "2.0", "method": "notifications/initialized"}


def test_an_answer_gives_its_result_and_what_follows_it_stays_for_the_session() -> None:
    greeting = Greeting()
    log = line({"jsonrpc": "2.0", "method": "notifications/message", "params": {}})
    data = log + b"\n" + ANSWER + b'{"jsonrpc":"2.0","method":"late"}\n'
    # In pieces, as a pipe gives it.
    outcome = None
    start = 0
    while outcome is None:
        outcome = greeting.feed(data[start : start + 7])
        start += 7
    rest = data[start:]
    assert isinstance(outcome, Greeted)
    assert msgspec.json.decode(outcome.result) == RESULT
    assert outcome.rest + rest == b'{"jsonrpc":"2.0","method":"late"}\n'


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (
            line({"jsonrpc": "2.0", "id": GREETING_ID, "error": {"code": -1, "message": "no"}}),
            "greeting_refused",
        ),
        (b"Starting server...\n", "greeting_invalid"),
        (b"[1, 2]\n", "greeting_invalid"),
        (line({"jsonrpc": "2.0", "id": 7, "result": RESULT}), "greeting_invalid"),
        (line({"jsonrpc": "2.0", "id": GREETING_ID, "result": [1]}), "greeting_invalid"),
        (line({"jsonrpc": "2.0", "id": GREETING_ID}), "greeting_invalid"),
        (line({"jsonrpc": "2.0", "id": 1, "method": "roots/list"}), "greeting_invalid"),
        (b"x" * (MAX_GREETING_BYTES + 1), "greeting_too_large"),
    ],
)
def test_anything_but_an_answer_with_a_result_fails_the_greeting(data: bytes, reason: str) -> None:
    outcome = Greeting().feed(data)
    assert isinstance(outcome, GreetingFailed)
    assert outcome.reason == reason


def test_notifications_before_the_answer_count_towards_the_bound() -> None:
    greeting = Greeting()
    log = line({"jsonrpc": "2.0", "method": "notifications/message", "params": {"d": "x" * 900}})
    outcome = None
    fed = 0
    while outcome is None:
        outcome = greeting.feed(log)
        fed += len(log)
    assert isinstance(outcome, GreetingFailed)
    assert outcome.reason == "greeting_too_large"
    assert fed <= MAX_GREETING_BYTES + len(log)
    # An answer that ends past the bound is too large as well.
    late = Greeting()
    assert late.feed(b" " * (MAX_GREETING_BYTES - len(ANSWER) + 1)) is None
    failed = late.feed(ANSWER)
    assert isinstance(failed, GreetingFailed)
    assert failed.reason == "greeting_too_large"
    # ...and one that ends on it is not.
    exact = Greeting()
    assert exact.feed(b" " * (MAX_GREETING_BYTES - len(ANSWER))) is None
    assert isinstance(exact.feed(ANSWER), Greeted)


def test_no_answer_in_time_or_an_output_that_ends_fails_the_greeting() -> None:
    assert Greeting.expired().reason == "greeting_timeout"
    assert Greeting.ended().reason == "greeting_exited"
    greeting = Greeting()
    assert greeting.feed(ANSWER[:-1]) is None  # an answer not ended yet: nothing decided
