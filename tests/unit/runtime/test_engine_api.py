"""The engine client against a fake engine that misbehaves: connections it closed while idle,
answers too large, too slow or not HTTP, errors in its own words, the attach's upgrade.

The fake engine is a thread serving a Unix socket; each connection it accepts is handled by
the test's script (one call per request read), which answers with raw bytes. The real engines
(Docker and Podman) run the same client in the integration tests.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reactor_fabric.runtime import engine_api
from reactor_fabric.runtime.engine_api import (
    AttachNotHandedOver,
    EngineAddress,
    EngineClient,
    EngineError,
    EngineUnreachable,
    ImageNotFound,
    NotFound,
)
from reactor_fabric.runtime.engines import EngineAddressError

VERSION = {"Version": "20.10.24", "ApiVersion": "1.41"}


class Request:
    def __init__(self, head: bytes, body: bytes) -> None:
        first, *lines = head.decode().split("\r\n")
        self.method, self.target, _ = first.split(" ")
        self.headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        self.body = body


# What a script does with a request: returns the bytes to answer (None: close the connection).
Script = Callable[[Request, socket.socket], bytes | None]


def answer(status: int, body: object = None, *, close: bool = False) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\n"
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + data


class FakeEngine:
    def __init__(self, path: Path, script: Script) -> None:
        self.path = str(path)
        self.script = script
        self.requests: list[Request] = []
        self.connections = 0
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(self.path)
        self._listener.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # (a client that went)
            self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                more = conn.recv(65536)
                if not more:
                    return
                buffer += more
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            request = Request(head, b"")
            length = int(request.headers.get("content-length", "0"))
            while len(buffer) < length:
                buffer += conn.recv(65536)
            request.body, buffer = buffer[:length], buffer[length:]
            if not request.target.endswith("/version"):
                self.requests.append(request)
            reply = (
                answer(200, VERSION) if request.target == "/version" else self.script(request, conn)
            )
            if reply is None:
                return
            conn.sendall(reply)

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Callable[[Script], EngineClient]]:
    made: list[tuple[FakeEngine, EngineClient]] = []

    def start(script: Script) -> EngineClient:
        fake = FakeEngine(tmp_path / f"engine{len(made)}.sock", script)
        client = EngineClient(EngineAddress.parse(f"unix://{fake.path}"), timeout=2.0)
        made.append((fake, client))
        client.fake = fake  # type: ignore[attr-defined]
        return client

    yield start
    for fake, client in made:
        client.close()
        fake.close()


def test_requests_carry_the_api_version_the_engine_gave_and_reuse_one_connection(
    engine: Callable[[Script], EngineClient],
) -> None:
    client = engine(lambda request, _conn: answer(200, {"Id": "c0ffee"}))
    assert client.inspect_container("c0ffee") == {"Id": "c0ffee"}
    assert client.inspect_container("c0ffee") == {"Id": "c0ffee"}
    fake = client.fake  # type: ignore[attr-defined]
    assert [r.target for r in fake.requests] == ["/v1.41/containers/c0ffee/json"] * 2
    # One connection, kept alive, for the version and both inspects.
    assert fake.connections == 1


def test_a_create_sends_its_body_as_json_and_its_name_in_the_query(
    engine: Callable[[Script], EngineClient],
) -> None:
    client = engine(lambda request, _conn: answer(201, {"Id": "c0ffee", "Warnings": []}))
    assert client.create_container({"Image": "img", "Env": ["A=1"]}, name="rf-x-0") == "c0ffee"
    [request] = client.fake.requests  # type: ignore[attr-defined]
    assert request.target == "/v1.41/containers/create?name=rf-x-0"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.body) == {"Image": "img", "Env": ["A=1"]}


def test_a_connection_the_engine_closed_while_idle_is_replaced_and_the_request_sent_once(
    engine: Callable[[Script], EngineClient],
) -> None:
    served: list[str] = []

    def once_then_close(request: Request, conn: socket.socket) -> bytes | None:
        served.append(request.target)
        # Answer, then go: the client pools a connection the engine no longer reads.
        conn.sendall(answer(200, {"n": len(served)}))
        conn.shutdown(socket.SHUT_RDWR)
        return None

    client = engine(once_then_close)
    assert client.inspect_container("a") == {"n": 1}
    assert client.inspect_container("b") == {"n": 2}
    assert served == ["/v1.41/containers/a/json", "/v1.41/containers/b/json"]


def test_the_engines_errors_are_its_own_words_and_404_says_what_was_not_found(
    engine: Callable[[Script], EngineClient],
) -> None:
    def refuse(request: Request, _conn: socket.socket) -> bytes:
        if "/images/" in request.target:
            return answer(404, {"message": "no such image: ghost:1"})
        if request.target.endswith("/start"):
            return answer(409, {"message": "container is being removed"})
        if request.target.endswith("/create?name=x"):
            return answer(404, {"message": "No such image: ghost:1"})
        return answer(404, {"message": "No such container: nope"})

    client = engine(refuse)
    with pytest.raises(ImageNotFound, match="no such image: ghost:1"):
        client.inspect_image("ghost:1")
    with pytest.raises(ImageNotFound):
        client.create_container({"Image": "ghost:1"}, name="x")
    with pytest.raises(NotFound) as not_found:
        client.inspect_container("nope")
    assert not isinstance(not_found.value, ImageNotFound)
    assert not_found.value.explanation == "No such container: nope"
    with pytest.raises(EngineError) as refused:
        client.start("c0ffee")
    assert (refused.value.status_code, refused.value.explanation) == (
        409,
        "container is being removed",
    )


def test_an_answer_over_the_bound_is_refused_before_it_is_all_read(
    engine: Callable[[Script], EngineClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_api, "MAX_ANSWER_BYTES", 1000)
    client = engine(lambda request, _conn: answer(200, ["x" * 100] * 20))
    with pytest.raises(EngineUnreachable, match="over 1000 bytes"):
        client.containers(labels=["a=b"])


def test_an_engine_that_does_not_answer_in_time_is_unreachable_not_waited_for(
    engine: Callable[[Script], EngineClient],
) -> None:
    release = threading.Event()

    def stall(request: Request, _conn: socket.socket) -> bytes:
        release.wait(10)
        return answer(200, {})

    client = engine(stall)
    client.api_version()
    client.timeout = 0.2
    try:
        with pytest.raises(EngineUnreachable, match="timed out"):
            client.request("GET", "/info", timeout=0.2)
    finally:
        release.set()


def test_an_answer_that_is_not_http_is_unreachable(
    engine: Callable[[Script], EngineClient],
) -> None:
    client = engine(lambda request, _conn: b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    with pytest.raises(EngineUnreachable):
        client.info()


def test_no_engine_at_the_socket_is_unreachable(tmp_path: Path) -> None:
    client = EngineClient(EngineAddress.parse(f"unix://{tmp_path}/none.sock"), timeout=1)
    with pytest.raises(EngineUnreachable, match="FileNotFoundError"):
        client.version()


def test_the_attach_is_handed_over_as_a_socket_after_the_upgrade(
    engine: Callable[[Script], EngineClient],
) -> None:
    def upgrade(request: Request, conn: socket.socket) -> bytes | None:
        assert request.headers["upgrade"] == "tcp"
        conn.sendall(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
        conn.sendall(conn.recv(100).upper())  # the container's side: an echo
        return None

    client = engine(upgrade)
    sock = client.attach_socket("c0ffee", {"stdin": "1", "stream": "1"})
    with sock:
        sock.sendall(b"hello")
        assert sock.recv(100) == b"HELLO"
    [request] = client.fake.requests  # type: ignore[attr-defined]
    assert request.target == "/v1.41/containers/c0ffee/attach?stdin=1&stream=1"


def test_bytes_before_the_attach_is_handed_over_are_refused_not_dropped(
    engine: Callable[[Script], EngineClient],
) -> None:
    def early(request: Request, _conn: socket.socket) -> bytes:
        return b"HTTP/1.1 101 UPGRADED\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\nearly"

    client = engine(early)
    with pytest.raises(EngineUnreachable, match="before the attach"):
        client.attach_socket("c0ffee", {"stdin": "1"})


def test_an_attach_the_engine_closes_before_answering_is_the_engine_unreachable(
    engine: Callable[[Script], EngineClient],
) -> None:
    # A new connection closed before any answer is not a stale keep-alive one to retry: the
    # client says the engine is unreachable (users see docker_unavailable, not attach_failed).
    client = engine(lambda request, _conn: None)
    with pytest.raises(EngineUnreachable, match="closed the connection"):
        client.attach_socket("c0ffee", {"stdin": "1"})


def test_an_attach_answered_without_handing_the_connection_over_is_not_relayed(
    engine: Callable[[Script], EngineClient],
) -> None:
    client = engine(lambda request, _conn: answer(204))
    with pytest.raises(AttachNotHandedOver):
        client.attach_socket("c0ffee", {"stdin": "1"})


def test_an_attach_the_engine_refuses_is_its_error(
    engine: Callable[[Script], EngineClient],
) -> None:
    client = engine(lambda request, _conn: answer(404, {"message": "No such container: c"}))
    with pytest.raises(NotFound, match="No such container"):
        client.attach_socket("c", {"stdin": "1"})


def test_a_pull_that_fails_in_its_progress_is_an_error(
    engine: Callable[[Script], EngineClient],
) -> None:
    progress = b'{"status":"Pulling"}\n{"error":"manifest unknown","errorDetail":{}}\n'

    def pull(request: Request, _conn: socket.socket) -> bytes:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(progress)}\r\n\r\n"
        return head.encode() + progress

    client = engine(pull)
    with pytest.raises(EngineError, match="manifest unknown"):
        client.pull("img", "1", timeout=5)


@pytest.mark.parametrize(
    ("url", "unix", "host", "port", "tls"),
    [
        ("unix:///run/podman/podman.sock", "/run/podman/podman.sock", None, None, False),
        ("/var/run/docker.sock", "/var/run/docker.sock", None, None, False),
        ("unix://", "/var/run/docker.sock", None, None, False),
        ("tcp://10.0.0.5:2375", None, "10.0.0.5", 2375, False),
        ("tcp://engine", None, "engine", 2375, False),
    ],
)
def test_engine_addresses_are_read_as_dockers_own_tools_read_them(
    url: str, unix: str | None, host: str | None, port: int | None, tls: bool
) -> None:
    address = EngineAddress.parse(url, {})
    assert address.unix_path == unix
    if host is not None:
        assert (address.host, address.port, address.tls is not None) == (host, port, tls)


def test_docker_host_is_read_when_no_address_is_given_and_ssh_is_refused() -> None:
    assert EngineAddress.parse(None, {"DOCKER_HOST": "unix:///x.sock"}).unix_path == "/x.sock"
    assert EngineAddress.parse(None, {}).unix_path == "/var/run/docker.sock"
    with pytest.raises(EngineAddressError, match="ssh"):
        EngineAddress.parse(None, {"DOCKER_HOST": "ssh://me@host"})
    with pytest.raises(EngineAddressError, match="TLS files"):
        EngineAddress.parse(
            "tcp://h:2376", {"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": "/nonexistent"}
        )
