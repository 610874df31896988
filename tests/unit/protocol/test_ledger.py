from __future__ import annotations

import json

import pytest

from reactor_fabric.protocol.jsonrpc import IdInFlight, peek
from reactor_fabric.protocol.ledger import Ledger


def client(ledger: Ledger, message: dict[str, object]) -> None:
    frame = json.dumps(message).encode()
    ledger.from_client(peek(frame), frame)


def server(ledger: Ledger, message: dict[str, object], *, expires_at: float = 100.0) -> None:
    ledger.from_server(peek(json.dumps(message).encode()), expires_at=expires_at)


def test_a_request_is_in_flight_until_its_response() -> None:
    ledger = Ledger()
    client(ledger, {"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
    assert ledger.busy
    server(ledger, {"jsonrpc": "2.0", "id": 1, "result": {}})
    assert not ledger.busy


def test_a_cancelled_request_is_no_longer_awaited() -> None:
    ledger = Ledger()
    client(ledger, {"jsonrpc": "2.0", "id": "x", "method": "tools/call"})
    client(
        ledger,
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "x"}},
    )
    assert not ledger.busy


def test_a_server_request_keeps_the_session_busy_until_the_client_answers() -> None:
    ledger = Ledger()
    server(ledger, {"jsonrpc": "2.0", "id": 9, "method": "sampling/createMessage"})
    assert ledger.busy
    client(ledger, {"jsonrpc": "2.0", "id": 9, "result": {}})
    assert not ledger.busy


def test_a_server_request_expires_when_its_time_is_up() -> None:
    ledger = Ledger()
    server(ledger, {"jsonrpc": "2.0", "id": "a", "method": "roots/list"}, expires_at=10.0)
    server(ledger, {"jsonrpc": "2.0", "id": "b", "method": "roots/list"}, expires_at=20.0)
    assert ledger.next_expiry() == 10.0
    assert ledger.expire(9.9) == []
    assert ledger.expire(10.0) == ["a"]
    assert ledger.next_expiry() == 20.0
    assert ledger.expire(30.0) == ["b"]
    assert not ledger.busy
    assert ledger.next_expiry() is None


def test_nothing_is_replayed_for_a_stateless_client() -> None:
    ledger = Ledger()
    client(ledger, {"jsonrpc": "2.0", "id": 1, "method": "server/discover"})
    assert ledger.replay() is None


def test_the_latest_handshake_is_replayed_with_a_fresh_id_each_time() -> None:
    ledger = Ledger()
    client(ledger, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"v": 1}})
    client(ledger, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    replay = ledger.replay()
    assert replay is not None
    assert json.loads(replay.initialize) == {
        "jsonrpc": "2.0",
        "id": replay.initialize_id,
        "method": "initialize",
        "params": {"v": 1},
    }
    assert replay.initialized is not None
    # A second replay gets another id.
    again = ledger.replay()
    assert again is not None
    assert again.initialize_id != replay.initialize_id


def test_a_dead_container_loses_every_pending_request() -> None:
    ledger = Ledger()
    client(ledger, {"jsonrpc": "2.0", "id": 1, "method": "a"})
    client(ledger, {"jsonrpc": "2.0", "id": "b", "method": "b"})
    server(ledger, {"jsonrpc": "2.0", "id": 5, "method": "roots/list"})
    assert ledger.container_gone() == [(1, "a"), ("b", "b")]
    assert not ledger.busy


def test_the_ledger_never_holds_two_requests_in_flight_under_one_id_in_either_direction() -> None:
    # The session machine refuses such a request first (duplicate_request_id); were one to get
    # here, the first request must not be silently replaced (it would never be answered).
    ledger = Ledger()
    client(ledger, {"jsonrpc": "2.0", "id": 7, "method": "tools/call"})
    with pytest.raises(IdInFlight):
        client(ledger, {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    assert ledger.client_requests == {7: "tools/call"}
    server(ledger, {"jsonrpc": "2.0", "id": "s", "method": "roots/list"}, expires_at=10.0)
    with pytest.raises(IdInFlight):
        server(ledger, {"jsonrpc": "2.0", "id": "s", "method": "roots/list"}, expires_at=99.0)
    assert ledger.server_requests == {"s": 10.0}
    # Once answered, an id is free again.
    server(ledger, {"jsonrpc": "2.0", "id": 7, "result": {}})
    client(ledger, {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    client(ledger, {"jsonrpc": "2.0", "id": "s", "result": {}})
    server(ledger, {"jsonrpc": "2.0", "id": "s", "method": "roots/list"}, expires_at=20.0)
    assert (ledger.client_requests, ledger.server_requests) == ({7: "tools/list"}, {"s": 20.0})


def test_a_response_answers_the_request_its_id_spells_in_any_way_a_client_reads_it() -> None:
    ledger = Ledger()
    for request_id in (0, 41, "41", "job-7", 2**53 + 1):
        client(ledger, {"jsonrpc": "2.0", "id": request_id, "method": "tools/list"})
    assert ledger.answering("41") == "41"  # its own id first
    assert ledger.answering(41) == 41
    for spelled in (" 41", "0x29", "4.1e1", "+41", "4_1", "\u0664\u0661", 41):
        assert ledger.answering(spelled) in (41, "41")
    assert ledger.answering("") == 0  # (JavaScript's Number("") is 0)
    assert ledger.answering(2**53) == 2**53 + 1  # (one double to JavaScript)
    assert ledger.answering("job-7") == "job-7"
    for stray in ("41a", "job-8", 42, "NaN", "0x2a", None):
        assert ledger.answering(stray) is None
