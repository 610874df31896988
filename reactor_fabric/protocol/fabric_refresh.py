"""A fabric-endpoint session's catalog refreshed from its backends' fresh lists, without I/O.

After a backend's ``notifications/*/list_changed`` the session asks it again
(:mod:`.fabric_relists`); what it answers is the backend's to choose, and everything made from
it costs CPU in proportion: the catalog's routing tables, the ranking index (seconds for half a
megabyte of words), what changed in its tools. None of that may run on the event loop, where it
would hold up every other session: :class:`Refresh` is that work as one value, which the
driver runs in a worker thread (:meth:`Refresh.run`, asked by a ``Compute``), and whose
:class:`Refreshed` it reports back to the machine (``Computed``). The machine runs at most one
per session at a time and lets each backend have at most one list in the works
(:class:`Relists`), so a backend that repeats
``list_changed`` costs one refresh after another, never a pile of them.

A fresh list is taken without the suite's secret values (the session's ``redact``, see
:mod:`.catalog`), as the catalog probe's offers are: before it is shown, indexed, compared with
what the service listed before, or with the suite lock.

What changed in a service's tools (:func:`tool_changes`) is kept for the audit trail and the
log — names, and for a tool whose definition changed, which fields and their hashes — never
their text: a rewritten description is a server trying its luck with the client's model, and
the record shows that it happened without repeating it. With a suite lock, every fresh list
of a kind the lock holds — tools, prompts, resource templates — is compared with it again
(:func:`~.suite_lock.relocked`): what now differs is reported as drift, and under enforce
left out of the session's catalog, as at start-up.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from ..discovery import DiscoveryIndex
from .catalog import Catalog, Redact, ServiceCatalog, service_catalog, unredacted
from .fabric_discovery import ServiceFacts, index_catalog
from .suite_lock import Mode, SuiteLock, relocked

Json = dict[str, Any]

# The largest list a service may answer (tools/list, prompts/list, …; its pages together), in
# bytes: a session's refresh refuses more (the backend is treated as broken), and so does the
# catalog probe. The largest real tools/list we know is ~150 KB (eval/discovery/servers);
# indexing half a megabyte takes seconds of CPU, and each answer is held until it is indexed.
MAX_LIST_BYTES = 1024 * 1024
# The record names at most this many tools per list (added, removed, changed), each cut to
# MAX_NAME_CHARS: a server's hostile list must not make a hostile record. The counts are whole.
MAX_NAMES = 100
MAX_NAME_CHARS = 128

_canonical = msgspec.json.Encoder(order="sorted")


@dataclass(frozen=True)
class ToolChanges:
    """What changed in one service's tools: names (and counts), never the text."""

    service: str
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    # Each changed tool: {"tool": name, "fields": [...], "sha256": {field: {before, after}}}.
    changed: tuple[Json, ...] = ()
    counts: tuple[int, int, int] = (0, 0, 0)  # added, removed, changed, before any cut
    tools: int = 0  # how many tools the service lists now
    # What now differs from the suite lock that did not before (Drift records with "mode"),
    # in the tools or in another kind listed again: logged and audited as drift (under
    # enforce those entries are left out, the tools withheld).
    drift: tuple[Json, ...] = ()

    @property
    def truncated(self) -> bool:
        return self.counts != (len(self.added), len(self.removed), len(self.changed))

    def record(self) -> Json:
        """As the audit trail and the log write it."""
        added, removed, changed = self.counts
        fields: Json = {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": list(self.changed),
            "counts": {"added": added, "removed": removed, "changed": changed},
            "tools": self.tools,
        }
        if self.truncated:
            fields["truncated"] = True
        return fields


@dataclass(frozen=True)
class Refreshed:
    """What a :class:`Refresh` made: the new catalog, its index (None: no tools changed, the
    old one stands), and what changed in each refreshed service's tools."""

    catalog: Catalog
    index: DiscoveryIndex | None
    changes: tuple[ToolChanges, ...]


