"""Raw MCP clients for measurement: JSON-RPC over WebSocket, container stdio, a pipe, HTTP.

No SDK on purpose: the figures should measure the relay, not a client library. Every client
offers the same :class:`Rpc` calls, and every call is timed the same way: the request is encoded
first, then the clock runs from handing its bytes to the transport to decoding the response
with the same id (messages with other ids, e.g. notifications, are skipped inside the timing).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

import msgspec
import trio
import trio_websocket
from wsproto.utilities import LocalProtocolError

from reactor_fabric.protocol.framing import LineSplitter
from reactor_fabric.runtime.docker_framing import STDOUT, DockerFrameDecoder

Json = dict[str, Any]

PROTOCOL_VERSION = "2025-06-18"
CLIENT_INFO = {"name": "reactor-fabric-bench", "version": "1"}
# Larger than the biggest message of the throughput runs (1 MiB payload, JSON-escaped).
MAX_MESSAGE = 64 * 1024 * 1024
READ_CHUNK = 65536

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class ProtocolError(RuntimeError):
    """The peer answered something a well-behaved MCP server would not."""


# What a measured system can do to a client: every one of them is recorded, none is a bug of
# the harness.
FAILURES: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    ValueError,  # includes msgspec.DecodeError: not JSON
    ProtocolError,
    trio.TooSlowError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio_websocket.HandshakeError,
    trio_websocket.ConnectionClosed,
)


def encode_request(request_id: int, method: str, params: Json) -> bytes:
    return _encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


def encode_notification(method: str, params: Json | None = None) -> bytes:
    message: Json = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return _encode(message)


def initialize_params() -> Json:
    return {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}


def check_result(message: Json, what: str) -> Json:
    """The ``result`` of a response; raises on a JSON-RPC error or a tool error."""
    if "error" in message:
        raise ProtocolError(f"{what} answered an error: {message['error']}")
    result = message.get("result")
    if not isinstance(result, dict):
        raise ProtocolError(f"{what} answered without a result: {str(message)[:300]}")
    if result.get("isError"):
        raise ProtocolError(f"{what} answered a tool error: {str(result)[:300]}")
    return result


class Rpc(Protocol):
    async def call(self, method: str, params: Json) -> tuple[int, Json]:
        """Send one request; (nanoseconds from send to its response, the response)."""

    async def notify(self, method: str, params: Json | None = None) -> None: ...

    async def aclose(self) -> None: ...


async def handshake(rpc: Rpc) -> int:
    """``initialize`` then ``notifications/initialized``; returns the initialize time (ns)."""
    elapsed, answer = await rpc.call("initialize", initialize_params())
    check_result(answer, "initialize")
    await rpc.notify("notifications/initialized")
    return elapsed


# --- message streams: one JSON-RPC message per frame or line ------------------------------


class MessageStream(Protocol):
    async def send(self, message: bytes) -> None: ...

    async def receive(self) -> bytes | str:
        """The next message; raises EOFError once the peer has gone."""

    async def aclose(self) -> None: ...


class StreamRpc:
    """Requests over a message stream, matched to their responses by id."""

    def __init__(self, stream: MessageStream) -> None:
        self.stream = stream
        self._next_id = 0

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def call(self, method: str, params: Json) -> tuple[int, Json]:
        request_id = self.new_id()
        frame = encode_request(request_id, method, params)
        start = time.perf_counter_ns()
        await self.stream.send(frame)
        answer = await self.response_to(request_id)
        return time.perf_counter_ns() - start, answer

    async def response_to(self, request_id: int) -> Json:
        while True:
            message = _decode(await self.stream.receive())
            if (
                isinstance(message, dict)
                and message.get("id") == request_id
                and ("result" in message or "error" in message)
            ):
                return message

    async def receive_response(self) -> Json:
        """The next message that is a response (any id): for pipelined runs."""
        while True:
            message = _decode(await self.stream.receive())
            if isinstance(message, dict) and ("result" in message or "error" in message):
                return message

    async def notify(self, method: str, params: Json | None = None) -> None:
        await self.stream.send(encode_notification(method, params))

    async def aclose(self) -> None:
        await self.stream.aclose()


class WebSocketStream:
    """One message per text frame (Reactor-Fabric's ``/mcp/{service}``, supergateway's ws)."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws

    async def send(self, message: bytes) -> None:
        await self.ws.send_message(message.decode())

    async def receive(self) -> bytes | str:
        try:
            data: bytes | str = await self.ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise EOFError(f"the WebSocket closed: {exc.reason}") from exc
        return data

    async def aclose(self) -> None:
        await self.ws.aclose()


