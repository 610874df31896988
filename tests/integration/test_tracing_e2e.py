"""End to end, OpenTelemetry: what a collector receives from the real orchestrator.

The orchestrator runs with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a collector stand-in
(tests/otlp_collector.py: the OTLP/HTTP receiver's side, decoding with the official protobuf
definitions) and exports through the ``otel`` extra, on the real engine with the bundled
servers. The clients: raw Streamable HTTP posts where a test needs a given ``traceparent``, and
the Python SDK 2.x with OpenTelemetry installed — an instrumented agent, whose own client spans
reach the same collector, so the test sees one trace across the two processes.
"""

from __future__ import annotations

import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import (
    Orchestrator,
    orchestrator,
    orchestrator_fixture,
    post,
    python2_client,
    time_call_through_fabric,
    wait_until,
    write_suite,
)
from tests.messages import INITIALIZE, INITIALIZED, request
from tests.otlp_collector import Collector, ReceivedSpan, otlp_collector

pytestmark = pytest.mark.integration

SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind
ERROR = 2  # Status.StatusCode
OPENING = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PER_CALL = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    with otlp_collector() as running:
        yield running


fabric = orchestrator_fixture(
    scope="module",
    env=lambda collector: {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        # Values are percent-encoded (the specification's form for OTEL_EXPORTER_OTLP_HEADERS).
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20collector-secret",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    },
)


def session_records(fabric: Orchestrator, session: str) -> list[dict[str, Any]]:
    def done() -> bool:
        events = Counter(r["event"] for r in fabric.audit() if r.get("session") == session)
        return events["session_end"] == 1

    wait_until(done, what=f"the end of session {session} in the audit trail")
    return [r for r in fabric.audit() if r.get("session") == session]


def of_session(spans: list[ReceivedSpan], session: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.attributes.get("mcp.session.id") == session]


def test_a_session_its_container_start_and_its_calls_reach_the_collector_as_the_trail_says(
    fabric: Orchestrator, collector: Collector
) -> None:
    with post(fabric, "/mcp/time", INITIALIZE, traceparent=OPENING) as answer:
        session = answer.headers["Mcp-Session-Id"]
        answer.read()
    sid = {"Mcp-Session-Id": session}
    post(fabric, "/mcp/time", INITIALIZED, **sid).close()
    arguments = {"name": "get_current_time", "arguments": {"timezone": "UTC"}}
    traced = {**arguments, "_meta": {"traceparent": PER_CALL}}
    bad = {"name": "get_current_time", "arguments": {"timezone": "Nowhere/Bad"}}
    for number, params in [(2, traced), (3, arguments), (4, bad)]:
        with post(fabric, "/mcp/time", request(number, "tools/call", params), **sid) as answer:
            assert b'"result"' in answer.read()
    delete = urllib.request.Request(
        f"{fabric.http_url}/mcp/time", method="DELETE", headers={**fabric.auth_header, **sid}
    )
    urllib.request.urlopen(delete, timeout=30).close()

    records = session_records(fabric, session)
    spans = of_session(
        collector.wait_for(
            lambda spans: any(s.name == "session time" for s in of_session(spans, session)),
            what="the session's span",
        ),
        session,
    )
    by_name = {s.name: s for s in spans if s.name != "tools/call get_current_time"}
    assert set(by_name) == {"session time", "container start time"}
    root = by_name["session time"]
    # The session: in the trace of the request that opened it, a child of that request's span.
    assert (root.trace_id, root.parent_span_id) == tuple(OPENING.split("-")[1:3])
    assert root.kind == SERVER
    assert root.attributes["reactor_fabric.endpoint"] == "relay"
    assert root.attributes["reactor_fabric.transport"] == "streamable-http"
    assert root.attributes["reactor_fabric.tool_calls"] == 3
    assert root.resource["service.name"] == "reactor-fabric"
    [start_record] = [r for r in records if r["event"] == "session_start"]
    assert start_record["trace_id"] == root.trace_id
    # Its container's start: a child, under the id the trail gives the container.
    container = by_name["container start time"]
    assert (container.trace_id, container.parent_span_id) == (root.trace_id, root.span_id)
    [started] = [r for r in records if r["event"] == "container_start"]
    assert container.attributes["container.id"] == started["container"]
    assert container.end_ns - container.start_ns == pytest.approx(
        started["start_ms"] * 1e6, rel=0.01
    )
    # Each call: one span, in the trace the trail names, under the client's span when it sent
    # one, else under the session's.
    calls = sorted(
        (s for s in spans if s.name == "tools/call get_current_time"),
        key=lambda s: s.attributes["jsonrpc.request.id"],
    )
    trail = [r for r in records if r["event"] == "tool_call"]
    assert [s.attributes["jsonrpc.request.id"] for s in calls] == ["2", "3", "4"]
    assert [s.trace_id for s in calls] == [r["trace_id"] for r in trail]
    assert [s.parent_span_id for s in calls] == [PER_CALL.split("-")[2], root.span_id, root.span_id]
    assert [s.attributes["reactor_fabric.outcome"] for s in calls] == [r["outcome"] for r in trail]
    assert [s.attributes["reactor_fabric.outcome"] for s in calls] == ["ok", "ok", "error"]
    assert calls[2].status_code == ERROR
    assert calls[2].attributes["error.type"] == "tool_error"
    for span, record in zip(calls, trail, strict=True):
        assert span.kind == SERVER
        assert span.attributes["container.id"] == record["container"]
        assert span.end_ns - span.start_ns == pytest.approx(record["duration_ms"] * 1e6, abs=1e6)
    # The exporter sent the operator's headers with every request.
    assert all(h.get("authorization") == "Bearer collector-secret" for h in collector.headers)


def test_an_instrumented_sdk_clients_call_is_the_parent_of_the_orchestrators_call_span(
    fabric: Orchestrator, collector: Collector
) -> None:
    client = python2_client(
        f"{fabric.http_url}/mcp", "legacy", "--trace",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url},
    )  # fmt: skip
    session = time_call_through_fabric(client)
    records = session_records(fabric, session)

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {s.name for s in of_session(spans, session)}
        return {"session fabric", "tools/call get_current_time"} <= names

    spans = collector.wait_for(complete, what="the fabric session's spans")
    ours = {s.name: s for s in of_session(spans, session)}
    routed = ours["tools/call get_current_time"]
    assert routed.attributes["reactor_fabric.service"] == "time"
    # The agent's own span for the same request, as its SDK exported it.
    [agent] = [
        s
        for s in spans
        if s.resource.get("service.name") == "test-agent"
        and s.kind == CLIENT
        and s.span_id == routed.parent_span_id
    ]
    assert agent.trace_id == routed.trace_id
    assert agent.start_ns <= routed.start_ns
    assert routed.end_ns <= agent.end_ns
    [record] = [r for r in records if r["event"] == "tool_call" and r["service"] == "time"]
    assert record["trace_id"] == routed.trace_id
    # The backend container started for that call belongs to the fabric session.
    root = ours["session fabric"]
    start = ours["container start time"]
    assert start.parent_span_id == root.span_id


