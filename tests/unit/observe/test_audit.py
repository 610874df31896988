"""The audit trail's file: a hash chain across restarts and rotations, bounded, never blocking."""

from __future__ import annotations

import datetime
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reactor_fabric.observe.audit import (
    GENESIS,
    AuditInUse,
    AuditWriter,
    audit_files,
    chain_head,
    chained,
    line_hash,
    now_iso,
    read_records,
    verify,
)


def writer(path: Path, **options: int) -> AuditWriter:
    audit = AuditWriter(
        path, max_bytes=options.get("max_bytes", 1 << 20), keep=options.get("keep", 3)
    )
    audit.open()
    return audit


def write(path: Path, count: int, **options: int) -> None:
    audit = writer(path, **options)
    try:
        for number in range(count):
            assert audit.submit({"ts": "t", "event": "tool_call", "n": number})
    finally:
        audit.close()


def test_each_line_carries_the_hash_of_the_one_before_starting_from_zeros(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 3)
    lines = path.read_bytes().splitlines()
    header, *records = [json.loads(line) for line in lines]
    # The file begins by saying where it stands: the trail's first file, nothing before it.
    assert header == {
        "ts": header["ts"],
        "event": "file_start",
        "file": 1,
        "previous_first": None,
        "prev": GENESIS,
    }
    assert [r["n"] for r in records] == [0, 1, 2]
    assert records[0]["prev"] == line_hash(lines[0])
    assert records[1]["prev"] == line_hash(lines[1])
    assert records[2]["prev"] == line_hash(lines[2])
    assert list(records[0]) == ["ts", "event", "n", "prev"]  # the order given, prev last
    assert verify(path).intact


def test_the_chain_continues_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 2)
    write(path, 2)
    result = verify(path)
    assert (result.intact, result.records, result.starts_after) == (True, 4, None)


def test_rotation_keeps_the_chain_and_at_most_keep_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 200, max_bytes=2000, keep=2)
    files = audit_files(path)
    assert [f.name for f in files] == ["audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"]
    assert all(f.stat().st_size <= 2000 for f in files)
    result = verify(path)
    assert result.intact
    assert result.starts_after is not None  # older files were rotated away
    numbers = [r["n"] for r in read_records(path)]
    assert numbers == list(range(200 - len(numbers), 200))  # the newest, in order


def test_verify_finds_an_edited_a_removed_and_an_inserted_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 5)
    original = path.read_bytes().splitlines(keepends=True)

    edited = list(original)  # (line 1 is the file's file_start; record n is line n + 2)
    edited[3] = edited[3].replace(b'"n":2', b'"n":9')
    path.write_bytes(b"".join(edited))
    assert verify(path).problems == [
        f"{path}:5: the previous line was changed or removed "
        f"(it hashes to {line_hash(edited[3].rstrip())[:12]}…, this line expects "
        f"{json.loads(original[4])['prev'][:12]}…)"
    ]

    path.write_bytes(b"".join(original[:3] + original[4:]))
    [problem] = verify(path).problems
    assert problem.startswith(f"{path}:4: the previous line was changed or removed")

    forged = chained(b'{"ts":"t","event":"tool_call","n":99}', line_hash(original[2].rstrip()))
    path.write_bytes(b"".join([*original[:3], forged + b"\n", *original[3:]]))
    [problem] = verify(path).problems
    assert problem.startswith(f"{path}:5:")


def test_verify_reports_lines_that_are_not_records(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 2)
    with path.open("ab") as file:
        file.write(b'not json\n{"no": "prev"}\n{"partial"')
    problems = verify(path).problems
    assert any(":4: not a JSON object" in p for p in problems)
    assert any(":5: no hash of the previous line" in p for p in problems)
    assert any("the last line is incomplete" in p for p in problems)


def test_verify_fails_when_the_first_lines_of_a_trail_with_no_rotated_file_were_deleted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 5)
    lines = path.read_bytes().splitlines(keepends=True)
    for cut in (1, 3):  # its file_start alone, and with records after it
        path.write_bytes(b"".join(lines[cut:]))
        result = verify(path)
        [problem] = result.problems
        assert problem.startswith(f"{path}:1: the first record does not start the chain")
        assert result.starts_after is None


def test_verify_accepts_a_trail_whose_oldest_rotated_file_follows_one_rotated_away(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 200, max_bytes=2000, keep=1)
    assert [f.name for f in audit_files(path)] == ["audit.jsonl.1", "audit.jsonl"]
    result = verify(path)
    assert (result.intact, result.starts_after is not None) == (True, True)
    oldest = json.loads(audit_files(path)[0].read_bytes().splitlines()[0])
    assert oldest["event"] == "file_start"
    assert result.rotated_away == oldest["file"] - 1 > 0
    assert result.head_unproven is None


