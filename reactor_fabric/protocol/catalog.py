"""The suite's catalog: every service's tools, prompts and resources, under the names the fabric
endpoint (``/mcp``) shows them by. Pure: built from what each service answered to
``tools/list``, ``prompts/list``, ``resources/list`` and ``resources/templates/list``.

Names. A tool ``git_log`` of service ``git`` is shown as ``git__git_log`` (``{service}__{tool}``,
the de-facto form: clients split on the first ``__``); its description starts with ``[git]``.
Clients bound names tighter than MCP does (the spec allows 128 characters of ``[A-Za-z0-9_.-]``;
the Anthropic API 64, and Claude Code adds ``mcp__<server>__`` on top — one over-long name has
broken tool search for a whole Claude Code session), so a name that would be longer than
:data:`MAX_NAME` characters, or that holds a character outside that alphabet, is shortened
deterministically: a readable prefix, ``_``, and 8 hex digits of the SHA-256 of the full
name. The same service and tool always give the same name, whatever else the suite holds; a
shown name is never looked up by splitting it, only through the catalog's table, so a
shortened one routes as well as any. The one exception: a service whose offer could not be
learned (its image missing, its probe failed) has no table to look in, yet stays addressable —
``{service}__{tool}`` routes to it (:meth:`Catalog.addressed`), so that a call starts it like any
call and answers why it cannot run rather than "unknown tool".

A service that could not be learned again keeps the offer it was last learned with
(:func:`relearned`): an image removed after start-up must not turn its tools into unknown ones.

Prompts are named the same way. Resource URIs keep their form (clients open them as they
are); they are routed by a table, and a URI two services both offer goes to the first one in
the suite's order — the other one's is shown as ``{service}+{uri}``, which routes to it.

Secrets. A server may write a secret it was given (its token) into what it offers — a tool's
description, a schema's default. An offer is kept, cached and served without the suite's secret
values (:func:`redacted_offer`, given the redactor: ``observe/redaction.py``'s, which this pure
layer cannot import): every string and number holding one says ``[REDACTED]`` instead. Names
too, so that a tool named after a secret is shown (and locked) by its redacted name, and its
calls name a tool its server does not have.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

SEPARATOR = "__"
MAX_NAME = 64
HASH_DIGITS = 8
_ALLOWED = re.compile(r"[A-Za-z0-9_.-]+")
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_.-]")

Json = dict[str, Any]
# A value of JSON's kinds, as it is without the suite's secret values (of the same shape; the
# value itself when it holds none): observe/redaction.py's SECRET_VALUES.redacted.
Redact = Callable[[Any], Any]


def unredacted(value: Any) -> Any:
    """The :data:`Redact` of a process that has no secret values."""
    return value


def shown_name(service: str, name: str) -> str:
    """The name ``service``'s tool (or prompt) ``name`` is shown by (see the module's rules)."""
    full = f"{service}{SEPARATOR}{name}"
    if len(full) <= MAX_NAME and _ALLOWED.fullmatch(full):
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:HASH_DIGITS]
    readable = _NOT_ALLOWED.sub("_", full)[: MAX_NAME - HASH_DIGITS - 1]
    return f"{readable}_{digest}"


@dataclass(frozen=True)
class Entry:
    """One tool or prompt of one service, as the service described it and as it is shown."""

    service: str
    name: str  # the service's own name
    shown: str  # the name the fabric endpoint shows
    definition: Json  # what the service answered (name, description, schemas, …)

    def as_shown(self) -> Json:
        """The definition under its shown name, its description prefixed with the service."""
        shown = dict(self.definition)
        shown["name"] = self.shown
        description = str(self.definition.get("description") or "").strip()
        shown["description"] = f"[{self.service}] {description}".rstrip()
        return shown


@dataclass(frozen=True)
class ServiceCatalog:
    """What one service offers; ``error`` when it could not be learned (the rest still work),
    and ``reason`` when that learning *failed* (a reason of :mod:`reactor_fabric._reasons`,
    e.g. ``image_not_found``): the service is then shown as unavailable. An ``error`` without a
    reason is a service not learned yet. The offer may be the one last learned (see
    :func:`relearned`)."""

    tools: tuple[Json, ...] = ()
    prompts: tuple[Json, ...] = ()
    resources: tuple[Json, ...] = ()
    resource_templates: tuple[Json, ...] = ()
    error: str | None = None
    reason: str | None = None
    # Tools the suite lock withholds (orchestrator.lock: enforce, see suite_lock.py): each
    # {"tool", "change", "parts"}; not listed, and a call of one is refused saying why.
    withheld: tuple[Json, ...] = ()
    # What differs from the suite lock (warn and enforce): drift records (suite_lock.Drift).
    drift: tuple[Json, ...] = ()


@dataclass(frozen=True)
class Catalog:
    """Every service's offer, with the tables that route a shown name back to its service."""

    services: Mapping[str, ServiceCatalog]
    tools: Mapping[str, Entry] = field(init=False)
    prompts: Mapping[str, Entry] = field(init=False)
    resources: Mapping[str, tuple[str, str]] = field(init=False)  # shown URI → (service, URI)

    # Shown names two services would share, refused for both: service → why, naming both.
    conflicts: Mapping[str, tuple[str, ...]] = field(init=False)

    def __post_init__(self) -> None:
        conflicts: dict[str, list[str]] = {}
        object.__setattr__(self, "tools", _entries(self.services, "tools", conflicts))
        object.__setattr__(self, "prompts", _entries(self.services, "prompts", conflicts))
        object.__setattr__(self, "resources", _resource_table(self.services))
        object.__setattr__(
            self, "conflicts", {service: tuple(why) for service, why in conflicts.items()}
        )

    @classmethod
    def empty(cls) -> Catalog:
        return cls({})

    def tools_of(self, services: Iterable[str] | None = None) -> list[Json]:
        """The shown tools of ``services`` (all when None), in the suite's order."""
        return _shown(self.tools.values(), services)

    def prompts_of(self, services: Iterable[str] | None = None) -> list[Json]:
        return _shown(self.prompts.values(), services)

    def resources_of(self, services: Iterable[str] | None = None) -> list[Json]:
        """The resources of ``services`` (all when None), each under its shown URI."""
        wanted = None if services is None else set(services)
        shown_uri = {route: shown for shown, route in self.resources.items()}
        listed = []
        for service, offer in self.services.items():
            if wanted is not None and service not in wanted:
                continue
            for resource in offer.resources:
                route = (service, resource.get("uri"))
                if route in shown_uri:
                    listed.append({**resource, "uri": shown_uri[route]})
        return listed

    def tool(self, shown: str) -> Entry | None:
        return self.tools.get(shown)

    def prompt(self, shown: str) -> Entry | None:
        return self.prompts.get(shown)

    def resource(self, uri: str) -> tuple[str, str] | None:
        """(service, the service's own URI) for a shown resource URI."""
        return self.resources.get(uri)

    def withheld_tool(self, name: str) -> tuple[str, Json] | None:
        """(service, why) for a shown name of a tool the suite lock withholds."""
        for service, offer in self.services.items():
            for why in offer.withheld:
                if shown_name(service, str(why.get("tool"))) == name:
                    return service, why
        return None

    def addressed(self, name: str) -> tuple[str, str] | None:
        """(service, tool) for a name that is not in the table but addresses, as
        ``{service}__{tool}``, a service whose offer could not be learned (or not yet): the
        call goes to it, and its start says whether it can run. None for any other name (a
        learned service's unknown tool stays unknown; service names hold no ``__``)."""
        service, separator, tool = name.partition(SEPARATOR)
        offer = self.services.get(service)
        if not separator or not tool or offer is None or offer.error is None:
            return None
        return service, tool

    def unavailable(self) -> dict[str, Json]:
        """The services whose learning failed, each with why: ``{"reason", "detail"}`` (what
        the meta-tools mark them with; a service not learned yet is not among them)."""
        return {
            name: {"reason": offer.reason, "detail": offer.error or ""}
            for name, offer in self.services.items()
            if offer.reason is not None
        }

    def lock_drift(self) -> dict[str, list[Json]]:
        """Each service's difference from the suite lock (only services with some)."""
        return {name: list(s.drift) for name, s in self.services.items() if s.drift}

    def errors(self) -> dict[str, str]:
        """Why each service's offer is missing or partial: not learned, or names refused."""
        errors = {name: s.error for name, s in self.services.items() if s.error is not None}
        for service, why in self.conflicts.items():
            errors[service] = "; ".join([*filter(None, [errors.get(service)]), *why])
        return errors


