"""What a session sees of its client: one JSON-RPC message per frame, whatever the transport.

WebSocket (:mod:`.websocket`), Streamable HTTP (:mod:`.http_channel`) and the tests' fakes
implement it; both endpoints' session drivers (:mod:`.session`, :mod:`.fabric_session`) use it.
"""

from __future__ import annotations

from typing import Protocol

from ..protocol.jsonrpc import Peek


class ChannelClosed(Exception):
    """The client is gone (its connection broke or closed): what every channel raises from
    :meth:`ClientChannel.send` and :meth:`ClientChannel.close`, whatever its transport raised
    (translated at the channel, as httpcore's ``map_exceptions`` does)."""


class ClientChannel(Protocol):
    """A client connection carrying one JSON-RPC message per frame, for one session.

    ``send`` may wait while the transport's buffer for the client is full (backpressure); it
    raises :class:`trio.BrokenResourceError` or :class:`trio.ClosedResourceError` once the client
    is gone. ``message`` is the frame's envelope when the relay has peeked at it already.
    """

    async def receive(self) -> bytes | None:
        """The next message (UTF-8 bytes), or None once the client has gone."""

    async def send(self, frame: bytes, message: Peek | None = None) -> None: ...

    async def close(self, code: int, reason: str = "") -> None: ...
