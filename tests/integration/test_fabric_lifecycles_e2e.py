"""End to end, container lifecycles on the fabric endpoint ``/mcp``: the real orchestrator and
engine, the bundled servers, the Python SDK 2.x as the client.

``everything`` runs ``fresh_per_call`` (a container of its own for every call, removed when the
call ends), ``time`` runs ``smart_refresh`` with ``max_calls_per_container: 2``, and
``allocating`` (a test server whose ``allocate`` tool makes it hold memory) ``smart_refresh``
with ``memory_threshold: 32m``, and ``aging`` (the same server) ``smart_refresh`` with
``max_container_age: 2s``.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.harness import (
    BUNDLED,
    LineProcess,
    Orchestrator,
    build_test_image,
    containers_of,
    orchestrator,
    orchestrator_fixture,
    python2_client,
    text_of,
    wait_until,
    write_suite,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def allocating_image() -> str:
    return build_test_image("allocating")


def refreshed_services(allocating_image: str) -> dict[str, Any]:
    refreshed = {"image": allocating_image, "container_strategy": "smart_refresh"}
    return {
        "test_services": {
            "allocating": {**refreshed, "memory_threshold": "32m"},
            "aging": {**refreshed, "max_container_age": "2s"},
        }
    }


fabric = orchestrator_fixture(
    scope="module",
    given=refreshed_services,
    service_fields={
        "everything": {"container_strategy": "fresh_per_call"},
        "time": {"container_strategy": "smart_refresh", "max_calls_per_container": 2},
    },
)


def opened(fabric: Orchestrator) -> tuple[LineProcess, str]:
    """An initialized SDK 2.x session of ``/mcp`` (every tool listed) and its session id."""
    client = python2_client(f"{fabric.http_url}/mcp?tools=all", "legacy")
    assert client.ask({"op": "initialize"})["server"] == "reactor-fabric"
    status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
    assert status["ok"], status
    return client, str(status["structured"]["session_id"])


def running(docker_client: docker.DockerClient, session: str, service: str) -> list[Any]:
    return [
        c
        for c in containers_of(docker_client, session=session, service=service)
        if c.status in ("created", "running")
    ]


def records(fabric: Orchestrator, session: str, event: str, service: str) -> list[dict[str, Any]]:
    return [
        r
        for r in fabric.audit()
        if r.get("event") == event and r.get("session") == session and r.get("service") == service
    ]


def api_session(fabric: Orchestrator, session: str) -> dict[str, Any]:
    """The session as the operators' ``/api/sessions`` shows it."""
    request = urllib.request.Request(f"{fabric.http_url}/api/sessions", headers=fabric.auth_header)
    with urllib.request.urlopen(request, timeout=30) as response:
        sessions = json.load(response)["sessions"]
    [shown] = [s for s in sessions if s["id"] == session]
    return dict(shown)


