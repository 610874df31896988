"""Fakes shared by the unit tests (fakes over mocks: they behave, they don't record)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import trio
import trio.lowlevel
import wsproto
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, CloseConnection, Ping, Request, TextMessage

from reactor_fabric._errors import DockerUnavailable
from reactor_fabric.policy.container_parts.context import RuntimeCapabilities
from reactor_fabric.policy.container_spec import ContainerSpec
from reactor_fabric.policy.pinning import PinSet
from reactor_fabric.protocol.jsonrpc import Peek
from reactor_fabric.runtime.base import Container, ContainerExit, Gate, ManagedContainer
from reactor_fabric.runtime.memory import MemoryServer
from reactor_fabric.trio.channel import ChannelClosed, channel_boundary
from tests.messages import INITIALIZE, INITIALIZED, request

__all__ = ["INITIALIZE", "INITIALIZED", "request"]

# A runtime that can give a container everything a spec may ask (the specs tests compose
# without one, or for a runtime whose spawn they exercise with what it can do).
EVERY_CAPABILITY = RuntimeCapabilities(
    stdio="", child_sessions=True, mounts_on_host_reach_containers=True
)


async def until(condition: Callable[[], bool], *, what: str, wall_seconds: float = 60.0) -> None:
    """Yield until ``condition()`` holds: for work in worker threads (mount pinning), which
    ``wait_all_tasks_blocked`` does not wait for.

    Bounded by the wall clock, not by trio's (an autojump clock does not move while this task
    keeps checkpointing) and not by a count of checkpoints: a count is a time bound in
    disguise, which a slow or busy machine overran while the thread was still at work."""
    give_up = time.monotonic() + wall_seconds
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"never happened: {what}")
        await trio.lowlevel.checkpoint()


class UnreachableRuntime:
    """A runtime whose engine does not answer."""

    name = "unreachable"
    # It never started a container (stdio not known); nothing refused before its engine is.
    capabilities = RuntimeCapabilities(stdio="")
    egress = None
    children = None

    async def ping(self, *, time_bound: float | None = None) -> str:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def verify_isolation(self, image: str, labels: dict[str, str]) -> None:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def image_id(self, image: str) -> str | None:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def spawn(
        self, spec: ContainerSpec, pins: PinSet | None = None, *, gate: Gate | None = None
    ) -> Container:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def exit_status(self, container_id: str) -> ContainerExit:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def set_cpu_shares(self, container_id: str, shares: int) -> None:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def main_pid(self, container_id: str) -> int:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def memory_usage(self, container_id: str) -> int | None:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def remove(self, container: str, *, grace: float | None = None) -> None:
        return None

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[ManagedContainer]:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def close(self) -> None:
        return None


class AnsweringRuntime(UnreachableRuntime):
    async def ping(self, *, time_bound: float | None = None) -> str:
        return "99.0-fake"


class MemoryClient:
    """The client end of a session: a ClientChannel for the relay plus the test's handles."""

    def __init__(self, capacity: int = 100) -> None:
        self._to_relay_send, self._to_relay_receive = trio.open_memory_channel[bytes | None](
            capacity
        )
        self._from_relay_send, self.from_relay = trio.open_memory_channel[bytes](capacity)
        self.closed_with: tuple[int, str] | None = None

    # ClientChannel (what the relay sees)
    @property
    def more_received(self) -> bool:
        return self._to_relay_receive.statistics().current_buffer_used > 0

    async def receive(self) -> bytes | None:
        if self.closed_with is not None:
            return None
        try:
            return await self._to_relay_receive.receive()
        except trio.EndOfChannel:
            return None

    @channel_boundary
    async def send(self, frame: bytes, message: Peek | None = None, *, more: bool = False) -> None:
        if self.closed_with is not None:
            raise ChannelClosed("closed")
        # BrokenResourceError once the test closed its end (from_relay): the client is gone.
        await self._from_relay_send.send(frame)

    @channel_boundary
    async def close(self, code: int, reason: str = "") -> None:
        if self.closed_with is None:
            self.closed_with = (code, reason)
            self._from_relay_send.close()

    # The test's side
    async def say(self, message: dict[str, Any] | bytes) -> None:
        frame = message if isinstance(message, bytes) else json.dumps(message).encode()
        await self._to_relay_send.send(frame)

    async def hear(self) -> dict[str, Any]:
        frame = await self.from_relay.receive()
        decoded: dict[str, Any] = json.loads(frame)
        return decoded

    async def leave(self) -> None:
        await self._to_relay_send.send(None)


