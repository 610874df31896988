"""Whether a Docker or Podman engine can run a container under gVisor, as far as the
orchestrator found out: the runtimes the engine lists (``GET /info``, on each new connection)
and whether it honoured the runtime a container named (one container created and removed at
the start, never started: :meth:`DockerRuntime.verify_isolation`).

On Podman the engine's default runtime may be ``deploy/podman/oci-dispatch`` (registered as
:data:`DISPATCHING_RUNTIME`): Podman's API drops the runtime a container names, so the check's
container gets the default, and that program runs the containers marked for gVisor (every one
the orchestrator starts under gVisor: ``REACTOR_FABRIC_ISOLATION``) under runsc. gVisor is had
then too, by the mark; anything else a container naming runsc gets means there is none.

Pure bookkeeping: the engine calls are the Docker runtime's.
"""

from __future__ import annotations

import logging

from ..policy.container_parts.isolation import DISPATCHING_RUNTIME

log = logging.getLogger(__name__)


class GvisorRuntime:
    """gVisor's runtime as ``wanted`` names it (``orchestrator.gvisor_runtime``) on one engine."""

    def __init__(self, wanted: str) -> None:
        self.wanted = wanted
        # The engine's runtimes, once it answered (None: not yet).
        self._listed: frozenset[str] | None = None
        # Why not, once the engine ran a container naming the runtime under another.
        self._dropped = ""

    @property
    def found(self) -> bool:
        """Listed by the engine, and not found dropped."""
        return self._listed is not None and self.wanted in self._listed and not self._dropped

    def missing(self) -> str:
        """Why there is none, in the refused client's words ("" when there is one)."""
        if self.found:
            return ""
        if self._dropped:
            return self._dropped
        if self._listed is None:
            return "the engine has not answered since the orchestrator started"
        return (
            f"the engine has no runtime {self.wanted!r} (gVisor; scripts/ensure-gvisor "
            "installs and registers it)"
        )

    def listed(self, names: frozenset[str]) -> None:
        """The engine's runtimes, as it just said (logged when they changed)."""
        before, self._listed = self._listed, names
        if before != names:
            log.info(
                "container_runtimes",
                extra={"runtimes": sorted(names), "gvisor": self.wanted in names},
            )

    def ran_under(self, runtime: str, engine: str) -> None:
        """A container naming the runtime was given ``runtime`` by ``engine``: that one, or the
        dispatcher (which gives the containers marked for gVisor runsc), or another one, and
        gVisor is not to be had from this engine."""
        if runtime == self.wanted:
            return
        if runtime == DISPATCHING_RUNTIME:
            log.info(
                "gvisor_by_dispatch",
                extra={"engine": engine, "runtime": runtime, "gvisor": self.wanted},
            )
            return
        self._dropped = (
            f"the engine ({engine}) ran a container that names the runtime {self.wanted!r} "
            f"under {runtime or 'its default'!r} (Podman drops the runtime a container names "
            f"through its API; deploy/podman/oci-dispatch as its default runtime, named "
            f"{DISPATCHING_RUNTIME!r}, runs the containers marked for gVisor under it: "
            "scripts/ensure-gvisor registers it)"
        )
        log.warning("gvisor_not_honoured", extra={"detail": self._dropped})
