"""The suite lock: image digests and definition hashes a suite was reviewed with, without I/O.

``reactor-fabric lock`` writes ``claude-mcp-suite.lock`` beside the suite (:func:`lock_text`):
per service, the image's id as the engine reports it (a content digest: the same bytes, the
same id) and, for each tool, prompt and resource template, the SHA-256 of each part of its
definition and of the whole. A tool's description is prompt text for the client's model: an
image update that rewrites it can steer an agent ("rug pull"), so whatever a server offers later
is compared with the lock (:func:`compare_offer`, :func:`compare_image`), and what differs is a
list of :class:`Drift` items. ``orchestrator.lock`` says what is done with them
(:func:`lock_mode`; said in the suite, ``enforce`` and ``warn`` need the lock file:
:func:`missing_lock`): ``enforce`` hides a changed tool (:func:`enforced`; a call of it is refused
with -32004 ``tool_definition_changed``) and starts no container from a changed image
(``image_changed``); ``warn`` serves everything and reports the drift; ``off`` compares nothing.

Hashes are of canonical JSON (:func:`canonical`): keys sorted, no spaces, UTF-8 as is. The
parts hashed are the ones that reach a model or a client's choice (:data:`PARTS`); other keys
(``_meta``, ``icons``) are not locked. Names are the service's own, not the endpoint's shown ones.

What is hashed is a definition as ``/mcp`` serves it: without the suite's secret values (each
replaced by ``[REDACTED]``, see :mod:`.catalog`). The catalog probe's offers are redacted before
anything reads them (the lock made from them, and every comparison), a ``/mcp`` session's fresh
lists too, and the relay compares a server's lists (tools, prompts, resource templates) the
same way (:func:`checked_list` is given the redactor) while passing the answer on as it is.
So the lock never holds a hash of a secret (one that could be guessed offline against it, the
rest of the text being known), a secret rotated changes no hash, and a definition hashes alike
wherever it is compared.

Error handling: :func:`parse_lock` raises :class:`LockInvalid` with what is wrong; nothing here
raises on a server's malformed entries (an entry without a name is not comparable, and ignored
as the catalog ignores it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

import msgspec

from .._errors import SecurityViolation
from .._reasons import TOOL_DEFINITION_CHANGED
from .catalog import Redact, ServiceCatalog, unredacted

Json = dict[str, Any]
Mode = Literal["enforce", "warn", "off"]

LOCK_FILE: Final = "claude-mcp-suite.lock"
LOCK_VERSION: Final = 1
# The largest lock file read (a suite's worth of hashes is a few hundred KB at most).
MAX_LOCK_BYTES: Final = 16 * 1024 * 1024

# Each kind: the key of its entries in a ServiceCatalog and the lock, what names an entry, and
# the parts of its definition that are hashed.
KINDS: Final = ("tools", "prompts", "resource_templates")
_NAME_KEY: Final = {"tools": "name", "prompts": "name", "resource_templates": "uriTemplate"}
PARTS: Final[Mapping[str, tuple[str, ...]]] = {
    "tools": ("name", "title", "description", "inputSchema", "outputSchema", "annotations"),
    "prompts": ("name", "title", "description", "arguments"),
    "resource_templates": (
        "uriTemplate",
        "name",
        "title",
        "description",
        "mimeType",
        "annotations",
    ),
}
_SINGULAR: Final = {"tools": "tool", "prompts": "prompt", "resource_templates": "resource template"}


class LockInvalid(ValueError):
    """The lock file is not one this version reads (the message says why)."""


def canonical(value: object) -> bytes:
    """Canonical JSON: sorted keys, no spaces, UTF-8 (not escaped)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _sha256(value: object) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def definition_hashes(kind: str, definition: Json) -> Json:
    """``{"sha256": whole, "parts": {part: sha256}}`` of one entry: the whole is the hash of
    the locked parts together (absent parts are absent from both)."""
    locked = {part: definition[part] for part in PARTS[kind] if part in definition}
    return {
        "sha256": _sha256(locked),
        "parts": {part: _sha256(value) for part, value in locked.items()},
    }


def _named(kind: str, entries: Iterable[Json]) -> dict[str, Json]:
    named: dict[str, Json] = {}
    for entry in entries:
        name = entry.get(_NAME_KEY[kind])
        if isinstance(name, str) and name:
            named.setdefault(name, entry)  # a repeated name: the first one, as the catalog
    return named


def service_lock(image: str, image_id: str | None, offer: ServiceCatalog) -> Json:
    """One service's entry of the lock."""
    entry: Json = {"image": image, "image_id": image_id}
    for kind in KINDS:
        entry[kind] = {
            name: definition_hashes(kind, definition)
            for name, definition in _named(kind, getattr(offer, kind)).items()
        }
    return entry


