"""One session of the fabric endpoint ``/mcp`` on trio: the driver of :class:`FabricServer`.

See :class:`~reactor_fabric.protocol.fabric_server.FabricServer` for what the session does; this
module carries out its actions and moves bytes:

- client → server: the client reader feeds each message to the machine and carries out what it
  returns; it pauses while any of the session's containers has more than ``buffer_to_server``
  bytes waiting for its stdin (a slow service stalls only this session);
- a container per service, started when the machine asks (the first call to one of its tools),
  with the session's mounts — validated again and pinned at every start, as on the per-service
  relay; each has one stdin writer, a stdout reader feeding the machine, a stderr reader;
- a timer runs the machine's :meth:`~FabricServer.tick` at its deadline (a service idle for its
  ``timeout`` is removed; the next call starts a fresh one);
- a backend's fresh list (its list_changed) is made into the session's catalog and ranking
  index in a worker thread (:class:`~reactor_fabric.protocol.fabric_refresh.Refresh`, one at
  a time per session, :attr:`Fabric.refresh_limiter` across sessions): that CPU work is in
  proportion to what the backend sent, and on the event loop it held up every other session.

Ownership tree (all in the session's nursery)::

    FabricDriver.run
    ├── _read_client, DeadlineTimer.run, _watch_shutdown
    ├── _start(service)             one per container start
    ├── _refresh(refresh)           at most one: a catalog refresh in a worker thread
    └── per container: _write_stdin, _read_stdout, _read_stderr, and its removal

Resource handling: leaving the nursery for any reason removes every container of the session
(shielded, bounded in time); a start in flight is undone by the runtime.

Error handling: a service that cannot start, or that exits, answers the calls it owed with its
error (-32002 and ``data.reason``), and the session's other services go on; the orchestrator
stopping answers everything in flight with ``orchestrator_stopping``.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import trio

from .._errors import ContainerStartFailure, FabricError
from .._reasons import (
    CONTAINER_OUTPUT_INVALID,
    EXITED,
    IDLE,
    ORCHESTRATOR_STOPPING,
    TIMEOUT,
)
from .._version import __version__
from ..config.suite import FABRIC_ENDPOINT
from ..discovery import DiscoveryIndex
from ..policy.admission import FabricOptions
from ..protocol.answers import (
    ENDED_BY_OPERATOR,
    UNRESPONSIVE,
    container_exited,
    log_notification,
    session_ending,
)
from ..protocol.catalog import Catalog
from ..protocol.fabric_refresh import Refresh, Refreshed, ToolChanges
from ..protocol.fabric_server import (
    Action,
    FabricServer,
    StartBackend,
    StopBackend,
    ToBackend,
    ToClient,
    ToolsChanged,
)
from ..protocol.framing import FramingError, LineSplitter
from ..protocol.handshake import RegisterClient, register_answer
from ..protocol.tool_calls import ToolCall, ToolCallDone
from .channel import ChannelClosed, ClientChannel
from .containers import audit_call, how_it_exited, remove_container, start_container
from .fabric import Fabric, SessionRecord
from .live_container import READ_CHUNK, LiveContainer, read_stderr
from .timer import DeadlineTimer

log = logging.getLogger(__name__)

__all__ = ["FABRIC_ENDPOINT", "FabricDriver", "fabric_driver"]

# How long a session that opens while the catalog is still being learned waits for it.
CATALOG_WAIT_SECONDS = 30.0
# How long a catalog refresh may take in its thread (its input is bounded: MAX_LIST_BYTES);
# beyond, it is given up and the session's catalog stays as it was.
REFRESH_SECONDS = 60.0


async def fabric_driver(
    fabric: Fabric,
    channel: ClientChannel,
    *,
    session_id: str,
    record: SessionRecord,
    options: FabricOptions,
) -> FabricDriver:
    """The driver of a new fabric-endpoint session, with the catalog it serves: waited for
    (bounded) while it is still being learned, and its ranking index: the start-up's, or, for a
    catalog not indexed yet (the wait gave up, or a re-check is publishing), one built in a
    worker thread, never on the event loop."""
    if not fabric.catalog_ready.is_set():
        with trio.move_on_after(CATALOG_WAIT_SECONDS):
            await fabric.catalog_ready.wait()
    catalog = fabric.catalog
    index = fabric.indexed(catalog)
    if index is None:
        index = await trio.to_thread.run_sync(fabric.discovery_index, catalog)
    return FabricDriver(
        fabric,
        channel,
        session_id=session_id,
        record=record,
        options=options,
        catalog=catalog,
        index=index,
    )


@dataclass(eq=False)
class _Backend(LiveContainer):
    """A running container of one of the session's services."""

    service: str = ""
    queued_bytes: int = 0
    own_bytes: int = 0  # of queued_bytes, the machine's own messages (ToBackend.own)


