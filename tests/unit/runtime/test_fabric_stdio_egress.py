"""fabric-stdio's egress forwarder, run on this host (runtime/stdio_helper/fabric-stdio.c).

``fabric-stdio --egress PORT EGRESS_SOCKET SOCKET COMMAND...`` listens on 127.0.0.1:PORT and
carries each connection to the Unix socket EGRESS_SOCKET, before it connects SOCKET as the
command's stdin and stdout and execs the command. Here the test plays the orchestrator: it
listens on both sockets (the egress side echoes), and the command is a Python client of
127.0.0.1:PORT that prints what it saw to its stdout, which is the stdio socket.

The program is built by scripts/build-stdio-helper; without gcc and a static C library these
tests are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reactor_fabric._reasons import EGRESS_BAD_REQUEST, EGRESS_BUSY
from reactor_fabric.protocol.egress import refusal_response
from reactor_fabric.runtime import egress_proxy
from reactor_fabric.runtime.stdio_sockets import BUNDLED_HELPER

REPO = Path(__file__).resolve().parents[3]
SOURCE = BUNDLED_HELPER.with_name("fabric-stdio.c")
# A deadline for every wait: reached only when something is broken.
DEADLINE = 30.0

# The command in the container: CLIENT PORT COUNT SIZE [hold]. Opens COUNT connections to
# 127.0.0.1:PORT at once; on each, a first round trip ("hello" echoed before anything ends),
# then SIZE bytes sent while the echo is read, then its sending half-closed and the rest read
# to EOF. Prints, as JSON, each connection's outcome, its own PID and its children's (the
# forwarder) and theirs (the forwarder's connections). "hold": exits right after the first
# round trip, the connection still open on the egress side.
CLIENT = r"""
import json, os, socket, sys, threading
port, count, size = (int(a) for a in sys.argv[1:4])
hold = sys.argv[4:] == ["hold"]

def children(parent):
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(entry))
    return found

def exchange(i, results):
    payload = bytes([65 + i % 26]) * size
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"hello")
            first = b""
            while len(first) < 5:
                chunk = s.recv(5 - len(first))
                if not chunk:
                    results[i] = "closed"
                    return
                first += chunk
            if hold:
                results[i] = "held"
                return
            def send():
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
            sender = threading.Thread(target=send)
            sender.start()
            back = bytearray()
            while chunk := s.recv(1 << 16):
                back += chunk
            sender.join()
            results[i] = "echoed" if back == payload else f"wrong: {len(back)} bytes"
    except socket.timeout:
        results[i] = "timeout"
    except ConnectionError:
        results[i] = "closed"

results = [None] * count
threads = [threading.Thread(target=exchange, args=(i, results)) for i in range(count)]
for t in threads:
    t.start()
for t in threads:
    t.join()
forwarders = children(os.getpid())
workers = [w for f in forwarders for w in children(f)]
print(json.dumps({"results": results, "pid": os.getpid(), "forwarders": forwarders,
                  "workers": workers}), flush=True)
if hold:
    os._exit(0)  # the held connection open until the process ends
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Egress:
    """The orchestrator's side of EGRESS_SOCKET: echoes each connection as it reads it, and
    closes once the other side has ended its sending. ``together``: no connection is answered
    before that many are open at once. ``hold``: after the other side's EOF, the connection
    stays open until the other side is gone (``gone`` is set then)."""

    def __init__(self, path: Path, *, together: int = 1, hold: bool = False) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(128)
        self.barrier = threading.Barrier(together, timeout=DEADLINE)
        self.hold = hold
        self.gone = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(DEADLINE)
            with contextlib.suppress(threading.BrokenBarrierError):
                self.barrier.wait()
            while chunk := connection.recv(1 << 16):
                connection.sendall(chunk)
            if self.hold:
                # Both directions shut (the other end closed): POLLHUP.
                watcher = select.poll()
                watcher.register(connection, 0)
                if watcher.poll(DEADLINE * 1000):
                    self.gone.set()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.listener.close()


@dataclass
class Run:
    pid: int  # of the process started: the command, once exec'd
    returncode: int
    stdout: bytes | None  # what reached the stdio socket; None: it was never connected
    stderr: str

    def report(self) -> dict[str, Any]:
        assert self.stdout is not None, self.stderr
        return dict(json.loads(self.stdout))


