"""The catalog's names and routing tables (pure)."""

from __future__ import annotations

import re

import pytest

from reactor_fabric.protocol.catalog import (
    MAX_NAME,
    Catalog,
    ServiceCatalog,
    relearned,
    service_catalog,
    shown_name,
)

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def test_a_short_name_is_the_service_and_the_tool_joined_by_two_underscores() -> None:
    assert shown_name("git", "git_log") == "git__git_log"
    exactly = "t" * (MAX_NAME - len("svc__"))
    assert shown_name("svc", exactly) == f"svc__{exactly}"


@pytest.mark.parametrize(
    ("service", "tool"),
    [
        ("svc", "t" * 60),  # one character over
        ("a-very-long-service-name-indeed", "and_a_very_long_tool_name_as_well_0123456789"),
        ("svc", "has space"),
        ("svc", "slash/in/it"),
        ("svc", "ünïcode"),
    ],
)
def test_a_long_or_odd_name_is_shortened_readably_and_stably(service: str, tool: str) -> None:
    shown = shown_name(service, tool)
    assert NAME.fullmatch(shown)
    assert len(shown) <= MAX_NAME
    assert shown.startswith(service[:20])  # still readable
    assert shown_name(service, tool) == shown  # the same every time, whatever else exists
    assert shown_name(service, tool + "x") != shown


def test_names_that_shorten_alike_stay_apart() -> None:
    names = {shown_name("svc", "t" * 100 + str(i)) for i in range(1000)}
    assert len(names) == 1000


def test_tools_are_shown_under_their_names_with_the_service_in_the_description() -> None:
    catalog = Catalog(
        {
            "git": service_catalog(
                tools=[{"name": "git_log", "description": "Show log", "inputSchema": {"a": 1}}]
            ),
            "time": service_catalog(tools=[{"name": "now", "inputSchema": {}}]),
        }
    )
    assert catalog.tools_of() == [
        {"name": "git__git_log", "description": "[git] Show log", "inputSchema": {"a": 1}},
        {"name": "time__now", "description": "[time]", "inputSchema": {}},
    ]
    assert [t["name"] for t in catalog.tools_of(["time"])] == ["time__now"]
    entry = catalog.tool("git__git_log")
    assert entry is not None
    assert (entry.service, entry.name) == ("git", "git_log")
    assert catalog.tool("git_log") is None


def test_a_shortened_name_routes_back_to_its_service_and_tool() -> None:
    long_tool = "x" * 80
    catalog = Catalog({"svc": service_catalog(tools=[{"name": long_tool}])})
    [listed] = catalog.tools_of()
    entry = catalog.tool(listed["name"])
    assert entry is not None
    assert (entry.service, entry.name) == ("svc", long_tool)


def test_malformed_entries_are_left_out_and_the_rest_kept() -> None:
    catalog = Catalog(
        {
            "svc": service_catalog(
                tools=[{"name": ""}, {"description": "no name"}, "junk", {"name": "ok"}],  # type: ignore[list-item]
                prompts=[{"name": 3}, {"name": "p"}],
            )
        }
    )
    assert [t["name"] for t in catalog.tools_of()] == ["svc__ok"]
    assert [p["name"] for p in catalog.prompts_of()] == ["svc__p"]


def test_a_resource_uri_offered_twice_goes_to_the_first_service_and_the_other_is_prefixed() -> None:
    catalog = Catalog(
        {
            "a": service_catalog(resources=[{"uri": "file:///x", "name": "x"}]),
            "b": service_catalog(
                resources=[{"uri": "file:///x", "name": "x"}, {"uri": "mem://y", "name": "y"}]
            ),
        }
    )
    assert catalog.resource("file:///x") == ("a", "file:///x")
    assert catalog.resource("b+file:///x") == ("b", "file:///x")
    assert catalog.resource("mem://y") == ("b", "mem://y")
    assert [r["uri"] for r in catalog.resources_of()] == ["file:///x", "b+file:///x", "mem://y"]
    assert [r["uri"] for r in catalog.resources_of(["b"])] == ["b+file:///x", "mem://y"]


