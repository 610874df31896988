"""The orchestrator's shared state: the suite, the engine, and the live sessions.

One :class:`Fabric` exists per running orchestrator. It is owned by
:func:`~reactor_fabric.trio.serve.serve_orchestrator`, whose nursery owns every task that uses it,
and it is what a session sees of the orchestrator
(:class:`~reactor_fabric.trio.session.SessionHost`).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

import trio

from ..config.structs import Service, Suite
from ..policy.container_spec import ContainerIdentity, MountSpec
from ..policy.mounts import MountPolicy
from ..policy.origins import allowed_hosts, normalise_origins
from ..policy.owner import process_start_time
from ..runtime.base import ContainerBackend
from ..runtime.docker import hostname


def new_instance_id() -> str:
    """A random id for this orchestrator run, stamped on every container it creates."""
    return secrets.token_hex(8)


@dataclass
class Fabric:
    suite: Suite
    engine: ContainerBackend
    network: str
    listen_host: str = "127.0.0.1"
    instance_id: str = field(default_factory=new_instance_id)
    mount_policy: MountPolicy = field(init=False)
    allowed_origins: frozenset[str] = field(init=False)
    allowed_hosts: frozenset[str] | None = field(init=False)
    sessions: set[str] = field(default_factory=set)
    container_count: int = 0
    _identity: ContainerIdentity = field(init=False)

    def __post_init__(self) -> None:
        self.mount_policy = MountPolicy(self.suite.orchestrator.allowed_mount_roots)
        self.allowed_origins = normalise_origins(self.suite.orchestrator.allowed_origins)
        self.allowed_hosts = allowed_hosts(self.listen_host)
        pid = os.getpid()
        self._identity = ContainerIdentity(
            instance_id=self.instance_id,
            owner_host=hostname(),
            owner_pid=pid,
            owner_start=process_start_time(pid) or "",
            default_network=self.network,
        )

    # --- what sessions use (SessionHost) --------------------------------------------------

    @property
    def max_message_bytes(self) -> int:
        return self.suite.orchestrator.max_message_bytes

    @property
    def session_count(self) -> int:
        return len(self.sessions)

    def service(self, name: str) -> Service | None:
        return self.suite.mcp_services.get(name)

    def container_identity(self) -> ContainerIdentity:
        return self._identity

    async def validate_mounts(self, mounts: object) -> tuple[MountSpec, ...]:
        # Resolving paths touches the file system (which may be slow, e.g. NFS): in a thread.
        return await trio.to_thread.run_sync(self.mount_policy.validate, mounts)

    def admit(self, session_id: str) -> bool:
        if len(self.sessions) >= self.suite.orchestrator.max_sessions:
            return False
        self.sessions.add(session_id)
        return True

    def release(self, session_id: str) -> None:
        self.sessions.discard(session_id)

    def container_started(self) -> None:
        self.container_count += 1

    def container_stopped(self) -> None:
        self.container_count -= 1
