"""An in-memory container backend, for fast deterministic tests of everything above Docker.

Each "container" runs a Python coroutine (the *server*) in the backend's own nursery, connected
to the relay through trio memory streams that speak exactly what Docker's attach stream speaks:
raw bytes towards the server's stdin (half-close = EOF on stdin), Docker's multiplexed frames
from its stdout and stderr. So the relay runs the same code path as against a real engine.

It keeps the books a leak test needs: every spec spawned, the containers still alive, and
whether any were removed twice or never.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

from .._errors import FabricError
from ..policy.container_spec import LABEL_MANAGED, ContainerSpec
from ..protocol.framing import STDERR, STDOUT, LineSplitter, docker_frame
from .base import ContainerExit, SpawnedContainer


@dataclass
class FakeContainer:
    """The server's side of one in-memory container."""

    id: str
    spec: ContainerSpec
    stream: trio.abc.HalfCloseableStream
    exit_code: int | None = None
    oom_killed: bool = False
    removed: bool = False
    stdin_lines: list[bytes] = field(default_factory=list)
    _splitter: LineSplitter = field(default_factory=lambda: LineSplitter(max_line=1 << 24))
    _backlog: list[bytes] = field(default_factory=list)
    _write_lock: trio.Lock = field(default_factory=trio.Lock)
    _scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    async def read_line(self) -> bytes | None:
        """The next line the relay wrote to stdin, or None at EOF."""
        while not self._backlog:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return None  # the process has exited (see `exit`)
            if not data:
                return None
            self._backlog.extend(self._splitter.feed(bytes(data)))
        line = self._backlog.pop(0)
        self.stdin_lines.append(line)
        return line

    async def write_stdout(self, data: bytes) -> None:
        async with self._write_lock:
            await self.stream.send_all(docker_frame(STDOUT, data))

    async def write_stderr(self, data: bytes) -> None:
        async with self._write_lock:
            await self.stream.send_all(docker_frame(STDERR, data))

    async def exit(self, code: int) -> None:
        """The server process ends: its output stream closes."""
        self.exit_code = code
        await self.stream.aclose()


Server = Callable[[FakeContainer], Awaitable[None]]


class MemoryEngine:
    """A :class:`~reactor_fabric.runtime.base.ContainerBackend` whose containers are coroutines."""

    def __init__(self, nursery: trio.Nursery, server: Server) -> None:
        self._nursery = nursery
        self.server = server
        self.spawned: list[ContainerSpec] = []
        self.containers: dict[str, FakeContainer] = {}
        self.removals: list[str] = []
        # Set to make the next spawns fail, as Docker would (image missing, engine down...).
        self.spawn_error: FabricError | None = None
        self.ping_error: FabricError | None = None
        self._ids = itertools.count(1)

    @property
    def alive(self) -> list[FakeContainer]:
        """Containers created and not removed: after a session ends this must be empty."""
        return [c for c in self.containers.values() if not c.removed]

    async def ping(self, *, time_bound: float | None = None) -> str:
        await trio.lowlevel.checkpoint()
        if self.ping_error is not None:
            raise self.ping_error
        return "memory"

    async def spawn(self, spec: ContainerSpec) -> SpawnedContainer:
        await trio.lowlevel.checkpoint()  # "create"
        if self.spawn_error is not None:
            raise self.spawn_error
        container_id = f"mem{next(self._ids):061d}"
        relay_side, server_side = trio.testing.memory_stream_pair()
        container = FakeContainer(container_id, spec, server_side)
        self.containers[container_id] = container
        self.spawned.append(spec)
        try:
            await trio.lowlevel.checkpoint()  # "attach" and "start"
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.remove(container_id)
            raise
        self._nursery.start_soon(self._run, container)
        return SpawnedContainer(id=container_id, name=spec.name, stream=relay_side)

    async def _run(self, container: FakeContainer) -> None:
        with container._scope:
            try:
                await self.server(container)
            finally:
                if container.exit_code is None:
                    container.exit_code = 0
                with trio.CancelScope(shield=True):
                    await container.stream.aclose()

    async def exit_status(self, container_id: str) -> ContainerExit:
        await trio.lowlevel.checkpoint()
        container = self.containers[container_id]
        return ContainerExit(container.exit_code, container.oom_killed, "")

    async def remove(self, container_id: str) -> None:
        await trio.lowlevel.checkpoint()
        container = self.containers.get(container_id)
        self.removals.append(container_id)
        if container is None or container.removed:
            return
        container.removed = True
        container._scope.cancel()
        if container.exit_code is None:
            container.exit_code = 137  # killed

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        await trio.lowlevel.checkpoint()
        wanted = {LABEL_MANAGED: "true", **(extra_labels or {})}
        return [
            {"Id": c.id, "Labels": c.spec.labels, "Created": 0}
            for c in self.alive
            if all(c.spec.labels.get(k) == v for k, v in wanted.items())
        ]

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def open_memory_engine(server: Server) -> AsyncIterator[MemoryEngine]:
    """A MemoryEngine whose server tasks live in a nursery that ends with the block."""
    async with trio.open_nursery() as nursery:
        engine = MemoryEngine(nursery, server)
        try:
            yield engine
        finally:
            for container in engine.containers.values():
                container._scope.cancel()
