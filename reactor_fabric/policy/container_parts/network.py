"""The network part: which network the container joins.

A service with an egress allowlist has none (its proxy, :mod:`.egress`, is its only way out:
even an empty list means no network at all); the catalog's probe has none (it only answers the
probe); else the service's ``network``, or the orchestrator's default.
"""

from __future__ import annotations

from ...config.structs import Service
from .context import SpecContext


def network(service: Service, context: SpecContext) -> str:
    """The network's name (``none``: no network)."""
    if service.egress_in_force is not None or context.probe_token is not None:
        return "none"
    return service.network or context.identity.default_network
