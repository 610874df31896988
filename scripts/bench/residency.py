"""How long each relayed message stays in the orchestrator, read from the kernel's syscall
tracepoints: the orchestrator's own share of a round trip, apart from the client's, the
engine's and the rest of the machine's.

End-to-end round trips on a two-core machine mix the orchestrator's cost with everything else
that runs (a refill's ``runc``, the client, ``dockerd``), and two runs differ by more than a
change is worth; an instruction count misses the syscalls and the scheduler. This records, with
``perf record -e raw_syscalls:sys_enter,raw_syscalls:sys_exit``, every syscall of the
orchestrator's event-loop thread (its process id) while one session is driven one call at a
time, and takes from it, per message:

``request``  the client's frame read (``recvfrom`` on the client's TCP socket returns) → the
             line written on (``sendto`` on the container's stream begins);
``answer``   the container's line read (``recvfrom`` on its stream returns) → the frame written
             to the client (``sendto`` on the client's socket begins).

What falls between is the orchestrator's: its Python, its scheduler turns and the syscalls it
makes on the way (``epoll_ctl``, ``epoll_wait``), and any time the kernel gave its CPU to
someone else meanwhile (which is what a refill could add). perf's tracepoints cost about a
microsecond per syscall; the client's socket is told apart from the container's by being TCP.

Needs ``perf`` (Debian: ``apt-get install linux-perf``) and root, or a
``kernel.perf_event_paranoid`` that allows tracepoints; without them the figure says why it
is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trio

from .stats import Json, percentile, spread

PERF_START_BOUND = 10.0
PERF_STOP_BOUND = 30.0
SYS_SENDTO, SYS_RECVFROM, SYS_FUTEX = 44, 45, 202
# futex operations that wait (FUTEX_WAIT, FUTEX_WAIT_BITSET; the private flag masked off): the
# event loop's thread blocked on a lock another thread of the process holds — the interpreter's
# (the GIL) or one of ours.
FUTEX_WAITS = frozenset({0, 9})
FUTEX_CMD_MASK = 0x7F

_LINE = re.compile(
    r"^\s*(?P<tid>\d+)\s+(?P<time>[\d.]+):\s+raw_syscalls:sys_(?P<kind>enter|exit):"
    r"\s+NR (?P<nr>\d+)(?: \((?P<fd>[0-9a-f]+), (?P<arg2>[0-9a-f]+)?| = (?P<ret>-?\d+))?"
)

Event = tuple[str, int, float, int | None, int | None]


def unavailable() -> str | None:
    """Why syscalls cannot be traced here (None: they can)."""
    if shutil.which("perf") is None:
        return "perf is not installed (apt-get install linux-perf)"
    try:
        probe = subprocess.run(
            ["perf", "record", "-q", "-e", "raw_syscalls:sys_enter", "-o", os.devnull, "true"],
            capture_output=True,
            check=False,
            timeout=PERF_START_BOUND,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf cannot trace syscalls here: {exc}"
    if probe.returncode != 0:
        return "perf cannot trace syscalls here: " + probe.stderr.decode(errors="replace")[:200]
    return None


@dataclass
class Trace:
    """The syscalls of one recording, and where they came from."""

    pid: int
    path: Path
    # fd → socket inode of the orchestrator's sockets, read while the session is still open.
    sockets: dict[int, int] = field(default_factory=dict)
    figures: Json = field(default_factory=dict)  # residency(), once the recording ended

    def note_sockets(self) -> None:
        """Which of the orchestrator's fds are which sockets (call before they close)."""
        base = Path(f"/proc/{self.pid}/fd")
        for entry in base.iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(entry)
                if target.startswith("socket:["):
                    self.sockets[int(entry.name)] = int(target[8:-1])

    def residency(self) -> Json:
        """``{request_us, answer_us}``, each ``{n, p50, p90, p99, max}`` in microseconds, of
        the busiest session's messages (others opened meanwhile, e.g. to take pooled
        containers, are left out)."""
        tcp = _tcp_inodes()
        clients = {fd for fd, inode in self.sockets.items() if inode in tcp}
        hops = list(_hops(self._events()))
        inward = Counter((r, w) for r, w, _, _ in hops if r in clients and w not in clients)
        if not inward:
            return {"request_us": _figures([], 0), "answer_us": _figures([], 0)}
        (client, container), _ = inward.most_common(1)[0]
        out: Json = {}
        for path, way in (("request_us", (client, container)), ("answer_us", (container, client))):
            mine = [(us, waited) for r, w, us, waited in hops if (r, w) == way]
            out[path] = _figures([us for us, _ in mine], sum(waited for _, waited in mine))
        return out

    def _events(self) -> Iterator[Event]:
        """(enter or exit, syscall number, µs, the fd (first argument) it was called with at
        enter / what it returned at exit, its second argument at enter) of the event loop's
        thread."""
        script = subprocess.run(
            ["perf", "script", "-i", str(self.path), "-F", "tid,time,event,trace", "--ns"],
            capture_output=True,
            check=True,
            timeout=300,
        )
        for line in script.stdout.decode(errors="replace").splitlines():
            match = _LINE.match(line)
            if match is None or int(match["tid"]) != self.pid:
                continue  # only the event loop's thread (its tid is the process id)
            if match["fd"] is not None:
                value: int | None = int(match["fd"], 16)
            else:
                value = int(match["ret"]) if match["ret"] is not None else None
            second = int(match["arg2"], 16) if match["arg2"] is not None else None
            yield match["kind"], int(match["nr"]), float(match["time"]) * 1e6, value, second