def run(program: Path, short: Path, arguments: list[str], command: list[str]) -> Run:
    """Runs ``program ARGUMENTS... STDIO_SOCKET COMMAND...`` with the test listening on the
    stdio socket; returns once the stdio socket saw EOF and the program exited."""
    path = short / "stdio.sock"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    stderr = short / "stderr"
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener,
        stderr.open("wb") as errors,
    ):
        listener.bind(str(path))
        listener.listen(1)
        listener.settimeout(0.05)
        process = subprocess.Popen(
            [str(program), *arguments, str(path), *command], stdin=subprocess.DEVNULL, stderr=errors
        )
        try:
            received: bytes | None = None
            deadline = time.monotonic() + DEADLINE
            while received is None and time.monotonic() < deadline:
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    if process.poll() is not None:
                        break  # exited without connecting
                    continue
                with connection:
                    connection.settimeout(DEADLINE)
                    chunks = []
                    while chunk := connection.recv(1 << 16):
                        chunks.append(chunk)
                    received = b"".join(chunks)
            returncode = process.wait(timeout=DEADLINE)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return Run(process.pid, returncode, received, stderr.read_text())


def client(port: int, count: int = 1, size: int = 0, *extra: str) -> list[str]:
    return [sys.executable, "-c", CLIENT, str(port), str(count), str(size), *extra]


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_for(condition: Any) -> bool:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def can_listen_on(port: int) -> bool:
    with socket.socket() as attempt:
        attempt.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            attempt.bind(("127.0.0.1", port))
            attempt.listen(1)
        except OSError:
            return False
    return True


# --- the old form -------------------------------------------------------------------------


def test_the_form_without_egress_still_connects_stdio_and_becomes_the_command(
    program: Path, short: Path
) -> None:
    # Passes on the earlier program too: the form it had is unchanged.
    done = run(program, short, [], [sys.executable, "-c", "import os; print(os.getpid())"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{done.pid}\n".encode()


# --- forwarding ------------------------------------------------------------------------------


def test_bytes_cross_both_ways_with_a_large_payload_and_each_half_close_is_passed_on(
    program: Path, short: Path
) -> None:
    # The egress side closes only after the client's half-close reached it, and the client
    # reads to EOF: both half-closes crossed. 8 MiB through 64 KiB buffers each way.
    egress = Egress(short / "egress.sock")
    port = free_port()
    try:
        done = run(
            program,
            short,
            ["--egress", str(port), str(short / "egress.sock")],
            client(port, 1, 8 << 20),
        )
    finally:
        egress.close()
    assert done.returncode == 0, done.stderr
    report = done.report()
    assert report["results"] == ["echoed"]
    # The command is the process that was started (exec, no wrapper left), the forwarder its
    # child.
    assert report["pid"] == done.pid
    assert len(report["forwarders"]) == 1


def test_several_connections_are_carried_at_once(program: Path, short: Path) -> None:
    # The egress side answers none of them before all five are open at the same time.
    egress = Egress(short / "egress.sock", together=5)
    port = free_port()
    try:
        done = run(
            program,
            short,
            ["--egress", str(port), str(short / "egress.sock")],
            client(port, 5, 256 << 10),
        )
    finally:
        egress.close()
    assert done.returncode == 0, done.stderr
    assert done.report()["results"] == ["echoed"] * 5
    assert egress.accepted == 5


def test_with_nothing_listening_on_the_egress_socket_the_client_connection_is_closed(
    program: Path, short: Path
) -> None:
    port = free_port()
    done = run(
        program,
        short,
        ["--egress", str(port), str(short / "nobody.sock")],
        client(port, 2, 1024),
    )
    assert done.returncode == 0, done.stderr
    assert done.report()["results"] == ["closed", "closed"]


# --- lifetime ------------------------------------------------------------------------------


def test_when_the_command_exits_stdio_ends_and_the_forwarder_and_its_connections_die(
    program: Path, short: Path
) -> None:
    # run() returns only once the stdio socket saw EOF: the forwarder never held it. The
    # connection the command left open (held by the egress side) dies with it too.
    egress = Egress(short / "egress.sock", hold=True)
    port = free_port()
    try:
        done = run(
            program,
            short,
            ["--egress", str(port), str(short / "egress.sock")],
            client(port, 1, 0, "hold"),
        )
        assert done.returncode == 0, done.stderr
        report = done.report()
        assert report["results"] == ["held"]
        assert len(report["forwarders"]) == 1
        assert len(report["workers"]) == 1
        assert egress.gone.wait(DEADLINE)
    finally:
        egress.close()
    assert wait_for(lambda: all(gone(pid) for pid in report["forwarders"] + report["workers"]))
    assert wait_for(lambda: can_listen_on(port))


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        ["--egress", "0", "E", "S", "true"],
        ["--egress", "65536", "E", "S", "true"],
        ["--egress", "+443", "E", "S", "true"],
        ["--egress", "443x", "E", "S", "true"],
        ["--egress", "", "E", "S", "true"],
        ["--egress", "443", "E" * 120, "S", "true"],
        ["--egress", "443", "E", "S"],
        ["--egress", "443", "E"],
    ],
    ids=["zero", "too-big", "signed", "trailing", "empty", "long-path", "no-command", "short"],
)
def test_a_malformed_egress_form_is_a_usage_error(
    program: Path, short: Path, arguments: list[str]
) -> None:
    # The earlier program took "--egress" for the stdio socket's path: 70, not 64.
    finished = subprocess.run(
        [str(program), *arguments], check=False, capture_output=True, timeout=DEADLINE, cwd=short
    )
    assert finished.returncode == 64
    assert finished.stderr.startswith(b"fabric-stdio: ")


