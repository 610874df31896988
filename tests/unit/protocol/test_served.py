"""Which container served which call (protocol/served.py): a relayed call is named when shown,
from a copy of its params only when they are small — never a view of its frame."""

from __future__ import annotations

import json

from reactor_fabric.protocol.events import BackendKey
from reactor_fabric.protocol.jsonrpc import peek
from reactor_fabric.protocol.served import MAX_ID_CHARS, NAMED_PARAMS_BYTES, Served


def relayed(served: Served, key: BackendKey, request_id: int, params: dict[str, object]) -> None:
    frame = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    ).encode()
    served.relayed(key, peek(frame))


def test_a_relayed_call_is_named_when_shown_and_keeps_no_view_of_a_large_frame() -> None:
    served = Served()
    key = BackendKey("time", 0)
    served.asked(key, "reuse_per_session", 0.0)
    relayed(served, key, 1, {"name": "get_current_time", "arguments": {}})
    big: dict[str, object] = {"name": "echo", "arguments": {"text": "x" * NAMED_PARAMS_BYTES}}
    relayed(served, key, 2, big)
    [container] = served.records(0.0)
    assert container["calls"] == 2
    assert container["recent_calls"] == [
        {"id": 1, "method": "tools/call", "name": "get_current_time"},
        {"id": 2, "method": "tools/call", "name": None},  # too large to be read for its name
    ]
    # What is kept of each: a copy of the small params (bytes of their own), nothing of the
    # large one (a msgspec.Raw would keep the whole frame alive).
    live = served._live[key]
    kept = [getattr(ref, "params", None) for ref in live.recent]
    assert type(kept[0]) is bytes
    assert kept[1] is None


def test_a_relayed_calls_long_id_is_cut_when_shown() -> None:
    served = Served()
    key = BackendKey("time", 0)
    served.asked(key, "reuse_per_session", 0.0)
    served.relayed(
        key,
        peek(json.dumps({"jsonrpc": "2.0", "id": "i" * 500, "method": "ping"}).encode()),
    )
    [container] = served.records(0.0)
    [call] = container["recent_calls"]
    assert call["id"] == "i" * MAX_ID_CHARS
    assert (call["method"], call["name"]) == ("ping", None)
