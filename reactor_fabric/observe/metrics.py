"""Prometheus metrics of one orchestrator, served at ``GET /metrics``.

Built on the ``prometheus-client`` library, in a registry of the orchestrator's own (several
orchestrators in one process — tests — never mix their figures).

Two kinds of figures:

- events counted when they happen — container starts and their time, errors, idle teardowns,
  respawns, orphans — with the library's counters and histograms;
- figures kept as plain numbers by the orchestrator and turned into metric families by a
  collector when Prometheus scrapes — tool calls and their duration, live sessions and
  containers, bytes relayed, audit records dropped — so that what happens per frame or per call
  on the relay's thread is an integer added to a field, never the library's lock and child
  lookup (a few microseconds per call, measured).

Label values stay bounded: a tool's name is used only when the suite's catalog knows it
(otherwise ``other``), services come from the suite, error reasons from our own code.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"
# Tool calls take from milliseconds (a lookup) to minutes (a build, a human answering).
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# Container starts: milliseconds (taken from the warm pool) or a few hundred milliseconds to the
# Docker call bound (30 s).
START_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)
# (service, tool, outcome) as sent → their labels, cached; beyond this many keys (the tool names
# a client sends are unbounded, the labels are not) they are worked out per call.
MAX_CACHED_LABELS: Final = 4096


@dataclass
class Durations:
    """One service's tool call durations, as a histogram of plain numbers."""

    counts: list[int]  # per bucket of CALL_BUCKETS, not cumulative; the last one is +Inf
    total: float = 0.0


@dataclass
class LiveFigures:
    """What exists right now, as the collector reads it at scrape time."""

    sessions: Mapping[str, int] = field(default_factory=dict)  # endpoint → live sessions
    containers: Mapping[str, int] = field(default_factory=dict)  # service → live containers
    pooled: Mapping[str, int] = field(default_factory=dict)  # service → ready pooled containers


