"""The audit trail: JSON lines, each carrying the SHA-256 of the line before it.

Every record is one JSON object on one line, its keys in a fixed order, ending in ``"prev"``:
the hex SHA-256 of the previous line's bytes (without its newline). The first line ever written
has 64 zeros there. A line removed or edited breaks the chain at the next line, which
:func:`verify` finds (``python -m reactor_fabric audit verify``). The chain continues across
restarts (the writer reads the last line on start) and across rotations (the first line of a
fresh file names the last line of the rotated one).

Every file the writer begins starts with a ``file_start`` record: the file's number in the
trail (``file``, 1 for its first) and the hash of the previous file's first line
(``previous_first``; null for the trail's first file), chained like any record (its ``prev`` is
the previous file's last line). So the oldest file left says where it stands: beginning with its
``file_start``, it follows files rotated away (``file`` - 1 of them); beginning with anything
else but the chain's start, its head was cut — and the next file's ``file_start`` says which
line it began with, which also covers a file written before these records existed.

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
files. Where a file ends is decided where lines are chained (the next file's ``file_start`` must
come between them in the chain); the thread rotates where the queue says so.

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
# The record each file begins with (see the module docstring).
FILE_START: Final = "file_start"
CHAIN_BYTES: Final = len(_PREV_KEY) + 64 + 3  # what chaining adds to a record's line
# What chaining adds to an encoded record (the key, the hash, its closing quote) with the newline.
_LINE_EXTRA: Final = len(_PREV_KEY) + 64 + 1 + 1
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


def first_line(path: Path) -> bytes | None:
    """The first line of a file (without its newline), or None if it is empty or missing."""
    try:
        with path.open("rb") as file:
            line = file.readline()
    except FileNotFoundError:
        return None
    return line.rstrip(b"\n") or None


def file_start(record: object) -> dict[str, Any] | None:
    """``record`` if it is a file's ``file_start`` record, else None."""
    if isinstance(record, dict) and record.get("event") == FILE_START:
        return record
    return None


def file_number(line: bytes | None) -> int | None:
    """The number the ``file_start`` record ``line`` gives its file (None: not one)."""
    header = file_start(_decoded(line)) if line is not None else None
    number = header.get("file") if header is not None else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


# --- verification -------------------------------------------------------------------------------


@dataclass
class Verification:
    """What :func:`verify` found."""

    files: list[Path] = field(default_factory=list)
    records: int = 0  # lines read but the files' file_start records
    problems: list[str] = field(default_factory=list)
    # The first line's predecessor when it is not the genesis: older files were rotated away.
    starts_after: str | None = None
    # How many files were rotated away before the oldest, as its file_start says (None: it
    # has none, or it is the trail's first file).
    rotated_away: int | None = None
    # The oldest file, when it begins neither the chain nor with a file_start record and no
    # later file's file_start names its first line: a trail written before file_start records,
    # whose cut head would look the same as its predecessors rotated away.
    head_unproven: Path | None = None

    @property
    def intact(self) -> bool:
        return not self.problems


@dataclass
class _Head:
    """A file's first line, as :func:`verify` read it."""

    file: Path
    line: bytes
    prev: str | None  # the hash it names (None: it names none)
    header: dict[str, Any] | None  # itself, when it is a file_start record


