"""A deferred answer (HttpExchange.defer): written by the task that has it, the request ended
there without the connection's handler task; or handed back to that task, which runs the
handler's continuation. Over a socket pair with small kernel buffers (the orchestrator's own
socket stream writes without waiting only on a socket), and over a memory stream."""

from __future__ import annotations

import h11
import pytest
import trio
import trio.testing

from reactor_fabric.protocol.http1 import RequestHead
from reactor_fabric.trio.http_server import (
    ConnectionCounts,
    HttpExchange,
    HttpLimits,
    serve_connection,
)
from tests.http_client import HttpClient
from tests.unit.trio.test_http_server import socket_streams

LIMITS = HttpLimits(header_timeout=10.0, keepalive_timeout=5.0, write_timeout=7.0)


class Defers:
    """An app that leaves every answer to another task, as a POST leaves its response to the
    task that delivers it; the test plays that task."""

    def __init__(self) -> None:
        self.exchanges: list[HttpExchange] = []
        self.tasks: list[str] = []  # which task served each request
        self.at_once = True
        self.came = trio.Event()
        self.resumed = 0
        self.dropped = 0

    async def http(self, exchange: HttpExchange) -> None:
        await exchange.read_body(1024)  # (as a POST does before it defers)

        async def resume() -> None:
            self.resumed += 1
            await exchange.respond(200, b'{"resumed": true}')

        def drop() -> None:
            self.dropped += 1

        exchange.defer(resume, drop)
        self.tasks.append(trio.lowlevel.current_task().name)
        self.exchanges.append(exchange)
        self.came.set()

    def answers_at_once(self, head: RequestHead) -> bool:
        return self.at_once

    async def websocket(self, *_args: object) -> None:
        raise AssertionError("no WebSocket here")

    async def next_exchange(self) -> HttpExchange:
        await self.came.wait()
        self.came = trio.Event()
        return self.exchanges[-1]


async def test_an_answer_written_by_the_task_that_has_it_ends_the_request_there() -> None:
    client_side, server_side = socket_streams()
    app = Defers()
    counts = ConnectionCounts()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS, counts)
        client = HttpClient(client_side)
        for n in range(3):  # one kept-alive connection
            await client.send_request("POST", "/x", {"n": n})
            exchange = await app.next_exchange()
            assert counts.busy == 1
            exchange.answer_now(200, b'{"n": %d}' % n)
            assert exchange.answered_now
            assert counts.busy == 0  # ended here, in this task
            reply = await client.read_reply()
            assert (reply.status, reply.body) == (200, b'{"n": %d}' % n)
        assert (app.resumed, app.dropped) == (0, 0)  # the handler task never took one over
        await client.aclose()


async def test_an_answer_the_kernel_does_not_take_at_once_is_finished_by_the_handler_task() -> None:
    client_side, server_side = socket_streams()  # (16 KiB kernel buffers)
    app = Defers()
    body = b'"' + b"x" * (2 << 20) + b'"'
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS)
        client = HttpClient(client_side)
        await client.send_request("POST", "/x", {"n": 1})
        exchange = await app.next_exchange()
        exchange.answer_now(200, body)
        assert exchange.unsent  # the rest is the handler task's to write
        assert not exchange.answered_now
        reply = await client.read_reply()
        assert reply.body == body
        # The connection carries the next request.
        await client.send_request("POST", "/x", {"n": 2})
        (await app.next_exchange()).answer_now(200, b"{}")
        assert (await client.read_head()).status == 200
        assert (app.resumed, app.dropped) == (0, 1)  # (the first's end: dropped, not resumed)
        await client.aclose()


@pytest.mark.parametrize("streams", ["socket", "memory"])
async def test_an_answer_handed_back_is_the_handlers_continuation(streams: str) -> None:
    client_side: trio.abc.Stream
    server_side: trio.abc.Stream
    if streams == "socket":
        client_side, server_side = socket_streams()
    else:
        client_side, server_side = trio.testing.memory_stream_pair()
    app = Defers()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS)
        client = HttpClient(client_side)
        reply = None
        for _ in range(2):
            await client.send_request("POST", "/x", {"n": 1})
            (await app.next_exchange()).wake()
            reply = await client.read_reply()
            assert reply.body == b'{"resumed": true}'
        assert app.resumed == 2
        await client.aclose()


async def test_a_memory_stream_answer_written_now_goes_through_the_handler_task() -> None:
    # A stream that cannot write without waiting takes nothing at once: the handler task
    # writes all of it, and the request ends as any other.
    client_side, server_side = trio.testing.memory_stream_pair()
    app = Defers()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS)
        client = HttpClient(client_side)
        for n in range(2):
            await client.send_request("POST", "/x", {"n": n})
            exchange = await app.next_exchange()
            exchange.answer_now(200, b'{"n": %d}' % n)
            reply = await client.read_reply()
            assert reply.body == b'{"n": %d}' % n
        await client.aclose()


