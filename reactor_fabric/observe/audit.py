"""The audit trail: JSON lines, each carrying the SHA-256 of the line before it.

Every record is one JSON object on one line, its keys in a fixed order, ending in ``"prev"``:
the hex SHA-256 of the previous line's bytes (without its newline). The first line ever written
has 64 zeros there. A line removed or edited breaks the chain at the next line, which
:func:`verify` finds (``python -m reactor_fabric audit verify``); so does removing the first
lines of a trail whose oldest file is not a rotated one. The chain continues across
restarts (the writer reads the last line on start) and across rotations (the first line of a
fresh file names the last line of the rotated one).

What the chain does not do: someone who can rewrite the files can recompute every hash after
an edit, and the newest line can be removed without a trace. Ship the lines elsewhere as they
are written (``audit --follow --json``) when that matters.

Writing never blocks the relay. A record is encoded and chained where it is submitted, on the
trio thread (a few microseconds: the thread that writes does no Python work per line, which on
two cores cost the relay more in contention for the interpreter than the work itself), and its
line queued — bounded in bytes; when the writer thread falls behind, records are dropped before
they are chained and counted, and an ``audit_dropped`` record with the count is written as soon
as there is room again. A thread appends the lines (``O_APPEND``, mode 0600, its directory
0700) in batches — it lingers a second after the first line, less when the queue fills —
flushes after each batch (no fsync: a crash of the machine may lose the last lines), and
rotates by size: ``audit.jsonl`` becomes ``audit.jsonl.1`` and so on, keeping ``keep`` rotated
files.

Resource handling: :meth:`AuditWriter.close` writes what is queued and joins the thread, bounded
by its timeout; the file is closed by the thread itself.

Error handling: a write that fails (disk full, a removed directory) is logged once per batch and
its records counted as dropped; the writer goes on with the next batch. Those lines were
chained already, so the next line written names a line the trail does not have: ``verify``
shows the gap where it is, and the ``audit_dropped`` record says how many were lost.
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

from .redaction import SECRET_VALUES

log = logging.getLogger(__name__)

GENESIS: Final = "0" * 64
DEFAULT_QUEUE_BYTES: Final = 8 * 1024 * 1024
# Once woken, the writer lets records gather this long before taking them (one wake-up, one
# write and one flush per batch). Why a second, not less: every time the writer thread runs it
# needs the interpreter, and on two cores the event loop then waits for it or finds its caches
# cold. Traced on the relay (perf, 3,000 calls one at a time, two alternating runs each): at
# 50 ms the loop waited on the interpreter lock or woke the writer inside 30-60 relayed
# messages, and a message stayed in the orchestrator 98-109 us (request) and 160-168 us
# (answer) at P50; at 1 s, in 0-4 messages, and 77-80 and 113-122 us. It bounds how late a
# line reaches the file; a queue filling up (a quarter of its bytes) ends the wait early.
LINGER_SECONDS: Final = 1.0
_PREV_KEY: Final = b',"prev":"'
CHAIN_BYTES: Final = len(_PREV_KEY) + 64 + 3  # what chaining adds to a record's line
_encoder = msgspec.json.Encoder()


# The last second formatted (several records share one; formatting a datetime costs more than
# the rest of a record): (whole seconds, "YYYY-MM-DDTHH:MM:SS"). Replaced whole: thread-safe.
_second: tuple[int, str] = (0, "1970-01-01T00:00:00")


def now_iso(timestamp: float | None = None) -> str:
    """A UTC timestamp as the audit writes them (ISO 8601, milliseconds, truncated)."""
    global _second  # noqa: PLW0603 (a cache)
    moment = time.time() if timestamp is None else timestamp
    whole = math.floor(moment)
    second, text = _second
    if whole != second:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, text)
    return f"{text}.{int((moment - whole) * 1000):03d}Z"


def line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def chained(record: bytes, prev: str) -> bytes:
    """The line for an encoded record (a JSON object) that follows a line hashing to ``prev``."""
    if not record.endswith(b"}") or record == b"{}":
        raise ValueError("a record is a non-empty JSON object")
    return record[:-1] + _PREV_KEY + prev.encode() + b'"}'


# --- files --------------------------------------------------------------------------------------


def rotated(path: Path, number: int) -> Path:
    return path.with_name(f"{path.name}.{number}")


def audit_files(path: Path) -> list[Path]:
    """The trail's files, oldest first: ``audit.jsonl.N`` … ``audit.jsonl.1``, ``audit.jsonl``."""
    numbered: list[tuple[int, Path]] = []
    if path.parent.is_dir():
        prefix = path.name + "."
        for candidate in path.parent.iterdir():
            suffix = candidate.name.removeprefix(prefix)
            if candidate.name.startswith(prefix) and suffix.isdigit():
                numbered.append((int(suffix), candidate))
    files = [candidate for _number, candidate in sorted(numbered, reverse=True)]
    if path.exists():
        files.append(path)
    return files