async def connect_websocket(
    nursery: trio.Nursery, url: str, *, subprotocols: list[str] | None = None
) -> StreamRpc:
    ws = await trio_websocket.connect_websocket_url(
        nursery,
        url,
        subprotocols=subprotocols,
        max_message_size=MAX_MESSAGE,
        receive_buffer_size=READ_CHUNK,
    )
    return StreamRpc(WebSocketStream(ws))


@contextlib.asynccontextmanager
async def websocket_session(
    url: str, *, subprotocols: list[str] | None = None
) -> AsyncIterator[StreamRpc]:
    """A WebSocket connection for the duration of the block, closed (bounded) after it.

    A keepalive ping of the orchestrator's that crosses our Close makes trio-websocket's
    reader answer with a pong wsproto refuses while closing (python-trio/trio-websocket#184):
    that failure, once the block is done, is not the measurement's (the bridge does the same,
    reactor_fabric/trio/bridge.py)."""
    done = False
    try:
        with unwrapped():
            async with trio.open_nursery() as nursery:
                rpc = await connect_websocket(nursery, url, subprotocols=subprotocols)
                try:
                    yield rpc
                    done = True
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(15):
                        await rpc.aclose()
                    nursery.cancel_scope.cancel()
    except LocalProtocolError:
        if not done:
            raise


class _Lines:
    """Complete lines from a byte stream, in order."""

    def __init__(self) -> None:
        self.splitter = LineSplitter(max_line=MAX_MESSAGE)
        self.ready: collections.deque[bytes] = collections.deque()

    def feed(self, data: bytes) -> None:
        self.ready.extend(self.splitter.feed(data))


class _LineStdio:
    """A server's stdin and stdout as byte streams, one message per line: no relay.

    Subclasses say where the bytes go and come from; :meth:`_file` sorts what was read
    (plain stdout by default).
    """

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self._send = send
        self._receive = receive
        self._stdout = _Lines()

    def _closed(self) -> str:
        return "the container's stdio closed"

    def _file(self, data: bytes) -> None:
        self._stdout.feed(data)

    async def send(self, message: bytes) -> None:
        await self._send.send_all(message + b"\n")

    async def receive(self) -> bytes:
        while not self._stdout.ready:
            data = await self._receive.receive_some(READ_CHUNK)
            if not data:
                raise EOFError(self._closed())
            self._file(bytes(data))
        return self._stdout.ready.popleft()


class _SocketStdio(_LineStdio):
    """Both directions on one socket: half-closed for EOF, then closed."""

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream, stream)
        self._stream = stream

    async def send_eof(self) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


class AttachedStream(_SocketStdio):
    """A container's stdio through Docker's attach socket (multiplexed, no TTY): no relay."""

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self._demuxer = DockerFrameDecoder(max_frame=MAX_MESSAGE)
        self.stderr_tail: collections.deque[bytes] = collections.deque(maxlen=20)

    def _closed(self) -> str:
        return f"the container's stdio closed; stderr: {list(self.stderr_tail)}"

    def _file(self, data: bytes) -> None:
        for stream_id, payload in self._demuxer.feed(data):
            if stream_id == STDOUT:
                self._stdout.feed(payload)
            else:
                self.stderr_tail.append(payload)


class SocketStdioStream(_SocketStdio):
    """A container's stdin and stdout as its own Unix socket (``fabric-stdio``), the way the
    orchestrator talks to its containers: no engine process, no framing. No relay."""


