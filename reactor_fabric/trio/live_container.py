"""A running container of a session and its I/O state, and its stderr read into the log.

Used by both endpoints' drivers, by :mod:`.containers` and by the warm pool (which reads a
pooled container's stderr before any session has it); a leaf of the trio layer (it imports
nothing of it), so that none of those needs another to reach it.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from .._reasons import SESSION_ENDED
from ..observe.ratelimit import TokenBucket
from ..observe.redaction import SECRET_VALUES
from ..protocol.framing import FramingError, TruncatingLineSplitter
from ..runtime.base import Container

# The logger these lines always came from (before this module was split from .containers):
# the log's "logger" field stays what operators filter on.
log = logging.getLogger("reactor_fabric.trio.containers")

READ_CHUNK = 65536
STDERR_TAIL_LINES = 20
STDERR_LINE_BYTES = 8192
STDERR_TAIL_CHARS = 500
STDERR_RATE_PER_SECOND = 50.0
STDERR_BURST = 200


@dataclass
class LiveContainer:
    """A running container of a session and its I/O state (both endpoints' drivers)."""

    seq: int
    container: Container
    queue: collections.deque[bytes] = field(default_factory=collections.deque)
    queued: trio.Event = field(default_factory=trio.Event)
    stdout_done: trio.Event = field(default_factory=trio.Event)
    stderr_done: trio.Event = field(default_factory=trio.Event)
    removed: trio.Event = field(default_factory=trio.Event)
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES)
    )
    removing: bool = False
    reading_stdout: bool = True  # the stdout reader runs (it was not cancelled)
    stop_reason: str = SESSION_ENDED
    stop_graceful: bool = True
    exit_code: int | None = None  # when it exited on its own and the engine could tell
    # Its task's copy, once recorded at its removal: (structuredContent.workspace, or None and
    # why not); and whether the machine waits for it (StopBackend.report_workspace).
    workspace: tuple[dict[str, Any] | None, str | None] | None = None
    report_workspace: bool = False


async def read_stderr(live: LiveContainer, fields: dict[str, Any]) -> None:
    """Container stderr → the log: lines truncated, rate-limited per container; the last lines
    kept in ``live.stderr_tail`` (they explain an exit)."""
    splitter = TruncatingLineSplitter(max_line=STDERR_LINE_BYTES)
    bucket = TokenBucket(rate=STDERR_RATE_PER_SECOND, burst=STDERR_BURST, now=trio.current_time())
    stderr = live.container.stderr
    try:
        while data := await stderr.receive_some(READ_CHUNK):
            for line, dropped in splitter.feed(bytes(data)):
                _stderr_line(live, bucket, line, dropped, fields)
        last = splitter.flush()
        if last is not None:
            _stderr_line(live, bucket, *last, fields)
    except (trio.BrokenResourceError, trio.ClosedResourceError, FramingError):
        pass
    finally:
        live.stderr_done.set()
        suppressed = bucket.take_suppressed()
        if suppressed:
            log.warning(
                "container_stderr_suppressed",
                extra={**fields, "sequence": live.seq, "lines": suppressed},
            )


def _stderr_line(
    live: LiveContainer,
    bucket: TokenBucket,
    line: bytes,
    dropped: int,
    fields: dict[str, Any],
) -> None:
    # A server that prints its token (a debug line) has it logged redacted, and the tail (an
    # exit's error details) keeps it redacted too.
    text = SECRET_VALUES.redact(line.decode("utf-8", "replace"))
    live.stderr_tail.append(text[:STDERR_TAIL_CHARS])
    if not bucket.allow(trio.current_time()):
        return
    logged: dict[str, Any] = {**fields, "sequence": live.seq, "line": text}
    if dropped:
        logged["truncated_bytes"] = dropped
    suppressed = bucket.take_suppressed()
    if suppressed:
        logged["suppressed_before"] = suppressed
    log.info("container_stderr", extra=logged)
