"""Running the orchestrator: the root nursery, the server, and a shutdown bounded in time.

Ownership tree::

    serve_orchestrator (root nursery)
    ├── EgressProxy.run        containers' egress proxies (runtime/egress_proxy.py)
    ├── run_sweeper            orphan containers: at start-up, then periodically; removals
    │                          a teardown cut short, as they come
    ├── Fabric.learn_catalog   what each service offers (cache, else a probe), for /mcp
    ├── WarmPool.run           started, idle containers for services with `warm` (warm_pool)
    ├── HttpSessions.run       one task per Streamable HTTP session → serve_session
    └── connections (nursery)
        ├── serve_http         the accept loop (HTTP and WebSocket on one port)
        └── one task per connection; a WebSocket's task runs its session

Shutdown (:meth:`Orchestrator.stop`, on SIGINT/SIGTERM): stop accepting; tell every session
(``Fabric.stopping``), which answers each request in flight with -32002
``orchestrator_stopping``, closes its client normally and removes its containers; wait for that,
then cancel what is left — all before ``limits.shutdown_timeout`` has passed since the signal,
even if a client does not read (every write to a client is bounded and cancellable). The last
part of the bound is kept for removing containers; one that could not be removed in time is left
to the sweeper of the next start (its owner is gone).

Resource handling: leaving :func:`serve_orchestrator` for any reason cancels every session,
whose own ``finally`` removes its containers; then every container still labelled with this
instance is removed and the runtime closed — shielded, and bounded by the same deadline.

Error handling: nothing a session does reaches this nursery (sessions contain their failures);
the sweeper only logs an unreachable engine.
"""

from __future__ import annotations

import functools
import logging
import socket
from dataclasses import dataclass, field

import trio

from .._errors import FabricError
from ..policy.owner import hostname
from .app import FabricApp
from .audit_batches import hand_audit_over_later
from .child_sessions import serve_child
from .fabric import Fabric
from .http_server import ConnectionCounts, HttpLimits, serve_http
from .streamable_http import HttpSessions
from .sweeper import remove_instance_containers, run_sweeper
from .warm_pool import open_warm_pool

log = logging.getLogger(__name__)

# Of the shutdown bound, the share kept for removing containers after the graceful part.
CLEANUP_SHARE = 0.4


@dataclass(frozen=True)
class Listening:
    """Where the orchestrator answers, once it really does."""

    http_url: str

    @property
    def ws_url(self) -> str:
        return "ws" + self.http_url.removeprefix("http")


