"""The orchestrator's HTTP/1.1 server on real socket pairs: how it writes answers (at once when
the kernel takes them, bounded in time when it does not)."""

from __future__ import annotations

import contextlib
import socket

import pytest
import trio
import trio.testing

from reactor_fabric._sockets import LeanSocketStream
from reactor_fabric.protocol.http1 import RequestHead
from reactor_fabric.trio.http_server import (
    ClientGone,
    HttpExchange,
    HttpLimits,
    serve_connection,
)
from tests.http_client import HttpClient

LIMITS = HttpLimits(write_timeout=7.0, body_timeout=5.0)


class AnswersWith:
    """An app answering every request with ``body`` (and noting how its answer went)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.answered = trio.Event()

    async def http(self, exchange: HttpExchange) -> None:
        await exchange.respond(200, self.body)
        self.answered.set()

    def answers_at_once(self, head: RequestHead) -> bool:
        return False

    async def websocket(self, *_args: object) -> None:
        raise AssertionError("no WebSocket here")


class EchoesBody:
    """An app answering every request with its body (and noting what happened to it)."""

    def __init__(self) -> None:
        self.outcome = ""

    async def http(self, exchange: HttpExchange) -> None:
        try:
            body = await exchange.read_body(1 << 20)
        except ClientGone as exc:
            self.outcome = str(exc)
            raise
        await exchange.respond(200, body)
        self.outcome = "answered"

    def answers_at_once(self, head: RequestHead) -> bool:
        return False

    async def websocket(self, *_args: object) -> None:
        raise AssertionError("no WebSocket here")


def socket_streams() -> tuple[trio.SocketStream, LeanSocketStream]:
    client, server = socket.socketpair()
    # Small kernel buffers, so that a few hundred kilobytes are more than the kernel takes.
    for sock in (client, server):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    return trio.SocketStream(trio.socket.from_stdlib_socket(client)), LeanSocketStream(server)


async def test_a_small_answer_on_a_socket_reaches_the_client_whole() -> None:
    client_side, server_side = socket_streams()
    app = AnswersWith(b'{"ok": true}')
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS)
        client = HttpClient(client_side)
        reply = await client.request("GET", "/")
        assert (reply.status, reply.body) == (200, b'{"ok": true}')
        await client.aclose()


async def test_an_answer_the_client_does_not_read_ends_its_connection_at_the_write_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The kernel takes the first part of the answer at once; the rest has to wait for a
    # client that never reads: the deadline, armed only then, still bounds the wait.
    client_side, server_side = socket_streams()
    app = AnswersWith(b"x" * 4 * 1024 * 1024)
    started = trio.current_time()
    with trio.fail_after(10 * LIMITS.write_timeout):  # unbounded: fail, do not hang
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_connection, server_side, app, LIMITS)
            client = HttpClient(client_side)
            await client.send_request("GET", "/")  # and never reads the answer
    assert not app.answered.is_set()
    assert trio.current_time() - started == LIMITS.write_timeout
    # The server closed its side: the client reads what was sent, then the end.
    received = 0
    while data := await client_side.receive_some(1 << 20):
        received += len(data)
    assert 0 < received < len(app.body)
    await client.aclose()


HEAD_OF_A_100_BYTE_POST = (
    b"POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
)


async def test_a_body_that_stops_arriving_ends_its_connection_at_the_body_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    app = EchoesBody()
    started = trio.current_time()
    with trio.fail_after(10 * LIMITS.body_timeout):  # unbounded: fail, do not hang
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_connection, server_side, app, LIMITS)
            await client_side.send_all(HEAD_OF_A_100_BYTE_POST + b"x" * 10)
            await trio.sleep(LIMITS.body_timeout - 1)
            await client_side.send_all(b"x" * 10)  # more, but not all of it in time
    assert trio.current_time() - started == LIMITS.body_timeout
    assert app.outcome == "the body did not arrive within 5 s"
    assert await client_side.receive_some() == b""  # closed, nothing answered


async def test_a_body_arriving_in_pieces_within_the_deadline_is_answered() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    app = EchoesBody()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS)
        client = HttpClient(client_side)
        await client_side.send_all(HEAD_OF_A_100_BYTE_POST)
        for _ in range(10):
            await trio.testing.wait_all_tasks_blocked()
            await client_side.send_all(b"y" * 10)
        reply = await client.read_head()
        assert reply.status == 200
        body = b""
        while (chunk := await client.read_chunk()) is not None:
            body += chunk
        assert body == b"y" * 100
        assert app.outcome == "answered"
        await client.aclose()


class RefusesWithoutReading:
    """An app that refuses every request (as the token check does), reading none of it but
    what :meth:`HttpExchange.discard_body` reads."""

    def __init__(self) -> None:
        self.refused = 0

    async def http(self, exchange: HttpExchange) -> None:
        self.refused += 1
        await exchange.discard_body(1 << 10, 1.0)
        await exchange.respond(401, b'{"error": "no token"}')

    def answers_at_once(self, head: RequestHead) -> bool:
        return False

    async def websocket(self, *_args: object) -> None:
        raise AssertionError("no WebSocket here")


async def test_a_refusal_reads_the_body_still_coming_so_the_connection_ends_cleanly() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    app = RefusesWithoutReading()

    async def answers(count: int) -> bytes:
        received = b""
        while received.count(b"HTTP/1.1 401") < count or not received.endswith(b"}"):
            received += await client_side.receive_some()
        return received

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS)
        await client_side.send_all(HEAD_OF_A_100_BYTE_POST)
        await trio.testing.wait_all_tasks_blocked()
        await client_side.send_all(b"z" * 100)  # the body comes after the refusal began
        assert b'{"error": "no token"}' in await answers(1)
        # The request was read whole: the connection was not dropped with it unread (which a
        # socket turns into a reset), and carries the next request.
        await client_side.send_all(HEAD_OF_A_100_BYTE_POST + b"z" * 100)
        await answers(1)
        assert app.refused == 2
        await client_side.aclose()


async def test_a_refusal_reads_no_more_of_a_body_than_its_bound() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    app = RefusesWithoutReading()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS)
        client = HttpClient(client_side)
        head = HEAD_OF_A_100_BYTE_POST.replace(b"content-length: 100", b"content-length: 4096")
        await client_side.send_all(head + b"z" * 4096)
        assert (await client.read_head()).status == 401  # refused all the same
        while await client.read_chunk() is not None:
            pass
        assert await client_side.receive_some() == b""  # then closed: too much to read
        await client.aclose()


class WaitsForTheClient:
    """An app that, like a POST waiting for its response, watches the connection until the test
    lets it answer."""

    def __init__(self) -> None:
        self.waiting = trio.CancelScope()
        self.requests = 0

    async def http(self, exchange: HttpExchange) -> None:
        self.requests += 1
        if self.requests == 1:
            with self.waiting:
                await exchange.wait_disconnect()
        await exchange.respond(200, b"{}")

    def answers_at_once(self, head: RequestHead) -> bool:
        return False

    async def websocket(self, *_args: object) -> None:
        raise AssertionError("no WebSocket here")


async def test_what_a_client_sends_ahead_of_its_answer_is_read_only_up_to_the_bound() -> None:
    client_side, server_side = socket_streams()
    app = WaitsForTheClient()
    limits = HttpLimits(read_ahead_bytes=64 * 1024)
    flood = 4 * 1024 * 1024
    ahead = b"POST /next HTTP/1.1\r\nhost: h\r\ncontent-length: %d\r\n\r\n" % flood
    sent = 0

    async def send_ahead() -> None:
        nonlocal sent
        with contextlib.suppress(trio.BrokenResourceError):  # (closed after the test)
            for _ in range(flood // 16384):
                await client_side.send_all(b"z" * 16384)
                sent += 16384

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, limits)
        await client_side.send_all(b"GET /first HTTP/1.1\r\nhost: h\r\n\r\n" + ahead)
        nursery.start_soon(send_ahead)
        await trio.testing.wait_all_tasks_blocked()
        # The server stopped reading: the rest waits in the client (TCP's flow control), not
        # in the orchestrator's memory. (The bound, one read and the kernel's buffers.)
        assert sent < 64 * 1024 + 64 * 1024 + 256 * 1024
        app.waiting.cancel()
        client = HttpClient(client_side)
        assert (await client.read_head()).status == 200  # the waiting request is answered
        nursery.cancel_scope.cancel()
    await client_side.aclose()


async def test_bytes_that_are_not_http_get_a_400_and_the_end_of_the_connection() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, AnswersWith(b"{}"), LIMITS)
        await client_side.send_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 4)
        received = b""
        while chunk := await client_side.receive_some():
            received += chunk
        assert received.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert received.endswith(b'{"error": "malformed HTTP request"}')


async def test_a_connection_that_sends_no_request_is_closed_at_the_header_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    limits = HttpLimits(header_timeout=10.0, keepalive_timeout=5.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, AnswersWith(b"{}"), limits)
        began = trio.current_time()
        assert await client_side.receive_some() == b""  # closed, nothing said
        assert trio.current_time() - began == pytest.approx(10.0)


async def test_a_kept_alive_connection_carries_requests_until_it_idles_past_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    limits = HttpLimits(header_timeout=10.0, keepalive_timeout=5.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, AnswersWith(b"{}"), limits)
        client = HttpClient(client_side)
        for pause in (0.0, 4.9, 4.9):  # each within the keep-alive deadline of the one before
            await trio.sleep(pause)
            assert (await client.request("GET", "/x")).status == 200  # (no body: not read)
        answered = trio.current_time()
        assert await client_side.receive_some() == b""  # then idle: closed
        assert trio.current_time() - answered == pytest.approx(5.0)