class GoneMidAnswer(MemoryClient):
    """A client whose connection goes away once it is told to: every send then fails as every
    channel fails once its client is gone, with ChannelClosed."""

    def __init__(self) -> None:
        super().__init__()
        self.gone = False
        self.failed_sends = 0

    async def send(self, frame: bytes, message: Peek | None = None, *, more: bool = False) -> None:
        if self.gone:
            self.failed_sends += 1
            raise ChannelClosed("the client went away")
        await super().send(frame, message, more=more)


TOOLS = ("echo", "wait", "flood", "crash", "ask", "hold", "notify", "progress")


async def scripted_mcp_server(container: MemoryServer) -> None:
    """A small stdio MCP server with tools that exercise the relay's edges.

    Requests are handled concurrently, as real servers do. Tools: ``echo`` (returns its
    arguments), ``wait`` (answers after ``seconds``), ``crash`` (writes to stderr and exits with
    code 3), ``ask`` (sends a roots/list request to the client, then answers with what the client
    said), ``progress`` (two progress notifications, then the answer), ``hold`` (a notification
    that it runs, then no answer ever), ``notify`` (``count`` log
    notifications of ``size`` bytes, then the answer), ``flood`` (one line of ``pieces``
    pieces of 64 KiB).
    """
    await container.write_stderr(b"scripted server starting\n")
    asks: dict[str, trio.MemorySendChannel[Any]] = {}
    async with trio.open_nursery() as nursery:
        while (line := await container.read_line()) is not None:
            message = json.loads(line)
            if "method" not in message:  # the client's answer to one of our requests
                channel = asks.pop(message["id"], None)
                if channel is not None:
                    await channel.send(message.get("result"))
            elif "id" in message:
                nursery.start_soon(_handle, container, message, asks, nursery.cancel_scope)
        nursery.cancel_scope.cancel()  # EOF on stdin: a stdio server exits


async def _handle(
    container: MemoryServer,
    message: dict[str, Any],
    asks: dict[str, trio.MemorySendChannel[Any]],
    server_scope: trio.CancelScope,
) -> None:
    method = message["method"]
    if method == "initialize":
        await _answer(
            container,
            message["id"],
            {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "scripted", "version": container.id[-4:]},
            },
        )
    elif method == "tools/list":
        await _answer(
            container,
            message["id"],
            {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]},
        )
    elif method == "tools/call":
        await _call_tool(container, message, asks, server_scope)
    else:
        error = {"code": -32601, "message": "Method not found"}
        frame = json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}).encode()
        await container.write_stdout(frame + b"\n")