def verify(path: Path) -> Verification:
    """Check the chain of every line of the trail at ``path``, across its rotated files.

    The trail's first record must start the chain (64 zeros) or be a ``file_start`` record:
    then older files were rotated away. Each ``file_start`` names the first line of the file
    before it (``previous_first``), which must be that file's first line: so a file whose head
    was cut is told apart from one whose predecessors were rotated away, also when it was
    written before ``file_start`` records existed. Only an oldest file with neither, and no
    later file naming its first line (a trail written before them), is taken as it is
    (:attr:`Verification.head_unproven`).
    """
    result = Verification(files=audit_files(path))
    expected: str | None = None
    heads: list[_Head] = []
    for file in result.files:
        with file.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                line = raw.rstrip(b"\n")
                where = f"{file}:{number}"
                if not raw.endswith(b"\n"):
                    result.problems.append(f"{where}: the last line is incomplete")
                record = _decoded(line)
                prev = record.get("prev") if isinstance(record, dict) else None
                if number == 1:
                    named = prev if isinstance(prev, str) else None
                    heads.append(_Head(file, line, named, file_start(record)))
                    _check_previous_first(heads, result)
                if record is None:
                    # Never a traceback: a line nested beyond the decoder's limit is tampering
                    # like any other line that is not a record (the writer writes neither).
                    result.problems.append(
                        f"{where}: not a JSON object (unparseable, or nested too deep to read)"
                    )
                    expected = line_hash(line)
                    continue
                if not isinstance(prev, str):
                    result.problems.append(f"{where}: no hash of the previous line")
                elif expected is not None and prev != expected:
                    result.problems.append(
                        f"{where}: the previous line was changed or removed "
                        f"(it hashes to {expected[:12]}…, this line expects {prev[:12]}…)"
                    )
                if file_start(record) is None:
                    result.records += 1  # (a file's file_start is no event)
                expected = line_hash(line)
    if heads:
        _check_oldest(heads, path, result)
    return result


def _check_previous_first(heads: list[_Head], result: Verification) -> None:
    """The file_start of the file just begun against the first line of the one before it."""
    if len(heads) < 2 or heads[-1].header is None:
        return
    named = heads[-1].header.get("previous_first")
    before = heads[-2]
    found = line_hash(before.line)
    if named != found:
        shown = f"{named[:12]}…" if isinstance(named, str) else repr(named)
        result.problems.append(
            f"{before.file}:1: the first lines of this file were removed (its first line "
            f"hashes to {found[:12]}…, the file_start of {heads[-1].file.name} names {shown})"
        )


def _check_oldest(heads: list[_Head], path: Path, result: Verification) -> None:
    """Where the oldest file stands: at the chain's start, after files rotated away, or after
    lines removed from its head (a problem)."""
    oldest = heads[0]
    if oldest.prev is None or oldest.prev == GENESIS:
        return  # the chain's start (a first line naming no hash is reported already)
    if oldest.header is not None:
        result.starts_after = oldest.prev
        number = file_number(oldest.line)
        if number is not None and number > 1:
            result.rotated_away = number - 1
        return
    successor = heads[1] if len(heads) > 1 else None
    if successor is not None and successor.header is not None:
        # The next file's file_start names this one's first line, or that was reported: a file
        # written before file_start records, its head as it was when it was rotated.
        if successor.header.get("previous_first") == line_hash(oldest.line):
            result.starts_after = oldest.prev
        return
    if oldest.file == path:
        result.problems.append(
            f"{oldest.file}:1: the first record does not start the chain (it follows a line "
            f"hashing to {oldest.prev[:12]}…, and it is no file_start record, nor does a "
            "rotated file precede it): the lines before it were removed"
        )
        return
    # A trail written before file_start records: rotated away or cut, nothing tells which.
    result.starts_after = oldest.prev
    result.head_unproven = oldest.file