def _hops(events: Iterator[Event]) -> Iterator[tuple[int, int, float, bool]]:
    """(fd read, fd written, µs between, whether the thread waited on a lock between): each
    read that returned bytes, to the next write begun, when no other read returned bytes
    between (a read that found nothing, EAGAIN, is not where a message arrived)."""
    read_fd: int | None = None  # the fd of the read in progress
    last_read: tuple[int, float] | None = None
    waited = False
    for kind, number, micros, value, second in events:
        if kind == "enter":
            if number == SYS_RECVFROM:
                read_fd = value
            elif number == SYS_SENDTO and value is not None and last_read is not None:
                yield last_read[0], value, micros - last_read[1], waited
                last_read = None
            elif number == SYS_FUTEX and second is not None:
                waited = waited or (second & FUTEX_CMD_MASK) in FUTEX_WAITS
        elif number == SYS_RECVFROM and read_fd is not None and (value or 0) > 0:
            last_read, waited = (read_fd, micros), False


def _tcp_inodes() -> set[int]:
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                columns = row.split()
                if len(columns) > 9:
                    inodes.add(int(columns[9]))
    return inodes


def _figures(micros: list[float], lock_waits: int) -> Json:
    """Percentiles of the messages' residency, and ``lock_waits``: how many of them waited
    on a lock (a futex) between their read and their write."""
    if not micros:
        return {"error": "no message seen"}
    ordered = sorted(micros)
    return {
        "n": len(ordered),
        "lock_waits": lock_waits,
        "p50": round(percentile(ordered, 0.50), 1),
        "p90": round(percentile(ordered, 0.90), 1),
        "p99": round(percentile(ordered, 0.99), 1),
        "max": round(ordered[-1], 1),
    }


@contextlib.asynccontextmanager
async def traced(pid: int) -> AsyncIterator[Trace]:
    """Record ``pid``'s syscalls while the body runs (with the session already open: its
    sockets are looked up as the body ends); the figures are in ``trace.figures`` after it."""
    directory = Path(tempfile.mkdtemp(prefix="bench-residency-"))
    trace = Trace(pid, directory / "perf.data")
    try:
        perf = await trio.lowlevel.open_process(
            ["perf", "record", "-q", "-e", "raw_syscalls:sys_enter,raw_syscalls:sys_exit",
             "-p", str(pid), "-o", str(trace.path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            with trio.fail_after(PERF_START_BOUND):
                while not (trace.path.exists() and trace.path.stat().st_size > 0):
                    if perf.poll() is not None:
                        raise RuntimeError(f"perf record ended at once ({perf.returncode})")
                    await trio.sleep(0.05)
            await trio.sleep(0.2)  # attached to every thread
            yield trace
            trace.note_sockets()
        finally:
            with trio.move_on_after(PERF_STOP_BOUND) as stopping, trio.CancelScope(shield=True):
                if perf.poll() is None:
                    perf.send_signal(signal.SIGINT)
                await perf.wait()
            if stopping.cancelled_caught:
                perf.kill()
        try:
            trace.figures = await trio.to_thread.run_sync(trace.residency)
        except (subprocess.SubprocessError, OSError) as exc:
            # A recording perf could not read back (seen once: `perf script` exiting 255) loses
            # this figure, not the run.
            detail = getattr(exc, "stderr", b"") or b""
            trace.figures = {
                "error": f"{type(exc).__name__}: {exc} {detail.decode(errors='replace')}"[:300]
            }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def summary(per_repeat: list[dict[str, Json]]) -> Json:
    """Per key (a system or a phase): the median and spread over repeats of each path's P50
    and P99, and the repeats themselves."""
    keys = sorted({key for figures in per_repeat for key in figures})
    out: Json = {}
    for key in keys:
        out[key] = {
            f"{path}_{quantile}_us": spread(
                [figures.get(key, {}).get(f"{path}_us", {}).get(quantile) for figures in per_repeat]
            )
            for path in ("request", "answer")
            for quantile in ("p50", "p99")
        }
        for path in ("request", "answer"):
            out[key][f"{path}_lock_waits"] = spread(
                [
                    figures.get(key, {}).get(f"{path}_us", {}).get("lock_waits")
                    for figures in per_repeat
                ]
            )
    out["per_repeat"] = per_repeat
    return out


def differences(per_repeat: list[dict[str, Json]], *, minus: str, of: str) -> Json:
    """Per path and quantile, the spread over repeats of ``of`` minus ``minus`` (µs)."""
    out: Json = {}
    for path in ("request", "answer"):
        for quantile in ("p50", "p99"):
            values: list[float | None] = []
            for figures in per_repeat:
                a = figures.get(of, {}).get(f"{path}_us", {}).get(quantile)
                b = figures.get(minus, {}).get(f"{path}_us", {}).get(quantile)
                values.append(None if a is None or b is None else round(a - b, 1))
            out[f"{path}_{quantile}_us"] = spread(values)
    return out
