"""The egress proxy's driver (reactor_fabric.runtime.egress_proxy) on real sockets: a container's
Unix socket in, a destination on this host's loopback out, a resolver the test controls. What a
client in the container sees (the answer's status and reason) and what the trail gets (one
record per connection) are asserted; the decisions themselves are test_egress_decisions'."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

from reactor_fabric._reasons import (
    EGRESS_ADDRESS_REFUSED,
    EGRESS_BAD_REQUEST,
    EGRESS_BUSY,
    EGRESS_CONNECT_FAILED,
    EGRESS_NOT_LISTED,
    EGRESS_UNAUTHORIZED,
    EGRESS_UNRESOLVED,
)
from reactor_fabric.protocol.egress import MAX_REQUEST_HEAD, Allowlist, EgressRecord, IPAddress
from reactor_fabric.runtime import egress_proxy
from reactor_fabric.runtime.egress_proxy import EgressProxy
from tests.unit.protocol.test_egress_decisions import head_of

CONTAINER = "c0ffee" * 10


class Upstream:
    """A destination on 127.0.0.1: echoes with a prefix, and keeps what it was sent."""

    def __init__(self) -> None:
        self.port = 0
        self.received: list[bytes] = []

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        async def handle(stream: trio.SocketStream) -> None:
            got = bytearray()
            while data := await stream.receive_some(65536):
                got += data
                if b"\r\n\r\n" in got and got.startswith(b"GET "):
                    break  # a forwarded request: answer it and close
            self.received.append(bytes(got))
            if got.startswith(b"GET "):
                await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            else:
                await stream.send_all(b"echo:" + bytes(got))
            await stream.aclose()

        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(handle, listeners)


class Resolver:
    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.asked.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ipaddress.ip_address(a) for a in self.table[host]]


class Records(list[EgressRecord]):
    """The proxy's records, with an event for each new one."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = trio.Event()

    def __call__(self, record: EgressRecord) -> None:
        self.append(record)
        self.changed.set()
        self.changed = trio.Event()


class Served:
    def __init__(self, proxy: EgressProxy, path: str, records: Records) -> None:
        self.proxy = proxy
        self.path = path
        self.records = records

    async def ask(self, request: bytes, *, half_close: bool = True) -> bytes:
        """Connect as the container's fabric-stdio would, send, and read until closed."""
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(self.path)
        stream = trio.SocketStream(sock)
        await stream.send_all(request)
        if half_close:
            await stream.send_eof()
        answer = bytearray()
        with trio.fail_after(30):
            while data := await stream.receive_some(65536):
                answer += data
        await stream.aclose()
        return bytes(answer)

    async def record(self, count: int = 1) -> list[EgressRecord]:
        with trio.fail_after(30):
            while len(self.records) < count:
                await self.records.changed.wait()
        return self.records


