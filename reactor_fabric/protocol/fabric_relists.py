"""A fabric-endpoint session's catalog, refreshed from its backends' fresh lists, without I/O:
the part of its router (:mod:`.fabric_router`) that asks a backend for its list again after its
list_changed and has the catalog made anew from what it answers.

A backend's ``notifications/{tools,prompts,resources}/list_changed`` makes :class:`Relisting`
ask it for that list (a request of the machine's own: one its backend must read, see
:mod:`.fabric_backends`), unless it is asked for or in the works already: then once more after
that one, however often it repeats (:class:`~.fabric_refresh.Relists` keeps which). The list
that comes waits for the session's next catalog refresh, one at a time
(:class:`~.fabric_refresh.Refresh`, run by the driver off the event loop: a
:class:`~.events.Compute`); a list over :data:`~.fabric_refresh.MAX_LIST_BYTES` is refused,
the backend treated as broken (``backend_list_too_large``). A refresh that ran makes its catalog
the session's (:meth:`Relisting.done`); one that failed leaves the catalog as it was. A per-call
or retiring backend's list_changed is not asked about (the next call's container is fresh).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ContainerStartFailure
from .._reasons import BACKEND_LIST_TOO_LARGE
from .backend import Role
from .catalog import Catalog, Redact
from .events import Action, BackendKey, Compute, Job
from .fabric_backends import BackendTable
from .fabric_discovery import ServiceFacts
from .fabric_exchanges import Exchanges
from .fabric_messages import encoder
from .fabric_refresh import MAX_LIST_BYTES, Finished, Refreshed, Relist, Relists
from .mcp import LIST_CHANGED, LIST_METHOD
from .suite_lock import Mode, SuiteLock

Json = dict[str, Any]

# What a backend's list_changed makes the machine ask it again, and where the answer goes.
REFRESH = {notification: (LIST_METHOD[kind], kind) for notification, kind in LIST_CHANGED.items()}


class Relisting:
    """The session's catalog and its refreshes (see the module's docs)."""

    def __init__(
        self,
        catalog: Catalog,
        relists: Relists,
        table: BackendTable,
        exchanges: Exchanges,
        *,
        facts: Mapping[str, ServiceFacts],
        count_tokens: Callable[[Json], int],
        redact: Redact,
        lock: SuiteLock | None,
        lock_mode: Mode,
    ) -> None:
        self.catalog = catalog  # the session's: replaced whole by a refresh
        self.relists, self.table, self.exchanges = relists, table, exchanges
        # What a refresh makes the session's catalog and index with: fresh lists without the
        # suite's secret values (see .catalog), checked against the suite lock.
        self.facts = dict(facts)
        self.count_tokens = count_tokens
        self.redact = redact
        self.lock, self.lock_mode = lock, lock_mode

    def changed(self, key: BackendKey, method: str) -> list[Action]:
        """The backend ``key`` said its list changed (``method``: a list_changed)."""
        backend = self.table.roster.all.get(key)
        if backend is None or backend.role is not Role.CURRENT:
            # A per-call (or retiring) container's list is moot: the next call gets a fresh
            # container, whose offer is the one learned at start-up.
            return []
        # Ask the service what it offers now (see answered); unless its list is asked for or in
        # the works already: then once more after that one, however often it repeats.
        _list_method, kind = REFRESH[method]
        return self._ask(key, kind) if self.relists.changed(key.service, kind) else []

    def _ask(self, key: BackendKey, kind: str) -> list[Action]:
        method = LIST_METHOD[kind]
        request = {"jsonrpc": "2.0", "id": self.exchanges.own(key, method), "method": method}
        return self.table.send(key, encoder.encode(request), own=True)

    def answered(self, key: BackendKey, method: str, message: Json, nbytes: int) -> list[Action]:
        """A service's fresh list (its answer to ``method``, ``nbytes`` long): kept for the next
        refresh."""
        service = key.service
        kind = dict(REFRESH.values()).get(method)
        if kind is None:
            return []
        result = message.get("result")
        entries = result.get(kind) if isinstance(result, dict) else None
        relist = self.relists.asked.get((service, kind))
        if relist is None:
            return []  # asked of a container that is gone since
        if not isinstance(entries, list) or service not in self.catalog.services:
            return self._list_done(service, kind, relist)  # no list: the catalog stays
        if nbytes > MAX_LIST_BYTES:
            error = ContainerStartFailure(
                f"the {service} server answered {method} with {nbytes} bytes, more than the "
                f"{MAX_LIST_BYTES} the fabric endpoint takes: it is treated as broken",
                reason=BACKEND_LIST_TOO_LARGE,
            )
            return self.table.broken(key, error)
        self.relists.keep(service, kind, relist, entries)
        return self._next()

    def _next(self) -> list[Action]:
        refresh = self.relists.next(
            self.catalog,
            self.facts,
            self.count_tokens,
            self.lock,
            self.lock_mode,
            redact=self.redact,
        )
        if refresh is None:
            return []
        # (a refresh that fails leaves the catalog as it was: logged, not the session's end)
        return [Compute(refresh, failure_event="catalog_refresh_failed")]

    def done(self, job: Job, result: Refreshed | None) -> Finished | None:
        """The refresh ``job`` ran (``result`` None: it failed or was given up; the catalog
        stays as it was): its catalog is the session's now. The refresh and the lists it held
        (None: not the one running, or the session ends: nothing to do), for :meth:`settled`
        once the client is told."""
        finished = self.relists.finished(job)
        if finished is None or self.table.ending is not None:
            return None
        if result is not None:
            self.catalog = result.catalog
        return finished

    def settled(self, finished: Finished) -> list[Action]:
        """After a refresh: a backend that repeated list_changed meanwhile is asked again, and
        the next refresh starts."""
        actions: list[Action] = []
        for (service, kind), relist in finished[1].items():
            actions += self._list_done(service, kind, relist)
        return actions + self._next()

    def _list_done(self, service: str, kind: str, relist: Relist) -> list[Action]:
        again = self.relists.done(service, kind, relist)
        if not again:
            return []
        backend = self.table.roster.current.get(service)
        return [] if backend is None else self._ask(backend.key, kind)

    # --- model checking -----------------------------------------------------------------------

    def clone(self, relists: Relists, table: BackendTable, exchanges: Exchanges) -> Relisting:
        """A copy working on the twin's lists, backends and requests (the catalog is shared:
        a refresh replaces it whole)."""
        twin = copy.copy(self)
        twin.relists, twin.table, twin.exchanges = relists, table, exchanges
        return twin