def test_verify_reports_a_line_nested_beyond_the_decoders_limit_with_its_number(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 2)
    lines = path.read_bytes().splitlines(keepends=True)
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    path.write_bytes(b"".join([*lines[:2], deep + b"\n", lines[2]]))
    problems = verify(path).problems
    assert problems[0] == f"{path}:3: not a JSON object (unparseable, or nested too deep to read)"
    assert problems[1].startswith(f"{path}:4: the previous line was changed or removed")
    assert [r["event"] for r in read_records(path)] == ["tool_call", "tool_call"]


def test_a_full_queue_drops_records_counts_them_and_says_so_in_the_trail(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path, max_bytes=1 << 20, keep=1, queue_bytes=400)
    # A disk that stalls: the writer thread is stuck in its first write until released.
    stalled, release = threading.Event(), threading.Event()
    write = audit._write

    def stalling_write(batch: list[Any]) -> None:
        stalled.set()
        release.wait(30)
        write(batch)

    audit._write = stalling_write  # type: ignore[method-assign]
    audit.open()
    assert audit.submit({"ts": "t", "event": "first"})
    stalled.wait(30)
    accepted = [audit.submit({"ts": "t", "event": "e", "n": n}) for n in range(20)]
    release.set()
    assert accepted.count(False) == audit.dropped > 0
    accepted.append(True)  # the first
    while audit.written < accepted.count(True):  # the writer catches up
        time.sleep(0.001)
    assert audit.submit({"ts": "t", "event": "after"})
    audit.close()
    records = list(read_records(path))
    [notice] = [r for r in records if r["event"] == "audit_dropped"]
    assert notice["count"] == accepted.count(False)
    assert verify(path).intact


def test_a_queue_filling_past_a_quarter_is_written_without_waiting_out_the_linger(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path, max_bytes=1 << 20, keep=1, queue_bytes=4000, linger=600)
    audit.open()
    try:
        sent = 0
        while audit._queued_bytes < 1000 and audit.written == 0:
            assert audit.submit({"ts": "t", "event": "burst", "n": sent})
            sent += 1
        deadline = time.monotonic() + 10  # the linger would be 600 s
        while audit.written < sent:
            assert time.monotonic() < deadline, "the burst waited for the linger"
            time.sleep(0.001)
        assert audit.dropped == 0
    finally:
        audit.close()


def test_close_cuts_the_linger_short_and_writes_what_is_queued(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path, max_bytes=1 << 20, keep=1, linger=600)
    audit.open()
    assert audit.submit({"ts": "t", "event": "last"})
    started = time.monotonic()
    audit.close(timeout=10)
    assert time.monotonic() - started < 10
    assert [r["event"] for r in read_records(path)] == ["last"]


def test_a_second_writer_of_the_same_trail_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    first = writer(path)
    try:
        with pytest.raises(AuditInUse, match="another orchestrator writes the audit trail"):
            writer(path)
    finally:
        first.close()
    writer(path).close()  # free again once the first is closed


