"""The container runtime interface the orchestrator depends on.

Implementations: :class:`~reactor_fabric.runtime.docker.DockerEngine` (the real one) and the
in-memory fake used by unit tests. Podman and Kubernetes backends would implement the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import trio

from ..policy.container_spec import ContainerSpec


@dataclass
class SpawnedContainer:
    """A started container and the stream attached to its stdio.

    The stream carries Docker's multiplexed framing (see :mod:`._stdio_framing`); its half-close
    (``send_eof``) closes the server's stdin.
    """

    id: str
    name: str
    stream: trio.abc.HalfCloseableStream


@dataclass(frozen=True)
class ContainerExit:
    """How a container ended (``exit_code`` is None while it still runs)."""

    exit_code: int | None
    oom_killed: bool
    error: str


class ContainerBackend(Protocol):
    async def ping(self, *, time_bound: float | None = None) -> str:
        """The engine's version; raises DockerUnavailable when it does not answer."""

    async def spawn(self, spec: ContainerSpec) -> SpawnedContainer:
        """Create, attach and start; raise ContainerStartFailure/DockerUnavailable, leak nothing."""

    async def exit_status(self, container_id: str) -> ContainerExit: ...

    async def remove(self, container_id: str) -> None:
        """Stop and remove; never raises for a container that is already gone."""

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]: ...

    async def close(self) -> None: ...
