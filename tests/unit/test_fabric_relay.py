"""The agent image's fabric relay (images/agent-claude-code/fabric_relay.py), run as Claude Code
runs it (a process on pipes) against a real Unix socket server in this process: the auth line
first, then bytes both ways unchanged, until either side closes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

RELAY = Path(__file__).resolve().parents[2] / "images" / "agent-claude-code" / "fabric_relay.py"
TOKEN = "child-token-not-to-be-printed"
WAIT = 30.0


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    path = tmp_path / "fabric.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(WAIT)
    yield server, path
    server.close()


def start(path: Path, token: str | None = TOKEN) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_FABRIC_")}
    env["REACTOR_FABRIC_FABRIC_SOCKET"] = str(path)
    if token is not None:
        env["REACTOR_FABRIC_FABRIC_TOKEN"] = token
    return subprocess.Popen(
        [sys.executable, str(RELAY)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def read_line(connection: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        byte = connection.recv(1)
        assert byte, f"EOF after {line!r}"
        line += byte
    return line


def read_exactly(read: Callable[..., bytes], fd: int | None, size: int) -> bytes:
    """``size`` bytes from ``read`` (given ``fd`` first when not ``None``)."""
    data = b""
    while len(data) < size:
        chunk = read(size - len(data)) if fd is None else read(fd, size - len(data))
        assert chunk, f"EOF after {len(data)} of {size} bytes"
        data += chunk
    return data


def test_the_auth_line_comes_first_then_bytes_pass_both_ways_unchanged_until_stdin_ends(
    listener: tuple[socket.socket, Path],
) -> None:
    server, path = listener
    with start(path) as relay:
        stdin, stdout, stderr = relay.stdin, relay.stdout, relay.stderr
        assert stdin is not None
        assert stdout is not None
        assert stderr is not None
        connection, _ = server.accept()
        connection.settimeout(WAIT)
        assert json.loads(read_line(connection)) == {
            "jsonrpc": "2.0",
            "method": "fabric/child",
            "params": {"token": TOKEN},
        }
        # Client → fabric: a message, then more than one read's worth of any bytes.
        request = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}\n'
        bulk = bytes(range(256)) * 1200  # 300 KB, not JSON, not lines

        def write() -> None:
            stdin.write(request + bulk)
            stdin.flush()

        writer = threading.Thread(target=write)
        writer.start()
        assert read_exactly(connection.recv, None, len(request) + len(bulk)) == request + bulk
        writer.join(WAIT)
        # Fabric → client, likewise.
        answer = b'{"jsonrpc":"2.0","id":0,"result":{}}\n' + bulk
        sender = threading.Thread(target=connection.sendall, args=(answer,))
        sender.start()
        assert read_exactly(os.read, stdout.fileno(), len(answer)) == answer
        sender.join(WAIT)
        # The client is done: the fabric sees EOF, the relay ends.
        stdin.close()
        assert connection.recv(1) == b""
        assert relay.wait(WAIT) == 0
        assert TOKEN not in stderr.read().decode()
        connection.close()


def test_the_fabric_closing_ends_the_relay_and_the_clients_stdout(
    listener: tuple[socket.socket, Path],
) -> None:
    server, path = listener
    with start(path) as relay:
        stdout, stderr = relay.stdout, relay.stderr
        assert stdout is not None
        assert stderr is not None
        connection, _ = server.accept()
        connection.settimeout(WAIT)
        read_line(connection)
        connection.sendall(b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n')
        connection.close()
        # What was sent before the close arrives, then EOF: the relay has ended.
        assert stdout.read() == b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n'
        assert relay.wait(WAIT) == 0
        said = stderr.read().decode()
        assert "the fabric closed the connection" in said
        assert TOKEN not in said


def test_a_missing_socket_is_said_on_stderr_with_exit_status_1(tmp_path: Path) -> None:
    absent = tmp_path / "absent.sock"
    relay = subprocess.run(
        [sys.executable, str(RELAY)],
        input=b"",
        check=False,
        capture_output=True,
        timeout=WAIT,
        env={
            "PATH": os.environ["PATH"],
            "REACTOR_FABRIC_FABRIC_SOCKET": str(absent),
            "REACTOR_FABRIC_FABRIC_TOKEN": TOKEN,
        },
    )
    assert relay.returncode == 1
    assert relay.stdout == b""
    stderr = relay.stderr.decode()
    assert f"cannot connect to the fabric socket {absent}: no such socket" in stderr
    assert TOKEN not in stderr


def test_without_a_token_the_relay_does_not_connect_and_exits_2(
    listener: tuple[socket.socket, Path],
) -> None:
    server, path = listener
    with start(path, token=None) as relay:
        _, stderr = relay.communicate(b"", timeout=WAIT)
        assert relay.returncode == 2
        assert "REACTOR_FABRIC_FABRIC_TOKEN is not set" in stderr.decode()
        server.settimeout(0)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
