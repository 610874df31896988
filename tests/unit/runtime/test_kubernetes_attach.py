"""The attach WebSocket client against an in-memory API server that can misbehave."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing
import wsproto
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from reactor_fabric.protocol.k8s_attach import V4, V5
from reactor_fabric.runtime.kubernetes_attach import AttachRefused, AttachSocket, handshake


class FakeApiServer:
    """The server end of one attach: reads the request, then does what a test tells it."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        self.request: Request | None = None
        self.received: list[Event] = []

    async def events(self) -> list[Event]:
        data = await self.stream.receive_some(65536)
        self.ws.receive_data(bytes(data) or None)
        return list(self.ws.events())

    async def read_request(self) -> Request:
        while self.request is None:
            for event in await self.events():
                if isinstance(event, Request):
                    self.request = event
        return self.request

    async def send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def receive_until(self, kind: type[Event]) -> Event:
        while True:
            for event in await self.events():
                self.received.append(event)
                if isinstance(event, kind):
                    return event


Scenario = Callable[[FakeApiServer], Awaitable[None]]


@pytest.fixture
async def run_attach(
    nursery: trio.Nursery,
) -> Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]]:
    async def start(
        scenario: Scenario, *, token: str | None = "t0ken", max_message: int = 1 << 20
    ) -> tuple[AttachSocket, FakeApiServer]:
        client_end, server_end = trio.testing.memory_stream_pair()
        server = FakeApiServer(server_end)
        nursery.start_soon(scenario, server)
        socket = await handshake(
            client_end,
            "api.example:6443",
            "/api/v1/namespaces/n/pods/p/attach?container=server&stdin=true",
            token=token,
            max_message=max_message,
        )
        return socket, server

    return start


async def accept_v5(server: FakeApiServer) -> None:
    await server.read_request()
    await server.send(AcceptConnection(subprotocol=V5))


