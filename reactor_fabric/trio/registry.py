"""What is alive in one orchestrator: its sessions, their containers, the connections that have
not sent a first message yet, the agent calls in flight, and whether it is stopping.

One :class:`SessionRegistry` exists per running orchestrator (made by
:func:`~reactor_fabric.trio.serve.assemble`). Live sessions and containers are kept as
registries (id → record), not counters: a session adds and removes its own entries in
``finally`` blocks (:mod:`.session`, :mod:`.containers`), so the figures ``/healthz``, the
metrics and the operators' views report cannot drift from what exists. Admission's capacity
check reads the count here (the decision is :func:`~reactor_fabric.policy.admission.capacity`'s).

Resource handling: holds no resource; every entry is removed by whoever added it, and
:attr:`SessionRegistry.changed` wakes whoever waits for the registry to empty (a shutdown, the
tests). Error handling: none raised; a full or stopping orchestrator is an answer
(:meth:`SessionRegistry.admit` returns the refusal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import trio

from .._errors import SessionRefused
from ..observe.metrics import LiveFigures
from ..observe.observer import Client
from ..policy.admission import Capacity, capacity
from ..policy.child_grant import ChildGrant
from ..policy.mount_spec import MountSpec
from ..protocol.agent_slots import AgentSlots
from ..protocol.call_rates import CallRates, UserCallRate
from ..protocol.served import Served

# How long removing one session's containers may take (a shutdown may allow less).
TEARDOWN_BOUND_SECONDS = 15.0


@dataclass(eq=False)
class SessionRecord:
    """A live session, as operators see it (``sessions``, ``/api/sessions``, the status page)."""

    service: str  # the relay's service, or "fabric" for the fabric endpoint
    transport: str
    id: str = ""
    client: Client | None = None
    mounts: tuple[MountSpec, ...] = ()
    trace_id: str = ""
    started_at: float = 0.0  # wall clock
    # When a message last passed (trio time), kept by the session's driver.
    last_active: float = 0.0
    # Set by an operator (sessions --end): the session tells its client why and ends.
    ended_by_operator: trio.Event = field(default_factory=trio.Event)
    tool_calls: int = 0  # how many ended so far
    # An agent's child session: its grant (the parent session and call, what it may use).
    parent: ChildGrant | None = None
    # The services this session may use (its user's, and for a child its grant's; None: all).
    services: frozenset[str] | None = None
    # Its signed-in user's tool calls a minute (orchestrator.users; None: no limit).
    call_rate: UserCallRate | None = None
    # The session's containers and the calls each served (its machine's; None until it has
    # one), and the trio time the machine counts them from (its start).
    served: Served | None = None
    served_since: float = 0.0

    @property
    def endpoint(self) -> str:
        return "fabric" if self.service == "fabric" else "relay"

    @property
    def depth(self) -> int:
        """How many agents deep the session is: 0 for a client's, 1 for an agent's child."""
        return self.parent.depth if self.parent is not None else 0

    def mount_records(self) -> list[dict[str, Any]]:
        """The session's mounts as the audit trail and the operators' API show them."""
        return [
            {"source": m.source, "target": m.target, "read_only": m.read_only} for m in self.mounts
        ]


@dataclass(frozen=True)
class ContainerRecord:
    """A live session container."""

    session: str
    service: str
    name: str
    image: str
    started_at: float  # wall clock


class SessionRegistry:
    """The sessions, containers and waiting connections of one orchestrator (see the module
    docstring); ``max_sessions`` and ``max_pending`` bound the first and the last."""

    def __init__(self, *, max_sessions: int, max_pending: int, agent_slots: AgentSlots) -> None:
        self.sessions: dict[str, SessionRecord] = {}
        self.containers: dict[str, ContainerRecord] = {}  # by container id
        self.pending_connections = 0  # WebSocket connections before their first message
        # Agent calls in flight by session (orchestrator.agents): the decision is the
        # sessions' machines' (protocol/agent_slots.py); the count they share is held here.
        self.agent_slots = agent_slots
        # Every signed-in user's tool calls of the last minute (orchestrator.users).
        self.call_rates = CallRates()
        # Set when the orchestrator begins to stop: every session answers what is in flight.
        self.stopping = trio.Event()
        # When a shutdown must be over (trio time); every teardown ends by then.
        self.hard_deadline = math.inf
        # Set (and replaced) whenever a session, container or busy connection comes or goes.
        self.changed = trio.Event()
        self._max_sessions = max_sessions
        self._max_pending = max_pending

    @property
    def session_count(self) -> int:
        return len(self.sessions)

    @property
    def container_count(self) -> int:
        return len(self.containers)

    def notify_change(self) -> None:
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    def teardown_deadline(self, bound: float = TEARDOWN_BOUND_SECONDS) -> float:
        """When a teardown starting now must be over: ``bound`` from now, or the hard deadline."""
        return min(trio.current_time() + bound, self.hard_deadline)

    # --- sessions ---------------------------------------------------------------------------

    def admit(
        self, session_id: str, record: SessionRecord, *, user_limit: int | None = None
    ) -> SessionRefused | None:
        """Register a session, unless the orchestrator is full or stopping, or its signed-in
        user has ``user_limit`` sessions already (an agent's child sessions are not counted):
        then the error that refuses it (the decision is :func:`~reactor_fabric.policy.
        admission.capacity`'s; the counts it reads are these)."""
        user = record.client.user if record.client is not None else None
        own = 0
        if user is not None and user_limit is not None and record.parent is None:
            own = sum(
                1
                for other in self.sessions.values()
                if other.parent is None and other.client is not None and other.client.user == user
            )
        full = capacity(
            Capacity(
                sessions=len(self.sessions),
                limit=self._max_sessions,
                stopping=self.stopping.is_set(),
                user_sessions=own,
                user_limit=user_limit if record.parent is None else None,
            )
        )
        if full is None:
            self.sessions[session_id] = record
        return full

    def release(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        # Whatever ended the session, its agent calls hold no slot any more.
        self.agent_slots.leave(session_id)
        self.notify_change()

    def end_session(self, session_id: str) -> bool:
        """Ask a live session to end (an operator's request); False if there is none."""
        record = self.sessions.get(session_id)
        if record is None:
            return False
        record.ended_by_operator.set()
        return True

    # --- containers -------------------------------------------------------------------------

    def container_started(self, container_id: str, record: ContainerRecord) -> None:
        self.containers[container_id] = record

    def container_removed(self, container_id: str) -> None:
        self.containers.pop(container_id, None)
        self.notify_change()

    def live_figures(self, pooled: dict[str, int]) -> LiveFigures:
        """Sessions by endpoint, containers by service, and ``pooled`` (the warm pool's
        ready containers by service), as the metrics and ``/healthz`` show them."""
        sessions: dict[str, int] = {}
        for record in self.sessions.values():
            sessions[record.endpoint] = sessions.get(record.endpoint, 0) + 1
        containers: dict[str, int] = {}
        for container in self.containers.values():
            containers[container.service] = containers.get(container.service, 0) + 1
        return LiveFigures(sessions, containers, pooled)

    # --- connections before their first message ---------------------------------------------

    def reserve_pending(self) -> bool:
        """Count a connection that has yet to send its first message, if there is room."""
        if self.pending_connections >= self._max_pending:
            return False
        self.pending_connections += 1
        return True

    def release_pending(self) -> None:
        self.pending_connections -= 1
