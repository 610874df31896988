from __future__ import annotations

import json

import pytest

from reactor_fabric import InvalidRequest
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.protocol.handshake import (
    ForwardFirst,
    RegisterClient,
    classify_first_message,
    register_answer,
)

MOUNTS = [{"source": "/home/a", "target": "/w"}]


def test_register_client_as_a_method_is_recognised() -> None:
    frame = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "fabric/registerClient", "params": {"mounts": MOUNTS}}
    ).encode()
    assert classify_first_message(frame) == RegisterClient(1, "method", MOUNTS)


def test_register_client_as_a_tool_call_is_recognised() -> None:
    frame = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": "r",
            "method": "tools/call",
            "params": {"name": "fabric/registerClient", "arguments": {"mounts": MOUNTS}},
        }
    ).encode()
    assert classify_first_message(frame) == RegisterClient("r", "tool", MOUNTS)


@pytest.mark.parametrize("method", ["initialize", "server/discover", "tools/list"])
def test_other_first_messages_are_forwarded(method: str) -> None:
    frame = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method}).encode()
    decision = classify_first_message(frame)
    assert isinstance(decision, ForwardFirst)
    assert decision.peek.method == method


def test_a_tool_call_of_another_tool_is_forwarded() -> None:
    frame = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "git_log"}}
    ).encode()
    assert isinstance(classify_first_message(frame), ForwardFirst)


def test_register_client_as_a_notification_is_refused() -> None:
    frame = json.dumps(
        {"jsonrpc": "2.0", "method": "fabric/registerClient", "params": {"mounts": []}}
    ).encode()
    with pytest.raises(InvalidRequest) as caught:
        classify_first_message(frame)
    assert caught.value.reason == "register_without_id"


def test_the_answer_matches_the_form_of_the_request() -> None:
    mounts = (MountSpec("/home/a", "/w", True),)
    as_method = json.loads(register_answer(RegisterClient(1, "method", []), "sid", mounts))
    assert as_method["result"] == {
        "sessionId": "sid",
        "mounts": [{"source": "/home/a", "target": "/w", "readOnly": True}],
    }
    as_tool = json.loads(register_answer(RegisterClient(2, "tool", []), "sid", mounts))
    assert as_tool["result"]["structuredContent"] == as_method["result"]
    assert as_tool["result"]["content"][0]["type"] == "text"
