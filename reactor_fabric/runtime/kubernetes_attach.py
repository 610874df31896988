"""A pod's stdio through the API server: the ``pods/attach`` WebSocket, client side, on trio.

The Kubernetes runtime attaches to a session's pod once its server runs. This module opens that
WebSocket (TCP, TLS with the kubeconfig's trust and client certificate, the bearer token) and
moves whole binary messages; what the messages mean — channels, the half-close, the exit
status — is :class:`~reactor_fabric.protocol.k8s_attach.AttachChannels`' business (pure).

Why not a general WebSocket client: the ones at hand each run a reader task in a nursery their
context manager owns, so the connection could only live inside the task that opened it — a
pod started by the warm pool's task and handed to a session's could not be. This one has no
task: whoever reads stdout reads the socket (as with Docker's attach socket, see
:mod:`.demux`), and answers the server's pings on the way.

Bounds: a message over ``max_message`` bytes ends the attach (checked as its pieces arrive,
before they are joined); a refused handshake's body is read up to 64 KiB for its reason; the
handshake is bounded in time by the caller.

Resource handling: :meth:`AttachSocket.aclose` closes the transport; the caller owns the socket
from :func:`open_attach`'s return, which closes what it opened when it fails or is cancelled.

Error handling: a refused handshake is :class:`AttachRefused` (with the HTTP status and the
server's message); a connection that breaks or speaks broken WebSocket ends the stream (EOF for
readers), as a closed Docker attach socket does.
"""

from __future__ import annotations

import ssl
from typing import Final
from urllib.parse import urlsplit

import msgspec
import trio
import wsproto
import wsproto.utilities
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from ..protocol.k8s_attach import SUBPROTOCOLS

RECEIVE_SIZE: Final = 65536
MAX_REFUSAL_BODY: Final = 64 * 1024
NORMAL_CLOSURE: Final = 1000