def lock_text(services: Mapping[str, Json]) -> str:
    """The lock file's text: JSON, sorted keys, indented (reviewable in a diff)."""
    document = {"version": LOCK_VERSION, "services": dict(services)}
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class SuiteLock:
    """A parsed lock: service name → its entry (as :func:`service_lock` made it)."""

    services: Mapping[str, Json]

    def unknown_services(self, suite_services: Iterable[str]) -> list[str]:
        """Services the lock names that the suite lacks (validate-config refuses them)."""
        known = set(suite_services)
        return sorted(name for name in self.services if name not in known)


def parse_lock(text: str | bytes) -> SuiteLock:
    """The lock in ``text``; :class:`LockInvalid` when it is not one."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LockInvalid(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("version") != LOCK_VERSION:
        raise LockInvalid(f"not a version {LOCK_VERSION} suite lock")
    services = document.get("services")
    if not isinstance(services, dict):
        raise LockInvalid("no 'services' object")
    for name, entry in services.items():
        if not isinstance(entry, dict):
            raise LockInvalid(f"service {name!r}: not an object")
        image_id = entry.get("image_id")
        if image_id is not None and not isinstance(image_id, str):
            raise LockInvalid(f"service {name!r}: image_id is not a string")
        for kind in KINDS:
            items = entry.get(kind, {})
            if not isinstance(items, dict) or not all(
                isinstance(item, dict)
                and isinstance(item.get("sha256"), str)
                and isinstance(item.get("parts", {}), dict)
                for item in items.values()
            ):
                raise LockInvalid(f"service {name!r}: {kind} is not a map of hashes")
    return SuiteLock(services)


def lock_mode(setting: str | None, lock_exists: bool) -> Mode:
    """``orchestrator.lock``, its default applied: warn with a lock file, off without."""
    if setting in ("enforce", "warn", "off"):
        return setting  # type: ignore[return-value]  # (narrowed by the test above)
    return "warn" if lock_exists else "off"


def missing_lock(setting: str | None) -> str | None:
    """Why there must be a lock file, when ``orchestrator.lock`` says so (None: it need not
    be there): ``enforce`` or ``warn`` said in the suite would compare nothing without one,
    silently (enforce enforcing nothing). Only the default (unset, ``null``) turns itself off
    when there is no lock file."""
    if setting not in ("enforce", "warn"):
        return None
    return (
        f"no such file, and orchestrator.lock is {setting} (write it with 'reactor-fabric "
        'lock\', or set orchestrator.lock: "off")'
    )


# --- drift ------------------------------------------------------------------------------------

Change = Literal["changed", "added", "removed", "duplicated"]


@dataclass(frozen=True)
class Drift:
    """One difference from the lock. ``kind``: ``image``, ``service`` (not in the lock) or one
    of :data:`KINDS`; ``name``: the entry's (the image reference for an image); ``parts``: for
    a changed entry, the parts whose hashes differ. ``duplicated``: the name listed again, with
    a definition other than the locked one (the parts that differ from it): the lock holds one
    definition per name, and which of two a client takes, clients do not say."""

    service: str
    kind: str
    name: str
    change: Change
    parts: tuple[str, ...] = ()
    locked: str | None = None  # an image's locked id
    found: str | None = None  # the id the engine has now

    def record(self) -> Json:
        """As the log, the audit trail's ``drift`` record and get_status give it (hashes and
        names, never a definition's text)."""
        record: Json = {
            "service": self.service,
            "kind": self.kind,
            "entry": self.name,  # ("name" would clash with the log record's own)
            "change": self.change,
        }
        if self.parts:
            record["parts"] = list(self.parts)
        if self.kind == "image":
            record["locked"] = self.locked
            record["found"] = self.found
        return record

    def describe(self) -> str:
        """One line for a person (``lock --check``, the log)."""
        if self.kind == "image" and self.locked is None:
            return f"{self.service}: image {self.name} ({self.found}) is not in the lock"
        if self.kind == "image":
            return f"{self.service}: image {self.name} is {self.found}, the lock has {self.locked}"
        if self.kind == "service":
            return f"{self.service}: not in the lock"
        what = f"{self.service}: {_SINGULAR.get(self.kind, self.kind)} {self.name!r}"
        if self.change == "changed":
            return f"{what} changed ({', '.join(self.parts)})"
        if self.change == "duplicated":
            return f"{what} listed again, otherwise defined ({', '.join(self.parts)})"
        return f"{what} {'is not in the lock' if self.change == 'added' else 'is gone'}"


