"""An agent's child session: the suite, as the agent in its container reaches it.

An agent service (``llm_agent``) with ``uses: [git, filesystem, …]`` gets, for each of its
containers, a grant (:mod:`reactor_fabric.policy.child_grant`: a token, made at the
container's start and revoked at its removal) and a socket bound into that one container
(:mod:`reactor_fabric.runtime.child_sockets`). The agent image's relay connects, sends one
line naming the token::

    {"jsonrpc": "2.0", "method": "fabric/child", "params": {"token": "…"}}

and from then on speaks MCP over stdio framing (one JSON-RPC message per line), as its agent
CLI spoke it to the relay. :func:`serve_child` checks the token and serves the connection as a
fabric-endpoint session (:func:`~reactor_fabric.trio.session.serve_session`) of its own: the
*child* of the session whose call started the agent, with

- the parent session's mounts (validated then; pinned again at each of its containers' starts,
  as the parent's own are): the agent works on the caller's project and nothing else;
- only the services of ``uses`` (another agent only below ``orchestrator.agents.max_depth``),
  every tool listed (``tools=all``): an agent has no use for discovery's meta-tools;
- the parent call's id and the parent's trace: every record of the child session names them
  (the provenance the audit asks for), the status page shows it under its parent.

Why a line of our own before MCP rather than HTTP with a bearer token: the agent CLI spawns
the relay as a stdio MCP server (no proxy settings, no network on the way), and a socket that
only one container can reach already says whose the connection is; the token makes a socket
handed to the wrong container by a bug useless, and ends with the call.

Bounds: the token line within ``first_message_timeout`` and 4 KiB, the first message within
``first_message_timeout`` again; then the session's own limits (message size, buffers, the
client write timeout for :class:`LineChannel`).

Resource handling: the stream is closed by the runtime's :class:`~reactor_fabric.runtime.
child_sockets.ChildSockets` when this returns; the session's teardown (shielded, bounded)
removes its containers, including when the agent's container is removed under it.
"""

from __future__ import annotations

import hmac
import logging

import msgspec
import trio

from ..config.suite import FABRIC_ENDPOINT
from ..observe.observer import Client
from ..protocol.framing import FramingError, LineSplitter
from ..protocol.jsonrpc import Peek
from .channel import ChannelClosed, channel_boundary
from .session import SessionParts, serve_session

log = logging.getLogger(__name__)

# The relay's first line: the method and the most it may be.
CHILD_METHOD = "fabric/child"
MAX_TOKEN_LINE = 4096
READ_CHUNK = 65536
TRANSPORT = "agent"


class _TokenLine(msgspec.Struct):
    method: str
    params: dict[str, object] = msgspec.field(default_factory=dict)


class LineChannel:
    """A client speaking MCP's stdio framing on a byte stream (one message per line).

    One writer at a time: :meth:`send` holds a lock (FIFO) for its one ``send_all``, bounded by
    ``write_timeout`` — a relay that stops reading ends its session (ChannelClosed), and stalls
    nothing but the session's own feeders meanwhile. Reading: lines of at most ``max_line``; a
    longer one ends the session (the relay is broken or hostile).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        max_line: int,
        write_timeout: float,
        pending: list[bytes] | None = None,
        splitter: LineSplitter | None = None,
    ) -> None:
        self._stream = stream
        self._splitter = splitter or LineSplitter(max_line=max_line)
        self._lines: list[bytes] = list(pending or [])
        self._write_timeout = write_timeout
        self._lock = trio.Lock()
        self._eof = False

    async def receive(self) -> bytes | None:
        while not self._lines:
            if self._eof:
                return None
            try:
                data = bytes(await self._stream.receive_some(READ_CHUNK))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self._eof = True
                return None
            try:
                self._lines.extend(self._splitter.feed(data))
            except FramingError as exc:
                log.warning("child_line_too_long", extra={"detail": str(exc)})
                self._eof = True
                return None
        return self._lines.pop(0)

    @property
    def more_received(self) -> bool:
        return bool(self._lines)

    @channel_boundary
    async def send(self, frame: bytes, message: Peek | None = None, *, more: bool = False) -> None:
        async with self._lock:
            with trio.move_on_after(self._write_timeout) as bounded:
                await self._stream.send_all(frame + b"\n")
            if bounded.cancelled_caught:
                raise ChannelClosed("the agent's relay did not read in time")

    @channel_boundary
    async def close(self, code: int, reason: str = "") -> None:
        await trio.aclose_forcefully(self._stream)


async def serve_child(parts: SessionParts, container_name: str, stream: trio.abc.Stream) -> None:
    """Serve one connection on the fabric socket of the container ``container_name`` (see the
    module docstring) with the grant its start made (``parts.starter``'s). Returns when the
    session ends or the connection is refused; the caller closes the stream."""
    grant = parts.starter.child_grants.get(container_name)
    limits = parts.settings.limits
    fields = {"container_name": container_name}
    if grant is None:
        log.warning("child_refused", extra={**fields, "detail": "no agent call is served"})
        return
    first = await _token_line(stream, limits.first_message_seconds)
    if first is None:
        log.warning("child_refused", extra={**fields, "detail": "no token line in time"})
        return
    line, rest = first
    if not _token_matches(line, grant.token):
        log.warning("child_refused", extra={**fields, "detail": "a wrong or malformed token"})
        return
    # What came with the token line (the initialize, often) is the session's first.
    splitter = LineSplitter(max_line=limits.max_message_bytes)
    try:
        pending = splitter.feed(rest)
    except FramingError:
        return
    channel = LineChannel(
        stream,
        max_line=limits.max_message_bytes,
        write_timeout=limits.client_write_seconds,
        pending=pending,
        splitter=splitter,
    )
    opening: bytes | None = None
    with trio.move_on_after(limits.first_message_seconds):
        opening = await channel.receive()
    if opening is None:
        log.warning("child_refused", extra={**fields, "detail": "no first message in time"})
        return
    await serve_session(
        parts,
        channel,
        FABRIC_ENDPOINT,
        [],
        first_frame=opening,
        transport=TRANSPORT,
        client=Client(
            parts.settings.token_id if grant.user is None else "oidc",
            f"agent:{grant.agent}",
            TRANSPORT,
            user=grant.user,
            groups=grant.groups,
        ),
        child=grant,
    )


async def _token_line(stream: trio.abc.Stream, seconds: float) -> tuple[bytes, bytes] | None:
    """The first line (at most MAX_TOKEN_LINE bytes, within ``seconds``) and what came after it
    in the same reads; None if the relay sent none, closed, or sent more without a newline."""
    received = bytearray()
    with trio.move_on_after(seconds):
        while len(received) <= MAX_TOKEN_LINE:
            try:
                data = await stream.receive_some(MAX_TOKEN_LINE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not data:
                return None
            newline = data.find(b"\n")
            if newline != -1 and len(received) + newline <= MAX_TOKEN_LINE:
                return bytes(received) + data[:newline], bytes(data[newline + 1 :])
            received += data
    return None


def _token_matches(line: bytes, token: str) -> bool:
    try:
        first = msgspec.json.decode(line, type=_TokenLine)
    except msgspec.DecodeError:
        return False
    offered = first.params.get("token")
    if first.method != CHILD_METHOD or not isinstance(offered, str):
        return False
    return hmac.compare_digest(offered.encode(), token.encode())
