"""The fake API server's NetworkPolicies on the real engine: served as the API serves them, and
enforced by its kubelet as a CNI would (tests/kube_fake/network_policies.py) — a pod an egress
policy selects reaches the policy's ip:port and nothing else; a pod none selects has no network
at all, as before."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest
import trio

from tests.integration.harness import bridge_gateway, engine_is_podman
from tests.integration.test_kube_fake import create, manifest, phase, running, wait_for

pytestmark = pytest.mark.integration

NETWORKING = "networking.k8s.io/v1"
# Connects to each port of the host's bridge gateway given, prints what happened, ends.
SCRIPT = """
import json, socket, sys
host, found = sys.argv[1], {}
for port in sys.argv[2:]:
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        found[port] = "connected"
    except OSError as exc:
        found[port] = type(exc).__name__
print(json.dumps(found), flush=True)
"""


def policy(name: str, cidr: str, port: int, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": NETWORKING,
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": {"app": "kube-fake-test"}},
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress", "Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": port}]}
            ],
        },
    }


async def call(api: Any, method: str, url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    async with api.call_api(
        method, version=NETWORKING, namespace="default", url=url, raise_for_status=False, **kwargs
    ) as response:
        return response.status_code, response.json()


async def listening() -> tuple[list[trio.SocketListener], int]:
    listeners = await trio.open_tcp_listeners(0, host="0.0.0.0")
    return listeners, listeners[0].socket.getsockname()[1]


async def accept_and_close(stream: trio.SocketStream) -> None:
    await stream.aclose()


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as opened:
        yield opened
        opened.cancel_scope.cancel()


def gateway(docker_client: docker.DockerClient) -> str:
    return bridge_gateway(docker_client)


async def test_network_policies_are_created_listed_got_and_deleted_as_the_api_serves_them(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        status, created = await call(
            api, "POST", "networkpolicies", json=policy("p", "10.0.0.1/32", 80, a="b")
        )
        assert status == 201
        assert created["metadata"]["uid"]
        status, _ = await call(api, "POST", "networkpolicies", json=policy("p", "10.0.0.1/32", 80))
        assert status == 409
        bad = policy("q", "10.0.0.1/33", 80)
        status, refused = await call(api, "POST", "networkpolicies", json=bad)
        assert (status, refused["reason"]) == (422, "Invalid")
        status, listed = await call(
            api, "GET", "networkpolicies", params={"labelSelector": "app=kube-fake-test"}
        )
        assert (status, [item["metadata"]["name"] for item in listed["items"]]) == (200, ["p"])
        assert (await call(api, "GET", "networkpolicies/p"))[0] == 200
        assert (await call(api, "DELETE", "networkpolicies/p"))[0] == 200
        assert (await call(api, "GET", "networkpolicies/p"))[0] == 404
        assert (await call(api, "DELETE", "networkpolicies/p"))[0] == 404


async def test_a_pod_an_egress_policy_selects_reaches_its_ip_and_port_and_nothing_else(
    tmp_path: Path, docker_client: docker.DockerClient, nursery: trio.Nursery
) -> None:
    if engine_is_podman(docker_client):
        # Known gap of the fake's kubelet: on Podman its holder container (the pod's network
        # namespace) is refused removal while the pod's container still exists ("has dependent
        # containers"); the product's Kubernetes egress is tested on Docker.
        pytest.skip("the fake kubelet's network holder is not removable on Podman yet")
    allowed_listeners, allowed = await listening()
    other_listeners, other = await listening()
    nursery.start_soon(trio.serve_listeners, accept_and_close, allowed_listeners)
    nursery.start_soon(trio.serve_listeners, accept_and_close, other_listeners)
    host = gateway(docker_client)
    async with running(tmp_path, docker_client) as (fake, api):
        status, _ = await call(
            api,
            "POST",
            "networkpolicies",
            json=policy("limited", f"{host}/32", allowed, pod="limited"),
        )
        assert status == 201
        command = ["/opt/mcp/bin/python3", "-c", SCRIPT, host, str(allowed), str(other)]
        await create(api, manifest("limited", command=command, labels={"pod": "limited"}))
        await create(api, manifest("unlimited", command=command, labels={"pod": "other"}))
        for name in ("limited", "unlimited"):
            await wait_for(api, name, phase("Succeeded"))
        outcome = {}
        for name in ("limited", "unlimited"):
            container_id = fake.pods[name].container_id
            assert container_id is not None
            logs = docker_client.api.logs(container_id, stdout=True, stderr=False)
            outcome[name] = json.loads(logs.decode().strip().splitlines()[-1])
            mode = docker_client.api.inspect_container(container_id)["HostConfig"]["NetworkMode"]
            outcome[name]["mode"] = mode.split(":")[0]
        assert outcome["limited"][str(allowed)] == "connected"
        assert outcome["limited"][str(other)] != "connected"
        assert outcome["limited"]["mode"] == "container"  # the holder's namespace
        assert outcome["unlimited"]["mode"] == "none"
        assert "connected" not in (
            outcome["unlimited"][str(allowed)],
            outcome["unlimited"][str(other)],
        )
