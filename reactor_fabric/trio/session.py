"""One client session: a connection, its nursery, its container, and the relay between them.

Ownership tree of a session (all in the session's own nursery)::

    serve_session
    ├── _pump_client      client frames → peek → bounded queue (in order)
    ├── _pump_stdin       queue → (start the container if none) → container stdin
    ├── _idle_watchdog    stop the container after `timeout` with nothing in flight
    ├── _start_early      the first spawn, overlapping the client's MCP handshake
    └── _read_container   one per container: stdout lines → client, stderr → log

Resource handling: leaving the session's nursery for any reason (client gone, error,
cancellation, shutdown) removes its container in a ``finally`` that is shielded and bounded in
time. A container that is stopped for idleness or dies is replaced on the client's next message;
a recorded ``initialize`` handshake is replayed to the new one so the MCP session continues.

Error handling: every error the client sees is a JSON-RPC error object with the product's code
and ``data.reason``; container failures answer the requests that were in flight with -32002.
Nothing a client or container does raises out of :func:`serve_session`, except cancellation.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import secrets
from dataclasses import dataclass, field
from typing import Protocol

import trio

from .._errors import (
    ContainerStartFailure,
    FabricError,
    InvalidMessage,
    SecurityViolation,
    ServiceNotFound,
)
from ..config.structs import Service
from ..policy.container_spec import ContainerIdentity, MountSpec, container_spec_for
from ..policy.mounts import parse_query_mount
from ..protocol.framing import STDOUT, DockerStreamDemuxer, FramingError, LineSplitter
from ..protocol.handshake import RegisterClient, classify_first_message, register_answer
from ..protocol.jsonrpc import Peek, error_response, for_stdio, peek
from ..protocol.ledger import Ledger
from ..runtime.base import ContainerBackend, SpawnedContainer

log = logging.getLogger(__name__)

# Client messages waiting for the container (e.g. while it starts): beyond this, the client's
# connection is no longer read, so a fast client stalls only itself.
QUEUE_DEPTH = 64
STDERR_TAIL_LINES = 20
# How long a fresh container may take to answer the replayed `initialize`.
REPLAY_BOUND_SECONDS = 30.0
# Closing stdin asks a stdio server to exit; after this it is stopped (SIGTERM, then SIGKILL).
STDIN_CLOSE_GRACE_SECONDS = 0.5
TEARDOWN_BOUND_SECONDS = 15.0
READ_CHUNK = 65536

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN_LATER = 1013


def new_session_id() -> str:
    """A session id: random, 128 bits, safe in URLs, headers and container names."""
    return secrets.token_hex(16)


class ClientChannel(Protocol):
    """A client connection carrying one JSON-RPC message per frame."""

    async def receive(self) -> bytes | None:
        """The next message (UTF-8 bytes), or None once the client has gone."""

    async def send(self, frame: bytes, message: Peek | None = None) -> None:
        """Deliver one message; raises trio.BrokenResourceError if the client has gone.

        ``message`` is the frame's envelope when the relay has already peeked at it, so a
        channel that routes by envelope (Streamable HTTP) need not decode it again.
        """

    async def close(self, code: int, reason: str = "") -> None: ...


class SessionHost(Protocol):
    """What a session needs from the orchestrator (:class:`~reactor_fabric.trio.fabric.Fabric`)."""

    @property
    def engine(self) -> ContainerBackend: ...

    @property
    def max_message_bytes(self) -> int: ...

    def service(self, name: str) -> Service | None: ...

    def container_identity(self) -> ContainerIdentity: ...

    async def validate_mounts(self, mounts: object) -> tuple[MountSpec, ...]: ...

    def admit(self, session_id: str) -> bool: ...

    def release(self, session_id: str) -> None: ...

    def container_started(self) -> None: ...

    def container_stopped(self) -> None: ...


async def serve_session(
    host: SessionHost,
    channel: ClientChannel,
    service_name: str,
    query_mounts: list[str],
    *,
    session_id: str | None = None,
) -> None:
    """Run one client connection from its first message to its end (see module docstring).

    ``session_id`` is chosen here unless the transport needs it beforehand (Streamable HTTP
    announces it in a header of the first response).
    """
    first_frame = await channel.receive()
    if first_frame is None:
        return
    try:
        first = classify_first_message(first_frame)
    except InvalidMessage as exc:
        await _refuse(channel, None, exc, service=service_name)
        return
    request_id = first.id if isinstance(first, RegisterClient) else first.peek.id
    service = host.service(service_name)
    if service is None:
        not_found = ServiceNotFound(
            f"no service named {service_name!r} in the suite",
            reason="service_not_found",
            service=service_name,
        )
        await _refuse(channel, request_id, not_found, service=service_name)
        return
    try:
        requested: object = (
            first.mounts
            if isinstance(first, RegisterClient)
            else [parse_query_mount(text) for text in query_mounts]
        )
        mounts = await host.validate_mounts(requested)
    except SecurityViolation as exc:
        await _refuse(channel, request_id, exc, service=service_name)
        return
    session_id = session_id or new_session_id()
    if not host.admit(session_id):
        full = ContainerStartFailure(
            "the orchestrator has reached its limit of concurrent sessions; try again later",
            reason="too_many_sessions",
        )
        await _refuse(channel, request_id, full, service=service_name, code=CLOSE_TRY_AGAIN_LATER)
        return
    try:
        session = Session(
            host=host,
            channel=channel,
            service_name=service_name,
            service=service,
            session_id=session_id,
            mounts=mounts,
        )
        log.info(
            "session_started",
            extra={
                "session": session_id,
                "service": service_name,
                "mounts": [m.target for m in mounts],
            },
        )
        await session.run(first_frame, first)
    finally:
        host.release(session_id)
        log.info("session_ended", extra={"session": session_id, "service": service_name})


async def _refuse(
    channel: ClientChannel,
    request_id: object,
    error: FabricError,
    *,
    service: str,
    code: int = CLOSE_POLICY,
) -> None:
    log.warning(
        "session_refused",
        extra={
            "service": service,
            "code": error.code,
            "reason": error.reason,
            "detail": str(error),
        },
    )
    answer_id = request_id if isinstance(request_id, str | int) else None
    try:
        await channel.send(error_response(answer_id, error))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
    await channel.close(code, error.reason)


@dataclass
class _Running:
    """One container of the session and what the relay knows about it."""

    container: SpawnedContainer
    sequence: int
    exited: trio.Event = field(default_factory=trio.Event)
    stopping: bool = False
    replay_id: str | None = None
    replay_answered: trio.Event = field(default_factory=trio.Event)
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES)
    )
    # Why the relay gave up on the container's output, if it did (e.g. a line over the limit).
    output_error: str | None = None


@dataclass
class _StartAttempt:
    done: trio.Event = field(default_factory=trio.Event)
    result: _Running | None = None
    error: FabricError | None = None


class Session:
    def __init__(
        self,
        *,
        host: SessionHost,
        channel: ClientChannel,
        service_name: str,
        service: Service,
        session_id: str,
        mounts: tuple[MountSpec, ...],
    ) -> None:
        self.host = host
        self.channel = channel
        self.service_name = service_name
        self.service = service
        self.id = session_id
        self.mounts = mounts
        self.ledger = Ledger()
        self._idle_timeout = service.idle_timeout_seconds
        self._running: _Running | None = None
        self._attempt: _StartAttempt | None = None
        self._sequence = 0
        self._last_activity = trio.current_time()
        self._writing = False
        self._container_up = trio.Event()
        self._queue_in, self._queue_out = trio.open_memory_channel[tuple[Peek, bytes]](QUEUE_DEPTH)
        self._nursery: trio.Nursery | None = None

    @property
    def _log_fields(self) -> dict[str, object]:
        return {"session": self.id, "service": self.service_name}

    async def run(self, first_frame: bytes, first: object) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if isinstance(first, RegisterClient):
                    await self.channel.send(register_answer(first, self.id, self.mounts))
                else:
                    await self._queue_in.send((peek(first_frame), first_frame))
                nursery.start_soon(self._start_early)
                nursery.start_soon(self._pump_client, nursery.cancel_scope)
                nursery.start_soon(self._pump_stdin)
                nursery.start_soon(self._idle_watchdog)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away mid-send: an ordinary end of a session
        finally:
            with trio.move_on_after(TEARDOWN_BOUND_SECONDS) as scope:
                scope.shield = True
                await self._stop_container("session_ended")

    # --- client side ----------------------------------------------------------------------

    async def _pump_client(self, session_scope: trio.CancelScope) -> None:
        while (frame := await self.channel.receive()) is not None:
            self._touch()
            try:
                message = peek(frame)
            except InvalidMessage as exc:
                log.info("client_message_refused", extra={**self._log_fields, "reason": exc.reason})
                await self.channel.send(error_response(None, exc))
                continue
            running = self._ready_for_direct_write()
            if running is not None:
                # The hot path: a running container and nothing queued before this frame, so
                # writing it here keeps the order and saves a hop through the queue.
                self._writing = True
                try:
                    await self._write(running, message, frame)
                finally:
                    self._writing = False
                continue
            await self._queue_in.send((message, frame))
        session_scope.cancel()  # the client has gone: end the session

    def _ready_for_direct_write(self) -> _Running | None:
        running = self._running
        if (
            running is None
            or running.stopping
            or running.exited.is_set()
            or self._attempt is not None
            or self._writing
            or self._queue_out.statistics().current_buffer_used
        ):
            return None
        return running

    async def _pump_stdin(self) -> None:
        """Frames that had to wait (no container yet, or others ahead of them), in order."""
        async for message, frame in self._queue_out:
            self._writing = True
            try:
                try:
                    running = await self._ensure_container()
                except FabricError as exc:
                    await self._answer_failure(message, exc)
                    continue
                await self._write(running, message, frame)
            finally:
                self._writing = False

    async def _write(self, running: _Running, message: Peek, frame: bytes) -> None:
        self.ledger.from_client(message, frame)
        try:
            await running.container.stream.send_all(for_stdio(frame) + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The container is gone; its reader answers what was in flight.
            log.info("stdin_closed", extra=self._log_fields)
        self._touch()

    async def _answer_failure(self, message: Peek, error: FabricError) -> None:
        log.error(
            "request_failed",
            extra={
                **self._log_fields,
                "code": error.code,
                "reason": error.reason,
                "detail": str(error),
                "method": message.method,
            },
        )
        if message.is_request:
            await self.channel.send(error_response(message.id, error))

    async def _to_client(self, running: _Running, line: bytes) -> None:
        try:
            message = peek(line)
        except InvalidMessage as exc:
            # Not JSON-RPC on stdout (a misbehaving server printing logs there): drop it, since
            # it would break the client's parser, and keep it in the log.
            log.warning(
                "server_stdout_not_jsonrpc",
                extra={
                    **self._log_fields,
                    "reason": exc.reason,
                    "line": line[:500].decode("utf-8", "replace"),
                },
            )
            return
        self._touch()
        if not self.ledger.from_server(message):
            if message.id == running.replay_id:
                running.replay_answered.set()
            return
        await self.channel.send(line, message)

    # --- container side -------------------------------------------------------------------

    async def _start_early(self) -> None:
        # A failure is logged by the attempt; the next client message tries again and gets the
        # error as its answer.
        with contextlib.suppress(FabricError):
            await self._ensure_container()

    async def _ensure_container(self) -> _Running:
        """The running container, starting one (and replaying the handshake) if there is none."""
        while True:
            running = self._running
            if running is not None and not running.exited.is_set() and not running.stopping:
                return running
            if self._attempt is None:
                attempt = self._attempt = _StartAttempt()
                try:
                    attempt.result = await self._spawn()
                except FabricError as exc:
                    attempt.error = exc
                    log.error(
                        "container_start_failed",
                        extra={
                            **self._log_fields,
                            "code": exc.code,
                            "reason": exc.reason,
                            "detail": str(exc),
                            "image": self.service.image,
                        },
                    )
                finally:
                    attempt.done.set()
                    self._attempt = None
            else:
                attempt = self._attempt
                await attempt.done.wait()
            if attempt.error is not None:
                raise attempt.error
            if attempt.result is None:  # the attempt was cancelled
                continue

    async def _spawn(self) -> _Running:
        assert self._nursery is not None
        sequence = self._sequence
        self._sequence += 1
        spec = container_spec_for(
            self.service_name,
            self.service,
            session_id=self.id,
            mounts=self.mounts,
            sequence=sequence,
            identity=self.host.container_identity(),
        )
        container = await self.host.engine.spawn(spec)
        running = self._running = _Running(container, sequence)
        self.host.container_started()
        self._container_up.set()
        log.info(
            "container_started",
            extra={
                **self._log_fields,
                "container": container.id[:12],
                "container_name": container.name,
                "sequence": sequence,
            },
        )
        self._nursery.start_soon(self._read_container, running)
        replay = self.ledger.replay()
        if replay is not None:
            running.replay_id = replay.initialize_id
            try:
                await container.stream.send_all(replay.initialize + b"\n")
                with trio.move_on_after(REPLAY_BOUND_SECONDS):
                    await running.replay_answered.wait()
                if not running.replay_answered.is_set():
                    raise ContainerStartFailure(
                        "the new container did not answer the replayed initialize",
                        reason="replay_failed",
                        stderr=list(running.stderr_tail),
                    )
                if replay.initialized is not None:
                    await container.stream.send_all(replay.initialized + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ContainerStartFailure(
                    "the new container exited while its session was being restored",
                    reason="replay_failed",
                    stderr=list(running.stderr_tail),
                ) from exc
            log.info("session_restored", extra={**self._log_fields, "sequence": sequence})
        return running

    async def _read_container(self, running: _Running) -> None:
        demuxer = DockerStreamDemuxer(max_frame=self.host.max_message_bytes)
        stdout = LineSplitter(max_line=self.host.max_message_bytes)
        stderr = LineSplitter(max_line=64 * 1024)
        stream = running.container.stream
        try:
            while data := await stream.receive_some(READ_CHUNK):
                for stream_id, payload in demuxer.feed(bytes(data)):
                    if stream_id == STDOUT:
                        for line in stdout.feed(payload):
                            await self._to_client(running, line)
                    else:
                        for line in stderr.feed(payload):
                            self._log_stderr(running, line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except FramingError as exc:
            # A server whose output cannot be relayed (a message over max_message_size, broken
            # framing) is replaced like one that died: its in-flight requests get the reason.
            running.output_error = str(exc)
            log.error("container_output_invalid", extra={**self._log_fields, "detail": str(exc)})
        finally:
            running.exited.set()
            running.replay_answered.set()  # wake a replay waiting on a container that is gone
        if not running.stopping:
            with trio.move_on_after(TEARDOWN_BOUND_SECONDS) as scope:
                scope.shield = True
                await self._container_died(running)

    def _log_stderr(self, running: _Running, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        running.stderr_tail.append(text)
        log.info(
            "container_stderr",
            extra={**self._log_fields, "sequence": running.sequence, "line": text},
        )

    async def _container_died(self, running: _Running) -> None:
        engine = self.host.engine
        exit_code: int | None = None
        oom = False
        try:
            status = await engine.exit_status(running.container.id)
            exit_code, oom = status.exit_code, status.oom_killed
        except FabricError as exc:
            log.warning(
                "container_inspect_failed", extra={**self._log_fields, "reason": exc.reason}
            )
        lost = self.ledger.container_gone()
        log.error(
            "container_exited",
            extra={
                **self._log_fields,
                "exit_code": exit_code,
                "oom_killed": oom,
                "in_flight": len(lost),
                "stderr": list(running.stderr_tail),
            },
        )
        await self._release(running)
        if running.output_error is not None:
            error = ContainerStartFailure(
                f"the {self.service_name} server's output could not be relayed "
                f"({running.output_error}); the container was replaced",
                reason="container_output_invalid",
                stderr=list(running.stderr_tail),
            )
        else:
            error = ContainerStartFailure(
                f"the {self.service_name} server exited"
                + (f" with code {exit_code}" if exit_code is not None else "")
                + (" (out of memory)" if oom else "")
                + " before answering",
                reason="container_exited",
                exit_code=exit_code,
                oom_killed=oom,
                stderr=list(running.stderr_tail),
            )
        for request_id, _method in lost:
            try:
                await self.channel.send(error_response(request_id, error))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    async def _release(self, running: _Running) -> None:
        """Close the stream and remove the container (idempotent)."""
        if self._running is running:
            self._running = None
            self._container_up = trio.Event()
            self.host.container_stopped()
        await running.container.stream.aclose()
        await self.host.engine.remove(running.container.id)
        log.info(
            "container_removed", extra={**self._log_fields, "container": running.container.id[:12]}
        )

    async def _stop_container(self, reason: str) -> None:
        """Stop the current container on purpose: close stdin, brief grace, then remove."""
        running = self._running
        if running is None:
            return
        running.stopping = True
        log.info("container_stopping", extra={**self._log_fields, "reason": reason})
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await running.container.stream.send_eof()
        with trio.move_on_after(STDIN_CLOSE_GRACE_SECONDS):
            await running.exited.wait()
        await self._release(running)

    def _touch(self) -> None:
        self._last_activity = trio.current_time()

    async def _idle_watchdog(self) -> None:
        if math.isinf(self._idle_timeout):
            return
        while True:
            await self._container_up.wait()
            deadline = self._last_activity + self._idle_timeout
            if trio.current_time() < deadline:
                await trio.sleep_until(deadline)
                continue
            busy = (
                self.ledger.busy
                or self._writing
                or self._queue_out.statistics().current_buffer_used > 0
                or self._attempt is not None
            )
            if busy:
                self._touch()
                continue
            await self._stop_container("idle")