def test_a_port_already_taken_exits_71_before_stdio_is_connected(
    program: Path, short: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = run(
            program,
            short,
            ["--egress", str(port), str(short / "egress.sock")],
            [sys.executable, "-c", "print('ran')"],
        )
    assert done.returncode == 71
    assert done.stdout is None
    assert f"fabric-stdio: egress listen on 127.0.0.1:{port}:" in done.stderr


# --- at the proxy's bound (the orchestrator's proxy answers and records; nothing is reset) ----

# The forwarder carries as many connections at once as the proxy holds of one container: the 64
# it serves and the 16 it may be answering a refusal at once (runtime/egress_proxy.py).
CARRIED = egress_proxy.MAX_CONNECTIONS + egress_proxy.MAX_REFUSING
BUSY = refusal_response(503, EGRESS_BUSY, "64 connections at once")


class Proxy:
    """The orchestrator's side of EGRESS_SOCKET as the egress proxy behaves at its bound: of
    the connections open at once, it holds the first ``held`` (each answered ``held`` once its
    first bytes are read); any other is answered ``answer`` and closed at once, both ways,
    without waiting for the client's end (as the proxy ends a refused connection)."""

    def __init__(self, path: Path, *, held: int, answer: bytes = BUSY) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(128)
        self.held, self.answer = held, answer
        self.lock = threading.Lock()
        self.holding: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        connection.settimeout(DEADLINE)
        with contextlib.suppress(OSError):
            connection.recv(65536)
        with self.lock:
            hold = len(self.holding) < self.held
            if hold:
                self.holding.append(connection)
        with contextlib.suppress(OSError):
            if hold:
                connection.sendall(b"held")
                return
            connection.sendall(self.answer)
        connection.close()

    def release(self) -> None:
        """Close one held connection (both ways)."""
        with self.lock:
            self.holding.pop(0).close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for connection in self.holding:
                connection.close()


def live_children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def waiting_to_be_accepted(port: int) -> int:
    """Connections in the accept queue of the listener on 127.0.0.1:PORT (a listening socket's
    rx_queue in /proc/net/tcp); -1 when there is no such listener."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":
            return int(fields[4].split(":")[1], 16)
    return -1


@dataclass
class Forwarder:
    port: int
    command: int  # the PID of the command fabric-stdio became

    def workers(self) -> list[int]:
        """The forwarder's live connection processes."""
        (forwarder,) = live_children(self.command)
        return live_children(forwarder)

    def connect(self, first: bytes) -> socket.socket:
        connection = socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE)
        connection.sendall(first)
        return connection