def socket_stream(raw: socket.socket) -> trio.SocketStream:
    return trio.SocketStream(trio.socket.from_stdlib_socket(raw))


class PipeStream(_LineStdio):
    """A child process's stdin/stdout (``docker run -i``): one message per line."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        super().__init__(process.stdin, process.stdout)
        self.process = process

    def _closed(self) -> str:
        return f"{self.process.args!r} closed its stdout"

    async def aclose(self) -> None:
        """Close stdin (asks the server to exit) and stdout; the caller reaps the process."""
        for pipe in (self._send, self._receive):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await pipe.aclose()


# --- Streamable HTTP ---------------------------------------------------------------------


class HttpRpc:
    """MCP Streamable HTTP over one keep-alive HTTP/1.1 connection (raw, no client library).

    Every JSON-RPC message is a POST; a response is JSON or an SSE stream whose ``data:`` lines
    carry messages. The clock stops when the matching response has been decoded; the rest of
    an SSE body is drained afterwards, outside the timing.
    """

    def __init__(
        self, host: str, port: int, path: str, headers: dict[str, str] | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.path = path
        self.headers = dict(headers or {})  # sent with every request (e.g. Authorization)
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self._stream: trio.SocketStream | None = None
        self._buffer = bytearray()
        # Request ids must be unique in a session: connections sharing one share the counter.
        self.ids = itertools.count(1)

    async def _connection(self) -> trio.SocketStream:
        if self._stream is None:
            self._stream = await trio.open_tcp_stream(self.host, self.port)
            self._buffer.clear()
        return self._stream

    def _request_bytes(self, body: bytes) -> bytes:
        lines = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            "Accept: application/json, text/event-stream",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in self.headers.items()),
        ]
        if self.session_id is not None:
            lines.append(f"Mcp-Session-Id: {self.session_id}")
        if self.protocol_version is not None:
            lines.append(f"MCP-Protocol-Version: {self.protocol_version}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def _exchange(self, request: bytes) -> tuple[int, int, dict[str, str]]:
        """Send a request, read the response head: (start ns, status, headers).

        A kept-alive connection the server closed while idle (its keep-alive timeout) is
        reopened and the request sent again, as HTTP clients do; the clock restarts.
        """
        for attempt in range(2):
            reused = self._stream is not None
            stream = await self._connection()
            start = time.perf_counter_ns()
            try:
                await stream.send_all(request)
                status, headers = await self._read_head()
            except (EOFError, trio.BrokenResourceError):
                await self._close_connection()
                if reused and attempt == 0:
                    continue
                raise
            return start, status, headers
        raise AssertionError("unreachable")

    async def call(self, method: str, params: Json) -> tuple[int, Json]:
        request_id = next(self.ids)
        request = self._request_bytes(encode_request(request_id, method, params))
        start, status, headers = await self._exchange(request)
        if status != 200:
            body = await self._read_body(headers)
            raise ProtocolError(f"POST {self.path} {method} answered HTTP {status}: {body[:300]!r}")
        answer = await self._read_answer(headers, request_id)
        elapsed = time.perf_counter_ns() - start
        if method == "initialize":
            self.session_id = headers.get("mcp-session-id", self.session_id)
            result = answer.get("result")
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                self.protocol_version = result["protocolVersion"]
        return elapsed, answer

    async def notify(self, method: str, params: Json | None = None) -> None:
        request = self._request_bytes(encode_notification(method, params))
        _, status, headers = await self._exchange(request)
        await self._read_body(headers)
        if status not in (200, 202, 204):
            raise ProtocolError(f"POST {self.path} {method} answered HTTP {status}")

    async def aclose(self) -> None:
        """End the session (DELETE: an HTTP session outlives its connections), then close."""
        session, self.session_id = self.session_id, None
        if session is not None:
            with contextlib.suppress(*FAILURES), trio.move_on_after(10):
                extra = "".join(f"{name}: {value}\r\n" for name, value in self.headers.items())
                request = (
                    f"DELETE {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                    f"Mcp-Session-Id: {session}\r\n{extra}Content-Length: 0\r\n\r\n"
                )
                _, _, headers = await self._exchange(request.encode("latin-1"))
                await self._read_body(headers)
        await self._close_connection()

    async def close_connection(self) -> None:
        """Close the connection only (the session stays, for the other connections on it)."""
        await self._close_connection()

    async def _close_connection(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()

    # --- HTTP/1.1 response parsing --------------------------------------------------------

    async def _fill(self) -> None:
        assert self._stream is not None
        data = await self._stream.receive_some(READ_CHUNK)
        if not data:
            raise EOFError("the HTTP server closed the connection")
        self._buffer += data

    async def _read_until(self, marker: bytes) -> bytes:
        while (index := self._buffer.find(marker)) == -1:
            await self._fill()
        found = bytes(self._buffer[:index])
        del self._buffer[: index + len(marker)]
        return found

    async def _read_exact(self, size: int) -> bytes:
        while len(self._buffer) < size:
            await self._fill()
        found = bytes(self._buffer[:size])
        del self._buffer[:size]
        return found

    async def _read_head(self) -> tuple[int, dict[str, str]]:
        head = (await self._read_until(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _body_chunks(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        if "content-length" in headers:
            yield await self._read_exact(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self._read_until(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self._read_until(b"\r\n")  # no trailers are expected
                    return
                yield await self._read_exact(size)
                await self._read_exact(2)
        else:  # body delimited by the connection's end
            assert self._stream is not None
            try:
                while True:
                    await self._fill()
                    yield bytes(self._buffer)
                    self._buffer.clear()
            except EOFError:
                await self._close_connection()
        if headers.get("connection", "").lower() == "close":
            await self._close_connection()

    async def _read_body(self, headers: dict[str, str]) -> bytes:
        return b"".join([chunk async for chunk in self._body_chunks(headers)])

    async def _read_answer(self, headers: dict[str, str], request_id: int) -> Json:
        content_type = headers.get("content-type", "")
        if content_type.startswith("application/json"):
            decoded = _decode(await self._read_body(headers))
            for message in decoded if isinstance(decoded, list) else [decoded]:
                if isinstance(message, dict) and message.get("id") == request_id:
                    return message
            raise ProtocolError(f"no response with id {request_id} in the JSON body")
        if not content_type.startswith("text/event-stream"):
            raise ProtocolError(f"unexpected Content-Type {content_type!r}")
        answer: Json | None = None
        pending = b""
        data_lines: list[bytes] = []
        async for chunk in self._body_chunks(headers):
            if answer is not None:
                continue  # drain the rest of the stream
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.rstrip(b"\r")
                if line.startswith(b"data:"):
                    data_lines.append(line[5:].lstrip(b" "))
                elif not line and data_lines:
                    message = _decode(b"\n".join(data_lines))
                    data_lines = []
                    if isinstance(message, dict) and message.get("id") == request_id:
                        answer = message
                        break
        if answer is None:
            raise ProtocolError(f"the SSE stream ended without a response to id {request_id}")
        return answer


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for peers that need a number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def wait_for_port(port: int, *, bound: float, alive: Callable[[], bool]) -> None:
    """Until something accepts on 127.0.0.1:port (``alive()`` False: the server died)."""
    with trio.fail_after(bound):
        while True:
            if not alive():
                raise ProtocolError(f"the server meant for port {port} exited before listening")
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.1)
                continue
            await stream.aclose()
            return


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in KiB, from /proc."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields


@contextlib.contextmanager
def unwrapped() -> Iterator[None]:
    """Re-raise the one real error of a nursery's exception group (trio groups strictly)."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        real = [leaf for leaf in leaves if not isinstance(leaf, trio.Cancelled)]
        if len(real) >= 1 and all(isinstance(leaf, Exception) for leaf in real):
            raise real[0] from group
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
