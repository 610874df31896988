"""The fabric endpoint's backends of one session and their lifecycles, without I/O: the table
its router (:mod:`.fabric_router`) keeps them in, and what becomes of them from their start to
their stop.

Each service the session calls gets a backend — a container of that service for this session,
started on first use and keyed by a :class:`~.events.BackendKey` whose ``seq`` counts the
session's starts and names the container (a respawn when its service ran one before). Each is
a :class:`Routed`: the one backend model of :mod:`.backend` (its state table, role, stdin
accounting, the rule for a backend that stopped reading) and the requests waiting for its
handshake (or its memory figure), at most :data:`MAX_QUEUED_PER_BACKEND`. It is ``starting``
until the driver reports it started, ``handshaking`` while it is greeted as a client would
(``initialize``), ``ready`` once it answered, when what waited for it is sent.

A backend that fails to start, exits, breaks its output, refuses the handshake or stops reading
is forgotten and, when it still runs, stopped at once (:class:`~.events.StopBackend`, logged
``backend_failed``), and what it owed is answered with its error (:meth:`BackendTable.failed`:
its calls, questions and lists go with it); an idle one is stopped gracefully. The next call
starts a fresh one (transparent respawn), and the session's other services are not affected.

Lifecycles (:class:`~.lifecycle.Lifecycle`, the suite's ``container_strategy``). By default a
service has one backend per session, its *current* one (:attr:`BackendTable.current`). A
``fresh_per_call`` service has none: each call starts a backend of its own, bound to it and
removed (``call_done``) once its call ended and its requests to the client were answered, at
most :data:`MAX_PER_CALL_CONTAINERS` at once per service. A ``smart_refresh`` service's current
backend that reached ``max_calls`` calls or ``max_age`` seconds is *retired*: the next call
starts a fresh one, and it is removed (``refresh_calls``, ``refresh_age``) once the calls it has
end, never under one; one between calls is retired when it reaches its age (a deadline). With
a ``memory_threshold`` it is measured between calls (:class:`~.events.MeasureBackend`, once
after each call; calls for it wait for the figure) and retired when over (``refresh_memory``).
Every backend is in :attr:`BackendTable.all`, by key.

Bounds. Every line sent to a backend is counted until the driver reports it written: the
client is not read while a backend has more than ``buffer_to_server_bytes`` waiting
(:attr:`BackendTable.accepting`: a slow service stalls only its session). A backend that has
stopped reading its stdin by the one rule of :mod:`.backend` — it leaves more than
``own_backlog_bytes`` of the machine's own messages unread (answers to its ``ping`` and
``roots/list``, refusals, refreshes, the handshake), or nothing sent to it moved for
``stall_timeout`` seconds — is treated as broken (``container_unresponsive``, as on the relay)
rather than grow the orchestrator's memory or hold its calls for ever. A backend's question the
client leaves unanswered for its time, or a call it does not resume in time, is answered here
to the backend (see :mod:`.fabric_exchanges`).

The table is made with the session's replies ledger, its requests in flight both ways and its
list refreshes (:class:`~.fabric_replies.Replies`, :class:`~.fabric_exchanges.Exchanges`,
:class:`~.fabric_refresh.Relists`): a backend's end takes its calls, questions and lists along.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._errors import ClientDidNotAnswer, ContainerStartFailure, FabricError
from .._reasons import (
    CALL_DONE,
    CLIENT_DID_NOT_ANSWER,
    EXITED,
    HANDSHAKE_FAILED,
    IDLE,
    INPUT_WAIT_EXPIRED,
    NOT_NEEDED,
    REFRESH_AGE,
    REFRESH_CALLS,
    REFRESH_MEMORY,
    SESSION_ENDED,
)
from .answers import UNRESPONSIVE, SessionLimits
from .backend import (
    Backend,
    Role,
    Step,
    age_deadline,
    measure_due,
    spent,
    start_measuring,
)
from .events import Action, BackendKey, Log, MeasureBackend, StopBackend, ToBackend, ToClient
from .fabric_exchanges import Exchanges
from .fabric_messages import handshake_request, notification_bytes
from .fabric_refresh import Relists
from .fabric_replies import Replies
from .jsonrpc import error_response
from .lifecycle import REUSE, Lifecycle
from .served import Served

Json = dict[str, Any]

MAX_QUEUED_PER_BACKEND = 64
# Bytes of the endpoint's own messages a backend may leave unread on its stdin, and bytes that
# may wait for a backend's stdin before the client is no longer read (the session's bound):
# by default the relay's bound on what waits for a server (the driver passes buffer_to_server).
OWN_BACKLOG_BYTES = SessionLimits().to_server_bytes
# Per-call containers of one service a session may have at once (fresh_per_call): one more call
# is refused (-32600 too_many_per_call_containers) rather than queued, so that a client sees at
# once that it asks more of the service than a session may.
MAX_PER_CALL_CONTAINERS = 8
# Stops that end a backend's work rather than a failure of it (not logged backend_failed).
QUIET_STOPS = frozenset(
    {IDLE, CALL_DONE, REFRESH_CALLS, REFRESH_AGE, REFRESH_MEMORY, NOT_NEEDED, INPUT_WAIT_EXPIRED}
)


@dataclass(frozen=True)
class Limits:
    """The session's bounds on its backends (see the module's docs)."""

    own_backlog_bytes: int = OWN_BACKLOG_BYTES
    buffer_to_server_bytes: int = OWN_BACKLOG_BYTES
    # A backend that takes none of the bytes sent to it for this long stopped reading its
    # stdin (the one rule of .backend, the relay's too: SessionLimits.stdin_stall_timeout).
    stall_timeout: float = SessionLimits().stdin_stall_timeout


class Waiting(NamedTuple):
    """A request waiting for its backend's handshake (or memory figure): as it will be
    sent, encoded once, so that what waits is counted in bytes (see accepting)."""

    request: Json
    line: bytes


@dataclass
class Routed(Backend):
    """A backend of the fabric endpoint: the one model of :mod:`.backend`, and the requests
    waiting for its handshake (or its memory figure), in order."""

    queue: list[Waiting] = field(default_factory=list)

    def clone(self) -> Routed:
        twin = super().clone()
        twin.queue = list(self.queue)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return (*super().fingerprint(), tuple(w.line for w in self.queue))


class BackendTable:
    """A session's backends by key, each service's current one among them, and what becomes
    of them (see the module's docs)."""

    def __init__(
        self,
        replies: Replies,
        exchanges: Exchanges,
        relists: Relists,
        *,
        version: str,
        lifecycles: Mapping[str, Lifecycle],
        idle_timeouts: Mapping[str, float],
        limits: Limits,
    ) -> None:
        self.replies, self.exchanges, self.relists = replies, exchanges, relists
        self.version = version  # (the orchestrator's, in each handshake)
        self.lifecycles = dict(lifecycles)
        self.idle_timeouts = dict(idle_timeouts)
        self.limits = limits
        # Which container served which call (get_status, /api/sessions), bounded.
        self.served = Served()
        # The session is ending (see end): its backends are owed nothing any more.
        self.ending: FabricError | None = None
        # Every backend the router counts on, and each service's current (shared) one among
        # them; a fresh_per_call backend, or a retiring smart_refresh one, is only in the first.
        self.all: dict[BackendKey, Routed] = {}
        self.current: dict[str, Routed] = {}
        self.seq = 0  # the last backend's sequence (it names its container)
        self.had: set[str] = set()  # services that had a container (the next is a respawn)

    @property
    def now(self) -> float:
        """The time of the event being handled (the replies ledger's: the server's clock)."""
        return self.replies.now

    def lifecycle(self, service: str) -> Lifecycle:
        return self.lifecycles.get(service, REUSE)

    # --- starts ---------------------------------------------------------------------------------

    def add(self, service: str, role: Role) -> Routed:
        """A new backend of ``service``, to be started, with its first call counted."""
        self.seq += 1
        backend = Routed(BackendKey(service, self.seq), role=role, last_active=self.now, calls=1)
        self.all[backend.key] = backend
        self.served.asked(backend.key, self.lifecycle(service).strategy, self.now)
        if role is Role.CURRENT:
            self.current[service] = backend
        return backend

    def per_call(self, service: str) -> int:
        """The service's backends bound to a call each (fresh_per_call) the session has."""
        return sum(1 for b in self.all.values() if b.key.service == service and b.role is Role.CALL)

    def started(self, key: BackendKey, container: str, *, greeted: bool) -> list[Action]:
        """The service's container runs: greet it as a client would, unless the warm pool did
        (``greeted``: a per-call one, its handshake done while it waited): then it is ready."""
        self.served.started(key, container, self.now)
        self.had.add(key.service)
        backend = self.all.get(key)
        if backend is None or self.ending is not None:
            return []
        backend.started_at = self.now
        if backend.role is not Role.CURRENT and not backend.queue:
            # Its call was cancelled while it started (or, retiring, its calls): not needed.
            self._remove(key)
            return self._stop(key, NOT_NEEDED)
        backend.last_active = self.now
        if greeted:
            backend.advance(Step.STARTED_GREETED)
            note = {"backend": key.service, "sequence": key.seq}
            return [Log("info", "backend_greeted_by_pool", note), *self.send_queue(key, backend)]
        backend.advance(Step.STARTED)
        capabilities: Json = {"roots": {"listChanged": False}}
        for capability in ("sampling", "elicitation"):
            if self.replies.stateless:
                # A 2026-07-28 client says per call what it may be asked (see input_waits).
                capabilities[capability] = {}
            elif capability in self.replies.client_capabilities:
                capabilities[capability] = self.replies.client_capabilities[capability]
        our_id = self.exchanges.own(key, "initialize")
        return self.own(key, handshake_request(our_id, capabilities, self.version))

    def handshake_done(self, key: BackendKey, message: Json) -> list[Action]:
        """The backend answered its handshake: ready (what waited for it is sent), or, refused,
        removed as a failure."""
        backend = self.all.get(key)
        service = key.service
        if backend is None:
            return []
        if "result" not in message:
            error = message.get("error")
            detail = error.get("message") if isinstance(error, dict) else "no result"
            refused = ContainerStartFailure(
                f"{service} refused the handshake: {detail}", reason=HANDSHAKE_FAILED
            )
            # Removed as well as forgotten: the next call starts a fresh one, and this one
            # would otherwise run beside it until the session ends.
            stop = self._stop(key, refused.reason)
            return [*stop, *self._backend_failed(key, refused)]
        backend.advance(Step.GREETED)
        actions = self.own(key, notification_bytes("notifications/initialized", None))
        if key not in self.all:
            return actions  # it was found broken
        return actions + self.send_queue(key, backend)

    def send_queue(self, key: BackendKey, backend: Routed) -> list[Action]:
        """A backend just ready (or measured): the requests that waited for it, in order."""
        actions: list[Action] = []
        for waiting in backend.queue:
            actions += self.send(key, waiting.line)
        backend.queue = []
        return actions

    # --- writing to backends ------------------------------------------------------------------

    def send(self, key: BackendKey, data: bytes, *, own: bool = False) -> list[Action]:
        """One line for the backend ``key``, counted until reported written. A message of the
        endpoint's own (``own``) is within the bound on what it leaves unread: past it the
        backend has stopped reading its stdin while asking (pings, roots, refreshes…): it is
        broken, not the orchestrator's memory (one message alone may exceed the bound, as a
        client's may)."""
        backend = self.all.get(key)
        if backend is None:
            return []  # forgotten (broken, stopped): nothing is owed to it any more
        line = data + b"\n"
        size = len(line)
        if own and backend.stdin.overflows_own(size, self.limits.own_backlog_bytes):
            unread = f"{backend.stdin.own} bytes of the orchestrator's own messages to it unread"
            return self._unresponsive(key, unread)
        backend.stdin.sent(size, self.now, own=own)
        return [ToBackend(backend.key, line)]

    def own(self, key: BackendKey, data: bytes) -> list[Action]:
        return self.send(key, data, own=True)

    def written(self, backend: Routed, nbytes: int) -> None:
        """``nbytes`` of what was sent to ``backend`` (whole lines, oldest first) are written."""
        backend.stdin.written(nbytes, self.now)

    @property
    def accepting(self) -> bool:
        """Whether the client may be read: no backend has more than the session's bound
        waiting for its stdin — sent and not reported written, or waiting for its handshake
        (a slow service, or one slow to start, stalls only this session; without the second,
        a client could pile up to :data:`MAX_QUEUED_PER_BACKEND` messages of the largest size
        per starting backend)."""
        bound = self.limits.buffer_to_server_bytes
        return all(
            b.stdin.pending + sum(len(w.line) for w in b.queue) <= bound for b in self.all.values()
        )

    # --- stops and failures ---------------------------------------------------------------------

    def forget(self, key: BackendKey) -> None:
        backend = self.all.pop(key, None)
        if backend is not None:
            backend.advance(Step.STOPPED)
        current = self.current.get(key.service)
        if current is not None and current.key == key:
            del self.current[key.service]

    def _remove(self, key: BackendKey) -> None:
        """A backend that is not the current one goes (its call ended, it is not needed)."""
        self.all.pop(key).advance(Step.STOPPED)

    def _stop(self, key: BackendKey, reason: str, logged: str | None = None) -> list[Action]:
        """Stop a backend the table forgot, logged as failed (``backend_failed``, with
        ``logged`` or ``reason``) unless its work is done (idle, its call ended, refreshed).
        Gracefully (its stdin closed, a moment to exit) unless it no longer reads its stdin or
        has exited: those are removed at once."""
        self.served.ended(key, logged or reason, self.now)
        stop = StopBackend(key, reason, graceful=reason not in (UNRESPONSIVE, EXITED))
        if reason in QUIET_STOPS:
            return [stop]
        failed = {"backend": key.service, "reason": logged or reason}
        return [Log("warning", "backend_failed", failed), stop]

    def _unresponsive(self, key: BackendKey, detail: str) -> list[Action]:
        error = ContainerStartFailure(
            f"the {key.service} server stopped reading its input ({detail}); its container "
            "was removed, the next call starts a fresh one",
            reason=UNRESPONSIVE,
        )
        # Stopped first: the driver drops what waits for its stdin before the answers go out.
        stop = self._stop(key, UNRESPONSIVE)
        return [*stop, *self._backend_failed(key, error)]

    def output_ended(self, backend: Routed, error: FabricError) -> list[Action]:
        """A backend's output ended (it exited, or broke the framing): removed at once, logged
        as the failure it is, and what it owed answered with ``error``."""
        stop = self._stop(backend.key, EXITED, logged=error.reason)
        self.forget(backend.key)  # (also while the session ends)
        return [*stop, *self.failed(backend.key, error)]

    def failed(self, key: BackendKey, error: FabricError) -> list[Action]:
        """A backend could not start, or ended: answer what it owed, forget it (the next call
        starts a new one). The session's other backends go on."""
        if self.ending is not None:
            self.forget(key)
            return []  # it owes nothing any more
        return self.replies.with_done(self._backend_failed(key, error))

    def broken(self, key: BackendKey, error: FabricError) -> list[Action]:
        """A backend that answered what cannot be taken: what it owed answered, then stopped."""
        stop = self._stop(key, error.reason)
        return [*self._backend_failed(key, error), *stop]

    def _backend_failed(self, key: BackendKey, error: FabricError) -> list[Action]:
        self.served.ended(key, error.reason, self.now)
        current = self.current.get(key.service)
        if current is not None and current.key == key:
            self.relists.forget(key.service)
        self.forget(key)
        return self.exchanges.owed(key, error)

    # --- lifecycles -----------------------------------------------------------------------------

    def spent(self, backend: Routed) -> str | None:
        """Which bound a backend has reached (None while it may take calls)."""
        return spent(backend, self.lifecycle(backend.key.service), self.now)

    def retire(self, backend: Routed, bound: str) -> None:
        """smart_refresh: the service's current backend takes no more calls (the next starts a
        fresh one); it is removed, for ``bound``, once the calls it has end (see settle)."""
        backend.retire(bound)
        del self.current[backend.key.service]
        self.relists.forget(backend.key.service)

    def settle_all(self) -> list[Action]:
        """After every event: a smart_refresh backend past its bounds with no call in flight is
        retired now rather than at the next call, what is done is removed (settle), and one
        due for a memory reading is measured."""
        busy = self.exchanges.busy()
        for service, backend in list(self.current.items()):
            if self.lifecycle(service).strategy != "smart_refresh" or not backend.ready:
                continue
            bound = self.spent(backend)
            if bound is not None and backend.key not in busy:
                self.retire(backend, bound)
        return self.settle() + self.measure_between_calls()

    def settle(self) -> list[Action]:
        """Remove the backends whose work is done: a per-call one whose call ended (and whose
        requests to the client were answered), a retiring one whose calls ended. One still
        starting waits for its start: a stop before would find nothing."""
        if self.ending is not None:
            return []
        busy = self.exchanges.busy()
        actions: list[Action] = []
        for key, backend in list(self.all.items()):
            if backend.role is Role.CURRENT or not backend.ready or key in busy:
                continue
            self._remove(key)
            actions += self._stop(key, CALL_DONE if backend.role is Role.CALL else backend.retired)
        return actions

    def measure_between_calls(self) -> list[Action]:
        """A smart_refresh backend with a ``memory_threshold`` is measured between calls (ready,
        nothing in flight), once after each call that could have grown it (the relay's rule);
        calls for it meanwhile wait in its queue for the figure, so that a container over the
        threshold serves none."""
        if self.ending is not None:
            return []
        busy = self.exchanges.busy()
        actions: list[Action] = []
        for service, backend in self.current.items():
            if not measure_due(backend, self.lifecycle(service)) or backend.key in busy:
                continue
            start_measuring(backend)
            actions.append(MeasureBackend(backend.key))
        return actions

    # --- time -----------------------------------------------------------------------------------

    def deadlines(self) -> list[float]:
        """When backends' questions to the client expire, calls stop waiting for a retry, idle
        backends stop, one whose stdin does not move counts as no longer reading it, and
        current smart_refresh backends between calls reach their ``max_container_age``
        (retired then, as the relay does, rather than at the next event)."""
        busy = self.exchanges.busy()
        due = self.exchanges.deadlines()
        for backend in self.all.values():
            stalls = backend.stdin.stall_deadline(self.limits.stall_timeout)
            if stalls is not None:
                due.append(stalls)
        for service, backend in self.current.items():
            if backend.ready and backend.key not in busy:
                due.append(backend.last_active + self.idle_timeouts.get(service, math.inf))
        for service, backend in self.current.items():
            aged = age_deadline(backend, self.lifecycle(service))
            if aged is not None and backend.ready and backend.key not in busy:
                due.append(aged)
        return due

    def tick(self) -> list[Action]:
        """What came due of the backends' stdin, their questions to the client and the calls
        waiting for a retry (idle backends: :meth:`stop_idle`, last)."""
        return self._stop_stalled() + self._expire_asked() + self._expire_waits()

    def _stop_stalled(self) -> list[Action]:
        """Backends whose stdin did not move for the stall timeout: they stopped reading it
        (replaced at the next call, what they owed answered ``container_unresponsive``)."""
        actions: list[Action] = []
        timeout = self.limits.stall_timeout
        for key, backend in list(self.all.items()):
            if key in self.all and backend.stdin.stalled(self.now, timeout):
                actions += self._unresponsive(key, f"its input did not move for {timeout:g} s")
        return actions

    def _expire_asked(self) -> list[Action]:
        """Backends' questions the client left unanswered in time: answered to the backend."""
        actions: list[Action] = []
        asked = self.exchanges.asked
        for our_id, question in list(asked.items()):
            # (still asked: a backend found broken meanwhile took its questions along)
            if question.deadline <= self.now and our_id in asked:
                del asked[our_id]
                error = ClientDidNotAnswer(
                    "the client did not answer this request in time", reason=CLIENT_DID_NOT_ANSWER
                )
                actions += self.own(question.key, error_response(question.backend_id, error))
                note = {"requestId": our_id, "reason": "no answer in time"}
                actions.append(ToClient(notification_bytes("notifications/cancelled", note)))
        return actions

    def _expire_waits(self) -> list[Action]:
        """Calls the client did not resume in time: given up. A per-call container goes (it
        served nothing else); another is told its questions go unanswered and the call is
        cancelled, and serves on."""
        actions: list[Action] = []
        for wait in self.exchanges.waits.expired(self.now):
            backend = self.all.get(wait.key)
            if backend is None:
                continue
            note = {"backend": wait.key.service, "sequence": wait.key.seq}
            actions.append(Log("info", "input_wait_expired", note))
            if backend.role is Role.CALL:
                self._remove(wait.key)
                actions += self._stop(wait.key, INPUT_WAIT_EXPIRED)
                continue
            error = ClientDidNotAnswer(
                "the client did not retry its call with the answer in time",
                reason=CLIENT_DID_NOT_ANSWER,
            )
            for backend_id, _asked in wait.asked.values():
                actions += self.own(wait.key, error_response(backend_id, error))
            cancel = {"requestId": wait.call_id, "reason": "the client did not retry in time"}
            actions += self.own(wait.key, notification_bytes("notifications/cancelled", cancel))
        return actions

    def stop_idle(self) -> list[Action]:
        """Stop the current backends idle for their service's timeout (per-call and retiring
        ones go when their calls end: see settle)."""
        busy = self.exchanges.busy()
        actions: list[Action] = []
        for service, backend in list(self.current.items()):
            idle_until = backend.last_active + self.idle_timeouts.get(service, math.inf)
            if backend.ready and backend.key not in busy and idle_until <= self.now:
                self.forget(backend.key)
                self.relists.forget(service)
                actions += self._stop(backend.key, IDLE)
        return actions

    # --- the session's end ----------------------------------------------------------------------

    def end(self, error: FabricError) -> list[Action]:
        """The session ends: every call in flight is answered ``error``, and the backends hear
        nothing more (a start that completes is not greeted, a call that waited for it is not
        sent: its client was told it failed)."""
        self.ending = error
        for backend in self.all.values():
            backend.queue = []  # (their requests are answered below)
        return self.exchanges.end(error)

    def stop_all(self) -> list[Action]:
        """The client left: every backend is stopped."""
        stops: list[Action] = [
            StopBackend(b.key, SESSION_ENDED, graceful=True) for b in self.all.values()
        ]
        self.all.clear()
        self.current.clear()
        return stops

    # --- model checking -----------------------------------------------------------------------

    def clone(self, replies: Replies, exchanges: Exchanges, relists: Relists) -> BackendTable:
        """An independent copy, with the twin's ledger, requests and refreshes."""
        twin = copy.copy(self)  # (the settings are shared: never changed in place)
        twin.replies, twin.exchanges, twin.relists = replies, exchanges, relists
        twin.served = self.served.clone()
        twin.all = {key: backend.clone() for key, backend in self.all.items()}
        # (the same objects as the twin's all, as here)
        twin.current = {s: twin.all[b.key] for s, b in self.current.items()}
        twin.had = set(self.had)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return (
            tuple(b.fingerprint() for _k, b in sorted(self.all.items())),
            tuple(sorted((s, b.key) for s, b in self.current.items())),
            self.seq,
            tuple(sorted(self.had)),
            None if self.ending is None else self.ending.reason,
        )
