"""The scripted Messages API stand-in (tests/messages_api.py) answers as the API does: each
request gets the next step, streamed as the API's events when asked, and what it cannot answer
is refused in words rather than served wrong."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests import messages_api
from tests.messages_api import Hold, Step, Text, ToolUse, scripted_messages_api

CLOCK = {"name": "clock", "input_schema": {"type": "object"}}


def post(url: str, body: dict[str, Any], path: str = "/v1/messages?beta=true") -> Any:
    """The answer's body: its JSON, or its server-sent events as (name, data) pairs."""
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
        if answer.headers["Content-Type"] != "text/event-stream":
            return json.loads(text)
    events = []
    for chunk in text.split("\n\n"):
        if chunk:
            name, data = chunk.split("\n")
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def refusal(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    with pytest.raises(urllib.error.HTTPError) as raised:
        post(url, body)
    with raised.value:
        error: dict[str, Any] = json.loads(raised.value.read())
    return raised.value.code, error


def test_each_request_gets_the_next_step_streamed_as_the_api_streams_it() -> None:
    script: list[Step] = [[Text("Looking."), ToolUse("clock", {"zone": "UTC"})], [Text("Done.")]]
    with scripted_messages_api(script) as api:
        first = post(api.url, {"model": "m", "stream": True, "tools": [CLOCK]})
        second = post(api.url, {"model": "m", "tools": [CLOCK]})
    assert [name for name, _ in first] == [
        "message_start",
        *["content_block_start", "content_block_delta", "content_block_stop"] * 2,
        "message_delta",
        "message_stop",
    ]
    data = [d for _, d in first]
    assert data[0]["message"]["content"] == []
    assert data[1]["content_block"] == {"type": "text", "text": ""}
    assert data[2]["delta"] == {"type": "text_delta", "text": "Looking."}
    assert data[4]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_rf_1",
        "name": "clock",
        "input": {},
    }
    assert data[5]["delta"] == {"type": "input_json_delta", "partial_json": '{"zone": "UTC"}'}
    assert data[7]["delta"]["stop_reason"] == "tool_use"
    assert second["content"] == [{"type": "text", "text": "Done."}]
    assert second["stop_reason"] == "end_turn"
    assert second["model"] == "m"


def test_a_step_may_answer_from_the_request_and_the_tool_results_are_collected() -> None:
    def echo(request: dict[str, Any]) -> list[Text]:
        return [Text(str(api.tool_results()))]

    script: list[Step] = [[ToolUse("clock")], echo]
    with scripted_messages_api(script) as api:
        post(api.url, {"tools": [CLOCK], "messages": [{"role": "user", "content": "time?"}]})
        result = {"type": "tool_result", "tool_use_id": "toolu_rf_1", "content": "12:00"}
        messages = [{"role": "user", "content": [result]}]
        answer = post(api.url, {"tools": [CLOCK], "messages": messages})
    assert answer["content"] == [{"type": "text", "text": "{'toolu_rf_1': '12:00'}"}]


def test_a_held_step_answers_once_released_and_the_next_request_is_served_meanwhile() -> None:
    released = threading.Event()
    answers: list[Any] = []
    script: list[Step] = [Hold(released, [Text("slow")]), [Text("quick")]]
    with scripted_messages_api(script) as api:
        held = threading.Thread(target=lambda: answers.append(post(api.url, {"model": "m"})))
        held.start()
        # The held step is taken when its request comes: the next request gets the next step.
        while api.steps_served < 1:
            held.join(0.01)
        answers.append(post(api.url, {"model": "m"}))
        released.set()
        held.join(10)
    assert [a["content"][0]["text"] for a in answers] == ["quick", "slow"]
    assert answers[1]["id"] == "msg_rf_1"


def test_each_message_has_its_own_id_unless_one_id_is_given_for_all_as_a_gateway_may() -> None:
    script: list[Step] = [[Text("one")], [Text("two")]]
    with scripted_messages_api(script) as api:
        own = [post(api.url, {})["id"] for _ in script]
    with scripted_messages_api(script, message_id="msg_gateway") as api:
        streamed = post(api.url, {"stream": True})
        plain = post(api.url, {})
    assert own == ["msg_rf_1", "msg_rf_2"]
    assert [streamed[0][1]["message"]["id"], plain["id"]] == ["msg_gateway", "msg_gateway"]


def test_a_tool_the_request_does_not_offer_is_refused_with_the_tools_it_offers() -> None:
    with scripted_messages_api([[ToolUse("clock")], [Text("after")]]) as api:
        status, error = refusal(api.url, {"tools": [{"name": "ToolSearch"}]})
        assert status == 400
        assert error["error"]["type"] == "invalid_request_error"
        assert "'clock', which the request does not offer" in error["error"]["message"]
        assert "['ToolSearch']" in error["error"]["message"]
        assert api.refusals == [error["error"]["message"]]
        # The step was not consumed: offered, it is served.
        answer = post(api.url, {"tools": [CLOCK]})
        assert answer["content"][0]["name"] == "clock"


def test_a_request_after_the_last_step_is_refused_as_the_script_exhausted() -> None:
    with scripted_messages_api([[Text("only")]]) as api:
        post(api.url, {})
        status, error = refusal(api.url, {})
    assert status == 400
    assert error["error"]["message"] == "the script is exhausted: all 1 steps were served"


def test_count_tokens_is_answered_and_other_paths_are_not_found_but_recorded() -> None:
    with scripted_messages_api([]) as api:
        counted = post(api.url, {"x": "y" * 400}, "/v1/messages/count_tokens")
        with pytest.raises(urllib.error.HTTPError) as raised:
            post(api.url, {}, "/v1/models")
        raised.value.close()
        assert raised.value.code == 404
        assert [(r.method, r.path) for r in api.received] == [
            ("POST", "/v1/messages/count_tokens"),
            ("POST", "/v1/models"),
        ]
    assert counted["input_tokens"] > 1


def test_a_body_over_the_bound_is_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages_api, "MAX_BODY", 100)
    with scripted_messages_api([[Text("never")]]) as api:
        status, error = refusal(api.url, {"x": "y" * 200})
        assert api.received == []
        assert api.steps_served == 0
    assert status == 413
    assert error["error"]["type"] == "request_too_large"
