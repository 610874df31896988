"""Structured logs, written by a thread from a bounded queue that never makes a caller wait."""

from __future__ import annotations

import io
import json
import logging
import queue

from reactor_fabric.observe.logging import DroppingQueueHandler, configure_logging


def test_records_become_json_lines_with_their_fields_written_by_the_writer_thread() -> None:
    out = io.StringIO()
    stop = configure_logging("info", out)
    try:
        logging.getLogger("reactor_fabric.test").info(
            "container_started", extra={"session": "s1", "sequence": 2}
        )
        logging.getLogger("reactor_fabric.test").debug("not_shown")
    finally:
        stop()
    [line] = out.getvalue().splitlines()
    entry = json.loads(line)
    assert (entry["event"], entry["level"], entry["session"], entry["sequence"]) == (
        "container_started",
        "info",
        "s1",
        2,
    )


def test_the_opentelemetry_sdks_warnings_are_json_lines_too_and_its_chatter_is_not() -> None:
    out = io.StringIO()
    stop = configure_logging("debug", out)
    try:
        exporter = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        exporter.warning("Transient error %s encountered while exporting spans", "refused")
        exporter.info("not_shown")
    finally:
        stop()
    [line] = out.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["level"] == "warning"
    assert entry["logger"].startswith("opentelemetry.")
    assert entry["event"] == "Transient error refused encountered while exporting spans"


def test_a_full_queue_drops_records_and_says_how_many_once_there_is_room() -> None:
    records: queue.Queue[logging.LogRecord] = queue.Queue(2)
    handler = DroppingQueueHandler(records)
    logger = logging.getLogger("reactor_fabric.test.dropping")
    logger.handlers[:] = [handler]
    logger.propagate = False
    for index in range(5):
        logger.warning(f"event_{index}")  # never blocks, though nobody reads
    assert handler.dropped == 3
    assert [records.get_nowait().getMessage() for _ in range(2)] == ["event_0", "event_1"]
    logger.warning("event_5")
    dropped = records.get_nowait()
    assert (dropped.getMessage(), dropped.dropped) == ("log_records_dropped", 3)  # type: ignore[attr-defined]
    assert records.get_nowait().getMessage() == "event_5"