class AttachRefused(Exception):
    """The API server did not accept the attach (``status``: its HTTP status; 0: no answer)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class _RefusalStatus(msgspec.Struct):
    message: str = ""
    reason: str = ""


class AttachSocket:
    """An accepted attach WebSocket: whole binary messages in, whole binary messages out."""

    def __init__(
        self,
        transport: trio.abc.Stream,
        connection: wsproto.WSConnection,
        subprotocol: str,
        *,
        max_message: int,
        pending: list[Event],
    ) -> None:
        self.subprotocol = subprotocol
        self._transport = transport
        self._ws = connection
        self._max_message = max_message
        self._events = list(pending)  # events that came with the handshake's answer
        self._parts: list[bytes] = []
        self._size = 0
        self._ended = False
        # The stdin writer and the reader (answering pings, closing) both write the transport.
        self._send_lock = trio.StrictFIFOLock()

    async def receive_message(self) -> bytes | None:
        """The next whole binary message; None once the WebSocket has ended (closed by either
        side, broken, or a message over the bound)."""
        while True:
            while self._events:
                message = await self._handle(self._events.pop(0))
                if message is not None:
                    return message
            if self._ended:
                return None
            try:
                data = await self._transport.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            try:
                self._ws.receive_data(bytes(data) or None)
                self._events.extend(self._ws.events())
            except wsproto.utilities.RemoteProtocolError:
                self._ended = True
            if not data:
                self._ended = True

    async def _handle(self, event: Event) -> bytes | None:
        if isinstance(event, BytesMessage):
            self._size += len(event.data)
            if self._size > self._max_message:
                await self._close(1009)
                return None
            self._parts.append(bytes(event.data))
            if not event.message_finished:
                return None
            message = b"".join(self._parts)
            self._parts.clear()
            self._size = 0
            return message
        if isinstance(event, Ping):
            await self._send(event.response())
        elif isinstance(event, CloseConnection):
            if self._ws.state is ConnectionState.REMOTE_CLOSING:
                await self._send(event.response())
            self._ended = True
        elif isinstance(event, TextMessage):
            # The channel protocols are binary only (base64 ones are never offered).
            await self._close(1003)
        return None

    async def send_message(self, data: bytes) -> None:
        """Send one binary message; raises :class:`trio.BrokenResourceError` once the
        WebSocket can no longer carry it."""
        if self._ws.state is not ConnectionState.OPEN:
            raise trio.BrokenResourceError("the attach WebSocket is closed")
        await self._send(BytesMessage(data=data))

    async def close(self, code: int = NORMAL_CLOSURE) -> None:
        """Start the closing handshake (the server answers and ends the stream)."""
        await self._close(code)

    async def _close(self, code: int) -> None:
        if self._ws.state is ConnectionState.OPEN:
            try:
                await self._send(CloseConnection(code=code))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._ended = True
        if code != NORMAL_CLOSURE:
            self._ended = True

    async def _send(self, event: Event) -> None:
        data = self._ws.send(event)
        async with self._send_lock:
            await self._transport.send_all(data)

    async def aclose(self) -> None:
        self._ended = True
        await self._transport.aclose()


async def open_attach(
    server: str,
    target: str,
    *,
    token: str | None,
    ssl_context: ssl.SSLContext | bool,
    tls_server_name: str | None = None,
    max_message: int,
) -> AttachSocket:
    """Open ``target`` (path and query of the attach) on the API server at ``server`` (its URL,
    as the kubeconfig names it), offering the channel subprotocols (v5 first).

    ``ssl_context`` is the kubeconfig's trust (``True``: the system's). Bound it in time
    yourself. Raises :class:`AttachRefused` if the server refuses, or accepts without one of
    the offered subprotocols; OSError and trio's stream errors pass through.
    """
    parts = urlsplit(server)
    secure = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    prefix = parts.path.rstrip("/")
    transport: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    try:
        if secure:
            context = ssl_context if isinstance(ssl_context, ssl.SSLContext) else None
            transport = trio.SSLStream(
                transport,
                context or ssl.create_default_context(),
                server_hostname=tls_server_name or host,
                https_compatible=True,
            )
        authority = parts.netloc.rpartition("@")[2]
        return await handshake(
            transport, authority, prefix + target, token=token, max_message=max_message
        )
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(transport)
        raise


async def handshake(
    transport: trio.abc.Stream,
    authority: str,
    target: str,
    *,
    token: str | None,
    max_message: int,
) -> AttachSocket:
    """The opening handshake on a connected ``transport`` (the caller closes it on failure)."""
    connection = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    request = Request(
        host=authority, target=target, subprotocols=list(SUBPROTOCOLS), extra_headers=headers
    )
    await transport.send_all(connection.send(request))
    return await _accepted(transport, connection, max_message=max_message)


async def _accepted(
    transport: trio.abc.Stream, connection: wsproto.WSConnection, *, max_message: int
) -> AttachSocket:
    """Read the handshake's answer: the socket, or AttachRefused with the server's reason."""
    refusal: RejectConnection | None = None
    body = bytearray()
    while True:
        data = await transport.receive_some(RECEIVE_SIZE)
        if not data and refusal is None:
            raise AttachRefused("the API server closed the connection", status=0)
        try:
            connection.receive_data(bytes(data) or None)
            events = list(connection.events())
        except wsproto.utilities.RemoteProtocolError as exc:
            raise AttachRefused(f"not a WebSocket answer: {exc}", status=0) from None
        for index, event in enumerate(events):
            if isinstance(event, AcceptConnection):
                if event.subprotocol not in SUBPROTOCOLS:
                    raise AttachRefused(
                        f"the API server chose no channel subprotocol ({event.subprotocol!r})",
                        status=101,
                    )
                return AttachSocket(
                    transport,
                    connection,
                    event.subprotocol,
                    max_message=max_message,
                    pending=events[index + 1 :],
                )
            if isinstance(event, RejectConnection):
                refusal = event
                if not event.has_body:
                    raise _refused(refusal, b"")
            elif isinstance(event, RejectData) and refusal is not None:
                body += event.data[: MAX_REFUSAL_BODY - len(body)]
                if event.body_finished:
                    raise _refused(refusal, bytes(body))
        if not data and refusal is not None:
            raise _refused(refusal, bytes(body))


def _refused(refusal: RejectConnection, body: bytes) -> AttachRefused:
    """The server's own words (a Status object's message), else its status line."""
    message = ""
    try:
        message = msgspec.json.decode(body, type=_RefusalStatus).message
    except (msgspec.DecodeError, RecursionError):
        message = body[:500].decode("utf-8", "replace").strip()
    return AttachRefused(message or f"HTTP {refusal.status_code}", status=refusal.status_code)
