"""What a session sees of its client: one JSON-RPC message per frame, whatever the transport.

WebSocket (:mod:`.websocket`), Streamable HTTP (:mod:`.http_channel`) and the tests' fakes
implement it; the one session driver (:mod:`.driver`) uses it, for both endpoints.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, runtime_checkable

import trio

from ..protocol.events import Action
from ..protocol.jsonrpc import Peek


class ChannelClosed(Exception):
    """The client is gone (its connection broke or closed): what every channel raises from
    :meth:`ClientChannel.send` and :meth:`ClientChannel.close`, whatever its transport raised
    (translated at the channel, as httpcore's ``map_exceptions`` does)."""


# What trio raises from a stream whose other end is gone, or that was closed.
_CLIENT_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


_P = ParamSpec("_P")
_T = TypeVar("_T")
_Self = TypeVar("_Self")


def channel_boundary(
    method: Callable[Concatenate[_Self, _P], Awaitable[_T]],
) -> Callable[Concatenate[_Self, _P], Coroutine[Any, Any, _T]]:
    """Around a channel's ``send`` or ``close``: trio's exceptions for a broken or closed
    stream become :class:`ChannelClosed`, so that what a session catches does not depend on the
    transport (nor on trio's names for it). Anything else goes through unchanged: it is a bug,
    for the session's crash path to report."""

    @functools.wraps(method)
    async def translated(self: _Self, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        # A plain try: this is every message's path, and a try costs nothing until it catches
        # (a generator-based context manager would cost a generator per message).
        try:
            return await method(self, *args, **kwargs)
        except _CLIENT_GONE as exc:
            raise ChannelClosed(str(exc) or type(exc).__name__) from exc

    return translated


class Handover:
    """What a message delivered directly (:class:`DeliversDirectly`) left for the session's
    reader task: the machine's actions that may wait (a frame for the client, a container to
    start), or the machine's failure, raised there as if it had happened in that task."""

    __slots__ = ("actions", "failure")

    def __init__(self, actions: list[Action], failure: Exception | None = None) -> None:
        self.actions = actions
        self.failure = failure

    def __len__(self) -> int:
        return 0  # (bytes counted by a channel's inbox: none)


@runtime_checkable
class DeliversDirectly(Protocol):
    """A channel whose client messages arrive in other tasks (Streamable HTTP: each in its
    POST's handler). While the session's reader waits for a message with none queued, the
    session sets ``direct``; the channel then hands a message to it instead of queueing it for
    the reader — one task hand-off fewer per message; its third argument says whether more of
    the client's messages are under way (a burst: what they ask of a container is then left to
    its writer task, which writes them together). ``direct`` returns False when it did not
    take the message (the machine does not accept now): the channel queues it then, as
    always. What a delivered message left to do that may wait comes back through
    :meth:`hand_over`, and the reader's :meth:`ClientChannel.receive` returns it in order."""

    direct: Callable[[bytes, Peek, bool], bool] | None

    def hand_over(self, handover: Handover) -> None: ...


class ClientChannel(Protocol):
    """A client connection carrying one JSON-RPC message per frame, for one session.

    ``send`` may wait while the transport's buffer for the client is full (backpressure); it
    raises :class:`ChannelClosed` once the client is gone, and so may ``close`` (closing a
    channel closed already is no error). No other exception of the transport's comes out of
    either: implementations translate them at this boundary
    (:func:`channel_boundary`). ``message`` is the frame's envelope when the relay
    has peeked at it already.
    """

    async def receive(self) -> bytes | Handover | None:
        """The next message (UTF-8 bytes), or None once the client has gone (a
        :class:`Handover` only from a channel that :class:`DeliversDirectly`)."""

    async def send(self, frame: bytes, message: Peek | None = None, *, more: bool = False) -> None:
        """``more``: other frames follow at once (a burst): the transport may hold this one
        back to write them together."""

    @property
    def more_received(self) -> bool:
        """Whether messages received already wait to be taken (a burst): what they cause may
        be written together."""

    async def close(self, code: int, reason: str = "") -> None: ...


class LeasedClient(Protocol):
    """A transport whose client may leave without saying so (Streamable HTTP: nothing is
    connected between requests). Its session keeps the client's lease (see
    :mod:`reactor_fabric.protocol.client_lease`) from what this tells."""

    @property
    def lease_seconds(self) -> float | None:
        """How long the client may stay away with nothing open (None: for ever)."""

    @property
    def busy(self) -> bool:
        """Whether a request or a stream of the client's is open now."""

    async def streams_changed(self) -> None:
        """Wait until a stream of the client's opened or closed (several changes are told as
        one)."""