@dataclass(frozen=True, eq=False)
class Refresh:
    """Fresh lists of some services to put into ``base``: run :meth:`run` off the event loop.

    ``lists``: (service, kind, entries), kind one of ``tools``, ``prompts``, ``resources``.
    Nothing here is shared with the machine while it runs: the catalog is immutable and the
    entries were decoded for this refresh alone.
    """

    base: Catalog
    lists: tuple[tuple[str, str, tuple[Any, ...]], ...]
    facts: Mapping[str, ServiceFacts]
    count_tokens: Callable[[Json], int]
    # The suite lock the fresh tools are checked against (orchestrator.lock; None: none).
    lock: SuiteLock | None = None
    lock_mode: Mode = "off"
    # The suite's secret values out of the lists (see .catalog: Redact).
    redact: Redact = unredacted

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(kind for _service, kind, _entries in self.lists)

    def run(self) -> Refreshed:
        services = dict(self.base.services)
        changes: list[ToolChanges] = []
        for service, kind, entries in self.lists:
            before = services.get(service)
            if before is None:
                continue  # not a service of the suite: nothing to refresh
            fresh: ServiceCatalog = service_catalog(**{kind: self.redact(list(entries))})
            services[service] = replace(before, **{kind: getattr(fresh, kind)})
            drift: tuple[Json, ...] = ()
            if self.lock is not None:
                # Every kind the lock holds is checked again, as at start-up: a prompt or
                # template rewritten mid-session is the same rug pull as a tool.
                services[service], found = relocked(
                    service, kind, services[service], self.lock, self.lock_mode
                )
                drift = tuple({**d.record(), "mode": self.lock_mode} for d in found)
            change = tool_changes(service, before.tools, fresh.tools) if kind == "tools" else None
            if change is not None or drift:
                changes.append(replace(change or ToolChanges(service), drift=drift))
        catalog = Catalog(services)
        index = None
        if "tools" in self.kinds:
            index = index_catalog(catalog, self.facts, self.count_tokens)
        return Refreshed(catalog, index, tuple(changes))


def tool_changes(service: str, before: Sequence[Json], after: Sequence[Json]) -> ToolChanges | None:
    """What changed from ``before`` to ``after`` (None: nothing), tools matched by name."""
    old, new = _by_name(before), _by_name(after)
    added = [name for name in new if name not in old]
    removed = [name for name in old if name not in new]
    changed: list[Json] = []
    for name, definition in new.items():
        previous = old.get(name)
        if previous is None or previous == definition:
            continue
        fields = sorted(
            key
            for key in previous.keys() | definition.keys()
            if previous.get(key) != definition.get(key)
        )
        hashes = {
            key: {"before": _hash(previous, key), "after": _hash(definition, key)} for key in fields
        }
        changed.append({"tool": _cut(name), "fields": fields, "sha256": hashes})
    if not (added or removed or changed):
        return None
    return ToolChanges(
        service,
        added=tuple(_cut(name) for name in added[:MAX_NAMES]),
        removed=tuple(_cut(name) for name in removed[:MAX_NAMES]),
        changed=tuple(changed[:MAX_NAMES]),
        counts=(len(added), len(removed), len(changed)),
        tools=len(new),
    )


def _by_name(tools: Sequence[Json]) -> dict[str, Json]:
    named: dict[str, Json] = {}
    for tool in tools:
        name = tool.get("name")
        if isinstance(name, str) and name:
            named.setdefault(name, tool)  # as the catalog: a repeated name, the first one
    return named


def _hash(definition: Json, key: str) -> str | None:
    """The SHA-256 of a field's canonical JSON (sorted keys, no spaces); None: absent."""
    if key not in definition:
        return None
    return hashlib.sha256(_canonical.encode(definition[key])).hexdigest()


def _cut(name: str) -> str:
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + "…"


@dataclass(eq=False)
class Relist:
    """A backend's list asked for after its list_changed, until it is in the catalog (told apart
    by identity: a list asked again is another one)."""

    again: bool = False  # it sent list_changed again meanwhile: asked once more after