def last_line(path: Path) -> bytes | None:
    """The last complete line of a file (read from its end), or None if it has none."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            block = 65536
            data = b""
            position = size
            while position > 0:
                step = min(block, position)
                position -= step
                file.seek(position)
                data = file.read(step) + data
                body = data.rstrip(b"\n")
                if b"\n" in body or position == 0:
                    return body.rsplit(b"\n", 1)[-1] or None
    except FileNotFoundError:
        return None
    return None


def chain_head(path: Path) -> str:
    """The hash the next line of the trail at ``path`` must carry (GENESIS for a new trail)."""
    for candidate in reversed(audit_files(path)):
        line = last_line(candidate)
        if line is not None:
            return line_hash(line)
    return GENESIS


# --- verification -------------------------------------------------------------------------------


@dataclass
class Verification:
    """What :func:`verify` found."""

    files: list[Path] = field(default_factory=list)
    records: int = 0
    problems: list[str] = field(default_factory=list)
    # The first line's predecessor when it is not the genesis: older files were rotated away.
    starts_after: str | None = None

    @property
    def intact(self) -> bool:
        return not self.problems


def verify(path: Path) -> Verification:
    """Check the chain of every line of the trail at ``path``, across its rotated files.

    The trail's first record must start the chain (64 zeros), unless its file is a rotated one
    (``audit.jsonl.N``): older files were rotated away, which the numbering shows. Anything
    else would let the first lines of a trail be deleted without a trace.
    """
    result = Verification(files=audit_files(path))
    expected: str | None = None
    for file in result.files:
        with file.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                line = raw.rstrip(b"\n")
                where = f"{file}:{number}"
                if not raw.endswith(b"\n"):
                    result.problems.append(f"{where}: the last line is incomplete")
                record = _decoded(line)
                if record is None:
                    # Never a traceback: a line nested beyond the decoder's limit is tampering
                    # like any other line that is not a record (the writer writes neither).
                    result.problems.append(
                        f"{where}: not a JSON object (unparseable, or nested too deep to read)"
                    )
                    expected = line_hash(line)
                    continue
                prev = record.get("prev") if isinstance(record, dict) else None
                if not isinstance(prev, str):
                    result.problems.append(f"{where}: no hash of the previous line")
                elif expected is None:
                    if prev == GENESIS:
                        pass
                    elif file != path:
                        result.starts_after = prev
                    else:
                        result.problems.append(
                            f"{where}: the first record does not start the chain (it follows a "
                            f"line hashing to {prev[:12]}…, and no rotated file precedes it): "
                            "the lines before it were removed"
                        )
                elif prev != expected:
                    result.problems.append(
                        f"{where}: the previous line was changed or removed "
                        f"(it hashes to {expected[:12]}…, this line expects {prev[:12]}…)"
                    )
                result.records += 1
                expected = line_hash(line)
    return result


def _decoded(line: bytes) -> object | None:
    """A line's JSON value; None when it is not JSON or is nested beyond the decoder's limit."""
    try:
        value: object = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    return value


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of the trail, oldest first (lines that are not records, or nested too deep
    to read, are skipped)."""
    for file in audit_files(path):
        with file.open("rb") as lines:
            for raw in lines:
                record = _decoded(raw)
                if isinstance(record, dict):
                    yield record


# --- the writer ---------------------------------------------------------------------------------


class AuditInUse(OSError):
    """Another orchestrator writes this trail: two writers would break its chain."""


