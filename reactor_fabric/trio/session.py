"""One relay session on trio: the driver of the pure session state machine.

See :class:`~reactor_fabric.protocol.session.SessionMachine`.

The machine decides; this module moves bytes and runs the machine's actions. The data path is a
straight walk:

- client → container: the client reader receives a frame, feeds it to the machine, and the
  machine's ``WriteStdin`` lands in the container's stdin queue, which exactly one writer task
  drains (several queued lines leave in one write);
- container → client: the container's stdout reader splits lines, feeds each to the machine, and
  sends what the machine returns to the client channel (whose transport has its own single
  writer).

Ownership tree of a session (all in the session's nursery)::

    serve_session
    └── SessionDriver.run
        ├── _read_client          client frames → machine (paused while the machine's buffer
        │                         for the container is full)
        ├── DeadlineTimer.run     a Tick at the machine's next deadline (idle, expiries)
        ├── _watch_shutdown       the orchestrator stopping → Shutdown
        ├── _spawn(seq)           one per container start
        └── per container: _write_stdin, _read_stdout, _read_stderr, and _stop when asked

Resource handling: leaving the session's nursery for any reason (client gone, error,
cancellation, shutdown) removes every container the session still has, in a ``finally`` that is
shielded and bounded in time; a container whose start was in flight is removed by the runtime
(see :mod:`reactor_fabric.runtime.base`).

Error handling: :func:`serve_session` never raises except :class:`trio.Cancelled`. What a client
or a container does is answered as the machine decides; anything unexpected (a bug) is logged
with its traceback, the client is told with a JSON-RPC error and the connection closed — other
sessions never notice.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import trio

from .._errors import (
    FabricError,
    SessionCrashed,
)
from .._reasons import INTERNAL_ERROR
from ..config.structs import Service
from ..observe.observer import Client, Observer, trace_of
from ..policy.admission import Refusal, admission
from ..protocol.framing import FramingError, LineSplitter
from ..protocol.handshake import RegisterClient, register_answer
from ..protocol.jsonrpc import error_response
from ..protocol.session import (
    ENDED_BY_OPERATOR,
    OUTPUT_INVALID,
    Action,
    ClientFrame,
    ClientGone,
    CloseClient,
    ContainerBroken,
    ContainerExited,
    EndSession,
    Event,
    Log,
    SendToClient,
    SessionMachine,
    Shutdown,
    Spawn,
    SpawnFailed,
    SpawnSucceeded,
    StdinWritten,
    StdoutLine,
    StopContainer,
    Tick,
    WriteStdin,
)
from ..protocol.tool_calls import ToolCall, ToolCallDone, valid_traceparent
from .channel import ChannelClosed, ClientChannel
from .containers import audit_call, how_it_exited, remove_container, start_container
from .fabric import Fabric, SessionRecord, new_session_id
from .fabric_session import fabric_driver
from .http_server import Request
from .live_container import READ_CHUNK, LiveContainer, read_stderr
from .timer import DeadlineTimer

__all__ = ["ClientChannel", "client_of", "refuse", "serve_session"]

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_INTERNAL_ERROR = 1011

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


async def serve_session(
    fabric: Fabric,
    channel: ClientChannel,
    service_name: str,
    query_mounts: list[str],
    *,
    first_frame: bytes | None = None,
    session_id: str | None = None,
    transport: str = "websocket",
    query: Mapping[str, list[str]] | None = None,
    client: Client | None = None,
    traceparent: str | None = None,
) -> None:
    """Run one client session from its first message to its end (see the module docstring).

    ``first_frame`` is the first message when the transport already has it (otherwise it is
    received here); ``session_id`` is chosen here unless the transport needs it beforehand
    (Streamable HTTP announces it in a header of the first response). ``client`` and the W3C
    ``traceparent`` of the request that opened the session go into the audit trail.
    """
    session_id = session_id or new_session_id(fabric.replica)
    progress = _Progress()
    try:
        await _serve_session(
            fabric,
            channel,
            service_name,
            query_mounts,
            first_frame=first_frame,
            session_id=session_id,
            transport=transport,
            query=query,
            progress=progress,
            client=client,
            traceparent=traceparent,
        )
    except* Exception as failure:
        log.error(
            "session_crashed",
            extra={"session": session_id, "service": service_name},
            exc_info=failure,
        )
        with trio.move_on_after(5) as cleanup:
            cleanup.shield = True
            await _tell_client_of_crash(channel, progress, session_id)


@dataclass
class _Progress:
    """How far a session got, for the answers to give if it crashes."""

    first_request_id: object = None
    driver: _Driver | None = None


class _Driver(Protocol):
    """What both endpoints' session drivers offer the session's lifecycle."""

    async def run(self, first_frame: bytes, first: object) -> None: ...

    def owed_frames(self, error: FabricError) -> list[bytes]:
        """The answers the client is owed if the session ends now with ``error``."""


async def _tell_client_of_crash(
    channel: ClientChannel, progress: _Progress, session_id: str
) -> None:
    """Every request the crashed session owed gets the error; then the connection closes.

    Contained, not silent: what fails here too (a second bug, a channel that breaks) is logged
    with its traceback, and the steps after it still run.
    """
    fields = {"session": session_id}
    error = SessionCrashed(
        "the orchestrator failed while serving this session; see its log",
        reason=INTERNAL_ERROR,
    )
    frames = [error_response(progress.first_request_id, error)]
    if progress.driver is not None:
        try:
            frames = progress.driver.owed_frames(error)
        except Exception:
            # The first request is still answered; the others are not known.
            log.exception("session_crash_answers_failed", extra=fields)
    try:
        for frame in frames:
            await channel.send(frame)
    except ChannelClosed:
        log.info("session_crash_untold", extra={**fields, "detail": "the client is gone"})
    except Exception:
        log.exception("session_crash_untold", extra=fields)
    try:
        await channel.close(CLOSE_INTERNAL_ERROR, "internal error")
    except ChannelClosed:
        pass  # the client is gone: there is nothing left to close
    except Exception:
        log.exception("session_crash_close_failed", extra=fields)


async def _serve_session(
    fabric: Fabric,
    channel: ClientChannel,
    service_name: str,
    query_mounts: list[str],
    *,
    first_frame: bytes | None,
    session_id: str,
    transport: str,
    query: Mapping[str, list[str]] | None,
    progress: _Progress,
    client: Client | None,
    traceparent: str | None,
) -> None:
    observer = fabric.observer
    client = client or Client(fabric.token_id, "", transport)

    async def refused(request_id: object, error: FabricError) -> None:
        observer.session_refused(
            service=service_name, client=client, code=error.code, reason=error.reason
        )
        await refuse(channel, request_id, error, service=service_name)

    if first_frame is None:
        first_frame = await channel.receive()
        if first_frame is None:
            return
    # What the session is and asks for: decided in policy.admission, steps 1-4.
    decision = admission(
        first_frame,
        endpoint=service_name,
        suite=fabric.suite,
        query=query or {},
        query_mounts=query_mounts,
    )
    request_id = progress.first_request_id = decision.request_id
    if isinstance(decision, Refusal):
        await refused(request_id, decision.error)
        return
    try:
        # The mount policy resolves paths on the file system: the one step that does I/O.
        mounts = await fabric.validate_mounts(decision.mounts)
    except FabricError as exc:
        await refused(request_id, exc)
        return
    traceparent = traceparent if traceparent and valid_traceparent(traceparent) else None
    record = SessionRecord(
        service_name,
        transport,
        id=session_id,
        client=client,
        mounts=mounts,
        trace_id=trace_of(traceparent) or secrets.token_hex(16),
        started_at=time.time(),
        last_active=trio.current_time(),
    )
    full = fabric.admit(session_id, record)  # step 5, and the session counted if admitted
    if full is not None:
        await refused(request_id, full)
        return
    observer.session_started(
        session_id,
        endpoint=record.endpoint,
        service=service_name,
        client=client,
        mounts=record.mount_records(),
        trace_id=record.trace_id,
        traceparent=traceparent,
    )
    try:
        log.info(
            "session_started",
            extra={
                "session": session_id,
                "service": service_name,
                "transport": transport,
                "mounts": [m.target for m in mounts],
                "trace_id": record.trace_id,
            },
        )
        driver: _Driver
        if decision.options is not None:
            driver = await fabric_driver(
                fabric, channel, session_id=session_id, record=record, options=decision.options
            )
        else:
            assert decision.service is not None
            driver = SessionDriver(
                fabric,
                channel,
                service_name,
                decision.service,
                session_id=session_id,
                record=record,
            )
        progress.driver = driver
        await driver.run(first_frame, decision.first)
    finally:
        fabric.release(session_id)
        log.info("session_ended", extra={"session": session_id, "service": service_name})
        observer.session_ended(
            session_id,
            endpoint=record.endpoint,
            service=service_name,
            seconds=time.time() - record.started_at,
            calls=record.tool_calls,
        )


def client_of(fabric: Fabric, request: Request, transport: str) -> Client:
    """Who opened a session, for the audit: the token it was admitted with, its address."""
    return Client(fabric.token_id, request.peer, transport, request.header(b"user-agent"))


async def refuse(
    channel: ClientChannel, request_id: object, error: FabricError, *, service: str
) -> None:
    """Answer the first message with ``error`` and close, normally: nothing was started.

    The close is a normal one (1000) so that clients deliver the error to the waiting request
    instead of failing on the close (the Python SDK 1.x raises on any other code).
    """
    log.warning(
        "session_refused",
        extra={
            "service": service,
            "code": error.code,
            "reason": error.reason,
            "detail": str(error),
        },
    )
    try:
        await channel.send(error_response(request_id, error))
        await channel.close(CLOSE_NORMAL, error.reason)
    except ChannelClosed:
        return  # the client is gone: nobody to tell


class SessionDriver:
    """Runs one :class:`SessionMachine` against a client channel and a container runtime."""

    def __init__(
        self,
        fabric: Fabric,
        channel: ClientChannel,
        service_name: str,
        service: Service,
        *,
        session_id: str,
        record: SessionRecord,
    ) -> None:
        self.fabric = fabric
        self.channel = channel
        self.service_name = service_name
        self.service = service
        self.session_id = session_id
        self.record = record
        self.mounts = record.mounts
        self.observer: Observer = fabric.observer
        self.metrics = fabric.observer.metrics
        self.machine = SessionMachine(
            service_name=service_name,
            idle_timeout=service.idle_timeout_seconds,
            limits=fabric.session_limits(service),
            now=trio.current_time(),
            audit_arguments=fabric.audit_arguments,
        )
        self._fields = {"session": session_id, "service": service_name}
        self._live: dict[int, LiveContainer] = {}
        self._nursery: trio.Nursery | None = None
        self._timer = DeadlineTimer(lambda: self.machine.deadline, lambda: self._feed(Tick()))
        self._accepting = trio.Event()

    def owed_frames(self, error: FabricError) -> list[bytes]:
        """What the client is owed if the session must end now with ``error``."""
        return [a.frame for a in self.machine.answer_all(error) if isinstance(a, SendToClient)]

    # --- the machine --------------------------------------------------------------------------

    async def _feed(self, event: Event) -> None:
        actions = self.machine.handle(event, trio.current_time())
        self._after_handle()
        await self._execute(actions)

    def _after_handle(self) -> None:
        self._timer.wake()
        if self.machine.accepting:
            self._accepting.set()

    async def _execute(self, actions: list[Action]) -> None:
        nursery = self._nursery
        assert nursery is not None
        for action in actions:
            match action:
                case WriteStdin():
                    self._write(action)
                case SendToClient():
                    await self._send_client(action)
                case Log():
                    self._log(action)
                case Spawn(seq=seq):
                    nursery.start_soon(self._spawn, seq)
                case StopContainer():
                    self._stop(action)
                case CloseClient(code=code, reason=reason):
                    with contextlib.suppress(ChannelClosed):
                        await self.channel.close(code, reason)
                case EndSession():
                    nursery.cancel_scope.cancel()
                case ToolCallDone():
                    # The call's outcome is read later, after the answer went out.
                    self._audit(action)

    def _audit(self, call: ToolCallDone | ToolCall) -> None:
        seq = self.machine.current_seq
        live = self._live.get(seq) if seq is not None else None
        audit_call(self.fabric, self.record, call, service=self.service_name, live=live)

    def _log(self, action: Log) -> None:
        log.log(_LEVELS[action.level], action.event, extra={**self._fields, **action.fields})

    # --- client side --------------------------------------------------------------------------

    async def run(self, first_frame: bytes, first: object) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                now = trio.current_time()
                nursery.start_soon(self._timer.run)
                nursery.start_soon(self._watch_shutdown)
                nursery.start_soon(self._watch_operator)
                if isinstance(first, RegisterClient):
                    await self._send_client(
                        SendToClient(register_answer(first, self.session_id, self.mounts))
                    )
                    await self._execute(self.machine.start_container(now))
                else:
                    await self._feed(ClientFrame(first_frame))
                nursery.start_soon(self._read_client)
        finally:
            # Calls the machine never saw end (the session was cancelled): no answer.
            for call in self.machine.calls.abandon(trio.current_time()):
                self._audit(call)
            with trio.move_on_at(self.fabric.teardown_deadline()) as scope:
                scope.shield = True
                async with trio.open_nursery() as cleanup:
                    for live in list(self._live.values()):
                        cleanup.start_soon(self._remove, live)

    async def _read_client(self) -> None:
        while True:
            while not self.machine.accepting:
                self._accepting = trio.Event()
                await self._accepting.wait()
            frame = await self.channel.receive()
            if frame is None:
                await self._feed(ClientGone())
                return
            self.record.last_active = trio.current_time()
            await self._feed(ClientFrame(frame))

    async def _send_client(self, action: SendToClient) -> None:
        frame = action.frame
        self.metrics.bytes_to_client += len(frame)
        if action.error is not None:
            self.observer.error_sent(*action.error)
        try:
            await self.channel.send(frame, action.message)
        except ChannelClosed:
            await self._feed(ClientGone())

    async def _watch_shutdown(self) -> None:
        await self.fabric.stopping.wait()
        await self._feed(Shutdown())

    async def _watch_operator(self) -> None:
        await self.record.ended_by_operator.wait()
        log.warning("session_ended_by_operator", extra=self._fields)
        await self._feed(Shutdown(ENDED_BY_OPERATOR))

    # --- container side -----------------------------------------------------------------------

    async def _spawn(self, seq: int) -> None:
        try:
            container = await start_container(
                self.fabric,
                self.service_name,
                self.service,
                session_id=self.session_id,
                mounts=self.mounts,
                sequence=seq,
                fields=self._fields,
                respawn=seq > 0,
            )
        except FabricError as exc:
            await self._feed(SpawnFailed(seq, exc))
            return
        live = LiveContainer(seq, container)
        self._live[seq] = live
        assert self._nursery is not None
        self._nursery.start_soon(self._write_stdin, live)
        self._nursery.start_soon(self._read_stdout, live)
        self._nursery.start_soon(self._read_stderr, live)
        await self._feed(SpawnSucceeded(seq))

    def _write(self, action: WriteStdin) -> None:
        live = self._live.get(action.seq)
        if live is None or live.removing:
            return  # the container is going away; what it was owed is answered by the machine
        self.metrics.bytes_to_server += len(action.data)
        live.queue.append(action.data)
        live.queued.set()

    async def _write_stdin(self, live: LiveContainer) -> None:
        """The one writer of this container's stdin: drains the queue, several lines at once."""
        stdin = live.container.stdin
        while True:
            await live.queued.wait()
            live.queued = trio.Event()
            data = live.queue[0] if len(live.queue) == 1 else b"".join(live.queue)
            live.queue.clear()
            # No deadline here: a container that stops taking its input is the machine's call
            # (its deadline), which stops it — and that ends this write.
            try:
                await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # The container is gone: its stdout reader reports the exit.
                log.info("stdin_closed", extra=self._fields)
                return
            await self._feed(StdinWritten(live.seq, len(data)))

    async def _read_stdout(self, live: LiveContainer) -> None:
        splitter = LineSplitter(max_line=self.fabric.max_message_bytes)
        stdout = live.container.stdout
        try:
            while data := await stdout.receive_some(READ_CHUNK):
                for line in splitter.feed(bytes(data)):
                    await self._feed(StdoutLine(live.seq, line))
        except FramingError as exc:
            live.stdout_done.set()
            await self._feed(ContainerBroken(live.seq, OUTPUT_INVALID, str(exc)))
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            live.reading_stdout = False
        live.stdout_done.set()
        if live.removing:
            return  # stopped on purpose; the machine knows
        exit_code, oom = await how_it_exited(self.fabric, live, self._fields)
        await self._feed(ContainerExited(live.seq, exit_code, oom, tuple(live.stderr_tail)))

    async def _read_stderr(self, live: LiveContainer) -> None:
        await read_stderr(live, self._fields)

    def _stop(self, action: StopContainer) -> None:
        live = self._live.get(action.seq)
        if live is None or live.removing:
            return
        live.stop_reason, live.stop_graceful = action.reason, action.graceful
        assert self._nursery is not None
        self._nursery.start_soon(self._remove, live)

    async def _remove(self, live: LiveContainer) -> None:
        await remove_container(
            self.fabric, live, self._fields, forget=lambda: self._live.pop(live.seq, None)
        )
