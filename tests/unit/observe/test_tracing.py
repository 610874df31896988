"""OpenTelemetry spans: what the observer's events become, and how they line up with the trail.

Spans go to the SDK's in-memory exporter (the OTLP wire is tested end to end against a
collector stand-in in tests/integration/test_tracing_e2e.py).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from reactor_fabric.observe.observer import Client, Observer, token_id
from reactor_fabric.observe.otel import tracing_from_environment
from reactor_fabric.observe.tracing import Tracing
from tests.unit.observe.test_observer import TRACEPARENT, call

CLIENT = Client(token_id("secret-token"), "127.0.0.1:5000", "streamable-http", "test/1")
SESSION_TRACE = "0af7651916cd43dd8448eb211c80319c"
OPENING = f"00-{SESSION_TRACE}-b7ad6b7169203331-01"
MADE_UP_TRACE = "5f2c1d0e9b8a7f6e5d4c3b2a19081726"


def traced() -> tuple[Observer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return Observer(services=["git"], tracing=Tracing(exporter)), exporter


def start(observer: Observer, session: str = "s1", traceparent: str | None = None) -> None:
    observer.session_started(
        session,
        endpoint="relay",
        service="git",
        client=CLIENT,
        mounts=[],
        trace_id=traceparent.split("-")[1] if traceparent else MADE_UP_TRACE,
        traceparent=traceparent,
    )


def end(observer: Observer, session: str = "s1", calls: int = 0) -> None:
    observer.session_ended(session, endpoint="relay", service="git", seconds=1.0, calls=calls)


def finished(observer: Observer, exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    observer.close()
    return {span.name: span for span in exporter.get_finished_spans()}


def trace_hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def test_a_session_without_a_traceparent_is_a_root_span_in_the_trace_the_trail_names() -> None:
    observer, exporter = traced()
    start(observer)
    end(observer, calls=3)
    [span] = finished(observer, exporter).values()
    assert span.name == "session git"
    assert span.kind is SpanKind.SERVER
    assert span.parent is None
    assert trace_hex(span) == MADE_UP_TRACE
    assert span.attributes is not None
    assert dict(span.attributes) == {
        "mcp.session.id": "s1",
        "reactor_fabric.endpoint": "relay",
        "reactor_fabric.service": "git",
        "reactor_fabric.transport": "streamable-http",
        "client.address": "127.0.0.1",
        "client.port": 5000,
        "reactor_fabric.tool_calls": 3,
    }
    assert span.resource.attributes["service.name"] == "reactor-fabric"


def test_a_session_opened_with_a_traceparent_is_a_child_of_the_clients_span() -> None:
    observer, exporter = traced()
    start(observer, traceparent=OPENING)
    end(observer)
    [span] = finished(observer, exporter).values()
    assert span.parent is not None
    assert span.parent.is_remote
    assert f"{span.parent.span_id:016x}" == "b7ad6b7169203331"
    assert trace_hex(span) == SESSION_TRACE


def test_container_starts_and_calls_are_children_of_their_session_with_their_real_times() -> None:
    observer, exporter = traced()
    start(observer, traceparent=OPENING)
    observer.container_started(
        session="s1", service="git", container="c0ffee", image="mcp/git:1", seconds=1.5,
        respawn=True,
    )  # fmt: skip
    observer.tool_call(
        call("git_log"), session="s1", endpoint="relay", service="git", container="c0ffee",
        client=CLIENT, trace_id=SESSION_TRACE,
    )  # fmt: skip
    end(observer, calls=1)
    spans = finished(observer, exporter)
    session = spans["session git"]
    container = spans["container start git"]
    tool = spans["tools/call git_log"]
    assert session.context is not None
    for child in (container, tool):
        assert child.parent is not None
        assert child.parent.span_id == session.context.span_id
        assert trace_hex(child) == SESSION_TRACE
    assert container.end_time is not None
    assert container.start_time is not None
    assert container.end_time - container.start_time == pytest.approx(1.5e9, abs=1e6)
    assert container.attributes is not None
    assert container.attributes["container.image.name"] == "mcp/git:1"
    assert container.attributes["reactor_fabric.respawn"] is True
    assert tool.end_time is not None
    assert tool.start_time is not None
    assert tool.end_time - tool.start_time == pytest.approx(0.25e9, abs=1e6)
    assert tool.kind is SpanKind.SERVER
    assert tool.status.status_code is StatusCode.UNSET
    assert tool.attributes is not None
    assert dict(tool.attributes) == {
        "mcp.method.name": "tools/call",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "git_log",
        "mcp.session.id": "s1",
        "reactor_fabric.service": "git",
        "reactor_fabric.outcome": "ok",
        "reactor_fabric.bytes_in": 10,
        "reactor_fabric.bytes_out": 20,
        "jsonrpc.request.id": "1",
        "container.id": "c0ffee",
    }


def test_a_call_with_its_own_traceparent_joins_the_clients_trace_as_the_trail_says() -> None:
    observer, exporter = traced()
    start(observer)
    observer.tool_call(
        call("git_log", traceparent=TRACEPARENT), session="s1", endpoint="relay", service="git",
        container="c1", client=CLIENT, trace_id=MADE_UP_TRACE,
    )  # fmt: skip
    end(observer)
    tool = finished(observer, exporter)["tools/call git_log"]
    assert tool.parent is not None
    assert tool.parent.is_remote
    assert f"{tool.parent.span_id:016x}" == TRACEPARENT.split("-")[2]
    assert trace_hex(tool) == TRACEPARENT.split("-")[1]


@pytest.mark.parametrize(
    ("outcome", "code", "reason", "error_type"),
    [
        ("error", -32002, "container_exited", "-32002"),
        ("error", None, None, "tool_error"),
        ("cancelled", None, None, "cancelled"),
        ("no_answer", None, None, "no_answer"),
    ],
)
def test_a_call_that_did_not_succeed_is_an_error_span_with_the_conventions_error_type(
    outcome: str, code: int | None, reason: str | None, error_type: str
) -> None:
    observer, exporter = traced()
    start(observer)
    observer.tool_call(
        call("git_log", outcome, error_code=code, error_reason=reason), session="s1",
        endpoint="relay", service="git", container=None, client=CLIENT, trace_id=MADE_UP_TRACE,
    )  # fmt: skip
    end(observer)
    tool = finished(observer, exporter)["tools/call git_log"]
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.status.description == (reason or outcome)
    assert tool.attributes is not None
    assert tool.attributes["error.type"] == error_type
    assert tool.attributes["reactor_fabric.outcome"] == outcome
    assert ("rpc.response.status_code" in tool.attributes) == (code is not None)
    assert "container.id" not in tool.attributes


def test_a_client_that_does_not_sample_its_trace_gets_no_spans_recorded_in_it() -> None:
    observer, exporter = traced()
    start(observer, traceparent=f"00-{SESSION_TRACE}-b7ad6b7169203331-00")
    observer.tool_call(
        call("git_log"), session="s1", endpoint="relay", service="git", container="c1",
        client=CLIENT, trace_id=SESSION_TRACE,
    )  # fmt: skip
    end(observer)
    assert finished(observer, exporter) == {}


def test_a_call_of_an_unknown_session_starts_a_trace_with_the_id_the_trail_names() -> None:
    observer, exporter = traced()
    observer.tool_call(
        call("git_log"), session="gone", endpoint="relay", service="git", container=None,
        client=CLIENT, trace_id=MADE_UP_TRACE,
    )  # fmt: skip
    tool = finished(observer, exporter)["tools/call git_log"]
    assert tool.parent is None
    assert trace_hex(tool) == MADE_UP_TRACE


def test_closing_ends_the_spans_of_sessions_still_open_as_stopped_by_the_orchestrator() -> None:
    observer, exporter = traced()
    start(observer, "s1")
    start(observer, "s2")
    end(observer, "s1")
    observer.close()
    sessions = {
        span.attributes["mcp.session.id"]: span
        for span in exporter.get_finished_spans()
        if span.attributes is not None
    }
    assert sessions.keys() == {"s1", "s2"}
    assert "reactor_fabric.ended_by" not in sessions["s1"].attributes  # type: ignore[operator]
    assert sessions["s2"].attributes is not None
    assert sessions["s2"].attributes["reactor_fabric.ended_by"] == "orchestrator_stopping"


class StuckExporter(SpanExporter):
    """A collector that never answers: export blocks until the test lets it go."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exporting = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exporting.set()
        self.release.wait(60)
        return SpanExportResult.SUCCESS