@contextlib.contextmanager
def forwarding(program: Path, short: Path, egress: Path) -> Iterator[Forwarder]:
    """fabric-stdio with its forwarder on a free port, its command waiting for the end of its
    stdin (the stdio socket, held here until the block ends)."""
    port = free_port()
    path = short / "stdio.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        listener.settimeout(DEADLINE)
        command = [sys.executable, "-c", "import sys; sys.stdin.buffer.read()"]
        process = subprocess.Popen(
            [str(program), "--egress", str(port), str(egress), str(path), *command],
            stdin=subprocess.DEVNULL,
        )
        try:
            connection, _ = listener.accept()
            with connection:
                assert wait_for(lambda: len(live_children(process.pid)) == 1)
                yield Forwarder(port, process.pid)
            process.wait(timeout=DEADLINE)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def received(connection: socket.socket, size: int | None = None) -> bytes:
    """What comes back: ``size`` bytes, or everything until the end; b"reset" for a reset."""
    got = b""
    try:
        while (size is None or len(got) < size) and (chunk := connection.recv(65536)):
            got += chunk
    except ConnectionResetError:
        return b"reset"
    return got


def test_the_65th_connection_while_64_are_held_reaches_the_proxy_and_gets_its_503(
    program: Path, short: Path
) -> None:
    # The attack on the promise: 64 connections held, then one more. The forwarder closed the
    # 65th itself (a reset in the container), so the proxy never answered 503 egress_busy nor
    # recorded it.
    proxy = Proxy(short / "egress.sock", held=egress_proxy.MAX_CONNECTIONS)
    held: list[socket.socket] = []
    try:
        with forwarding(program, short, short / "egress.sock") as forwarder:
            for _ in range(egress_proxy.MAX_CONNECTIONS):
                held.append(forwarder.connect(b"hello"))
                assert received(held[-1], 4) == b"held"
            with forwarder.connect(b"CONNECT a.test:443 HTTP/1.1\r\n\r\n") as extra:
                assert received(extra) == BUSY
            assert proxy.accepted == egress_proxy.MAX_CONNECTIONS + 1
    finally:
        for connection in held:
            connection.close()
        proxy.close()


def test_beyond_its_bound_the_forwarder_leaves_a_connection_waiting_and_carries_it_later(
    program: Path, short: Path
) -> None:
    # The proxy holds everything: the forwarder carries CARRIED connections at once, no more
    # processes than that; the next waits in the listen backlog (not closed), and is carried
    # once one of the others ends.
    proxy = Proxy(short / "egress.sock", held=10 * CARRIED)
    held: list[socket.socket] = []
    try:
        with forwarding(program, short, short / "egress.sock") as forwarder:
            for _ in range(CARRIED):
                held.append(forwarder.connect(b"hello"))
                assert received(held[-1], 4) == b"held"
            with forwarder.connect(b"hello") as waiting:
                assert wait_for(lambda: waiting_to_be_accepted(forwarder.port) == 1)
                assert len(forwarder.workers()) == CARRIED
                assert proxy.accepted == CARRIED
                proxy.release()  # the proxy ends one (as its deadlines do): so does its carrier
                assert received(waiting, 4) == b"held"
            assert proxy.accepted == CARRIED + 1
    finally:
        for connection in held:
            connection.close()
        proxy.close()


def test_a_connection_the_proxy_closed_ends_though_the_client_keeps_its_side_open(
    program: Path, short: Path
) -> None:
    # A refused connection (or one the proxy's deadlines ended) whose client neither sends nor
    # closes: its process ends with the proxy's side, and does not hold one of the forwarder's
    # places past the proxy's deadlines.
    answer = refusal_response(400, EGRESS_BAD_REQUEST, "no complete request head within 10 s")
    proxy = Proxy(short / "egress.sock", held=0, answer=answer)
    try:
        with (
            forwarding(program, short, short / "egress.sock") as forwarder,
            forwarder.connect(b"CONNECT a.test:443 HTTP/1.1\r\n") as client,
        ):
            assert received(client) == answer
            assert wait_for(lambda: forwarder.workers() == [])
    finally:
        proxy.close()