def _entries(
    services: Mapping[str, ServiceCatalog], kind: str, conflicts: dict[str, list[str]]
) -> dict[str, Entry]:
    """Every service's ``kind`` by shown name. A shown name two services would share (only a
    hashed form can: service names hold no ``__``) is refused for both, and the conflict
    recorded for each, naming both: keeping the first would let one server shadow another's
    tool by choosing its names."""
    table: dict[str, Entry] = {}
    refused: set[str] = set()
    for service, offer in services.items():
        for definition in getattr(offer, kind):
            name = definition.get("name")
            if not isinstance(name, str) or not name:
                continue  # a service's malformed entry is left out, not fatal
            shown = shown_name(service, name)
            if shown in refused:
                continue
            first = table.get(shown)
            if first is None:
                table[shown] = Entry(service, name, shown, definition)
            elif first.service != service:
                del table[shown]
                refused.add(shown)
                why = (
                    f"{kind[:-1]} name {shown!r} refused: both {first.service!r}'s "
                    f"{first.name!r} and {service!r}'s {name!r} would be shown by it"
                )
                for party in (first.service, service):
                    conflicts.setdefault(party, []).append(why)
            # else: one service listing the same name twice; its first one stands.
    return table


def _resource_table(services: Mapping[str, ServiceCatalog]) -> dict[str, tuple[str, str]]:
    table: dict[str, tuple[str, str]] = {}
    for service, offer in services.items():
        for resource in offer.resources:
            uri = resource.get("uri")
            if not isinstance(uri, str) or not uri:
                continue
            shown = uri if uri not in table else f"{service}+{uri}"
            table.setdefault(shown, (service, uri))
    return table


