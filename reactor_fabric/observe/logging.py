"""Structured logs: one JSON object per line on stderr.

Call sites use the standard library's logging with an event name as the message and fields in
``extra``::

    log.info("container_started", extra={"session": sid, "service": name, "container": cid})

which prints ``{"ts": "...", "level": "info", "logger": "reactor_fabric.session",
"event": "container_started", "session": "...", ...}``.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, TextIO

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime"}
)


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
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send the ``reactor_fabric`` loggers to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("reactor_fabric")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
