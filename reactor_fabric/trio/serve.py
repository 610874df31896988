"""Running the orchestrator: its parts assembled, the root nursery, the server, and a shutdown
bounded in time.

:func:`assemble` builds one orchestrator's parts from its suite, once: the frozen settings
(:mod:`reactor_fabric.config.settings`), the session registry (:mod:`.registry`), the catalog
service (:mod:`.catalog_service`), the container starter (:mod:`.containers`), the gate in
front of every route; :class:`Fabric` is their composition, nothing more. Each module that
serves takes the parts it needs, not the composition.

Ownership tree::

    serve_orchestrator (root nursery)
    ├── EgressProxy.run        containers' egress proxies (runtime/egress_proxy.py)
    ├── run_sweeper            orphan containers: at start-up, then periodically; removals
    │                          a teardown cut short, as they come
    ├── CatalogService.learn   what each service offers (cache, else a probe), for /mcp
    ├── WarmPool.run           started, idle containers for services with `warm` (warm_pool)
    ├── Spares.run             ended sessions' spare copies, kept for a while (spares)
    ├── HttpSessions.run       one task per Streamable HTTP session → serve_session
    └── connections (nursery)
        ├── serve_http         the accept loop (HTTP and WebSocket on one port)
        └── one task per connection; a WebSocket's task runs its session

Shutdown (:meth:`Orchestrator.stop`, on SIGINT/SIGTERM): stop accepting; tell every session
(``SessionRegistry.stopping``), which answers each request in flight with -32002
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .._errors import FabricError
from ..config.secrets import ServiceSecrets
from ..config.settings import settings_for
from ..config.structs import Suite
from ..observe.observer import Observer, token_id
from ..policy.auth import Gate, SignIn
from ..policy.container_parts.isolation import resolved_isolation
from ..policy.mounts import MountPolicy
from ..policy.origins import allowed_hosts, normalise_origins
from ..policy.owner import hostname
from ..protocol.agent_slots import AgentSlots
from ..protocol.egress import EgressRecord
from ..protocol.fabric_messages import FABRIC_SERVICE
from ..protocol.fabric_meta_tools import META_NAMES
from ..protocol.settings import Settings
from ..protocol.suite_lock import Mode, SuiteLock
from ..runtime.base import Runtime
from .app import FabricApp
from .audit_batches import hand_audit_over_later
from .authentication import Authenticator
from .catalog import CatalogStore
from .catalog_service import CATALOG_RECHECK_SECONDS, CatalogService
from .child_sessions import serve_child
from .containers import ContainerStarter
from .http_server import ConnectionCounts, HttpLimits, serve_http
from .identity import new_instance_id, process_identity, resolve_secrets
from .registry import SessionRegistry
from .streamable_http import HttpSessions
from .sweeper import DeferredRemovals, remove_instance_containers, run_sweeper
from .warm_pool import open_warm_pool
from .workspaces import close_workspaces, open_workspaces

if TYPE_CHECKING:
    from .issuer_keys import JsonFetcher

log = logging.getLogger(__name__)

# How long the start waits for the engine to say what it runs (see _learn_isolation).
ISOLATION_PING_SECONDS = 10.0

# Of the shutdown bound, the share kept for removing containers after the graceful part.
CLEANUP_SHARE = 0.4


@dataclass(frozen=True)
class Fabric:
    """One orchestrator's parts (see :func:`assemble`), as the serving hands them out."""

    suite: Suite
    settings: Settings
    registry: SessionRegistry
    catalog: CatalogService
    starter: ContainerStarter
    observer: Observer
    runtime: Runtime
    # The gate in front of every route, and the issuer's keys when users sign in.
    authenticator: Authenticator
    # Each service's secrets, resolved once at the start (services without any are absent).
    secrets: Mapping[str, ServiceSecrets]


