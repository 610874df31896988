"""fabric-stdio's egress forwarder in a real container (Docker; Podman with DOCKER_HOST at its
socket): with ``network_mode: none`` the container's client reaches the host's Unix socket
through 127.0.0.1:PORT, and a direct TCP connection anywhere else goes nowhere."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from reactor_fabric.runtime.stdio_sockets import BUNDLED_HELPER
from tests.integration.harness import build_test_image
from tests.unit.test_fabric_stdio_egress import DEADLINE, Egress

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
            container.remove(force=True)
        client.close()
        stdio.close()
        egress.close()
    report = json.loads(received)
    assert report["back"] == "through the forwarder"
    assert report["direct"] == "ENETUNREACH"  # no route: only the loopback exists
    assert egress.accepted == 1
