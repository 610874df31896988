"""The one trio driver of a client session, for the relay and the fabric endpoint alike.

A session machine (:class:`~reactor_fabric.protocol.events.SessionMachineContract`: the relay's
:class:`~reactor_fabric.protocol.session.SessionMachine` or the fabric endpoint's
:class:`~reactor_fabric.protocol.fabric_server.FabricServer`) decides; this module moves bytes
and carries out its actions, in order:

- client → backends: the client reader feeds each message to the machine (paused while the
  machine is not :attr:`accepting`: its bytes for backends are over the session's bound); a
  :class:`ToBackend` lands in that backend's stdin queue, which exactly one writer task drains
  (several queued lines leave in one write) and reports :class:`StdinWritten`;
- backends → client: each backend's stdout reader splits lines and feeds them to the machine;
  what the machine sends to the client goes to the channel (whose transport has its own single
  writer);
- one :class:`DeadlineTimer` feeds a :class:`Tick` at the machine's deadline; the orchestrator
  stopping and an operator ending the session are :class:`Shutdown` events;
- a :class:`Compute` runs in a worker thread (bounded, abandoned safely: pure computation).

Ownership tree (all in the session's nursery)::

    SessionDriver.run
    ├── _read_client, DeadlineTimer.run, _watch_shutdown, _watch_operator, _watch_lease
    ├── _start(key)                     one per backend start
    ├── _compute(action)                one per Compute
    ├── _measure(key)                   one per MeasureBackend
    └── per backend: _write_stdin, _read_stdout, read_stderr, and its removal

The driver runs against a narrow :class:`SessionHost` (start and remove a container, its exit
status, the audit, the observer, limits, the stopping event), never the whole orchestrator.

Resource handling: leaving the nursery for any reason (client gone, error, cancellation,
shutdown) removes every backend still there, in a ``finally`` that is shielded and bounded by
the host's teardown deadline; a start in flight is undone by the runtime (see
:mod:`reactor_fabric.runtime.base`); a backend whose output ended is removed even when the
machine no longer counted on it.

Error handling: what a client or a backend does is answered as the machine decides; the
client leaving (:class:`ChannelClosed`) is the :class:`ClientGone` event. Anything else
propagates to :func:`~reactor_fabric.trio.session.serve_session`, which logs it and answers
what the session owed (:meth:`SessionDriver.owed_frames`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import trio

from .._errors import FabricError
from .._reasons import EXITED, ORCHESTRATOR_STOPPING, TIMEOUT
from .._sockets import send_now_if_idle
from ..observe.observer import Observer
from ..protocol.answers import ENDED_BY_OPERATOR, OUTPUT_INVALID
from ..protocol.events import (
    Action,
    BackendBroken,
    BackendExited,
    BackendKey,
    BackendLine,
    BackendMeasured,
    BackendStarted,
    BackendStartFailed,
    CallRef,
    ClientActivity,
    ClientFrame,
    ClientGone,
    ClientRegistered,
    CloseClient,
    Compute,
    Computed,
    EndSession,
    Event,
    Log,
    MeasureBackend,
    SessionMachineContract,
    Shutdown,
    StartBackend,
    StdinWritten,
    StopBackend,
    Tick,
    ToBackend,
    ToClient,
    ToolCallDone,
    ToolsChanged,
    WorkspaceRecorded,
)
from ..protocol.fabric_refresh import ToolChanges
from ..protocol.framing import FramingError, LineSplitter
from ..protocol.handshake import RegisterClient, register_answer
from ..protocol.jsonrpc import REQUEST, RESPONSE, Peek, error_response, peek
from ..runtime.base import Container
from .channel import ChannelClosed, ClientChannel, DeliversDirectly, Handover, LeasedClient
from .live_container import READ_CHUNK, LiveContainer, read_stderr
from .pooled import HandedOut
from .registry import SessionRecord
from .timer import DeadlineTimer

__all__ = ["SessionDriver", "SessionHost"]

log = logging.getLogger(__name__)

# How long a Compute's job may take in its thread (its input is bounded by the machine that
# made it); beyond, it is given up and reported as failed.
COMPUTE_SECONDS = 60.0
# How long reading a container's memory from the engine may take; beyond, it is reported
# unreadable (the machine decides nothing on it, and the client's frames it held go on).
MEASURE_SECONDS = 5.0

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class SessionHost(Protocol):
    """What a session's driver needs of the orchestrator, for one session."""

    @property
    def observer(self) -> Observer: ...

    @property
    def max_message_bytes(self) -> int: ...

    @property
    def stopping(self) -> trio.Event: ...

    @property
    def compute_limiter(self) -> trio.CapacityLimiter: ...

    def teardown_deadline(self) -> float:
        """When a session's removal of its containers must be done (shielded until then)."""

    async def start(
        self,
        key: BackendKey,
        *,
        respawn: bool,
        fields: dict[str, Any],
        greeted: bool = False,
        call: CallRef | None = None,
    ) -> Container:
        """A started container of ``key.service`` for this session; FabricError if not.
        ``greeted``: one the warm pool greeted may be handed out (a :class:`HandedOut` with
        its ``greeting``); ``call``: the one call it serves (audited)."""

    async def exit_status(
        self, live: LiveContainer, fields: dict[str, Any]
    ) -> tuple[int | None, bool]:
        """(exit code, out of memory) of a container whose output ended on its own."""

    async def remove(
        self, live: LiveContainer, fields: dict[str, Any], forget: Callable[[], object]
    ) -> None:
        """Stop and remove it (shielded, bounded, once); ``forget`` runs before waiters wake."""

    async def memory_usage(self, live: LiveContainer) -> int | None:
        """The container's memory in use in bytes, from the engine; None if it cannot tell."""

    def works_on_copy(self, container: Container) -> bool:
        """Whether the container works on a copy of the project (an isolated call's): its
        task's changes are recorded at its removal."""

    def audit(self, call: ToolCallDone, *, service: str, live: LiveContainer | None) -> None:
        """One finished tool call into the audit trail and the metrics (its outcome read
        when the record is made, not before)."""


