"""The isolation part: which runtime runs the container — the engine's default (runc) or
gVisor (runsc on Docker and Podman, a RuntimeClass on Kubernetes) — as the service asks
(``isolation``) and the runtime can (:attr:`RuntimeCapabilities.gvisor_runtime`).

``gvisor`` is a requirement: where the runtime has no gVisor the container is refused
(``isolation_unavailable``), never started under runc. ``prefer-gvisor`` (an agent's default)
takes gVisor where there is one and runc where not; the orchestrator says which at its start
(``isolation`` in the log, and in ``get_status``).

Under gVisor a mount made on the host after the container started is not reliably seen in it
(a directory bound below a propagating bind source fails ``stat`` inside: measured with runsc
20221219), so a warm pool's container of such a service serves only sessions without mounts
(:mod:`reactor_fabric.trio.warm_pool`).

A gVisor container also carries ``REACTOR_FABRIC_ISOLATION=gvisor`` in its environment (a name a
suite cannot set: :mod:`reactor_fabric.config.suite`). Podman's API drops the runtime a
container names; on Podman the runtime that honours the mark instead is ``deploy/podman/
oci-dispatch`` (the engine's default, :data:`DISPATCHING_RUNTIME`), and the program in the
container may read which kernel it meets from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..._reasons import ISOLATION_UNAVAILABLE
from ...config.structs import Service
from ...config.suite import ISOLATION_ENV
from .context import RuntimeCapabilities, SpecContext, SpecRefusal

RUNC: Literal["runc"] = "runc"
GVISOR: Literal["gvisor"] = "gvisor"

# The name of Podman's runtime that reads ISOLATION_ENV (deploy/podman/oci-dispatch).
DISPATCHING_RUNTIME = "reactor-fabric-dispatch"


@dataclass(frozen=True)
class IsolationPart:
    """``kind``: what the container runs under; ``runtime``: the engine's runtime (or the
    RuntimeClass) naming it, None for the engine's default."""

    kind: Literal["runc", "gvisor"] = RUNC
    runtime: str | None = None

    @property
    def environment(self) -> dict[str, str]:
        """The mark a gVisor container carries (none under runc)."""
        return {ISOLATION_ENV: GVISOR} if self.kind == GVISOR else {}


def resolved_isolation(service: Service, capabilities: RuntimeCapabilities) -> str:
    """What ``service``'s containers run under on a runtime with ``capabilities``: ``runc``,
    ``gvisor``, or ``unavailable`` (it asks for gVisor and there is none)."""
    wanted = service.isolation_in_force
    if wanted == RUNC:
        return RUNC
    if capabilities.gvisor:
        return GVISOR
    return "unavailable" if wanted == GVISOR else RUNC


def isolation(service: Service, context: SpecContext) -> IsolationPart | SpecRefusal:
    """The runtime of ``service``'s container, or why it must not start."""
    capabilities = context.capabilities
    resolved = resolved_isolation(service, capabilities)
    if resolved == GVISOR:
        return IsolationPart(GVISOR, capabilities.gvisor_runtime)
    if resolved == RUNC:
        return IsolationPart()
    name = context.service_name
    message = f"service {name!r} asks for isolation: gvisor, and {capabilities.gvisor_missing}"
    return SpecRefusal(name, ISOLATION_UNAVAILABLE, message)
