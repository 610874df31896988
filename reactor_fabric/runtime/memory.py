"""An in-memory container runtime, for fast deterministic tests of everything above it.

Each "container" runs a Python coroutine (the *server*) in the runtime's own nursery, connected
to the relay by bounded byte pipes: stdin, stdout and stderr, exactly the streams a real
runtime's container has. The pipes apply backpressure (a server that does not read its stdin
stalls the writer once ``stdin_capacity`` bytes wait), and every step of the runtime can be made
slow, failing or hanging (:meth:`MemoryRuntime.fault`), so the tests can reach the races a real
engine produces: a spawn outliving its session, a removal that takes its time, a create that
never returns.

Like the Docker runtime's worker threads, a create runs on its own: when the spawn that asked for
it is cancelled, the create still completes, and then removes its container by name.

It keeps the books a leak test needs: every spec spawned (and the pins each spawn was given),
every removal, and the containers that were created and never removed
(:attr:`MemoryRuntime.alive`).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
import trio.testing

from .._errors import ContainerStartFailure, FabricError, SecurityViolation
from .._reasons import CREATE_FAILED, INSPECT_FAILED, MOUNT_TARGET_IN_IMAGE
from ..policy.container_parts.context import RuntimeCapabilities
from ..policy.container_parts.ownership import LABEL_MANAGED
from ..policy.container_spec import ContainerSpec
from ..policy.pinning import PinSet
from ..protocol.framing import LineSplitter
from .base import ContainerExit, Gate, ManagedContainer
from .child_sockets import ChildSockets

# "verify" is the check, after start, that the container got the pinned mounts (only when pinned).
STEPS = (
    "create",
    "attach",
    "start",
    "verify",
    "exit_status",
    "pid",
    "update",
    "remove",
    "ping",
    "list",
)


class Pipe:
    """A one-way byte pipe bounded at ``capacity`` bytes waiting to be read."""

    def __init__(self, capacity: int) -> None:
        self._buffer = bytearray()
        self._capacity = capacity
        self._eof = False  # the writer is done
        self._broken = False  # the reader is gone
        self._sending = False  # a send_all is under way (it may be waiting for room)
        self._changed = trio.Event()
        self.sender = _PipeSender(self)
        self.receiver = _PipeReceiver(self)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _send_if_idle(self, data: bytes) -> int | None:
        """What a socket's non-blocking write does: take what fits now (maybe part, maybe
        nothing), unless a send is under way or the pipe is closed (None)."""
        if self._sending or self._broken or self._eof:
            return None
        taken = data[: max(0, self._capacity - len(self._buffer))]
        if taken:
            self._buffer += taken
            self._notify()
        return len(taken)

    async def _send(self, data: bytes | bytearray | memoryview) -> None:
        self._sending = True
        try:
            await self._send_all(data)
        finally:
            self._sending = False

    async def _send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(bytes(data))
        waited = False
        while view:
            if self._broken:
                raise trio.BrokenResourceError("the reading end is closed")
            if self._eof:
                raise trio.ClosedResourceError("this end was closed")
            room = self._capacity - len(self._buffer)
            if room <= 0:
                await self._changed.wait()
                waited = True
                continue
            self._buffer += view[:room]
            view = view[room:]
            self._notify()
        if not waited:
            await trio.lowlevel.checkpoint()

    async def _receive(self, max_bytes: int | None) -> bytes:
        waited = False
        while not self._buffer:
            if self._broken:
                raise trio.ClosedResourceError("this end was closed")
            if self._eof:
                if not waited:
                    await trio.lowlevel.checkpoint()
                return b""
            await self._changed.wait()
            waited = True
        if not waited:
            await trio.lowlevel.checkpoint()
        size = len(self._buffer) if max_bytes is None else min(max_bytes, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._notify()
        return data

    def close_sender(self) -> None:
        self._eof = True
        self._notify()

    def close_receiver(self) -> None:
        self._broken = True
        self._buffer.clear()
        self._notify()


class _PipeSender(trio.abc.SendStream):
    def __init__(self, pipe: Pipe) -> None:
        self._pipe = pipe

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._pipe._send(data)

    def send_if_idle(self, data: bytes) -> int | None:
        """(see :func:`reactor_fabric._sockets.send_now_if_idle`)"""
        return self._pipe._send_if_idle(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        self._pipe.close_sender()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._pipe.close_sender()
        await trio.lowlevel.checkpoint()


class _PipeReceiver(trio.abc.ReceiveStream):
    def __init__(self, pipe: Pipe) -> None:
        self._pipe = pipe

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self._pipe._receive(max_bytes)

    async def aclose(self) -> None:
        self._pipe.close_receiver()
        await trio.lowlevel.checkpoint()


@dataclass
class MemoryServer:
    """The server's side of one in-memory container: what a fake server coroutine uses."""

    id: str
    spec: ContainerSpec
    stdin: Pipe
    stdout: Pipe
    stderr: Pipe
    exit_code: int | None = None
    oom_killed: bool = False
    removed: bool = False
    started: bool = False
    stdin_lines: list[bytes] = field(default_factory=list)
    children: ChildSockets | None = None
    _splitter: LineSplitter = field(default_factory=lambda: LineSplitter(max_line=1 << 26))
    _backlog: list[bytes] = field(default_factory=list)
    _scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def name(self) -> str:
        return self.spec.name

    async def read_line(self) -> bytes | None:
        """The next line the relay wrote to stdin, or None at EOF."""
        while not self._backlog:
            try:
                data = await self.stdin.receiver.receive_some(65536)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return None
            if not data:
                return None
            self._backlog.extend(self._splitter.feed(data))
        line = self._backlog.pop(0)
        self.stdin_lines.append(line)
        return line

    async def connect_fabric(self) -> trio.abc.Stream:
        """Connect to this container's fabric socket (an agent's child session), as the agent
        image's relay does; the stream is the caller's to close. OSError when the container has
        none (its spec has no child_fabric, or the runtime serves no children)."""
        if self.children is None:
            raise OSError("this container has no fabric socket")
        ours, theirs = trio.testing.memory_stream_pair()
        await self.children.connect(self.id, theirs)
        return ours

    async def write_stdout(self, data: bytes) -> None:
        await self.stdout.sender.send_all(data)

    async def write_stderr(self, data: bytes) -> None:
        await self.stderr.sender.send_all(data)

    async def exit(self, code: int) -> None:
        """The server process ends: its output streams close."""
        self.exit_code = code
        self._close_outputs()
        await trio.lowlevel.checkpoint()

    def _close_outputs(self) -> None:
        self.stdout.close_sender()
        self.stderr.close_sender()
        self.stdin.close_receiver()