def compare_image(service: str, image: str, lock: SuiteLock, image_id: str | None) -> Drift | None:
    """The image's drift, if any: an image the engine has under another id than the lock's (or
    a service the lock lacks). An image the engine does not have is no drift: its start fails
    for that (image_not_found)."""
    entry = lock.services.get(service)
    if image_id is None:
        return None
    if entry is None:  # (compare_offer names the service itself)
        return Drift(service, "image", image, "added", found=image_id)
    locked = entry.get("image_id")
    if locked == image_id:
        return None
    return Drift(service, "image", image, "changed", locked=locked, found=image_id)


def compare_offer(service: str, lock: SuiteLock, offer: ServiceCatalog) -> list[Drift]:
    """What ``offer`` (a learned catalog, or lists a backend answered later) differs from the
    lock in, entry by entry, kind by kind. A service the lock lacks: one ``service`` item,
    and each of its entries ``added``. An offer not learned (``error``) is not compared."""
    if offer.error is not None:
        return []
    entry = lock.services.get(service)
    drifts: list[Drift] = []
    if entry is None:
        drifts.append(Drift(service, "service", service, "added"))
        entry = {}
    for kind in KINDS:
        drifts += compare_entries(service, kind, entry.get(kind, {}), getattr(offer, kind))
    return drifts


def compare_entries(
    service: str, kind: str, locked: Mapping[str, Json], entries: Sequence[Json]
) -> list[Drift]:
    """One kind's drift, every entry compared: entries added, removed, changed (which parts),
    and a locked name listed again with another definition (``duplicated``: a server could
    show the locked one first and its own after, for a client that keeps the last)."""
    seen: set[str] = set()
    drifts: list[Drift] = []
    for definition in entries:
        name = definition.get(_NAME_KEY[kind])
        if not isinstance(name, str) or not name:
            continue  # not comparable (see listed_entries: not served under enforce)
        repeated = name in seen
        seen.add(name)
        before = locked.get(name)
        if before is None:
            if not repeated:  # (a name the lock lacks is withheld whole under enforce)
                drifts.append(Drift(service, kind, name, "added"))
            continue
        hashes = definition_hashes(kind, definition)
        if before.get("sha256") != hashes["sha256"]:
            old: Mapping[str, str] = before.get("parts", {})
            new: Mapping[str, str] = hashes["parts"]
            parts = tuple(sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p)))
            change: Change = "duplicated" if repeated else "changed"
            drifts.append(Drift(service, kind, name, change, parts or ("definition",)))
    drifts += [Drift(service, kind, name, "removed") for name in locked if name not in seen]
    return drifts


def listed_entries(kind: str, entries: Sequence[object], hidden: Container[str]) -> list[Any]:
    """``entries`` as ``enforce`` lists them: each name once (its first entry; a later one is
    not the locked definition's place), none ``hidden`` (withheld), and nothing that has no
    name (no comparison could pass it)."""
    listed: list[Any] = []
    names: set[str] = set()
    for entry in entries:
        name = entry.get(_NAME_KEY[kind]) if isinstance(entry, dict) else None
        if isinstance(name, str) and name and name not in hidden and name not in names:
            names.add(name)
            listed.append(entry)
    return listed


def relocked(
    service: str, kind: str, offer: ServiceCatalog, lock: SuiteLock, mode: Mode
) -> tuple[ServiceCatalog, list[Drift]]:
    """A service's offer after one kind of its entries (tools, prompts, resource templates)
    was listed again mid-session (its list_changed): that kind compared with the lock, its
    drift records' part for that kind replaced, and under enforce served as :func:`enforced`
    serves it (for tools, ``withheld`` made anew). Also the drift not known before (to
    report). A kind the lock does not hold (resources) is returned as it is."""
    if mode == "off" or kind not in KINDS:
        return offer, []
    entry = lock.services.get(service, {})
    drifts = compare_entries(service, kind, entry.get(kind, {}), getattr(offer, kind))
    known = [record for record in offer.drift if record.get("kind") != kind]
    records = tuple(known + [drift.record() for drift in drifts])
    new = [drift for drift in drifts if drift.record() not in offer.drift]
    if mode == "enforce":
        offer = _enforced_kind(offer, kind, drifts)
    return replace(offer, drift=records), new


def withheld_error(service: str, why: Json) -> SecurityViolation:
    """What a call of a tool the lock withholds is answered with (-32004
    ``tool_definition_changed``): the tool and the parts that changed, never the new text."""
    tool, parts = str(why.get("tool")), list(why.get("parts") or ())
    said = f"changed ({', '.join(parts)})" if parts else "not in the suite lock"
    return SecurityViolation(
        f"{service}'s tool {tool!r} is withheld: its definition {said} since the suite was "
        "locked (review it, then run 'reactor-fabric lock' again)",
        reason=TOOL_DEFINITION_CHANGED,
        service=service,
        tool=tool,
        change=why.get("change"),
        changed=parts,
    )


