"""The floor for ``bench-instructions.py --floor``: a WebSocket ↔ stdio relay on trio that only
moves bytes.

What a relayed call costs in the orchestrator is measured against this: the same trio, the same
two wake-ups per call (the client's socket readable, the container's stdout readable), the same
two writes done at once from the task that has the bytes, a WebSocket frame parsed and unmasked
and one built per message, a line split per answer — and nothing else: no bounds, no session
machine, no tool-call record, no audit, metrics or tracing, no authentication. Not a product:
it trusts its one client completely (frames under 64 KiB, unfragmented, text only) and serves
one session at a time.

    python scripts/bench/trio_floor_relay.py --port 8765 --image reactor-fabric/mcp-server-time:…

The server is ``docker run -i --rm --network none IMAGE`` on pipes; when the client leaves, its
stdin is closed (the server then exits, and ``--rm`` removes the container); SIGTERM ends the
program.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from functools import partial

import trio

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
STOP_TIMEOUT_S = 10.0


def accept_key(request: bytes) -> bytes:
    for line in request.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"sec-websocket-key":
            digest = hashlib.sha1(value.strip() + GUID).digest()
            return base64.b64encode(digest)
    raise ValueError("no Sec-WebSocket-Key")


def text_frame(payload: bytes) -> bytes:
    size = len(payload)
    if size < 126:
        return bytes((0x81, size)) + payload
    if size < 65536:
        return bytes((0x81, 126)) + size.to_bytes(2, "big") + payload
    return bytes((0x81, 127)) + size.to_bytes(8, "big") + payload


def unmask(payload: bytes, mask: bytes) -> bytes:
    size = len(payload)
    key = (mask * (size // 4 + 1))[:size]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(
        size, "little"
    )


def client_messages(buffer: bytearray) -> list[bytes]:
    """Whole masked frames off the front of ``buffer`` (a close frame ends the relay)."""
    messages = []
    while len(buffer) >= 2:
        opcode, size = buffer[0] & 0x0F, buffer[1] & 0x7F
        start = 2
        if size == 126:
            if len(buffer) < 4:
                break
            size, start = int.from_bytes(buffer[2:4], "big"), 4
        if len(buffer) < start + 4 + size:
            break
        mask = bytes(buffer[start : start + 4])
        payload = unmask(bytes(buffer[start + 4 : start + 4 + size]), mask)
        del buffer[: start + 4 + size]
        if opcode == 0x8:
            raise EOFError
        messages.append(payload)
    return messages


async def relay(client: trio.SocketStream, image: str) -> None:
    """The relay as trio's streams make it natural to write (``--streams``)."""
    request = b""
    while b"\r\n\r\n" not in request:
        data = await client.receive_some(4096)
        if not data:  # a probe of the port (bench-instructions.py waits for it so)
            return
        request += data
    await client.send_all(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Protocol: mcp\r\nSec-WebSocket-Accept: " + accept_key(request) + b"\r\n\r\n"
    )
    command = ["docker", "run", "-i", "--rm", "--network", "none", image]
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert process.stdin is not None
    assert process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def client_to_server() -> None:
        buffer = bytearray()
        while True:
            data = await client.receive_some(65536)
            if not data:
                return
            buffer += data
            try:
                messages = client_messages(buffer)
            except EOFError:
                return
            if messages:
                await stdin.send_all(b"\n".join(messages) + b"\n")

    async def server_to_client() -> None:
        pending = b""
        while True:
            data = await stdout.receive_some(65536)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            if lines:
                await client.send_all(b"".join(text_frame(line) for line in lines))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_to_client)
        await client_to_server()
        # The client left: the server's stdin closed ends it, and --rm removes its container.
        with trio.move_on_after(STOP_TIMEOUT_S):
            await stdin.aclose()
            await process.wait()
        nursery.cancel_scope.cancel()


def start_server(image: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """The server's process, and its stdin's and stdout's descriptors, non-blocking."""
    command = ["docker", "run", "-i", "--rm", "--network", "none", image]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None
    assert process.stdout is not None
    stdin_fd, stdout_fd = process.stdin.fileno(), process.stdout.fileno()
    os.set_blocking(stdin_fd, False)
    os.set_blocking(stdout_fd, False)
    return process, stdin_fd, stdout_fd


async def raw_relay(sock: socket.socket, image: str) -> None:
    """The same relay on the bare calls the orchestrator makes: a wait for readability, then
    ``recv``/``read``; a write made at once (``send``/``write`` of what the kernel takes, a wait
    for writability only for the rest) — none of trio's stream machinery (conflict detection,
    the checkpoints of ``send_all``/``receive_some``)."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = b""
    while b"\r\n\r\n" not in request:
        await trio.lowlevel.wait_readable(sock)
        data = sock.recv(4096)
        if not data:  # a probe of the port (bench-instructions.py waits for it so)
            sock.close()
            return
        request += data
    process, stdin_fd, stdout_fd = start_server(image)
    sock.sendall(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Protocol: mcp\r\nSec-WebSocket-Accept: " + accept_key(request) + b"\r\n\r\n"
    )

    async def write(fd: int, data: bytes, send: Callable[[bytes], int]) -> None:
        while data:
            try:
                data = data[send(data) :]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)

    async def client_to_server() -> None:
        buffer = bytearray()
        while True:
            await trio.lowlevel.wait_readable(sock)
            data = sock.recv(65536)
            if not data:
                return
            buffer += data
            try:
                messages = client_messages(buffer)
            except EOFError:
                return
            if messages:
                line = b"\n".join(messages) + b"\n"
                await write(stdin_fd, line, lambda data: os.write(stdin_fd, data))

    async def server_to_client() -> None:
        pending = b""
        while True:
            await trio.lowlevel.wait_readable(stdout_fd)
            data = os.read(stdout_fd, 65536)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            if lines:
                frames = b"".join(text_frame(line) for line in lines)
                await write(sock.fileno(), frames, sock.send)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_to_client)
        await client_to_server()
        assert process.stdin is not None
        process.stdin.close()
        with trio.move_on_after(STOP_TIMEOUT_S):
            await trio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()
    sock.close()


async def main(port: int, image: str, *, streams: bool) -> None:
    stopping = trio.Event()
    async with trio.open_nursery() as nursery:

        async def stop_on_sigterm() -> None:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    stopping.set()
                    return

        async def serve() -> None:
            if streams:
                listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
                await trio.serve_listeners(partial(relay, image=image), listeners)
            with socket.create_server(("127.0.0.1", port)) as listener:
                listener.setblocking(False)
                while True:
                    await trio.lowlevel.wait_readable(listener)
                    connection, _ = listener.accept()
                    nursery.start_soon(raw_relay, connection, image)

        nursery.start_soon(stop_on_sigterm)
        nursery.start_soon(serve)
        await stopping.wait()
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument(
        "--streams",
        action="store_true",
        help="trio's streams (send_all, receive_some), not bare calls",
    )
    arguments = parser.parse_args()
    trio.run(partial(main, streams=arguments.streams), arguments.port, arguments.image)
    sys.exit(0)
