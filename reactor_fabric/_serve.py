"""Running the orchestrator: the root nursery, the HTTP/WebSocket server, and shutdown.

Ownership tree::

    serve_orchestrator (root nursery)
    └── hypercorn.trio.serve   (HTTP routes and the /mcp endpoint, one port)

Resource handling: leaving :func:`serve_orchestrator` for any reason (cancellation, an error,
a signal handled by the caller) closes the listening sockets and the Docker client; the close is
shielded and bounded in time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import hypercorn.config
import hypercorn.trio
import trio

from ._app import FabricApp
from ._fabric import Fabric

log = logging.getLogger(__name__)

SHUTDOWN_BOUND_SECONDS = 20.0


@dataclass(frozen=True)
class Listening:
    """Where the orchestrator answers, once it really does."""

    http_url: str

    @property
    def ws_url(self) -> str:
        return "ws" + self.http_url.removeprefix("http")


def hypercorn_config(host: str, port: int, *, max_message_bytes: int) -> hypercorn.config.Config:
    config = hypercorn.config.Config()
    bind_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    config.bind = [f"{bind_host}:{port}"]
    config.accesslog = None
    # hypercorn's own messages go through our JSON handler (see _logging.configure_logging).
    config.errorlog = logging.getLogger("reactor_fabric.http")
    config.websocket_max_message_size = max_message_bytes
    config.graceful_timeout = 2.0
    return config


async def serve_orchestrator(
    fabric: Fabric,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the orchestrator until cancelled.

    Calls ``task_status.started(Listening(...))`` only once the socket is bound and accepting,
    with the real port when ``port`` is 0.

    Error handling: an ``OSError`` from binding (port in use, address not available) propagates
    before ``started`` is called, so the caller can report it.
    """
    config = hypercorn_config(
        host, port, max_message_bytes=fabric.suite.orchestrator.max_message_bytes
    )
    app = FabricApp(fabric)
    try:
        async with trio.open_nursery() as nursery:
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
            await fabric.engine.close()