class FabricDriver:
    """Runs one :class:`FabricServer` against a client channel and a container runtime."""

    def __init__(
        self,
        fabric: Fabric,
        channel: ClientChannel,
        *,
        session_id: str,
        record: SessionRecord,
        options: FabricOptions,
        catalog: Catalog,
        index: DiscoveryIndex,
    ) -> None:
        self.fabric = fabric
        self.channel = channel
        self.session_id = session_id
        self.record = record
        self.mounts = mounts = record.mounts
        self.observer = fabric.observer
        self.metrics = fabric.observer.metrics
        self._started_services: set[str] = set()  # a second start of one is a respawn
        services = fabric.suite.mcp_services
        self.server = FabricServer(
            catalog,
            session_id=session_id,
            mount_targets=[mount.target for mount in mounts],
            exposure=options.exposure,
            active=options.active,
            version=__version__,
            facts=fabric.service_facts(),
            profiles={name: p.services for name, p in fabric.suite.profiles.items()},
            idle_timeouts={name: s.idle_timeout_seconds for name, s in services.items()},
            clock=trio.current_time,
            index=index,
            token_budget=fabric.suite.orchestrator.fabric.token_budget,
            assist=fabric.assist_settings,
            audit_arguments=fabric.audit_arguments,
            own_backlog_bytes=fabric.limits.buffer_to_server_bytes,
        )
        self._fields = {"session": session_id, "service": FABRIC_ENDPOINT}
        self._current: dict[str, _Backend] = {}  # service → its running container
        self._all: dict[int, _Backend] = {}  # every container not yet removed, by sequence
        self._sequence = 0
        self._nursery: trio.Nursery | None = None
        self._timer = DeadlineTimer(lambda: self.server.deadline, self._tick)
        self._room = trio.Event()  # set when a container's stdin queue shrinks

    def owed_frames(self, error: FabricError) -> list[bytes]:
        """What the client is owed if the session must end now with ``error``."""
        return [a.data for a in self.server.answer_all(error) if isinstance(a, ToClient)]

    # --- the machine --------------------------------------------------------------------------

    async def _execute(self, actions: list[Action]) -> None:
        nursery = self._nursery
        assert nursery is not None
        for action in actions:
            match action:
                case ToClient(data=data, error=error):
                    if error is not None:
                        self.observer.error_sent(*error)
                    await self._send_client(data)
                case ToBackend(service=service, data=data, own=own):
                    self._write(service, data, own=own)
                case StartBackend(service=service):
                    nursery.start_soon(self._start, service)
                case StopBackend(service=service, reason=reason):
                    if reason != IDLE:  # the machine found it broken
                        log.warning(
                            "backend_failed",
                            extra={**self._fields, "backend": service, "reason": reason},
                        )
                    self._stop(service, reason)
                case ToolCallDone(call=call):
                    self._audit(call)
                case Refresh() as refresh:
                    nursery.start_soon(self._refresh, refresh)
                case ToolsChanged(changes=changes):
                    self._tools_changed(changes)
        self._timer.wake()

    def _audit(self, call: ToolCall) -> None:
        service = call.service or FABRIC_ENDPOINT
        audit_call(self.fabric, self.record, call, service=service, live=self._current.get(service))

    async def _tick(self) -> None:
        await self._execute(self.server.tick())

    async def _refresh(self, refresh: Refresh) -> None:
        """Run a catalog refresh in a worker thread and report it to the machine. The thread
        is abandoned when the session ends or :data:`REFRESH_SECONDS` pass: it is pure
        computation with nothing to undo, and finishes on its own, holding its limiter token
        until then (so abandoned ones cannot pile up either)."""
        result: Refreshed | None = None
        with trio.move_on_after(REFRESH_SECONDS) as bound:
            try:
                result = await trio.to_thread.run_sync(
                    refresh.run, abandon_on_cancel=True, limiter=self.fabric.refresh_limiter
                )
            except Exception:
                # A bug, or a list it cannot digest: this session's catalog stays as it was.
                log.error("catalog_refresh_failed", exc_info=True, extra=self._fields)
        if bound.cancelled_caught:
            log.warning("catalog_refresh_failed", extra={**self._fields, "reason": TIMEOUT})
        await self._execute(self.server.refreshed(refresh, result))

    def _tools_changed(self, changes: ToolChanges) -> None:
        """A backend's tools changed (after its list_changed): logged and audited."""
        live = self._current.get(changes.service)
        container = live.container.id[:12] if live is not None else None
        record = changes.record()
        log.warning(
            "tools_changed",
            extra={**self._fields, "backend": changes.service, "container": container, **record},
        )
        self.observer.tools_changed(
            session=self.session_id,
            endpoint=self.record.endpoint,
            service=changes.service,
            container=container,
            changes=record,
        )

    # --- client side --------------------------------------------------------------------------

    async def run(self, first_frame: bytes, first: object) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._timer.run)
                nursery.start_soon(self._watch_shutdown)
                nursery.start_soon(self._watch_operator)
                if isinstance(first, RegisterClient):
                    await self._send_client(register_answer(first, self.session_id, self.mounts))
                else:
                    await self._execute(self.server.client_message(first_frame))
                nursery.start_soon(self._read_client)
        finally:
            # The calls still open will never be answered to this client.
            for action in self.server.client_gone():
                if isinstance(action, ToolCallDone):
                    self._audit(action.call)
            with trio.move_on_at(self.fabric.teardown_deadline()) as scope:
                scope.shield = True
                async with trio.open_nursery() as cleanup:
                    for backend in list(self._all.values()):
                        cleanup.start_soon(self._remove, backend)

    def _end(self) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _read_client(self) -> None:
        limit = self.fabric.limits.buffer_to_server_bytes
        while True:
            while any(b.queued_bytes > limit for b in self._current.values()):
                self._room = trio.Event()
                await self._room.wait()
            frame = await self.channel.receive()
            if frame is None:
                self._end()
                return
            self.record.last_active = trio.current_time()
            self.metrics.bytes_to_server += len(frame)
            await self._execute(self.server.client_message(frame))

    async def _send_client(self, data: bytes) -> None:
        self.metrics.bytes_to_client += len(data)
        try:
            await self.channel.send(data)
        except ChannelClosed:
            self._end()

    async def _watch_shutdown(self) -> None:
        await self.fabric.stopping.wait()
        await self._end_now(ORCHESTRATOR_STOPPING, 1001)

    async def _watch_operator(self) -> None:
        await self.record.ended_by_operator.wait()
        log.warning("session_ended_by_operator", extra=self._fields)
        await self._end_now(ENDED_BY_OPERATOR, 1000)

    async def _end_now(self, reason: str, close_code: int) -> None:
        """Answer everything owed with ``reason``'s error, tell the client, and end."""
        error = session_ending(reason)
        await self._execute(self.server.answer_all(error))
        if reason == ENDED_BY_OPERATOR:
            await self._send_client(log_notification("warning", str(error)))
        with contextlib.suppress(ChannelClosed):
            await self.channel.close(close_code, reason.replace("_", " "))
        self._end()

    # --- container side -----------------------------------------------------------------------

    async def _start(self, service: str) -> None:
        self._sequence += 1
        sequence = self._sequence
        fields = {**self._fields, "backend": service}
        try:
            container = await start_container(
                self.fabric,
                service,
                # The catalog's services are the suite's: the machine asks for no other.
                self.fabric.suite.mcp_services[service],
                session_id=self.session_id,
                mounts=self.mounts,
                sequence=sequence,
                fields=fields,
                respawn=service in self._started_services,
            )
        except FabricError as exc:
            log.warning("container_start_failed", extra={**fields, "reason": exc.reason})
            await self._execute(self.server.backend_failed(service, exc))
            return
        self._started_services.add(service)
        backend = _Backend(sequence, container, service=service)
        self._current[service] = backend
        self._all[sequence] = backend
        assert self._nursery is not None
        self._nursery.start_soon(self._write_stdin, backend)
        self._nursery.start_soon(self._read_stdout, backend)
        self._nursery.start_soon(read_stderr, backend, fields)
        await self._execute(self.server.backend_started(service))

    def _write(self, service: str, data: bytes, *, own: bool) -> None:
        backend = self._current.get(service)
        if backend is None or backend.removing:
            return  # it is going away; the machine answers what it was owed
        line = data + b"\n"
        backend.queue.append(line)
        backend.queued_bytes += len(line)
        if own:
            backend.own_bytes += len(line)
        backend.queued.set()

    async def _write_stdin(self, backend: _Backend) -> None:
        """The one writer of this container's stdin: drains the queue, several lines at once."""
        stdin = backend.container.stdin
        while True:
            await backend.queued.wait()
            backend.queued = trio.Event()
            data = b"".join(backend.queue)
            backend.queue.clear()
            own, backend.own_bytes = backend.own_bytes, 0
            try:
                await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the container is gone: its stdout reader reports the exit
            finally:
                backend.queued_bytes -= len(data)
                self._room.set()
            if own and self._current.get(backend.service) is backend:
                # (not a former container's: the machine's count is of the current one)
                self.server.backend_read(backend.service, own)

    async def _read_stdout(self, backend: _Backend) -> None:
        service = backend.service
        splitter = LineSplitter(max_line=self.fabric.max_message_bytes)
        stdout = backend.container.stdout
        failure: FabricError | None = None
        try:
            while data := await stdout.receive_some(READ_CHUNK):
                for line in splitter.feed(bytes(data)):
                    if self._current.get(service) is backend:
                        await self._execute(self.server.backend_message(service, line))
        except FramingError as exc:
            failure = ContainerStartFailure(
                f"the {service} server wrote a line the orchestrator cannot relay: {exc}",
                reason=CONTAINER_OUTPUT_INVALID,
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            backend.reading_stdout = False
            backend.stdout_done.set()
        if backend.removing:
            return  # stopped on purpose; the machine knows
        if failure is None:
            failure = await self._exit_error(backend)
        if self._current.get(service) is backend:
            del self._current[service]
            log.warning(
                "backend_failed",
                extra={**self._fields, "backend": service, "reason": failure.reason},
            )
            await self._execute(self.server.backend_failed(service, failure))
        backend.stop_reason, backend.stop_graceful = EXITED, False
        await self._remove(backend)

    async def _exit_error(self, backend: _Backend) -> FabricError:
        exit_code, oom = await how_it_exited(self.fabric, backend, self._fields)
        stderr = list(backend.stderr_tail)
        return container_exited(backend.service, exit_code, oom, stderr, service=backend.service)

    def _stop(self, service: str, reason: str) -> None:
        backend = self._current.pop(service, None)
        if backend is None or backend.removing:
            return
        backend.stop_reason = reason
        if reason == UNRESPONSIVE:
            # The machine found it broken (logged with every non-idle stop, in _execute): not
            # asked to exit through the stdin it leaves unread. What waits for that stdin is
            # dropped now, not when the removal ends.
            backend.stop_graceful = False
            self._drop_queue(backend)
        assert self._nursery is not None
        self._nursery.start_soon(self._remove, backend)

    def _drop_queue(self, backend: _Backend) -> None:
        """Forget what waits for a container's stdin (it is going away); the client may be
        read again if that was what held it."""
        backend.queued_bytes -= sum(map(len, backend.queue))  # (not a write in progress)
        backend.queue.clear()
        backend.own_bytes = 0
        self._room.set()

    async def _remove(self, backend: _Backend) -> None:
        self._drop_queue(backend)

        def forget() -> None:
            self._all.pop(backend.seq, None)
            if self._current.get(backend.service) is backend:
                del self._current[backend.service]

        await remove_container(
            self.fabric, backend, {**self._fields, "backend": backend.service}, forget=forget
        )