def assemble(
    suite: Suite,
    runtime: Runtime,
    *,
    network: str,
    listen_host: str = "127.0.0.1",
    token: str | None = None,
    instance_id: str | None = None,
    replica: str | None = None,
    observer: Observer | None = None,
    secrets: Mapping[str, ServiceSecrets] | None = None,
    lock: SuiteLock | None = None,
    lock_mode: Mode = "off",
    catalog_store: CatalogStore | None = None,
    catalog_recheck_seconds: float = CATALOG_RECHECK_SECONDS,
    sign_in: SignIn | None = None,
    issuer_fetcher: JsonFetcher | None = None,
) -> Fabric:
    """The parts of an orchestrator serving ``suite`` on ``runtime``, its settings built once.

    ``network``: the containers' default network; ``listen_host``: where it listens (the
    Host header it accepts); ``token``: what every request must carry (None: no
    authentication; the command line always decides); ``replica``: its name among several
    behind one proxy; ``observer``: the audit trail, the metrics and the recent past (default:
    metrics only, no trail); ``secrets``: each service's (None: resolved now, from this
    process's environment and files); ``lock`` and ``lock_mode``: the suite lock and what
    orchestrator.lock makes of it; ``catalog_store``: the catalog's disk cache (None: none,
    and the catalog is learned once); ``sign_in``: users sign in with an OpenID provider
    (``auth.mode: oidc``, :func:`~reactor_fabric.policy.sign_in.sign_in_for`), whose documents
    ``issuer_fetcher`` fetches (default: over HTTP). Blocking (secrets' files, NSS): call it
    before serving.
    """
    observer = observer if observer is not None else Observer()
    if secrets is None:
        secrets = resolve_secrets(suite)
    orchestrator = suite.orchestrator
    identity = process_identity(instance_id or new_instance_id(), network, secrets)
    settings = settings_for(
        suite,
        audited=observer.audit is not None,
        token_id=token_id(token),
        lock=lock,
        lock_mode=lock_mode,
        replica=replica,
    )
    registry = SessionRegistry(
        max_sessions=settings.limits.max_sessions,
        max_pending=settings.limits.max_pending_connections,
        agent_slots=AgentSlots(settings.agent_limits),
    )
    catalog = CatalogService(
        runtime,
        identity,
        suite.mcp_services,
        observer=observer,
        facts=settings.facts,
        max_line=settings.limits.max_message_bytes,
        secrets=secrets,
        lock=lock,
        lock_mode=lock_mode,
        store=catalog_store,
        recheck_seconds=catalog_recheck_seconds,
        on_pass=registry.notify_change,
    )
    starter = ContainerStarter(
        runtime,
        identity,
        MountPolicy(
            orchestrator.allowed_mount_roots, allowed_targets=orchestrator.allowed_mount_targets
        ),
        suite.mcp_services,
        settings=settings,
        registry=registry,
        observer=observer,
        image_checked=catalog.image_checked,
        deferred=DeferredRemovals(),
    )
    metrics = observer.metrics
    metrics.services = frozenset(suite.mcp_services) | {FABRIC_SERVICE}
    metrics.know_tools({FABRIC_SERVICE: META_NAMES})
    metrics.live = lambda: registry.live_figures(starter.pooled())
    gate = Gate(
        normalise_origins(orchestrator.allowed_origins),
        allowed_hosts(listen_host),
        token if sign_in is None else None,
        sign_in,
    )
    keys = None
    if sign_in is not None:
        # Here, not at the top: PyJWT, cryptography and httpx are 20 MB only oidc mode uses.
        from .issuer_keys import HttpFetcher, IssuerKeys  # noqa: PLC0415

        keys = IssuerKeys(sign_in.rules.issuer, issuer_fetcher or HttpFetcher())
    authenticator = Authenticator(gate, keys)
    return Fabric(
        suite, settings, registry, catalog, starter, observer, runtime, authenticator, secrets
    )


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
        registry = self.fabric.registry
        while registry.sessions or registry.containers or self.connections.open:
            await registry.changed.wait()

    @property
    def http_url(self) -> str:
        return self.listening.http_url

    @property
    def ws_url(self) -> str:
        return self.listening.ws_url

    def stop(self) -> None:
        """Begin a graceful, bounded shutdown; :func:`serve_orchestrator` returns when done."""
        self._stop_requested.set()