def _shown(entries: Iterable[Entry], services: Iterable[str] | None) -> list[Json]:
    wanted = None if services is None else set(services)
    return [entry.as_shown() for entry in entries if wanted is None or entry.service in wanted]


def relearned(before: ServiceCatalog | None, after: ServiceCatalog) -> ServiceCatalog:
    """A service's offer after it was learned again: ``after`` when that worked; when it
    failed, the offer it had (``before``: learned earlier, or nothing yet) with the new
    failure's ``error`` and ``reason`` — so that its tools stay known and callable (a call
    answers why the service cannot run) instead of vanishing until it is learned again."""
    if after.error is None or before is None:
        return after
    return replace(before, error=after.error, reason=after.reason)


def service_catalog(
    *,
    tools: Sequence[Json] = (),
    prompts: Sequence[Json] = (),
    resources: Sequence[Json] = (),
    resource_templates: Sequence[Json] = (),
) -> ServiceCatalog:
    """A service's offer from its list answers, keeping only well-formed entries (objects)."""
    return ServiceCatalog(
        tools=tuple(t for t in tools if isinstance(t, dict)),
        prompts=tuple(p for p in prompts if isinstance(p, dict)),
        resources=tuple(r for r in resources if isinstance(r, dict)),
        resource_templates=tuple(t for t in resource_templates if isinstance(t, dict)),
    )


def redacted_offer(offer: ServiceCatalog, redact: Redact) -> ServiceCatalog:
    """``offer`` without the suite's secret values: its lists and its ``error`` (a server's
    words may be in it); ``offer`` itself when it held none."""
    changed = False

    def clean(entries: tuple[Json, ...]) -> tuple[Json, ...]:
        nonlocal changed
        given = list(entries)
        shown = redact(given)
        changed = changed or shown is not given  # (a Redact gives back what held nothing)
        return tuple(shown)

    tools, prompts = clean(offer.tools), clean(offer.prompts)
    resources, templates = clean(offer.resources), clean(offer.resource_templates)
    error = redact(offer.error) if offer.error is not None else None
    if not changed and error == offer.error:
        return offer
    return replace(
        offer,
        tools=tools,
        prompts=prompts,
        resources=resources,
        resource_templates=templates,
        error=error,
    )
