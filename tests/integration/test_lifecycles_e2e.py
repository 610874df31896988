"""Container lifecycles on the relay (``/mcp/{service}``), on the real engine with the MCP
Python SDK 1.x over WebSocket: ``fresh_per_call`` runs each call in a container of its own
(served by the warm pool), ``smart_refresh`` replaces the container after its calls or its age,
the client seeing no error either way.

Which container served a call is read from the audit trail (its ``tool_call`` records name the
container); that it is gone, from the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.harness import (
    Orchestrator,
    build_test_image,
    orchestrator,
    orchestrator_fixture,
    python_client,
    text_of,
    wait_until,
    write_suite,
)
from tests.integration.test_fabric_lifecycles_e2e import api_session
from tests.integration.test_observability_e2e import calls_in, ended, records_of
from tests.integration.test_warm_pool_e2e import ready, wait_for_pool

pytestmark = pytest.mark.integration

MARKER = "/tmp/written-by-an-earlier-call.txt"


@pytest.fixture(scope="module")
def allocating_image() -> str:
    return build_test_image("allocating")


fabric = orchestrator_fixture(
    roots="home",
    # A server whose allocate tool makes it hold that many MiB more, until it ends.
    given=lambda allocating_image: {
        "test_services": {
            "allocating": {
                "image": allocating_image,
                "container_strategy": "smart_refresh",
                "memory_threshold": "32m",
            }
        }
    },
    service_fields={
        # The filesystem server allowed /tmp (the container's own, not a mount).
        "filesystem": {"container_strategy": "fresh_per_call", "command": ["/tmp"], "warm": 1},
        "time": {"container_strategy": "smart_refresh", "max_calls_per_container": 2},
        "everything": {"container_strategy": "smart_refresh", "max_container_age": "2s"},
    },
)


def gone(client: docker.DockerClient, container: str) -> bool:
    # Sparse: a full listing inspects each container it found, and one removed in between
    # (this one, being removed) raises NotFound.
    return client.containers.list(all=True, sparse=True, filters={"id": container}) == []


def served(fabric: Orchestrator, session: str, count: int) -> list[str]:
    """The containers that served the session's first ``count`` tool calls, in order."""
    wait_until(lambda: len(calls_in(records_of(fabric, session))) >= count, what=f"{count} calls")
    return [call["container"] for call in calls_in(records_of(fabric, session))][:count]


def stop_reasons(records: list[dict[str, Any]]) -> dict[str, str]:
    return {r["container"]: r["reason"] for r in records if r["event"] == "container_stop"}


