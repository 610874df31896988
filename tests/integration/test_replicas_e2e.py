"""Two orchestrators behind a real nginx, configured as docs/SCALING.md says (its very block):
Streamable HTTP sessions stay on the replica their id names, WebSockets on their connection,
and losing a replica ends only its own sessions, with the error the document promises."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import docker
import pytest
import trio
from trio_websocket import open_websocket_url

from tests.integration.harness import (
    REPO,
    LineProcess,
    Orchestrator,
    containers_of,
    orchestrator,
    python2_client,
    remove_container,
    write_suite,
)
from tests.messages import INITIALIZE

NGINX = REPO / ".cache" / "test-tools" / "usr" / "sbin" / "nginx"
SCALING = REPO / "docs" / "SCALING.md"
TIME_CALL = {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def documented_nginx_block() -> str:
    """The nginx configuration of docs/SCALING.md, as a user would copy it."""
    [block] = re.findall(r"```nginx\n(.*?)```", SCALING.read_text(), flags=re.S)
    return str(block)


@contextmanager
def nginx_in_front(home: Path, replicas: dict[str, Orchestrator]) -> Iterator[str]:
    """nginx running the documented block, its ports made this test's; its base URL."""
    port = free_port()
    block = documented_nginx_block().replace("127.0.0.1:8765", f"127.0.0.1:{port}")
    for name, documented in (("a", 8001), ("b", 8002)):
        replica_port = replicas[name].http_url.rsplit(":", 1)[1]
        block = block.replace(f"127.0.0.1:{documented}", f"127.0.0.1:{replica_port}")
    prefix = home / "nginx"
    for directory in ("logs", "temp"):
        (prefix / directory).mkdir(parents=True, exist_ok=True)
    temp = prefix / "temp"
    conf = prefix / "nginx.conf"
    # What Debian's nginx.conf around conf.d/ provides, pointed at this test's directory.
    conf.write_text(
        f"""
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/logs/access.log;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
{block}
}}
"""
    )
    process = subprocess.Popen(
        [str(NGINX), "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "logs/error.log"),
         "-g", "daemon off; master_process off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else b""
            with suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, "nginx did not listen"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()


def sessions_of(replica: Orchestrator) -> set[str]:
    request = urllib.request.Request(
        f"{replica.http_url}/api/sessions", headers=replica.auth_header
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return {session["id"] for session in json.load(response)["sessions"]}


def raw_post(url: str, session: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """A tools/list POST on an existing session: the status and the JSON body."""
    request = urllib.request.Request(
        url,
        data=json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}).encode(),
        headers={
            **headers,
            "Mcp-Session-Id": session,
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def session_of(client: LineProcess) -> str:
    status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
    assert status["ok"], status
    return str(status["structured"]["session_id"])


async def websocket_call(url: str) -> dict[str, object]:
    """A WebSocket session through the proxy: initialize, then the fabric's get_status."""
    async with open_websocket_url(url, subprotocols=["mcp"]) as ws:
        await ws.send_message(json.dumps(INITIALIZE))
        assert "result" in json.loads(await ws.get_message())
        await ws.send_message(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        await ws.send_message(
            json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                        "params": {"name": "get_status", "arguments": {}}})
        )  # fmt: skip
        answer: dict[str, object] = json.loads(await ws.get_message())
        return answer


@pytest.mark.skipif(not NGINX.exists(), reason="nginx is unpacked by scripts/ensure-test-tools")
def test_sessions_stay_on_their_replica_behind_nginx_and_losing_one_ends_only_its_own(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    (tmp_path / "projects").mkdir()
    suite = write_suite(tmp_path / "suite.yaml", [str(tmp_path / "projects")])
    clients: list[LineProcess] = []
    lost_instance = ""
    try:
        with (
            orchestrator(suite, tmp_path / "a.log", "--replica", "a") as replica_a,
            orchestrator(suite, tmp_path / "b.log", "--replica", "b") as replica_b,
            nginx_in_front(tmp_path, {"a": replica_a, "b": replica_b}) as proxy,
        ):
            lost_instance = replica_a.instance
            # Real SDK clients (Streamable HTTP, several requests per session) through nginx.
            # New sessions go to a replica at random: open them until both replicas have some
            # (all of 24 on one replica: once in 8 million runs).
            sessions: list[str] = []
            while len({s.rsplit(".", 1)[1] for s in sessions}) < 2 and len(sessions) < 24:
                client = python2_client(f"{proxy}/mcp")
                clients.append(client)
                assert client.ask({"op": "initialize"})["ok"]
                sessions.append(session_of(client))
            assert {session.rsplit(".", 1)[1] for session in sessions} == {"a", "b"}
            for client in clients:  # every request of a session reached its own replica
                answer = client.ask(TIME_CALL)
                assert answer["ok"], answer
            on_a = {s for s in sessions if s.endswith(".a")}
            on_b = {s for s in sessions if s.endswith(".b")}
            assert on_a <= sessions_of(replica_a)
            assert on_b <= sessions_of(replica_b)
            assert not on_a & sessions_of(replica_b)
            assert not on_b & sessions_of(replica_a)
            # A WebSocket through the proxy is a session of whichever replica took it.
            ws_answer = trio.run(websocket_call, f"ws{proxy.removeprefix('http')}/mcp?token="
                                 f"{replica_a.token}")  # fmt: skip
            assert "result" in ws_answer, ws_answer

            # Replica a is lost.
            replica_a.process.kill()
            replica_a.process.wait()
            for client, session in zip(clients, sessions, strict=True):
                answer = client.ask(TIME_CALL)
                if session in on_b:
                    assert answer["ok"], answer  # untouched
                else:
                    # The SDK reads the 404 as the spec says: the session is over.
                    assert not answer["ok"], answer
                    assert answer["error"]["message"] == "Session terminated", answer
                    # And what the proxy answered, as documented.
                    status, body = raw_post(f"{proxy}/mcp", session, replica_a.auth_header)
                    assert (status, body["reason"]) == (404, "replica_unavailable")
            # New sessions land on the live replica.
            newcomer = python2_client(f"{proxy}/mcp")
            clients.append(newcomer)
            assert newcomer.ask({"op": "initialize"})["ok"]
            assert session_of(newcomer).endswith(".b")
            assert newcomer.ask(TIME_CALL)["ok"]
    finally:
        for client in clients:
            client.close()
        # What the next sweep of an orchestrator on this host would do for the lost replica.
        if lost_instance:
            for container in containers_of(docker_client, instance=lost_instance):
                remove_container(container, volumes=True)
