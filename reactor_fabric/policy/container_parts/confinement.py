"""The confinement part: what the server may do in its container, safe by default.

No capability but those the suite adds, no new privileges unless the suite relaxes it, a
read-only root with a bounded ``/tmp`` (temporary files, HOME and caches: counted against the
memory limit, writable by whichever user the server runs as).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config.structs import Service
from .context import SpecContext

READ_ONLY_ROOT_TMPFS = {"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"}  # noqa: S108 - in the container


@dataclass(frozen=True)
class ConfinementPart:
    cap_add: tuple[str, ...] = ()
    no_new_privileges: bool = True
    read_only_rootfs: bool = False
    tmpfs: dict[str, str] = field(default_factory=dict)


def confinement(service: Service, context: SpecContext) -> ConfinementPart:
    """The suite's ``security``; with the root writable, the image's own /tmp is left as is."""
    security = service.security
    return ConfinementPart(
        cap_add=tuple(security.cap_add),
        no_new_privileges=security.no_new_privileges,
        read_only_rootfs=security.read_only_rootfs,
        tmpfs=READ_ONLY_ROOT_TMPFS if security.read_only_rootfs else {},
    )
