"""The fabric relay: the stdio MCP server Claude Code is given as ``fabric``
(``--mcp-config``), which is only a pipe to the orchestrator's fabric endpoint of the call's
child session.

The container has no network; the orchestrator binds a Unix socket into it instead
(``REACTOR_FABRIC_FABRIC_SOCKET``, default ``/.reactor-fabric/fabric.sock``). The relay connects
to it, sends ONE line that authenticates the connection — the JSON-RPC notification
``{"jsonrpc":"2.0","method":"fabric/child","params":{"token":TOKEN}}`` with the token of
``REACTOR_FABRIC_FABRIC_TOKEN`` (valid for that child session while the call lasts) — and from
then on copies bytes unchanged both ways between its stdin/stdout (Claude Code's MCP client, line
JSON-RPC) and the socket. It reads no message: the orchestrator's side speaks MCP.

Why stdio and not an ``http`` MCP server on the container's loopback: Claude Code's MCP HTTP
client goes through ``HTTP_PROXY``/``HTTPS_PROXY`` (which ``egress:`` sets to its egress
forwarder) unless ``NO_PROXY`` names the host, and ``NO_PROXY`` would take the model API's
loopback traffic off the proxy too; a stdio server has no port, no proxy and no second forwarder.

Single-threaded (one ``select`` loop), at most one chunk held per direction, and a peer that
takes no bytes for :data:`STALL` seconds ends it. It exits when either side closes: EOF on stdin
(the CLI is done) half-closes the socket and ends; EOF on the socket (the child session ended)
closes stdout and ends. The token is never printed.

Exit status: 0 either side closed; 1 the socket cannot be reached, or a peer stalled or failed;
2 no token.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import socket
import sys
import time
from collections.abc import Callable

SOCKET_ENV = "REACTOR_FABRIC_FABRIC_SOCKET"
TOKEN_ENV = "REACTOR_FABRIC_FABRIC_TOKEN"  # noqa: S105 - the name, not a token
DEFAULT_SOCKET = "/.reactor-fabric/fabric.sock"
AUTH_METHOD = "fabric/child"
# Bytes read at once from either side (and so held at most, per direction).
CHUNK = 64 * 1024
# Seconds a side may take no bytes we hold for it before the relay gives up.
STALL = 60.0
# Seconds to connect to the socket (a local socket: its listener answers at once or never).
CONNECT_TIMEOUT = 10.0


def auth_line(token: str) -> bytes:
    """The first line the relay sends: the notification that authenticates the connection."""
    message = {"jsonrpc": "2.0", "method": AUTH_METHOD, "params": {"token": token}}
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _say(text: str) -> None:
    sys.stderr.write(f"fabric-relay: {text}\n")
    sys.stderr.flush()


def connect(path: str) -> socket.socket | None:
    """The connection to the fabric socket, or ``None`` (said on stderr) when there is none."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        why = "no such socket" if isinstance(exc, FileNotFoundError) else exc.strerror or str(exc)
        _say(f"cannot connect to the fabric socket {path}: {why}")
        return None
    return sock


def _write_all(fd: int, data: bytes, stall: float) -> bool:
    """``data`` written to the non-blocking ``fd``, or ``False`` when it took nothing for
    ``stall`` seconds or failed."""
    view = memoryview(data)
    deadline = time.monotonic() + stall
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            _, writable, _ = select.select([], [fd], [], remaining)
            if not writable:
                continue
            written = os.write(fd, view)
        except BlockingIOError:
            continue
        except OSError:
            return False
        view = view[written:]
        deadline = time.monotonic() + stall
    return True


def _read(read: Callable[[int], bytes]) -> bytes | None:
    """A chunk; ``b""`` at EOF or when the read failed; ``None`` when nothing is there yet."""
    try:
        return read(CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def relay(stdin: int, stdout: int, sock: socket.socket, token: str, stall: float = STALL) -> int:
    """The auth line, then bytes both ways until either side closes; the exit status."""
    sock.setblocking(False)
    os.set_blocking(stdin, False)
    os.set_blocking(stdout, False)
    peer = sock.fileno()
    if not _write_all(peer, auth_line(token), stall):
        _say("the fabric took no authentication line")
        return 1
    from_client = functools.partial(os.read, stdin)
    while True:
        try:
            readable, _, _ = select.select([stdin, peer], [], [])
        except InterruptedError:
            continue
        # One chunk at a time, written out before the next read: nothing piles up.
        if stdin in readable:
            chunk = _read(from_client)
            if chunk == b"":
                # The CLI is done with the server: the fabric sees EOF, the relay ends.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
                return 0
            if chunk and not _write_all(peer, chunk, stall):
                _say("the fabric stopped taking messages")
                return 1
        if peer in readable:
            chunk = _read(sock.recv)
            if chunk == b"":
                _say("the fabric closed the connection")
                return 0
            if chunk and not _write_all(stdout, chunk, stall):
                _say("the MCP client stopped reading")
                return 1


def main() -> int:
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        _say(f"no token: {TOKEN_ENV} is not set")
        return 2
    path = os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
    sock = connect(path)
    if sock is None:
        return 1
    try:
        return relay(sys.stdin.fileno(), sys.stdout.fileno(), sock, token)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
