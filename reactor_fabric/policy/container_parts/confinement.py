"""The confinement part: what the server may do in its container, safe by default.

No capability but those the suite adds, no new privileges unless the suite relaxes it, a
read-only root with a bounded ``/tmp`` (temporary files, HOME and caches; ``security.tmp_size``,
64 MiB by default: counted against the memory limit, writable by whichever user the server runs
as).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config.structs import Service
from .context import SpecContext

TMP = "/tmp"  # noqa: S108 - in the container


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
        tmpfs=(
            {TMP: _tmp_options(security.tmp_bytes, exec_allowed=security.tmp_exec)}
            if security.read_only_rootfs
            else {}
        ),
    )


def _tmp_options(size: int, *, exec_allowed: bool) -> str:
    """The tmpfs options of /tmp: the engines make a tmpfs noexec unless told ``exec``."""
    executable = "exec," if exec_allowed else ""
    return f"rw,nosuid,nodev,{executable}size={_size(size)},mode=1777"


def _size(size: int) -> str:
    """A tmpfs ``size=`` in the largest unit that divides it (``64m``, ``1g``, ``1536k``)."""
    for unit, factor in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)