class AuditWriter:
    """Appends records to the trail from a thread of its own (see the module docstring).

    One writer per trail: :meth:`open` takes an exclusive lock (``audit.jsonl.lock``) for as
    long as the writer lives, and fails with :class:`AuditInUse` when another process holds it.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        keep: int,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        linger: float = LINGER_SECONDS,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.queue_bytes = queue_bytes
        self.linger = linger
        # Queued bytes from which the writer stops lingering: a burst is written at once, and
        # the queue keeps room for three times as much before anything is dropped.
        self._wake_bytes = max(1, queue_bytes // 4)
        self.dropped = 0  # records dropped so far (queue full or a failed write)
        self.written = 0
        self._reported = 0  # drops already told in an audit_dropped record
        self._queue: collections.deque[bytes] = collections.deque()  # chained lines, with \n
        self._queued_bytes = 0
        self._condition = threading.Condition(threading.Lock())
        self._closing = False
        self._thread: threading.Thread | None = None
        self._file: Any = None
        self._lock: int | None = None
        self._size = 0
        self._head = GENESIS

    def open(self) -> None:
        """Create the directory and file (private to the user) and start the writer thread.

        Raises OSError when the trail cannot be written (AuditInUse: another orchestrator
        writes it): the caller decides whether to go on.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_path = self.path.with_name(self.path.name + ".lock")
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            raise AuditInUse(
                f"another orchestrator writes the audit trail {self.path}; give this one its "
                "own (orchestrator.audit.path, or XDG_STATE_HOME)"
            ) from None
        self._lock = lock
        self._head = chain_head(self.path)
        self._file = self._open_file()
        self._thread = threading.Thread(target=self._run, name="reactor-fabric-audit", daemon=True)
        self._thread.start()

    def _open_file(self) -> Any:
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        file = os.fdopen(descriptor, "ab")
        self._size = file.seek(0, os.SEEK_END)
        return file

    def submit(self, record: dict[str, Any]) -> bool:
        """Chain and queue one record (its keys in the order to write them; no ``prev``);
        False if it was dropped. Never blocks beyond taking a lock the writer holds only to
        swap queues."""
        return self.submit_many([record]) == 1

    def submit_many(self, records: list[dict[str, Any]]) -> int:
        """:meth:`submit` for several records in order, taking the lock once; how many were
        queued (the others were dropped)."""
        # A secret's value never reaches the trail (a tool call's arguments in full may carry
        # one a client passed on).
        encoded = [SECRET_VALUES.redact_bytes(_encoder.encode(record)) for record in records]
        queued = 0
        with self._condition:
            was_empty = not self._queue
            was_below = self._queued_bytes < self._wake_bytes
            for data in encoded:
                if (
                    self._closing
                    or self._thread is None
                    or self._queued_bytes + len(data) + CHAIN_BYTES > self.queue_bytes
                ):
                    self.dropped += 1
                    continue
                self._queue_drop_notice()
                self._chain(data)
                queued += 1
            # The writer is woken by the first record, and once more when the queue fills past
            # a quarter (that ends its linger); never for each record.
            if self._queue and (was_empty or (was_below and self._filling())):
                self._condition.notify()
        return queued

    def count_dropped(self, count: int) -> None:
        """Records that were never submitted (they could not be made) count as dropped: the
        next record queued is preceded by an audit_dropped record that says so."""
        with self._condition:
            self.dropped += count

    def _filling(self) -> bool:
        return self._queued_bytes >= self._wake_bytes

    def _chain(self, data: bytes) -> None:
        """Queue the line of an encoded record, next in the chain (the lock is held)."""
        line = chained(data, self._head)
        self._head = line_hash(line)
        self._queue.append(line + b"\n")
        self._queued_bytes += len(line) + 1

    def _queue_drop_notice(self) -> None:
        """Queue an audit_dropped record for drops not yet told (the lock is held)."""
        if self.dropped > self._reported:
            count = self.dropped - self._reported
            self._chain(
                _encoder.encode({"ts": now_iso(), "event": "audit_dropped", "count": count})
            )
            self._reported = self.dropped

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the thread (waits at most ``timeout``)."""
        with self._condition:
            if self._thread is not None:
                self._queue_drop_notice()
            self._closing = True
            self._condition.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._lock is not None and (self._thread is None or not self._thread.is_alive()):
            os.close(self._lock)  # releases the lock
            self._lock = None

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._condition:
                    while not self._queue and not self._closing:
                        self._condition.wait()
                    self._linger()
                    batch = list(self._queue)
                    self._queue.clear()
                    self._queued_bytes = 0
                    closing = self._closing
                if batch:
                    self._write(batch)
                if closing and not batch:
                    return
        finally:
            if self._file is not None:
                self._file.close()

    def _linger(self) -> None:
        """Let records gather (the lock is held, and released while waiting) until the linger
        is over, the queue fills past a quarter, or :meth:`close` is called."""
        deadline = time.monotonic() + self.linger
        while not self._closing and not self._filling():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._condition.wait(remaining)

    def _write(self, batch: list[bytes]) -> None:
        """Append a batch of chained lines, rotating where the file would outgrow max_bytes."""
        try:
            start = 0
            size = self._size
            for index, line in enumerate(batch):
                if size and size + len(line) > self.max_bytes:
                    self._file.write(b"".join(batch[start:index]))
                    self._rotate()
                    start, size = index, 0
                size += len(line)
            self._file.write(b"".join(batch[start:]))
            self._file.flush()
            self._size = size
            self.written += len(batch)
        except (OSError, ValueError) as exc:
            with self._condition:
                self.dropped += len(batch)
            log.error("audit_write_failed", extra={"path": str(self.path), "detail": str(exc)})

    def _rotate(self) -> None:
        self._file.flush()
        self._file.close()
        if self.keep > 0:
            rotated(self.path, self.keep).unlink(missing_ok=True)
            for number in range(self.keep - 1, 0, -1):
                older = rotated(self.path, number)
                if older.exists():
                    older.rename(rotated(self.path, number + 1))
            self.path.rename(rotated(self.path, 1))
        else:
            self.path.unlink(missing_ok=True)
        self._file = self._open_file()
