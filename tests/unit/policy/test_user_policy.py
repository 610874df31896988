"""What a signed-in user may do: the entry that decides (their own, else their first group's,
else default), the fields it leaves to default and to the orchestrator, {user} in a mount
root (never a path elsewhere, whatever the name), and agents spending accounts."""

from __future__ import annotations

import pytest

from reactor_fabric.config.structs import Orchestrator, Service, UserEntry
from reactor_fabric.policy.principal import TOKEN_HOLDER, Principal
from reactor_fabric.policy.user_policy import Allowance, allowance_for

SERVICES = {
    "time": Service(image="t:1"),
    "git": Service(image="g:1"),
    "reviewer": Service(image="a:1", service_type="llm_agent", config={"account": "team"}),
    "auditor": Service(image="a:1", service_type="llm_agent", config={"account": "security"}),
}


def orchestrator(**users: UserEntry) -> Orchestrator:
    return Orchestrator(allowed_mount_roots=["/srv/projects"], max_sessions=64, users=users)


def allowance(orch: Orchestrator, user: str, *groups: str) -> Allowance:
    return allowance_for(orch, SERVICES, Principal(user, groups))


def test_the_tokens_holder_may_do_everything() -> None:
    orch = orchestrator(default=UserEntry(services=["time"], max_sessions=1))
    assert allowance_for(orch, SERVICES, TOKEN_HOLDER) == Allowance(("/srv/projects",))


def test_without_entries_a_user_gets_the_orchestrators_roots_and_every_service() -> None:
    assert allowance(orchestrator(), "alice") == Allowance(("/srv/projects",))


def test_the_users_own_entry_wins_over_groups_and_default() -> None:
    orch = orchestrator(
        default=UserEntry(services=["time"], max_sessions=2, calls_per_minute=60),
        **{
            "group:team-a": UserEntry(services=["time", "git"]),
            "group:ops": UserEntry(services=["git"], max_sessions=20),
            "alice": UserEntry(max_sessions=5),
        },
    )
    alice = allowance(orch, "alice", "team-a")
    # Her entry sets max_sessions; services and the rate are default's (not her group's).
    assert (alice.entry, alice.services, alice.max_sessions, alice.calls_per_minute) == (
        "alice",
        frozenset({"time"}),
        5,
        60,
    )
    # Bob has no entry: his first group in the suite's order decides.
    bob = allowance(orch, "bob", "ops", "team-a")
    assert (bob.entry, bob.max_sessions) == ("group:team-a", 2)
    assert bob.services == frozenset({"time", "git"})
    carol = allowance(orch, "carol", "elsewhere")
    assert (carol.entry, carol.services) == ("default", frozenset({"time"}))


def test_names_that_look_like_entry_keys_are_never_taken_for_them() -> None:
    orch = orchestrator(
        default=UserEntry(services=["time"]),
        **{"group:ops": UserEntry(services=["git"])},
    )
    # A user whose name is "group:ops" is not the group's members' entry.
    assert allowance(orch, "group:ops").services == frozenset({"time"})
    assert allowance(orch, "default").entry == "default"


def test_user_in_a_mount_root_is_the_users_name() -> None:
    orch = orchestrator(default=UserEntry(allowed_mount_roots=["/home/{user}/", "/shared"]))
    assert allowance(orch, "alice").mount_roots == ("/home/alice/", "/shared")
    assert allowance(orch, "alice.smith@example.com").mount_roots == (
        "/home/alice.smith@example.com/",
        "/shared",
    )


@pytest.mark.parametrize(
    "name",
    [
        "..",
        ".",
        "../bob",
        "bob/../../etc",
        "a/b",
        "x\x00y",
        "tab\there",
        ".hidden",
        "é" * 3,
        "x" * 129,
    ],
)
def test_a_name_that_is_not_a_plain_path_component_makes_user_roots_allow_nothing(
    name: str,
) -> None:
    orch = orchestrator(default=UserEntry(allowed_mount_roots=["/home/{user}", "/shared"]))
    assert allowance(orch, name).mount_roots == ("/shared",)


def test_an_agent_spending_an_account_the_user_may_not_is_not_theirs() -> None:
    orch = orchestrator(default=UserEntry(accounts=["team"]))
    assert allowance(orch, "alice").services == frozenset({"time", "git", "reviewer"})
    both = orchestrator(default=UserEntry(services=["time", "auditor"], accounts=["team"]))
    assert allowance(both, "alice").services == frozenset({"time"})
    assert allowance(both, "alice").may_use("time")
    assert not allowance(both, "alice").may_use("auditor")
