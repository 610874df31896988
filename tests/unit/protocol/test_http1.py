"""HTTP/1.1, the server's side (protocol/http1.py): what it parses, refuses, bounds and writes,
fed whole and byte by byte."""

from __future__ import annotations

import pytest

from reactor_fabric.protocol.http1 import (
    CLOSED,
    MESSAGE_END,
    NEED_DATA,
    BodyData,
    Event,
    HttpError,
    LocalHttpError,
    RequestHead,
    ServerConnection,
)

POST = (
    b"POST /mcp/time?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nContent-Type: application/json\r\n"
    b'Content-Length: 11\r\n\r\n{"a": true}'
)
GET = b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n"


def events(connection: ServerConnection) -> list[Event]:
    """What the connection has for the handler now (up to NEED_DATA)."""
    taken: list[Event] = []
    while (event := connection.next_event()) is not NEED_DATA:
        taken.append(event)
    return taken


def fed(data: bytes, *, pieces: int = 0, **options: int) -> tuple[ServerConnection, list[Event]]:
    """A connection fed ``data`` whole (pieces=0) or in pieces of that many bytes."""
    connection = ServerConnection(**options)
    size = pieces or len(data)
    for start in range(0, len(data), size):
        connection.receive(data[start : start + size])
    return connection, events(connection)


def body_of(taken: list[Event]) -> bytes:
    return b"".join(event.data for event in taken if isinstance(event, BodyData))


@pytest.mark.parametrize("pieces", [0, 1, 7])
def test_a_request_is_the_same_whole_or_byte_by_byte(pieces: int) -> None:
    connection, taken = fed(POST, pieces=pieces)
    head = taken[0]
    assert isinstance(head, RequestHead)
    assert (head.method, head.target, head.http_version) == ("POST", b"/mcp/time?x=1", "1.1")
    assert (b"content-type", b"application/json") in head.headers  # names lower-cased
    assert head.keep_alive
    assert not head.expects_continue
    assert not head.upgrade
    assert body_of(taken) == b'{"a": true}'
    assert taken[-1] is MESSAGE_END
    assert connection.buffered_bytes == 0


def test_a_chunked_body_arrives_whole() -> None:
    request = (
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    _connection, taken = fed(request, pieces=2)
    assert body_of(taken) == b"abcde"
    assert taken[-1] is MESSAGE_END


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        # Request smuggling: two ways to say where the body ends, or two lengths.
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n0\r\n\r\n",
            400,
        ),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400),  # whitespace before the colon
        (b"GET / HTTP/1.1\nHost: h\n\n", 400),  # bare LF
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),  # TLS to the plain port
    ],
)
def test_what_is_not_http_1_1_is_refused_with_its_status(request_bytes: bytes, status: int) -> None:
    connection = ServerConnection()
    with pytest.raises(HttpError) as refused:
        connection.receive(request_bytes)
    assert refused.value.status == status
    with pytest.raises(HttpError):  # and the connection stays broken
        connection.receive(GET)


def test_a_head_over_the_bound_is_refused_431_whole_or_in_pieces() -> None:
    big = b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n"
    with pytest.raises(HttpError) as whole:
        fed(big, max_head_bytes=4096)
    assert whole.value.status == 431
    # Streamed in pieces, it is refused before much more than the bound has been taken in.
    connection = ServerConnection(max_head_bytes=4096)
    connection.receive(b"GET / HTTP/1.1\r\nX: ")
    taken_in = 0
    refused: HttpError | None = None
    while refused is None and taken_in < 1_000_000:
        try:
            connection.receive(b"a" * 1000)
        except HttpError as exc:
            refused = exc
        taken_in += 1000
    assert refused is not None
    assert refused.status == 431
    assert taken_in <= 4096 + 2 * 1000
    fed(b"GET / HTTP/1.1\r\nHost: h\r\nX-Fits: " + b"a" * 3000 + b"\r\n\r\n", max_head_bytes=4096)


def test_a_pipelined_request_waits_until_the_first_is_answered_and_is_counted_meanwhile() -> None:
    connection = ServerConnection()
    connection.receive(GET + POST)
    first = connection.next_event()
    assert isinstance(first, RequestHead)
    assert first.target == b"/healthz"
    assert connection.next_event() is MESSAGE_END
    assert connection.next_event() is NEED_DATA  # the next head waits for the answer
    assert connection.buffered_bytes > len(b'{"a": true}')  # its head and body, counted
    connection.respond(200, [], b"ok")
    assert connection.reusable
    connection.start_next_cycle()
    second = events(connection)
    assert isinstance(second[0], RequestHead)
    assert second[0].method == "POST"
    assert body_of(second) == b'{"a": true}'
    assert connection.buffered_bytes == 0


def test_a_connection_whose_request_body_was_not_read_is_not_reused() -> None:
    connection = ServerConnection()
    connection.receive(POST)
    assert isinstance(connection.next_event(), RequestHead)
    connection.respond(401, [])
    assert not connection.reusable
    with pytest.raises(LocalHttpError):
        connection.start_next_cycle()