async def _start_starters_own(root: trio.Nursery, starter: ContainerStarter) -> None:
    """The container starter's own background work: its warm pool, and the spare copies of
    ended sessions, kept for a while (:meth:`.spares.Spares.run`)."""
    if starter.pool is not None:
        await root.start(starter.pool.run)
    if starter.workspaces is not None:
        await root.start(starter.workspaces.spares.run)


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
    limits = fabric.settings.limits
    registry, starter, runtime = fabric.registry, fabric.starter, fabric.runtime
    instance_id = starter.identity.instance_id
    http_limits = HttpLimits(
        max_connections=limits.max_connections, write_timeout=limits.client_write_seconds
    )
    http_sessions = HttpSessions(fabric)
    app = FabricApp(fabric, http_sessions)
    counts = ConnectionCounts(on_change=registry.notify_change)
    accepting_socket = listener.dup()  # ours to close; the caller keeps `listener`
    accepting_socket.setblocking(False)
    running = Orchestrator(fabric, Listening(listening_url(listener)), counts)
    await _learn_isolation(runtime, fabric.suite, starter.identity.labels())
    if starter.pool is None:
        starter.pool = await open_warm_pool(
            runtime,
            fabric.suite,
            fabric.settings.pooling,
            identity=starter.identity,
            stopping=registry.stopping,
            teardown_deadline=registry.teardown_deadline,
            metrics=fabric.observer.metrics,
            refused=[name for name, found in fabric.secrets.items() if not found.available],
        )
    if starter.workspaces is None and any(
        service.workspace_mode == "isolated" for service in fabric.suite.mcp_services.values()
    ):
        owner = {
            k: v
            for k, v in starter.identity.labels().items()
            if k.startswith("reactor-fabric.owner")
        }
        starter.workspaces = await open_workspaces(
            instance_id, owner, fabric.suite.orchestrator.workspaces, fabric.observer
        )
    try:
        async with trio.open_nursery() as root:
            if runtime.egress is not None:
                # First: the catalog's probe and the pool may start egress containers.
                await root.start(runtime.egress.run, functools.partial(_egress_connection, fabric))
            if runtime.children is not None:
                # Agents' child sessions: their sockets are made as their containers start.
                await root.start(runtime.children.run, functools.partial(serve_child, fabric))
            await root.start(
                functools.partial(
                    run_sweeper,
                    runtime,
                    instance_id=instance_id,
                    this_host=hostname(),
                    live_sessions=lambda: set(registry.sessions),
                    live_containers=starter.live_container_ids,
                    on_removed=fabric.observer.orphans_removed,
                    deferred=starter.deferred,
                )
            )
            await _start_starters_own(root, starter)
            await root.start(http_sessions.run)
            await root.start(hand_audit_over_later, fabric.observer)
            await root.start(fabric.catalog.learn)  # in the background: serving does not wait
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
                log.info("serving", extra={"url": running.http_url, "instance": instance_id})
                task_status.started(running)
                await running._stop_requested.wait()
                await _stop_gracefully(registry, limits.shutdown_seconds, accepting, counts)
                connections.cancel_scope.cancel()
            root.cancel_scope.cancel()
    finally:
        with trio.move_on_at(registry.teardown_deadline()) as scope:
            scope.shield = True
            await _remove_leftovers(runtime, instance_id)
        if starter.workspaces is not None:
            await close_workspaces(starter.workspaces)
        trio.lowlevel.notify_closing(accepting_socket)
        accepting_socket.close()


async def _stop_gracefully(
    registry: SessionRegistry,
    bound: float,
    accepting: trio.CancelScope,
    counts: ConnectionCounts,
) -> None:
    """Stop accepting, let sessions answer and end; give up at the graceful part's end
    (``bound``: the whole shutdown's, seconds)."""
    now = trio.current_time()
    registry.hard_deadline = now + bound
    log.info("shutting_down", extra={"sessions": registry.session_count, "bound_seconds": bound})
    accepting.cancel()
    registry.stopping.set()
    with trio.move_on_at(now + bound * (1 - CLEANUP_SHARE)):
        while registry.sessions or registry.containers or counts.busy:
            await registry.changed.wait()
    if registry.sessions or registry.containers or counts.busy:
        log.warning(
            "shutdown_forced",
            extra={
                "sessions": registry.session_count,
                "containers": registry.container_count,
                "busy_connections": counts.busy,
            },
        )


def _egress_connection(fabric: Fabric, record: EgressRecord) -> None:
    """A container's connection through its egress proxy: audited under its session
    (none yet for a pooled container)."""
    owner = fabric.registry.containers.get(record.container)
    fabric.observer.egress(record, session=owner.session if owner is not None else "")


async def _learn_isolation(runtime: Runtime, suite: Suite, labels: dict[str, str]) -> None:
    """Ask the engine what it runs (its runtimes: is gVisor among them, and does it honour it?)
    before anything is started, and say what each service that asks for gVisor runs under. An
    engine down now is asked again when it answers (then the services asking for gVisor are
    refused until it did: ``isolation_unavailable``)."""
    images = {s.image for s in suite.mcp_services.values() if s.isolation_in_force != "runc"}
    try:
        with trio.move_on_after(ISOLATION_PING_SECONDS):
            await runtime.ping(time_bound=ISOLATION_PING_SECONDS)
    except FabricError as exc:
        log.warning("isolation_unknown", extra={"detail": str(exc)})
    with trio.move_on_after(ISOLATION_PING_SECONDS):
        for image in sorted(images):  # (the first one the engine has)
            try:
                await runtime.verify_isolation(image, labels)
                break
            except FabricError as exc:
                log.info("isolation_not_checked", extra={"image": image, "detail": str(exc)})
    capabilities = runtime.capabilities
    for name, service in suite.mcp_services.items():
        asked = service.isolation_in_force
        if asked == "runc":
            continue
        runs_under = resolved_isolation(service, capabilities)
        level = logging.WARNING if runs_under != "gvisor" else logging.INFO
        log.log(
            level,
            "service_isolation",
            extra={
                "service": name,
                "asked": asked,
                "runs_under": runs_under,
                "detail": capabilities.gvisor_missing if runs_under != "gvisor" else "",
            },
        )


async def _remove_leftovers(runtime: Runtime, instance_id: str) -> None:
    try:
        removed = await remove_instance_containers(runtime, instance_id)
        log.info("shutdown_complete", extra={"removed_containers": removed})
    except FabricError as exc:
        log.error("shutdown_cleanup_failed", extra={"reason": exc.reason, "detail": str(exc)})
    await runtime.close()