def listening(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    listener.setblocking(False)
    return listener


@pytest.fixture
async def upstream(nursery: trio.Nursery) -> Upstream:
    served = Upstream()
    await nursery.start(served.serve)
    return served


async def serving(
    nursery: trio.Nursery,
    tmp_path: Path,
    entries: list[str],
    resolver: Resolver | None = None,
    max_connections: int = egress_proxy.MAX_CONNECTIONS,
) -> Served:
    records = Records()
    proxy = EgressProxy(resolver=resolver or Resolver({}), max_connections=max_connections)
    await nursery.start(proxy.run, records)
    path = tmp_path / "1.egress.sock"
    proxy.serve(CONTAINER, "github", Allowlist.of(entries), listening(path), str(path))
    return Served(proxy, str(path), records)


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as opened:
        yield opened
        opened.cancel_scope.cancel()


async def test_a_tunnel_to_a_listed_address_passes_bytes_both_ways_and_is_recorded(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream
) -> None:
    served = await serving(nursery, tmp_path, [f"127.0.0.1:{upstream.port}"])
    answer = await served.ask(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\nhello" % upstream.port
    )
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\necho:hello"
    (record,) = await served.record()
    assert (record.outcome, record.reason) == ("connected", "")
    assert (record.destination, record.address) == (f"127.0.0.1:{upstream.port}", "127.0.0.1")
    assert (record.sent, record.received, record.service) == (5, 10, "github")
    assert record.container == CONTAINER


async def test_a_forwarded_request_reaches_the_destination_in_origin_form_and_closes(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream
) -> None:
    served = await serving(nursery, tmp_path, [f"127.0.0.1:{upstream.port}"])
    # The client keeps its side open (keep-alive): the destination's close ends it.
    answer = await served.ask(
        b"GET http://127.0.0.1:%d/v1/x HTTP/1.1\r\nHost: h\r\nProxy-Connection: keep-alive\r\n\r\n"
        % upstream.port,
        half_close=False,
    )
    assert answer == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    (sent,) = upstream.received
    assert sent.startswith(b"GET /v1/x HTTP/1.1\r\n")
    assert b"proxy-connection" not in sent.lower()
    assert b"connection: close" in sent.lower()


async def test_an_unlisted_destination_gets_403_and_nothing_is_resolved_or_connected(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream
) -> None:
    resolver = Resolver({"evil.test": ["127.0.0.1"]})
    served = await serving(nursery, tmp_path, ["api.github.com:443"], resolver)
    answer = await served.ask(b"CONNECT evil.test:%d HTTP/1.1\r\nHost: x\r\n\r\n" % upstream.port)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"X-Reactor-Fabric-Reason: egress_not_listed" in answer
    assert resolver.asked == []
    assert upstream.received == []
    (record,) = await served.record()
    assert (record.outcome, record.reason) == ("refused", EGRESS_NOT_LISTED)
    assert record.destination == f"evil.test:{upstream.port}"


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "10.0.0.7"])
async def test_a_listed_name_that_resolves_to_a_special_address_gets_403(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream, address: str
) -> None:
    resolver = Resolver({"api.github.com": [address]})
    served = await serving(nursery, tmp_path, [f"api.github.com:{upstream.port}"], resolver)
    answer = await served.ask(
        b"CONNECT api.github.com:%d HTTP/1.1\r\nHost: x\r\n\r\n" % upstream.port
    )
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert EGRESS_ADDRESS_REFUSED.encode() in answer
    assert address.encode() in answer
    assert upstream.received == []
    (record,) = await served.record()
    assert (record.outcome, record.reason) == ("refused", EGRESS_ADDRESS_REFUSED)


async def test_a_listed_name_reaches_loopback_when_that_address_is_listed_too(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream
) -> None:
    resolver = Resolver({"gateway.test": ["127.0.0.1"]})
    entries = [f"gateway.test:{upstream.port}", f"127.0.0.1:{upstream.port}"]
    served = await serving(nursery, tmp_path, entries, resolver)
    answer = await served.ask(
        b"CONNECT gateway.test:%d HTTP/1.1\r\nHost: x\r\n\r\nhi" % upstream.port
    )
    assert answer.endswith(b"echo:hi")
    (record,) = await served.record()
    assert (record.destination, record.address) == (f"gateway.test:{upstream.port}", "127.0.0.1")


