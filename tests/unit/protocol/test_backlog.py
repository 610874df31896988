"""The messages waiting for a backend: what a container that works on a copy is given of them."""

from __future__ import annotations

import json
from collections.abc import Mapping

from reactor_fabric.protocol.backlog import Backlog
from reactor_fabric.protocol.jsonrpc import REQUEST, Peek, peek
from tests.messages import request


def _frame(message: Mapping[str, object]) -> tuple[Peek, bytes]:
    frame = json.dumps(message).encode()
    return peek(frame), frame


def _is_call(message: Peek) -> bool:
    return message.kind == REQUEST and message.method == "tools/call"


CANCEL: dict[str, object] = {
    "jsonrpc": "2.0",
    "method": "notifications/cancelled",
    "params": {"requestId": 2},
}


def test_up_to_the_second_call_goes_and_the_rest_keeps_waiting_counted() -> None:
    backlog = Backlog()
    items = [
        _frame({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        _frame(request(2, "tools/call", {"name": "a"})),
        _frame(CANCEL),
        _frame(request(3, "tools/call", {"name": "b"})),
        _frame(request(4, "tools/list")),
    ]
    for message, frame in items:
        backlog.append(message, frame)
    taken = backlog.drain_to_second(_is_call)
    assert [frame for _m, frame in taken] == [frame for _m, frame in items[:3]]
    assert backlog.frames() == tuple(frame for _m, frame in items[3:])
    assert backlog.bytes == sum(len(frame) for _m, frame in items[3:])
    assert len(backlog) == len(backlog.frames()) == 2
    twin = backlog.clone()
    assert (len(twin), twin.bytes) == (len(backlog), backlog.bytes)
    assert not backlog.has_request(2)
    assert backlog.has_request(3)
    assert backlog.has_request(4)
    # The next container gets the rest (one call: all of it).
    assert len(backlog.drain_to_second(_is_call)) == 2
    assert (len(backlog), backlog.bytes) == (0, 0)
    assert len(twin) == 2  # (a clone is its own)


def test_with_no_second_call_everything_goes() -> None:
    backlog = Backlog()
    for message, frame in (_frame(CANCEL), _frame(request(5, "ping"))):
        backlog.append(message, frame)
    assert len(backlog.drain_to_second(_is_call)) == 2
    assert (len(backlog), backlog.bytes, backlog.has_request(5)) == (0, 0, False)
