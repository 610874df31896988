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

The same recording has the thread's context switches (``sched:sched_switch`` as it leaves the
CPU, with its state and who came next; perf's switch records for when it is back), so each
message's residency splits into:

``own``            the residency less ``waited for a CPU``: on the CPU (``on_cpu``), or off it
                   for a reason of the orchestrator's own (asleep on a lock, the GIL; a thread
                   of its own given the CPU);
``waited for a CPU``  runnable, but the CPU given to another process (the engine, ``runc``, a
                   container's server): the machine's share, which no change to the
                   orchestrator's code removes (a higher priority, or the short slice it asks
                   for, reactor_fabric/_scheduling.py, shortens it).

And before each message, outside its residency, ``wake``: how long the thread, asleep until
the message came, waited for a CPU once woken (``sched:sched_wakeup``, recorded machine-wide
by a second ``perf``, since a wake-up happens in its waker's context) — the other place a busy
machine adds to a relayed call, once per hop.

Needs ``perf`` (Debian: ``apt-get install linux-perf``) and root, or a
``kernel.perf_event_paranoid`` that allows tracepoints and machine-wide recording; without
them the figure says why it is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
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
from typing import Any

import trio

from .stats import Json, percentile, spread

PERF_START_BOUND = 10.0
PERF_STOP_BOUND = 30.0
PERF_EVENTS = "raw_syscalls:sys_enter,raw_syscalls:sys_exit,sched:sched_switch"
# What the two recordings take (the probe in unavailable() tries the same): the process's
# syscalls and context switches (``-p PID`` added), and the whole machine's wake-ups (a
# wake-up is recorded in its waker's context, another process or the kernel, so not by ``-p``).
THREAD_RECORDING = ("-e", PERF_EVENTS, "--switch-events")
WAKEUP_RECORDING = ("-a", "-e", "sched:sched_wakeup")
SYS_SENDTO, SYS_RECVFROM, SYS_FUTEX = 44, 45, 202
# futex operations that wait (FUTEX_WAIT, FUTEX_WAIT_BITSET; the private flag masked off): the
# event loop's thread blocked on a lock another thread of the process holds — the interpreter's
# (the GIL) or one of ours.
FUTEX_WAITS = frozenset({0, 9})
FUTEX_CMD_MASK = 0x7F

_HEAD = r"^\s*(?P<tid>\d+)\s+(?P<time>[\d.]+):\s+"
_SYSCALL = re.compile(
    _HEAD + r"raw_syscalls:sys_(?P<kind>enter|exit):"
    r"\s+NR (?P<nr>\d+)(?: \((?P<fd>[0-9a-f]+), (?P<arg2>[0-9a-f]+)?| = (?P<ret>-?\d+))?"
)
# A thread leaving its CPU: its state (R: it could have run on, the CPU was taken from it) and
# who got the CPU. A comm may hold spaces, hence the lazy match up to ``next_pid=``.
_SWITCH_OUT = re.compile(
    _HEAD + r"sched:sched_switch:.* prev_state=(?P<state>\S+) ==> "
    r"next_comm=(?P<comm>.*?) next_pid=(?P<next>\d+) "
)
_SWITCH_IN = re.compile(_HEAD + r"PERF_RECORD_SWITCH IN\b")
_WAKEUP = re.compile(_HEAD + r"sched:sched_wakeup: comm=.*? pid=(?P<woken>\d+) prio=")
_ANY = re.compile(_HEAD)


@dataclass(frozen=True, slots=True)
class Syscall:
    """A syscall of the event loop's thread entered or left: the fd (first argument) it was
    called with at enter, what it returned at exit; its second argument at enter."""

    entering: bool
    number: int
    micros: float
    value: int | None
    second: int | None


@dataclass(frozen=True, slots=True)
class SwitchedOut:
    """The event loop's thread left its CPU; ``runnable``: taken from it (it could have run
    on), not given up to sleep."""

    micros: float
    runnable: bool
    next_tid: int
    next_comm: str


@dataclass(frozen=True, slots=True)
class Woken:
    """The event loop's thread was woken (made runnable, not yet on a CPU)."""

    micros: float


@dataclass(frozen=True, slots=True)
class SwitchedIn:
    """The event loop's thread is back on a CPU."""

    micros: float


Event = Syscall | SwitchedOut | Woken | SwitchedIn


@dataclass(frozen=True, slots=True)
class Hop:
    """One message through the event loop's thread: read on ``read_fd``, written on
    ``write_fd``, ``micros`` between. ``cpu_wait``: µs of those it was runnable while a CPU ran
    another process (``preemptors``: their comms); ``lock_wait``: it slept on a lock."""

    read_fd: int
    write_fd: int
    micros: float
    lock_wait: bool = False
    cpu_wait: float = 0.0
    preemptors: tuple[str, ...] = ()
    # Off its CPU for a reason of the orchestrator's own: asleep (a lock), or the CPU given to
    # a thread of its own.
    own_wait: float = 0.0
    # Before the read, not part of ``micros``: from the wake-up of the thread, asleep waiting
    # for something to happen (the message), to its return to a CPU.
    wake_wait: float = 0.0

    @property
    def own(self) -> float:
        """The residency less the time another process had the CPU the thread was ready for."""
        return self.micros - self.cpu_wait

    @property
    def on_cpu(self) -> float:
        """The part of the residency the thread was on a CPU."""
        return self.micros - self.cpu_wait - self.own_wait


def unavailable() -> str | None:
    """Why syscalls cannot be traced here (None: they can)."""
    if shutil.which("perf") is None:
        return "perf is not installed (apt-get install linux-perf)"
    for what in (THREAD_RECORDING, WAKEUP_RECORDING):  # the latter: root, or a low paranoia
        try:
            probe = subprocess.run(
                ["perf", "record", "-q", *what, "-o", os.devnull, "true"],
                capture_output=True,
                check=False,
                timeout=PERF_START_BOUND,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"perf cannot trace syscalls here: {exc}"
        if probe.returncode != 0:
            return "perf cannot trace here: " + probe.stderr.decode(errors="replace")[:200]
    return None


@dataclass
class Trace:
    """The syscalls of one recording, and where they came from."""

    pid: int
    path: Path  # the process's syscalls and context switches
    wakeups: Path  # the machine's wake-ups
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
        """``{request_us, answer_us}``, each :func:`_figures` in microseconds, of the busiest
        session's messages (others opened meanwhile, e.g. to take pooled containers, are left
        out)."""
        script = _script(self.path, "--show-switch-events")
        return messages(script, self.pid, self._client_fds(), _script(self.wakeups))

    def _client_fds(self) -> set[int]:
        tcp = _tcp_inodes()
        return {fd for fd, inode in self.sockets.items() if inode in tcp}


def _script(path: Path, *options: str) -> str:
    done = subprocess.run(
        ["perf", "script", "-i", str(path), "-F", "tid,time,event,trace", "--ns", *options],
        capture_output=True,
        check=True,
        timeout=300,
    )
    return done.stdout.decode(errors="replace")


def messages(script: str, pid: int, clients: set[int], wakeups: str = "") -> Json:
    """The figures of :meth:`Trace.residency` from ``perf script``'s text (``script``) of a
    recording of process ``pid``, whose TCP sockets (its clients') are the fds ``clients``,
    and of the machine's wake-ups meanwhile (``wakeups``)."""
    events, threads = parse(script, pid)
    events = list(heapq.merge(events, woken(wakeups, pid), key=lambda event: event.micros))
    hops = list(_hops(events, threads))
    inward = Counter(
        (h.read_fd, h.write_fd) for h in hops if h.read_fd in clients and h.write_fd not in clients
    )
    if not inward:
        return {"request_us": _figures([]), "answer_us": _figures([])}
    (client, container), _ = inward.most_common(1)[0]
    return {
        path: _figures([h for h in hops if (h.read_fd, h.write_fd) == way])
        for path, way in (("request_us", (client, container)), ("answer_us", (container, client)))
    }


def parse(script: str, pid: int) -> tuple[list[Event], set[int]]:
    """The events of the event loop's thread (its tid is the process id), and every thread of
    the process the recording saw (``perf record -p`` records only those)."""
    events: list[Event] = []
    threads: set[int] = set()
    for line in script.splitlines():
        head = _ANY.match(line)
        if head is None:
            continue
        tid = int(head["tid"])
        threads.add(tid)
        if tid != pid:
            continue
        micros = float(head["time"]) * 1e6
        if (call := _SYSCALL.match(line)) is not None:
            if call["fd"] is not None:
                value: int | None = int(call["fd"], 16)
            else:
                value = int(call["ret"]) if call["ret"] is not None else None
            second = int(call["arg2"], 16) if call["arg2"] is not None else None
            events.append(Syscall(call["kind"] == "enter", int(call["nr"]), micros, value, second))
        elif (out := _SWITCH_OUT.match(line)) is not None:
            runnable = out["state"].startswith("R")
            events.append(SwitchedOut(micros, runnable, int(out["next"]), out["comm"]))
        elif _SWITCH_IN.match(line) is not None:
            events.append(SwitchedIn(micros))
    return events, threads


def woken(script: str, tid: int) -> list[Woken]:
    """The wake-ups of thread ``tid`` in ``perf script``'s text of ``sched:sched_wakeup``."""
    found: list[Woken] = []
    for line in script.splitlines():
        wakeup = _WAKEUP.match(line)
        if wakeup is not None and int(wakeup["woken"]) == tid:
            found.append(Woken(float(wakeup["time"]) * 1e6))
    return found


def _hops(events: list[Event], threads: set[int]) -> Iterator[Hop]:
    """Each read that returned bytes, to the next write begun, when no other read returned
    bytes between (a read that found nothing, EAGAIN, is not where a message arrived); with
    what kept the thread off its CPU meanwhile. A thread cannot make a syscall while off its
    CPU, so every time away that begins after a read has ended before the next write."""
    walk = _Walk(threads)
    for event in events:
        match event:
            case Syscall(entering=True):
                if (hop := walk.entered(event)) is not None:
                    yield hop
            case Syscall(entering=False):
                walk.left_syscall(event)
            case SwitchedOut():
                walk.away(event)
            case Woken():
                walk.woken(event)
            case SwitchedIn():
                walk.back(event)


@dataclass
class _Walk:
    """Where :func:`_hops` is in the event loop thread's events."""

    threads: set[int]  # the process's threads
    read_fd: int | None = None  # the fd of the read in progress
    hop: Hop | None = None  # the message in the thread, its residency not yet known
    left: SwitchedOut | None = None  # the thread's last departure from its CPU, if not back
    woke: float | None = None  # when the thread, asleep, was woken (not yet back on a CPU)
    wake_wait: float = 0.0  # its last wait for a CPU once woken, for the next message

    def entered(self, call: Syscall) -> Hop | None:
        """A syscall begun; the message, if it is the write that ends one."""
        if call.number == SYS_RECVFROM:
            self.read_fd = call.value
        elif call.number == SYS_SENDTO and call.value is not None and self.hop is not None:
            done = dataclasses.replace(
                self.hop, write_fd=call.value, micros=call.micros - self.hop.micros
            )
            self.hop, self.wake_wait = None, 0.0
            return done
        elif (
            call.number == SYS_FUTEX
            and call.second is not None
            and self.hop is not None
            and (call.second & FUTEX_CMD_MASK) in FUTEX_WAITS
        ):
            self.hop = dataclasses.replace(self.hop, lock_wait=True)
        return None

    def left_syscall(self, call: Syscall) -> None:
        if call.number == SYS_RECVFROM and self.read_fd is not None and (call.value or 0) > 0:
            # A message arrived; its ``micros`` is when, until its write.
            self.hop = Hop(self.read_fd, -1, call.micros, wake_wait=self.wake_wait)
            self.wake_wait = 0.0

    def away(self, event: SwitchedOut) -> None:
        """The thread left its CPU."""
        self.left, self.woke = event, None

    def woken(self, event: Woken) -> None:
        """The thread was woken: counted from the first wake-up while it sleeps."""
        if self.left is not None and not self.left.runnable and self.woke is None:
            self.woke = event.micros

    def back(self, event: SwitchedIn) -> None:
        """The thread is on a CPU again."""
        if self.woke is not None:
            self.wake_wait, self.woke = event.micros - self.woke, None
        # Away because another process had the CPU: the machine's share. Asleep (a lock), or
        # the CPU given to a thread of ours: the orchestrator's own.
        left = self.left
        if self.hop is not None and left is not None:
            away = event.micros - left.micros
            if left.runnable and left.next_tid not in self.threads:
                self.hop = dataclasses.replace(
                    self.hop,
                    cpu_wait=self.hop.cpu_wait + away,
                    preemptors=(*self.hop.preemptors, left.next_comm),
                )
            else:
                self.hop = dataclasses.replace(self.hop, own_wait=self.hop.own_wait + away)
        self.left = None


def _tcp_inodes() -> set[int]:
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                columns = row.split()
                if len(columns) > 9:
                    inodes.add(int(columns[9]))
    return inodes


def _figures(hops: list[Hop]) -> Json:
    """Percentiles of the messages' residency, of their ``own`` time and of their time
    ``on_cpu``; ``lock_waits``: how many slept on a lock (a futex) between their read and
    their write; ``cpu_waits``: how many waited for a CPU another process had, ``cpu_wait_us``
    how long in all, and ``preemptors`` who had it (comm → times); ``own_waits``: how many
    were off their CPU for a reason of the orchestrator's own."""
    if not hops:
        return {"error": "no message seen"}
    return {
        "n": len(hops),
        "lock_waits": sum(1 for h in hops if h.lock_wait),
        **_quantiles([h.micros for h in hops]),
        "own": _quantiles([h.own for h in hops]),
        "on_cpu": _quantiles([h.on_cpu for h in hops]),
        "wake": _quantiles([h.wake_wait for h in hops]),
        "cpu_waits": sum(1 for h in hops if h.cpu_wait > 0),
        "own_waits": sum(1 for h in hops if h.own_wait > 0),
        "cpu_wait_us": round(sum(h.cpu_wait for h in hops), 1),
        "preemptors": dict(Counter(c for h in hops for c in h.preemptors).most_common(5)),
    }


def _quantiles(micros: list[float]) -> Json:
    ordered = sorted(micros)
    return {
        "p50": round(percentile(ordered, 0.50), 1),
        "p90": round(percentile(ordered, 0.90), 1),
        "p99": round(percentile(ordered, 0.99), 1),
        "max": round(ordered[-1], 1),
    }


@contextlib.asynccontextmanager
async def traced(pid: int) -> AsyncIterator[Trace]:
    """Record ``pid``'s syscalls and context switches, and every wake-up on the machine, while
    the body runs (with the session already open: its sockets are looked up as the body ends);
    the figures are in ``trace.figures`` after it."""
    directory = Path(tempfile.mkdtemp(prefix="bench-residency-"))
    trace = Trace(pid, directory / "perf.data", directory / "wakeups.data")
    try:
        async with (
            # The machine's wake-ups (the thread's picked out when read) are started first:
            # perf's file is begun before every CPU records, and the next one's settling time
            # covers that.
            _recording(WAKEUP_RECORDING, trace.wakeups, settle=0.0),
            _recording((*THREAD_RECORDING, "-p", str(pid)), trace.path, settle=0.2),
        ):
            yield trace
            trace.note_sockets()
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


@contextlib.asynccontextmanager
async def _recording(what: tuple[str, ...], path: Path, *, settle: float) -> AsyncIterator[None]:
    """``perf record`` of ``what`` into ``path`` while the body runs (started: its file begun,
    then ``settle`` s more, e.g. to attach to every thread); stopped as ``perf`` is, by SIGINT,
    within PERF_STOP_BOUND."""
    perf = await trio.lowlevel.open_process(
        ["perf", "record", "-q", *what, "-o", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(PERF_START_BOUND):
            while not (await trio.Path(path).exists() and (await trio.Path(path).stat()).st_size):
                if perf.poll() is not None:
                    raise RuntimeError(f"perf record ended at once ({perf.returncode})")
                await trio.sleep(0.05)
        await trio.sleep(settle)
        yield
    finally:
        with trio.move_on_after(PERF_STOP_BOUND) as stopping, trio.CancelScope(shield=True):
            if perf.poll() is None:
                perf.send_signal(signal.SIGINT)
            await perf.wait()
        if stopping.cancelled_caught:
            perf.kill()


PATHS = ("request", "answer")
QUANTILES = ("p50", "p99")
# The figures of a path with quantiles: all of the residency (""), its own time, the part of
# it on a CPU, and the wait for a CPU once woken before it (not part of the residency).
PARTS = ("", "own", "on_cpu", "wake")


def _figure(figures: Json, key: str, path: str, name: str, part: str = "") -> Any:
    """``figures[key][path + "_us"]`` (its ``part`` if given)``[name]``, or None."""
    found = figures.get(key, {}).get(f"{path}_us", {})
    return (found.get(part, {}) if part else found).get(name)


def figure_name(path: str, part: str, quantile: str) -> str:
    """``request_p99_us``, ``request_own_p99_us``, ``request_wake_p99_us``…"""
    return "_".join(word for word in (path, part, quantile, "us") if word)


def summary(per_repeat: list[dict[str, Json]]) -> Json:
    """Per key (a system or a phase): the median and spread over repeats of each path's P50
    and P99 (of each of PARTS), how many messages waited on a lock and for a CPU, who had the
    CPU (over all repeats), and the repeats themselves."""
    keys = sorted({key for figures in per_repeat for key in figures})
    out: Json = {}
    for key in keys:
        figures: Json = {}
        for path in PATHS:
            for quantile in QUANTILES:
                for part in PARTS:
                    figures[figure_name(path, part, quantile)] = spread(
                        [_figure(f, key, path, quantile, part) for f in per_repeat]
                    )
            for count in ("lock_waits", "cpu_waits", "own_waits"):
                figures[f"{path}_{count}"] = spread(
                    [_figure(f, key, path, count) for f in per_repeat]
                )
            who: Counter[str] = Counter()
            for f in per_repeat:
                who.update(_figure(f, key, path, "preemptors") or {})
            figures[f"{path}_preemptors"] = dict(who.most_common(5))
        out[key] = figures
    out["per_repeat"] = per_repeat
    return out


def differences(per_repeat: list[dict[str, Json]], *, minus: str, of: str) -> Json:
    """Per path, quantile and part (PARTS): the spread over repeats of ``of`` minus ``minus``
    (µs)."""
    out: Json = {}
    for path in PATHS:
        for quantile in QUANTILES:
            for part in PARTS:
                values: list[float | None] = []
                for figures in per_repeat:
                    a = _figure(figures, of, path, quantile, part)
                    b = _figure(figures, minus, path, quantile, part)
                    values.append(None if a is None or b is None else round(a - b, 1))
                out[figure_name(path, part, quantile)] = spread(values)
    return out
