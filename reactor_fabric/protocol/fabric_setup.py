"""What one fabric-endpoint session is made from, frozen: the orchestrator's settings
(:class:`~.settings.Settings`, built once from the suite) and what is the session's own — its
id, catalog and ranking index, mounts, exposure and active services, client lease, the shared
count of agent calls, the redaction of secrets, the time it opens — and the session's bounds
on its backends as the settings make them (:func:`backend_limits`).

The server (:mod:`.fabric_server`) and its router (:mod:`.fabric_router`) are both made from
it; a module of its own so that both can take it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..discovery import DiscoveryIndex
from ..discovery.tokens import count_definition
from .agent_slots import AgentSlots
from .call_rates import UserCallRate
from .catalog import Catalog, Redact, unredacted
from .fabric_meta_tools import Exposure
from .fabric_roster import Limits
from .settings import Settings

Json = dict[str, Any]


@dataclass(frozen=True)
class FabricSetup:
    """What one fabric-endpoint session is made from: the orchestrator's settings and what is
    the session's own (see the module's docs)."""

    catalog: Catalog
    session_id: str
    settings: Settings = field(default_factory=Settings)
    # The ranking index of ``catalog``: the orchestrator's (built once per catalog); None:
    # built here.
    index: DiscoveryIndex | None = None
    mount_targets: tuple[str, ...] = ()  # the session's mounts, as its backends' roots
    exposure: Exposure = "discover"
    active: frozenset[str] = frozenset()  # the services shown from the start
    client_lease: float | None = None  # (see .client_lease; None: the client does not leave)
    # The orchestrator's shared count of agent calls (None: no limit, as in most tests).
    agent_slots: AgentSlots | None = None
    # Its signed-in user's tool calls a minute (None: no limit): see .call_rates.
    call_rate: UserCallRate | None = None
    redact: Redact = unredacted  # the secrets' values, out of what the session keeps
    now: float = 0.0  # when it opens
    version: str = "0"  # the orchestrator's, in serverInfo and the backends' handshake
    count_tokens: Callable[[Json], int] = count_definition
    # The session's bounds on its backends; None: the settings' (see backend_limits).
    limits: Limits | None = None


def backend_limits(settings: Settings) -> Limits:
    """The session's bounds on its backends from the settings: the relay's bound on what waits
    for a server (buffer_to_server_bytes), for what waits and for the endpoint's own messages
    alike, and its stall timeout (the one rule of a backend that stopped reading)."""
    relay = settings.session_limits
    return Limits(relay.to_server_bytes, relay.to_server_bytes, relay.stdin_stall_timeout)
