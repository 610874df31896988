"""What an agent's child session may do, and on whose behalf (a leaf: the orchestrator's
registry, its sessions and the child sessions' server all read it).

See :mod:`reactor_fabric.trio.child_sessions` for how a grant is made, used and revoked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..protocol.events import CallRef
from .mount_spec import MountSpec


@dataclass(frozen=True)
class ChildGrant:
    """One agent container's child sessions: the token its relay opens them with (never
    shown), the agent and the call it runs for, and what the sessions get."""

    token: str = field(repr=False)
    container_name: str
    agent: str  # the agent's service
    parent_session: str
    parent_call: CallRef | None
    trace_id: str  # the parent's: the child's records join its trace
    mounts: tuple[MountSpec, ...]  # the parent's
    services: tuple[str, ...]  # the services the child sessions offer
    depth: int  # the child sessions': 1 under a client's session
    # The signed-in user of the parent session (None: the orchestrator's token's holder): the
    # child sessions are theirs, and say so in every record.
    user: str | None = None
    groups: tuple[str, ...] = ()

    def record(self) -> dict[str, object]:
        """The parent, as the audit trail and the operators' API show it."""
        return {
            "session": self.parent_session,
            "call": self.parent_call.record() if self.parent_call is not None else None,
            "agent": self.agent,
            "depth": self.depth,
        }