async def test_a_client_leaving_while_its_answer_is_deferred_hands_it_back() -> None:
    client_side, server_side = socket_streams()
    app = Defers()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_connection, server_side, app, LIMITS)
            client = HttpClient(client_side)
            await client.send_request("POST", "/x", {"n": 1})
            exchange = await app.next_exchange()
            await client.aclose()
    # The continuation met the client gone (its POST's call abandoned there).
    assert app.resumed == 1
    assert exchange.disconnected.is_set()


async def test_a_connection_cancelled_with_its_answer_deferred_drops_it_and_is_not_busy() -> None:
    client_side, server_side = socket_streams()
    app = Defers()
    counts = ConnectionCounts()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS, counts)
        client = HttpClient(client_side)
        await client.send_request("POST", "/x", {"n": 1})
        await app.next_exchange()
        assert counts.busy == 1
        nursery.cancel_scope.cancel()  # (a shutdown, past its grace)
    assert (app.dropped, app.resumed, counts.busy) == (1, 0, 0)
    await client.aclose()


async def test_a_connection_idle_after_an_answer_written_now_closes_at_its_keepalive_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_side, server_side = socket_streams()
    app = Defers()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_connection, server_side, app, LIMITS)
            client = HttpClient(client_side)
            await client.send_request("POST", "/x", {"n": 1})
            await trio.sleep(30)  # a long call: no deadline while the answer is to come
            (await app.next_exchange()).answer_now(200, b"{}")
            answered = trio.current_time()
            assert (await client.read_head()).status == 200
            assert await client.read_chunk() == b"{}"
            assert await client.read_chunk() is None
            assert await client_side.receive_some() == b""  # then idle: closed
    assert trio.current_time() - answered == pytest.approx(LIMITS.keepalive_timeout)
    await client.aclose()


async def test_a_pipelined_request_is_taken_once_the_answer_before_it_is_written() -> None:
    client_side, server_side = socket_streams()
    app = Defers()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_connection, server_side, app, LIMITS)
            client = HttpClient(client_side)
            await client.send_request("POST", "/x", {"n": 1})
            # The second request, sent before the first is answered (h11 would not pipeline).
            second = b"POST /y HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
            await client_side.send_all(second)
            first = await app.next_exchange()
            await trio.testing.wait_all_tasks_blocked()
            assert len(app.exchanges) == 1  # the second waits for the first's answer
            first.answer_now(200, b'{"n": 1}')
            # The handler task was told the next request is there.
            assert (await app.next_exchange()).request.path == "/y"
            assert (await client.read_head()).status == 200
            assert await client.read_chunk() == b'{"n": 1}'
            assert await client.read_chunk() is None
            client.connection.start_next_cycle()
            client.connection.send(
                h11.Request(
                    method="POST", target="/y", headers=[("host", "x"), ("content-length", "2")]
                )
            )
            client.connection.send(h11.Data(data=b"{}"))
            client.connection.send(h11.EndOfMessage())
            app.exchanges[-1].answer_now(200, b'{"n": 2}')
            assert (await client.read_head()).status == 200
            assert await client.read_chunk() == b'{"n": 2}'
            await client.aclose()


@pytest.mark.parametrize("streams", ["socket", "memory"])
async def test_a_whole_request_the_app_answers_at_once_is_served_by_the_connections_reader(
    streams: str,
) -> None:
    client_side: trio.abc.Stream
    server_side: trio.abc.Stream
    if streams == "socket":
        client_side, server_side = socket_streams()
    else:
        client_side, server_side = trio.testing.memory_stream_pair()
    app = Defers()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server_side, app, LIMITS)
        client = HttpClient(client_side)
        for at_once in (True, False, True):
            app.at_once = at_once
            await client.send_request("POST", "/x", {"n": 1})
            (await app.next_exchange()).answer_now(200, b"{}")
            assert (await client.read_head()).status == 200
            assert await client.read_chunk() == b"{}"
            assert await client.read_chunk() is None
        # A body that comes after its head: the request is not whole when the reader sees
        # it, and goes to the handler task.
        app.at_once = True
        await client_side.send_all(b"POST /y HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()
        await client_side.send_all(b"{}")
        (await app.next_exchange()).answer_now(200, b"{}")
        await client.aclose()
    reader = "reactor_fabric.trio.http_exchange.ConnectionReader.run"
    handler = "reactor_fabric.trio.http_server.serve_connection"
    assert app.tasks == [reader, handler, reader, handler]