def test_closing_gives_up_on_a_collector_that_does_not_answer_in_bounded_time() -> None:
    exporter = StuckExporter()
    tracing = Tracing(exporter)
    observer = Observer(tracing=tracing)
    start(observer)
    end(observer)
    began = time.monotonic()
    try:
        tracing.close(timeout=0.5)
        assert time.monotonic() - began < 5
        assert exporter.exporting.is_set()
    finally:
        exporter.release.set()


def test_the_operator_names_the_service_through_the_standard_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "fabric-eu-1")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
    observer, exporter = traced()
    start(observer)
    end(observer)
    [span] = finished(observer, exporter).values()
    assert span.resource.attributes["service.name"] == "fabric-eu-1"
    assert span.resource.attributes["deployment.environment"] == "staging"


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": ""},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
    ],
)
def test_tracing_stays_off_unless_an_endpoint_is_set_and_opentelemetry_is_on(
    environ: dict[str, str],
) -> None:
    assert tracing_from_environment(environ) is None


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
)
def test_either_standard_endpoint_variable_turns_tracing_on(variable: str) -> None:
    tracing = tracing_from_environment({variable: "http://127.0.0.1:9"})
    assert isinstance(tracing, Tracing)
    tracing.close(timeout=0.1)


def test_an_unsupported_otlp_protocol_is_refused_loudly_rather_than_sent_wrongly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    with caplog.at_level(logging.ERROR):
        assert tracing_from_environment(environ) is None
    [record] = caplog.records
    assert record.getMessage() == "tracing_unavailable"
    assert record.__dict__["reason"] == "otlp_protocol_unsupported"


def test_without_the_otel_extra_the_orchestrator_says_so_and_serves_untraced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # None in sys.modules makes the import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with caplog.at_level(logging.WARNING):
        assert tracing_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}) is None
    [record] = caplog.records
    assert record.__dict__["reason"] == "otel_not_installed"
    assert "reactor-fabric[otel]" in record.__dict__["detail"]


def test_a_call_recorded_later_in_a_batch_ends_its_span_when_the_call_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    observer, exporter = traced()
    start(observer, traceparent=OPENING)
    observer.defer_audit(lambda: None)  # held for a batch, as the orchestrator does
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.5)  # when the call ends
    observer.tool_call(
        call("git_log"), session="s1", endpoint="relay", service="git", container="c0ffee",
        client=CLIENT, trace_id=SESSION_TRACE,
    )  # fmt: skip
    monkeypatch.undo()  # the batch is taken later
    observer.flush()
    tool = finished(observer, exporter)["tools/call git_log"]
    assert tool.end_time == 1_700_000_000_500_000_000
    assert tool.start_time == 1_700_000_000_250_000_000
