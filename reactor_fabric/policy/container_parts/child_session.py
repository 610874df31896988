"""The child session part: an agent's container that reaches a child session of the session
that started it (see :mod:`reactor_fabric.trio.child_sessions`).

Its relay finds the socket and the token in its environment; the runtime binds a socket of its
own at CHILD_SOCKET_TARGET (:mod:`reactor_fabric.runtime.child_sockets`). The starter grants a
child session only where the runtime can give a container that socket
(``RuntimeCapabilities.child_sessions``): elsewhere the agent runs without the suite's services.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config.structs import Service
from .context import SpecContext

# Where an agent's relay finds its child session's socket, and the token it opens it with
# (images/README.md, "Agent images"). The socket's place in the container is the runtime's.
CHILD_SOCKET_ENV = "REACTOR_FABRIC_FABRIC_SOCKET"
CHILD_TOKEN_ENV = "REACTOR_FABRIC_FABRIC_TOKEN"  # noqa: S105 - the variable's name
CHILD_SOCKET_TARGET = "/.reactor-fabric/fabric.sock"


@dataclass(frozen=True)
class ChildSessionPart:
    token: str = field(repr=False)

    @property
    def environment(self) -> dict[str, str]:
        return {CHILD_SOCKET_ENV: CHILD_SOCKET_TARGET, CHILD_TOKEN_ENV: self.token}


def child_session(service: Service, context: SpecContext) -> ChildSessionPart | None:
    """The child session the starter granted this container, if any."""
    if context.child_token is None:
        return None
    return ChildSessionPart(context.child_token)
