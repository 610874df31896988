"""The catalog's file format, shared by ``reactor-fabric catalog --json`` and ``rank --catalog``:

    {"services": {NAME: {"description": str, "keywords": [str], "categories": [str],
                         "example_tasks": [str], "requires": [str],
                         "tools": [{"name": str, "description": str, "inputSchema": {...}}],
                         "resources": [...], "prompts": [...]}}}

Every field but ``tools`` may be empty or absent. Any catalog in this form can be ranked, also
one of servers that have no image here (the evaluation set is one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .index import ServiceText

Json = dict[str, Any]
MAX_SERVICES = 10_000
MAX_TOOLS_PER_SERVICE = 10_000


class CatalogFormatError(ValueError):
    """The file is not a catalog in the documented form (the message says where)."""


def services_from_json(data: object) -> list[ServiceText]:
    """The services of a catalog file's content, in its order (CatalogFormatError if malformed)."""
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise CatalogFormatError('a catalog is an object with a "services" object')
    services: Mapping[str, object] = data["services"]
    if len(services) > MAX_SERVICES:
        raise CatalogFormatError(f"more than {MAX_SERVICES} services")
    found = []
    for name, entry in services.items():
        if not isinstance(entry, dict):
            raise CatalogFormatError(f"services.{name} is not an object")
        tools = entry.get("tools", [])
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS_PER_SERVICE:
            raise CatalogFormatError(
                f"services.{name}.tools is not a list (of at most {MAX_TOOLS_PER_SERVICE})"
            )
        found.append(
            ServiceText(
                name=name,
                description=_text(entry, "description", name),
                keywords=_words(entry, "keywords", name),
                categories=_words(entry, "categories", name),
                example_tasks=_words(entry, "example_tasks", name),
                requires=_words(entry, "requires", name),
                tools=tuple(
                    t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)
                ),
            )
        )
    return found


def catalog_json(services: list[ServiceText], *, extra: Mapping[str, Json] | None = None) -> Json:
    """The file form of ``services`` (``extra``: more fields per service, e.g. prompts)."""
    extra = extra or {}
    return {
        "services": {
            s.name: {
                "description": s.description,
                "keywords": list(s.keywords),
                "categories": list(s.categories),
                "example_tasks": list(s.example_tasks),
                "requires": list(s.requires),
                "tools": list(s.tools),
                **extra.get(s.name, {}),
            }
            for s in services
        }
    }


def _text(entry: Json, key: str, name: str) -> str:
    value = entry.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise CatalogFormatError(f"services.{name}.{key} is not a string")
    return value


def _words(entry: Json, key: str, name: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CatalogFormatError(f"services.{name}.{key} is not a list of strings")
    return tuple(value)
