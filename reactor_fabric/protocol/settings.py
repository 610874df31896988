"""What the orchestrator reads of its suite while it serves, frozen: built once when the suite
is loaded (:func:`reactor_fabric.config.settings.settings_for`), never read from the suite
again. Pure (no I/O), so that the session machines can take it as the trio layer does.

:class:`Settings` holds the bounds a connection and a session keep (durations and sizes parsed
once), each service's container lifecycle and idle timeout, what the warm pool keeps
(:class:`Pooling`, which its machine takes), what the fabric endpoint's
meta-tools know of the services (facts, profiles, token budget, model assist), the agents and
their bounds, what the audit keeps of a call's arguments, the suite lock and its mode, and
this orchestrator's name among replicas.

Resource handling: none (plain values). Error handling: none; the suite was validated before
(:mod:`reactor_fabric.config.suite`), so building these cannot fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from .agent_slots import AgentLimits
from .answers import SessionLimits
from .fabric_discovery import AssistSettings, ServiceFacts
from .lifecycle import Lifecycle
from .suite_lock import Mode, SuiteLock
from .tool_calls import ArgumentsMode

# A session of the fabric endpoint in a suite without services idles out after this long.
DEFAULT_IDLE_SECONDS = 60.0


@dataclass(frozen=True)
class Limits:
    """``orchestrator.limits`` and the orchestrator's other bounds, as numbers."""

    max_sessions: int = 64
    max_message_bytes: int = 16 * 1024 * 1024
    max_connections: int = 512
    max_pending_connections: int = 256
    first_message_seconds: float = 30.0
    buffer_to_server_bytes: int = 1024 * 1024
    buffer_to_client_bytes: int = 1024 * 1024
    client_write_seconds: float = 30.0
    shutdown_seconds: float = 10.0


@dataclass(frozen=True)
class RelaySettings:
    """What one relay session's machine reads of the settings: its service's bounds,
    lifecycle and idle timeout, what the audit keeps of a call's arguments, the suite lock."""

    limits: SessionLimits = field(default_factory=SessionLimits)
    idle_timeout: float = DEFAULT_IDLE_SECONDS
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    audit_arguments: ArgumentsMode = "hash"
    lock: SuiteLock | None = None
    lock_mode: Mode = "off"
    # Its containers work on copies of the project (``workspace: isolated``), and whether it
    # is an agent: an agent's call that names a ``base`` is refused here (isolated: its copy
    # starts before the call, with the container; shared: there is no copy). Another
    # server's ``base`` argument is its own.
    isolated: bool = False
    agent: bool = False


@dataclass(frozen=True)
class Pooling:
    """What the warm pool keeps (``warm`` and ``orchestrator.warm_pool``), as its machine
    (:class:`~.warm_pool.WarmPoolMachine`) takes it."""

    # Each service's warm (0: it keeps no pool), in the suite's order.
    targets: Mapping[str, int] = field(default_factory=dict)
    max_containers: int = 16
    parallel_starts: int = 2
    # After a hand-out, refills wait this long (0: not at all; see warm_pool.py, "Holds").
    refill_hold_seconds: float = 0.0
    # The services whose suite names their user: their containers are all alike (no shape).
    fixed_shape: frozenset[str] = frozenset()
    # The fresh_per_call services that keep a pool: their pooled containers are greeted, and
    # their target follows their takes (two rules, which the model checks also explore apart).
    greets: frozenset[str] = frozenset()
    per_call: frozenset[str] = frozenset()

    def without(self, refused: Iterable[str]) -> Pooling:
        """The same, with the ``refused`` services (for their secrets: each start would fail)
        keeping no pool."""
        gone = frozenset(refused)
        return replace(
            self,
            targets={name: 0 if name in gone else warm for name, warm in self.targets.items()},
            greets=self.greets - gone,
            per_call=self.per_call - gone,
        )


@dataclass(frozen=True)
class Settings:
    """One orchestrator's settings (see the module docstring)."""

    limits: Limits = field(default_factory=Limits)
    # Each service's container lifecycle and idle timeout (seconds), in the suite's order.
    lifecycles: Mapping[str, Lifecycle] = field(default_factory=dict)
    idle_timeouts: Mapping[str, float] = field(default_factory=dict)
    pooling: Pooling = field(default_factory=Pooling)
    # What the suite says about each service (ranking, the capability list), its profiles.
    facts: Mapping[str, ServiceFacts] = field(default_factory=dict)
    profiles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    token_budget: int | None = None
    assist: AssistSettings = field(default_factory=AssistSettings)
    # The services whose calls work on copies of the project (``workspace: isolated``).
    isolated: frozenset[str] = frozenset()
    # The services that are agents (llm_agent), their bounds, and how deep agents may go.
    agents: frozenset[str] = frozenset()
    agent_limits: AgentLimits = field(default_factory=AgentLimits)
    max_agent_depth: int = 1
    # What of a call's arguments the sessions keep: nothing when no trail is written (nothing
    # else reads them; hashing them would be wasted).
    audit_arguments: ArgumentsMode = "none"
    # Who opened a session, as the audit names the token it was admitted with.
    token_id: str = ""
    # The suite lock (None: none, or orchestrator.lock is off) and what is made of it.
    lock: SuiteLock | None = None
    lock_mode: Mode = "off"
    # This orchestrator's name among several behind one proxy (None: it runs alone); it ends
    # every session id it mints.
    replica: str | None = None

    @property
    def session_limits(self) -> SessionLimits:
        """The bounds of one relay session."""
        return SessionLimits(to_server_bytes=self.limits.buffer_to_server_bytes)

    def relay(self, service: str) -> RelaySettings:
        """What a relay session of ``service`` reads of these settings."""
        return RelaySettings(
            limits=self.session_limits,
            idle_timeout=self.idle_timeouts[service],
            lifecycle=self.lifecycles[service],
            audit_arguments=self.audit_arguments,
            lock=self.lock,
            lock_mode=self.lock_mode,
            isolated=service in self.isolated,
            agent=service in self.agents,
        )

    def session_idle_seconds(self, endpoint: str) -> float:
        """How long an HTTP session of ``endpoint`` may go without a request: its service's
        idle timeout; on the fabric endpoint, the longest of them (a session outlives its
        containers)."""
        timeout = self.idle_timeouts.get(endpoint)
        if timeout is not None:
            return timeout
        return max(self.idle_timeouts.values(), default=DEFAULT_IDLE_SECONDS)
