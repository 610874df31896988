"""The fabric socket of an agent's container: how the agent reaches its child session.

An agent service (``llm_agent``) that ``uses`` other services gets, for each of its containers,
a Unix socket of the orchestrator's stdio area bound into that one container at
:data:`CHILD_SOCKET_TARGET`; the agent image's relay connects to it (images/README.md, "Agent
images"). A connection on that socket comes from that container and no other — the container
has no network — so whose it is is known without trusting what it sends; the token it sends
first is checked as well (:mod:`reactor_fabric.trio.child_sessions`), so that a socket handed to
the wrong container by a bug would still not open a session.

This module only accepts: each connection is handed, with the container's name, to the handler
whoever runs :meth:`ChildSockets.run` gave (the trio layer serves it as a child session). It
knows nothing of sessions, tokens or MCP.

Bounds: :data:`MAX_CONNECTIONS` at once per container (Claude Code opens one per MCP server; a
relay that reconnects in a loop gets the next ones closed at once).

Resource handling: :meth:`ChildSockets.run` owns a nursery; each container's listener and its
connections' handlers live in a cancel scope of their own, ended by :meth:`ChildSockets.stop`
(at the container's removal) or when the nursery ends: a child session still open is then
cancelled, and its own shielded teardown removes its containers. Every socket is closed, and
its path unlinked, in ``finally``.

Error handling: a handler's failure ends its own connection only (``except*``, logged); nothing
one container does reaches another's connections or the orchestrator.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from ..policy.container_parts.child_session import CHILD_SOCKET_TARGET
from .unix_listeners import close_listener, serve_listener

__all__ = ["CHILD_SOCKET_TARGET", "ChildHandler", "ChildSockets"]

log = logging.getLogger(__name__)

# Connections at once per container.
MAX_CONNECTIONS = 4
# A container's listen backlog: its relay connects once per agent run.
CHILD_BACKLOG = 8

ChildHandler = Callable[[str, trio.abc.Stream], Awaitable[None]]


@dataclass
class _Served:
    name: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    connections: int = 0


class ChildSockets:
    """Each agent container's fabric socket, served while :meth:`run` runs."""

    def __init__(self, *, max_connections: int = MAX_CONNECTIONS) -> None:
        self._max_connections = max_connections
        self._nursery: trio.Nursery | None = None
        self._handler: ChildHandler | None = None
        self._served: dict[str, _Served] = {}  # by container id

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def run(
        self,
        handler: ChildHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve containers' sockets until cancelled, each connection by ``handler(name,
        stream)`` (the container's name; the stream is the handler's to close)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery, self._handler = nursery, handler
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = self._handler = None
            self._served.clear()

    def serve(
        self, container: str, name: str, listener: socket.socket, path: str | None = None
    ) -> None:
        """Serve the container ``container`` (its id; ``name``, its name, is what the handler
        is told) on ``listener`` (listening, ours from now on: closed, and ``path`` unlinked,
        when served no more) until :meth:`stop`. RuntimeError if :meth:`run` does not run."""
        if self._nursery is None:
            close_listener(listener, path)
            raise RuntimeError("the fabric sockets are not served in this process")
        served = _Served(name)
        self._served[container] = served
        self._nursery.start_soon(self._accept, served, listener, path)

    async def connect(self, container: str, stream: trio.abc.Stream) -> None:
        """Hand ``stream`` to the handler as a connection of ``container`` (a runtime with no
        socket of its own: the in-memory one, see :meth:`watch`). Closed at once if the
        container is not served."""
        served = self._served.get(container)
        if served is None or self._nursery is None:
            await _close_quietly(stream)
            return
        self._nursery.start_soon(self._connection_in_scope, served, stream)

    def stop(self, container: str) -> None:
        """End ``container``'s listener and connections (by id; unknown: nothing to do)."""
        served = self._served.pop(container, None)
        if served is not None:
            served.scope.cancel()

    def watch(self, container: str, name: str) -> None:
        """Serve ``container`` with no listener (its connections come by :meth:`connect`)."""
        if self._nursery is None:
            raise RuntimeError("the fabric sockets are not served in this process")
        self._served[container] = _Served(name)

    async def _connection_in_scope(self, served: _Served, stream: trio.abc.Stream) -> None:
        with served.scope:
            await self._connection(served, stream)

    async def _accept(self, served: _Served, listener: socket.socket, path: str | None) -> None:
        with served.scope:
            await serve_listener(
                listener,
                path,
                functools.partial(self._connection, served),
                failed="child_socket_failed",
                fields={"container_name": served.name},
            )

    async def _connection(self, served: _Served, stream: trio.abc.Stream) -> None:
        served.connections += 1
        try:
            if served.connections > self._max_connections or self._handler is None:
                log.warning(
                    "child_connection_refused",
                    extra={
                        "container_name": served.name,
                        "detail": f"{self._max_connections} connections at once",
                    },
                )
                await _close_quietly(stream)
                return
            try:
                await self._handler(served.name, stream)
            except* Exception as failure:
                # The handler's own bug: this connection ends, nothing else does.
                log.error(
                    "child_connection_failed",
                    extra={"container_name": served.name},
                    exc_info=failure,
                )
        finally:
            served.connections -= 1
            await _close_quietly(stream)


async def _close_quietly(stream: trio.abc.Stream) -> None:
    with trio.CancelScope(shield=True), contextlib.suppress(trio.BrokenResourceError, OSError):
        await trio.aclose_forcefully(stream)