async def test_the_handshake_offers_v5_then_v4_with_the_bearer_token(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    socket, server = await run_attach(accept_v5)
    assert socket.subprotocol == V5
    assert server.request is not None
    assert server.request.subprotocols == [V5, V4]
    assert server.request.host == "api.example:6443"
    assert server.request.target.endswith("attach?container=server&stdin=true")
    assert (b"authorization", b"Bearer t0ken") in list(server.request.extra_headers)


async def test_no_token_sends_no_authorization_header(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    _socket, server = await run_attach(accept_v5, token=None)
    assert server.request is not None
    assert all(name != b"authorization" for name, _ in server.request.extra_headers)


async def test_a_refusal_carries_the_api_servers_own_message_and_status(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    body = b'{"kind":"Status","status":"Failure","message":"pods \\"p\\" is forbidden","code":403}'

    async def forbid(server: FakeApiServer) -> None:
        await server.read_request()
        await server.send(
            RejectConnection(
                status_code=403,
                headers=[(b"content-length", str(len(body)).encode())],
                has_body=True,
            )
        )
        await server.send(RejectData(data=body[:10], body_finished=False))
        await server.send(RejectData(data=body[10:], body_finished=True))

    with pytest.raises(AttachRefused, match='pods "p" is forbidden') as caught:
        await run_attach(forbid)
    assert caught.value.status == 403


async def test_a_refusal_without_a_body_names_the_http_status(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    async def refuse(server: FakeApiServer) -> None:
        await server.read_request()
        await server.send(RejectConnection(status_code=401, has_body=False))

    with pytest.raises(AttachRefused, match="HTTP 401") as caught:
        await run_attach(refuse)
    assert caught.value.status == 401


async def test_an_accept_without_a_channel_subprotocol_is_refused(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    async def accept_plain(server: FakeApiServer) -> None:
        await server.read_request()
        await server.send(AcceptConnection())

    with pytest.raises(AttachRefused, match="no channel subprotocol"):
        await run_attach(accept_plain)


async def test_a_server_that_hangs_up_during_the_handshake_is_a_refusal(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    async def hang_up(server: FakeApiServer) -> None:
        await server.read_request()
        await server.stream.aclose()

    with pytest.raises(AttachRefused, match="closed the connection"):
        await run_attach(hang_up)


async def test_fragmented_messages_arrive_whole_and_pings_are_answered(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    async def talk(server: FakeApiServer) -> None:
        await accept_v5(server)
        await server.send(Ping(payload=b"are you there"))
        await server.send(BytesMessage(data=b"\x01hel", message_finished=False))
        await server.send(Message(data=b"lo\n", message_finished=True))  # continuation
        await server.send(BytesMessage(data=b"\x02warn"))

    socket, server = await run_attach(talk)
    assert await socket.receive_message() == b"\x01hello\n"
    assert await socket.receive_message() == b"\x02warn"
    pong = await server.receive_until(Pong)
    assert isinstance(pong, Pong)
    assert pong.payload == b"are you there"


async def test_messages_go_out_whole_and_close_starts_the_closing_handshake(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    socket, server = await run_attach(accept_v5)
    await socket.send_message(b"\x00" + b"x" * 100_000)
    got = await server.receive_until(BytesMessage)
    data = bytearray(got.data) if isinstance(got, BytesMessage) else bytearray()
    while isinstance(got, BytesMessage) and not got.message_finished:
        got = await server.receive_until(BytesMessage)
        assert isinstance(got, BytesMessage)
        data += got.data
    assert bytes(data) == b"\x00" + b"x" * 100_000
    await socket.close()
    closing = await server.receive_until(CloseConnection)
    assert isinstance(closing, CloseConnection)
    assert closing.code == 1000
    await server.send(closing.response())
    assert await socket.receive_message() is None
    with pytest.raises(trio.BrokenResourceError):
        await socket.send_message(b"\x00late")


async def test_a_message_over_the_bound_ends_the_attach_with_1009_before_it_is_joined(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    async def flood(server: FakeApiServer) -> None:
        await accept_v5(server)
        for _ in range(5):
            await server.send(BytesMessage(data=b"\x01" + b"y" * 400, message_finished=False))

    socket, server = await run_attach(flood, max_message=1000)
    assert await socket.receive_message() is None
    closing = await server.receive_until(CloseConnection)
    assert isinstance(closing, CloseConnection)
    assert closing.code == 1009


async def test_a_text_message_ends_the_attach_with_1003(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    async def speak_text(server: FakeApiServer) -> None:
        await accept_v5(server)
        await server.send(TextMessage(data="AQ=="))  # what a base64 channel protocol sends

    socket, server = await run_attach(speak_text)
    assert await socket.receive_message() is None
    closing = await server.receive_until(CloseConnection)
    assert isinstance(closing, CloseConnection)
    assert closing.code == 1003


async def test_the_server_closing_is_answered_and_ends_the_stream(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    async def finish(server: FakeApiServer) -> None:
        await accept_v5(server)
        await server.send(BytesMessage(data=b'\x03{"status":"Success"}'))
        await server.send(CloseConnection(code=1000))

    socket, server = await run_attach(finish)
    assert await socket.receive_message() == b'\x03{"status":"Success"}'
    assert await socket.receive_message() is None
    answer = await server.receive_until(CloseConnection)
    assert isinstance(answer, CloseConnection)
    assert server.ws.state is ConnectionState.CLOSED


async def test_a_broken_connection_ends_the_stream_like_eof(
    run_attach: Callable[..., Awaitable[tuple[AttachSocket, FakeApiServer]]],
) -> None:
    async def vanish(server: FakeApiServer) -> None:
        await accept_v5(server)
        await server.stream.send_all(b"\x82\x05ab")  # half a frame, then gone
        await server.stream.aclose()

    socket, _server = await run_attach(vanish)
    assert await socket.receive_message() is None
    assert await socket.receive_message() is None  # and stays ended
