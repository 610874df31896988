"""What operators see of a running orchestrator, as plain data: live sessions, recent tool
calls (filtered), and the last hour in per-minute buckets for the status page's charts.

Pure functions of what the orchestrator knows (see :mod:`.observer`); the trio layer serves
them as JSON (``/api/sessions``, ``/api/calls``, ``/api/stats``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .audit import now_iso
from .observer import CallEvent, Client, StartEvent

MAX_CALLS_SHOWN = 500
BUCKET_SECONDS = 60
WINDOW_SECONDS = 3600


@dataclass(frozen=True)
class SessionView:
    """One live session, as the orchestrator's registries describe it."""

    id: str
    endpoint: str
    service: str
    transport: str
    client: Client | None
    mounts: list[dict[str, Any]]
    started_at: float  # wall clock
    idle_seconds: float
    containers: list[dict[str, Any]]
    # The session's containers, live and recently ended, with the calls each served (see
    # reactor_fabric.protocol.served).
    recent_containers: list[dict[str, Any]] = field(default_factory=list)
    # An agent's child session: its parent session and call, the agent, the depth.
    parent: dict[str, Any] | None = None


def session_json(view: SessionView) -> dict[str, Any]:
    shown = {
        "id": view.id,
        "endpoint": view.endpoint,
        "service": view.service,
        "transport": view.transport,
        "client": view.client.record() if view.client is not None else None,
        "mounts": view.mounts,
        "started_at": now_iso(view.started_at),
        "idle_seconds": round(max(0.0, view.idle_seconds), 3),
        "containers": view.containers,
        "recent_containers": view.recent_containers,
    }
    if view.parent is not None:
        shown["parent"] = view.parent
    return shown


def record_user(record: dict[str, Any]) -> object:
    """The signed-in user an audit record names (its client's), if any."""
    client = record.get("client")
    return client.get("user") if isinstance(client, dict) else None


def recent_calls(
    events: Iterable[CallEvent],
    *,
    session: str | None = None,
    service: str | None = None,
    tool: str | None = None,
    outcome: str | None = None,
    limit: int = 100,
    user: str | None = None,
) -> list[dict[str, Any]]:
    """The newest tool call records first, those matching every filter given (``user``: the
    signed-in user's own calls only)."""
    limit = max(1, min(MAX_CALLS_SHOWN, limit))
    shown: list[dict[str, Any]] = []
    for event in reversed(list(events)):
        record = event.record
        if (
            (user is None or record_user(record) == user)
            and (session is None or record.get("session") == session)
            and (service is None or record.get("service") == service)
            and (tool is None or record.get("tool") == tool)
            and (outcome is None or record.get("outcome") == outcome)
        ):
            shown.append(record)
            if len(shown) >= limit:
                break
    return shown


def _percentile(sorted_values: list[float], share: float) -> float:
    """The nearest-rank percentile of values already sorted."""
    rank = max(1, math.ceil(share * len(sorted_values)))
    return sorted_values[rank - 1]


def stats(
    calls: Iterable[CallEvent],
    starts: Iterable[StartEvent],
    *,
    now: float,
    window: int = WINDOW_SECONDS,
    bucket: int = BUCKET_SECONDS,
) -> dict[str, Any]:
    """The last ``window`` seconds in buckets of ``bucket`` seconds, oldest first: tool calls
    per second, P50/P95 latency per service (ms), container starts and their median time."""
    count = window // bucket
    first = math.floor(now / bucket) * bucket - (count - 1) * bucket
    per_bucket: list[dict[str, list[float]]] = [{} for _ in range(count)]
    for call in calls:
        index = int((call.at - first) // bucket)
        if 0 <= index < count:
            per_bucket[index].setdefault(call.service, []).append(call.duration)
    started: list[list[float]] = [[] for _ in range(count)]
    for start in starts:
        index = int((start.at - first) // bucket)
        if 0 <= index < count:
            started[index].append(start.seconds)
    services = sorted({service for entry in per_bucket for service in entry})
    buckets: list[dict[str, Any]] = []
    for index in range(count):
        entry = per_bucket[index]
        latency: dict[str, dict[str, float]] = {}
        for service, durations in entry.items():
            ordered = sorted(durations)
            latency[service] = {
                "p50_ms": round(_percentile(ordered, 0.5) * 1000, 3),
                "p95_ms": round(_percentile(ordered, 0.95) * 1000, 3),
            }
        calls_in_bucket = sum(len(durations) for durations in entry.values())
        buckets.append(
            {
                "t": now_iso(first + index * bucket),
                "calls_per_second": round(calls_in_bucket / bucket, 4),
                "latency": latency,
                "container_starts": len(started[index]),
                "container_start_median_ms": (
                    round(statistics.median(started[index]) * 1000, 1) if started[index] else None
                ),
            }
        )
    return {"bucket_seconds": bucket, "services": services, "buckets": buckets}


def sessions_json(views: Mapping[str, SessionView]) -> dict[str, Any]:
    return {"sessions": [session_json(view) for view in views.values()]}
