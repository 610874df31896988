"""The catalog probe's conversation with a server, message by message (no I/O)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reactor_fabric.protocol.fabric_refresh import MAX_LIST_BYTES
from reactor_fabric.protocol.probe import MAX_PAGES, MAX_RELISTS, OfferProbe, ProbeFailed


def finished(probe: OfferProbe) -> bool:
    # A call, so that a type checker does not carry one assertion's narrowing to the next.
    return probe.done


def sent(lines: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def answer(request: dict[str, Any], result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode()


def initialized(probe: OfferProbe, capabilities: dict[str, Any]) -> list[dict[str, Any]]:
    [initialize] = sent(probe.start())
    assert initialize["method"] == "initialize"
    # What a session's client may have: servers offer some tools only to such clients.
    assert set(initialize["params"]["capabilities"]) == {"roots", "sampling", "elicitation"}
    return sent(
        probe.receive(
            answer(
                initialize,
                {"capabilities": capabilities, "serverInfo": {"name": "s", "version": "1"}},
            )
        )
    )


def test_the_probe_asks_for_every_list_the_capabilities_announce_and_nothing_else() -> None:
    probe = OfferProbe()
    out = initialized(probe, {"tools": {}, "resources": {"subscribe": True}})
    assert [m["method"] for m in out] == [
        "notifications/initialized",
        "tools/list",
        "resources/list",
        "resources/templates/list",
    ]
    assert not finished(probe)
    by_method = {m["method"]: m for m in out[1:]}
    probe.receive(answer(by_method["tools/list"], {"tools": [{"name": "t"}]}))
    probe.receive(answer(by_method["resources/list"], {"resources": [{"uri": "a://b"}]}))
    assert not finished(probe)
    probe.receive(answer(by_method["resources/templates/list"], {"resourceTemplates": []}))
    assert finished(probe)
    catalog = probe.catalog()
    assert catalog.tools == ({"name": "t"},)
    assert catalog.resources == ({"uri": "a://b"},)
    assert catalog.prompts == ()
    assert probe.server_info == {"name": "s", "version": "1"}


def test_a_server_with_no_lists_is_done_after_the_handshake() -> None:
    probe = OfferProbe()
    assert [m["method"] for m in initialized(probe, {})] == ["notifications/initialized"]
    assert finished(probe)


def test_pages_are_followed_through_their_cursor() -> None:
    probe = OfferProbe()
    [_, tools] = initialized(probe, {"tools": {}})
    [page2] = sent(probe.receive(answer(tools, {"tools": [{"name": "a"}], "nextCursor": "c2"})))
    assert page2["params"] == {"cursor": "c2"}
    assert probe.receive(answer(page2, {"tools": [{"name": "b"}]})) == []
    assert finished(probe)
    assert [t["name"] for t in probe.catalog().tools] == ["a", "b"]


def test_a_server_that_never_stops_paging_is_cut_off() -> None:
    probe = OfferProbe()
    [_, request] = initialized(probe, {"tools": {}})
    for page in range(MAX_PAGES):
        out = sent(
            probe.receive(answer(request, {"tools": [{"name": f"t{page}"}], "nextCursor": "x"}))
        )
        if not out:
            break
        [request] = out
    assert finished(probe)
    assert len(probe.catalog().tools) == MAX_PAGES
    assert any("pages" in problem for problem in probe.problems)


def test_requests_from_the_server_are_answered_so_that_none_waits() -> None:
    probe = OfferProbe()
    initialized(probe, {"tools": {}})
    roots, ping, sampling = (
        sent(probe.receive(json.dumps({"jsonrpc": "2.0", "id": i, "method": m}).encode()))[0]
        for i, m in (("r", "roots/list"), (7, "ping"), ("s", "sampling/createMessage"))
    )
    assert roots == {"jsonrpc": "2.0", "id": "r", "result": {"roots": []}}
    assert ping == {"jsonrpc": "2.0", "id": 7, "result": {}}
    assert sampling["error"]["code"] == -32601
    # Notifications and lines that are not JSON are no answer to anything.
    assert probe.receive(b'{"jsonrpc":"2.0","method":"notifications/message"}') == []
    assert probe.receive(b"Starting server...") == []
    assert not finished(probe)


def test_a_failed_initialize_fails_the_probe_with_the_servers_reason() -> None:
    probe = OfferProbe()
    [initialize] = sent(probe.start())
    refusal = {"jsonrpc": "2.0", "id": initialize["id"], "error": {"code": -1, "message": "no"}}
    with pytest.raises(ProbeFailed, match="no"):
        probe.receive(json.dumps(refusal).encode())


def test_an_error_answering_one_list_leaves_it_empty_and_the_others_count() -> None:
    probe = OfferProbe()
    [_, tools, prompts] = initialized(probe, {"tools": {}, "prompts": {}})
    probe.receive(
        json.dumps({"jsonrpc": "2.0", "id": prompts["id"], "error": {"message": "boom"}}).encode()
    )
    probe.receive(answer(tools, {"tools": [{"name": "t"}]}))
    assert finished(probe)
    assert probe.catalog().prompts == ()
    assert probe.problems == ["prompts/list: boom"]


def test_a_list_that_changes_while_it_is_learned_is_asked_for_again() -> None:
    probe = OfferProbe()
    [tools] = [m for m in initialized(probe, {"tools": {}}) if m.get("method") == "tools/list"]
    changed = b'{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}'
    [again] = sent(probe.receive(changed))
    assert again["method"] == "tools/list"
    assert probe.receive(answer(tools, {"tools": [{"name": "old"}]})) == []  # superseded
    assert not finished(probe)
    probe.receive(answer(again, {"tools": [{"name": "old"}, {"name": "sample"}]}))
    assert finished(probe)
    assert [t["name"] for t in probe.catalog().tools] == ["old", "sample"]


def test_a_server_that_keeps_changing_its_lists_is_asked_again_only_a_few_times() -> None:
    probe = OfferProbe()
    initialized(probe, {"tools": {}})
    changed = b'{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}'
    asked = [probe.receive(changed) for _ in range(MAX_RELISTS + 2)]
    assert [len(lines) for lines in asked] == [1] * MAX_RELISTS + [0, 0]


def test_a_list_larger_than_the_fabric_endpoint_takes_fails_the_probe_whatever_its_pages() -> None:
    # A server's list is made into the catalog and indexed, in proportion to its size: one
    # over the bound (in one answer, or in pages that add up) is refused, as a session's
    # refresh refuses it, not learned.
    page = {"tools": [{"name": "t", "description": "word " * (MAX_LIST_BYTES // 10)}]}
    probe = OfferProbe()
    [_, tools] = initialized(probe, {"tools": {}})
    [page2] = sent(probe.receive(answer(tools, {**page, "nextCursor": "c2"})))
    with pytest.raises(ProbeFailed, match=f"tools/list: more than {MAX_LIST_BYTES} bytes"):
        probe.receive(answer(page2, {**page, "nextCursor": "c3"}))


def test_a_list_asked_again_counts_its_bytes_from_nothing() -> None:
    page = {"tools": [{"name": "t", "description": "word " * (MAX_LIST_BYTES // 10)}]}
    probe = OfferProbe()
    [_, tools] = initialized(probe, {"tools": {}})
    probe.receive(answer(tools, {**page, "nextCursor": "c2"}))  # its page 2 is asked for
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    [again] = sent(probe.receive(json.dumps(changed).encode()))
    probe.receive(answer(again, page))
    assert finished(probe)
    assert len(probe.catalog().tools) == 1
