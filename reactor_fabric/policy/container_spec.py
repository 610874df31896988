"""What a session's container looks like, decided without talking to an engine.

A :class:`ContainerSpec` is composed of parts, one per service option, each decided by a pure
function of its own module in :mod:`.container_parts` — ``(service, context) -> part`` or a
:class:`~.container_parts.context.SpecRefusal`:

- :mod:`~.container_parts.lifecycle` — the name and the lifecycle and ownership labels;
- :mod:`~.container_parts.program` — image, command, pull, user, the environment and config;
- :mod:`~.container_parts.mounts` — the session's validated mounts (or the pool's staging);
- :mod:`~.container_parts.network` — the network joined (none with egress);
- :mod:`~.container_parts.resources` — memory, CPU and process limits, the CPU weight;
- :mod:`~.container_parts.confinement` — capabilities, no new privileges, read-only root;
- :mod:`~.container_parts.secrets` — the secrets, as variables and files (may refuse);
- :mod:`~.container_parts.egress` — the egress allowlist and its proxy (may refuse);
- :mod:`~.container_parts.child_session` — an agent's child session;
- :mod:`~.container_parts.isolation` — runc or gVisor (may refuse).

:func:`compose` builds the spec from them and returns the first refusal instead, before
anything is spawned: a part that needs what the runtime cannot do reads it from the
:class:`~.container_parts.context.RuntimeCapabilities` in its context, so no runtime checks it
again. Each runtime realises each part in one place (``runtime/docker_payload.py``,
``runtime/kubernetes_manifests.py``: one function per part, named after it). Adding a service
option: docs/DEVELOPMENT.md, "Adding a service option".

Pure, so the security-relevant choices are unit-tested without an engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..config.secrets import Secret
from ..config.structs import Service
from .accounts import UNPRIVILEGED, Account
from .container_parts.child_session import ChildSessionPart, child_session
from .container_parts.confinement import ConfinementPart, confinement
from .container_parts.context import RuntimeCapabilities, SpecContext, SpecRefusal
from .container_parts.egress import EgressPart, egress
from .container_parts.isolation import IsolationPart, isolation
from .container_parts.lifecycle import LifecyclePart, lifecycle
from .container_parts.mounts import mounts
from .container_parts.network import network
from .container_parts.ownership import ContainerIdentity
from .container_parts.program import ProgramPart, program
from .container_parts.resources import ResourcesPart, resources
from .container_parts.secrets import SecretsPart, file_delivery, secrets, server_account
from .mount_spec import MountSpec


@dataclass(frozen=True)
class ContainerSpec:
    """A container as the parts decided it (each field is one part, named after its module);
    the properties read them as the runtimes and the tests ask."""

    lifecycle: LifecyclePart
    program: ProgramPart
    mounts: tuple[MountSpec, ...]
    network: str
    resources: ResourcesPart
    confinement: ConfinementPart
    secrets: SecretsPart
    egress: EgressPart | None = None
    child_session: ChildSessionPart | None = None
    isolation: IsolationPart = field(default_factory=IsolationPart)

    @property
    def name(self) -> str:
        return self.lifecycle.name

    @property
    def labels(self) -> dict[str, str]:
        return self.lifecycle.labels

    @property
    def image(self) -> str:
        return self.program.image

    @property
    def command(self) -> list[str] | None:
        return self.program.command

    @property
    def pull(self) -> str:
        return self.program.pull

    @property
    def user(self) -> str | None:
        return self.program.user

    @property
    def environment(self) -> dict[str, str]:
        """The container's whole environment: the program's, then the egress proxy's, the
        secrets', the child session's and the isolation's variables (the last, so that nothing
        takes gVisor's mark away)."""
        environment = dict(self.program.environment)
        if self.egress is not None:
            environment |= self.egress.environment
        environment |= self.secrets.environment
        if self.child_session is not None:
            environment |= self.child_session.environment
        return environment | self.isolation.environment

    @property
    def memory_bytes(self) -> int:
        return self.resources.memory_bytes

    @property
    def nano_cpus(self) -> int:
        return self.resources.nano_cpus

    @property
    def pids_limit(self) -> int:
        return self.resources.pids_limit

    @property
    def cpu_shares(self) -> int | None:
        return self.resources.cpu_shares

    @property
    def cap_add(self) -> tuple[str, ...]:
        return self.confinement.cap_add

    @property
    def no_new_privileges(self) -> bool:
        return self.confinement.no_new_privileges

    @property
    def read_only_rootfs(self) -> bool:
        return self.confinement.read_only_rootfs

    @property
    def tmpfs(self) -> dict[str, str]:
        return self.confinement.tmpfs

    @property
    def runtime(self) -> str | None:
        """The engine's runtime (Kubernetes: the RuntimeClass) to run it with; None: the
        default."""
        return self.isolation.runtime

    @property
    def secret_files(self) -> tuple[Secret, ...]:
        """The secrets delivered as files (see reactor_fabric.runtime.secret_files)."""
        return self.secrets.files

    @property
    def child_fabric(self) -> bool:
        """An agent's container with a child session (its runtime binds it a socket)."""
        return self.child_session is not None


