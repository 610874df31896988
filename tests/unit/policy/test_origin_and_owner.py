from __future__ import annotations

import os
from pathlib import Path

import pytest

from reactor_fabric.policy.container_parts.ownership import (
    LABEL_INSTANCE,
    LABEL_OWNER_HOST,
    LABEL_OWNER_PID,
    LABEL_OWNER_START,
    LABEL_SESSION,
)
from reactor_fabric.policy.origins import normalise_origins, origin_allowed
from reactor_fabric.policy.owner import owner_is_gone, process_start_time
from reactor_fabric.runtime.base import ManagedContainer
from reactor_fabric.trio.sweeper import OWN_GRACE_SECONDS, containers_to_remove


@pytest.mark.parametrize(
    "origin",
    [
        None,
        "http://localhost",
        "http://localhost:3000",
        "https://127.0.0.1:8443",
        "http://[::1]:9000",
        "HTTP://LOCALHOST",
    ],
)
def test_missing_and_loopback_origins_are_allowed(origin: str | None) -> None:
    assert origin_allowed(origin, frozenset())


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "http://localhost.evil.example",
        "null",
        "file://",
        "http://127.0.0.2",
        "http://localhost:99999",
        "ws://localhost",
    ],
)
def test_other_origins_are_refused(origin: str) -> None:
    assert not origin_allowed(origin, frozenset())


def test_listed_origins_are_allowed() -> None:
    allowed = normalise_origins(["https://App.Example.com/"])
    assert origin_allowed("https://app.example.com", allowed)
    assert not origin_allowed("https://other.example.com", allowed)


def test_this_process_has_a_start_time_and_a_missing_pid_has_none() -> None:
    assert process_start_time(os.getpid())
    assert process_start_time(2**22 + 12345) is None


def test_a_weird_command_name_does_not_confuse_the_stat_parser(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    fields = " ".join(str(n) for n in range(3, 53))
    (tmp_path / "77" / "stat").write_text(f"77 (a ) b (c) {fields}\n")
    assert process_start_time(77, proc=tmp_path) == "22"


def labels(host: str = "h", pid: int = 10, start: str = "100") -> dict[str, str]:
    return {LABEL_OWNER_HOST: host, LABEL_OWNER_PID: str(pid), LABEL_OWNER_START: start}


def test_an_owner_on_this_host_is_gone_when_its_pid_is_gone_or_reused() -> None:
    assert owner_is_gone(labels(), this_host="h", start_time_of=lambda pid: None)
    assert owner_is_gone(labels(), this_host="h", start_time_of=lambda pid: "999")  # reused
    assert not owner_is_gone(labels(), this_host="h", start_time_of=lambda pid: "100")


def test_an_owner_on_another_host_is_never_judged_gone() -> None:
    assert not owner_is_gone(labels(host="other"), this_host="h", start_time_of=lambda pid: None)


def test_the_sweeper_removes_dead_owners_and_stale_own_containers_only() -> None:
    now = 10_000.0
    containers = [
        ManagedContainer("dead-owner", "a", {LABEL_INSTANCE: "old", **labels()}, now),
        ManagedContainer("live-owner", "b", {LABEL_INSTANCE: "other", **labels(pid=11)}, now),
        ManagedContainer("mine-live", "c", {LABEL_INSTANCE: "me", LABEL_SESSION: "s1"}, 1.0),
        ManagedContainer(
            "mine-young",
            "d",
            {LABEL_INSTANCE: "me", LABEL_SESSION: "s2"},
            now - OWN_GRACE_SECONDS + 5,
        ),
        ManagedContainer("mine-stale", "e", {LABEL_INSTANCE: "me", LABEL_SESSION: "s3"}, 1.0),
    ]
    doomed = containers_to_remove(
        containers,
        instance_id="me",
        this_host="h",
        live_sessions={"s1"},
        now=now,
        owner_gone=lambda labels, this_host: labels.get(LABEL_OWNER_PID) == "10",
    )
    assert doomed == [("dead-owner", "owner_gone"), ("mine-stale", "no_live_session")]