class MemoryContainer:
    """The relay's side of one in-memory container (a :class:`~.base.Container`)."""

    def __init__(self, server: MemoryServer) -> None:
        self._server = server

    @property
    def id(self) -> str:
        return self._server.id

    @property
    def name(self) -> str:
        return self._server.name

    @property
    def stdin(self) -> _PipeSender:
        return self._server.stdin.sender

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._server.stdout.receiver

    @property
    def stderr(self) -> trio.abc.ReceiveStream:
        return self._server.stderr.receiver

    async def aclose(self) -> None:
        self._server.stdin.close_sender()
        self._server.stdout.close_receiver()
        self._server.stderr.close_receiver()
        await trio.lowlevel.checkpoint()


Server = Callable[[MemoryServer], Awaitable[None]]


@dataclass
class Fault:
    """What a step does besides succeeding: wait ``delay``, then hang or fail.

    ``error`` may be any exception: a product error (as a real engine gives) or, to test that a
    bug stays inside its session, anything else. ``only`` limits the fault to the containers
    whose spec it accepts.
    """

    delay: float = 0.0
    error: Exception | None = None
    hang: bool = False
    only: Callable[[ContainerSpec], bool] | None = None


@dataclass
class _Create:
    server: MemoryServer | None = None
    error: Exception | None = None
    abandoned: bool = False
    done: trio.Event = field(default_factory=trio.Event)