async def test_a_name_that_does_not_resolve_gets_502(nursery: trio.Nursery, tmp_path: Path) -> None:
    served = await serving(nursery, tmp_path, ["nowhere.test:443"])
    answer = await served.ask(b"CONNECT nowhere.test:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert EGRESS_UNRESOLVED.encode() in answer
    (record,) = await served.record()
    assert (record.outcome, record.reason) == ("failed", EGRESS_UNRESOLVED)


async def test_a_destination_that_refuses_gets_502(nursery: trio.Nursery, tmp_path: Path) -> None:
    with socket.socket() as taken:  # a port nothing listens on
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
    served = await serving(nursery, tmp_path, [f"127.0.0.1:{port}"])
    answer = await served.ask(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n" % port)
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert EGRESS_CONNECT_FAILED.encode() in answer


async def test_something_that_is_not_a_proxy_request_gets_400(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    served = await serving(nursery, tmp_path, ["api.github.com:443"])
    answer = await served.ask(b"\x16\x03\x01 a TLS hello sent straight at the proxy\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert EGRESS_BAD_REQUEST.encode() in answer


async def test_a_client_that_sends_no_head_is_answered_400_at_the_head_bound(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        served = await serving(nursery, tmp_path, ["api.github.com:443"])
        began = trio.current_time()
        answer = await served.ask(b"CONNECT api.github.com:443 HTTP/1.1\r\n", half_close=False)
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert trio.current_time() - began >= egress_proxy.HEAD_SECONDS
        nursery.cancel_scope.cancel()


async def test_a_head_trickled_a_byte_at_a_time_is_answered_400_at_the_head_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Slowloris: each byte is read at once, and the head's deadline is not moved by any.
    async with trio.open_nursery() as nursery:
        served = await serving(nursery, tmp_path, ["api.github.com:443"])
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(served.path)
        stream = trio.SocketStream(sock)
        began = trio.current_time()

        async def trickle() -> None:
            with contextlib.suppress(trio.BrokenResourceError):  # until the proxy closes
                for byte in b"CONNECT api.github.com:443 HTTP/1.1\r\nX: " + b"a" * 1000:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(1)

        nursery.start_soon(trickle)
        answer = bytearray()
        while data := await stream.receive_some(65536):
            answer += data
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert egress_proxy.HEAD_SECONDS <= trio.current_time() - began < 1000
        (record,) = await served.record()
        assert record.reason == EGRESS_BAD_REQUEST
        nursery.cancel_scope.cancel()
    await stream.aclose()


async def send_head(served: Served, head: bytes, *, cut: int | None) -> bytes:
    """Send ``head`` and a tunnel's first bytes as the container would, in one write or (``cut``)
    its first ``cut`` bytes read by the proxy before the rest is sent; what comes back."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(served.path)
    async with trio.SocketStream(sock) as stream:
        if cut is not None:
            await stream.send_all(head[:cut])
            await trio.testing.wait_all_tasks_blocked()  # read, and more awaited
            head = head[cut:]
        await stream.send_all(head + b"hello")
        await stream.send_eof()
        answer = bytearray()
        with trio.fail_after(30):
            while data := await stream.receive_some(65536):
                answer += data
    return bytes(answer)


@pytest.mark.parametrize("cut", [None, 10_000], ids=["one-read", "two-reads"])
@pytest.mark.parametrize("line", [0, 10], ids=["one-large-header", "small-header-lines"])
async def test_a_head_over_16_kib_is_refused_400_and_nothing_is_connected(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream, cut: int | None, line: int
) -> None:
    # The attack: a complete 40 KB CONNECT head in one write was tunnelled.
    served = await serving(nursery, tmp_path, [f"127.0.0.1:{upstream.port}"])
    head = head_of(40_000, line=line, target=b"127.0.0.1:%d" % upstream.port)
    answer = await send_head(served, head, cut=cut)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"X-Reactor-Fabric-Reason: " + EGRESS_BAD_REQUEST.encode() in answer
    (record,) = await served.record()
    assert (record.outcome, record.reason) == ("refused", EGRESS_BAD_REQUEST)
    assert upstream.received == []


@pytest.mark.parametrize("cut", [None, 10_000], ids=["one-read", "two-reads"])
async def test_a_head_of_exactly_16_kib_is_tunnelled_and_one_byte_more_is_refused(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream, cut: int | None
) -> None:
    served = await serving(nursery, tmp_path, [f"127.0.0.1:{upstream.port}"])
    target = b"127.0.0.1:%d" % upstream.port
    at_bound = await send_head(served, head_of(MAX_REQUEST_HEAD, target=target), cut=cut)
    assert at_bound == b"HTTP/1.1 200 Connection established\r\n\r\necho:hello"
    over = await send_head(served, head_of(MAX_REQUEST_HEAD + 1, target=target), cut=cut)
    assert over.startswith(b"HTTP/1.1 400 ")
    assert upstream.received == [b"hello"]


async def test_connections_over_the_bound_get_503_while_the_others_go_on(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream
) -> None:
    served = await serving(nursery, tmp_path, [f"127.0.0.1:{upstream.port}"], max_connections=1)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(served.path)
    holding = trio.SocketStream(sock)
    await holding.send_all(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n" % upstream.port)
    assert await holding.receive_some(100) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    answer = await served.ask(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n" % upstream.port)
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert EGRESS_BUSY.encode() in answer
    await holding.send_all(b"still here")
    await holding.send_eof()
    assert await holding.receive_some(100) == b"echo:still here"
    await holding.aclose()


async def open_tunnel(served: Served, port: int, more: bytes = b"") -> trio.SocketStream:
    """A tunnel through the proxy to 127.0.0.1:PORT, established and held open."""
    if isinstance(served, ServedTcp):
        stream: trio.SocketStream = await trio.open_tcp_stream("127.0.0.1", int(served.path))
    else:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(served.path)
        stream = trio.SocketStream(sock)
    await stream.send_all(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n%s\r\n" % (port, more))
    with trio.fail_after(30):
        assert await stream.receive_some(100) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    return stream


async def test_the_65th_connection_while_64_are_held_gets_503_egress_busy_and_a_record(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream
) -> None:
    served = await serving(nursery, tmp_path, [f"127.0.0.1:{upstream.port}"])
    held = [await open_tunnel(served, upstream.port) for _ in range(egress_proxy.MAX_CONNECTIONS)]
    answer = await served.ask(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n" % upstream.port)
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"X-Reactor-Fabric-Reason: " + EGRESS_BUSY.encode() in answer
    (record,) = await served.record()
    assert (record.container, record.outcome, record.reason) == (CONTAINER, "refused", EGRESS_BUSY)
    assert record.destination == ""  # answered before its head was read
    for stream in held:
        await stream.aclose()


async def test_a_connection_being_refused_does_not_count_among_those_served(
    tmp_path: Path, upstream: Upstream, mock_clock: trio.testing.MockClock
) -> None:
    # Time stands still: the refused connection stays in its drain (the client keeps it open).
    # It took the place of a served one: the next connection was refused 503 too, though the
    # only one served had ended.
    async with trio.open_nursery() as nursery:
        served = await serving(nursery, tmp_path, [f"127.0.0.1:{upstream.port}"], max_connections=1)
        holding = await open_tunnel(served, upstream.port)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(served.path)
        refused = trio.SocketStream(sock)
        busy = bytearray()
        while data := await refused.receive_some(65536):  # the answer, then the proxy's EOF
            busy += data
        assert busy.startswith(b"HTTP/1.1 503 ")
        await holding.aclose()
        (ended,) = await served.record()  # the one served: not the refusal, still draining
        assert ended.outcome == "connected"
        answer = await served.ask(
            b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\nhi" % upstream.port
        )
        assert answer == b"HTTP/1.1 200 Connection established\r\n\r\necho:hi"
        await refused.aclose()
        nursery.cancel_scope.cancel()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def flood(served: Served, count: int) -> list[socket.socket]:
    """``count`` connections to the proxy that send nothing and stay open, each made once the
    proxy has done what it does with the one before (its backlog never overflows)."""
    clients = []
    for _ in range(count):
        if isinstance(served, ServedTcp):
            client = socket.create_connection(("127.0.0.1", int(served.path)))
        else:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(served.path)  # (with room in the backlog: at once)
        clients.append(client)
        await trio.testing.wait_all_tasks_blocked()
    return clients


def answered(client: socket.socket) -> bytes | None:
    """What the proxy answered and ended with its EOF; None while it has answered nothing
    (read once the proxy is blocked: an answer is then there whole, or not at all)."""
    answer = b""
    try:
        while chunk := client.recv(65536, socket.MSG_DONTWAIT):
            answer += chunk
    except BlockingIOError:
        assert answer == b"", "an answer without its end"
        return None
    return answer


@pytest.mark.parametrize("way_in", ["socket", "tcp"])
async def test_a_flood_of_connections_holds_at_most_80_here_and_each_is_answered_in_turn(
    tmp_path: Path, mock_clock: trio.testing.MockClock, way_in: str
) -> None:
    # The attack: connections opened as fast as they are taken, none sending anything (on a
    # container's socket, straight to it past fabric-stdio). Every one was accepted and held
    # (64 reading a head, the rest draining a 503), in the number the attacker chose.
    # Time stands still but where the test moves it.
    carried = egress_proxy.MAX_CONNECTIONS + egress_proxy.MAX_REFUSING
    async with trio.open_nursery() as nursery:
        if way_in == "tcp":
            served: Served = await serving_tcp(nursery, ["api.github.com:443"])
        else:
            served = await serving(nursery, tmp_path, ["api.github.com:443"])
        await trio.testing.wait_all_tasks_blocked()
        before = open_fds()
        clients = await flood(served, carried + 20)
        assert open_fds() - before - len(clients) == carried  # the rest wait in the backlog
        reading = clients[: egress_proxy.MAX_CONNECTIONS]
        waiting = clients[egress_proxy.MAX_CONNECTIONS :]
        busy: list[bytes] = []
        while waiting:
            answers = [answered(client) for client in waiting]
            done = [answer for answer in answers if answer is not None]
            assert len(done) <= egress_proxy.MAX_REFUSING
            busy += done
            waiting = [c for c, answer in zip(waiting, answers, strict=True) if answer is None]
            # Their drain ends: the next ones are taken, never more than the bound.
            mock_clock.jump(egress_proxy.DRAIN_SECONDS)
            await trio.testing.wait_all_tasks_blocked()
            assert open_fds() - before - len(clients) <= carried
        assert len(busy) == 36
        assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in busy)
        assert all(EGRESS_BUSY.encode() in answer for answer in busy)
        assert [answered(client) for client in reading] == [None] * len(reading)
        assert [r.reason for r in await served.record(36)] == [EGRESS_BUSY] * 36
        for client in clients:
            client.close()
        nursery.cancel_scope.cancel()


async def test_stopping_a_container_closes_its_connections_and_removes_its_socket(
    nursery: trio.Nursery, tmp_path: Path, upstream: Upstream
) -> None:
    served = await serving(nursery, tmp_path, [f"127.0.0.1:{upstream.port}"])
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(served.path)
    open_tunnel = trio.SocketStream(sock)
    await open_tunnel.send_all(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n" % upstream.port)
    assert (await open_tunnel.receive_some(100)).startswith(b"HTTP/1.1 200")
    served.proxy.stop(CONTAINER)
    with trio.fail_after(30):
        assert await open_tunnel.receive_some(100) == b""  # closed by the proxy
        await trio.testing.wait_all_tasks_blocked()
    assert not await trio.Path(served.path).exists()
    await open_tunnel.aclose()
    (record,) = await served.record()
    assert record.outcome == "connected"


async def test_a_container_is_refused_when_the_proxy_does_not_run(tmp_path: Path) -> None:
    proxy = EgressProxy()
    path = tmp_path / "1.egress.sock"
    with pytest.raises(RuntimeError, match="not running"):
        proxy.serve(CONTAINER, "github", Allowlist.of([]), listening(path), str(path))
    assert not path.exists()


# --- the TCP way in (Kubernetes pods): who asks is the token in Proxy-Authorization -----------

POD = "session-pod-0"
POD_TOKEN = "pod-token-0123456789abcdefghijklmnopqrstuv"


def authorization(token: str) -> bytes:
    return b"Proxy-Authorization: Basic " + base64.b64encode(f"rf:{token}".encode()) + b"\r\n"


class ServedTcp(Served):
    async def ask(self, request: bytes, *, half_close: bool = True) -> bytes:
        """Connect as a pod would, to the proxy's TCP port, send, and read until closed."""
        stream = await trio.open_tcp_stream("127.0.0.1", int(self.path))
        await stream.send_all(request)
        if half_close:
            await stream.send_eof()
        answer = bytearray()
        with trio.fail_after(30):
            while data := await stream.receive_some(65536):
                answer += data
        await stream.aclose()
        return bytes(answer)


async def serving_tcp(
    nursery: trio.Nursery,
    entries: list[str],
    max_connections: int = egress_proxy.MAX_CONNECTIONS,
) -> ServedTcp:
    records = Records()
    proxy = EgressProxy(resolver=Resolver({}), max_connections=max_connections)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    await nursery.start(proxy.run, records)
    proxy.serve_tcp(listener)
    proxy.register(POD_TOKEN, POD, "github", Allowlist.of(entries))
    return ServedTcp(proxy, str(port), records)


async def test_a_pod_with_its_token_reaches_a_listed_destination_over_tcp_and_is_recorded(
    nursery: trio.Nursery, upstream: Upstream
) -> None:
    served = await serving_tcp(nursery, [f"127.0.0.1:{upstream.port}"])
    answer = await served.ask(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n%s\r\nhello"
        % (upstream.port, authorization(POD_TOKEN))
    )
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\necho:hello"
    (record,) = await served.record()
    assert (record.container, record.service, record.outcome) == (POD, "github", "connected")
    # The token goes no further than the proxy.
    assert upstream.received == [b"hello"]


async def test_a_pods_unlisted_destination_over_tcp_gets_403(nursery: trio.Nursery) -> None:
    served = await serving_tcp(nursery, ["127.0.0.1:9"])
    answer = await served.ask(
        b"CONNECT example.org:443 HTTP/1.1\r\nHost: x\r\n%s\r\n" % authorization(POD_TOKEN)
    )
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"X-Reactor-Fabric-Reason: " + EGRESS_NOT_LISTED.encode() in answer
    (record,) = await served.record()
    assert (record.container, record.reason) == (POD, EGRESS_NOT_LISTED)


@pytest.mark.parametrize("token", [None, "a-guess-of-a-token", POD_TOKEN[:-1]])
async def test_a_connection_without_a_served_pods_token_gets_407_and_connects_nowhere(
    nursery: trio.Nursery, upstream: Upstream, token: str | None
) -> None:
    served = await serving_tcp(nursery, [f"127.0.0.1:{upstream.port}"])
    answer = await served.ask(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n%s\r\nhello"
        % (upstream.port, b"" if token is None else authorization(token))
    )
    assert answer.startswith(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
    assert b"X-Reactor-Fabric-Reason: " + EGRESS_UNAUTHORIZED.encode() in answer
    (record,) = await served.record()
    assert (record.container, record.outcome, record.reason) == ("", "refused", EGRESS_UNAUTHORIZED)
    assert upstream.received == []


async def test_an_unregistered_pods_token_gets_407_and_its_open_tunnel_ends(
    nursery: trio.Nursery,
) -> None:
    # A destination that never answers nor closes: only the unregistering ends the tunnel.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    silent = listeners[0].socket.getsockname()[1]

    async def hold(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    nursery.start_soon(trio.serve_listeners, hold, listeners)
    served = await serving_tcp(nursery, [f"127.0.0.1:{silent}"])
    stream = await trio.open_tcp_stream("127.0.0.1", int(served.path))
    await stream.send_all(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n%s\r\n" % (silent, authorization(POD_TOKEN))
    )
    with trio.fail_after(30):
        assert await stream.receive_some(65536) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    served.proxy.unregister(POD)
    with trio.fail_after(30):
        assert await stream.receive_some(65536) == b""  # ended by the unregistering
    await stream.aclose()
    answer = await served.ask(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n%s\r\n" % (silent, authorization(POD_TOKEN))
    )
    assert b"X-Reactor-Fabric-Reason: " + EGRESS_UNAUTHORIZED.encode() in answer


async def test_a_pods_head_over_16_kib_is_refused_400_though_it_carries_the_pods_token(
    nursery: trio.Nursery, upstream: Upstream
) -> None:
    served = await serving_tcp(nursery, [f"127.0.0.1:{upstream.port}"])
    head = head_of(40_000, target=b"127.0.0.1:%d" % upstream.port, more=authorization(POD_TOKEN))
    answer = await served.ask(head + b"hello")
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"X-Reactor-Fabric-Reason: " + EGRESS_BAD_REQUEST.encode() in answer
    (record,) = await served.record()
    assert (record.outcome, record.reason) == ("refused", EGRESS_BAD_REQUEST)
    assert upstream.received == []


async def test_a_pods_65th_connection_while_64_are_held_gets_503_egress_busy_and_a_record(
    nursery: trio.Nursery, upstream: Upstream
) -> None:
    served = await serving_tcp(nursery, [f"127.0.0.1:{upstream.port}"])
    token = authorization(POD_TOKEN)
    held = [
        await open_tunnel(served, upstream.port, token) for _ in range(egress_proxy.MAX_CONNECTIONS)
    ]
    answer = await served.ask(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n%s\r\n" % (upstream.port, token)
    )
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"X-Reactor-Fabric-Reason: " + EGRESS_BUSY.encode() in answer
    (record,) = await served.record()
    assert (record.container, record.outcome, record.reason) == (POD, "refused", EGRESS_BUSY)
    for stream in held:
        await stream.aclose()


async def test_pods_connections_once_theirs_leave_the_tcp_way_ins_places_to_others(
    nursery: trio.Nursery, upstream: Upstream
) -> None:
    # One connection at once per pod, 17 places for connections not yet a pod's: 20 pods each
    # hold a tunnel, and a 21st connection is still read and served.
    served = await serving_tcp(nursery, [], max_connections=1)
    pods = [(f"token-{n:02d}-" + "x" * 32, f"pod-{n}") for n in range(21)]
    for token, pod in pods:
        served.proxy.register(token, pod, "github", Allowlist.of([f"127.0.0.1:{upstream.port}"]))
    held = [await open_tunnel(served, upstream.port, authorization(t)) for t, _ in pods[:20]]
    answer = await served.ask(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n%s\r\nhi"
        % (upstream.port, authorization(pods[20][0]))
    )
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\necho:hi"
    for stream in held:
        await stream.aclose()


async def test_the_proxy_binds_its_tcp_way_in_where_it_is_told_to_listen(
    nursery: trio.Nursery,
) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proxy = EgressProxy(listen=("127.0.0.1", port))
    await nursery.start(proxy.run, Records())
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"CONNECT example.org:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    with trio.fail_after(30):
        assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 407 ")
    await stream.aclose()
