"""The orchestrator's settings and a fabric session's setup, as the unit tests write them: the
few things a test is about, the rest as a suite that does not mention them has them."""

from __future__ import annotations

import dataclasses
from typing import Any

from reactor_fabric.protocol.catalog import Catalog
from reactor_fabric.protocol.fabric_roster import Limits
from reactor_fabric.protocol.fabric_server import FabricServer
from reactor_fabric.protocol.fabric_setup import FabricSetup
from reactor_fabric.protocol.settings import Settings

SETTINGS_FIELDS = frozenset(field.name for field in dataclasses.fields(Settings))
# The session's bounds on its backends, each its own in a test (the settings give one for two).
BOUNDS = frozenset(field.name for field in dataclasses.fields(Limits))


def settings_with(**overrides: Any) -> Settings:
    """Settings with ``overrides``; a call's arguments hashed for the audit unless a test says
    otherwise (the fabric endpoint's tests read the hash in its records)."""
    return Settings(**{"audit_arguments": "hash", **overrides})


def fabric_setup(catalog: Catalog, session_id: str, **options: Any) -> FabricSetup:
    """A fabric session's setup: ``options`` are the settings' fields (:func:`settings_with`),
    the backends' bounds (``own_backlog_bytes``, ``buffer_to_server_bytes``,
    ``stall_timeout``: each alone) and the setup's own fields."""
    settings = {name: options.pop(name) for name in [*options] if name in SETTINGS_FIELDS}
    bounds = {name: options.pop(name) for name in [*options] if name in BOUNDS}
    for name, kind in (("active", frozenset), ("mount_targets", tuple)):
        if name in options:
            options[name] = kind(options[name])
    return FabricSetup(
        catalog,
        session_id,
        settings_with(**settings),
        limits=Limits(**bounds) if bounds else None,
        **options,
    )


def fabric_server(catalog: Catalog, session_id: str, **options: Any) -> FabricServer:
    """A fabric session's machine, made from :func:`fabric_setup`."""
    return FabricServer(fabric_setup(catalog, session_id, **options))