def test_the_trail_and_its_directory_are_private_to_the_user(tmp_path: Path) -> None:
    path = tmp_path / "state" / "audit.jsonl"
    write(path, 1)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_a_failed_write_counts_its_records_as_dropped_the_writer_goes_on_and_verify_shows_the_gap(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    audit = writer(path)
    audit.submit({"ts": "t", "event": "kept"})
    while audit.written < 1:
        time.sleep(0.001)
    broken = threading.Event()
    real_write = audit._file.write

    def failing(data: bytes) -> int:
        if not broken.is_set():
            broken.set()
            raise OSError(28, "No space left on device")
        written: int = real_write(data)
        return written

    audit._file.write = failing
    audit.submit({"ts": "t", "event": "lost"})
    assert broken.wait(5)
    while audit.dropped < 1:
        time.sleep(0.001)
    audit.submit({"ts": "t", "event": "after"})
    audit.close()
    assert audit.dropped == 1
    records = list(read_records(path))
    assert [r["event"] for r in records] == ["kept", "audit_dropped", "after"]
    assert records[1]["count"] == 1
    # The lost line was chained: the line after it names a line the file does not have.
    result = verify(path)
    assert len(result.problems) == 1
    assert f"{path}:3: the previous line was changed or removed" in result.problems[0]


def test_the_head_of_an_empty_or_missing_trail_is_the_genesis(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    assert chain_head(path) == GENESIS
    path.write_bytes(b"")
    assert chain_head(path) == GENESIS
    os.truncate(path, 0)
    assert list(read_records(path)) == []


def test_a_record_must_be_a_json_object() -> None:
    with pytest.raises(ValueError, match="non-empty JSON object"):
        chained(b"[1]", GENESIS)
    assert chained(b'{"a":1}', GENESIS) == b'{"a":1,"prev":"' + GENESIS.encode() + b'"}'


@pytest.mark.parametrize(
    "moment",
    [0.0, 1.0005, 59.999, 1_764_000_000.0, 1_764_000_000.123456, 1_764_003_599.9994],
)
def test_timestamps_are_utc_iso_8601_to_the_millisecond_truncated(moment: float) -> None:
    expected = datetime.datetime.fromtimestamp(math.floor(moment * 1000) / 1000, datetime.UTC)
    assert now_iso(moment) == expected.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_timestamps_of_consecutive_seconds_each_get_their_own_second() -> None:
    assert [now_iso(t) for t in (10.5, 11.25, 10.75)] == [
        "1970-01-01T00:00:10.500Z",
        "1970-01-01T00:00:11.250Z",
        "1970-01-01T00:00:10.750Z",
    ]


# --- where each file stands: file_start records ------------------------------------------------


def legacy_file(path: Path, numbers: range, after: str) -> str:
    """A file as writers before file_start records wrote it: records chained after ``after``;
    the hash of its last line."""
    lines = []
    for number in numbers:
        line = chained(json.dumps({"ts": "t", "event": "tool_call", "n": number}).encode(), after)
        lines.append(line + b"\n")
        after = line_hash(line)
    path.write_bytes(b"".join(lines))
    return after


def test_verify_reports_the_first_lines_cut_from_the_oldest_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 200, max_bytes=2000, keep=2)
    oldest = audit_files(path)[0]
    assert oldest.name == "audit.jsonl.2"
    lines = oldest.read_bytes().splitlines(keepends=True)
    for cut in (1, 4):  # its file_start alone; it and the records after it
        oldest.write_bytes(b"".join(lines[cut:]))
        result = verify(path)
        [problem] = result.problems
        assert problem.startswith(f"{oldest}:1: the first lines of this file were removed")
        assert "the file_start of audit.jsonl.1 names" in problem
        assert not result.intact


def test_files_rotated_away_are_accepted_and_verify_says_how_many(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 300, max_bytes=2000, keep=2)
    files = audit_files(path)
    numbers = [json.loads(file.read_bytes().splitlines()[0])["file"] for file in files]
    assert numbers == [numbers[0], numbers[0] + 1, numbers[0] + 2]  # consecutive, oldest first
    assert numbers[0] > 1  # older files were rotated away
    result = verify(path)
    assert result.intact
    assert result.rotated_away == numbers[0] - 1
    assert result.starts_after is not None
    # Removing the oldest file whole is what the next rotation does: still a trail that stands.
    files[0].unlink()
    result = verify(path)
    assert (result.intact, result.rotated_away) == (True, numbers[1] - 1)


def test_a_trail_that_keeps_no_rotated_file_verifies_after_its_rotations(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 100, max_bytes=2000, keep=0)
    assert audit_files(path) == [path]
    result = verify(path)
    assert result.intact
    assert result.rotated_away is not None
    assert result.rotated_away > 0
    # A head cut from it is still told apart from a rotation.
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[2:]))
    [problem] = verify(path).problems
    assert problem.startswith(f"{path}:1: the first record does not start the chain")


def test_the_file_numbers_go_on_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 50, max_bytes=2000, keep=20)
    write(path, 50, max_bytes=2000, keep=20)
    numbers = [json.loads(f.read_bytes().splitlines()[0])["file"] for f in audit_files(path)]
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(numbers) > 2
    result = verify(path)
    assert (result.intact, result.records, result.starts_after) == (True, 100, None)


def test_a_trail_written_before_file_start_records_verifies_as_it_did(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    rotated_away = line_hash(b"a line of a file rotated away")
    last = legacy_file(tmp_path / "audit.jsonl.1", range(5), rotated_away)
    legacy_file(path, range(5, 10), last)
    result = verify(path)
    assert result.intact
    assert result.starts_after == rotated_away
    # Nothing tells its cut head from a rotation: verify says so rather than failing it.
    assert result.head_unproven == tmp_path / "audit.jsonl.1"
    assert result.rotated_away is None
    # Its current file alone, the first lines cut, fails as it did.
    (tmp_path / "audit.jsonl.1").unlink()
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[2:]))
    [problem] = verify(path).problems
    assert problem.startswith(f"{path}:1: the first record does not start the chain")


def test_a_file_written_before_file_start_records_has_its_head_checked_once_rotated(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    legacy_file(path, range(20), line_hash(b"a line of a file rotated away"))
    write(path, 40, max_bytes=2000, keep=5)  # the old file is rotated: audit.jsonl.N
    oldest = audit_files(path)[0]
    assert json.loads(oldest.read_bytes().splitlines()[0])["n"] == 0
    result = verify(path)
    assert (result.intact, result.head_unproven) == (True, None)
    assert result.starts_after == line_hash(b"a line of a file rotated away")
    # The next file's file_start names its first line: a cut is seen.
    oldest.write_bytes(b"".join(oldest.read_bytes().splitlines(keepends=True)[3:]))
    [problem] = verify(path).problems
    assert problem.startswith(f"{oldest}:1: the first lines of this file were removed")


def test_a_file_start_in_the_trail_is_not_shown_as_a_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 60, max_bytes=2000, keep=5)
    assert [r["n"] for r in read_records(path)] == list(range(60))
    assert verify(path).records == 60
