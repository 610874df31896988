"""The fake's core/v1 Secrets: a create request as kube-apiserver admits it (decoding,
defaulting, validation; pure) and the store the API and the kubelet share.

Admission follows the API server: ``data`` is a map of base64 strings (Go decodes ``[]byte``
fields with standard, padded base64: anything else is a 400 before validation, as the JSON
decoder refuses it); ``stringData`` is merged into ``data`` (its keys win) and not stored;
``type`` defaults to ``Opaque``; the name must be a DNS subdomain and each key a valid config
key (422 Invalid, field ``data[KEY]``). What the fake does not validate it refuses: the
built-in ``kubernetes.io/*`` types (each has required keys the fake does not check) and
finalizers.

Every change takes the next resourceVersion from the pods' store (one counter, as etcd's
revision is); Secrets have no watch. :meth:`SecretStore.changed_since` wakes the kubelet, which
retries a pod waiting for a Secret or a key, as a kubelet does on its next sync.
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
import secrets
import string
import uuid
from collections.abc import Mapping
from typing import Any, Final

import trio

from .api import (
    DNS1123_SUBDOMAIN,
    DNS1123_SUBDOMAIN_MESSAGE,
    LABEL_VALUE_MESSAGE,
    Cause,
    already_exists,
    bad_request,
    forbidden,
    invalid,
    invalid_value,
    label_key_errors,
    label_value_ok,
    not_found,
    timestamp,
)
from .pods import PodStore, Selection

FAKE: Final = "not supported by the fake API server (tests/kube_fake)"
_CONFIG_KEY: Final = re.compile(r"[-._a-zA-Z0-9]+")
CONFIG_KEY_MESSAGE: Final = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
    "'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is "
    "'[-._a-zA-Z0-9]+')"
)
_BASE64: Final = frozenset(string.ascii_letters + string.digits + "+/")
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
_SERVER_OWNED: Final = (
    "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink",
)  # fmt: skip
_CANNOT: Final = 'Secret in version "v1" cannot be handled as a Secret'


def config_key_errors(key: str) -> list[str]:
    """validation.IsConfigMapKey: what is wrong with ``key`` as a Secret's (or ConfigMap's)."""
    problems = []
    if len(key) > 253:
        problems.append("must be no more than 253 characters")
    if not _CONFIG_KEY.fullmatch(key):
        problems.append(CONFIG_KEY_MESSAGE)
    if key == ".":
        problems.append("must not be '.'")
    elif key == "..":
        problems.append("must not be '..'")
    elif key.startswith(".."):
        problems.append("must not start with '..'")
    return problems


def decode_base64(text: str) -> bytes:
    """``text`` as Go's encoding/json decodes a ``[]byte`` (base64.StdEncoding, which skips
    ``\\r`` and ``\\n``). Error handling: raises 400 with the decoder's message."""
    compact = text.replace("\r", "").replace("\n", "")
    bad = next((i for i, char in enumerate(compact) if char not in _BASE64 and char != "="), None)
    if bad is None and len(compact) % 4:
        bad = len(compact) - len(compact) % 4
    if bad is None:
        try:
            return base64.b64decode(compact, validate=True)
        except binascii.Error:
            # Padding too early: Go points past it (trailing garbage), or at it.
            first = compact.find("=")
            after = len(compact) - len(compact[first:].lstrip("="))
            bad = after if after < len(compact) else first
    raise bad_request(f"{_CANNOT}: illegal base64 data at input byte {max(bad, 0)}")


_JSON_TYPES: Final = {dict: "object", list: "array", bool: "bool", int: "number", float: "number"}


def _string_map(value: object, field: str, go_type: str) -> dict[str, str]:
    """``value`` as a map of strings (absent: empty); else the JSON decoder's 400."""
    if value is None:
        return {}
    values = value.values() if isinstance(value, dict) else [value]
    wrong = [v for v in values if not isinstance(v, str)]
    if wrong:
        found = _JSON_TYPES.get(type(wrong[0]), "null")
        raise bad_request(
            f"{_CANNOT}: json: cannot unmarshal {found} into Go struct field {field} of type "
            f"{go_type}"
        )
    assert isinstance(value, dict)
    return value


