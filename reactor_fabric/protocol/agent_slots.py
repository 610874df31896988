"""Agent calls in flight, and whether one more may start: ``orchestrator.agents``. Pure.

An *agent call* is a call (``tools/call``, ``resources/read``, ``prompts/get``) of a service
with ``service_type: llm_agent``, on the fabric endpoint (``/mcp``) or on the relay
(``/mcp/{service}``), from the moment its session takes it until it ends — answered, refused
by its container, cancelled, its container gone, its session ended. Each runs a model-driven
CLI in a container of its own, so they are bounded twice: ``max_concurrent_per_session`` in
one session, ``max_concurrent`` in the whole orchestrator. A call over either is answered at
once (-32002 ``agent_busy``, ``data``: the ``limit`` and its ``scope``, ``session`` or
``orchestrator``), never queued: a client sees at once that it asks more than it may.

One :class:`AgentSlots` is shared by the orchestrator's sessions (the trio side makes it with
the fabric and hands it to every session machine); it holds only the count each session last
reported. Each session machine counts its own agent calls from its own state (so every way a
call ends frees its slot without a release of its own), asks :meth:`AgentSlots.refusal` before
it takes one more, and reports its count after every event (:meth:`AgentSlots.hold`); the
driver calls :meth:`AgentSlots.leave` when the session is over, whatever ended it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._errors import AgentBusy
from .._reasons import AGENT_BUSY

# What a call over a limit says is full: its session's share, or the whole orchestrator's.
SESSION = "session"
ORCHESTRATOR = "orchestrator"


@dataclass(frozen=True, slots=True)
class AgentLimits:
    """``orchestrator.agents``: at most so many agent calls at once, in all and per session."""

    max_concurrent: int = 4
    max_concurrent_per_session: int = 2


@dataclass
class AgentSlots:
    """The orchestrator's agent calls in flight, by session (see the module's docs)."""

    limits: AgentLimits = field(default_factory=AgentLimits)
    # Each session's agent calls in flight, as it last reported them (sessions with none are
    # absent), keyed by the session's own token (any hashable: its id).
    held: dict[object, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.held.values())

    def refusal(self, holder: object, in_flight: int, service: str) -> AgentBusy | None:
        """Why ``holder``, with ``in_flight`` agent calls now, may not take one more of
        ``service`` (None: it may). The session's limit is said first: it is the one the
        client can do something about."""
        limits = self.limits
        if in_flight >= limits.max_concurrent_per_session:
            return _busy(service, limits.max_concurrent_per_session, SESSION)
        # The others' calls, and this session's as it counts them now (it reports after).
        others = self.total - self.held.get(holder, 0)
        if others + in_flight >= limits.max_concurrent:
            return _busy(service, limits.max_concurrent, ORCHESTRATOR)
        return None

    def hold(self, holder: object, in_flight: int) -> None:
        """``holder`` has ``in_flight`` agent calls now."""
        if in_flight > 0:
            self.held[holder] = in_flight
        else:
            self.held.pop(holder, None)

    def leave(self, holder: object) -> None:
        """``holder``'s session is over: its calls hold nothing any more."""
        self.held.pop(holder, None)


def _busy(service: str, limit: int, scope: str) -> AgentBusy:
    whose = "this session" if scope == SESSION else "the orchestrator"
    return AgentBusy(
        f"{whose} already has {limit} agent calls in flight (orchestrator.agents."
        f"{'max_concurrent_per_session' if scope == SESSION else 'max_concurrent'}); "
        f"{service} was not called: retry when one ends",
        reason=AGENT_BUSY,
        service=service,
        limit=limit,
        scope=scope,
    )
