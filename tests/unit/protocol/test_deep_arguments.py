"""Arguments nested as deep as the decoder accepts: every call is still recorded (their hash,
and a flag where they cannot be kept as configured), and both endpoints answer it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import trio

from reactor_fabric.config.structs import Audit, Orchestrator, Service, Suite
from reactor_fabric.observe import observer as observer_module
from reactor_fabric.observe.audit import AuditWriter, read_records
from reactor_fabric.observe.observer import Observer
from reactor_fabric.protocol.deep_json import DeepEncoder, decode_deep
from reactor_fabric.protocol.events import StartBackend, ToBackend, ToClient
from reactor_fabric.protocol.jsonrpc import peek
from reactor_fabric.protocol.tool_calls import (
    FULL_ARGUMENTS_DEPTH,
    REDACTED,
    ToolCallDone,
    ToolCalls,
    canonical_json,
    redact,
)
from reactor_fabric.runtime.memory import open_memory_runtime
from reactor_fabric.trio.audit_batches import hand_audit_over_later
from reactor_fabric.trio.serve import assemble
from reactor_fabric.trio.session import serve_session
from tests.fakes import INITIALIZE, INITIALIZED, MemoryClient, scripted_mcp_server
from tests.served import served
from tests.unit.observe.test_observer import CLIENT, call
from tests.unit.protocol.test_fabric_server import client, line, session, started

T = TypeVar("T")
# The depths the attack used: past where a recursive redaction failed (about 500 levels), below
# the decoder's limit (about 1,000 less the stack).
DEPTHS = (600, 900)


def nested(depth: int) -> bytes:
    """Arrays nested ``depth`` levels, as JSON (built as bytes: encoders recurse too)."""
    return b"[" * depth + b"]" * depth


def call_frame(request_id: int, tool: str, depth: int) -> bytes:
    arguments = b'{"seconds":0,"deep":' + nested(depth) + b',"token":"t"}'
    return (
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
        % (request_id, tool.encode(), arguments)
    )


def expected_hash(depth: int) -> str:
    canonical = b'{"deep":' + nested(depth) + b',"seconds":0,"token":"t"}'
    return hashlib.sha256(canonical).hexdigest()


def deep_in_the_stack(frames: int, work: Callable[[], T]) -> T:
    """``work`` run ``frames`` Python frames further down the stack (where a record may be made:
    msgspec's depth limit is Python's recursion limit less the stack already used)."""
    if frames == 0:
        return work()
    return deep_in_the_stack(frames - 1, work)


# --- the machine's view -------------------------------------------------------------------------


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_arguments_in_full_mode_keep_their_hash_and_a_flag_instead_of_failing(
    depth: int,
) -> None:
    calls = ToolCalls("full")
    arguments = decode_deep(call_frame(1, "t", depth))["params"]["arguments"]  # type: ignore[index]
    calls.begin(1, tool="t", service="s", arguments=arguments, traceparent=None, nbytes=1, now=0.0)
    [done] = calls.abandon(now=1.0)
    assert done.arguments.sha256 == expected_hash(depth)
    assert (done.arguments.full, done.arguments.too_deep) == (None, True)


@pytest.mark.parametrize("mode", ["hash", "full"])
def test_the_relay_hashes_deep_arguments_even_read_further_down_the_stack_than_they_were_peeked(
    mode: Any,
) -> None:
    calls = ToolCalls(mode)
    frame = call_frame(1, "git_commit", 900)
    message = peek(frame)  # the session's decoder takes it
    calls.begin_params(1, message.params, len(frame), now=0.0)
    # The call's params are read when it ends, maybe deep in the stack, where msgspec no longer
    # can: read with a stack of their own, the same hash as the fabric endpoint's.
    [done] = deep_in_the_stack(300, lambda: calls.abandon(now=1.0))
    assert (done.tool, done.arguments.sha256) == ("git_commit", expected_hash(900))
    assert done.arguments.too_deep is (mode == "full")


def test_arguments_up_to_the_depth_bound_are_kept_in_full_and_redacted() -> None:
    calls = ToolCalls("full")
    value: Any = {"password": "p", "x": 1}
    for _ in range(FULL_ARGUMENTS_DEPTH - 1):
        value = [value]
    calls.begin(1, tool="t", service="s", arguments=value, traceparent=None, nbytes=1, now=0.0)
    [done] = calls.abandon(now=1.0)
    kept = done.arguments.full
    for _ in range(FULL_ARGUMENTS_DEPTH - 1):
        kept = kept[0]
    assert kept == {"password": REDACTED, "x": 1}
    assert done.arguments.too_deep is False


def test_redaction_and_canonical_json_walk_any_depth_without_pythons_stack() -> None:
    depth = 100_000
    value = decode_deep(b'{"a":' * depth + b'{"api_key":"k","n":[1.5,"\\u00e9"]}' + b"}" * depth)
    redacted = canonical_json(redact(value))
    assert redacted == b'{"a":' * depth + b'{"api_key":"[redacted]","n":[1.5,"\xc3\xa9"]}' + (
        b"}" * depth
    )


@pytest.mark.parametrize(
    "text",
    [
        b'{"b":[1,-2.5e3,true,false,null,"x\\"\\n\\u00e9",{}],"a":{"z":[],"\xc3\xa9":0},"":1}',
        b' [ 1 , { "k" : [ ] } ] ',
        b'"only a string"',
        b"12345678901234567890123",
    ],
)
def test_the_deep_decoder_and_encoder_make_what_msgspec_makes(text: bytes) -> None:
    value = msgspec.json.decode(text)
    assert decode_deep(text) == value
    deep = deep_in_the_stack(0, lambda: canonical_json(value))
    assert deep == msgspec.json.Encoder(order="sorted").encode(value)


@pytest.mark.parametrize(
    "text", [b"[1,]", b'{"a":1,}', b"[1 2]", b'{"a" 1}', b"{1:2}", b"[", b"[1]]", b"[1] x", b""]
)
def test_the_deep_decoder_refuses_what_is_not_json(text: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_deep(text)


@pytest.mark.parametrize(
    "text", [b'{"b":1,"a":[{"z":null,"y":"\\u00e9"}]}', b"[]", b'{"":{"":[]}}']
)
def test_the_deep_encoder_keeps_the_order_of_keys_as_msgspec_does(text: bytes) -> None:
    value = msgspec.json.decode(text)
    assert (
        DeepEncoder()._encode_deep(value)
        == msgspec.json.encode(value)
        == text.replace(b"\\u00e9", "\u00e9".encode())
    )


@pytest.mark.parametrize("mode", ["hash", "full"])
def test_the_fabric_server_forwards_and_records_a_deep_call_queued_until_its_backend_is_ready(
    mode: Any,
) -> None:
    server = session(audit_arguments=mode)
    frame = call_frame(5, "git__git_log", 900)
    actions = client(server, frame)  # near the top of the stack, as a session reads it
    assert [type(action) for action in actions] == [StartBackend]
    [handshake] = [json.loads(a.data) for a in started(server, "git") if isinstance(a, ToBackend)]
    ready = (
        b'{"jsonrpc":"2.0","id":%d,"result":{"capabilities":{},"serverInfo":{}}}'
        % (handshake["id"])
    )
    # The backend's reader takes its answer far down the stack; the queued call goes out then.
    sent = deep_in_the_stack(300, lambda: line(server, "git", ready))
    forwarded: Any = decode_deep([a.data for a in sent if isinstance(a, ToBackend)][-1])
    assert forwarded["method"] == "tools/call"
    assert forwarded["params"]["name"] == "git_log"
    arguments = canonical_json(forwarded["params"]["arguments"])
    assert hashlib.sha256(arguments).hexdigest() == expected_hash(900)  # all of it, unchanged
    answered = line(
        server, "git", msgspec.json.encode({"jsonrpc": "2.0", "id": forwarded["id"], "result": {}})
    )
    [answer] = [json.loads(a.frame) for a in answered if isinstance(a, ToClient)]
    assert (answer["id"], answer["result"]) == (5, {})
    [done] = [a.call for a in answered if isinstance(a, ToolCallDone)]
    assert (done.tool, done.arguments.sha256) == ("git_log", expected_hash(900))
    assert done.arguments.too_deep is (mode == "full")


# --- the record ---------------------------------------------------------------------------------


def test_a_record_of_deep_arguments_carries_their_hash_and_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path, max_bytes=1 << 20, keep=1)
    audit.open()
    observer = Observer(services=["git"], audit=audit)
    calls = ToolCalls("full")
    frame = call_frame(7, "git_commit", 900)
    calls.begin_params(7, peek(frame).params, len(frame), now=0.0)
    [done] = calls.abandon(now=1.0)
    observer.tool_call(
        done, session="s", endpoint="relay", service="git", container="c",
        client=CLIENT, trace_id="f" * 32,
    )  # fmt: skip
    observer.close()
    [record] = read_records(path)
    assert record["arguments_sha256"] == expected_hash(900)
    assert record["arguments_too_deep"] is True
    assert "arguments" not in record


def test_a_call_whose_record_cannot_be_made_is_counted_as_dropped_in_the_trail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path, max_bytes=1 << 20, keep=1)
    audit.open()
    observer = Observer(services=["git"], audit=audit)
    observer.defer_audit(lambda: None)
    failing = call(request_id=1)
    real = Observer._record_call

    def record_call(self: Observer, held: Any) -> bytes | None:
        if held.done.call is failing:
            raise RuntimeError("a tracing exporter failing, say")
        return real(self, held)

    monkeypatch.setattr(Observer, "_record_call", record_call)
    monkeypatch.setattr(observer_module.log, "exception", lambda *_a, **_k: None)
    for done in (failing, call(request_id=2)):
        observer.tool_call(
            done, session="s", endpoint="relay", service="git", container="c",
            client=CLIENT, trace_id="f" * 32,
        )  # fmt: skip
    observer.close()
    records = list(read_records(path))
    assert [(r["event"], r.get("count")) for r in records] == [
        ("audit_dropped", 1),
        ("tool_call", None),
    ]


# --- both endpoints -----------------------------------------------------------------------------


def full_audit(path: Path) -> Observer:
    audit = AuditWriter(path, max_bytes=1 << 24, keep=1, linger=0)
    audit.open()
    return Observer(services=["svc", "alpha"], audit=audit)


def recorded_calls(path: Path) -> list[dict[str, Any]]:
    return [r for r in read_records(path) if r["event"] == "tool_call"]


async def test_the_relay_runs_and_records_a_call_with_deep_arguments(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    observer = full_audit(path)
    suite = Suite(
        version="1.0",
        orchestrator=Orchestrator(
            allowed_mount_roots=[str(tmp_path)], audit=Audit(arguments="full")
        ),
        mcp_services={"svc": Service(image="fake/svc:1", timeout="1m")},
    )
    async with open_memory_runtime(scripted_mcp_server) as engine:
        fabric = assemble(suite, runtime=engine, network="none", observer=observer)
        client = MemoryClient()
        async with trio.open_nursery() as nursery:
            await nursery.start(hand_audit_over_later, observer)
            async with trio.open_nursery() as session:
                session.start_soon(serve_session, fabric, client, "svc", [])
                await client.say(INITIALIZE)
                await client.hear()
                await client.say(INITIALIZED)
                for request_id, depth in enumerate(DEPTHS, start=2):
                    await client.say(call_frame(request_id, "wait", depth))
                    assert (await client.hear()) == {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "result": {"content": []},
                    }
                await client.leave()
            nursery.cancel_scope.cancel()  # the records held are handed over as it ends
    observer.close()
    records = recorded_calls(path)
    assert [(r["request_id"], r["outcome"]) for r in records] == [(2, "ok"), (3, "ok")]
    assert [r["arguments_sha256"] for r in records] == [expected_hash(d) for d in DEPTHS]
    assert all(r["arguments_too_deep"] is True and "arguments" not in r for r in records)


async def test_the_fabric_endpoint_answers_and_records_a_call_with_deep_arguments(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    services = {"alpha": Service(image="fake/alpha:1", timeout="30s")}
    observer = full_audit(path)
    async with served(
        tmp_path,
        learn_catalog=True,
        services=services,
        audit=Audit(arguments="full"),
        observer=observer,
    ) as http:
        await http.nursery.start(hand_audit_over_later, observer)
        ws, _ = await http.websocket("/mcp")
        await ws.send_json(INITIALIZE)
        await ws.hear()
        await ws.send_json(INITIALIZED)
        for request_id, depth in enumerate(DEPTHS, start=2):
            await ws.send_text(call_frame(request_id, "alpha__wait", depth).decode())
            answer = await ws.hear()
            assert (answer["id"], answer.get("result")) == (request_id, {"content": []})
    observer.close()  # the calls ended with their answers; their records were handed over
    records = recorded_calls(path)
    assert [(r["request_id"], r["service"], r["tool"]) for r in records] == [
        (2, "alpha", "wait"),
        (3, "alpha", "wait"),
    ]
    assert [r["arguments_sha256"] for r in records] == [expected_hash(d) for d in DEPTHS]
    assert all(r["arguments_too_deep"] is True and "arguments" not in r for r in records)


def test_the_deep_frames_are_what_a_json_encoder_would_send() -> None:
    depth = 5
    value = json.loads(call_frame(1, "t", depth))
    assert value["params"]["arguments"]["deep"] == json.loads(nested(depth))