def test_a_service_whose_offer_could_not_be_learned_reports_why_and_the_rest_work() -> None:
    catalog = Catalog(
        {
            "broken": ServiceCatalog(error="probe timed out"),
            "time": service_catalog(tools=[{"name": "now"}]),
        }
    )
    assert catalog.errors() == {"broken": "probe timed out"}
    assert [t["name"] for t in catalog.tools_of()] == ["time__now"]


def test_a_shown_name_two_services_would_share_is_refused_for_both_and_names_both() -> None:
    # A suite that gets past validate-config (or a hashed form two services' names meet in)
    # must not let one service's tool silently stand in for the other's.
    catalog = Catalog(
        {
            "a": service_catalog(tools=[{"name": "b__c"}, {"name": "d"}]),
            "a__b": service_catalog(tools=[{"name": "c"}]),
        }
    )
    assert [t["name"] for t in catalog.tools_of()] == ["a__d"]
    assert catalog.tool("a__b__c") is None
    errors = catalog.errors()
    assert set(errors) == {"a", "a__b"}
    for why in errors.values():
        assert "'a__b__c' refused" in why
        assert "'a''s 'b__c'" in why
        assert "'a__b''s 'c'" in why


def test_one_service_listing_a_name_twice_keeps_its_first_and_reports_no_conflict() -> None:
    catalog = Catalog(
        {"a": service_catalog(tools=[{"name": "x", "description": "1"}, {"name": "x"}])}
    )
    assert catalog.tool("a__x") is not None
    assert catalog.errors() == {}


def test_a_service_that_could_not_be_learned_again_keeps_the_offer_it_was_learned_with() -> None:
    # An image removed after start-up: its tools must not turn into unknown ones at the next
    # re-check; the failure is recorded beside them.
    before = service_catalog(tools=[{"name": "now"}], prompts=[{"name": "p"}])
    failed = ServiceCatalog(error="image ghost:none not found", reason="image_not_found")
    kept = relearned(before, failed)
    catalog = Catalog({"time": kept})
    assert catalog.tool("time__now") is not None
    assert catalog.prompt("time__p") is not None
    assert catalog.errors() == {"time": "image ghost:none not found"}
    assert catalog.unavailable() == {
        "time": {"reason": "image_not_found", "detail": "image ghost:none not found"}
    }
    # Learned again later: the fresh offer, and nothing of the failure.
    fresh = service_catalog(tools=[{"name": "later"}])
    assert relearned(kept, fresh) == fresh
    # Never learned before: the failure alone.
    assert relearned(None, failed) == failed
    assert relearned(ServiceCatalog(error="not learned yet"), failed) == failed


def test_a_service_not_learned_yet_is_not_marked_unavailable() -> None:
    catalog = Catalog(
        {
            "pending": ServiceCatalog(error="not learned yet"),
            "ghost": ServiceCatalog(error="no such image", reason="image_not_found"),
            "time": service_catalog(tools=[{"name": "now"}]),
        }
    )
    assert list(catalog.unavailable()) == ["ghost"]


def test_a_name_addresses_an_unlearned_service_but_no_unknown_tool_of_a_learned_one() -> None:
    catalog = Catalog(
        {
            "ghost": ServiceCatalog(error="no such image", reason="image_not_found"),
            "pending": ServiceCatalog(error="not learned yet"),
            "time": service_catalog(tools=[{"name": "now"}]),
        }
    )
    assert catalog.addressed("ghost__anything") == ("ghost", "anything")
    assert catalog.addressed("ghost__a__b") == ("ghost", "a__b")
    assert catalog.addressed("pending__x") == ("pending", "x")
    # A learned service's tool that it does not have stays unknown; so does a name that
    # addresses no service of the suite, or no tool.
    assert catalog.addressed("time__nope") is None
    assert catalog.addressed("nobody__x") is None
    assert catalog.addressed("ghost__") is None
    assert catalog.addressed("ghost") is None
