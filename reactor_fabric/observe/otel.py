"""Whether to export OpenTelemetry spans, decided from the environment at start.

Tracing is on when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and OpenTelemetry is not switched off
(``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none``). It needs the ``otel`` extra;
without it, the orchestrator says so once and serves untraced. Kept apart from
:mod:`.tracing` so that the SDK is imported only when it is used.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._reasons import OTEL_NOT_INSTALLED, OTLP_PROTOCOL_UNSUPPORTED

if TYPE_CHECKING:
    from .tracing import Tracing

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def tracing_from_environment(environ: Mapping[str, str]) -> Tracing | None:
    """The orchestrator's :class:`~.tracing.Tracing` if the environment asks for it and it
    can be had, else None (logged when asked for but impossible)."""
    endpoint = next((environ[name] for name in ENDPOINT_VARIABLES if environ.get(name)), None)
    if endpoint is None:
        return None
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if "none" in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(","):
        return None
    protocol = next(
        (environ[name] for name in PROTOCOL_VARIABLES if environ.get(name)), "http/protobuf"
    )
    if protocol.strip() != "http/protobuf":
        log.error(
            "tracing_unavailable",
            extra={
                "reason": OTLP_PROTOCOL_UNSUPPORTED,
                "protocol": protocol,
                "detail": "only OTLP over http/protobuf is exported; spans are not sent",
            },
        )
        return None
    try:
        # Imported here, not at the top: the extra is optional, and costs nothing when off.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )

        from .tracing import Tracing  # noqa: PLC0415
    except ImportError as exc:
        log.warning(
            "tracing_unavailable",
            extra={
                "reason": OTEL_NOT_INSTALLED,
                "detail": f"{exc}; install reactor-fabric[otel] to export spans",
            },
        )
        return None
    # The exporter reads the endpoint, headers, timeout and compression from the environment
    # itself (adding /v1/traces to OTEL_EXPORTER_OTLP_ENDPOINT).
    tracing = Tracing(OTLPSpanExporter())
    log.info("tracing", extra={"endpoint": endpoint, "protocol": protocol})
    return tracing
