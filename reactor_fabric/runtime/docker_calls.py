"""The Docker engine's calls: the engine client in worker threads, each bounded, each failure
translated.

The client (:mod:`.engine_api`) is blocking, so every API call runs in a worker thread (never
on the trio thread), bounded in time (30 s by default, the product's contract; a pull 10
minutes) and in parallelism (a capacity limiter: a burst of sessions queues for a slot, up to 5
minutes, before its own bound starts). The client is made lazily, in the first call's thread,
so an orchestrator starts (and reports an unhealthy engine) while the engine is down, and
reconnects once it is back; whoever made the :class:`DockerCalls` is told what the engine says
it is when it first answers.

Error handling: each call's exception is translated at the call (:mod:`.docker_errors`) into
the product's errors; the product's own errors raised in a call pass through as they are; a
call that outran its bound, or never got a slot, is DockerUnavailable (``docker_timeout``).

Resource handling: a call that is cancelled (or times out) while its thread runs is *abandoned*:
trio stops waiting, but the thread goes on. Such a thread undoes its work when it ends (the
caller says how: ``if_abandoned`` — an abandoned create removes its container by name, an
abandoned attach closes its socket), exactly once, also when the thread ended just as trio gave
up; and ``release`` frees what the engine may use while the call runs (pinned descriptors) only
once the call can no longer run. :meth:`DockerCalls.settle` waits, bounded, for abandoned
threads, and :meth:`DockerCalls.close` settles before it closes the client, so shutdown never
races them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from .._errors import FabricError
from .docker_errors import engine_busy, engine_timed_out, translate_docker_error
from .engine_api import EngineAddress, EngineClient, EngineError
from .engines import EngineIdentity, identify

# Logged under the Docker runtime's name, as before its modules were split (operators filter
# the log by it).
log = logging.getLogger("reactor_fabric.runtime.docker")

T = TypeVar("T")

DOCKER_CALL_TIMEOUT = 30.0
# How long a call may wait for one of the max_parallel_calls slots before it begins (its own
# bound starts when it begins): a burst of sessions queues here behind a busy engine, and each
# call is then judged on the engine's answer, not on the queue ahead of it.
DOCKER_QUEUE_TIMEOUT = 300.0
# Pulling an image legitimately takes longer than an API call.
DOCKER_PULL_TIMEOUT = 600.0
# How long close() waits for threads that cancellations abandoned.
ABANDONED_WORK_BOUND = 35.0


class _NotRun(Exception):
    pass


class _Operation:
    """One worker-thread call, whether trio stopped waiting for it, and what it left behind."""

    __slots__ = ("abandoned", "client", "done", "lock", "result", "started")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = False
        self.done = False
        self.abandoned = False
        self.client: EngineClient | None = None
        self.result: Any = None

    def finish(self, client: EngineClient | None, result: object) -> bool:
        """Mark the call done (in its thread); whether trio had stopped waiting for it."""
        with self.lock:
            self.done = True
            self.client = client
            self.result = result
            return self.abandoned


class DockerCalls:
    """The calls to one engine (``base_url``; None: the environment's ``DOCKER_HOST``, else
    the local socket); ``identified`` is told what the engine is when it first answers.

    Error handling: EngineAddressError (at once) for an address the client cannot use.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        call_timeout: float = DOCKER_CALL_TIMEOUT,
        queue_timeout: float = DOCKER_QUEUE_TIMEOUT,
        max_parallel_calls: int = 16,
        identified: Callable[[EngineIdentity], None] = lambda _identity: None,
        runtimes: Callable[[frozenset[str]], None] = lambda _names: None,
    ) -> None:
        self._address = EngineAddress.parse(base_url)
        self._call_timeout = call_timeout
        self._queue_timeout = queue_timeout
        self._limiter = trio.CapacityLimiter(max_parallel_calls)
        self._identified = identified
        self._runtimes = runtimes
        self._client: EngineClient | None = None
        self._client_lock = threading.Lock()
        # Threads trio stopped waiting for that have not finished yet.
        self._abandoned = 0
        self._abandoned_done = threading.Condition()

    def _connect(self) -> EngineClient:
        # Runs in a worker thread: the client speaks the API version the engine says it does,
        # so one client works with old engines (20.10 speaks 1.41) and new ones (which refuse
        # old versions).
        with self._client_lock:
            if self._client is None:
                client = EngineClient(self._address, timeout=max(1.0, self._call_timeout))
                self._identified(identify(client.version()))
                self._runtimes(_runtime_names(client))
                self._client = client
            return self._client

    async def call(
        self,
        action: str,
        fn: Callable[[EngineClient], T],
        *,
        time_bound: float | None = None,
        if_abandoned: Callable[[EngineClient, T | None], None] | None = None,
        release: Callable[[], None] | None = None,
    ) -> T:
        """Run ``fn(client)`` in a thread; translate errors; give up after the time bound.

        If trio stops waiting (cancellation, or the bound), the thread runs on; when it ends it
        calls ``if_abandoned(client, result or None)`` to undo what it did. ``release`` is
        called once ``fn`` can no longer run: when it has ended (in its thread, abandoned or
        not), or at once if the thread never began it.
        """
        # The default bound counts from when the call begins in its thread (a slot may take a
        # while under a burst: DOCKER_QUEUE_TIMEOUT); an explicit time_bound is the caller's
        # whole wait (a health check must answer within it, queue or not).
        bound = self._call_timeout if time_bound is None else time_bound
        queued = time_bound is None and self._queue_timeout > bound
        operation = _Operation()
        scope = trio.CancelScope(
            deadline=trio.current_time() + (self._queue_timeout if queued else bound)
        )
        trio_token = trio.lowlevel.current_trio_token()

        def bound_from_now() -> None:  # (in trio's thread)
            scope.deadline = min(scope.deadline, trio.current_time() + bound)

        def in_thread() -> T:
            with operation.lock:
                if operation.abandoned:
                    raise _NotRun  # trio gave up before the thread began: nothing to undo
                operation.started = True
            if queued:
                with contextlib.suppress(trio.RunFinishedError):
                    trio_token.run_sync_soon(bound_from_now)
            result: T | None = None
            client: EngineClient | None = None
            try:
                client = self._connect()
                result = fn(client)
                return result
            finally:
                if release is not None:
                    release()
                if operation.finish(client, result):
                    self._undo(action, operation, if_abandoned)

        try:
            with scope:
                try:
                    result: T = await trio.to_thread.run_sync(
                        in_thread, abandon_on_cancel=True, limiter=self._limiter
                    )
                except FabricError:
                    raise
                except trio.Cancelled:
                    self._abandon(action, operation, if_abandoned)
                    raise
                except Exception as exc:
                    raise translate_docker_error(exc, action) from exc
                return result
            began = operation.started
            self._abandon(action, operation, if_abandoned)
        finally:
            if release is not None and self._never_ran(operation):
                release()
        if queued and not began:
            raise engine_busy(action, self._queue_timeout, self._limiter.total_tokens)
        raise engine_timed_out(action, bound)

    def _abandon(
        self,
        action: str,
        operation: _Operation,
        if_abandoned: Callable[[EngineClient, Any], None] | None,
    ) -> None:
        """trio stopped waiting for ``operation``: whatever it did must be undone, once.

        Either its thread still runs (it undoes its work when it ends), or it has already
        ended and trio never took its result (the cancellation won the race with the thread's
        answer): then nobody else knows the result, so a thread of its own undoes it now.
        """
        with operation.lock:
            if operation.abandoned:
                return  # already abandoned (a timeout reaches here twice), or never ran
            operation.abandoned = True
            if not operation.started:
                return  # the thread will find it abandoned and not run the call
            ended = operation.done
            with self._abandoned_done:
                self._abandoned += 1
        if ended:
            threading.Thread(
                target=self._undo,
                args=(action, operation, if_abandoned),
                name=f"reactor-fabric-undo-{action}",
                daemon=True,
            ).start()

    def _undo(
        self,
        action: str,
        operation: _Operation,
        if_abandoned: Callable[[EngineClient, Any], None] | None,
    ) -> None:
        try:
            if if_abandoned is not None and operation.client is not None:
                if_abandoned(operation.client, operation.result)
        except Exception as exc:  # noqa: BLE001 - a cleanup of last resort
            log.error("abandoned_cleanup_failed", extra={"action": action, "detail": str(exc)})
        finally:
            self._abandoned_finished()

    @staticmethod
    def _never_ran(operation: _Operation) -> bool:
        """True if the thread has not begun the call, and now never will."""
        with operation.lock:
            if operation.started:
                return False
            operation.abandoned = True  # a thread that begins late finds this and does nothing
            return True

    def _abandoned_finished(self) -> None:
        with self._abandoned_done:
            self._abandoned -= 1
            self._abandoned_done.notify_all()

    @property
    def abandoned_calls(self) -> int:
        """Worker threads still running after trio stopped waiting for them."""
        with self._abandoned_done:
            return self._abandoned

    async def settle(self, bound: float = ABANDONED_WORK_BOUND) -> bool:
        """Wait until abandoned threads have finished (and cleaned up); False if ``bound`` passed.

        The wait is abandonable itself: a caller's deadline (a shutdown's) wins over ``bound``.
        """

        def wait_for_abandoned() -> bool:
            with self._abandoned_done:
                return self._abandoned_done.wait_for(lambda: self._abandoned == 0, bound)

        if not self.abandoned_calls:
            await trio.lowlevel.checkpoint()
            return True
        return await trio.to_thread.run_sync(wait_for_abandoned, abandon_on_cancel=True)

    async def close(self) -> None:
        """Wait (bounded) for abandoned threads, then close the client."""
        await self.settle()
        client, self._client = self._client, None
        if client is not None:
            await trio.to_thread.run_sync(client.close)


def _runtime_names(client: EngineClient) -> frozenset[str]:
    """The container runtimes the engine has registered (``GET /info``'s ``Runtimes``: Docker's
    daemon.json, Podman's containers.conf); none when it does not say."""
    try:
        runtimes = client.info().get("Runtimes")
    except (EngineError, ConnectionError):
        return frozenset()
    return frozenset(str(name) for name in runtimes) if isinstance(runtimes, dict) else frozenset()
