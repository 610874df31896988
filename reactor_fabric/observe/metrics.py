"""Prometheus metrics of one orchestrator, served at ``GET /metrics``.

Built on the ``prometheus-client`` library, in a registry of the orchestrator's own (several
orchestrators in one process — tests — never mix their figures).

Two kinds of figures:

- events counted when they happen — tool calls, container starts and their time, errors,
  idle teardowns, respawns, orphans — with the library's counters and histograms;
- figures read when Prometheus scrapes — live sessions and containers, bytes relayed, audit
  records dropped — from the orchestrator's own state by a collector, so that the relay's hot
  path adds only an integer to a field per frame and never takes the library's lock.

Label values stay bounded: a tool's name is used only when the suite's catalog knows it
(otherwise ``other``), services come from the suite, error reasons from our own code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"
# Tool calls take from milliseconds (a lookup) to minutes (a build, a human answering).
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# Container starts: a few hundred milliseconds to the Docker call bound (30 s).
START_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)


@dataclass
class LiveFigures:
    """What exists right now, as the collector reads it at scrape time."""

    sessions: Mapping[str, int] = field(default_factory=dict)  # endpoint → live sessions
    containers: Mapping[str, int] = field(default_factory=dict)  # service → live containers


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
        self.tool_calls = Counter(
            "reactor_fabric_tool_calls",
            "Tool calls that ended, by service, tool (the catalog's names, else 'other') and "
            "outcome (ok, error, cancelled, no_answer).",
            ["service", "tool", "outcome"],
            registry=registry,
        )
        self.tool_call_duration = Histogram(
            "reactor_fabric_tool_call_duration_seconds",
            "Time from a tools/call request's arrival to its outcome.",
            ["service"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.container_start = Histogram(
            "reactor_fabric_container_start_seconds",
            "Time to start a session's container: mounts pinned, created, attached, started "
            "and verified.",
            ["service"],
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
        self.orphans_removed = Counter(
            "reactor_fabric_orphans_removed",
            "Containers of dead orchestrators removed by the sweeper.",
            registry=registry,
        )
        registry.register(_LiveCollector(self))

    def know_tools(self, tools: Mapping[str, Iterable[str]]) -> None:
        """The tool names each service has (from the catalog, or the fabric endpoint's own
        meta-tools): the only ones used as labels."""
        self._tools = {**self._tools, **{s: frozenset(names) for s, names in tools.items()}}

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
