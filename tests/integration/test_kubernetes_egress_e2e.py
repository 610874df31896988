"""Egress on Kubernetes, end to end: the real orchestrator with ``runtime: kubernetes`` and
``orchestrator.kubernetes.egress_proxy``, the fake API server of ``tests/kube_fake`` (whose
kubelet enforces NetworkPolicies as a CNI would), and the probe server in the pod.

The pod of a service with ``egress:`` reaches a listed destination on this host's loopback (the
orchestrator's: the proxy runs there) through the proxy at the orchestrator's address, named in
its environment with a token of its own; an unlisted one is refused 403; direct TCP goes
nowhere (its NetworkPolicy lets it reach the proxy alone). The policy exists while the pod runs
and goes with it; every connection is audited under the session."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import pytest
import trio
import yaml

from tests.integration.harness import (
    Orchestrator,
    bridge_up,
    build_test_image,
    orchestrator,
    wait_until,
)
from tests.integration.test_bounds_e2e import websocket
from tests.integration.test_kubernetes_e2e import (
    CLAIM,
    LABEL_MANAGED,
    LABEL_SERVICE,
    Cluster,
    fake_cluster_in_a_thread,
    kubernetes_suite,
)
from tests.messages import request

pytestmark = pytest.mark.integration


class Answering(BaseHTTPRequestHandler):
    name = "?"

    def do_GET(self) -> None:
        body = f"{self.name} answered {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def answering(name: str, host: str) -> Iterator[int]:
    handler = type(f"Answering{name}", (Answering,), {"name": name})
    server = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def listed() -> Iterator[int]:
    yield from answering("listed", "127.0.0.1")


@pytest.fixture
def unlisted() -> Iterator[int]:
    yield from answering("unlisted", "127.0.0.1")


@pytest.fixture
def everywhere() -> Iterator[int]:
    """A server on every interface of this host: the bridge's gateway too, where a pod with
    a route of its own would reach it."""
    yield from answering("everywhere", "0.0.0.0")


@pytest.fixture
def bridge(docker_client: docker.DockerClient) -> Iterator[str]:
    """The engine's bridge address, up on this host for the test (see harness.bridge_up)."""
    with bridge_up(docker_client) as address:
        yield address


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def network_policies(cluster: Cluster, **labels: str) -> list[dict[str, Any]]:
    assert cluster.fake is not None
    selector = ",".join(f"{k}={v}" for k, v in {LABEL_MANAGED: "true", **labels}.items())
    query = urllib.parse.urlencode({"labelSelector": selector})
    asked = urllib.request.Request(
        f"{cluster.fake.url}/apis/networking.k8s.io/v1/namespaces/{cluster.namespace}"
        f"/networkpolicies?{query}",
        headers={"Authorization": f"Bearer {cluster.fake.token}"},
    )
    with urllib.request.urlopen(asked, timeout=30) as response:
        found: list[dict[str, Any]] = json.load(response)["items"]
        return found


