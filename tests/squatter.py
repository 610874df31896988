"""Another local user holding a port: a real process of another uid that accepts every
connection and reports each byte it was sent (tests of the stdio bridge's squatter checks)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

SQUATTER_UID = 4001
# The squatter needs only the standard library, and another user cannot run this checkout's
# virtual environment's interpreter (under /root): the system's Python.
SYSTEM_PYTHON = "/usr/bin/python3"

needs_squatters = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason="a squatter of another uid needs root to start, and the system's python3 "
    "(CI runs as root on Debian)",
)

# Another user's listener: accepts every connection and prints, per connection, all it was
# sent (until the peer closes, or 5 s), as one JSON line; ends when its stdin closes.
SQUATTER = r"""
import json, socket, sys, threading
host, port = sys.argv[1], int(sys.argv[2])
server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
server.bind((host, port))
server.listen(16)
print(json.dumps({"uid": __import__("os").getuid()}), flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()

def take(conn):
    received = b""
    with conn:
        conn.settimeout(5)
        try:
            while chunk := conn.recv(65536):
                received += chunk
        except OSError:
            pass
    print(json.dumps({"received": received.decode("latin-1")}), flush=True)

server.settimeout(0.1)
while not done.is_set():
    try:
        conn, _ = server.accept()
    except TimeoutError:
        continue
    take(conn)
server.setblocking(False)
while True:  # what is still in the backlog
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        break
    conn.setblocking(True)
    take(conn)
"""


@dataclass
class Squatter:
    process: subprocess.Popen[str]
    connections: list[str] = field(default_factory=list)

    def finish(self) -> list[str]:
        """Stop it; every connection's received bytes."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        with self.process.stdout:
            for line in self.process.stdout:
                self.connections.append(json.loads(line)["received"])
        self.process.wait(timeout=30)
        return self.connections


@contextmanager
def squatting(host: str, port: int) -> Iterator[Squatter]:
    process = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", SQUATTER, host, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=SQUATTER_UID,
        group=SQUATTER_UID,
        extra_groups=[],
    )
    squatter = Squatter(process)
    try:
        assert process.stdout is not None
        assert json.loads(process.stdout.readline()) == {"uid": SQUATTER_UID}
        yield squatter
    finally:
        if process.stdout is not None and not process.stdout.closed:
            squatter.finish()


def free_port() -> int:
    """A port free on both 127.0.0.1 and ::1."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        with socket.socket(socket.AF_INET6) as other:
            try:
                other.bind(("::1", port))
            except OSError:
                continue
        return port