# Where each kind's entries are in a list answer's result (tools/list, prompts/list,
# resources/templates/list).
RESULT_KEY: Final[Mapping[str, str]] = {
    "tools": "tools",
    "prompts": "prompts",
    "resource_templates": "resourceTemplates",
}


class _Listing(msgspec.Struct):
    tools: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    prompts: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    resource_templates: msgspec.Raw | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="resourceTemplates"
    )


_listing_decoder = msgspec.json.Decoder(_Listing)


def listed_kinds(result: msgspec.Raw | None) -> tuple[str, ...]:
    """The kinds of entries (of :data:`KINDS`) a message's ``result`` (undecoded) holds a list
    of: what a client may take for a list answer, whatever it answers (read without decoding
    the rest). None for a result that is not an object, or for no result."""
    if result is None:
        return ()
    try:
        listing = _listing_decoder.decode(result)
    except (msgspec.DecodeError, RecursionError):  # (ValidationError: not an object)
        return ()
    return tuple(kind for kind in KINDS if getattr(listing, kind) is not msgspec.UNSET)


def checked_list(
    service: str,
    lock: SuiteLock,
    mode: Mode,
    line: bytes,
    *,
    kind: str,
    withheld: dict[str, Json],
    redact: Redact = unredacted,
) -> tuple[bytes, list[Drift]]:
    """A relayed message whose result lists ``kind`` (one page of a ``tools/list``,
    ``prompts/list`` or ``resources/templates/list`` answer, or what a server sends as one)
    checked against the lock: the line to pass on and the drift found in it. Every entry is
    compared (a name listed twice included). Under enforce the line passes only as
    :func:`listed_entries` lists it: the entries that differ, a name's later entries and
    entries without a name are taken out. For tools, ``withheld`` (tool name → why) is
    updated: the page's tools that differ in, the others out. An entry the page lacks is not
    drift here (another page may hold it). A list that is not a list passes as it is (no
    client takes it for one). The entries are compared, and named, as ``redact`` leaves them
    (the lock's hashes are of definitions without the suite's secret values); the line keeps
    what the server wrote."""
    try:
        message = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return line, []
    result = message.get("result") if isinstance(message, dict) else None
    items = result.get(RESULT_KEY[kind]) if isinstance(result, dict) else None
    if mode == "off" or not isinstance(result, dict) or not isinstance(items, list):
        return line, []
    entries = [item for item in items if isinstance(item, dict)]
    compared: list[Json] = redact(entries)
    locked = lock.services.get(service, {}).get(kind, {})
    drifts = [d for d in compare_entries(service, kind, locked, compared) if d.change != "removed"]
    if kind == "tools":
        for name in _named(kind, compared):
            withheld.pop(name, None)
    if mode != "enforce":
        return line, drifts
    hidden = {d.name for d in drifts if d.change != "duplicated"}  # (its first is the locked one)
    if kind == "tools":
        for drift in drifts:
            if drift.name in hidden:
                withheld[drift.name] = {
                    "tool": drift.name,
                    "change": drift.change,
                    "parts": list(drift.parts),
                }
        hidden = set(withheld)
    # Decided on the entries as compared, applied to the entries as the server wrote them.
    kept = {id(shown) for shown in listed_entries(kind, compared, hidden)}
    listed = [entry for entry, shown in zip(entries, compared, strict=True) if id(shown) in kept]
    if len(listed) == len(items):
        return line, drifts  # (as the server sent it: nothing is taken out)
    result[RESULT_KEY[kind]] = listed
    return msgspec.json.encode(message), drifts


def enforced(offer: ServiceCatalog, drifts: Sequence[Drift]) -> ServiceCatalog:
    """``offer`` as ``enforce`` serves it: a tool, prompt or resource template that is not the
    locked one (changed, or not in the lock) is left out, and so are a name's later entries
    (:func:`listed_entries`); the tools left out are kept in ``withheld`` (name, change,
    parts), so that a call of one is refused saying why rather than "unknown tool"."""
    for kind in KINDS:
        offer = _enforced_kind(offer, kind, drifts)
    return offer


def _enforced_kind(offer: ServiceCatalog, kind: str, drifts: Sequence[Drift]) -> ServiceCatalog:
    """:func:`enforced` for one kind of entries (the others as they are)."""
    hidden = {
        drift.name: drift
        for drift in drifts
        if drift.kind == kind and drift.change in ("changed", "added")
    }
    listed = tuple(listed_entries(kind, getattr(offer, kind), hidden))
    if kind != "tools":
        kept: Json = {kind: listed}
        return replace(offer, **kept)
    withheld = tuple(
        {"tool": d.name, "change": d.change, "parts": list(d.parts)} for d in hidden.values()
    )
    return replace(offer, tools=listed, withheld=withheld)
