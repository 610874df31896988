"""OpenTelemetry spans for sessions, container starts and tool calls, exported over OTLP.

Only imported when tracing was asked for (see :mod:`.otel`): it needs the ``otel`` extra
(``opentelemetry-sdk`` and the OTLP/HTTP exporter). Configuration is OpenTelemetry's own, from
the standard environment variables — ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*`` — so an operator's usual
settings apply unchanged.

What is exported, and how it lines up with the audit trail:

- a ``session {service}`` span per session, from its admission to its end. Its trace id is the
  session's ``trace_id`` in the trail: the one of the ``traceparent`` header of the request that
  opened it (whose span becomes the parent), else the one the orchestrator made up;
- a ``container start {service}`` span per container start, a child of its session's span;
- a ``tools/call {tool}`` span per tool call (the MCP semantic conventions' name and
  attributes), a child of the ``traceparent`` the client put in the call's ``params._meta``
  when there is one, else of its session's span. Its trace id is the call's ``trace_id`` in
  the trail.

Spans are made when the event is known to have ended (the observer is told then), with the
start time it really had, so nothing is kept open per call.

Resource handling: spans are queued in memory (the SDK's ``BatchSpanProcessor``, bounded by
``OTEL_BSP_MAX_QUEUE_SIZE``; full means dropped) and exported by the SDK's own thread; the
trio thread only builds spans. :meth:`Tracing.close` flushes what is queued, bounded in time,
and gives up on an exporter that does not answer (its thread is a daemon).

Error handling: an unreachable or failing collector costs only its spans, which the SDK logs
(its retries run on its thread); nothing a collector does reaches a session.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from .._version import __version__
from ..protocol.tool_calls import ToolCall

TRACER_NAME: Final = "reactor_fabric"
CLOSE_SECONDS: Final = 5.0
# Sessions whose span is open, at most (more than any orchestrator admits: max_sessions).
MAX_OPEN_SESSIONS: Final = 100_000


class _ChosenTraceIds(IdGenerator):
    """Random ids, except that the next root span may be given the trace id the audit trail
    already names (the SDK has no other way to start a root span in a given trace)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.next_trace_id: int | None = None

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        chosen, self.next_trace_id = self.next_trace_id, None
        return chosen if chosen is not None else self._random.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        # Ours come from secrets.token_hex: random in every bit, as the samplers assume.
        return True


def remote_parent(traceparent: str) -> Context:
    """A context whose current span is the (valid) W3C ``traceparent``'s span, remote."""
    _version, trace_id, span_id, flags = traceparent.split("-")
    parent = SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags, 16) & TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def resource() -> Resource:
    """The environment's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), named
    reactor-fabric unless the operator named it."""
    detected = Resource.create({SERVICE_VERSION: __version__})
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        detected = detected.merge(Resource({SERVICE_NAME: "reactor-fabric"}))
    return detected


class Tracing:
    """The spans of one orchestrator (see the module docstring). Synchronous; runs on the trio
    thread."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._ids = _ChosenTraceIds()
        self.provider = TracerProvider(
            resource=resource(), id_generator=self._ids, shutdown_on_exit=False
        )
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer(TRACER_NAME, __version__)
        self._sessions: dict[str, Span] = {}

    def _context(self, session: str, trace_id: str | None) -> Context:
        """The context of a session's children: its span, else a new trace (with the session's
        trace id when known)."""
        span = self._sessions.get(session)
        if span is not None:
            return trace.set_span_in_context(span)
        return self._new_trace(trace_id)

    def _new_trace(self, trace_id: str | None) -> Context:
        """The context of a root span: in the trace ``trace_id`` (the trail's) when given."""
        if trace_id is not None:
            self._ids.next_trace_id = int(trace_id, 16)
        return Context()

    def session_started(
        self,
        session: str,
        *,
        endpoint: str,
        service: str,
        transport: str,
        peer: str,
        trace_id: str,
        traceparent: str | None,
    ) -> None:
        if len(self._sessions) >= MAX_OPEN_SESSIONS:
            return
        context = (
            remote_parent(traceparent) if traceparent is not None else self._new_trace(trace_id)
        )
        attributes: dict[str, Any] = {
            "mcp.session.id": session,
            "reactor_fabric.endpoint": endpoint,
            "reactor_fabric.service": service,
            "reactor_fabric.transport": transport,
        }
        address, _, port = peer.rpartition(":")
        if address:
            attributes["client.address"] = address.strip("[]")
            if port.isdigit():
                attributes["client.port"] = int(port)
        self._sessions[session] = self._tracer.start_span(
            f"session {service}", context, SpanKind.SERVER, attributes
        )

    def session_ended(self, session: str, *, calls: int) -> None:
        span = self._sessions.pop(session, None)
        if span is not None:
            span.set_attribute("reactor_fabric.tool_calls", calls)
            span.end()

    def container_started(
        self,
        *,
        session: str,
        service: str,
        container: str,
        image: str,
        seconds: float,
        respawn: bool,
    ) -> None:
        end = time.time_ns()
        span = self._tracer.start_span(
            f"container start {service}",
            self._context(session, None),
            SpanKind.INTERNAL,
            {
                "mcp.session.id": session,
                "reactor_fabric.service": service,
                "container.id": container,
                "container.image.name": image,
                "reactor_fabric.respawn": respawn,
            },
            start_time=end - int(seconds * 1e9),
        )
        span.end(end)

    def tool_call(
        self,
        call: ToolCall,
        *,
        session: str,
        trace_id: str,
        service: str,
        container: str | None,
        ended: float | None = None,
    ) -> None:
        """The call's span, ended at ``ended`` (wall clock, seconds; None: now)."""
        end = time.time_ns() if ended is None else round(ended * 1e9)
        context = (
            remote_parent(call.traceparent)
            if call.traceparent is not None
            else self._context(session, trace_id)
        )
        attributes: dict[str, Any] = {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool,
            "mcp.session.id": session,
            "reactor_fabric.service": service,
            "reactor_fabric.outcome": call.outcome,
            "reactor_fabric.bytes_in": call.bytes_in,
            "reactor_fabric.bytes_out": call.bytes_out,
        }
        if call.request_id is not None:
            attributes["jsonrpc.request.id"] = str(call.request_id)
        if container is not None:
            attributes["container.id"] = container
        if call.outcome != "ok":
            # The conventions' error.type: the JSON-RPC code when there is one, "tool_error"
            # for a result with isError, else what happened (cancelled, no_answer).
            attributes["error.type"] = (
                str(call.error_code) if call.error_code is not None else _error_type(call)
            )
            if call.error_code is not None:
                attributes["rpc.response.status_code"] = str(call.error_code)
        span = self._tracer.start_span(
            f"tools/call {call.tool}",
            context,
            SpanKind.SERVER,
            attributes,
            start_time=end - int(call.duration * 1e9),
        )
        if call.outcome != "ok":
            span.set_status(Status(StatusCode.ERROR, call.error_reason or call.outcome))
        span.end(end)

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """End the spans of sessions still open, export what is queued; give up after
        ``timeout`` seconds (a collector that does not answer)."""
        for span in self._sessions.values():
            span.set_attribute("reactor_fabric.ended_by", "orchestrator_stopping")
            span.end()
        self._sessions.clear()
        closing = threading.Thread(
            target=self.provider.shutdown, name="reactor-fabric-otel-close", daemon=True
        )
        closing.start()
        closing.join(timeout)


def _error_type(call: ToolCall) -> str:
    return "tool_error" if call.outcome == "error" else call.outcome
