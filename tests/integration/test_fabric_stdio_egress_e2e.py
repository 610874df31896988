"""fabric-stdio's egress forwarder in a real container (Docker; Podman with DOCKER_HOST at its
socket): with ``network_mode: none`` the container's client reaches the host's Unix socket
through 127.0.0.1:PORT, and a direct TCP connection anywhere else goes nowhere; at the proxy's
bound, the connection over it is the proxy's to answer and record."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import trio

from reactor_fabric.protocol.egress import Allowlist
from reactor_fabric.runtime import egress_proxy
from reactor_fabric.runtime.egress_proxy import EgressProxy
from reactor_fabric.runtime.stdio_sockets import BUNDLED_HELPER, EGRESS_BACKLOG
from tests.integration.harness import build_test_image, remove_container
from tests.unit.runtime.test_egress_proxy import Records
from tests.unit.runtime.test_fabric_stdio_egress import DEADLINE, Egress

pytestmark = pytest.mark.integration

PORT = 3128
# In the container: one exchange through the forwarder (half-closed, read to EOF), then a
# direct connection to the engine's usual bridge gateway, which must fail.
CLIENT = r"""
import errno, json, socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30) as s:
    s.sendall(b"through the forwarder")
    s.shutdown(socket.SHUT_WR)
    back = b""
    while chunk := s.recv(65536):
        back += chunk
try:
    socket.create_connection(("172.17.0.1", 80), timeout=10).close()
    direct = "connected"
except OSError as error:
    direct = errno.errorcode.get(error.errno or 0, type(error).__name__)
print(json.dumps({"back": back.decode(), "direct": direct}), flush=True)
"""


@pytest.fixture
def area() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="fse-"))
    directory.chmod(0o755)  # the image's user, whoever it is, reaches the sockets
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_client_without_network_reaches_the_egress_socket_through_the_loopback_port(
    area: Path,
) -> None:
    if not BUNDLED_HELPER.exists():
        pytest.skip("fabric-stdio is not built (scripts/build-stdio-helper)")
    image = build_test_image("probe")
    egress = Egress(area / "egress.sock")
    os.chmod(area / "egress.sock", 0o666)
    stdio = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stdio.bind(str(area / "stdio.sock"))
    os.chmod(area / "stdio.sock", 0o666)
    stdio.listen(1)
    stdio.settimeout(DEADLINE)
    client = docker.from_env(version="auto", timeout=120)
    container = None
    try:
        container = client.containers.run(
            image,
            entrypoint=["/.rf/fabric-stdio"],
            command=[
                "--egress",
                str(PORT),
                "/.rf-sockets/egress.sock",
                "/.rf-sockets/stdio.sock",
                "/opt/mcp/bin/python3",
                "-c",
                CLIENT,
                str(PORT),
            ],
            network_mode="none",
            volumes={
                str(BUNDLED_HELPER): {"bind": "/.rf/fabric-stdio", "mode": "ro"},
                str(area): {"bind": "/.rf-sockets", "mode": "ro"},
            },
            detach=True,
        )
        connection, _ = stdio.accept()
        with connection:
            connection.settimeout(DEADLINE)
            received = b""
            while chunk := connection.recv(65536):
                received += chunk
        outcome = container.wait(timeout=DEADLINE)
        assert outcome["StatusCode"] == 0, container.logs()
    finally:
        if container is not None:
            remove_container(container)
        client.close()
        stdio.close()
        egress.close()
    report = json.loads(received)
    assert report["back"] == "through the forwarder"
    assert report["direct"] == "ENETUNREACH"  # no route: only the loopback exists
    assert egress.accepted == 1


# In the container: 64 tunnels through the proxy held open at once, then one more; prints each
# one's status line and the whole answer to the last ("<reset>" where the connection was reset).
HOLDING_CLIENT = r"""
import json, socket, sys
port, target, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = b""
    try:
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        while b"\r\n\r\n" not in head and (chunk := s.recv(4096)):
            head += chunk
    except ConnectionResetError:
        head += b"<reset>"
    return s, head

