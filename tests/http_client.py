"""A test's HTTP/1.1 and WebSocket client on any trio stream (h11 and wsproto as clients).

Over memory streams it drives the orchestrator's server with no socket, so tests can use the
autojump clock; over a real socket it is a plain loopback client. Each client owns its stream
and closes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import h11
import trio
import wsproto
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

READ_CHUNK = 65536
BOTH = "application/json, text/event-stream"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[dict[str, Any]]:
        """The JSON-RPC messages of an SSE body."""
        return [
            json.loads(line[len(b"data: ") :])
            for line in self.body.splitlines()
            if line.startswith(b"data: ")
        ]

    @property
    def session(self) -> str:
        return self.headers["mcp-session-id"]


@dataclass
class HttpClient:
    """One HTTP/1.1 connection (kept alive across requests)."""

    stream: trio.abc.Stream
    host: str = "127.0.0.1:8765"
    # Sent with every request (e.g. the orchestrator's Authorization header); per-request
    # headers win.
    headers: dict[str, str] = field(default_factory=dict)
    connection: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))

    async def _next(self) -> Any:
        while True:
            event = self.connection.next_event()
            if event is h11.NEED_DATA:
                data = await self.stream.receive_some(READ_CHUNK)
                self.connection.receive_data(bytes(data))
                continue
            return event

    async def send_request(
        self,
        method: str,
        target: str,
        body: bytes | dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        accept: str = BOTH,
    ) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body else b""
        all_headers = {
            "host": self.host,
            "accept": accept,
            "content-type": "application/json",
            "content-length": str(len(raw)),
            **self.headers,
            **(headers or {}),
        }
        if self.connection.our_state is h11.DONE:
            self.connection.start_next_cycle()
        data = self.connection.send(
            h11.Request(method=method, target=target, headers=list(all_headers.items()))
        )
        data = (data or b"") + (self.connection.send(h11.Data(data=raw)) or b"") if raw else data
        data = (data or b"") + (self.connection.send(h11.EndOfMessage()) or b"")
        await self.stream.send_all(data)

    async def read_head(self) -> Reply:
        while True:
            event = await self._next()
            if isinstance(event, h11.InformationalResponse):
                continue
            assert isinstance(event, h11.Response), event
            headers = {k.decode(): v.decode() for k, v in event.headers}
            return Reply(event.status_code, headers)

    async def read_chunk(self) -> bytes | None:
        """The next piece of the body, or None at its end."""
        event = await self._next()
        if isinstance(event, h11.Data):
            return bytes(event.data)
        assert isinstance(event, h11.EndOfMessage | h11.ConnectionClosed), event
        return None

    async def request(
        self,
        method: str,
        target: str,
        body: bytes | dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        accept: str = BOTH,
    ) -> Reply:
        await self.send_request(method, target, body, headers=headers, accept=accept)
        return await self.read_reply()

    async def read_reply(self) -> Reply:
        """The next answer, whole (for a request sent with :meth:`send_request`)."""
        reply = await self.read_head()
        while (chunk := await self.read_chunk()) is not None:
            reply.body += chunk
        return reply

    async def aclose(self) -> None:
        await self.stream.aclose()


class WebSocketClient:
    """A minimal WebSocket client (wsproto) whose stream the test owns and always closes."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.events: list[Any] = []
        self.eof = False

    @classmethod
    async def connect(
        cls,
        stream: trio.abc.Stream,
        target: str,
        *,
        host: str = "127.0.0.1:8765",
        headers: list[tuple[bytes, bytes]] | None = None,
        subprotocols: list[str] | None = None,
    ) -> tuple[WebSocketClient, Any]:
        """Open and handshake; the client and the server's answer (Accept or Reject event)."""
        client = cls(stream)
        await client._send(
            Request(
                host=host,
                target=target,
                extra_headers=headers or [],
                subprotocols=subprotocols or [],
            )
        )
        answer = await client.next_event()
        if isinstance(answer, RejectConnection):
            body = b""
            while answer.has_body:
                data = await client.next_event()
                assert isinstance(data, RejectData)
                body += data.data
                if data.body_finished:
                    break
            client.rejected_body = body
        return client, answer

    rejected_body: bytes = b""

    async def _send(self, event: Any) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def send_text(self, text: str) -> None:
        await self._send(TextMessage(data=text))

    async def send_json(self, message: dict[str, Any]) -> None:
        await self.send_text(json.dumps(message))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(BytesMessage(data=data))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next_event(self, *, answer_pings: bool = True) -> Any:
        """The next event from the server; pings are answered and skipped (as browsers do)."""
        while True:
            while not self.events:
                data = await self.stream.receive_some(READ_CHUNK)
                if not data:
                    self.eof = True
                    return None
                self.ws.receive_data(bytes(data))
                self.events.extend(self.ws.events())
            event = self.events.pop(0)
            if isinstance(event, Ping) and answer_pings:
                # Once the server's close frame was parsed (it may share a read with the
                # ping), a pong is a protocol error: clients stay silent.
                if self.ws.state is ConnectionState.OPEN:
                    await self._send(event.response())
                continue
            return event

    async def hear(self) -> dict[str, Any]:
        """The next JSON-RPC message (text frame)."""
        event = await self.next_event()
        assert isinstance(event, TextMessage), event
        decoded: dict[str, Any] = json.loads(event.data)
        return decoded

    async def close_code(self) -> int:
        """Read until the server's close frame; its code (the close is answered)."""
        while True:
            event = await self.next_event()
            assert event is not None, "the connection ended without a close frame"
            if isinstance(event, CloseConnection):
                if self.ws.state is wsproto.connection.ConnectionState.REMOTE_CLOSING:
                    await self._send(event.response())
                return int(event.code)

    async def close(self, code: int = 1000) -> CloseConnection | None:
        """Close from our side; the server's answering close event."""
        await self._send(CloseConnection(code=code))
        while True:
            event = await self.next_event()
            if event is None or isinstance(event, CloseConnection):
                return event

    async def aclose(self) -> None:
        await self.stream.aclose()


__all__ = ["BOTH", "AcceptConnection", "HttpClient", "RejectConnection", "Reply", "WebSocketClient"]
