"""How a suite's refusal is said: a schema error (:func:`schema_message`) or a mapping key the
schema refused (:func:`name_message`), in the words a user acts on — what was expected, what
was found, and for a pattern what the value must be (the parsers' own words, so a value reads
the same whether the schema or the parser refused it).

Pure: strings in, strings out.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from ..protocol.catalog import SEPARATOR
from .positions import KeyPath


def name_message(path: KeyPath, name: str, reserved: frozenset[str]) -> str:
    """Why a mapping's key is refused: a secret's (an environment variable's name) or a
    service's (used in URLs and container names)."""
    if path and path[-1] == "secrets":
        return (
            f"name {name!r} is not allowed: a secret's name is its environment variable's; "
            "use letters, digits and '_', not starting with a digit"
        )
    if name in reserved:
        return (
            f"name {name!r} is reserved: /mcp/{name}/… is the suite-level endpoint; "
            "choose another name"
        )
    if SEPARATOR in name:
        service, _, tool = name.partition(SEPARATOR)
        return (
            f"name {name!r} is not allowed: '{SEPARATOR}' separates a service from its "
            f"tool on the fabric endpoint (service{SEPARATOR}tool), so a service "
            f"{service!r} with a tool '{tool}{SEPARATOR}…' would show the same names; "
            "use a single '_' or '-'"
        )
    return (
        f"name {name!r} is not allowed: use lowercase letters, digits, '-' and '_' "
        "(at most 63, starting and ending with a letter or digit), since it is used in "
        "URLs and container names"
    )


_JSON_TYPE_NAMES = {
    dict: "a mapping",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}

_SCHEMA_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "null": "null",
    "integer": "an integer",
}


def schema_message(error: jsonschema.ValidationError, path: KeyPath) -> str:
    instance: Any = error.instance
    rule: Any = error.validator_value
    got = _JSON_TYPE_NAMES.get(type(instance), type(instance).__name__)
    if error.validator == "type":
        expected = rule if isinstance(rule, list) else [rule]
        wanted = " or ".join(_SCHEMA_TYPE_NAMES.get(str(name), f"a {name}") for name in expected)
        hint = ' (quote it: version: "1.0")' if path == ("version",) else ""
        return f"expected {wanted}, got {got} ({instance!r}){hint}"
    if error.validator == "enum":
        options = ", ".join(repr(option) for option in rule)
        hint = ' (quote it: version: "1.0")' if path == ("version",) else ""
        return f"{instance!r} is not one of {options}{hint}"
    if error.validator == "pattern":
        return _pattern_message(path, instance, rule)
    if error.validator == "minProperties" and path == ("mcp_services",):
        return "at least one service must be defined"
    if error.validator in ("oneOf", "uniqueItems"):
        return _combination_message(error, path)
    return error.message


def _combination_message(error: jsonschema.ValidationError, path: KeyPath) -> str:
    if error.validator == "uniqueItems":
        return "the list contains the same entry twice"
    if len(path) == 4 and path[2] == "secrets":  # mcp_services.NAME.secrets.SECRET
        return (
            "give exactly one source: env: VARIABLE (the orchestrator's environment) or "
            "file: /absolute/path"
        )
    if path == ("orchestrator", "auth"):
        return _auth_message(error)
    return error.message


def _auth_message(error: jsonschema.ValidationError) -> str:
    """``auth`` is a word or a mapping: say what is wrong with the form the suite used."""
    instance: Any = error.instance
    if not isinstance(instance, dict):
        return (
            f"{instance!r} is not one of 'token', 'none' (sign-in with an OpenID provider is "
            "auth: {mode: oidc, issuer: URL})"
        )
    for sub in sorted(error.context or (), key=lambda e: len(e.relative_path), reverse=True):
        if sub.schema_path and sub.schema_path[0] == 1:  # the mapping's branch
            inner = tuple(sub.relative_path)
            message = schema_message(sub, ("orchestrator", "auth", *inner))
            return f"{'.'.join(map(str, inner))}: {message}" if inner else message
    return error.message


# The words of parse_size's and parse_duration's own errors, so that a value reads the same
# whether the schema or the parser refused it.
_SIZE_MEANING = "a size; use e.g. '512m', '1g' or a number of bytes"
_DURATION_MEANING = "a duration; use a number and a unit (h, m, s, ms), e.g. '1m' or '5m30s'"
_PATTERN_MEANINGS = {
    "allowed_mount_roots": "an absolute path",
    "allowed_mount_targets": "an absolute path",
    "timeout": _DURATION_MEANING,
    "max_container_age": _DURATION_MEANING,
    "memory": _SIZE_MEANING,
    "memory_threshold": _SIZE_MEANING,
    "tmp_size": _SIZE_MEANING,
    "refill_hold": _DURATION_MEANING,
    "allowed_origins": "an origin such as 'https://example.com' (no path)",
    "issuer": "a URL such as 'https://login.example.com/realms/team' (no query or fragment)",
    "public_url": "a URL such as 'https://fabric.example.com' (no query or fragment)",
    "image": "a Docker image reference",
    "user": "a user such as '1000' or '1000:1000'",
    "cap_add": "a capability name such as 'CHOWN'",
}


def _pattern_message(path: KeyPath, instance: object, pattern: object) -> str:
    field = next((part for part in reversed(path) if isinstance(part, str)), "")
    meaning = _PATTERN_MEANINGS.get(field)
    if meaning is None:
        return f"{instance!r} does not match {pattern!r}"
    return f"{instance!r} is not {meaning}"
