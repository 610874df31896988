"""The orchestrator's shared state: the suite, the runtime, and what is alive.

One :class:`Fabric` exists per running orchestrator. It is owned by
:func:`~reactor_fabric.trio.serve.serve_orchestrator`, whose nursery owns every task that uses
it, and it is what a session sees of the orchestrator: for now the whole object, which the
session drivers reach into.

Live sessions and containers are kept as registries (id → owner), not counters: a session adds
and removes its own entries in ``finally`` blocks, so the figures ``/healthz`` reports cannot
drift from what exists.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import trio

from .._errors import ContainerStartFailure, FabricError, SecurityViolation, SessionRefused
from .._reasons import IMAGE_CHANGED, SECRET_UNAVAILABLE
from ..config.secrets import ServiceSecrets, resolve_suite_secrets
from ..config.structs import Limits, Service, Suite
from ..discovery import DiscoveryIndex, tokens
from ..observe.metrics import LiveFigures
from ..observe.observer import Client, Observer, token_id
from ..observe.redaction import SECRET_VALUES
from ..policy.accounts import (
    ROOT,
    UNPRIVILEGED,
    Account,
    account_named,
    orchestrator_ids,
    secrets_account,
    server_ids,
)
from ..policy.admission import Capacity, capacity
from ..policy.auth import Gate
from ..policy.child_grant import ChildGrant
from ..policy.container_spec import ContainerIdentity, ContainerSpec, container_spec_for
from ..policy.mount_spec import MountSpec
from ..policy.mounts import MountPolicy
from ..policy.origins import allowed_hosts, normalise_origins
from ..policy.owner import hostname, process_start_time
from ..policy.pinning import PinSet
from ..protocol.agent_slots import AgentLimits, AgentSlots
from ..protocol.answers import SessionLimits
from ..protocol.catalog import Catalog, ServiceCatalog, relearned
from ..protocol.egress import EgressRecord
from ..protocol.fabric_discovery import AssistSettings, ServiceFacts, index_catalog
from ..protocol.fabric_messages import FABRIC_SERVICE
from ..protocol.fabric_meta_tools import META_DEFINITIONS, META_NAMES
from ..protocol.served import Served
from ..protocol.suite_lock import Drift, Mode, SuiteLock, compare_image, compare_offer, enforced
from ..protocol.tool_calls import ArgumentsMode
from ..runtime.base import Container, Runtime
from .catalog import CatalogStore, Learned, learn_catalog
from .sweeper import DeferredRemovals

log = logging.getLogger(__name__)

# How long removing one session's containers may take (a shutdown may allow less).
TEARDOWN_BOUND_SECONDS = 15.0
# Until it is learned, a service's entry in the catalog says so (get_status shows it).
NOT_LEARNED_YET = "not learned yet: the orchestrator is asking the service what it offers"
# How often the catalog is checked against the images (one inspect per service; a service
# whose image changed is probed again). Only with a disk cache: without one, every check would
# probe every service.
CATALOG_RECHECK_SECONDS = 300.0
# How many sessions' catalog refreshes may run at once (each in a worker thread).
REFRESH_THREADS = 2


def process_identity(
    instance_id: str, network: str, secrets: Mapping[str, ServiceSecrets] | None = None
) -> ContainerIdentity:
    """The owner labels of containers this process starts (see ContainerIdentity), with the
    suite's resolved ``secrets`` and the account their servers run as: the orchestrator's own
    when it is not root (its user's secrets, and the only account it can give a file to), else
    one no account of the host holds (:func:`~reactor_fabric.policy.accounts.secrets_account`;
    without one the services with secrets are refused). Blocking (NSS) when there are
    secrets."""
    pid = os.getpid()
    uid, gid = orchestrator_ids()
    owner: Account | None = None
    if secrets and uid != ROOT:
        owner = account_named(uid, gid)
    elif secrets:
        owner = secrets_account()
        if owner is None:
            why = (
                "no uid and gid are free for the secrets' own account (every id tried is a host "
                "account's, group's or subordinate range's): a server with secrets would run as "
                "an account another user of this host holds"
            )
            secrets = {name: ServiceSecrets(problems=(why,)) for name in secrets}
    return ContainerIdentity(
        instance_id=instance_id,
        owner_host=hostname(),
        owner_pid=pid,
        owner_start=process_start_time(pid) or "",
        default_network=network,
        secrets=secrets or {},
        secrets_account=owner,
    )


def resolve_secrets(suite: Suite) -> dict[str, ServiceSecrets]:
    """The suite's secrets, resolved once (blocking: files): every value registered with
    the redactor (no log line, record or page shows it), each service refused for a missing
    one said in the log, by name and source, never by value."""
    resolved = resolve_suite_secrets(suite)
    for name, service_secrets in resolved.items():
        SECRET_VALUES.register(service_secrets.values())
        if not service_secrets.available:
            log.warning(
                "service_secrets_unavailable",
                extra={
                    "service": name,
                    "reason": SECRET_UNAVAILABLE,
                    "problems": list(service_secrets.problems),
                },
            )
    return resolved


def new_instance_id() -> str:
    """A random id for this orchestrator run, stamped on every container it creates."""
    return secrets.token_hex(8)


# A replica's name, as it ends the session ids it mints (see new_session_id).
REPLICA_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def new_session_id(replica: str | None = None) -> str:
    """A session id: random, 128 bits, safe in URLs, headers and container names; with
    ``replica``, ``HEX.REPLICA``: a proxy in front of several orchestrators routes a Streamable
    HTTP session's requests (its ``Mcp-Session-Id``) to the one that owns it (docs/SCALING.md).
    The name goes last so that what container names take from an id (its start) stays random.
    """
    random_part = secrets.token_hex(16)
    return random_part if replica is None else f"{random_part}.{replica}"


class ContainerPool(Protocol):
    """What the orchestrator sees of its warm pool (:class:`~.warm_pool.WarmPool`). A protocol,
    so that this module, which the pool uses, does not import the pool back."""

    def container_ids(self) -> set[str]:
        """The pooled containers it knows (the sweeper leaves them alone)."""

    def ready_by_service(self) -> dict[str, int]:
        """How many started containers wait, per service (the metrics)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pools filled until the orchestrator stops; then remove what is pooled."""

    async def take(
        self,
        service_name: str,
        service: Service,
        *,
        account: Account,
        mounts: tuple[MountSpec, ...],
        pins: PinSet | None,
        fields: dict[str, Any],
        greeted: bool = False,
    ) -> Container | None:
        """A started container of ``service_name`` for a session, its mounts attached (and
        ``pins`` released); None when none fits (``pins`` then stay the caller's).
        ``greeted``: one the pool greeted will do (the caller skips its handshake)."""


@dataclass(eq=False)
class SessionRecord:
    """A live session, as operators see it (``sessions``, ``/api/sessions``, the status page)."""

    service: str  # the relay's service, or "fabric" for the fabric endpoint
    transport: str
    id: str = ""
    client: Client | None = None
    mounts: tuple[MountSpec, ...] = ()
    trace_id: str = ""
    started_at: float = 0.0  # wall clock
    # When a message last passed (trio time), kept by the session's driver.
    last_active: float = 0.0
    # Set by an operator (sessions --end): the session tells its client why and ends.
    ended_by_operator: trio.Event = field(default_factory=trio.Event)
    tool_calls: int = 0  # how many ended so far
    # An agent's child session: its grant (the parent session and call, what it may use).
    parent: ChildGrant | None = None
    # The session's containers and the calls each served (its machine's; None until it has
    # one), and the trio time the machine counts them from (its start).
    served: Served | None = None
    served_since: float = 0.0

    @property
    def endpoint(self) -> str:
        return "fabric" if self.service == "fabric" else "relay"

    @property
    def depth(self) -> int:
        """How many agents deep the session is: 0 for a client's, 1 for an agent's child."""
        return self.parent.depth if self.parent is not None else 0

    def mount_records(self) -> list[dict[str, Any]]:
        """The session's mounts as the audit trail and the operators' API show them."""
        return [
            {"source": m.source, "target": m.target, "read_only": m.read_only} for m in self.mounts
        ]


@dataclass(frozen=True)
class ContainerRecord:
    """A live session container."""

    session: str
    service: str
    name: str
    image: str
    started_at: float  # wall clock


@dataclass
class Fabric:
    suite: Suite
    runtime: Runtime
    network: str
    listen_host: str = "127.0.0.1"
    # The token every request must carry (None: no authentication; the CLI always decides).
    token: str | None = None
    instance_id: str = field(default_factory=new_instance_id)
    # This orchestrator's name among several behind one proxy (None: it runs alone); it ends
    # every session id it mints.
    replica: str | None = None
    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    containers: dict[str, ContainerRecord] = field(default_factory=dict)  # by container id
    # The audit trail, the metrics and the recent past (default: metrics only, no trail).
    observer: Observer = field(default_factory=Observer)
    pending_connections: int = 0  # WebSocket connections before their first message
    # Set when the orchestrator begins to stop: every session answers what is in flight.
    stopping: trio.Event = field(default_factory=trio.Event)
    # When a shutdown must be over (trio time); every teardown ends by then.
    hard_deadline: float = math.inf
    # Set (and replaced) whenever a session, container or busy connection comes or goes.
    changed: trio.Event = field(default_factory=trio.Event)
    # The suite's catalog for the fabric endpoint: learned in the background at start-up
    # (learn_catalog), services appearing in it one by one; ``catalog_ready`` once all are in.
    catalog_store: CatalogStore | None = None
    catalog: Catalog = field(init=False)
    catalog_ready: trio.Event = field(default_factory=trio.Event)
    catalog_passes: int = 0  # how many times every service was looked at (diagnostics, tests)
    catalog_recheck_seconds: float = CATALOG_RECHECK_SECONDS
    # The worker threads in which fabric-endpoint sessions refresh their catalogs (after a
    # backend's list_changed: the machine's Compute, run by trio/driver.py): so many at once
    # at most, whichever sessions they are for, so that backends flooding refreshes take at
    # most that much of the host.
    refresh_limiter: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(REFRESH_THREADS)
    )
    # Containers whose removal a teardown's bound cut short: the sweeper removes them next.
    deferred_removals: DeferredRemovals = field(default_factory=DeferredRemovals)
    # Started, idle containers for services with `warm` (None: no service keeps any, or not
    # made yet; serve_orchestrator makes and runs it).
    pool: ContainerPool | None = None
    mount_policy: MountPolicy = field(init=False)
    gate: Gate = field(init=False)
    # Each service's secrets (services without any are absent); None: resolved from this
    # process's environment and files when the fabric is made (once, at the start).
    secrets: Mapping[str, ServiceSecrets] | None = field(default=None, repr=False)
    # The suite lock (None: no lock file) and what orchestrator.lock makes of it; the drift
    # found, per service and where (catalog, image), as get_status and the status page show it.
    lock: SuiteLock | None = None
    lock_mode: Mode = "off"
    drift: dict[tuple[str, str], tuple[Drift, ...]] = field(default_factory=dict)
    # Agent containers' child sessions, by the container's name: made at its start, revoked at
    # its removal (see reactor_fabric.trio.child_sessions).
    child_grants: dict[str, ChildGrant] = field(default_factory=dict, repr=False)
    # Agent calls in flight by session (orchestrator.agents): the decision is the sessions'
    # machines' (protocol/agent_slots.py); the count they share is held here.
    agent_slots: AgentSlots = field(init=False)
    _index: tuple[Catalog, DiscoveryIndex] | None = field(init=False, default=None)
    _identity: ContainerIdentity = field(init=False)

    def __post_init__(self) -> None:
        agents = self.suite.orchestrator.agents
        self.agent_slots = AgentSlots(
            AgentLimits(agents.max_concurrent, agents.max_concurrent_per_session)
        )
        self.mount_policy = MountPolicy(
            self.suite.orchestrator.allowed_mount_roots,
            allowed_targets=self.suite.orchestrator.allowed_mount_targets,
        )
        self.gate = Gate(
            normalise_origins(self.suite.orchestrator.allowed_origins),
            allowed_hosts(self.listen_host),
            self.token,
        )
        if self.secrets is None:
            self.secrets = resolve_secrets(self.suite)
        self._identity = process_identity(self.instance_id, self.network, self.secrets)
        metrics = self.observer.metrics
        metrics.services = frozenset(self.suite.mcp_services) | {FABRIC_SERVICE}
        metrics.know_tools({FABRIC_SERVICE: META_NAMES})
        self.observer.metrics.live = self.live_figures
        self.token_id = token_id(self.token)
        not_yet = ServiceCatalog(error=NOT_LEARNED_YET)
        self.catalog = Catalog(dict.fromkeys(self.suite.mcp_services, not_yet))

    # --- the catalog --------------------------------------------------------------------------

    async def learn_catalog(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Learn every service's offer (cache, else a probe), publishing each as it comes;
        then, with a disk cache, check again every ``catalog_recheck_seconds`` (an image
        rebuilt meanwhile is learned again; new sessions see it).

        Runs in the orchestrator's root nursery; reports started at once (serving does not
        wait for it). A fabric-endpoint session that starts meanwhile waits for it, bounded
        (see :mod:`reactor_fabric.trio.session`).
        """
        task_status.started()
        while True:
            await self._learn_catalog_once()
            # Index the catalog now, off the event loop, rather than in a session's first call;
            # sessions wait for it (catalog_ready), so that none indexes it again meanwhile.
            catalog = self.catalog
            try:
                await trio.to_thread.run_sync(self._index_ahead, catalog)
            except Exception:
                # A bug here must not end the orchestrator either; a session indexes it then.
                log.error("catalog_index_failed", exc_info=True)
            self.catalog_passes += 1
            self.catalog_ready.set()
            self.notify_change()
            if self.catalog_store is None:
                return
            await trio.sleep(self.catalog_recheck_seconds)

    async def _learn_catalog_once(self) -> None:
        def publish(name: str, learned: Learned) -> None:
            services = self.catalog.services
            # A failed learning keeps the offer last learned (its tools stay callable, a call
            # says why the service cannot run): see relearned.
            offer = relearned(services.get(name), self._locked(name, learned))
            self.catalog = Catalog({**services, name: offer})
            # The metrics label a tool call with its tool's name only if the catalog has it.
            self.observer.metrics.know_tools(
                {
                    service: [str(tool.get("name")) for tool in offer.tools]
                    for service, offer in self.catalog.services.items()
                }
            )

        try:
            await learn_catalog(
                self.runtime,
                self._identity,
                self.suite.mcp_services,
                self.catalog_store,
                max_line=self.max_message_bytes,
                on_learned=publish,
                image_refused=self._refused_before_probe,
            )
        except* Exception as failure:
            # A bug here must not end the orchestrator (this runs in its root nursery): the
            # services not learned keep saying so in get_status; the relay is not affected.
            log.error("catalog_failed", exc_info=failure)
        # A URI two services offer is shown as "service+uri" for the second one (catalog.py).
        shared = [shown for shown, (_, uri) in self.catalog.resources.items() if shown != uri]
        if shared:
            log.info("catalog_resource_uris_shared", extra={"shown_as": shared})
        # A shown name two services would share is refused for both (catalog.py): say so once.
        for service, why in self.catalog.conflicts.items():
            log.warning("catalog_names_refused", extra={"service": service, "detail": list(why)})

    # --- the suite lock -----------------------------------------------------------------------

    def _locked(self, name: str, learned: Learned) -> ServiceCatalog:
        """A learned offer compared with the suite lock: drift reported; under enforce, what
        differs withheld (see protocol/suite_lock.py)."""
        if self.lock is None or self.lock_mode == "off":
            return learned.offer
        service = self.suite.mcp_services[name]
        if learned.image_id is not None:
            image = compare_image(name, service.image, self.lock, learned.image_id)
            self.report_drift(name, "image", [image] if image is not None else [])
        self.report_drift(name, "catalog", compare_offer(name, self.lock, learned.offer))
        drifts = [*self.drift.get((name, "image"), ()), *self.drift.get((name, "catalog"), ())]
        offer = enforced(learned.offer, drifts) if self.lock_mode == "enforce" else learned.offer
        return replace(offer, drift=tuple(drift.record() for drift in drifts))

    def report_drift(self, service: str, where: str, drifts: list[Drift]) -> None:
        """Keep the service's drift for get_status and the page; log and audit it when it is
        new (a catalog recheck finding the same drift again says nothing twice)."""
        key = (service, where)
        found = tuple(drifts)
        if self.drift.get(key, ()) == found:
            return
        if found:
            self.drift[key] = found
        else:
            self.drift.pop(key, None)
        for drift in found:
            log.warning("lock_drift", extra={"mode": self.lock_mode, **drift.record()})
            self.observer.drift(mode=self.lock_mode, where=where, drift=drift.record())

    def drift_records(self) -> list[dict[str, Any]]:
        """Every drift found and still current (get_status, the status page)."""
        return [drift.record() for found in self.drift.values() for drift in found]

    def _refused_before_probe(
        self, name: str, service: Service, image_id: str | None
    ) -> FabricError | None:
        """Why a service cannot start whatever a probe or the cache would say, so that it is
        shown unavailable rather than by an offer cached earlier: its secrets or its account
        are unavailable, or its image is refused (:meth:`_image_refused`). Else None."""
        service_secrets = (self.secrets or {}).get(name)
        if service_secrets is not None and not service_secrets.available:
            return ContainerStartFailure(
                f"service {name!r} is refused: {'; '.join(service_secrets.problems)}",
                reason=service_secrets.reason,
                service=name,
            )
        return self._image_refused(name, service, image_id)

    def _image_refused(
        self, name: str, service: Service, image_id: str | None
    ) -> FabricError | None:
        """Under enforce: the refusal of an image that is not the locked one (else None)."""
        if self.lock is None or self.lock_mode != "enforce":
            return None
        drift = compare_image(name, service.image, self.lock, image_id)
        if drift is None:
            return None
        self.report_drift(name, "image", [drift])
        return SecurityViolation(
            f"{drift.describe()}: no container is started from it (review the image, then "
            "run 'reactor-fabric lock' again)",
            reason=IMAGE_CHANGED,
            service=name,
            image=service.image,
            locked=drift.locked,
            found=drift.found,
        )

    async def check_image(self, name: str, service: Service) -> None:
        """At every container start with a lock: the image's id against the locked one.
        Enforce raises SecurityViolation (image_changed); warn reports the drift."""
        if self.lock is None or self.lock_mode == "off":
            return
        try:
            image_id = await self.runtime.image_id(service.image)
        except FabricError:
            return  # the engine cannot say: the start itself will fail and say why
        refusal = self._image_refused(name, service, image_id)
        if refusal is not None:
            raise refusal
        drift = compare_image(name, service.image, self.lock, image_id)
        self.report_drift(name, "image", [drift] if drift is not None else [])

    def service_facts(self) -> dict[str, ServiceFacts]:
        return suite_facts(self.suite)

    def indexed(self, catalog: Catalog) -> DiscoveryIndex | None:
        """The ranking index of ``catalog`` if it was built already."""
        cached = self._index
        return cached[1] if cached is not None and cached[0] is catalog else None

    def _index_ahead(self, catalog: Catalog) -> None:
        """Index ``catalog`` and count the meta-tools' tokens (get_status shows them) with one
        load of the tokenizer, dropped after (see :mod:`reactor_fabric.discovery.tokens`). In
        a worker thread: loading it takes a fifth of a second."""
        with tokens.held():
            tokens.count_all(META_DEFINITIONS)
            self.discovery_index(catalog)

    def discovery_index(self, catalog: Catalog) -> DiscoveryIndex:
        """The ranking index of ``catalog``, built once per catalog and shared by sessions.
        Seconds of CPU for a large suite: call it in a worker thread (two threads may build the
        same index at once; the last one is kept)."""
        index = self.indexed(catalog)
        if index is not None:
            return index
        index = index_catalog(catalog, self.service_facts())
        self._index = (catalog, index)
        return index

    @property
    def assist_settings(self) -> AssistSettings:
        assist = self.suite.orchestrator.fabric.model_assist
        return AssistSettings(
            enabled=assist.enabled,
            below_confidence=assist.below_confidence,
            timeout=assist.timeout_seconds,
            candidates=assist.candidates,
        )

    # --- settings -----------------------------------------------------------------------------

    @property
    def limits(self) -> Limits:
        return self.suite.orchestrator.limits

    @property
    def max_message_bytes(self) -> int:
        return self.suite.orchestrator.max_message_bytes

    @property
    def max_agent_depth(self) -> int:
        """How many agents deep a session may go (``orchestrator.agents.max_depth``): at 1 (the
        default) a client's agent has a child session, but no agent of its own."""
        return self.suite.orchestrator.agents.max_depth

    @property
    def audit_arguments(self) -> ArgumentsMode:
        """What of a call's arguments the sessions keep: as configured, or nothing when no
        trail is written (nothing else reads them; hashing them would be wasted)."""
        if self.observer.audit is None:
            return "none"
        return self.suite.orchestrator.audit.arguments

    def service(self, name: str) -> Service | None:
        return self.suite.mcp_services.get(name)

    def session_idle_seconds(self, endpoint: str) -> float:
        """How long an HTTP session of ``endpoint`` may go without a request: its service's
        idle timeout; on the fabric endpoint, the longest of them (a session outlives its
        containers)."""
        service = self.service(endpoint)
        if service is not None:
            return service.idle_timeout_seconds
        timeouts = [s.idle_timeout_seconds for s in self.suite.mcp_services.values()]
        return max(timeouts, default=60.0)

    @property
    def container_identity(self) -> ContainerIdentity:
        return self._identity

    def session_limits(self, service: Service) -> SessionLimits:
        return SessionLimits(to_server_bytes=self.limits.buffer_to_server_bytes)

    def container_spec(
        self,
        service_name: str,
        service: Service,
        *,
        session_id: str,
        mounts: tuple[MountSpec, ...],
        sequence: int,
        account: Account = UNPRIVILEGED,
        child_token: str | None = None,
    ) -> ContainerSpec:
        return container_spec_for(
            service_name,
            service,
            session_id=session_id,
            mounts=mounts,
            account=account,
            sequence=sequence,
            identity=self._identity,
            child_token=child_token,
        )

    async def prepare_start(
        self, mounts: tuple[MountSpec, ...], *, guard_git: bool = False
    ) -> tuple[PinSet | None, Account, tuple[MountSpec, ...]]:
        """Validate the session's mounts again and pin them for one container start; choose
        the account the server runs as (see :mod:`reactor_fabric.policy.accounts`); the
        container's mounts: the session's, and with ``guard_git`` the read-only binds of their
        Git directories (:mod:`reactor_fabric.policy.git_guard`).

        Resource handling: the pins are the caller's to hand to :meth:`Runtime.spawn` (which
        releases them); if this call is cancelled, pins made by its thread are closed here.
        """
        if not mounts:
            await trio.lowlevel.checkpoint()
            return None, UNPRIVILEGED, ()
        made: list[tuple[PinSet, Account, tuple[MountSpec, ...]]] = []

        def prepare() -> None:
            # Both touch the file system or NSS, which may be slow: in a thread.
            pins, guards = self.mount_policy.pin(mounts, guard_git=guard_git)
            try:
                first = pins.for_target(mounts[0].target)
                uid, gid = server_ids(
                    first_mount_owner=first.owner if first is not None else None,
                    orchestrator=orchestrator_ids(),
                )
                made.append((pins, account_named(uid, gid), (*mounts, *guards)))
            except BaseException:
                pins.close()
                raise

        try:
            # Not abandonable: the thread is short (a few opens) and what it makes must be
            # closed by us, so we wait for it even when cancelled.
            await trio.to_thread.run_sync(prepare)
        except BaseException:
            for pins, _account, _mounts in made:
                pins.close()
            raise
        return made[0]

    async def validate_mounts(self, mounts: object) -> tuple[MountSpec, ...]:
        if mounts == []:
            await trio.lowlevel.checkpoint()
            return ()
        # Resolving paths touches the file system (which may be slow, e.g. NFS): in a thread.
        return await trio.to_thread.run_sync(self.mount_policy.validate, mounts)

    # --- what is alive ------------------------------------------------------------------------

    @property
    def session_count(self) -> int:
        return len(self.sessions)

    @property
    def container_count(self) -> int:
        return len(self.containers)

    def notify_change(self) -> None:
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    def teardown_deadline(self, bound: float = TEARDOWN_BOUND_SECONDS) -> float:
        """When a teardown starting now must be over: ``bound`` from now, or the hard deadline."""
        return min(trio.current_time() + bound, self.hard_deadline)

    def admit(self, session_id: str, record: SessionRecord) -> SessionRefused | None:
        """Register a session, unless the orchestrator is full or stopping: then the error
        that refuses it (the decision is :func:`~reactor_fabric.policy.admission.capacity`'s;
        the count it reads is this one)."""
        full = capacity(
            Capacity(
                sessions=len(self.sessions),
                limit=self.suite.orchestrator.max_sessions,
                stopping=self.stopping.is_set(),
            )
        )
        if full is None:
            self.sessions[session_id] = record
        return full

    def release(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        # Whatever ended the session, its agent calls hold no slot any more.
        self.agent_slots.leave(session_id)
        self.notify_change()

    def live_figures(self) -> LiveFigures:
        sessions: dict[str, int] = {}
        for record in self.sessions.values():
            sessions[record.endpoint] = sessions.get(record.endpoint, 0) + 1
        containers: dict[str, int] = {}
        for container in self.containers.values():
            containers[container.service] = containers.get(container.service, 0) + 1
        pooled = self.pool.ready_by_service() if self.pool is not None else {}
        return LiveFigures(sessions, containers, pooled)

    def end_session(self, session_id: str) -> bool:
        """Ask a live session to end (an operator's request); False if there is none."""
        record = self.sessions.get(session_id)
        if record is None:
            return False
        record.ended_by_operator.set()
        return True

    def container_started(self, container_id: str, record: ContainerRecord) -> None:
        self.containers[container_id] = record

    def live_container_ids(self) -> set[str]:
        """Every container this orchestrator uses now: sessions' and the warm pool's."""
        pooled = self.pool.container_ids() if self.pool is not None else set()
        return set(self.containers) | pooled

    def egress_connection(self, record: EgressRecord) -> None:
        """A container's connection through its egress proxy: audited under its session
        (none yet for a pooled container)."""
        owner = self.containers.get(record.container)
        self.observer.egress(record, session=owner.session if owner is not None else "")

    def child_services(self, agent: Service, depth: int) -> tuple[str, ...]:
        """What a child session at ``depth`` of an ``agent`` may use: the suite's services the
        agent ``uses``, other agents only while ``depth`` is below the depth limit (so that
        agents cannot start agents without bound). Empty: the agent gets no child session."""
        services = self.suite.mcp_services
        return tuple(
            name
            for name in agent.uses
            if name in services
            and (services[name].service_type != "llm_agent" or depth < self.max_agent_depth)
        )

    def grant_child(self, grant: ChildGrant) -> None:
        """Open child sessions to the relay of the container ``grant.container_name`` (until
        :meth:`revoke_child`); its token is redacted from every log and record meanwhile."""
        SECRET_VALUES.register([grant.token])
        self.child_grants[grant.container_name] = grant

    def revoke_child(self, container_name: str) -> None:
        """No new child session for that container (idempotent); those open end with it."""
        grant = self.child_grants.pop(container_name, None)
        if grant is not None:
            SECRET_VALUES.forget([grant.token])

    def container_removed(self, container_id: str) -> None:
        self.containers.pop(container_id, None)
        self.notify_change()

    def reserve_pending(self) -> bool:
        """Count a connection that has yet to send its first message, if there is room."""
        if self.pending_connections >= self.limits.max_pending_connections:
            return False
        self.pending_connections += 1
        return True

    def release_pending(self) -> None:
        self.pending_connections -= 1


def suite_facts(suite: Suite) -> dict[str, ServiceFacts]:
    """What the suite says about each service, as the ranking and meta-tools read it."""
    return {
        name: ServiceFacts(
            description=service.description,
            categories=tuple(service.categories),
            keywords=tuple(service.keywords),
            example_tasks=tuple(service.example_tasks),
            requires=tuple(service.requires),
        )
        for name, service in suite.mcp_services.items()
    }
