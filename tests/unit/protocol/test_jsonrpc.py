from __future__ import annotations

import json

import pytest

from reactor_fabric import InvalidRequest, ParseError, ServiceNotFound
from reactor_fabric.protocol.jsonrpc import error_response, for_stdio, peek, with_id


@pytest.mark.parametrize(
    ("frame", "kind", "message_id", "method"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', "request", 1, "tools/list"),
        (b'{"jsonrpc":"2.0","id":"a","method":"x","params":{"big":[1,2,3]}}', "request", "a", "x"),
        (
            b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            "notification",
            None,
            "notifications/initialized",
        ),
        (b'{"jsonrpc":"2.0","id":7,"result":{}}', "response", 7, None),
        (b'{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}', "response", 7, None),
        (
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}',
            "response",
            None,
            None,
        ),
    ],
)
def test_peek_classifies_requests_notifications_and_responses(
    frame: bytes, kind: str, message_id: object, method: str | None
) -> None:
    message = peek(frame)
    assert (message.kind, message.id, message.method) == (kind, message_id, method)


@pytest.mark.parametrize(
    ("frame", "error", "reason"),
    [
        (b"{", ParseError, "invalid_json"),
        (b"", ParseError, "invalid_json"),
        (b"  [ {} ]", InvalidRequest, "batch_not_supported"),
        (b"42", InvalidRequest, "not_an_object"),
        (b'{"jsonrpc":"2.0","id":true,"method":"x"}', InvalidRequest, "invalid_id"),
        (b'{"jsonrpc":"2.0","id":null,"method":"x"}', InvalidRequest, "invalid_id"),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"x"}', InvalidRequest, "invalid_id"),
        (b'{"jsonrpc":"2.0","id":1,"method":""}', InvalidRequest, "invalid_method"),
        (b'{"jsonrpc":"2.0","id":1}', InvalidRequest, "not_jsonrpc"),
    ],
)
def test_peek_refuses_what_is_not_a_single_message(
    frame: bytes, error: type[Exception], reason: str
) -> None:
    with pytest.raises(error) as caught:
        peek(frame)
    assert caught.value.reason == reason  # type: ignore[attr-defined]


def test_frames_without_line_breaks_pass_untouched() -> None:
    frame = b'{"a": "x\\ny",   "b" : 1}'
    assert for_stdio(frame) is frame


def test_frames_with_raw_line_breaks_are_compacted_without_changing_strings() -> None:
    frame = b'{\r\n  "a": "x\\ny",\n  "b": [1,\n 2]\n}'
    line = for_stdio(frame)
    assert b"\n" not in line
    assert b"\r" not in line
    assert json.loads(line) == json.loads(frame)


def test_error_responses_carry_code_message_and_reason() -> None:
    error = ServiceNotFound("no service named 'x'", reason="service_not_found", service="x")
    assert json.loads(error_response(3, error)) == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {
            "code": -32005,
            "message": "Service Not Found: no service named 'x'",
            "data": {
                "reason": "service_not_found",
                "detail": "no service named 'x'",
                "service": "x",
            },
        },
    }


def test_with_id_changes_only_the_id() -> None:
    frame = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"a":[1]}}'
    assert json.loads(with_id(frame, "r-1")) == {**json.loads(frame), "id": "r-1"}