def admit_secret(body: object, *, namespace: str) -> dict[str, Any]:
    """The Secret to store for ``POST /api/v1/namespaces/{namespace}/secrets`` with ``body``.

    Error handling: raises :class:`~.api.ApiError` (400 or 422).
    """
    if not isinstance(body, dict):
        raise bad_request(
            "the object provided is unrecognized (must be of type Secret): couldn't get "
            "version/kind; json parse error: expected a JSON object"
        )
    if body.get("kind") != "Secret" or body.get("apiVersion") != "v1":
        raise bad_request(
            f"the API version in the data ({body.get('apiVersion')}) and kind "
            f"({body.get('kind')}) do not match the expected v1 Secret"
        )
    secret = copy.deepcopy(body)
    metadata = secret.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise bad_request(f"{_CANNOT}: json: cannot unmarshal into Go struct field metadata")
    if metadata.get("namespace") and metadata["namespace"] != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    for key in ("labels", "annotations"):
        _string_map(metadata.get(key), f"ObjectMeta.metadata.{key}", "map[string]string")
    name = metadata.get("name") or ""
    generate = metadata.get("generateName")
    if not isinstance(name, str) or not isinstance(generate, str | None):
        raise bad_request(f"{_CANNOT}: json: cannot unmarshal into Go struct field name")
    if not name and generate:
        name = generate[:58] + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
    for key in _SERVER_OWNED:
        metadata.pop(key, None)
    metadata |= {
        "name": name,
        "namespace": namespace,
        "uid": str(uuid.uuid4()),
        "creationTimestamp": timestamp(),
    }
    secret["metadata"] = metadata
    data = {
        key: decode_base64(value)
        for key, value in _string_map(secret.get("data"), "Secret.data", "[]uint8").items()
    }
    data |= {
        key: value.encode()
        for key, value in _string_map(
            secret.pop("stringData", None), "Secret.stringData", "string"
        ).items()
    }
    kind = secret.get("type") or "Opaque"
    if not isinstance(kind, str):
        raise bad_request(f"{_CANNOT}: json: cannot unmarshal into Go struct field Secret.type")
    secret["type"] = kind
    if data:
        # Stored and shown canonically, as the API server re-encodes the bytes it decoded.
        secret["data"] = {key: base64.b64encode(value).decode() for key, value in data.items()}
    else:
        secret.pop("data", None)
    causes = _validate(secret, data)
    if causes:
        raise invalid(name, causes, kind="Secret")
    return secret


def _validate(secret: dict[str, Any], data: Mapping[str, bytes]) -> list[Cause]:
    causes: list[Cause] = []
    metadata = secret["metadata"]
    name = metadata["name"]
    if not name:
        causes.append(
            Cause(
                "FieldValueRequired",
                "metadata.name",
                "Required value: name or generateName is required",
            )
        )
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        causes.append(invalid_value("metadata.name", name, DNS1123_SUBDOMAIN_MESSAGE))
    for key, value in (metadata.get("labels") or {}).items():
        causes += label_key_errors("metadata.labels", key)
        if not label_value_ok(value):
            causes.append(invalid_value("metadata.labels", value, LABEL_VALUE_MESSAGE))
    if metadata.get("finalizers"):
        causes.append(
            forbidden("metadata.finalizers", f"finalizers are {FAKE}: nothing would remove them")
        )
    for key in data:
        causes += [invalid_value(f"data[{key}]", key, why) for why in config_key_errors(key)]
    if secret["type"].startswith("kubernetes.io/"):
        causes.append(
            forbidden("type", f"the built-in type {secret['type']} is {FAKE} (only Opaque)")
        )
    immutable = secret.get("immutable")
    if immutable is not None and not isinstance(immutable, bool):
        causes.append(invalid_value("immutable", immutable, "must be a boolean"))
    return causes


def deleted_status(secret: Mapping[str, Any]) -> dict[str, Any]:
    """What DELETE answers for an object deleted at once (no graceful deletion): a Status."""
    meta = secret["metadata"]
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": meta["name"], "kind": "secrets", "uid": meta["uid"]},
    }


class SecretStore:
    """The Secrets of the fake's namespace (as the API shows them, ``data`` in base64)."""

    def __init__(self, pods: PodStore) -> None:
        self.namespace = pods.namespace
        self.secrets: dict[str, dict[str, Any]] = {}
        self._pods = pods
        # Counts the changes: a reader notes it before it reads, then waits for a change
        # after that (none is missed while it works on what it read).
        self.generation = 0
        self._changed = trio.Event()

    def get(self, name: str) -> dict[str, Any] | None:
        found = self.secrets.get(name)
        return copy.deepcopy(found) if found is not None else None

    def data(self, name: str) -> dict[str, bytes] | None:
        """The decoded data of Secret ``name``; None when there is no such Secret."""
        found = self.secrets.get(name)
        if found is None:
            return None
        return {key: base64.b64decode(value) for key, value in (found.get("data") or {}).items()}

    def add(self, secret: dict[str, Any]) -> dict[str, Any]:
        name = secret["metadata"]["name"]
        if name in self.secrets:
            raise already_exists(name, "secrets")
        self._pods.next_resource_version(secret)
        self.secrets[name] = secret
        self._notify()
        return copy.deepcopy(secret)

    def remove(self, name: str) -> dict[str, Any]:
        secret = self.secrets.pop(name, None)
        if secret is None:
            raise not_found("secrets", name)
        self._pods.next_resource_version(secret)
        self._notify()
        return secret

    def listing(self, selection: Selection) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(secret)
            for _, secret in sorted(self.secrets.items())
            if selection.matches(secret)
        ]

    def _notify(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = trio.Event()

    async def changed_since(self, generation: int) -> None:
        """Return once any Secret changed after ``generation`` (at once if one did)."""
        while self.generation == generation:
            await self._changed.wait()