def _decoded(line: bytes) -> object | None:
    """A line's JSON value; None when it is not JSON or is nested beyond the decoder's limit."""
    try:
        value: object = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    return value


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of the trail, oldest first, but the files' ``file_start`` records (where a
    file stands is :func:`verify`'s business); lines that are not records, or nested too deep
    to read, are skipped."""
    for file in audit_files(path):
        with file.open("rb") as lines:
            for raw in lines:
                record = _decoded(raw)
                if isinstance(record, dict) and file_start(record) is None:
                    yield record


# --- the writer ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FileStart:
    """A queued file_start line (with its newline); ``rotate``: the file before it is full,
    rotate before writing it (else the file is empty: it starts the file as it is)."""

    line: bytes
    rotate: bool


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
        # Chained lines, with \n, and where a file starts.
        self._queue: collections.deque[bytes | _FileStart] = collections.deque()
        self._queued_bytes = 0
        self._condition = threading.Condition(threading.Lock())
        self._closing = False
        self._thread: threading.Thread | None = None
        self._file: Any = None
        self._lock: int | None = None
        self._head = GENESIS
        # The current file as it will be once the queue is written (kept where lines are
        # chained, which decides where a file ends): its bytes, whether it holds a line but its
        # file_start, its number and the hash of its first line (None: unknown, written before
        # file_start records; or, while it is empty, those of the file before it).
        self._file_bytes = 0
        self._file_records = False
        self._file_number: int | None = None
        self._file_first: str | None = None

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
        self._file_bytes = self._file.tell()
        first = first_line(self.path) if self._file_bytes else None
        if first is None:
            # Empty: the first line chained starts it with a file_start that follows the
            # newest rotated file, if there is one.
            before = [file for file in audit_files(self.path) if file != self.path]
            first = first_line(before[-1]) if before else None
            self._file_records = False
        else:
            only_header = self._file_bytes <= len(first) + 1 and file_number(first) is not None
            self._file_records = not only_header
        self._file_number = file_number(first)
        self._file_first = line_hash(first) if first is not None else None
        self._thread = threading.Thread(target=self._run, name="reactor-fabric-audit", daemon=True)
        self._thread.start()

    def _open_file(self) -> Any:
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        file = os.fdopen(descriptor, "ab")
        file.seek(0, os.SEEK_END)
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
        # one a client passed on): encoded as the operators' routes encode what they show.
        return self.submit_encoded([SECRET_VALUES.redacted_json(record) for record in records])

    def submit_encoded(self, encoded: list[bytes]) -> int:
        """:meth:`submit_many` for records already encoded (JSON objects, no ``prev``), and
        redacted by :meth:`~.redaction.Redactor.redacted_encoded`."""
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
        """Queue the line of an encoded record, next in the chain (the lock is held); a
        file_start before it when it begins a file (the current one is empty, or it would
        outgrow max_bytes with the line: then the file is rotated there)."""
        size = len(data) + _LINE_EXTRA
        if self._file_bytes == 0:
            self._start_file(rotate=False)
        elif self._file_records and self._file_bytes + size > self.max_bytes:
            self._start_file(rotate=True)
        line = chained(data, self._head)
        self._head = line_hash(line)
        self._queue.append(line + b"\n")
        self._queued_bytes += len(line) + 1
        self._file_bytes += len(line) + 1
        self._file_records = True

    def _start_file(self, *, rotate: bool) -> None:
        """Queue the file_start of the next file, next in the chain (the lock is held)."""
        number = (self._file_number or 0) + 1
        record = {
            "ts": now_iso(),
            "event": FILE_START,
            "file": number,
            "previous_first": self._file_first,
        }
        line = chained(_encoder.encode(record), self._head)
        self._head = line_hash(line)
        self._queue.append(_FileStart(line + b"\n", rotate))
        self._queued_bytes += len(line) + 1
        self._file_bytes, self._file_records = len(line) + 1, False
        self._file_number, self._file_first = number, self._head

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

    def _write(self, batch: list[bytes | _FileStart]) -> None:
        """Append a batch of chained lines, rotating where a file_start says so."""
        records = sum(1 for item in batch if not isinstance(item, _FileStart))
        try:
            lines: list[bytes] = []
            for item in batch:
                if isinstance(item, _FileStart):
                    if item.rotate:
                        self._file.write(b"".join(lines))
                        lines = []
                        self._rotate()
                    lines.append(item.line)
                else:
                    lines.append(item)
            self._file.write(b"".join(lines))
            self._file.flush()
            self.written += records
        except (OSError, ValueError) as exc:
            with self._condition:
                self.dropped += records
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
