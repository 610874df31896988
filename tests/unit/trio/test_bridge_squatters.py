"""The stdio bridge sends nothing to a loopback listener that is not the user's orchestrator.

The attack: another local user binds the orchestrator's port while it is not running (any
port above 1024 needs no privilege), or ``[::1]:PORT`` — a socket of its own — while it runs
on ``127.0.0.1``; the bridge that a client (Claude Desktop) starts at launch dials it. Before
the fix the bridge sent that listener ``Authorization: Bearer TOKEN`` — the record's or the
token file's — and the user's mounts. Each squatter here is a real process of another uid (the
tests run as root, as CI does, and drop to it) and reports every byte it received.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from reactor_fabric.config.token_record import record_name
from reactor_fabric.policy.listener_owner import Endpoint, connection_owner, trusted_owner
from reactor_fabric.trio.bridge import NotYourOrchestrator, open_orchestrator_stream
from tests.squatter import SQUATTER_UID, free_port, needs_squatters, squatting

REPO = Path(__file__).resolve().parents[3]
TOKEN = "t0ken-of-the-user-0123456789abcdefghijklmnopq"
RECORDED = "rec0rded-token-0123456789abcdefghijklmnopqrst"

pytestmark = needs_squatters


def users_files(home: Path, port: int) -> dict[str, str]:
    """A user with a token file and the port's token record (as a killed orchestrator leaves
    it): the two things the bridge may send on loopback."""
    config = home / ".config" / "reactor-fabric"
    config.mkdir(parents=True, mode=0o700)
    (config / "token").write_text(TOKEN + "\n")
    (config / "token").chmod(0o600)
    runtime = home / "run"
    (runtime / "reactor-fabric").mkdir(parents=True, mode=0o700)
    runtime.chmod(0o700)
    record = runtime / "reactor-fabric" / record_name(port)
    record.write_text(f"{RECORDED}\norchestrator 1 0123456789abcdef\n")
    record.chmod(0o600)
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(runtime),
    }


def bridge(url: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    return subprocess.run(
        [sys.executable, "-m", "reactor_fabric", "connect", url, "--no-mount", *extra],
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        input=json.dumps(initialize) + "\n",
        env=env,
    )


def assert_refused_as_not_yours(done: subprocess.CompletedProcess[str], where: str) -> None:
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert answer["id"] == 1
    assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (
        -32004,
        "listener_not_yours",
    )
    assert f"{where} (uid {SQUATTER_UID}) is not your orchestrator" in answer["error"]["message"]
    line, rest = done.stderr.split("\n", 1)
    assert line.startswith("reactor-fabric connect: the listener at ")
    assert rest == ""
    assert TOKEN not in done.stderr + done.stdout
    assert RECORDED not in done.stderr + done.stdout


def test_a_squatter_on_the_port_of_a_stopped_orchestrator_is_sent_nothing(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = users_files(tmp_path, port)
    with squatting("127.0.0.1", port) as squatter:
        done = bridge(f"ws://127.0.0.1:{port}/mcp", env)
        received = squatter.finish()
    assert_refused_as_not_yours(done, f"127.0.0.1:{port}")
    assert received == [""]  # it was reached, and got not one byte


def test_a_squatter_on_ipv6_loopback_beside_a_running_orchestrator_is_sent_nothing(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = users_files(tmp_path, port)
    with StandIn("127.0.0.1", port) as orchestrator, squatting("::1", port) as squatter:
        done = bridge(f"ws://[::1]:{port}/mcp", env)
        received = squatter.finish()
    assert_refused_as_not_yours(done, f"[::1]:{port}")
    assert received == [""]
    assert orchestrator.authorizations == []  # nothing was dialled there either


def test_the_users_own_orchestrator_beside_a_squatter_gets_the_recorded_token(
    tmp_path: Path,
) -> None:
    # The same squatter, but the bridge dials 127.0.0.1, where the user's orchestrator (here a
    # stand-in of root's, as a root orchestrator is) listens: served as always.
    port = free_port()
    env = users_files(tmp_path, port)
    with StandIn("127.0.0.1", port) as orchestrator, squatting("::1", port) as squatter:
        done = bridge(f"ws://127.0.0.1:{port}/mcp", env)
        received = squatter.finish()
    assert done.returncode == 0, done.stderr
    assert orchestrator.authorizations == [f"Bearer {RECORDED}"]
    assert received == []


def test_an_account_named_with_orchestrator_user_is_trusted_with_the_token(
    tmp_path: Path,
) -> None:
    # The check is what decides: the same listener, named as the orchestrator's account,
    # gets the handshake (a demanding set-up: an orchestrator run as a service account).
    port = free_port()
    env = users_files(tmp_path, port)
    with squatting("127.0.0.1", port) as squatter:
        done = bridge(f"ws://127.0.0.1:{port}/mcp", env, "--orchestrator-user", str(SQUATTER_UID))
        received = squatter.finish()
    assert done.returncode == 1  # it never answers the handshake: unreachable, no fallback
    assert len(received) == 1
    assert f"Bearer {RECORDED}" in received[0]


async def test_localhost_resolving_to_ipv6_first_reaches_the_users_listener_not_the_squatters(
    tmp_path: Path,
) -> None:
    # Debian and Ubuntu resolve localhost to ::1 first; a squatter there is skipped (sent
    # nothing) and the user's orchestrator on 127.0.0.1 is the connection kept.
    port = free_port()

    class LocalhostIPv6First(trio.abc.HostnameResolver):
        async def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            assert host in (b"localhost", "localhost")
            return [
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", int(port), 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", int(port))),
            ]

        async def getnameinfo(self, sockaddr: Any, flags: int) -> Any:
            raise NotImplementedError

    with StandIn("127.0.0.1", port), squatting("::1", port) as squatter:
        trio.socket.set_custom_hostname_resolver(LocalhostIPv6First())
        try:
            stream = await open_orchestrator_stream(f"ws://localhost:{port}/mcp")
        finally:
            trio.socket.set_custom_hostname_resolver(None)
        async with stream:
            assert isinstance(stream, trio.SocketStream)
            assert stream.socket.getpeername()[:2] == ("127.0.0.1", port)
        received = await trio.to_thread.run_sync(squatter.finish)
    assert received == [""]


async def test_only_squatters_on_every_address_of_localhost_is_a_refusal_naming_them() -> None:
    port = free_port()
    with squatting("127.0.0.1", port) as first, squatting("::1", port) as second:
        with pytest.raises(NotYourOrchestrator) as refused:
            await open_orchestrator_stream(f"ws://127.0.0.1:{port}/mcp")
        for squatter in (first, second):
            await trio.to_thread.run_sync(squatter.finish)
    assert refused.value.error["data"]["reason"] == "listener_not_yours"
    assert f"127.0.0.1:{port} (uid {SQUATTER_UID})" in str(refused.value)


# --- the owner as /proc/net/tcp says ----------------------------------------------------------

HEADING = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"


def row(local: str, remote: str, state: str, uid: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  {uid} 0 1"


SERVER = Endpoint.of(("127.0.0.1", 8765))
CLIENT = Endpoint.of(("127.0.0.1", 40000))
# 127.0.0.1 as a little-endian machine prints it; 8765 = 0x223D, 40000 = 0x9C40.
LOCAL, REMOTE = "0100007F:223D", "0100007F:9C40"


def test_the_owner_is_the_uid_of_the_servers_end_of_exactly_this_connection() -> None:
    if sys.byteorder != "little":
        pytest.skip("the rows are written as a little-endian kernel prints them")
    rows = [
        row(LOCAL, "00000000:0000", "0A", 0),  # the listener itself
        row(REMOTE, LOCAL, "01", 0),  # the bridge's own end
        row(LOCAL, "0100007F:9C41", "01", 1000),  # another client's connection
        row(LOCAL, REMOTE, "01", 4001),
    ]
    assert connection_owner(rows, SERVER, CLIENT) == 4001


def test_a_time_wait_entry_printed_with_uid_0_is_not_taken_for_roots() -> None:
    # A squatter that closes at once leaves an entry the kernel prints with uid 0.
    if sys.byteorder != "little":
        pytest.skip("the rows are written as a little-endian kernel prints them")
    assert connection_owner([row(LOCAL, REMOTE, "06", 0)], SERVER, CLIENT) is None
    assert not trusted_owner(None, own_uid=1000)


def test_a_dual_stack_listeners_ipv4_mapped_entry_is_this_connection() -> None:
    mapped = "0000000000000000FFFF00000100007F:223D"
    peer = "0000000000000000FFFF00000100007F:9C40"
    if sys.byteorder != "little":
        pytest.skip("the rows are written as a little-endian kernel prints them")
    assert connection_owner([row(mapped, peer, "01", 1000)], SERVER, CLIENT) == 1000


def test_trusted_owners_are_the_user_root_and_accounts_named() -> None:
    assert trusted_owner(1000, own_uid=1000)
    assert trusted_owner(0, own_uid=1000)
    assert trusted_owner(997, own_uid=1000, also=[997])
    assert not trusted_owner(4001, own_uid=1000, also=[997])


# --- a stand-in for the user's orchestrator ---------------------------------------------------


class StandIn(threading.Thread):
    """One WebSocket at a time (wsproto over a plain socket, owned by this test's uid): it
    answers the registration, echoes messages, and keeps each Authorization header it got."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server((host, port))
        self.listener.settimeout(0.1)
        self.authorizations: list[str] = []
        self.stopping = threading.Event()

    def __enter__(self) -> StandIn:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.join(timeout=30)
        self.listener.close()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                self.serve(conn)

    def serve(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        ws = WSConnection(ConnectionType.SERVER)
        while data := conn.recv(65536):
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Request):
                    for name, value in event.extra_headers:
                        if name.lower() == b"authorization":
                            self.authorizations.append(value.decode())
                    conn.sendall(ws.send(AcceptConnection(subprotocol="mcp")))
                elif isinstance(event, TextMessage):
                    message = json.loads(event.data)
                    if message.get("method") == "fabric/registerClient":
                        answer = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
                        conn.sendall(ws.send(TextMessage(json.dumps(answer))))
                    else:
                        conn.sendall(ws.send(TextMessage(event.data)))
                elif isinstance(event, CloseConnection):
                    conn.sendall(ws.send(event.response()))
                    return
