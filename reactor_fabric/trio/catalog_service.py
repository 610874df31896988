"""The suite's catalog as the fabric endpoint serves it: learned in the background, published
service by service, checked against the suite lock, indexed once for the ranking.

One :class:`CatalogService` exists per running orchestrator (made by
:func:`~reactor_fabric.trio.serve.assemble`). :meth:`CatalogService.learn` runs in the root
nursery: it learns every service's offer (the disk cache, else a probe: :mod:`.catalog`),
publishing each as it comes (:attr:`CatalogService.current`, a new :class:`Catalog` each time,
so a session keeps the one it started with), indexes the whole catalog in a worker thread and
sets :attr:`CatalogService.ready`; with a disk cache it checks again every
``recheck_seconds``. With a suite lock each learned offer is compared with it (drift reported,
logged and audited once; under enforce, what differs withheld), and an image that is not the
locked one is judged here for every container start (:meth:`CatalogService.image_checked`).

Resource handling: the probe containers are :func:`~.catalog.learn_catalog`'s (each removed in
a shielded, bounded ``finally``); the index is built in a worker thread, one catalog's at a
time kept. :attr:`CatalogService.refresh_limiter` bounds the worker threads in which
fabric-endpoint sessions refresh their catalogs.

Error handling: a service that cannot be learned keeps its last offer and says why (see
:func:`~reactor_fabric.protocol.catalog.relearned`); a bug while learning or indexing is logged
and contained (this runs in the root nursery): the relay is never affected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import trio

from .._errors import ContainerStartFailure, FabricError, SecurityViolation
from .._reasons import IMAGE_CHANGED
from ..config.secrets import ServiceSecrets
from ..config.structs import Service
from ..discovery import DiscoveryIndex, tokens
from ..observe.observer import Observer
from ..policy.container_parts.ownership import ContainerIdentity
from ..policy.container_spec import probe_spec_for
from ..protocol.catalog import Catalog, ServiceCatalog, relearned
from ..protocol.fabric_discovery import ServiceFacts, index_catalog
from ..protocol.fabric_meta_tools import META_DEFINITIONS
from ..protocol.suite_lock import Drift, Mode, SuiteLock, compare_image, compare_offer, enforced
from ..runtime.base import Runtime
from .catalog import CatalogStore, Learned, learn_catalog

# The logger these lines were always written under (operators may filter on it).
log = logging.getLogger("reactor_fabric.trio.fabric")

# Until it is learned, a service's entry in the catalog says so (get_status shows it).
NOT_LEARNED_YET = "not learned yet: the orchestrator is asking the service what it offers"
# How often the catalog is checked against the images (one inspect per service; a service
# whose image changed is probed again). Only with a disk cache: without one, every check would
# probe every service.
CATALOG_RECHECK_SECONDS = 300.0
# How many sessions' catalog refreshes may run at once (each in a worker thread).
REFRESH_THREADS = 2


class CatalogService:
    """The published catalog, its index and the suite lock's drift (see the module
    docstring). ``secrets``: each service's, resolved (one refused for them is shown
    unavailable, never probed); ``on_pass``: called after every look at all the services."""

    def __init__(
        self,
        runtime: Runtime,
        identity: ContainerIdentity,
        services: Mapping[str, Service],
        *,
        observer: Observer,
        facts: Mapping[str, ServiceFacts],
        max_line: int,
        secrets: Mapping[str, ServiceSecrets],
        lock: SuiteLock | None = None,
        lock_mode: Mode = "off",
        store: CatalogStore | None = None,
        recheck_seconds: float = CATALOG_RECHECK_SECONDS,
        on_pass: Callable[[], None] = lambda: None,
    ) -> None:
        self._runtime = runtime
        self._identity = identity
        self._services = services
        self._observer = observer
        self._facts = facts
        self._max_line = max_line
        self._secrets = secrets
        self._lock = lock
        self._lock_mode = lock_mode
        self._store = store
        self._recheck_seconds = recheck_seconds
        self._on_pass = on_pass
        not_yet = ServiceCatalog(error=NOT_LEARNED_YET)
        # The catalog sessions start with: services appear in it one by one as learned.
        self.current = Catalog(dict.fromkeys(services, not_yet))
        self.ready = trio.Event()  # every service looked at once
        self.passes = 0  # how many times every service was looked at (diagnostics, tests)
        # The drift found, per service and where (catalog, image), as get_status and the
        # status page show it.
        self.drift: dict[tuple[str, str], tuple[Drift, ...]] = {}
        # The worker threads in which fabric-endpoint sessions refresh their catalogs (after a
        # backend's list_changed: the machine's Compute, run by trio/driver.py): so many at
        # once at most, whichever sessions they are for, so that backends flooding refreshes
        # take at most that much of the host.
        self.refresh_limiter = trio.CapacityLimiter(REFRESH_THREADS)
        self._index: tuple[Catalog, DiscoveryIndex] | None = None

    # --- learning and publishing --------------------------------------------------------------

    async def learn(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Learn every service's offer (cache, else a probe), publishing each as it comes;
        then, with a disk cache, check again every ``recheck_seconds`` (an image rebuilt
        meanwhile is learned again; new sessions see it).

        Runs in the orchestrator's root nursery; reports started at once (serving does not
        wait for it). A fabric-endpoint session that starts meanwhile waits for it, bounded
        (see :mod:`reactor_fabric.trio.session`).
        """
        task_status.started()
        while True:
            await self._learn_once()
            # Index the catalog now, off the event loop, rather than in a session's first call;
            # sessions wait for it (ready), so that none indexes it again meanwhile.
            catalog = self.current
            try:
                await trio.to_thread.run_sync(self._index_ahead, catalog)
            except Exception:
                # A bug here must not end the orchestrator either; a session indexes it then.
                log.error("catalog_index_failed", exc_info=True)
            self.passes += 1
            self.ready.set()
            self._on_pass()
            if self._store is None:
                return
            await trio.sleep(self._recheck_seconds)

    async def _learn_once(self) -> None:
        try:
            await learn_catalog(
                self._runtime,
                self._identity,
                self._services,
                self._store,
                max_line=self._max_line,
                on_learned=self._publish,
                image_refused=self._refused_before_probe,
            )
        except* Exception as failure:
            # A bug here must not end the orchestrator (this runs in its root nursery): the
            # services not learned keep saying so in get_status; the relay is not affected.
            log.error("catalog_failed", exc_info=failure)
        # A URI two services offer is shown as "service+uri" for the second one (catalog.py).
        shared = [shown for shown, (_, uri) in self.current.resources.items() if shown != uri]
        if shared:
            log.info("catalog_resource_uris_shared", extra={"shown_as": shared})
        # A shown name two services would share is refused for both (catalog.py): say so once.
        for service, why in self.current.conflicts.items():
            log.warning("catalog_names_refused", extra={"service": service, "detail": list(why)})

    def _publish(self, name: str, learned: Learned) -> None:
        services = self.current.services
        # A failed learning keeps the offer last learned (its tools stay callable, a call
        # says why the service cannot run): see relearned.
        offer = relearned(services.get(name), self._locked(name, learned))
        self.current = Catalog({**services, name: offer})
        # The metrics label a tool call with its tool's name only if the catalog has it.
        self._observer.metrics.know_tools(
            {
                service: [str(tool.get("name")) for tool in offer.tools]
                for service, offer in self.current.services.items()
            }
        )

    # --- the ranking index --------------------------------------------------------------------

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
        index = index_catalog(catalog, self._facts)
        self._index = (catalog, index)
        return index

    # --- the suite lock -----------------------------------------------------------------------

    def _locked(self, name: str, learned: Learned) -> ServiceCatalog:
        """A learned offer compared with the suite lock: drift reported; under enforce, what
        differs withheld (see protocol/suite_lock.py)."""
        if self._lock is None or self._lock_mode == "off":
            return learned.offer
        service = self._services[name]
        if learned.image_id is not None:
            image = compare_image(name, service.image, self._lock, learned.image_id)
            self.report_drift(name, "image", [image] if image is not None else [])
        self.report_drift(name, "catalog", compare_offer(name, self._lock, learned.offer))
        drifts = [*self.drift.get((name, "image"), ()), *self.drift.get((name, "catalog"), ())]
        offer = enforced(learned.offer, drifts) if self._lock_mode == "enforce" else learned.offer
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
            log.warning("lock_drift", extra={"mode": self._lock_mode, **drift.record()})
            self._observer.drift(mode=self._lock_mode, where=where, drift=drift.record())

    def drift_records(self) -> list[dict[str, Any]]:
        """Every drift found and still current (get_status, the status page)."""
        return [drift.record() for found in self.drift.values() for drift in found]

    def _refused_before_probe(
        self, name: str, service: Service, image_id: str | None
    ) -> FabricError | None:
        """Why a service cannot start whatever a probe or the cache would say, so that it is
        shown unavailable rather than by an offer cached earlier: its secrets or its account
        are unavailable, its container is refused on this runtime (its parts: an isolation or
        an egress list the runtime cannot give), or its image is refused
        (:meth:`_image_refused`). Else None."""
        service_secrets = self._secrets.get(name)
        if service_secrets is not None and not service_secrets.available:
            return ContainerStartFailure(
                f"service {name!r} is refused: {'; '.join(service_secrets.problems)}",
                reason=service_secrets.reason,
                service=name,
            )
        try:
            probe_spec_for(
                name,
                service,
                session_id="catalog-check",
                token="check",  # noqa: S106 - the probe's name, no credential
                identity=self._identity,
                capabilities=self._runtime.capabilities,
            )
        except ContainerStartFailure as refused:
            return refused
        return self._image_refused(name, service, image_id)

    def _image_refused(
        self, name: str, service: Service, image_id: str | None
    ) -> FabricError | None:
        """Under enforce: the refusal of an image that is not the locked one (else None)."""
        if self._lock is None or self._lock_mode != "enforce":
            return None
        drift = compare_image(name, service.image, self._lock, image_id)
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

    def image_checked(
        self, name: str, service: Service, image_id: str | None
    ) -> FabricError | None:
        """A container start's image id (the engine's) against the locked one: under enforce
        the refusal of one that differs (SecurityViolation, image_changed); else None, the
        drift reported (or cleared) for get_status and the page."""
        refusal = self._image_refused(name, service, image_id)
        if refusal is not None:
            return refusal
        if self._lock is not None:
            drift = compare_image(name, service.image, self._lock, image_id)
            self.report_drift(name, "image", [drift] if drift is not None else [])
        return None
