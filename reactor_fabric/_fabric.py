"""The orchestrator's shared state: the suite, the engine, and the live sessions.

One :class:`Fabric` exists per running orchestrator. It is owned by
:func:`~reactor_fabric._serve.serve_orchestrator`, whose nursery owns every task that uses it.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from ._backend import ContainerBackend
from ._config import Suite
from ._docker import hostname


def new_instance_id() -> str:
    """A random id for this orchestrator run, stamped on every container it creates."""
    return secrets.token_hex(8)


@dataclass
class Fabric:
    suite: Suite
    engine: ContainerBackend
    network: str
    instance_id: str = field(default_factory=new_instance_id)
    owner_pid: int = field(default_factory=os.getpid)
    owner_host: str = field(default_factory=hostname)
    session_count: int = 0
    container_count: int = 0
