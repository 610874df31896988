"""The container runtime interface the orchestrator depends on.

A runtime starts containers from a :class:`~reactor_fabric.policy.container_spec.ContainerSpec`
and hands back a :class:`Container`: a byte stream to the server's stdin, byte streams from its
stdout and stderr, and an id and a name to ask about its exit and to remove it by. How the bytes
travel (Docker's multiplexed attach socket, a Kubernetes attach WebSocket, pipes) stays inside
the runtime.

Implementations: :class:`~reactor_fabric.runtime.docker.DockerRuntime` (the real one; Podman's
Docker-compatible API too) and :class:`~reactor_fabric.runtime.memory.MemoryRuntime` (unit
tests: coroutines as servers, with backpressure and faults at every step).

Resource handling, the contract every runtime keeps: :meth:`Runtime.spawn` owns the pins it is
given (the spec's mount sources, pinned by descriptor: :mod:`reactor_fabric.policy.pinning`;
they travel beside the spec, which is plain data) and releases them once no engine call can
resolve them any more, whatever happens. It either returns a started container — whose streams
the caller closes (:meth:`Container.aclose`) and which the caller removes
(:meth:`Runtime.remove`) — or raises having removed whatever it created, also when it is
cancelled half-way (a create still running in a worker thread is removed, by the name the spec
gave it, once it completes). :meth:`Runtime.close` waits, bounded, for such abandoned work.

A spawn may be given a :data:`Gate`: what the server must find at its first instruction is
still being made (an isolated task's copy, filled in its directory already pinned). The
runtime creates the container meanwhile — and, where it can hold the server's command (socket
stdio: ``fabric-stdio --hold``), starts it too — and lets the server run only once the gate
returned. A gate that raises fails the start like any step: the container is removed, the
gate's error goes up.

Error handling: every failure is one of the product's errors — DockerUnavailable (-32001) when
the engine does not answer, ContainerStartFailure (-32002) for anything about one container.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from ..policy.container_parts.context import RuntimeCapabilities
from ..policy.container_spec import ContainerSpec
from ..policy.pinning import PinSet
from .child_sockets import ChildSockets
from .egress_proxy import EgressProxy

# Awaited before the server of a spawn runs (see the module's notes).
Gate = Callable[[], Awaitable[None]]


class StdinStream(Protocol):
    """The server's stdin: bytes in order; ``send_eof`` is how MCP asks a stdio server to stop."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None: ...

    async def send_eof(self) -> None: ...


class Container(Protocol):
    """A started container's identity and stdio."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def stdin(self) -> StdinStream: ...

    @property
    def stdout(self) -> trio.abc.ReceiveStream: ...

    @property
    def stderr(self) -> trio.abc.ReceiveStream: ...

    async def aclose(self) -> None:
        """Release the streams (the container itself is removed with Runtime.remove)."""


@dataclass(frozen=True)
class ContainerExit:
    """How a container ended (``exit_code`` is None while it still runs)."""

    exit_code: int | None
    oom_killed: bool
    error: str = ""


@dataclass(frozen=True)
class ManagedContainer:
    """A container labelled as ours, as the orphan sweeper sees it."""

    id: str
    name: str
    labels: dict[str, str]
    created: float  # seconds since the epoch


class Runtime(Protocol):
    name: str

    @property
    def capabilities(self) -> RuntimeCapabilities:
        """What it can give a container (egress, file secrets, child sessions, stdio, mounts
        made on this host), in one value: the composer of specs and the starter read it, so
        that what it cannot do is refused before anything is spawned
        (:func:`~reactor_fabric.policy.container_spec.compose`)."""

    # The servers a runtime needs run beside it, which whoever runs the orchestrator runs: not
    # a way to ask what it can do (that is `capabilities`).

    @property
    def egress(self) -> EgressProxy | None:
        """The proxy of containers with an egress allowlist (EgressProxy.run); None where the
        runtime has none."""

    @property
    def children(self) -> ChildSockets | None:
        """Agent containers' fabric sockets, their child sessions (ChildSockets.run); None
        where the runtime has none."""

    async def ping(self, *, time_bound: float | None = None) -> str:
        """The engine's version; raises DockerUnavailable when it does not answer."""

    async def verify_isolation(self, image: str, labels: dict[str, str]) -> None:
        """Check, where the runtime can be asked, that what ``capabilities`` says of gVisor
        holds for a container of ``image`` (labelled ``labels``), and say otherwise from now
        on; nothing where there is nothing to check."""

    async def image_id(self, image: str) -> str | None:
        """The id of ``image`` as the engine has it now; None when it does not have it."""

    async def spawn(
        self, spec: ContainerSpec, pins: PinSet | None = None, *, gate: Gate | None = None
    ) -> Container:
        """Create, attach and start; on failure or cancellation nothing is left behind.

        ``pins``: the spec's mount sources pinned (None where nothing pinned them: no mounts,
        the warm pool's staging binds, the catalog's probe); the container gets these
        descriptors, checked, and they are released here (see the module's notes). ``gate``:
        the server runs only once it returned (see the module's notes).
        """

    async def exit_status(self, container_id: str) -> ContainerExit: ...

    async def set_cpu_shares(self, container_id: str, shares: int) -> None:
        """Change a running container's CPU weight (runtimes without one ignore it)."""

    async def main_pid(self, container_id: str) -> int:
        """The host PID of the container's first process (0 if it does not run, or the runtime
        has none: the warm pool then checks no mounts through it)."""

    async def memory_usage(self, container_id: str) -> int | None:
        """A running container's memory in use, in bytes (page cache left out where the engine
        gives it), from the engine's stats; None when the runtime has no such figure."""

    async def remove(self, container: str, *, grace: float | None = None) -> None:
        """Stop (SIGTERM, SIGKILL after ``grace``; at once if None) and remove, by id or name.

        Never raises for a container that is already gone; logs and swallows other errors, since
        it runs in ``finally`` blocks whose own error must win.
        """

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[ManagedContainer]: ...

    async def close(self) -> None:
        """Wait (bounded) for work abandoned by cancellations, then release the client."""