class Metrics:
    """The orchestrator's metrics (see the module docstring)."""

    def __init__(self, services: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.services = frozenset(services)
        self._tools: dict[str, frozenset[str]] = {}
        # Read at scrape time (see _LiveCollector): plain integers, cheap to add to.
        self.bytes_to_server = 0
        self.bytes_to_client = 0
        self.live: Callable[[], LiveFigures] = LiveFigures
        self.audit_dropped: Callable[[], int] = lambda: 0
        registry = self.registry
        # Tool calls (see tool_call): counts by labels, durations by service label.
        self.calls: dict[tuple[str, str, str], int] = {}
        self.durations: dict[str, Durations] = {}
        self._call_labels: dict[tuple[str, str, str], tuple[tuple[str, str, str], Durations]] = {}
        self.container_start = Histogram(
            "reactor_fabric_container_start_seconds",
            "Time to start a session's container: mounts pinned, created, attached, started "
            "and verified; or taken from the warm pool (source=pool), its mounts attached.",
            ["service", "source"],
            buckets=START_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "reactor_fabric_errors",
            "JSON-RPC errors and HTTP refusals the orchestrator answered clients with, by "
            "code and data.reason.",
            ["code", "reason"],
            registry=registry,
        )
        self.idle_teardowns = Counter(
            "reactor_fabric_idle_teardowns",
            "Containers removed after their service's idle timeout.",
            registry=registry,
        )
        self.respawns = Counter(
            "reactor_fabric_respawns",
            "Containers started for a session that had one of that service before.",
            registry=registry,
        )
        self.pool_takes = Counter(
            "reactor_fabric_pool_takes",
            "Container starts of services with a warm pool, by outcome: hit (a pooled "
            "container), empty (none ready), shape (none for the session's account), mounts "
            "(the session's mounts cannot be pooled here), stopping.",
            ["service", "outcome"],
            registry=registry,
        )
        self.egress_connections = Counter(
            "reactor_fabric_egress_connections",
            "Connections of containers through their egress proxy, by service and outcome: "
            "connected, refused (not listed, a refused address, a bad request, too many), "
            "failed (no such name, the destination did not answer).",
            ["service", "outcome"],
            registry=registry,
        )
        self.egress_bytes = Counter(
            "reactor_fabric_egress_bytes",
            "Bytes through the egress proxy, by service and direction: sent (container to "
            "destination), received.",
            ["service", "direction"],
            registry=registry,
        )
        self.agent_calls = Counter(
            "reactor_fabric_agent_child_calls",
            "Tool calls specialist agents made through their child sessions, by agent, the "
            "service called and outcome (the calls are counted in tool_calls too).",
            ["agent", "service", "outcome"],
            registry=registry,
        )
        self.orphans_removed = Counter(
            "reactor_fabric_orphans_removed",
            "Containers of dead orchestrators removed by the sweeper.",
            registry=registry,
        )
        registry.register(_LiveCollector(self))

    def egress(self, service: str, outcome: str, *, sent: int, received: int) -> None:
        """One connection through the egress proxy (see Observer.egress)."""
        label = self.service_label(service)
        self.egress_connections.labels(label, outcome).inc()
        if sent:
            self.egress_bytes.labels(label, "sent").inc(sent)
        if received:
            self.egress_bytes.labels(label, "received").inc(received)

    def agent_call(self, agent: str, service: str, outcome: str) -> None:
        """One tool call an agent made through its child session (see Observer.tool_call)."""
        self.agent_calls.labels(
            self.service_label(agent), self.service_label(service), outcome
        ).inc()

    def know_tools(self, tools: Mapping[str, Iterable[str]]) -> None:
        """The tool names each service has (from the catalog, or the fabric endpoint's own
        meta-tools): the only ones used as labels."""
        self._tools = {**self._tools, **{s: frozenset(names) for s, names in tools.items()}}
        self._call_labels.clear()  # a tool counted as "other" so far may be known now

    def tool_call(self, service: str, tool: str, outcome: str, seconds: float) -> None:
        """Count one finished tool call and its duration (plain numbers, read at scrape)."""
        key = (service, tool, outcome)
        found = self._call_labels.get(key)
        if found is None:
            label = self.service_label(service)
            durations = self.durations.get(label)
            if durations is None:
                durations = self.durations[label] = Durations([0] * (len(CALL_BUCKETS) + 1))
            found = ((label, self.tool_label(service, tool), outcome), durations)
            if len(self._call_labels) < MAX_CACHED_LABELS:
                self._call_labels[key] = found
        labels, durations = found
        self.calls[labels] = self.calls.get(labels, 0) + 1
        # Prometheus buckets are upper bounds, inclusive: the first bound >= seconds.
        durations.counts[bisect_left(CALL_BUCKETS, seconds)] += 1
        durations.total += seconds

    def tool_label(self, service: str, tool: str) -> str:
        return tool if tool in self._tools.get(service, ()) else OTHER

    def service_label(self, service: str | None) -> str:
        return service if service is not None and service in self.services else OTHER

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


class _LiveCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self.metrics
        calls = CounterMetricFamily(
            "reactor_fabric_tool_calls",
            "Tool calls that ended, by service, tool (the catalog's names, else 'other') and "
            "outcome (ok, error, cancelled, no_answer, input_required).",
            labels=["service", "tool", "outcome"],
        )
        for labels, count in sorted(metrics.calls.items()):
            calls.add_metric(list(labels), count)
        yield calls
        durations = HistogramMetricFamily(
            "reactor_fabric_tool_call_duration_seconds",
            "Time from a tools/call request's arrival to its outcome.",
            labels=["service"],
        )
        bounds = [*map(floatToGoString, CALL_BUCKETS), "+Inf"]
        for service, figures in sorted(metrics.durations.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, figures.counts, strict=True):
                cumulative += count
                buckets.append((bound, float(cumulative)))
            durations.add_metric([service], buckets, figures.total)
        yield durations
        live = metrics.live()
        sessions = GaugeMetricFamily(
            "reactor_fabric_sessions", "Live client sessions, by endpoint.", labels=["endpoint"]
        )
        for endpoint in ("relay", "fabric"):
            sessions.add_metric([endpoint], live.sessions.get(endpoint, 0))
        yield sessions
        containers = GaugeMetricFamily(
            "reactor_fabric_containers",
            "Live session containers, by service.",
            labels=["service"],
        )
        for service in sorted(metrics.services | set(live.containers)):
            containers.add_metric([service], live.containers.get(service, 0))
        yield containers
        pooled = GaugeMetricFamily(
            "reactor_fabric_pooled_containers",
            "Warm pool containers started and waiting for a session, by service.",
            labels=["service"],
        )
        for service in sorted(live.pooled):
            pooled.add_metric([service], live.pooled[service])
        yield pooled
        relayed = CounterMetricFamily(
            "reactor_fabric_relay_bytes",
            "Bytes of JSON-RPC messages passed between clients and containers, by direction.",
            labels=["direction"],
        )
        relayed.add_metric(["to_server"], metrics.bytes_to_server)
        relayed.add_metric(["to_client"], metrics.bytes_to_client)
        yield relayed
        yield CounterMetricFamily(
            "reactor_fabric_audit_dropped",
            "Audit records dropped because the writer fell behind or could not write.",
            value=metrics.audit_dropped(),
        )
