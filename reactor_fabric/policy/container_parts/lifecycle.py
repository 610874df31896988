"""The lifecycle part: a container's name and labels — its owner's (:mod:`.ownership`) and
what it is for: a session's service, the warm pool's (no session yet), the catalog's probe.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config.structs import Service
from .context import SpecContext
from .ownership import LABEL_POOLED, LABEL_SERVICE, LABEL_SESSION


@dataclass(frozen=True)
class LifecyclePart:
    name: str
    labels: dict[str, str]


def lifecycle(service: Service, context: SpecContext) -> LifecyclePart:
    """A session's container: ``rf-SERVICE-SESSION12-SEQUENCE``, labelled with its session
    and service; a pooled one: ``rf-SERVICE-pool-INSTANCE8-TOKEN``, labelled as pooled (no
    session yet); the catalog's probe: ``rf-catalog-SERVICE-TOKEN``."""
    name = context.service_name
    labels = context.identity.labels()
    if context.pool_token is not None:
        labels[LABEL_SERVICE] = name
        labels[LABEL_POOLED] = "true"
        instance = context.identity.instance_id[:8]
        return LifecyclePart(f"rf-{name}-pool-{instance}-{context.pool_token}", labels)
    labels[LABEL_SESSION] = context.session_id
    labels[LABEL_SERVICE] = name
    if context.probe_token is not None:
        return LifecyclePart(f"rf-catalog-{name}-{context.probe_token}", labels)
    return LifecyclePart(f"rf-{name}-{context.session_id[:12]}-{context.sequence}", labels)