def test_a_client_waiting_for_100_continue_is_told_to_go_on_once() -> None:
    head = POST.partition(b"\r\n\r\n")[0] + b"\r\nExpect: 100-continue\r\n\r\n"
    connection = ServerConnection()
    connection.receive(head)
    request = connection.next_event()
    assert isinstance(request, RequestHead)
    assert request.expects_continue
    assert connection.waiting_for_continue
    assert connection.continue_() == b"HTTP/1.1 100 Continue\r\n\r\n"
    told = not connection.waiting_for_continue  # (a new read: mypy would keep the narrowing)
    assert told
    # A client that sent its body anyway is not told.
    eager = ServerConnection()
    eager.receive(head + b'{"a": true}')
    assert isinstance(eager.next_event(), RequestHead)
    assert not eager.waiting_for_continue


def test_a_websocket_upgrade_stops_parsing_and_keeps_what_followed() -> None:
    upgrade = (
        b"GET /mcp/time HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    connection = ServerConnection()
    connection.receive(upgrade + b"\x81\x05hello")
    connection.receive(b"more")
    head = connection.next_event()
    assert isinstance(head, RequestHead)
    assert head.upgrade
    assert not head.keep_alive
    assert connection.trailing == b"\x81\x05hellomore"
    connection.respond(400, [])
    assert not connection.reusable


def test_an_http_1_0_client_gets_one_answer_then_the_end_of_the_connection() -> None:
    connection, taken = fed(b"GET /healthz HTTP/1.0\r\n\r\n")
    head = taken[0]
    assert isinstance(head, RequestHead)
    assert not head.keep_alive
    streamed = connection.start(200, [(b"content-type", b"text/event-stream")])
    assert b"transfer-encoding" not in streamed
    assert b"connection: close" in streamed
    assert connection.send(b"data") == b"data"  # delimited by the close, not chunked
    assert connection.end() == b""
    assert not connection.reusable


def test_answers_are_framed_for_what_was_asked() -> None:
    connection, _ = fed(GET)
    whole = connection.respond(200, [(b"content-type", b"application/json")], b"{}")
    assert whole == (
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"
    )
    connection.start_next_cycle()
    connection.receive(b"HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n")
    events(connection)
    assert connection.respond(200, [], b"body").endswith(b"content-length: 4\r\n\r\n")
    connection.start_next_cycle()
    connection.receive(b"DELETE /x HTTP/1.1\r\nHost: h\r\n\r\n")
    events(connection)
    assert connection.respond(204, [], b"") == b"HTTP/1.1 204 No Content\r\n\r\n"
    connection.start_next_cycle()
    connection.receive(GET)
    events(connection)
    head = connection.start(200, [(b"content-type", b"text/event-stream")])
    assert head.endswith(b"transfer-encoding: chunked\r\n\r\n")
    assert connection.send(b"event") == b"5\r\nevent\r\n"
    assert connection.send(b"") == b""  # (an empty chunk would end the body)
    assert connection.end() == b"0\r\n\r\n"
    assert connection.reusable


def test_a_client_asking_to_close_gets_its_answer_then_the_end() -> None:
    connection, _ = fed(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert b"connection: close" in connection.respond(200, [], b"x")
    assert not connection.reusable
    ours, _ = fed(GET)
    ours.respond(500, [(b"connection", b"close")], b"")
    assert not ours.reusable  # a close the server decided


def test_a_header_that_would_start_another_header_is_never_written() -> None:
    connection, _ = fed(GET)
    with pytest.raises(LocalHttpError):
        connection.respond(200, [(b"mcp-session-id", b"x\r\nset-cookie: y")], b"")
    with pytest.raises(LocalHttpError):
        fed(GET)[0].start(200, [(b"x\nevil", b"1")])


def test_an_answer_is_written_once() -> None:
    connection, _ = fed(GET)
    connection.respond(200, [], b"")
    with pytest.raises(LocalHttpError):
        connection.respond(200, [], b"")
    with pytest.raises(LocalHttpError):
        connection.send(b"late")


def test_a_close_between_requests_is_the_end_and_within_one_a_failure() -> None:
    connection = ServerConnection()
    connection.receive(b"")
    assert connection.next_event() is CLOSED
    cut = ServerConnection()
    cut.receive(POST[:-3])
    with pytest.raises(HttpError):
        cut.receive(b"")
    half = ServerConnection()
    half.receive(POST)
    half.receive(b"")  # a client that half-closes after its whole request is still answered
    assert isinstance(half.next_event(), RequestHead)


def test_a_request_without_a_body_need_not_be_read_for_the_next_to_follow() -> None:
    connection = ServerConnection()
    connection.receive(GET + GET)
    assert isinstance(connection.next_event(), RequestHead)  # its end is left unread
    connection.respond(200, [], b"{}")
    assert connection.reusable
    connection.start_next_cycle()
    assert isinstance(connection.next_event(), RequestHead)
    # A body read in part is another matter: the connection is not reused.
    partial = ServerConnection()
    partial.receive(POST)
    assert isinstance(partial.next_event(), RequestHead)
    assert isinstance(partial.next_event(), BodyData)
    partial.respond(413, [], b"")
    assert not partial.reusable
