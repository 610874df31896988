"""The resources part: the container's memory, CPU and process limits, and its CPU weight.

The sizes come parsed from the suite (its ``resources``); a pooled container starts at the
lowest CPU weight, set back to the default when it is handed out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config.structs import Service
from .context import SpecContext

# A pooled container's CPU weight until it is handed out (the engine's minimum; the default is
# 1024): starting and waiting servers yield the CPU to the sessions' containers whenever it is
# contended, and take all of it when it is not. Set back to DEFAULT_CPU_SHARES at hand-out.
POOLED_CPU_SHARES = 2
DEFAULT_CPU_SHARES = 1024


@dataclass(frozen=True)
class ResourcesPart:
    memory_bytes: int
    nano_cpus: int
    pids_limit: int
    # The CPU weight against other containers when the CPU is contended (None: the engine's
    # default, 1024).
    cpu_shares: int | None = None


def resources(service: Service, context: SpecContext) -> ResourcesPart:
    """The suite's limits; a pooled container's weight at POOLED_CPU_SHARES."""
    return ResourcesPart(
        memory_bytes=service.resources.memory_bytes,
        nano_cpus=round(service.resources.cpus * 1_000_000_000),
        pids_limit=service.resources.pids,
        cpu_shares=POOLED_CPU_SHARES if context.pool_token is not None else None,
    )