async def _call_tool(
    container: MemoryServer,
    message: dict[str, Any],
    asks: dict[str, trio.MemorySendChannel[Any]],
    server_scope: trio.CancelScope,
) -> None:
    name = message["params"]["name"]
    arguments = message["params"].get("arguments", {})
    if name == "echo":
        await _answer(container, message["id"], _text(json.dumps(arguments)))
    elif name == "wait":
        await trio.sleep(arguments.get("seconds", 3600))
        await _answer(container, message["id"], {"content": []})
    elif name == "flood":
        await _flood(
            container,
            message["id"],
            pieces=arguments.get("pieces", 4),
            late=bool(arguments.get("late")),
        )
    elif name == "crash":
        await container.write_stderr(b"fatal: asked to crash\n")
        await container.exit(3)
        server_scope.cancel()
    elif name == "ask":
        send, receive = trio.open_memory_channel[Any](1)
        asks["srv-1"] = send
        frame = json.dumps(request("srv-1", "roots/list")).encode()
        await container.write_stdout(frame + b"\n")
        await _answer(container, message["id"], _text(json.dumps(await receive.receive())))
    elif name == "hold":
        # Announces that it runs, then never answers (a long tool call, in flight).
        note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "holding"}}
        await container.write_stdout(json.dumps(note).encode() + b"\n")
        await trio.sleep_forever()
    elif name == "notify":
        # Log notifications that belong to no request in particular.
        for index in range(arguments.get("count", 1)):
            note = {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": "info", "data": f"{index}:" + "x" * arguments.get("size", 10)},
            }
            await container.write_stdout(json.dumps(note).encode() + b"\n")
        await _answer(container, message["id"], {"content": []})
    elif name == "progress":
        token = message["params"].get("_meta", {}).get("progressToken")
        for step in (1, 2):
            note = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": step, "total": 2},
            }
            await container.write_stdout(json.dumps(note).encode() + b"\n")
        await _answer(container, message["id"], {"content": []})


async def _flood(container: MemoryServer, request_id: Any, *, pieces: int, late: bool) -> None:
    """One line longer than any sane limit, written in pieces like a real process would; with
    ``late``, after answering the call (a notification nobody waits for)."""
    piece = b"x" * 65536
    if late:
        await _answer(container, request_id, {"content": []})
        await container.write_stdout(b'{"jsonrpc":"2.0","method":"x","params":{"text":"')
    else:
        head = b'{"jsonrpc":"2.0","id":' + json.dumps(request_id).encode()
        await container.write_stdout(head + b',"result":{"text":"')
    for _ in range(pieces):
        await container.write_stdout(piece)
    await container.write_stdout(b'"}}\n')


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


async def _answer(container: MemoryServer, request_id: Any, result: Any) -> None:
    frame = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode()
    await container.write_stdout(frame + b"\n")


class RawWebSocket:
    """A minimal WebSocket client on wsproto whose socket the test owns and always closes.

    trio-websocket leaves its TCP stream open when the server closes or rejects the connection
    (a ResourceWarning traced to its own open_tcp_stream), so the tests of server-initiated
    closes use this instead.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.events: list[Any] = []

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        headers: list[tuple[bytes, bytes]] | None = None,
        subprotocols: list[str] | None = None,
    ) -> tuple[RawWebSocket, Any]:
        """Open and handshake; returns the socket and the server's answer event."""
        parts = urlsplit(url)
        assert parts.hostname is not None
        assert parts.port is not None
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        client = cls(stream)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        await client._send(
            Request(
                host=parts.netloc,
                target=target,
                extra_headers=headers or [],
                subprotocols=subprotocols or [],
            )
        )
        return client, await client.next_event()

    async def _send(self, event: Any) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def send_text(self, text: str) -> None:
        await self._send(TextMessage(data=text))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(BytesMessage(data=data))

    async def next_event(self) -> Any:
        """The next event from the server; pings are answered and skipped, as browsers do."""
        while True:
            while not self.events:
                data = await self.stream.receive_some(65536)
                self.ws.receive_data(data or None)
                self.events.extend(self.ws.events())
            event = self.events.pop(0)
            if not isinstance(event, Ping):
                return event
            if self.ws.state is ConnectionState.OPEN:  # no pong after the server's close
                await self._send(event.response())

    async def close_code(self) -> int:
        """Read until the server's close frame; its code."""
        while True:
            event = await self.next_event()
            if isinstance(event, CloseConnection):
                return int(event.code)

    async def aclose(self) -> None:
        await self.stream.aclose()