def test_a_collector_that_cannot_be_reached_costs_only_the_spans(tmp_path: Path) -> None:
    (tmp_path / "projects").mkdir()
    suite = write_suite(tmp_path / "suite.yaml", [str(tmp_path / "projects")])
    with otlp_collector() as gone:
        unreachable = gone.url  # a loopback port nobody listens on once it is closed
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": unreachable, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    # The harness stops it with SIGTERM and requires a clean exit within its deadline.
    with orchestrator(suite, tmp_path / "orchestrator.log", env=env) as running:
        client = python2_client(f"{running.http_url}/mcp/time")
        try:
            assert client.ask({"op": "initialize"})["ok"]
            answer = client.ask(
                {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
            )
            assert answer["ok"], answer
        finally:
            assert client.close() == 0
        wait_until(
            lambda: any(r["event"] == "session_end" for r in running.audit()),
            what="the session's end",
        )
        # The operator is told, in the log's own format, that spans are not getting through.
        wait_until(
            lambda: any(
                entry["logger"].startswith("opentelemetry.") and entry["level"] == "warning"
                for entry in running.logs()
            ),
            what="the exporter's warning in the log",
        )
    lines = running.log_path.read_text().splitlines()
    assert all(line.startswith("{") for line in lines), [
        line for line in lines if not line.startswith("{")
    ][:3]
    assert any(entry["event"] == "tracing" for entry in running.logs())
