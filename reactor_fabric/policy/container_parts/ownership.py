"""Who owns the containers an orchestrator starts (:class:`ContainerIdentity`), and the labels
that say so and what each container is for (a leaf: the parts, the sweeper, the owner check
and the runtimes read them).

Every container carries its owner (the instance, the owner's host, PID and start time: a later
orchestrator tells whether its owner is gone, see :mod:`reactor_fabric.policy.owner`); the
sweeper, the operators' views and the Kubernetes runtime find containers again by these labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...config.secrets import ServiceSecrets
from ..accounts import Account

LABEL_MANAGED = "reactor-fabric.managed"
LABEL_INSTANCE = "reactor-fabric.instance"
LABEL_SESSION = "reactor-fabric.session"
LABEL_SERVICE = "reactor-fabric.service"
# On containers of the warm pool, which are created before any session (see warm_pool).
LABEL_POOLED = "reactor-fabric.pooled"
# The host, PID and process start time of the orchestrator that owns a container, so that a
# later instance can tell whether the owner is gone (crash recovery), even if the PID was reused.
LABEL_OWNER_HOST = "reactor-fabric.owner-host"
LABEL_OWNER_PID = "reactor-fabric.owner-pid"
LABEL_OWNER_START = "reactor-fabric.owner-start"


@dataclass(frozen=True)
class ContainerIdentity:
    """Who owns the containers an orchestrator starts, and where they go by default."""

    instance_id: str
    owner_host: str
    owner_pid: int
    owner_start: str
    default_network: str
    # Each service's secrets, resolved once at the start (services without any are absent).
    secrets: Mapping[str, ServiceSecrets] = field(default_factory=dict, repr=False)
    # Who a server with secrets runs as when the suite names no user (see .accounts): the
    # orchestrator's own account when it is not root (the only one it can give the files to:
    # a file secret is owned by the server's user, mode 0400), else an account no user of the
    # host holds. None when the suite has no secrets.
    secrets_account: Account | None = None

    def labels(self) -> dict[str, str]:
        """The labels of every container this orchestrator starts."""
        return {
            LABEL_MANAGED: "true",
            LABEL_INSTANCE: self.instance_id,
            LABEL_OWNER_HOST: self.owner_host,
            LABEL_OWNER_PID: str(self.owner_pid),
            LABEL_OWNER_START: self.owner_start,
        }