def compose(service: Service, context: SpecContext) -> ContainerSpec | SpecRefusal:
    """The spec of ``service``'s container in ``context``, or the first refusal of its parts.

    The server's account is decided first (a service with secrets runs as theirs), since the
    program and its environment follow it."""
    context = dataclasses.replace(context, account=server_account(service, context))
    secrets_part = secrets(service, context)
    if isinstance(secrets_part, SpecRefusal):
        return secrets_part
    egress_part = egress(service, context)
    if isinstance(egress_part, SpecRefusal):
        return egress_part
    undeliverable = file_delivery(secrets_part, context)
    if undeliverable is not None:
        return undeliverable
    isolation_part = isolation(service, context)
    if isinstance(isolation_part, SpecRefusal):
        return isolation_part
    return ContainerSpec(
        lifecycle=lifecycle(service, context),
        program=program(service, context),
        mounts=mounts(service, context),
        network=network(service, context),
        resources=resources(service, context),
        confinement=confinement(service, context),
        secrets=secrets_part,
        egress=egress_part,
        child_session=child_session(service, context),
        isolation=isolation_part,
    )


def spec_for(service: Service, context: SpecContext) -> ContainerSpec:
    """:func:`compose`, a refusal raised as the ContainerStartFailure (-32002) the session is
    answered with."""
    composed = compose(service, context)
    if isinstance(composed, SpecRefusal):
        raise composed.error()
    return composed


def container_spec_for(
    service_name: str,
    service: Service,
    *,
    session_id: str,
    identity: ContainerIdentity,
    capabilities: RuntimeCapabilities,
    mounts: tuple[MountSpec, ...] = (),
    account: Account = UNPRIVILEGED,
    sequence: int = 0,
    child_token: str | None = None,
) -> ContainerSpec:
    """The container for ``service_name`` in session ``session_id`` on a runtime that can do
    ``capabilities`` (see :class:`~.container_parts.context.SpecContext` for the rest);
    ContainerStartFailure if it is refused."""
    context = SpecContext(
        service_name,
        identity,
        capabilities,
        session_id=session_id,
        mounts=mounts,
        account=account,
        sequence=sequence,
        child_token=child_token,
    )
    return spec_for(service, context)


def pooled_spec_for(
    service_name: str,
    service: Service,
    *,
    token: int,
    identity: ContainerIdentity,
    capabilities: RuntimeCapabilities,
    staging: tuple[MountSpec, ...] = (),
    account: Account = UNPRIVILEGED,
) -> ContainerSpec:
    """A warm pool container of ``service_name``: what a session's container would be with
    ``account`` (image, command, environment, limits, network, user), but created before any
    session, so labelled as pooled rather than with a session, named after its pool ``token``,
    with the staging binds (see :mod:`reactor_fabric.runtime.staging`) as its mounts, and the
    lowest CPU weight until it is handed out (``POOLED_CPU_SHARES``)."""
    context = SpecContext(
        service_name, identity, capabilities, mounts=staging, account=account, pool_token=token
    )
    return spec_for(service, context)


def probe_spec_for(
    service_name: str,
    service: Service,
    *,
    session_id: str,
    token: str,
    identity: ContainerIdentity,
    capabilities: RuntimeCapabilities,
) -> ContainerSpec:
    """The catalog's probe container of ``service_name``: no mount, no network, unprivileged,
    named after its ``token``."""
    context = SpecContext(
        service_name, identity, capabilities, session_id=session_id, probe_token=token
    )
    return spec_for(service, context)
