"""Structured logs: one JSON object per line on stderr, written off the trio thread.

Call sites use the standard library's logging with an event name as the message and fields in
``extra``::

    log.info("container_started", extra={"session": sid, "service": name, "container": cid})

which prints ``{"ts": "...", "level": "info", "logger": "reactor_fabric.trio.session",
"event": "container_started", "session": "...", ...}``.

Why off the thread: writing to stderr blocks when whoever reads it (a terminal, a pipe to a log
collector) is slow, and JSON encoding costs CPU; on the trio thread either would stall every
session. So a record is only queued where it is logged — a bounded queue: when the writer falls
behind, records are dropped, never waited for, and the number dropped is logged once it catches
up. A thread (:class:`logging.handlers.QueueListener`) formats and writes them.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import queue
import sys
from collections.abc import Callable
from typing import Any, TextIO

from .redaction import SECRET_VALUES

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime"}
)
QUEUE_RECORDS = 10_000

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(
            (key, value)
            for key, value in record.__dict__.items()
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_")
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # A secret's value never reaches the log, whichever field carried it.
        return SECRET_VALUES.redact(json.dumps(entry, default=str, ensure_ascii=False))


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """Queues records for the writer thread; drops them (counted) rather than ever waiting."""

    def __init__(self, records: queue.Queue[logging.LogRecord]) -> None:
        super().__init__(records)
        self.dropped = 0
        self._reported = 0

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # The writer thread formats; this process keeps the record as it is (no pickling).
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            if self.dropped > self._reported:
                self.queue.put_nowait(self._dropped_record())
                self._reported = self.dropped
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _dropped_record(self) -> logging.LogRecord:
        record = logging.LogRecord(
            "reactor_fabric.observe", logging.WARNING, __file__, 0, "log_records_dropped", (), None
        )
        record.dropped = self.dropped - self._reported
        return record


def configure_logging(level: str = "info", stream: TextIO | None = None) -> Callable[[], None]:
    """Send the ``reactor_fabric`` loggers to ``stream`` (stderr) as JSON lines, via a thread;
    the OpenTelemetry SDK's warnings too (an unreachable collector), so that every line is JSON.

    Returns the function that stops the writer thread after writing what is queued.
    """
    writer = logging.StreamHandler(stream or sys.stderr)
    writer.setFormatter(JsonFormatter())
    records: queue.Queue[logging.LogRecord] = queue.Queue(QUEUE_RECORDS)
    listener = logging.handlers.QueueListener(records, writer)
    handler = DroppingQueueHandler(records)
    root = logging.getLogger("reactor_fabric")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    otel = logging.getLogger("opentelemetry")
    otel.handlers[:] = [handler]
    otel.setLevel(max(logging.WARNING, root.level))
    otel.propagate = False
    listener.start()
    return listener.stop