def test_a_pod_reaches_only_its_listed_destinations_through_the_orchestrators_proxy(
    tmp_path: Path,
    project_root: Path,
    docker_client: docker.DockerClient,
    listed: int,
    unlisted: int,
    everywhere: int,
    bridge: str,
) -> None:
    probe_image = build_test_image("probe")
    gateway = bridge
    port = free_port(gateway)
    with fake_cluster_in_a_thread({CLAIM: project_root}, tmp_path / "kubeconfig") as cluster:
        suite = kubernetes_suite(
            tmp_path,
            cluster,
            project_root,
            test_services={
                "probe": {"image": probe_image, "egress": [f"127.0.0.1:{listed}"]},
            },
        )
        # The proxy on the bridge's gateway, where the fake's pods reach this host.
        written = yaml.safe_load(suite.read_text())
        written["orchestrator"]["kubernetes"]["egress_proxy"] = {
            "listen": f"{gateway}:{port}",
            "address": f"{gateway}:{port}",
        }
        suite.write_text(yaml.safe_dump(written))

        async def ask(running: Orchestrator) -> dict[str, Any]:
            ws = await websocket(running, "/mcp/probe")
            asked = {
                "listed_http": ("fetch", {"url": f"http://127.0.0.1:{listed}/hello"}),
                "listed_tunnel": (
                    "tunnel",
                    {"host": "127.0.0.1", "port": listed, "send": "GET /t HTTP/1.0\r\n\r\n"},
                ),
                "unlisted": ("fetch", {"url": f"http://127.0.0.1:{unlisted}/"}),
                "direct_gateway": ("direct", {"host": gateway, "port": everywhere}),
                "direct_listed": ("direct", {"host": "127.0.0.1", "port": listed}),
            }
            seen: dict[str, Any] = {}
            for number, (key, (method, params)) in enumerate(asked.items(), start=1):
                await ws.send_json(request(number, method, params))
                seen[key] = (await ws.hear())["result"]
            # The session's pod and policy (the catalog's probe of the service may run meanwhile).
            seen["policies"] = [
                p
                for p in network_policies(cluster, **{LABEL_SERVICE: "probe"})
                if not p["metadata"]["name"].startswith("rf-catalog-")
            ]
            seen["pods"] = [
                p
                for p in cluster.pods(**{LABEL_SERVICE: "probe"})
                if not p["metadata"]["name"].startswith("rf-catalog-")
            ]
            await ws.aclose()
            return seen

        # What the orchestrator creates, in order, by name.
        created: list[tuple[str, str]] = []

        def record_creations(asked: Any) -> None:
            if asked.method == "POST" and asked.path.endswith(("/pods", "/networkpolicies")):
                name = json.loads(asked.body).get("metadata", {}).get("name", "")
                created.append((asked.path.rsplit("/", 1)[1], name))

        assert cluster.fake is not None
        cluster.fake.before_request = record_creations
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            seen = trio.run(ask, running)
            wait_until(
                lambda: sum(r["event"] == "egress" for r in running.audit()) >= 3,
                what="the egress records",
            )
            records = [r for r in running.audit() if r["event"] == "egress"]
            sessions = {r["session"] for r in running.audit() if r["event"] == "session_start"}
            wait_until(
                lambda: not network_policies(cluster, **{LABEL_SERVICE: "probe"}),
                what="the pod's NetworkPolicy to go with it",
            )
        assert cluster.fake is not None
        calls = [(method, target.split("?")[0]) for method, target, _ in cluster.fake.requests]

    # The proxy at the orchestrator's address, with the pod's token; nothing bypasses it.
    proxy_env = seen["listed_http"]["proxy_env"]
    proxy = urllib.parse.urlsplit(proxy_env["HTTPS_PROXY"])
    assert (proxy.hostname, proxy.port, proxy.username) == (gateway, port, "rf")
    assert proxy.password
    for name in ("HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
        assert proxy_env[name] == proxy_env["HTTPS_PROXY"]
    assert (proxy_env["NO_PROXY"], proxy_env["no_proxy"]) == ("", "")
    # Listed (the orchestrator's loopback): reached, forwarded and tunnelled.
    assert seen["listed_http"]["status"] == 200, seen["listed_http"]
    assert seen["listed_http"]["body"] == "listed answered /hello"
    assert seen["listed_tunnel"]["status"] == 200, seen["listed_tunnel"]
    assert seen["listed_tunnel"]["answer"].endswith("listed answered /t")
    assert seen["unlisted"]["status"] == 403
    assert seen["unlisted"]["reason"] == "egress_not_listed"
    # Past the proxy: nothing (the policy allows the proxy's port alone; loopback is the pod's).
    for key in ("direct_gateway", "direct_listed"):
        assert seen[key]["connected"] is False, (key, seen[key])

    # The pod's NetworkPolicy, while it ran: that pod alone, out to the proxy alone.
    [pod] = seen["pods"]
    [policy] = seen["policies"]
    assert policy["metadata"]["name"] == pod["metadata"]["name"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["egress"] == [
        {
            "to": [{"ipBlock": {"cidr": f"{gateway}/32"}}],
            "ports": [{"protocol": "TCP", "port": port}],
        }
    ]
    # Made before the pod, deleted after it.
    policies_url = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies"
    pods_url = "/api/v1/namespaces/default/pods"
    name = pod["metadata"]["name"]
    # (by name: the catalog's probe pods of the other services are created meanwhile)
    assert created.index(("networkpolicies", name)) < created.index(("pods", name)), created
    assert calls.index(("DELETE", f"{pods_url}/{name}")) < calls.index(
        ("DELETE", f"{policies_url}/{name}")
    )
    # The token is in the pod's environment, never in the log.
    log_text = (tmp_path / "orchestrator.log").read_text()
    assert proxy.password not in log_text

    # Every connection audited, under the session, with its outcome.
    by_destination = {(r["destination"], r["outcome"], r["reason"]) for r in records}
    assert (f"127.0.0.1:{listed}", "connected", "") in by_destination
    assert (f"127.0.0.1:{unlisted}", "refused", "egress_not_listed") in by_destination
    assert {r["session"] for r in records} <= sessions
    assert len(sessions) == 1
    assert all(r["service"] == "probe" for r in records)