def bind_listener(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket for ``host:port`` (port 0: any free port).

    Bound here rather than inside the server so that "address in use" surfaces as a plain
    ``OSError`` before any task starts, and no half-made socket is left open.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(512)
    except BaseException:
        sock.close()
        raise
    return sock


def listening_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


@dataclass
class Orchestrator:
    """A running orchestrator, as :func:`serve_orchestrator` reports it started."""

    fabric: Fabric
    listening: Listening
    connections: ConnectionCounts
    _stop_requested: trio.Event = field(default_factory=trio.Event)

    async def wait_until_idle(self) -> None:
        """Return once no session, container or connection is left (tests, diagnostics)."""
        fabric = self.fabric
        while fabric.sessions or fabric.containers or self.connections.open:
            await fabric.changed.wait()

    @property
    def http_url(self) -> str:
        return self.listening.http_url

    @property
    def ws_url(self) -> str:
        return self.listening.ws_url

    def stop(self) -> None:
        """Begin a graceful, bounded shutdown; :func:`serve_orchestrator` returns when done."""
        self._stop_requested.set()


async def serve_orchestrator(
    fabric: Fabric,
    listener: socket.socket,
    *,
    task_status: trio.TaskStatus[Orchestrator] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until :meth:`Orchestrator.stop` (graceful) or cancellation (immediate).

    ``listener`` comes from :func:`bind_listener` (already listening, so nothing that connects
    from now on is refused) and stays owned by the caller. Calls ``task_status.started`` once
    the accept loop runs.
    """
    limits = fabric.limits
    http_limits = HttpLimits(
        max_connections=limits.max_connections, write_timeout=limits.client_write_seconds
    )
    http_sessions = HttpSessions(fabric)
    app = FabricApp(fabric, http_sessions)
    counts = ConnectionCounts(on_change=fabric.notify_change)
    accepting_socket = listener.dup()  # ours to close; the caller keeps `listener`
    accepting_socket.setblocking(False)
    running = Orchestrator(fabric, Listening(listening_url(listener)), counts)
    if fabric.pool is None:
        fabric.pool = await open_warm_pool(fabric)
    try:
        async with trio.open_nursery() as root:
            if fabric.runtime.egress is not None:
                # First: the catalog's probe and the pool may start egress containers.
                await root.start(fabric.runtime.egress.run, fabric.egress_connection)
            if fabric.runtime.children is not None:
                # Agents' child sessions: their sockets are made as their containers start.
                await root.start(
                    fabric.runtime.children.run, functools.partial(serve_child, fabric)
                )
            await root.start(
                functools.partial(
                    run_sweeper,
                    fabric.runtime,
                    instance_id=fabric.instance_id,
                    this_host=hostname(),
                    live_sessions=lambda: set(fabric.sessions),
                    live_containers=fabric.live_container_ids,
                    on_removed=fabric.observer.orphans_removed,
                    deferred=fabric.deferred_removals,
                )
            )
            if fabric.pool is not None:
                await root.start(fabric.pool.run)
            await root.start(http_sessions.run)
            await root.start(hand_audit_over_later, fabric.observer)
            await root.start(fabric.learn_catalog)  # in the background: serving does not wait
            async with trio.open_nursery() as connections:
                accepting = trio.CancelScope()

                async def accept(*, task_status: trio.TaskStatus[None]) -> None:
                    with accepting:
                        await serve_http(
                            accepting_socket,
                            app,
                            http_limits,
                            connections,
                            counts,
                            task_status=task_status,
                        )

                await connections.start(accept)
                log.info("serving", extra={"url": running.http_url, "instance": fabric.instance_id})
                task_status.started(running)
                await running._stop_requested.wait()
                await _stop_gracefully(fabric, accepting, counts)
                connections.cancel_scope.cancel()
            root.cancel_scope.cancel()
    finally:
        with trio.move_on_at(fabric.teardown_deadline()) as scope:
            scope.shield = True
            await _remove_leftovers(fabric)
        trio.lowlevel.notify_closing(accepting_socket)
        accepting_socket.close()


async def _stop_gracefully(
    fabric: Fabric, accepting: trio.CancelScope, counts: ConnectionCounts
) -> None:
    """Stop accepting, let sessions answer and end; give up at the graceful part's end."""
    bound = fabric.limits.shutdown_seconds
    now = trio.current_time()
    fabric.hard_deadline = now + bound
    log.info("shutting_down", extra={"sessions": fabric.session_count, "bound_seconds": bound})
    accepting.cancel()
    fabric.stopping.set()
    with trio.move_on_at(now + bound * (1 - CLEANUP_SHARE)):
        while fabric.sessions or fabric.containers or counts.busy:
            await fabric.changed.wait()
    if fabric.sessions or fabric.containers or counts.busy:
        log.warning(
            "shutdown_forced",
            extra={
                "sessions": fabric.session_count,
                "containers": fabric.container_count,
                "busy_connections": counts.busy,
            },
        )


async def _remove_leftovers(fabric: Fabric) -> None:
    try:
        removed = await remove_instance_containers(fabric.runtime, fabric.instance_id)
        log.info("shutdown_complete", extra={"removed_containers": removed})
    except FabricError as exc:
        log.error("shutdown_cleanup_failed", extra={"reason": exc.reason, "detail": str(exc)})
    await fabric.runtime.close()
