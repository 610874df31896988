"""A short CPU slice for the orchestrator's threads: a relayed message gets a CPU soon after
it arrives, even while the engine keeps the host's cores busy starting containers.

Why: the event loop sleeps until a message arrives, then needs a CPU for about 60 µs to pass
it on. On a host with few cores, while containers start (the warm pool's refills, fresh
sessions), ``dockerd``, ``containerd``, ``runc`` and the starting servers hold the CPUs, and
the woken event loop waited up to milliseconds for one: measured on two cores, the P99 of
that wait on the request's way grew from 0.04 to 0.08 ms when quiet to 1.8 to 3.3 ms while
containers started (docs/BENCHMARKS.md, "Where a refill's cost to a live session goes"); with
the short slice, its P50 fell by a third and its quiet P99 by half.

Linux's fair scheduler (EEVDF) since 6.12 lets a thread choose a shorter slice
(``sched_attr.sched_runtime`` with ``SCHED_OTHER``), and a woken thread whose slice is
shorter than the running one's takes the CPU at once ("wakeup preemption"). That is the
latency a relay wants, and it needs no privilege: the thread's weight (its share of the CPU
over time) is unchanged, only how that share is cut up. A thread made later inherits the
slice; the orchestrator asks for it for the threads it already has too (a library may
start one on import): every thread of it has the slice.

Resource handling: none; two or three syscalls per thread, once at start.

Error handling: nothing here raises. On another OS or architecture, on a kernel before 6.12
(which accepts the call and keeps its own slice), or where a security policy refuses it, the
thread keeps the kernel's slice and :func:`shorten_slice` says why.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Final

# The shortest the kernel accepts (it clamps to 0.1 to 100 ms); the default is 0.7 ms times
# 1 + log2(CPUs), 1.4 ms on two cores.
SHORT_SLICE_NS: Final = 100_000

# sched_setattr / sched_getattr per machine (asm/unistd_64.h, asm-generic/unistd.h).
_SYSCALLS: Final = {"x86_64": (314, 315), "aarch64": (274, 275)}
# struct sched_attr, SCHED_ATTR_SIZE_VER0: size, policy, flags, nice, priority, runtime,
# deadline, period.
_SCHED_ATTR: Final = struct.Struct("=IIQiIQQQ")
_SCHED_OTHER: Final = 0


@dataclass(frozen=True)
class Slice:
    """The calling thread's slice after :func:`shorten_slice`: ``ns`` as the kernel reports
    it (None: unknown), ``shortened`` whether it is now the short one, ``reason`` why not;
    ``threads``: how many of the process's threads have it now."""

    ns: int | None
    shortened: bool
    reason: str = ""
    threads: int = 0


def shorten_slice(slice_ns: int = SHORT_SLICE_NS, *, whole_process: bool = False) -> Slice:
    """Ask for a slice of ``slice_ns`` for the calling thread (and the threads it makes
    later), keeping its policy (``SCHED_OTHER`` only) and nice value; read back what the
    kernel now applies. ``whole_process``: for every other thread of the process too (those
    a library started on import, such as a BLAS library's workers), each keeping its own nice
    value; one that refuses, or has ended meanwhile, is left as it is."""
    try:
        kernel = _Kernel.here()
        applied = kernel.set(slice_ns)
    except _Refused as refused:
        return Slice(refused.ns, False, refused.reason)
    except (OSError, AttributeError) as exc:  # no libc to load, no syscall()
        return Slice(None, False, f"cannot call the kernel: {exc}")
    if applied != slice_ns:
        # A kernel before 6.12 takes the call and ignores the runtime of a normal thread.
        return Slice(applied, False, "the kernel keeps its own slice (Linux before 6.12)")
    threads = 1
    if whole_process:
        me = threading.get_native_id()
        for tid in _threads_of_this_process():
            if tid != me:
                with contextlib.suppress(_Refused, OSError):
                    if kernel.set(slice_ns, tid) == slice_ns:
                        threads += 1
    return Slice(applied, True, threads=threads)


def _threads_of_this_process() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread only
        return []


def thread_slice(tid: int = 0) -> int | None:
    """The slice (ns) the kernel applies to thread ``tid`` (0: the calling one); None where it
    cannot say (another OS, a kernel before 6.12: 0 there, which is no slice)."""
    try:
        runtime = _Kernel.here().get(tid)[1]
    except (_Refused, OSError, AttributeError):
        return None
    return runtime or None


class _Refused(Exception):
    def __init__(self, reason: str, ns: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.ns = reason, ns


@dataclass(frozen=True)
class _Kernel:
    """The two syscalls, on this machine."""

    libc: ctypes.CDLL
    set_number: int  # sched_setattr
    get_number: int  # sched_getattr

    @classmethod
    def here(cls) -> _Kernel:
        """Raises _Refused on another OS or machine; OSError without a libc to load."""
        numbers = _SYSCALLS.get(platform.machine())
        if not sys.platform.startswith("linux") or numbers is None:
            raise _Refused(f"not supported on {sys.platform} {platform.machine()}")
        return cls(ctypes.CDLL(None, use_errno=True), *numbers)

    def set(self, slice_ns: int, tid: int = 0) -> int:
        """Set thread ``tid``'s slice (0: the calling thread's), keeping its policy (normal
        only) and nice value; the slice the kernel reports after."""
        policy, runtime = self.get(tid)
        if policy != _SCHED_OTHER:
            raise _Refused(f"the thread's scheduling policy is {policy}, not normal", runtime)
        nice = os.getpriority(os.PRIO_PROCESS, tid)  # the thread's own, kept
        attr = _SCHED_ATTR.pack(_SCHED_ATTR.size, _SCHED_OTHER, 0, nice, 0, slice_ns, 0, 0)
        buffer = ctypes.create_string_buffer(attr, _SCHED_ATTR.size)
        if self.libc.syscall(self.set_number, tid, buffer, 0) != 0:
            raise _Refused(f"sched_setattr: {os.strerror(ctypes.get_errno())}", runtime)
        return self.get(tid)[1]

    def get(self, tid: int = 0) -> tuple[int, int]:
        """(policy, runtime: the slice in ns on Linux 6.12 and later, else 0) of thread
        ``tid`` (0: the calling one)."""
        buffer = ctypes.create_string_buffer(_SCHED_ATTR.size)
        if self.libc.syscall(self.get_number, tid, buffer, _SCHED_ATTR.size, 0) != 0:
            raise _Refused(f"sched_getattr: {os.strerror(ctypes.get_errno())}")
        _size, policy, _flags, _nice, _priority, runtime, _deadline, _period = _SCHED_ATTR.unpack(
            buffer.raw
        )
        return policy, runtime
