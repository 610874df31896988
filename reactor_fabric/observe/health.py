"""The ``GET /healthz`` report, as a pure function of what the orchestrator knows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HealthReport:
    status_code: int
    body: dict[str, Any]


def health_report(
    *,
    engine: str = "docker",
    docker_version: str | None,
    docker_error: str | None,
    sessions: int,
    containers: int,
    version: str,
    pooled_containers: int = 0,
    replica: str | None = None,
    stdio: str = "",
) -> HealthReport:
    """200 with ``"docker": "ok"`` when the engine answers, else 503 with the reason.

    ``engine`` names the engine behind the Docker API (``docker`` or ``podman``, as it said
    last; the key ``docker`` keeps its name whichever it is, for the scripts that read it).
    ``stdio`` says how containers' stdio reaches us (``socket`` or ``attach``; left out while
    not yet known).

    The orchestrator itself is up in both cases (it answered); 503 tells a load balancer or a
    start-up script that it cannot start containers right now.
    """
    healthy = docker_error is None
    body: dict[str, Any] = {
        "status": "ok" if healthy else "degraded",
        "docker": "ok" if healthy else "unavailable",
        "engine": engine,
        "sessions": sessions,
        "containers": containers,
        "pooled_containers": pooled_containers,
        "version": version,
    }
    if stdio:
        body["stdio"] = stdio
    if replica is not None:
        body["replica"] = replica
    if healthy:
        body["docker_version"] = docker_version
    else:
        body["docker_error"] = docker_error
    return HealthReport(200 if healthy else 503, body)