class MemoryRuntime:
    """A :class:`~.base.Runtime` whose containers are coroutines in the runtime's nursery."""

    name = "memory"
    egress = None  # coroutines have no network to limit: no proxy to run
    # Agents' fabric sockets: None unless a test gives it ChildSockets (and runs them); then a
    # server reaches its child session by MemoryServer.connect_fabric.
    children: ChildSockets | None = None

    @property
    def capabilities(self) -> RuntimeCapabilities:
        """Its containers are coroutines: no network to limit and no files to write (an
        egress allowlist and file secrets are nothing to refuse), no mounts at all; child
        sessions when a test gives it ChildSockets."""
        return RuntimeCapabilities(stdio="memory", child_sessions=self.children is not None)

    def __init__(
        self,
        nursery: trio.Nursery,
        server: Server,
        *,
        stdin_capacity: int = 65536,
        output_capacity: int = 65536,
    ) -> None:
        self._nursery = nursery
        self.server = server
        self.stdin_capacity = stdin_capacity
        self.output_capacity = output_capacity
        self.faults: dict[str, Fault] = {}
        self.spawned: list[ContainerSpec] = []
        self.pins_given: list[PinSet | None] = []  # to every spawn, in order, failed ones too
        self.held: list[str] = []  # the spawns that waited at their gate, by name
        self.servers: dict[str, MemoryServer] = {}  # by name
        self.removals: list[str] = []
        # What each image holds (paths), for the same-path mount check (see DockerRuntime).
        self.image_files: dict[str, set[str]] = {}
        self.missing_images: set[str] = set()
        # Image ids other than the default "memory:IMAGE" (an image rebuilt under its name).
        self.image_ids: dict[str, str] = {}
        # Creates whose spawn was cancelled before they completed (they removed themselves).
        self.abandoned_creates = 0
        self.cpu_shares: dict[str, int] = {}  # set_cpu_shares calls, by container id
        # What memory_usage reports, by container id (None when not set: no figure).
        self.memory: dict[str, int] = {}
        self._ids = itertools.count(1)

    def fault(
        self,
        step: str,
        *,
        delay: float = 0.0,
        error: Exception | None = None,
        hang: bool = False,
        only: Callable[[ContainerSpec], bool] | None = None,
    ) -> None:
        """Make ``step`` (one of :data:`STEPS`) slow, failing or hanging until cleared."""
        assert step in STEPS, step
        self.faults[step] = Fault(delay, error, hang, only)

    def clear_faults(self) -> None:
        self.faults.clear()

    @property
    def alive(self) -> list[MemoryServer]:
        """Containers created and not removed: after a session ends this must be empty."""
        return [s for s in self.servers.values() if not s.removed]

    def _find(self, container: str) -> MemoryServer | None:
        found = self.servers.get(container)
        if found is not None:
            return found
        return next((s for s in self.servers.values() if s.id == container), None)

    async def _step(self, step: str, spec: ContainerSpec | None = None) -> None:
        await trio.lowlevel.checkpoint()
        fault = self.faults.get(step)
        if fault is None or (fault.only is not None and (spec is None or not fault.only(spec))):
            return
        if fault.delay:
            await trio.sleep(fault.delay)
        if fault.hang:
            await trio.sleep_forever()
        if fault.error is not None:
            raise fault.error

    async def ping(self, *, time_bound: float | None = None) -> str:
        await self._step("ping")
        return "memory"

    async def verify_isolation(self, image: str, labels: dict[str, str]) -> None:
        await trio.lowlevel.checkpoint()

    async def image_id(self, image: str) -> str | None:
        await trio.lowlevel.checkpoint()
        if image in self.missing_images:
            return None
        return self.image_ids.get(image, f"memory:{image}")

    async def spawn(
        self, spec: ContainerSpec, pins: PinSet | None = None, *, gate: Gate | None = None
    ) -> MemoryContainer:
        # The runtime owns the pins; nothing here runs in a thread, so once this call ends no
        # engine can resolve them any more.
        self.pins_given.append(pins)
        try:
            return await self._spawn(spec, pins, gate)
        finally:
            if pins is not None:
                pins.close()

    async def _spawn(
        self, spec: ContainerSpec, pins: PinSet | None, gate: Gate | None
    ) -> MemoryContainer:
        files = self.image_files.get(spec.image, set())
        shadowed = sorted(m.target for m in spec.mounts if m.check_in_image and m.target in files)
        if shadowed:
            await trio.lowlevel.checkpoint()
            raise SecurityViolation(
                f"mount target {shadowed[0]!r} exists in the image {spec.image}",
                reason=MOUNT_TARGET_IN_IMAGE,
                path=shadowed[0],
            )
        create = _Create()
        self._nursery.start_soon(self._create, spec, create)
        try:
            await create.done.wait()
        except BaseException:
            if create.server is not None:
                with trio.CancelScope(shield=True):
                    await self.remove(spec.name)
            else:
                create.abandoned = True  # the create removes it when it completes
            raise
        if create.error is not None:
            raise create.error
        server = create.server
        assert server is not None
        try:
            await self._step("attach", spec)
            await self._step("start", spec)
            if pins is not None:
                await self._step("verify", spec)
            if gate is not None:
                # As fabric-stdio --hold: the container runs, its server not yet.
                self.held.append(spec.name)
                await gate()
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.remove(server.id)
            raise
        server.started = True
        if spec.child_fabric and self.children is not None:
            self.children.watch(server.id, spec.name)
            server.children = self.children
        self._nursery.start_soon(self._run, server)
        return MemoryContainer(server)

    async def _create(self, spec: ContainerSpec, create: _Create) -> None:
        try:
            create.server = await self._make(spec)
        except Exception as exc:  # noqa: BLE001 - handed to the spawn that waits for it
            create.error = exc
        finally:
            create.done.set()
        if create.abandoned and create.server is not None:
            self.abandoned_creates += 1
            await self.remove(spec.name)

    async def _make(self, spec: ContainerSpec) -> MemoryServer:
        await self._step("create", spec)
        existing = self.servers.get(spec.name)
        if existing is not None and not existing.removed:
            raise ContainerStartFailure(
                f"the name {spec.name!r} is already in use", reason=CREATE_FAILED
            )
        server = MemoryServer(
            id=f"mem{next(self._ids):061d}",
            spec=spec,
            stdin=Pipe(self.stdin_capacity),
            stdout=Pipe(self.output_capacity),
            stderr=Pipe(self.output_capacity),
        )
        self.servers[spec.name] = server
        self.spawned.append(spec)
        return server

    async def _run(self, server: MemoryServer) -> None:
        with server._scope:
            try:
                await self.server(server)
            except* (trio.BrokenResourceError, trio.ClosedResourceError):
                # Writing to a stream nobody reads any more: a process dies of SIGPIPE.
                if server.exit_code is None:
                    server.exit_code = 141
            finally:
                if server.exit_code is None:
                    server.exit_code = 0
                server._close_outputs()

    async def exit_status(self, container_id: str) -> ContainerExit:
        server = self._find(container_id)
        await self._step("exit_status", server.spec if server is not None else None)
        if server is None:
            raise ContainerStartFailure("no such container", reason=INSPECT_FAILED)
        return ContainerExit(server.exit_code, server.oom_killed)

    async def set_cpu_shares(self, container_id: str, shares: int) -> None:
        """Recorded (:attr:`cpu_shares`): in-memory servers have no CPU weight."""
        server = self._find(container_id)
        await self._step("update", server.spec if server is not None else None)
        self.cpu_shares[container_id] = shares

    async def main_pid(self, container_id: str) -> int:
        """In-memory servers are no processes: 0 (nothing to look into)."""
        server = self._find(container_id)
        await self._step("pid", server.spec if server is not None else None)
        return 0

    async def memory_usage(self, container_id: str) -> int | None:
        """What :attr:`memory` says for it (in-memory servers use none of their own)."""
        server = self._find(container_id)
        await self._step("stats", server.spec if server is not None else None)
        return self.memory.get(container_id)

    async def remove(self, container: str, *, grace: float | None = None) -> None:
        self.removals.append(container)
        server = self._find(container)
        try:
            await self._step("remove", server.spec if server is not None else None)
        except FabricError:
            return  # a runtime's remove logs and swallows its errors
        if server is None or server.removed:
            return
        server.removed = True
        if self.children is not None:
            self.children.stop(server.id)
        server._scope.cancel()
        if server.exit_code is None:
            server.exit_code = 137  # killed
        server._close_outputs()

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[ManagedContainer]:
        await self._step("list")
        wanted = {LABEL_MANAGED: "true", **(extra_labels or {})}
        return [
            ManagedContainer(s.id, s.name, dict(s.spec.labels), 0.0)
            for s in self.alive
            if all(s.spec.labels.get(k) == v for k, v in wanted.items())
        ]

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def open_memory_runtime(server: Server, **options: int) -> AsyncIterator[MemoryRuntime]:
    """A MemoryRuntime whose server tasks live in a nursery that ends with the block."""
    async with trio.open_nursery() as nursery:
        runtime = MemoryRuntime(nursery, server, **options)
        try:
            yield runtime
        finally:
            nursery.cancel_scope.cancel()
