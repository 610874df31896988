"""End to end, MCP 2026-07-28's multi-round-trip calls on the relay (``/mcp/{service}``) under
``fresh_per_call``: a server that answers ``input_required`` gets the client's retry in the same
container, however fresh the service's containers otherwise are.

The server (``images/asking``) keeps what it asked in its process's memory, so a retry that
reached a fresh container would be refused by it; the client is the Python SDK 2.x on a keyed
URL (stateless), answering the question through its elicitation callback.
"""

from __future__ import annotations

import docker
import pytest

from tests.integration.harness import (
    Orchestrator,
    build_test_image,
    containers_of,
    orchestrator_fixture,
    python2_client,
    text_of,
    wait_until,
)
from tests.integration.test_observability_e2e import calls_in, records_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def asking_image() -> str:
    return build_test_image("asking")


fabric = orchestrator_fixture(
    roots="home",
    given=lambda asking_image: {
        "test_services": {
            "asking": {"image": asking_image, "container_strategy": "fresh_per_call"},
        }
    },
)


def test_a_per_call_relay_keeps_the_container_that_asked_for_input_for_the_clients_retry(
    fabric: Orchestrator, docker_client: docker.DockerClient
) -> None:
    client = python2_client(f"{fabric.http_url}/mcp/asking/agent-7", "auto", "--elicit", "Ada")
    try:
        assert client.ask({"op": "initialize"})["protocol"] == "2026-07-28"
        for _ in range(2):
            answer = client.ask({"op": "call", "name": "ask_name", "arguments": {}})
            assert answer["ok"], answer
            assert text_of(answer).startswith("Hello Ada (asked and answered in process")
        assert client.ask({"op": "heard"})["elicitations"] == ["What is your name?"] * 2
        # (The trail is written as containers go: a slow engine's removal comes later.)
        wait_until(
            lambda: any(r.get("service") == "asking" for r in fabric.audit()),
            what="the session's first record",
        )
        [session] = {r["session"] for r in fabric.audit() if r.get("service") == "asking"}
        wait_until(lambda: len(calls_in(records_of(fabric, session))) == 4, what="four calls")
        calls = calls_in(records_of(fabric, session))
        # Each call and its retry in one container; the next call in a fresh one.
        first, retry, second, second_retry = (call["container"] for call in calls)
        assert first == retry != second == second_retry
        wait_until(
            lambda: containers_of(docker_client, session=session) == [],
            what="both containers removed after their calls",
        )
    finally:
        client.close()
