"""Egress allowlists on the real engine (Docker; Podman with DOCKER_HOST at its socket).

A service with ``egress:`` runs with no network of its own; a client inside it (the probe
server, with Python's urllib and a raw CONNECT) reaches a listed destination on this host's
loopback through the orchestrator's proxy, and nothing else: an unlisted destination gets 403,
a listed *name* that resolves to loopback gets 403 unless that address is listed, direct TCP
goes nowhere (not the orchestrator's port, not the engine's TCP port), and every attempt is in
the audit trail under the session.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.harness import (
    Orchestrator,
    build_test_image,
    orchestrator,
    wait_until,
    write_suite,
)
from tests.integration.test_bounds_e2e import websocket
from tests.messages import request

pytestmark = pytest.mark.integration

PROXY = "http://127.0.0.1:3128"


@pytest.fixture(scope="module")
def probe_image() -> str:
    return build_test_image("probe")


class Answering(BaseHTTPRequestHandler):
    """A destination on this host's loopback: says who it is and what path it was asked."""

    name = "?"

    def do_GET(self) -> None:
        body = f"{self.name} answered {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def answering(name: str) -> Iterator[int]:
    handler = type(f"Answering{name}", (Answering,), {"name": name})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def listed() -> Iterator[int]:
    yield from answering("listed")


@pytest.fixture
def unlisted() -> Iterator[int]:
    yield from answering("unlisted")


@pytest.mark.parametrize("warm", [0, 1], ids=["fresh", "pooled"])
def test_a_container_reaches_only_its_listed_destinations_through_the_proxy(
    tmp_path: Path, probe_image: str, listed: int, unlisted: int, warm: int
) -> None:
    suite = write_suite(
        tmp_path / "suite.yaml",
        [],
        test_services={
            "probe": {
                "image": probe_image,
                "warm": warm,
                # The listed server by address; the other one only by a name that resolves to
                # loopback (which is not listed as an address for its port).
                "egress": [f"127.0.0.1:{listed}", f"localhost:{unlisted}"],
            }
        },
    )

    async def ask(running: Orchestrator) -> dict[str, Any]:
        ws = await websocket(running, "/mcp/probe")
        asked = {
            "listed_http": ("fetch", {"url": f"http://127.0.0.1:{listed}/hello"}),
            "listed_tunnel": (
                "tunnel",
                {"host": "127.0.0.1", "port": listed, "send": "GET /t HTTP/1.0\r\n\r\n"},
            ),
            "unlisted": ("fetch", {"url": f"http://127.0.0.1:{unlisted}/"}),
            "name_to_loopback": ("tunnel", {"host": "localhost", "port": unlisted, "send": ""}),
            "metadata": ("fetch", {"url": "http://169.254.169.254/latest/meta-data/"}),
            "orchestrator": ("tunnel", {"host": "127.0.0.1", "port": port_of(running), "send": ""}),
            "direct_listed": ("direct", {"host": "127.0.0.1", "port": listed}),
            "direct_orchestrator": ("direct", {"host": "127.0.0.1", "port": port_of(running)}),
            # The engine's TCP port, where one would listen: this host on the default bridge.
            "direct_gateway_engine": ("direct", {"host": "172.17.0.1", "port": 2375}),
            "direct_outside": ("direct", {"host": "1.1.1.1", "port": 443}),
        }
        seen: dict[str, Any] = {}
        for number, (key, (method, params)) in enumerate(asked.items(), start=1):
            await ws.send_json(request(number, method, params))
            seen[key] = (await ws.hear())["result"]
        await ws.aclose()
        return seen

    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        if warm:
            wait_until(
                lambda: any(e["event"] == "pooled_container_ready" for e in running.logs()),
                what="a pooled container",
            )
        seen = trio.run(ask, running)
        wait_until(
            lambda: sum(r["event"] == "egress" for r in running.audit()) >= 6,
            what="the egress records",
        )
        records = [r for r in running.audit() if r["event"] == "egress"]
        sessions = {r["session"] for r in running.audit() if r["event"] == "session_start"}

    # The proxy is named in the environment, both spellings, and nothing bypasses it.
    proxy_env = seen["listed_http"]["proxy_env"]
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        assert proxy_env[name] == PROXY
    assert proxy_env["NO_PROXY"] == ""
    assert proxy_env["no_proxy"] == ""

    # Listed: reached, by a forwarded request and by a tunnel.
    assert seen["listed_http"]["status"] == 200
    assert seen["listed_http"]["body"] == "listed answered /hello"
    assert seen["listed_tunnel"]["status"] == 200
    assert seen["listed_tunnel"]["answer"].endswith("listed answered /t")
    # Not listed (as that address and port): 403, with the reason, before any connection.
    assert seen["unlisted"]["status"] == 403
    assert seen["unlisted"]["reason"] == "egress_not_listed"
    assert seen["metadata"]["status"] == 403
    assert seen["orchestrator"]["status"] == 403
    # A listed name resolving to loopback: 403 after resolution.
    assert seen["name_to_loopback"]["status"] == 403
    assert "egress_address_refused" in seen["name_to_loopback"]["answer"]
    # Past the proxy there is nothing: no route, and the container's loopback is its own.
    for key in ("direct_listed", "direct_orchestrator", "direct_gateway_engine", "direct_outside"):
        assert seen[key]["connected"] is False, (key, seen[key])

    # Every attempt through the proxy is audited, under the session, with its outcome.
    by_destination = {(r["destination"], r["outcome"], r["reason"]) for r in records}
    assert (f"127.0.0.1:{listed}", "connected", "") in by_destination
    assert (f"127.0.0.1:{unlisted}", "refused", "egress_not_listed") in by_destination
    assert (f"localhost:{unlisted}", "refused", "egress_address_refused") in by_destination
    assert ("169.254.169.254:80", "refused", "egress_not_listed") in by_destination
    assert (f"127.0.0.1:{port_of(running)}", "refused", "egress_not_listed") in by_destination
    assert {r["session"] for r in records} <= sessions
    assert len(sessions) == 1
    assert all(r["service"] == "probe" for r in records)
    connected = [r for r in records if r["outcome"] == "connected"]
    assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in connected)
    assert all(r["address"] == "127.0.0.1" for r in connected)


def test_a_service_without_egress_runs_with_the_network_it_always_had(
    tmp_path: Path, probe_image: str
) -> None:
    suite = write_suite(
        tmp_path / "suite.yaml",
        [],
        test_services={"probe": {"image": probe_image, "network": "none"}},
    )

    async def ask(running: Orchestrator) -> dict[str, Any]:
        ws = await websocket(running, "/mcp/probe")
        await ws.send_json(request(1, "fetch", {"url": "http://127.0.0.1:9/"}))
        result = (await ws.hear())["result"]
        await ws.aclose()
        return dict(result)

    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        seen = trio.run(ask, running)
    assert seen["proxy_env"] == {}
    assert seen["status"] is None
    assert "Connection refused" in seen["error"]


def port_of(running: Orchestrator) -> int:
    return int(running.http_url.rsplit(":", 1)[1].split("/")[0])
