"""fabric-stdio --hold, run on this host (runtime/stdio_helper/fabric-stdio.c): once connected,
the command runs only after the orchestrator sent GO; a closed connection instead ends it
without running the command.

The test plays the orchestrator on the stdio socket. The command, once it runs, leaves a
marker file and echoes one line of its stdin (the socket) to its stdout (the socket), so the
test sees both that it ran and that it got what followed GO, whole. "Still held" is read from
the kernel, not from a pause: the program's process still is fabric-stdio (its command line),
blocked in read(2) on the socket (/proc/PID/syscall), and the marker does not exist.

The program is built by scripts/build-stdio-helper; without gcc and a static C library these
tests are skipped.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

from reactor_fabric.runtime.stdio_sockets import BUNDLED_HELPER, GO, wrapped_command

REPO = Path(__file__).resolve().parents[3]
SOURCE = BUNDLED_HELPER.with_name("fabric-stdio.c")
DEADLINE = 30.0  # reached only when something is broken
READ_SYSCALL = "0"  # x86-64's read(2), as /proc/PID/syscall names it

COMMAND = r"""
import sys
open(sys.argv[1], "w").close()
line = sys.stdin.readline()
sys.stdout.write("echo:" + line)
sys.stdout.flush()
"""


class Held:
    """The program started with ``--hold`` on a socket the test listens on, connected."""

    def __init__(self, program: Path, short: Path, options: list[str]) -> None:
        self.marker = short / "ran"
        path = short / "stdio.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(1)
        listener.settimeout(DEADLINE)
        command = [sys.executable, "-c", COMMAND, str(self.marker)]
        self.process = subprocess.Popen(
            [str(program), *options, str(path), *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            self.connection, _ = listener.accept()
        finally:
            listener.close()
        self.connection.settimeout(DEADLINE)

    def blocked_in_read(self) -> bool:
        """Waits (bounded) until the process sleeps in read(2); whether it still is the
        program (no exec happened) at that moment."""
        end = time.monotonic() + DEADLINE
        pid = self.process.pid
        while time.monotonic() < end:
            syscall = Path(f"/proc/{pid}/syscall").read_text().split()
            if syscall and syscall[0] == READ_SYSCALL:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                return cmdline[0].endswith(b"fabric-stdio")
            time.sleep(0.01)
        raise AssertionError("the program never waited in read(2)")

    def received(self) -> bytes:
        data = b""
        while chunk := self.connection.recv(4096):
            data += chunk
        return data

    def finish(self) -> tuple[int, str]:
        with contextlib.suppress(OSError):
            self.connection.close()
        _, stderr = self.process.communicate(timeout=DEADLINE)
        return self.process.returncode, stderr.decode()


def test_the_command_waits_for_go_and_reads_what_follows_it(program: Path, short: Path) -> None:
    held = Held(program, short, ["--hold"])
    try:
        assert held.blocked_in_read()
        assert not held.marker.exists()
        held.connection.sendall(GO + b"the first message\n")
        assert held.received() == b"echo:the first message\n"
    finally:
        status, stderr = held.finish()
    assert held.marker.exists()
    assert status == 0, stderr


def test_a_closed_connection_ends_it_with_75_and_the_command_never_runs(
    program: Path, short: Path
) -> None:
    held = Held(program, short, ["--hold"])
    assert held.blocked_in_read()
    held.connection.shutdown(socket.SHUT_WR)  # the orchestrator gives the start up
    status, stderr = held.finish()
    assert status == 75
    assert "gave the start up" in stderr
    assert not held.marker.exists()


def test_any_byte_but_go_ends_it_with_64_and_the_command_never_runs(
    program: Path, short: Path
) -> None:
    held = Held(program, short, ["--hold"])
    held.connection.sendall(b'{"jsonrpc": "2.0"}\n')
    status, stderr = held.finish()
    assert status == 64
    assert "not the byte GO" in stderr
    assert not held.marker.exists()


def test_hold_follows_the_egress_options(program: Path, short: Path) -> None:
    egress = short / "egress.sock"  # (never connected to: the command makes no connection)
    held = Held(program, short, ["--egress", "31280", str(egress), "--hold"])
    try:
        assert held.blocked_in_read()
        assert not held.marker.exists()
        held.connection.sendall(GO + b"x\n")
        assert held.received() == b"echo:x\n"
    finally:
        status, stderr = held.finish()
    assert status == 0, stderr


def test_without_hold_the_command_runs_at_once(program: Path, short: Path) -> None:
    held = Held(program, short, [])
    try:
        held.connection.sendall(b"G\n")  # not consumed: the command reads it
        assert held.received() == b"echo:G\n"
    finally:
        held.finish()


def test_the_orchestrator_puts_hold_after_egress_and_before_the_socket() -> None:
    assert wrapped_command(["/entry"], ["serve"], None, hold=True) == [
        "/.reactor-fabric/fabric-stdio",
        "--hold",
        "/.reactor-fabric/stdio.sock",
        "/entry",
        "serve",
    ]
    command = wrapped_command(None, ["serve"], None, egress_port=3128, hold=True)
    assert command[1:5] == ["--egress", "3128", "/.reactor-fabric/egress.sock", "--hold"]
