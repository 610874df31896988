"""Running the orchestrator: the root nursery, the HTTP/WebSocket server, and shutdown.

Ownership tree::

    serve_orchestrator (root nursery)
    ├── run_sweeper            orphan containers: at start-up, then periodically
    ├── HttpSessions.run       one task per Streamable HTTP session → serve_session
    └── hypercorn.trio.serve   HTTP routes and the /mcp endpoint, one port
        └── one task per WebSocket connection → serve_session (own nursery, own containers)

Resource handling: leaving :func:`serve_orchestrator` for any reason (cancellation, an error,
a signal handled by the caller) cancels every session, whose own ``finally`` removes its
container; then every container still labelled with this instance is removed and the Docker
client closed. That last step is shielded and bounded in time.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from dataclasses import dataclass

import hypercorn.config
import hypercorn.trio
import trio

from .._errors import FabricError
from ..runtime.docker import hostname
from .app import FabricApp
from .fabric import Fabric
from .streamable_http import HttpSessions
from .sweeper import remove_instance_containers, run_sweeper

log = logging.getLogger(__name__)

SHUTDOWN_BOUND_SECONDS = 20.0
WEBSOCKET_PING_SECONDS = 20.0


@dataclass(frozen=True)
class Listening:
    """Where the orchestrator answers, once it really does."""

    http_url: str

    @property
    def ws_url(self) -> str:
        return "ws" + self.http_url.removeprefix("http")


def bind_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket for ``host:port`` (port 0: any free port).

    Bound here rather than inside hypercorn so that "address in use" surfaces as a plain
    ``OSError`` before any task starts, and no half-made socket is left open.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host.strip("[]"), port))
    except BaseException:
        sock.close()
        raise
    return sock


def hypercorn_config(listener: socket.socket, *, max_message_bytes: int) -> hypercorn.config.Config:
    config = hypercorn.config.Config()
    # hypercorn takes ownership of an fd:// descriptor and closes it when it stops, so it gets a
    # duplicate: the caller keeps (and closes) `listener`.
    config.bind = [f"fd://{os.dup(listener.fileno())}"]
    config.accesslog = None
    # hypercorn's own messages go through our JSON handler (see _logging.configure_logging).
    config.errorlog = logging.getLogger("reactor_fabric.http")
    config.websocket_max_message_size = max_message_bytes
    # Keepalive for idle clients (JSON-RPC ping is gone in MCP 2026-07-28): WebSocket pings.
    config.websocket_ping_interval = WEBSOCKET_PING_SECONDS
    config.graceful_timeout = 2.0
    return config


async def serve_orchestrator(
    fabric: Fabric,
    listener: socket.socket,
    *,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the orchestrator until cancelled.

    ``listener`` comes from :func:`bind_listener` and stays owned by the caller. Calls
    ``task_status.started(Listening(...))`` only once the server is accepting connections.
    """
    config = hypercorn_config(
        listener, max_message_bytes=fabric.suite.orchestrator.max_message_bytes
    )
    http_sessions = HttpSessions(fabric)
    app = FabricApp(fabric, http_sessions)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(
                    run_sweeper,
                    fabric.engine,
                    instance_id=fabric.instance_id,
                    this_host=hostname(),
                    live_sessions=lambda: set(fabric.sessions),
                )
            )
            await nursery.start(http_sessions.run)
            binds: list[str] = await nursery.start(hypercorn.trio.serve, app, config)
            listening = Listening(http_url=binds[0])
            log.info(
                "serving",
                extra={"url": listening.http_url, "instance": fabric.instance_id},
            )
            task_status.started(listening)
    finally:
        with trio.move_on_after(SHUTDOWN_BOUND_SECONDS) as scope:
            scope.shield = True
            try:
                removed = await remove_instance_containers(fabric.engine, fabric.instance_id)
                log.info("shutdown_complete", extra={"removed_containers": removed})
            except FabricError as exc:
                log.error(
                    "shutdown_cleanup_failed", extra={"reason": exc.reason, "detail": str(exc)}
                )
            await fabric.engine.close()