class SessionDriver:
    """Runs one session machine against a client channel and a :class:`SessionHost`.

    ``endpoint`` is the session's service on the relay, or the fabric endpoint's name; a
    backend of another service is logged with ``backend`` besides it.
    """

    def __init__(
        self,
        machine: SessionMachineContract,
        channel: ClientChannel,
        host: SessionHost,
        *,
        record: SessionRecord,
        endpoint: str,
        lease: LeasedClient | None = None,
    ) -> None:
        self.machine = machine
        self.lease = lease
        self.channel = channel
        self.host = host
        self.record = record
        self.endpoint = endpoint
        self.observer = host.observer
        self.metrics = host.observer.metrics
        self._fields: dict[str, Any] = {"session": record.id, "service": endpoint}
        self._live: dict[BackendKey, LiveContainer] = {}
        self._stopping: set[BackendKey] = set()  # asked to stop; their removal may not run yet
        # The latest container of each service, while it runs: whom a call's record names.
        self._latest: dict[str, LiveContainer] = {}
        self._nursery: trio.Nursery | None = None
        # (a C-level getter: the timer asks after every event)
        self._timer = DeadlineTimer(functools.partial(getattr, machine, "deadline"), self._tick)
        self._accepting = trio.Event()
        self._paused = False  # the client reader waits for the machine to accept again
        # Hints that messages come in a burst (see _read_client, _read_stdout): their writes
        # are left to the writer tasks then, which batch them.
        self._burst_in = False
        self._burst_out = False
        # trio's clock, asked directly (trio.current_time() is three calls, and runs per event)
        self._now: Callable[[], float] = trio.current_time
        # The channel, when its messages may be fed from the tasks that receive them (asked
        # once: a runtime-checked protocol costs a walk over its attributes per check).
        self._direct = channel if isinstance(channel, DeliversDirectly) else None
        # The client's message the machine failed on, if it did (owed an answer at the crash).
        self._failed_on: bytes | None = None

    def owed_frames(self, error: FabricError) -> list[bytes]:
        """What the client is owed if the session must end now with ``error``: the answers
        the machine owes, and one to the request it failed on, which it never took."""
        frames = [a.frame for a in self.machine.answer_all(error) if isinstance(a, ToClient)]
        failed_on = _id_of(self._failed_on, REQUEST)
        if failed_on is not None and failed_on not in {_id_of(f, RESPONSE) for f in frames}:
            frames.append(error_response(failed_on, error))
        return frames

    # --- the machine --------------------------------------------------------------------------

    async def _feed(self, event: Event, now: float | None = None) -> None:
        machine = self.machine
        if now is None:
            now = self._now()
        try:
            actions = machine.handle(event, now)
        except Exception:
            if type(event) is ClientFrame:
                self._failed_on = event.frame  # (the machine never took it: see owed_frames)
            raise
        if len(actions) == 1 and type(actions[0]) is ToBackend:
            # The hot path (a client's message for its container): written at once, it is
            # reported before the timer is woken, which then wakes once for both events.
            written = self._write(actions[0])
            actions = [] if written is None else machine.handle(written, now)
        self._timer.wake()
        if self._paused and machine.accepting:
            self._paused = False
            self._accepting.set()
        await self._execute(actions)

    async def _execute(self, actions: list[Action]) -> None:
        written: list[StdinWritten] | None = None
        for action in actions:
            # (the hot path's three first, each one check: no match statement to walk)
            if isinstance(action, ToBackend):
                done = self._write(action)
                if done is not None:
                    written = [done] if written is None else [*written, done]
            elif isinstance(action, ToClient):
                await self._send_client(action)
            elif isinstance(action, ToolCallDone):
                # Its outcome is read later, off this path (see ToolCallDone).
                self._audit(action)
            else:
                await self._execute_other(action)
        # What went to a stdin at once is reported after this event's actions, as its writer
        # task would have (a later event, in order).
        for done in written or ():
            await self._feed(done)

    async def _execute_other(self, action: Action) -> None:
        nursery = self._nursery
        assert nursery is not None
        match action:
            case Log():
                self._log(action)
            case StartBackend():
                nursery.start_soon(self._start, action)
            case StopBackend():
                self._stop(action)
            case MeasureBackend(key=key):
                nursery.start_soon(self._measure, key)
            case CloseClient(code=code, reason=reason):
                # (the client may be gone: there is nothing left to close then)
                with contextlib.suppress(ChannelClosed):
                    await self.channel.close(code, reason)
            case EndSession():
                nursery.cancel_scope.cancel()
            case Compute():
                nursery.start_soon(self._compute, action)
            case ToolsChanged(changes=changes):
                self._tools_changed(changes)

    def _fields_of(self, service: str) -> dict[str, Any]:
        if service == self.endpoint:
            return self._fields
        return {**self._fields, "backend": service}

    def _audit(self, done: ToolCallDone) -> None:
        service = done.service or self.endpoint
        live = self._latest.get(service)
        seq = done.seq
        if seq is not None:
            # The container that served it (a service may run several: one per call).
            key = BackendKey(service, seq)
            live = self._live.get(key) if key not in self._stopping else None
        self.host.audit(done, service=service, live=live)

    def _log(self, action: Log) -> None:
        log.log(_LEVELS[action.level], action.event, extra={**self._fields, **action.fields})

    async def _compute(self, action: Compute) -> None:
        """Run a job in a worker thread and report it. The thread is abandoned when the session
        ends or :data:`COMPUTE_SECONDS` pass: it is pure computation with nothing to undo, and
        finishes on its own, holding its limiter token until then (so abandoned ones cannot
        pile up either)."""
        result: object = None
        with trio.move_on_after(COMPUTE_SECONDS) as bound:
            try:
                result = await trio.to_thread.run_sync(
                    action.job.run, abandon_on_cancel=True, limiter=self.host.compute_limiter
                )
            except Exception:
                # A bug, or input it cannot digest: the machine is told it failed.
                log.error(action.failure_event, exc_info=True, extra=self._fields)
        if bound.cancelled_caught:
            log.warning(action.failure_event, extra={**self._fields, "reason": TIMEOUT})
        await self._feed(Computed(action.job, result))

    def _tools_changed(self, changes: ToolChanges) -> None:
        """A backend's tools changed (after its list_changed): logged and audited."""
        live = self._latest.get(changes.service)
        container = live.container.id[:12] if live is not None else None
        record = changes.record()
        if changes.counts != (0, 0, 0):  # (the relay reports the suite lock's drift alone)
            log.warning(
                "tools_changed",
                extra={
                    **self._fields,
                    "backend": changes.service,
                    "container": container,
                    **record,
                },
            )
            self.observer.tools_changed(
                session=self.record.id,
                endpoint=self.record.endpoint,
                service=changes.service,
                container=container,
                changes=record,
            )
        for drift in changes.drift:  # (the suite lock: what now differs from it)
            fields = {key: value for key, value in drift.items() if key != "mode"}
            log.warning("lock_drift", extra={**self._fields, **drift})
            self.observer.drift(
                mode=str(drift.get("mode")),
                where="session",
                drift={"session": self.record.id, "container": container, **fields},
            )

    # --- client side --------------------------------------------------------------------------

    async def run(self, first_frame: bytes, first: object) -> None:
        """Serve the session from its first message (``first``: as classified) to its end."""
        self._now = trio.lowlevel.current_clock().current_time
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._timer.run)
                nursery.start_soon(self._watch_shutdown)
                nursery.start_soon(self._watch_operator)
                if self.lease is not None:
                    nursery.start_soon(self._watch_lease, self.lease)
                if isinstance(first, RegisterClient):
                    answer = register_answer(first, self.record.id, self.record.mounts)
                    await self._send_client(ToClient(answer))
                    await self._feed(ClientRegistered())
                else:
                    await self._feed(ClientFrame(first_frame))
                nursery.start_soon(self._read_client)
        finally:
            # Calls the machine never saw end (the session was cancelled): no answer.
            for action in self.machine.abandon(trio.current_time()):
                if isinstance(action, ToolCallDone):
                    self._audit(action)
            with trio.move_on_at(self.host.teardown_deadline()) as scope:
                scope.shield = True
                async with trio.open_nursery() as cleanup:
                    for key, live in list(self._live.items()):
                        cleanup.start_soon(self._remove, key, live)

    async def _read_client(self) -> None:
        channel = self.channel
        direct = self._direct

        async def until_accepting() -> None:
            while not self.machine.accepting:
                self._paused = True
                self._accepting = trio.Event()
                await self._accepting.wait()

        while True:
            await until_accepting()
            if direct is None:
                frame = await channel.receive()
            else:
                # While this waits with nothing queued, the channel may hand a message to the
                # machine from the task that received it (_feed_now).
                direct.direct = self._feed_now
                try:
                    frame = await channel.receive()
                finally:
                    direct.direct = None
                if frame is not None and not isinstance(frame, Handover):
                    # (queued while the machine accepted, it may have stopped since)
                    await until_accepting()
            if isinstance(frame, Handover):
                if frame.failure is not None:
                    raise frame.failure
                await self._execute(frame.actions)
                continue
            if frame is None:
                await self._feed(ClientGone())
                return
            self.record.last_active = now = self._now()
            # In a burst of the client's messages, what they ask of a container is left to its
            # writer task, which writes it together (one write, not one per message).
            self._burst_in = self.channel.more_received
            await self._feed(ClientFrame(frame), now)

    def _feed_now(self, frame: bytes, message: Peek, more: bool) -> bool:
        """A client's message fed to the machine by the task that received it (a POST's
        handler: see :class:`~.channel.DeliversDirectly`), while the reader waits with nothing
        queued; False when the machine does not accept now (the channel queues it then).
        ``more``: more of the client's messages are under way (see ``_burst_in``).

        Synchronous: nothing here waits, so no cancellation of the caller's task can leave an
        event half carried out. What the machine decides that may wait (the usual call has
        nothing left once its line is written at once) goes to the reader task as a
        :class:`~.channel.Handover`, in order; so does the machine's failure, raised there.
        """
        machine = self.machine
        channel = self._direct
        if channel is None or not machine.accepting:
            return False
        self.record.last_active = now = self._now()
        self._burst_in = more
        try:
            actions = machine.handle(ClientFrame(frame, message), now)
        except Exception as exc:  # noqa: BLE001 - the reader task raises it
            self._failed_on = frame  # (the machine never took it: see owed_frames)
            channel.hand_over(Handover([], exc))
            return True
        try:
            if len(actions) == 1 and type(actions[0]) is ToBackend:
                written = self._write(actions[0])
                actions = [] if written is None else machine.handle(written, now)
            self._timer.wake()
        except Exception as exc:  # noqa: BLE001 - the reader task raises it
            channel.hand_over(Handover([], exc))
            return True
        if actions:
            channel.hand_over(Handover(actions))
        return True

    async def _send_client(self, action: ToClient) -> None:
        frame = action.frame
        self.metrics.bytes_to_client += len(frame)
        if action.error is not None:
            self.observer.error_sent(*action.error)
        try:
            await self.channel.send(frame, action.message, more=self._burst_out)
        except ChannelClosed:
            await self._feed(ClientGone())

    async def _watch_shutdown(self) -> None:
        await self.host.stopping.wait()
        await self._feed(Shutdown(ORCHESTRATOR_STOPPING))

    async def _watch_operator(self) -> None:
        await self.record.ended_by_operator.wait()
        log.warning("session_ended_by_operator", extra=self._fields)
        await self._feed(Shutdown(ENDED_BY_OPERATOR))

    async def _watch_lease(self, lease: LeasedClient) -> None:
        while True:
            await lease.streams_changed()
            await self._feed(ClientActivity())

    async def _tick(self) -> None:
        if self.lease is not None and self.lease.busy:
            # (asked now rather than told at every request: a lease comes due rarely)
            await self._feed(ClientActivity())
        await self._feed(Tick())

    # --- backends -----------------------------------------------------------------------------

    async def _start(self, action: StartBackend) -> None:
        key = action.key
        fields = self._fields_of(key.service)
        try:
            container = await self.host.start(
                key, respawn=action.respawn, fields=fields, greeted=action.greeted, call=action.call
            )
        except FabricError as exc:
            await self._feed(BackendStartFailed(key, exc))
            return
        live = LiveContainer(key.seq, container)
        self._live[key] = live
        self._latest[key.service] = live
        assert self._nursery is not None
        self._nursery.start_soon(self._write_stdin, key, live)
        self._nursery.start_soon(self._read_stdout, key, live)
        self._nursery.start_soon(read_stderr, live, fields)
        # Greeted by the pool (asked for only by a machine that then skips its handshake).
        greeting = container.greeting if isinstance(container, HandedOut) else None
        greeting = greeting if action.greeted else None
        workspace = self.host.works_on_copy(container)
        await self._feed(BackendStarted(key, greeting, container.name, workspace))

    def _write(self, action: ToBackend) -> StdinWritten | None:
        """Queue a line for the container's stdin writer — or, while that writer is idle,
        write it from this task at once (no hand-off per message; see ``send_now_if_idle``):
        what the kernel took then is returned, to be reported."""
        live = self._live.get(action.key)
        if live is None or live.removing:
            return None  # it is going away; the machine answers what it was owed
        data = action.data
        self.metrics.bytes_to_server += len(data)
        sent = (
            None if live.queue or self._burst_in else send_now_if_idle(live.container.stdin, data)
        )
        if sent == len(data):
            return StdinWritten(action.key, sent)
        if sent:
            data = data[sent:]
        live.queue.append(data)
        live.queued.set()
        return StdinWritten(action.key, sent) if sent else None

    async def _write_stdin(self, key: BackendKey, live: LiveContainer) -> None:
        """The one writer of this container's stdin: drains the queue, several lines at once."""
        stdin = live.container.stdin
        while True:
            await live.queued.wait()
            live.queued = trio.Event()
            if not live.queue:
                continue  # dropped while we waited
            data = live.queue[0] if len(live.queue) == 1 else b"".join(live.queue)
            live.queue.clear()
            # No deadline here: a backend that stops taking its input is the machine's call
            # (its deadline), which stops it — and that ends this write.
            try:
                await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # The container is gone: its stdout reader reports the exit.
                log.info("stdin_closed", extra=self._fields_of(key.service))
                return
            await self._feed(StdinWritten(key, len(data)))

    async def _read_stdout(self, key: BackendKey, live: LiveContainer) -> None:
        splitter = LineSplitter(max_line=self.host.max_message_bytes)
        stdout = live.container.stdout
        broken: str | None = None
        try:
            while data := await stdout.receive_some(READ_CHUNK):
                lines = splitter.feed(bytes(data))
                last = len(lines) - 1
                for index, line in enumerate(lines):
                    # (lines read together: what goes to the client is written together)
                    self._burst_out = index < last
                    await self._feed(BackendLine(key, line))
                self._burst_out = False
        except FramingError as exc:
            broken = str(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            live.reading_stdout = False
            live.stdout_done.set()
        if live.removing or key in self._stopping:
            return  # stopped on purpose; the machine knows
        if broken is not None:
            await self._feed(BackendBroken(key, OUTPUT_INVALID, broken))
        else:
            exit_code, oom = await self.host.exit_status(live, self._fields_of(key.service))
            await self._feed(BackendExited(key, exit_code, oom, tuple(live.stderr_tail)))
        # A backend the machine no longer counted on: done all the same.
        self._stop(StopBackend(key, EXITED, graceful=False))

    async def _measure(self, key: BackendKey) -> None:
        """Read a backend's memory (bounded) and report it; None when it cannot be read."""
        memory: int | None = None
        live = self._live.get(key)
        if live is not None and not live.removing:
            with trio.move_on_after(MEASURE_SECONDS):
                memory = await self.host.memory_usage(live)
        await self._feed(BackendMeasured(key, memory))

    def _stop(self, action: StopBackend) -> None:
        live = self._live.get(action.key)
        if live is None or action.key in self._stopping:
            return  # the first stop's reason is the one recorded
        self._stopping.add(action.key)
        live.stop_reason, live.stop_graceful = action.reason, action.graceful
        live.report_workspace = action.report_workspace
        live.queue.clear()  # what waits for its stdin is dropped now, not when removal ends
        if self._latest.get(action.key.service) is live:
            del self._latest[action.key.service]
        assert self._nursery is not None
        self._nursery.start_soon(self._remove, action.key, live)

    async def _remove(self, key: BackendKey, live: LiveContainer) -> None:
        def forget() -> None:
            self._live.pop(key, None)
            self._stopping.discard(key)
            if self._latest.get(key.service) is live:
                del self._latest[key.service]

        await self.host.remove(live, self._fields_of(key.service), forget)
        if live.report_workspace:
            # The machine holds the call's answer until it knows what was recorded.
            workspace, failure = live.workspace or (None, "the task's copy was not recorded")
            await self._feed(WorkspaceRecorded(key, workspace, failure))


def _id_of(frame: bytes | None, kind: str) -> object:
    """The id of ``frame`` when it is a JSON-RPC message of ``kind``, else None (the crash
    path's: a frame that is no message has none)."""
    if frame is None:
        return None
    try:
        message = peek(frame)
    except (FabricError, ValueError, RecursionError):
        return None
    return message.id if message.kind == kind else None
