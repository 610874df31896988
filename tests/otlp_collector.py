"""A stand-in for an OpenTelemetry Collector's OTLP/HTTP traces receiver that records what it
receives.

It speaks the receiver's side of OTLP/HTTP with the official protobuf definitions
(``opentelemetry-proto``): ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` body
(``application/x-protobuf``, gzip when the exporter compresses), answered by an empty
``ExportTraceServiceResponse``. What it does not do: OTLP/JSON, gRPC, partial-success answers,
logs and metrics signals, batching or forwarding — it only keeps the spans, in arrival order,
decoded into plain values a test can compare.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex, as W3C traceparent writes it
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    resource: dict[str, Any]
    scope: str


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


class Collector:
    """What the stand-in received: spans, and each request's headers."""

    def __init__(self) -> None:
        self.url = ""
        self.spans: list[ReceivedSpan] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._received = threading.Condition(self._lock)  # notified at each export

    def receive(self, body: bytes, headers: dict[str, str]) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = [
            ReceivedSpan(
                name=span.name,
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                kind=span.kind,
                start_ns=span.start_time_unix_nano,
                end_ns=span.end_time_unix_nano,
                attributes=_attributes(span.attributes),
                status_code=span.status.code,
                status_message=span.status.message,
                resource=_attributes(spans.resource.attributes),
                scope=scoped.scope.name,
            )
            for spans in request.resource_spans
            for scoped in spans.scope_spans
            for span in scoped.spans
        ]
        with self._received:
            self.spans.extend(received)
            self.headers.append(headers)
            self._received.notify_all()

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], *, what: str, timeout: float = 30
    ) -> list[ReceivedSpan]:
        """The spans received, once ``found`` says they are all there (bounded): looked at again
        at each export received."""
        deadline = time.monotonic() + timeout
        with self._received:
            while not found(list(self.spans)):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._received.wait(remaining):
                    names = [s.name for s in self.spans]
                    raise AssertionError(f"the collector never received {what}; it has {names}")
            return list(self.spans)


class _Handler(http.server.BaseHTTPRequestHandler):
    collector: Collector

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces" or not self.headers.get("Content-Type", "").startswith(
            "application/x-protobuf"
        ):
            self.send_error(404 if self.path != "/v1/traces" else 415)
            return
        self.collector.receive(body, {k.lower(): v for k, v in self.headers.items()})
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: pytest shows what a test asserts."""


@contextmanager
def otlp_collector() -> Iterator[Collector]:
    """A collector stand-in on a free loopback port (``collector.url``: its base URL, what
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes)."""
    collector = Collector()
    handler = type("Handler", (_Handler,), {"collector": collector})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    collector.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
