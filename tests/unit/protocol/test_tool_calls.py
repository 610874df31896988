"""The audit's view of tool calls: one record per call, whichever way it ended."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from reactor_fabric.protocol.jsonrpc import IdInFlight, RequestId, peek
from reactor_fabric.protocol.tool_calls import (
    FULL_ARGUMENTS_BYTES,
    LAZY_PARAMS_BYTES,
    REDACTED,
    ToolCalls,
    redact,
    valid_traceparent,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def call_frame(request_id: object, name: object, arguments: object = None, **params: Any) -> bytes:
    body: dict[str, Any] = {"name": name, **params}
    if arguments is not None:
        body["arguments"] = arguments
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": body}
    return json.dumps(message).encode()


def begin(calls: ToolCalls, request_id: RequestId, frame: bytes, *, now: float) -> None:
    """The client's request, as the relay's session machine hands it over (peeked)."""
    message = peek(frame)
    assert message.id == request_id
    calls.begin_params(request_id, message.params, len(frame), now)


def answer(request_id: object, **body: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, **body}).encode()


def test_a_call_answered_with_a_result_is_ok_with_its_sizes_and_duration() -> None:
    calls = ToolCalls()
    frame = call_frame(7, "git_commit", {"message": "x"})
    begin(calls, 7, frame, now=10.0)
    reply = answer(7, result={"content": []})
    done = calls.answered(7, reply, now=10.25)
    assert done is not None
    assert (done.request_id, done.tool, done.outcome) == (7, "git_commit", "ok")
    assert (done.bytes_in, done.bytes_out, done.duration) == (len(frame), len(reply), 0.25)
    assert (done.error_code, done.error_reason) == (None, None)
    assert calls.open == {}


def test_an_answers_outcome_is_read_when_first_asked_for_and_only_once() -> None:
    calls = ToolCalls()
    begin(calls, 7, call_frame(7, "t"), now=0.0)
    reply = answer(7, result={"content": [], "isError": True})
    done = calls.answer(7, reply, now=1.0)
    assert done is not None
    assert calls.open == {}  # the call ended when its answer passed
    assert done.held_bytes == len(reply)  # ... what it says is read later
    assert (done.call.outcome, done.call.error_reason) == ("error", "tool_error")
    assert done.held_bytes == 0
    assert done.call is done.call


def test_small_params_are_read_when_the_call_ends_and_large_ones_as_they_pass() -> None:
    calls = ToolCalls()
    small = call_frame(1, "git_log", {"path": "."}, _meta={"traceparent": TRACEPARENT})
    large = call_frame(2, "git_log", {"path": "x" * LAZY_PARAMS_BYTES})
    begin(calls, 1, small, now=0.0)
    begin(calls, 2, large, now=0.0)
    assert calls.open[1].tool == ""  # kept as bytes: nothing read on the request's path
    assert calls.open[2].tool == "git_log"  # what is kept per call stays small
    ended = calls.answered(1, answer(1, result={}), now=1.0)
    assert ended is not None
    assert (ended.tool, ended.traceparent) == ("git_log", TRACEPARENT)
    assert ended.arguments.sha256 == hashlib.sha256(b'{"path":"."}').hexdigest()
    [abandoned] = calls.abandon(now=2.0)
    assert (abandoned.tool, abandoned.outcome) == ("git_log", "no_answer")


def test_a_json_rpc_error_is_an_error_with_its_code_and_reason() -> None:
    calls = ToolCalls()
    begin(calls, "a", call_frame("a", "t"), now=0.0)
    error = {"code": -32002, "message": "gone", "data": {"reason": "container_exited"}}
    done = calls.answered("a", answer("a", error=error), now=1.0)
    assert done is not None
    assert (done.outcome, done.error_code, done.error_reason) == (
        "error",
        -32002,
        "container_exited",
    )


def test_a_result_the_tool_marked_as_an_error_is_an_error_without_a_code() -> None:
    calls = ToolCalls()
    begin(calls, 1, call_frame(1, "t"), now=0.0)
    done = calls.answered(1, answer(1, result={"content": [], "isError": True}), now=0.0)
    assert done is not None
    assert (done.outcome, done.error_code, done.error_reason) == ("error", None, "tool_error")


def test_a_cancelled_call_is_recorded_once_and_its_late_answer_is_not() -> None:
    calls = ToolCalls()
    begin(calls, 1, call_frame(1, "t"), now=0.0)
    cancelled = calls.cancelled(1, now=2.0)
    assert cancelled is not None
    assert (cancelled.outcome, cancelled.duration) == ("cancelled", 2.0)
    assert calls.answered(1, answer(1, result={}), now=3.0) is None
    assert calls.cancelled(1, now=3.0) is None


def test_calls_still_open_when_the_session_ends_had_no_answer() -> None:
    calls = ToolCalls()
    begin(calls, 1, call_frame(1, "a"), now=0.0)
    begin(calls, 2, call_frame(2, "b"), now=1.0)
    done = calls.abandon(now=4.0)
    assert [(c.request_id, c.tool, c.outcome, c.duration) for c in done] == [
        (1, "a", "no_answer", 4.0),
        (2, "b", "no_answer", 3.0),
    ]
    assert calls.abandon(now=5.0) == []


def test_two_calls_can_never_be_open_under_one_id() -> None:
    # The second would replace the first, which would then end with no record at all.
    calls = ToolCalls()
    begin(calls, 7, call_frame(7, "first"), now=0.0)
    with pytest.raises(IdInFlight):
        begin(calls, 7, call_frame(7, "second"), now=1.0)
    with pytest.raises(IdInFlight):
        calls.begin(
            7, tool="third", service="s", arguments=None, traceparent=None, nbytes=1, now=1.0
        )
    done = calls.answered(7, answer(7, result={}), now=2.0)
    assert done is not None
    assert (done.tool, done.outcome) == ("first", "ok")


def test_a_call_refused_for_its_id_in_flight_is_recorded_alone_and_the_open_one_is_untouched() -> (
    None
):
    calls = ToolCalls()
    begin(calls, 7, call_frame(7, "first", {"a": 1}), now=0.0)
    duplicate = call_frame(7, "second", {"b": 2})
    refusal = answer(7, error={"code": -32600, "data": {"reason": "duplicate_request_id"}})
    refused = calls.refused_params(7, peek(duplicate).params, len(duplicate), refusal, now=1.0)
    assert (refused.call.request_id, refused.call.tool, refused.call.outcome) == (
        7,
        "second",
        "error",
    )
    assert (refused.call.error_code, refused.call.error_reason) == (-32600, "duplicate_request_id")
    assert refused.call.arguments.sha256 == hashlib.sha256(b'{"b":2}').hexdigest()
    assert list(calls.open) == [7]
    first = calls.answered(7, answer(7, result={}), now=3.0)
    assert first is not None
    assert (first.tool, first.outcome, first.duration) == ("first", "ok", 3.0)


def test_answers_to_anything_but_a_call_in_flight_are_not_calls() -> None:
    calls = ToolCalls()
    assert calls.answered(1, answer(1, result={}), now=0.0) is None
    assert calls.answered(None, answer(None, error={"code": -32700}), now=0.0) is None


def test_the_arguments_hash_is_of_their_canonical_json_whatever_the_client_sent() -> None:
    calls = ToolCalls("hash")
    compact = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t",'
    compact += b'"arguments":{"b":1,"a":[true,null]}}}'
    spaced = call_frame(2, "t", {"a": [True, None], "b": 1})
    begin(calls, 1, compact, now=0.0)
    begin(calls, 2, spaced, now=0.0)
    first, second = calls.abandon(now=0.0)
    expected = hashlib.sha256(b'{"a":[true,null],"b":1}').hexdigest()
    assert first.arguments.sha256 == second.arguments.sha256 == expected
    assert first.arguments.full is None


def test_arguments_kept_in_full_have_secret_looking_values_redacted_at_any_depth() -> None:
    calls = ToolCalls("full")
    arguments = {"path": "/w", "API_KEY": "k", "nested": [{"password": "p", "x": 1}]}
    begin(calls, 1, call_frame(1, "t", arguments), now=0.0)
    [done] = calls.abandon(now=0.0)
    assert done.arguments.full == {
        "path": "/w",
        "API_KEY": REDACTED,
        "nested": [{"password": REDACTED, "x": 1}],
    }
    assert done.arguments.sha256 is not None  # of what the client sent, not of the redaction


def test_arguments_too_large_to_keep_in_full_keep_only_their_hash() -> None:
    calls = ToolCalls("full")
    begin(calls, 1, call_frame(1, "t", {"data": "x" * FULL_ARGUMENTS_BYTES}), now=0.0)
    [done] = calls.abandon(now=0.0)
    assert (done.arguments.full, done.arguments.truncated) == (None, True)
    assert done.arguments.sha256 is not None


def test_with_arguments_none_nothing_of_them_is_kept() -> None:
    calls = ToolCalls("none")
    begin(calls, 1, call_frame(1, "t", {"password": "p"}), now=0.0)
    [done] = calls.abandon(now=0.0)
    assert (done.arguments.sha256, done.arguments.full) == (None, None)


def test_a_valid_traceparent_in_the_calls_meta_is_kept_and_an_invalid_one_is_not() -> None:
    calls = ToolCalls()
    begin(calls, 1, call_frame(1, "t", _meta={"traceparent": TRACEPARENT}), now=0.0)
    begin(calls, 2, call_frame(2, "t", _meta={"traceparent": "00-zz-yy-01"}), now=0.0)
    first, second = calls.abandon(now=0.0)
    assert (first.traceparent, second.traceparent) == (TRACEPARENT, None)


@pytest.mark.parametrize(
    "frame",
    [
        call_frame(1, {"not": "a name"}),
        call_frame(1, "t", "arguments that are a string"),
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call"}',
    ],
    ids=["name-not-a-string", "arguments-not-an-object", "params-not-an-object", "no-params"],
)
def test_a_malformed_call_is_still_recorded_and_never_raises(frame: bytes) -> None:
    calls = ToolCalls("full")
    begin(calls, 1, frame, now=0.0)
    [done] = calls.abandon(now=0.0)
    assert done.request_id == 1
    assert isinstance(done.tool, str)


def test_a_very_long_tool_name_is_cut() -> None:
    calls = ToolCalls()
    begin(calls, 1, call_frame(1, "t" * 10_000), now=0.0)
    [done] = calls.abandon(now=0.0)
    assert len(done.tool) == 256


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        (TRACEPARENT, True),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", False),
    ],
)
def test_traceparents_are_checked_as_w3c_trace_context_says(text: str, valid: bool) -> None:
    assert valid_traceparent(text) is valid


def test_redaction_leaves_values_of_ordinary_keys_alone() -> None:
    assert redact({"query": "token", "items": ["secret"]}) == {
        "query": "token",
        "items": ["secret"],
    }