held = [connect() for _ in range(count)]
extra, answer = connect()
try:
    while chunk := extra.recv(65536):
        answer += chunk
except ConnectionResetError:
    answer += b"<reset>"
print(json.dumps({"held": [head.split(b"\r\n")[0].decode() for _, head in held],
                  "extra": answer.decode("utf-8", "replace")}), flush=True)
"""


async def test_a_containers_65th_connection_gets_the_proxys_503_egress_busy_and_is_recorded(
    area: Path,
) -> None:
    # The real forwarder in a container without network, the real proxy (in this process) on
    # the container's egress socket, a destination on this host's loopback that holds every
    # connection: 64 tunnels are held, the 65th must be the proxy's to answer and record (the
    # forwarder reset it).
    if not BUNDLED_HELPER.exists():
        pytest.skip("fabric-stdio is not built (scripts/build-stdio-helper)")
    image = await trio.to_thread.run_sync(build_test_image, "probe")
    container_id = "e2e" + "0" * 61
    records = Records()
    client = docker.from_env(version="auto", timeout=120)
    container = None

    async def hold(stream: trio.SocketStream) -> None:
        async with stream:  # until the other side ends
            while await stream.receive_some(65536):
                pass

    try:
        async with trio.open_nursery() as nursery:
            destinations = await trio.open_tcp_listeners(0, host="127.0.0.1")
            target = f"127.0.0.1:{destinations[0].socket.getsockname()[1]}"
            nursery.start_soon(trio.serve_listeners, hold, destinations)
            proxy = EgressProxy()
            await nursery.start(proxy.run, records)
            egress = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            egress.bind(str(area / "egress.sock"))
            os.chmod(area / "egress.sock", 0o666)
            egress.listen(EGRESS_BACKLOG)
            egress.setblocking(False)
            proxy.serve(container_id, "probe", Allowlist.of([target]), egress)
            stdio = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            await stdio.bind(str(area / "stdio.sock"))
            os.chmod(area / "stdio.sock", 0o666)
            stdio.listen(1)
            command = [
                "--egress",
                str(PORT),
                "/.rf-sockets/egress.sock",
                "/.rf-sockets/stdio.sock",
                "/opt/mcp/bin/python3",
                "-c",
                HOLDING_CLIENT,
                str(PORT),
                target,
                str(egress_proxy.MAX_CONNECTIONS),
            ]

            def start() -> Any:
                return client.containers.run(
                    image,
                    entrypoint=["/.rf/fabric-stdio"],
                    command=command,
                    network_mode="none",
                    volumes={
                        str(BUNDLED_HELPER): {"bind": "/.rf/fabric-stdio", "mode": "ro"},
                        str(area): {"bind": "/.rf-sockets", "mode": "ro"},
                    },
                    detach=True,
                )

            container = await trio.to_thread.run_sync(start)
            with trio.fail_after(DEADLINE * 4):
                connection, _ = await stdio.accept()
                with connection:
                    received = b""
                    while chunk := await connection.recv(65536):
                        received += chunk
                stdio.close()
                # What the client in the container saw: 64 tunnels, then the proxy's answer.
                report = json.loads(received)
                assert report["held"] == ["HTTP/1.1 200 Connection established"] * 64
                assert report["extra"].startswith("HTTP/1.1 503 "), report["extra"]
                assert "X-Reactor-Fabric-Reason: egress_busy" in report["extra"]
                while len(records) < egress_proxy.MAX_CONNECTIONS + 1:
                    await records.changed.wait()  # the held ones end with the container's client
            nursery.cancel_scope.cancel()
    finally:
        if container is not None:
            await trio.to_thread.run_sync(remove_container, container)
        client.close()
    busy = [r for r in records if r.outcome == "refused"]
    assert [(r.container, r.reason) for r in busy] == [(container_id, "egress_busy")]
    assert sum(r.outcome == "connected" for r in records) == 64