Key = tuple[str, str]  # (service, kind)
# A refresh that ran and the lists it held (see Relists.finished).
Finished = tuple[Refresh, dict[Key, Relist]]


class Relists:
    """A session's refreshes, kept by its router: each backend's list asked for or in the works
    (by service and kind), the lists that came and wait for the next :class:`Refresh`, the one
    running (one at most) and the lists it holds. A backend that repeats list_changed while its
    list is asked for or in the works is asked once more after, however often it repeats."""

    def __init__(self) -> None:
        self.asked: dict[Key, Relist] = {}
        self.fresh: dict[Key, tuple[Relist, tuple[Any, ...]]] = {}
        self.running: Refresh | None = None
        self.held: dict[Key, Relist] = {}

    def changed(self, service: str, kind: str) -> bool:
        """The backend said its list changed: whether to ask it now (else once more after)."""
        relist = self.asked.get((service, kind))
        if relist is not None:
            relist.again = True
            return False
        self.asked[service, kind] = Relist()
        return True

    def keep(self, service: str, kind: str, relist: Relist, entries: list[Any]) -> None:
        """The list came: it waits for the next refresh."""
        self.fresh[service, kind] = (relist, tuple(entries))

    def done(self, service: str, kind: str, relist: Relist) -> bool:
        """The list is in the catalog (or came to nothing): whether to ask it again (it said
        list_changed meanwhile). A container gone since forgot its lists: nothing to do."""
        if self.asked.get((service, kind)) is not relist:
            return False
        del self.asked[service, kind]
        if not relist.again:
            return False
        self.asked[service, kind] = Relist()
        return True

    def next(
        self,
        base: Catalog,
        facts: Mapping[str, ServiceFacts],
        count: Callable[[Json], int],
        lock: SuiteLock | None = None,
        lock_mode: Mode = "off",
        *,
        redact: Redact = unredacted,
    ) -> Refresh | None:
        """The next refresh, with every list that came meanwhile, if none runs."""
        if self.running is not None or not self.fresh:
            return None
        lists = tuple(
            (service, kind, entries) for (service, kind), (_, entries) in self.fresh.items()
        )
        self.held = {key: relist for key, (relist, _) in self.fresh.items()}
        self.fresh = {}
        self.running = Refresh(base, lists, facts, count, lock, lock_mode, redact)
        return self.running

    def finished(self, job: object) -> Finished | None:
        """``job`` ran: the refresh and the lists it held (None: not the one running)."""
        refresh = self.running
        if refresh is None or job is not refresh:
            return None
        held, self.running, self.held = self.held, None, {}
        return refresh, held

    def forget(self, service: str) -> None:
        """The service's container is gone: the next one's list_changed is asked at once."""
        for key in [key for key in self.asked if key[0] == service]:
            del self.asked[key]
        for key in [key for key in self.fresh if key[0] == service]:
            del self.fresh[key]

    def clone(self) -> Relists:
        twin = Relists()
        twins: dict[int, Relist] = {}  # one twin per list (see done: told apart by identity)

        def twin_of(relist: Relist) -> Relist:
            return twins.setdefault(id(relist), replace(relist))

        twin.asked = {key: twin_of(relist) for key, relist in self.asked.items()}
        twin.fresh = {key: (twin_of(r), entries) for key, (r, entries) in self.fresh.items()}
        twin.running = self.running  # (never changed in place)
        twin.held = {key: twin_of(relist) for key, relist in self.held.items()}
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        numbers: dict[int, int] = {}

        def relist(r: Relist) -> tuple[int, bool]:
            # Which lists are the same one matters (see done), not where they live.
            return numbers.setdefault(id(r), len(numbers)), r.again

        encode = msgspec.json.encode
        running = self.running
        return (
            tuple((k, relist(r)) for k, r in sorted(self.asked.items())),
            tuple((k, relist(r), encode(e)) for k, (r, e) in sorted(self.fresh.items())),
            # (its base is the session's catalog: that changes only when it is reported done)
            None if running is None else encode(running.lists),
            tuple((k, relist(r)) for k, r in sorted(self.held.items())),
        )
