"""What every part of a container spec is decided from, besides the service: what the
container is started for, and by whom (:class:`SpecContext`, with the orchestrator's
:class:`~.ownership.ContainerIdentity`), on a runtime that can do what
(:class:`RuntimeCapabilities`); and the value a part answers with when the container must not
be started (:class:`SpecRefusal`). The parts, the composer and the runtimes all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..._errors import ContainerStartFailure
from ..accounts import UNPRIVILEGED, Account
from ..mount_spec import MountSpec
from .ownership import ContainerIdentity


@dataclass(frozen=True)
class RuntimeCapabilities:
    """What a runtime can give a container, stated by the runtime in this one value (its
    ``capabilities``) and read by the composer and the starter: never asked feature by feature.

    ``egress_missing`` and ``file_secrets_missing`` say why not, in the words the refused client
    reads (empty where the runtime can)."""

    # How containers' stdin and stdout reach the orchestrator: ``socket`` (a socket of their
    # own, no engine process on the way), ``attach`` (the engine's or the API server's attach),
    # ``memory``; ``""`` while not yet known (Docker decides on its first start).
    stdio: str
    # A container with an egress allowlist gets its proxy (else it is refused).
    egress_missing: str = ""
    # The service's secrets as files at /run/secrets (else such a service is refused).
    file_secrets_missing: str = ""
    # An agent's container gets a socket of ours for its child session (else it runs without).
    child_sessions: bool = False
    # A mount made on this host below a bind source with slave propagation appears in the
    # runtime's containers (the warm pool's staging area needs it).
    mounts_on_host_reach_containers: bool = False
    # The engine's runtime (Kubernetes: the RuntimeClass) that runs a container under gVisor;
    # "" where there is none, ``gvisor_missing`` saying why in the refused client's words.
    gvisor_runtime: str = ""
    gvisor_missing: str = "the runtime has no gVisor"

    @property
    def egress(self) -> bool:
        return not self.egress_missing

    @property
    def file_secrets(self) -> bool:
        return not self.file_secrets_missing

    @property
    def gvisor(self) -> bool:
        return bool(self.gvisor_runtime)


@dataclass(frozen=True)
class SpecContext:
    """What a container is started for, as every part reads it.

    ``session_id``: the session's ("" for a pooled container); ``sequence`` counts the
    containers a session has had, so that each gets a distinct, recognisable name; ``account``
    is who the server runs as unless the suite names a ``user``; ``child_token``: an agent's
    container that reaches a child session; ``pool_token``: a warm pool's container, created
    before any session; ``probe_token``: the catalog's probe container (no network)."""

    service_name: str
    identity: ContainerIdentity
    capabilities: RuntimeCapabilities
    session_id: str = ""
    mounts: tuple[MountSpec, ...] = ()
    account: Account = UNPRIVILEGED
    sequence: int = 0
    child_token: str | None = None
    pool_token: int | None = None
    probe_token: str | None = None


@dataclass(frozen=True)
class SpecRefusal:
    """Why a container must not be started: its reason (a constant of ``_reasons``) and what
    the client reads. Decided by a part before anything is spawned."""

    service: str
    reason: str
    message: str

    def error(self) -> ContainerStartFailure:
        """The error the session is answered with (-32002, this reason)."""
        return ContainerStartFailure(self.message, reason=self.reason, service=self.service)