def test_five_calls_to_a_per_call_service_run_in_five_pooled_containers_each_gone_after_it(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/filesystem", "--register", "[]")
    containers: list[str] = []
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        for n in range(5):
            wait_for_pool(fabric, "filesystem", 1)
            if n == 0:
                arguments = {"path": MARKER, "content": "from the first call"}
                answer = client.ask({"op": "call", "name": "write_file", "arguments": arguments})
                assert answer["ok"], answer
            else:
                arguments = {"path": MARKER}
                answer = client.ask(
                    {"op": "call", "name": "read_text_file", "arguments": arguments}
                )
                # Not there: the file was written in another container, gone since.
                assert not answer["ok"], answer
                assert "ENOENT" in text_of(answer), answer
            [*_, container] = served(fabric, session, n + 1)
            containers.append(container)
            wait_until(lambda: gone(docker_client, container), what="its container gone")  # noqa: B023
        # /api/sessions shows which container served which request: each its own (the SDK's
        # tools/list after the first call too), ended after its one request.
        shown = api_session(fabric, session)["recent_containers"]
        assert {(c["state"], c["stop_reason"], c["calls"]) for c in shown} == {
            ("ended", "call_done", 1)
        }, shown
        calls = [c for c in shown if c["recent_calls"][0]["method"] == "tools/call"]
        assert [c["recent_calls"][0]["name"] for c in calls] == ["write_file"] + [
            "read_text_file"
        ] * 4
        assert len({c["container"] for c in calls}) == 5
    finally:
        assert client.close() == 0
    assert len(set(containers)) == 5
    records = ended(fabric, session)
    reasons = stop_reasons(records)
    assert [reasons[c] for c in containers] == ["call_done"] * 5
    starts = {r["container"]: r for r in records if r["event"] == "container_start"}
    # The handshake's container was the pool's, and so was every fresh one.
    assert [starts[c]["pooled"] for c in containers] == [True] * 5
    assert [starts[c]["respawn"] for c in containers] == [False] + [True] * 4
    # Nothing leaks: the session's containers are gone. The pool refilled at the rate it was
    # consumed: as many ready as the session took within its window (six: the five calls and
    # the SDK's tools/list), where warm: 1 would leave the next calls to find it empty.
    for container in starts:
        assert gone(docker_client, container)
    assert all(start["pooled"] for start in starts.values())
    wait_for_pool(fabric, "filesystem", len(starts))
    assert ready(fabric)["filesystem"] == len(starts) == 6


def test_smart_refresh_replaces_the_container_after_its_calls_the_client_seeing_no_error(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/time", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        for _ in range(5):
            answer = client.ask(
                {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
            )
            assert answer["ok"], answer
        containers = served(fabric, session, 5)
    finally:
        assert client.close() == 0
    first, second, third = containers[0], containers[2], containers[4]
    assert containers == [first, first, second, second, third]
    assert len({first, second, third}) == 3
    reasons = stop_reasons(ended(fabric, session))
    assert (reasons[first], reasons[second]) == ("refresh_calls", "refresh_calls")
    assert all(gone(docker_client, c) for c in containers)


def test_smart_refresh_replaces_a_container_older_than_its_age_the_client_seeing_no_error(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python_client(f"{fabric.ws_url}/mcp/everything", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        call = {"op": "call", "name": "echo", "arguments": {"message": "one"}}
        assert client.ask(call)["ok"]
        [old] = served(fabric, session, 1)
        # Between calls, once older than its max_container_age, it goes on its own...
        wait_until(lambda: gone(docker_client, old), what="the old container replaced")
        answer = client.ask({**call, "arguments": {"message": "two"}})
        assert answer["ok"], answer  # ...and the next call is served by a fresh one
        assert "two" in text_of(answer)
        _, new = served(fabric, session, 2)
    finally:
        assert client.close() == 0
    assert new != old
    assert stop_reasons(ended(fabric, session))[old] == "refresh_age"


def test_smart_refresh_replaces_a_container_over_its_memory_threshold_before_the_next_call(
    tmp_path: Path,
) -> None:
    # The Python time server uses far more than the smallest threshold the suite takes (6 MiB):
    # the engine's reading after each call is over.
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path)],
        service_fields={"time": {"container_strategy": "smart_refresh", "memory_threshold": "6m"}},
    )
    with orchestrator(suite, tmp_path / "orchestrator.log") as fabric:
        client = python_client(f"{fabric.ws_url}/mcp/time", "--register", "[]")
        try:
            session = client.read_json()["result"]["sessionId"]
            assert client.ask({"op": "initialize"})["ok"]
            for _ in range(3):
                answer = client.ask(
                    {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
                )
                assert answer["ok"], answer
            containers = served(fabric, session, 3)
        finally:
            assert client.close() == 0
        assert len(set(containers)) == 3
        reasons = stop_reasons(ended(fabric, session))
        assert [reasons[c] for c in containers[:2]] == ["refresh_memory"] * 2


def test_under_gvisor_the_memory_figure_is_the_sandboxs_and_still_refreshes_the_container(
    tmp_path: Path, allocating_image: str, docker_client: docker.DockerClient
) -> None:
    # Under gVisor the engine's figure is the whole sandbox's (its kernel's own memory too,
    # about 12 MiB more here): under the 48 MiB threshold at rest, over it once the server
    # holds 64 MiB more, and the next call gets a fresh container, as under runc.
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path)],
        test_services={
            "allocating": {
                "image": allocating_image,
                "container_strategy": "smart_refresh",
                "memory_threshold": "48m",
                "isolation": "gvisor",
            }
        },
    )
    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        client = python_client(f"{running.ws_url}/mcp/allocating", "--register", "[]")
        texts, kernels = [], []
        try:
            session = client.read_json()["result"]["sessionId"]
            assert client.ask({"op": "initialize"})["ok"]
            for count, mb in enumerate((0, 0, 64, 0), start=1):
                answer = client.ask({"op": "call", "name": "allocate", "arguments": {"mb": mb}})
                assert answer["ok"], answer
                texts.append(text_of(answer))
                if mb == 0:
                    # The container a call took over its threshold is being stopped as the
                    # answer arrives (the engine then reports no process for it), so only a
                    # container that stays is looked at, by the name the orchestrator gave it.
                    kernels.append(sandboxed(docker_client, served(running, session, count)[-1]))
            containers = served(running, session, 4)
        finally:
            assert client.close() == 0
        reasons = stop_reasons(ended(running, session))
    assert texts == ["holding 0 MiB", "holding 0 MiB", "holding 64 MiB", "holding 0 MiB"]
    assert kernels == [True] * 3
    old, new = containers[0], containers[3]
    assert containers == [old, old, old, new]
    assert reasons[old] == "refresh_memory"


def sandboxed(client: docker.DockerClient, container: str) -> bool:
    """Whether a running container runs in a gVisor sandbox, as the host sees it: its first
    process is runsc's sandbox."""
    pid = int(client.api.inspect_container(container)["State"]["Pid"])
    assert pid > 0, f"{container} has no process"
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().split(b"\0", 1)[0] == b"runsc-sandbox"


def test_smart_refresh_replaces_a_container_once_a_call_took_it_over_its_memory_threshold(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    # Under its 32 MiB threshold the server keeps its container; a call that makes it hold
    # 64 MiB more is answered by it, and the next call is served by a fresh one.
    client = python_client(f"{fabric.ws_url}/mcp/allocating", "--register", "[]")
    texts = []
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        for mb in (0, 0, 64, 0):
            answer = client.ask({"op": "call", "name": "allocate", "arguments": {"mb": mb}})
            assert answer["ok"], answer
            texts.append(text_of(answer))
        containers = served(fabric, session, 4)
        old, new = containers[0], containers[3]
        wait_until(lambda: gone(docker_client, old), what="the container over its threshold gone")
    finally:
        assert client.close() == 0
    # The fresh container holds nothing: it is another process, its predecessor's memory gone.
    assert texts == ["holding 0 MiB", "holding 0 MiB", "holding 64 MiB", "holding 0 MiB"]
    assert containers == [old, old, old, new]
    assert new != old
    assert stop_reasons(ended(fabric, session))[old] == "refresh_memory"