def per_call_shown(containers: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """Each container of ``everything`` shown: its name, stop reason and the call it served."""
    shown = []
    for c in containers:
        if c["server"] == "everything":
            [served] = c["recent_calls"]
            shown.append((c["container"], c["stop_reason"], (served["name"], served["method"])))
    return shown


def test_five_calls_to_a_per_call_service_run_in_five_containers_each_gone_after_its_call(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client, session = opened(fabric)
    try:
        for n in range(5):
            echo = {"op": "call", "name": "everything__echo", "arguments": {"message": f"m{n}"}}
            answer = client.ask(echo)
            assert answer["ok"], answer
            assert text_of(answer) == f"Echo: m{n}"
            # Removed once its call is over, before the next call.
            wait_until(
                lambda: running(docker_client, session, "everything") == [],
                what=f"call {n}'s container removed",
            )
        wait_until(
            lambda: len(records(fabric, session, "container_stop", "everything")) == 5,
            what="five container_stop records",
        )
        calls = records(fabric, session, "tool_call", "everything")
        served_by = [r["container"] for r in calls]
        assert len(served_by) == 5
        assert len(set(served_by)) == 5, served_by  # five distinct containers
        starts = records(fabric, session, "container_start", "everything")
        assert sorted(r["container"] for r in starts) == sorted(served_by)
        assert not any(r["respawn"] for r in starts)
        stops = records(fabric, session, "container_stop", "everything")
        assert {r["reason"] for r in stops} == {"call_done"}
        # get_status and /api/sessions show which container served which call: five
        # distinct containers, each ended after its one echo call.
        status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
        from_status = per_call_shown(status["structured"]["recent_containers"])
        from_api = per_call_shown(api_session(fabric, session)["recent_containers"])
        for shown in (from_status, from_api):
            assert len(shown) == 5, shown
            assert len({name for name, _, _ in shown}) == 5, shown
            assert all(name.startswith("rf-everything-") for name, _, _ in shown), shown
            assert {(reason, call) for _, reason, call in shown} == {
                ("call_done", ("echo", "tools/call"))
            }
    finally:
        client.close()
    wait_until(lambda: containers_of(docker_client, session=session) == [], what="no leftovers")


def test_two_concurrent_calls_to_a_per_call_service_run_in_two_containers_at_once(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client, session = opened(fabric)
    try:
        slow = {
            "name": "everything__trigger-long-running-operation",
            "arguments": {"duration": 4, "steps": 4},
        }
        client.send({"op": "call_many", "calls": [slow, slow]})
        wait_until(
            lambda: len(running(docker_client, session, "everything")) == 2,
            what="two containers at once",
        )
        answer = client.read_json()
        assert answer["ok"], answer
        assert [r["ok"] for r in answer["results"]] == [True, True], answer
        wait_until(
            lambda: running(docker_client, session, "everything") == [],
            what="both removed after their calls",
        )
        wait_until(
            lambda: len(records(fabric, session, "tool_call", "everything")) == 2,
            what="two tool_call records",
        )
        served_by = {r["container"] for r in records(fabric, session, "tool_call", "everything")}
        assert len(served_by) == 2
    finally:
        client.close()
    wait_until(lambda: containers_of(docker_client, session=session) == [], what="no leftovers")


def test_a_smart_refresh_container_is_replaced_after_its_calls_and_the_client_sees_no_error(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client, session = opened(fabric)
    try:
        for _ in range(3):
            answer = client.ask(
                {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
            )
            assert answer["ok"], answer
            assert '"timezone": "UTC"' in text_of(answer)
        wait_until(
            lambda: len(records(fabric, session, "tool_call", "time")) == 3,
            what="three tool_call records",
        )
        first, second, third = (
            r["container"] for r in records(fabric, session, "tool_call", "time")
        )
        assert first == second != third  # replaced after its two calls
        wait_until(
            lambda: (
                [r["container"] for r in records(fabric, session, "container_stop", "time")]
                == [first]
            ),
            what="the first container removed",
        )
        [stop] = records(fabric, session, "container_stop", "time")
        assert stop["reason"] == "refresh_calls"
        assert [c.id[:12] for c in running(docker_client, session, "time")] == [third]
    finally:
        client.close()
    wait_until(lambda: containers_of(docker_client, session=session) == [], what="no leftovers")


def test_a_smart_refresh_container_a_call_took_over_its_memory_threshold_serves_no_next_call(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client, session = opened(fabric)
    texts = []
    try:
        # Under its threshold it is kept; a call makes it hold 64 MiB more (it answers it), and
        # the next call is served by a fresh container, the client seeing no error.
        for mb in (0, 0, 64, 0):
            call = {"op": "call", "name": "allocating__allocate", "arguments": {"mb": mb}}
            answer = client.ask(call)
            assert answer["ok"], answer
            texts.append(text_of(answer))
        assert texts == ["holding 0 MiB", "holding 0 MiB", "holding 64 MiB", "holding 0 MiB"]
        wait_until(
            lambda: len(records(fabric, session, "tool_call", "allocating")) == 4,
            what="four tool_call records",
        )
        served_by = [r["container"] for r in records(fabric, session, "tool_call", "allocating")]
        old, new = served_by[0], served_by[3]
        assert served_by == [old, old, old, new]
        assert new != old
        wait_until(
            lambda: (
                [r["container"] for r in records(fabric, session, "container_stop", "allocating")]
                == [old]
            ),
            what="the container over its threshold removed",
        )
        [stop] = records(fabric, session, "container_stop", "allocating")
        assert stop["reason"] == "refresh_memory"
        assert [c.id[:12] for c in running(docker_client, session, "allocating")] == [new]
    finally:
        client.close()
    wait_until(lambda: containers_of(docker_client, session=session) == [], what="no leftovers")


def test_an_idle_smart_refresh_container_goes_at_its_age_and_the_next_call_gets_a_fresh_one(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client, session = opened(fabric)
    call = {"op": "call", "name": "aging__allocate", "arguments": {"mb": 0}}
    try:
        assert client.ask(call)["ok"]
        # Between calls, once older than its max_container_age, it goes on its own (nothing
        # else happens in the session meanwhile)...
        wait_until(
            lambda: len(records(fabric, session, "container_stop", "aging")) == 1,
            what="the container removed at its age",
        )
        [stop] = records(fabric, session, "container_stop", "aging")
        assert stop["reason"] == "refresh_age"
        assert running(docker_client, session, "aging") == []
        answer = client.ask(call)  # ...and the next call is served by a fresh one
        assert answer["ok"], answer
        wait_until(
            lambda: len(records(fabric, session, "tool_call", "aging")) == 2,
            what="two tool_call records",
        )
        first, second = (r["container"] for r in records(fabric, session, "tool_call", "aging"))
        assert stop["container"] == first != second
    finally:
        client.close()
    wait_until(lambda: containers_of(docker_client, session=session) == [], what="no leftovers")


def test_a_per_call_service_with_a_warm_pool_serves_each_call_in_a_pooled_container_greeted_before(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    (tmp_path / "projects").mkdir()
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path / "projects")],
        service_fields={"time": {"container_strategy": "fresh_per_call", "warm": 2}},
    )
    with orchestrator(suite, tmp_path / "orchestrator.log") as running_fabric:
        client, session = opened(running_fabric)
        call = {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        try:
            # The first call takes a container the pool has not greeted (no fabric session
            # asked yet) and greets it itself; from then on the pool's refills are greeted.
            assert client.ask(call)["ok"]
            for n in range(3):
                # A greeted container waits (the pool refills behind each call).
                wait_until(
                    at_least(running_fabric, "pooled_container_greeted", n + 1),
                    what=f"{n + 1} pooled containers greeted",
                )
                answer = client.ask(call)
                assert answer["ok"], answer
            wait_until(
                lambda: len(records(running_fabric, session, "container_stop", "time")) == 4,
                what="four container_stop records",
            )
            starts = records(running_fabric, session, "container_start", "time")
            assert len({r["container"] for r in starts}) == 4
            assert all(r["pooled"] for r in starts), starts
            assert [r["call"]["name"] for r in starts] == ["get_current_time"] * 4
            # No handshake at the three calls after the first: the pool had greeted them.
            mine = [e for e in running_fabric.logs() if e.get("session") == session]
            skipped = [e for e in mine if e["event"] == "backend_greeted_by_pool"]
            assert len(skipped) == 3
            started = [e for e in mine if e["event"] == "container_started"]
            assert [e["greeted"] for e in started] == [False, True, True, True]
            assert not [e for e in running_fabric.logs() if e["event"] == "pooled_greeting_failed"]
        finally:
            client.close()
        wait_until(lambda: containers_of(docker_client, session=session) == [], what="no leftovers")


def at_least(fabric: Orchestrator, event: str, count: int) -> Callable[[], bool]:
    """Whether the orchestrator has logged ``event`` ``count`` times or more."""

    def logged() -> bool:
        return sum(1 for e in fabric.logs() if e["event"] == event) >= count

    return logged


def test_a_stateless_client_on_a_keyed_url_gets_a_fresh_container_for_every_call(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    # MCP 2026-07-28: no initialize, no session id; the keyed URL names the session.
    client = python2_client(f"{fabric.http_url}/mcp/fabric/per-call-agent?tools=all", "auto")
    try:
        assert client.ask({"op": "initialize"})["protocol"] == "2026-07-28"
        status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
        session = str(status["structured"]["session_id"])
        for n in range(5):
            echo = {"op": "call", "name": "everything__echo", "arguments": {"message": f"s{n}"}}
            answer = client.ask(echo)
            assert answer["ok"], answer
            assert text_of(answer) == f"Echo: s{n}"
        wait_until(
            lambda: len(records(fabric, session, "container_stop", "everything")) == 5,
            what="five container_stop records",
        )
        served_by = [r["container"] for r in records(fabric, session, "tool_call", "everything")]
        assert len(set(served_by)) == 5, served_by
        assert running(docker_client, session, "everything") == []
    finally:
        client.close()


def test_a_stateless_client_answers_a_per_call_servers_elicitation_through_input_required(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    # everything asks the client (elicitation/create) during the call: a 2026-07-28 client
    # gets input_required, answers through its elicitation callback, and its retry reaches the
    # container still waiting on the question.
    client = python2_client(
        f"{fabric.http_url}/mcp/fabric/eliciting-agent?tools=all", "auto", "--elicit", "Ada"
    )
    try:
        assert client.ask({"op": "initialize"})["protocol"] == "2026-07-28"
        status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
        session = str(status["structured"]["session_id"])
        answer = client.ask(
            {"op": "call", "name": "everything__trigger-elicitation-request", "arguments": {}}
        )
        assert answer["ok"], answer
        assert "- Name: Ada" in text_of(answer)
        heard = client.ask({"op": "heard"})["elicitations"]
        assert heard == ["Please provide inputs for the following fields:"]
        wait_until(
            lambda: len(records(fabric, session, "tool_call", "everything")) == 2,
            what="two tool_call records (the call, its retry)",
        )
        first, retry = records(fabric, session, "tool_call", "everything")
        assert first["outcome"] == "input_required"
        assert retry["outcome"] == "ok"
        assert first["container"] == retry["container"]  # the same container, still waiting
        # (the audit record is written once the container is removed: waited for, not read)
        wait_until(
            lambda: len(records(fabric, session, "container_stop", "everything")) == 1,
            what="its container removed after the call",
        )
        [stop] = records(fabric, session, "container_stop", "everything")
        assert stop["reason"] == "call_done"
        assert stop["container"] == first["container"]
        assert running(docker_client, session, "everything") == []
    finally:
        client.close()


def test_a_file_one_per_call_container_wrote_is_gone_for_the_next_call_unless_in_the_mount(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    project = tmp_path / "projects" / "kept"
    project.mkdir(parents=True)
    os.chown(project, 1000, 1000)  # a user's project: its server runs as its owner
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path / "projects")],
        service_fields={"filesystem": {"container_strategy": "fresh_per_call"}},
        # The same server given the container's own /tmp (the image's /workspace is not the
        # server's to write without a mount).
        test_services={
            "scratch": {
                "image": BUNDLED["mcp_services"]["filesystem"]["image"],
                "command": ["/tmp"],
                "container_strategy": "fresh_per_call",
            }
        },
    )

    def call(client: LineProcess, tool: str, **arguments: str) -> dict[str, Any]:
        return client.ask({"op": "call", "name": tool, "arguments": arguments})

    with orchestrator(suite, tmp_path / "orchestrator.log") as running_fabric:
        unmounted = python2_client(f"{running_fabric.http_url}/mcp?tools=all", "legacy")
        try:
            assert unmounted.ask({"op": "initialize"})["ok"]
            written = call(unmounted, "scratch__write_file", path="/tmp/a.txt", content="one")
            assert written["ok"], written
            read = call(unmounted, "scratch__read_text_file", path="/tmp/a.txt")
            # Written in the first call's container, removed since: the second one's /tmp is
            # the image's.
            assert not read["ok"], read
            assert "ENOENT" in text_of(read), read
        finally:
            unmounted.close()
        mounted = python2_client(
            f"{running_fabric.http_url}/mcp?tools=all&mount={project}:/workspace", "legacy"
        )
        try:
            assert mounted.ask({"op": "initialize"})["ok"]
            written = call(
                mounted, "filesystem__write_file", path="/workspace/note.txt", content="call one"
            )
            assert written["ok"], written
            read = call(mounted, "filesystem__read_text_file", path="/workspace/note.txt")
            assert read["ok"], read
            assert text_of(read) == "call one"  # in the mount: the project's, not a container's
        finally:
            mounted.close()
        assert (project / "note.txt").read_text() == "call one"

        def served() -> list[str]:
            return [
                r["container"]
                for r in running_fabric.audit()
                if r.get("event") == "tool_call" and r.get("service") in ("filesystem", "scratch")
            ]

        wait_until(lambda: len(served()) == 4, what="four tool_call records")
        assert len(set(served())) == 4  # four calls, four containers
        wait_until(
            lambda: (
                containers_of(docker_client, service="filesystem") == []
                and containers_of(docker_client, service="scratch") == []
            ),
            what="every per-call container removed",
        )
