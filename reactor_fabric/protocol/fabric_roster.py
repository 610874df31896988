"""The fabric endpoint's backends of one session as a table, without I/O: each by its key, each
service's current one, and the rules of their lifecycles and bounds. Pure bookkeeping: what is
done with the backends (writes, stops, failures, deadlines met) is :mod:`.fabric_backends`'s.

Each service the session calls gets a backend — a container of that service for this session,
started on first use and keyed by a :class:`~.events.BackendKey` whose ``seq`` counts the
session's starts and names the container (a respawn when its service ran one before). Each is
a :class:`Routed`: the one backend model of :mod:`.backend` (its state table, role, stdin
accounting, the rule for a backend that stopped reading) and the requests waiting for its
handshake (or its memory figure), at most :data:`MAX_QUEUED_PER_BACKEND`.

Lifecycles (:class:`~.lifecycle.Lifecycle`, the suite's ``container_strategy``). By default a
service has one backend per session, its *current* one (:attr:`Roster.current`). A
``fresh_per_call`` service has none: each call starts a backend of its own, bound to it and
removed (``call_done``) once its call ended and its requests to the client were answered, at
most :data:`MAX_PER_CALL_CONTAINERS` at once per service. A ``smart_refresh`` service's current
backend that reached ``max_calls`` calls or ``max_age`` seconds is *retired*: the next call
starts a fresh one, and it is removed (``refresh_calls``, ``refresh_age``) once the calls it has
end, never under one; one between calls is retired when it reaches its age (a deadline). With
a ``memory_threshold`` it is measured between calls (:class:`~.events.MeasureBackend`, once
after each call; calls for it wait for the figure) and retired when over (``refresh_memory``).
Every backend is in :attr:`Roster.all`, by key.

Bounds (:class:`Limits`). Every line sent to a backend is counted until the driver reports it
written: the client is not read while a backend has more than ``buffer_to_server_bytes``
waiting (:attr:`Roster.accepting`: a slow service stalls only its session). A backend that
leaves more than ``own_backlog_bytes`` of the machine's own messages unread, or whose stdin
did not move for ``stall_timeout`` seconds, has stopped reading it (the one rule of
:mod:`.backend`).

What is in flight on a backend (calls, questions to the client, calls waiting for a retry) is
not the table's to know: the rules that depend on it take the keys of the busy backends.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._reasons import CALL_DONE
from .answers import SessionLimits
from .backend import (
    Backend,
    Role,
    Step,
    age_deadline,
    measure_due,
    spent,
    start_measuring,
)
from .events import Action, BackendKey, MeasureBackend
from .lifecycle import REUSE, Lifecycle

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


class Roster:
    """A session's backends by key, each service's current one among them, and the rules of
    their lifecycles and bounds (see the module's docs)."""

    def __init__(
        self,
        *,
        lifecycles: Mapping[str, Lifecycle],
        idle_timeouts: Mapping[str, float],
        limits: Limits,
    ) -> None:
        self.lifecycles = dict(lifecycles)
        # The smart_refresh services: the only ones the rules between calls act on (asked after
        # every event, so a suite without any skips them at once).
        self.refreshed = frozenset(
            name for name, lifecycle in lifecycles.items() if lifecycle.strategy == "smart_refresh"
        )
        self.idle_timeouts = dict(idle_timeouts)
        self.limits = limits
        # Every backend the router counts on, and each service's current (shared) one among
        # them; a fresh_per_call backend, or a retiring smart_refresh one, is only in the first.
        self.all: dict[BackendKey, Routed] = {}
        self.current: dict[str, Routed] = {}
        self.seq = 0  # the last backend's sequence (it names its container)
        self.had: set[str] = set()  # services that had a container (the next is a respawn)

    def lifecycle(self, service: str) -> Lifecycle:
        return self.lifecycles.get(service, REUSE)

    def add(self, service: str, role: Role, now: float) -> Routed:
        """A new backend of ``service``, to be started, with its first call counted."""
        self.seq += 1
        backend = Routed(BackendKey(service, self.seq), role=role, last_active=now, calls=1)
        self.all[backend.key] = backend
        if role is Role.CURRENT:
            self.current[service] = backend
        return backend

    def per_call(self, service: str) -> int:
        """The service's backends bound to a call each (fresh_per_call) the session has."""
        return sum(1 for b in self.all.values() if b.key.service == service and b.role is Role.CALL)

    def forget(self, key: BackendKey) -> None:
        """The backend ``key`` is no longer counted on (nor current, if it was)."""
        backend = self.all.pop(key, None)
        if backend is not None:
            backend.advance(Step.STOPPED)
        current = self.current.get(key.service)
        if current is not None and current.key == key:
            del self.current[key.service]

    def remove(self, key: BackendKey) -> None:
        """A backend that is not the current one goes (its call ended, it is not needed)."""
        self.all.pop(key).advance(Step.STOPPED)

    def spent(self, backend: Routed, now: float) -> str | None:
        """Which bound a backend has reached (None while it may take calls)."""
        return spent(backend, self.lifecycle(backend.key.service), now)

    def retire(self, backend: Routed, bound: str) -> None:
        """smart_refresh: the service's current backend takes no more calls (the next starts a
        fresh one); it is removed, for ``bound``, once the calls it has end (see done)."""
        backend.retire(bound)
        del self.current[backend.key.service]

    def written(self, backend: Routed, nbytes: int, now: float) -> None:
        """``nbytes`` of what was sent to ``backend`` (whole lines, oldest first) are written."""
        backend.stdin.written(nbytes, now)

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

    def deadlines(self, busy: Container[BackendKey]) -> list[float]:
        """When a backend whose stdin does not move counts as no longer reading it, when idle
        backends stop, and when current smart_refresh backends between calls reach their
        ``max_container_age`` (retired then, as the relay does, rather than at the next
        event)."""
        # (Asked after every event: each backend is asked whether it is busy once, and only
        # when it has a deadline to add between calls.)
        due: list[float] = []
        stall_timeout = self.limits.stall_timeout
        for backend in self.all.values():
            stdin = backend.stdin
            if stdin.pending:  # (StdinBook.stall_deadline, written out)
                due.append(stdin.progress + stall_timeout)
        for service, backend in self.current.items():
            if not backend.ready:
                continue
            idle = self.idle_timeouts.get(service, math.inf)
            aged = age_deadline(backend, self.lifecycle(service))
            if (idle != math.inf or aged is not None) and backend.key not in busy:
                if idle != math.inf:
                    due.append(backend.last_active + idle)
                if aged is not None:
                    due.append(aged)
        return due

    def idle(self, now: float, busy: Container[BackendKey]) -> list[Routed]:
        """The current backends idle for their service's timeout (per-call and retiring ones go
        when their calls end: see done)."""
        return [
            backend
            for service, backend in self.current.items()
            if backend.ready
            and backend.key not in busy
            and backend.last_active + self.idle_timeouts.get(service, math.inf) <= now
        ]

    def spent_between_calls(
        self, now: float, busy: Container[BackendKey]
    ) -> list[tuple[Routed, str]]:
        """Current smart_refresh backends past their bounds with no call in flight, and the
        bound each reached: to be retired now rather than at the next call."""
        found: list[tuple[Routed, str]] = []
        if not self.refreshed:
            return found
        for service, backend in self.current.items():
            if service not in self.refreshed or not backend.ready:
                continue
            bound = self.spent(backend, now)
            if bound is not None and backend.key not in busy:
                found.append((backend, bound))
        return found

    def done(self, busy: Container[BackendKey]) -> list[tuple[BackendKey, str]]:
        """Remove the backends whose work is done — a per-call one whose call ended (and whose
        requests to the client were answered), a retiring one whose calls ended — with their
        stop reasons. One still starting waits for its start: a stop before would find
        nothing."""
        done: list[tuple[BackendKey, str]] = []
        for key, backend in list(self.all.items()):
            if backend.role is Role.CURRENT or not backend.ready or key in busy:
                continue
            self.remove(key)
            done.append((key, CALL_DONE if backend.role is Role.CALL else backend.retired))
        return done

    def to_measure(self, busy: Container[BackendKey]) -> list[Action]:
        """A smart_refresh backend with a ``memory_threshold`` is measured between calls (ready,
        nothing in flight), once after each call that could have grown it (the relay's rule);
        calls for it meanwhile wait in its queue for the figure, so that a container over the
        threshold serves none."""
        actions: list[Action] = []
        if not self.refreshed:
            return actions  # (only smart_refresh measures)
        for service, backend in self.current.items():
            if not measure_due(backend, self.lifecycle(service)) or backend.key in busy:
                continue
            start_measuring(backend)
            actions.append(MeasureBackend(backend.key))
        return actions

    # --- model checking -----------------------------------------------------------------------

    def clone(self) -> Roster:
        twin = copy.copy(self)  # (the settings are shared: never changed in place)
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
        )
