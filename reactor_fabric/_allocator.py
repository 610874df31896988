"""The C allocator's settings for a long-running orchestrator: memory freed goes back to the
system instead of staying in the process for ever.

Why: Python hands every block over 512 bytes to the C library's ``malloc``. glibc's defaults
suit short programs and hurt a relay that sometimes carries large messages and runs its
engine calls in worker threads:

- *the dynamic mmap threshold*: a block of 128 KiB or more is mapped on its own and unmapped
  when freed, but freeing one raises the threshold to that block's size (up to 32 MiB), and
  the trim threshold to twice that. After the first 1 MiB tool result, such blocks come from
  the heap and stay there when freed: measured, an orchestrator that relayed a few 1 MiB
  messages stayed 70 MB above its idle size for good (docs/BENCHMARKS.md, "Where the memory
  goes"). Setting the thresholds explicitly turns the adjustment off: a large message's
  buffers are unmapped when it is done with, and the heap's free top is returned past
  :data:`TRIM_THRESHOLD`.
- *one arena per thread* (up to eight per core): every worker thread that ever ran an engine
  call keeps its own heap with whatever was freed in it. Two arenas are enough for threads
  that mostly wait on a socket.

:func:`release_free_memory` (``malloc_trim``) gives back what is free inside the heaps too,
after a large, one-off allocation such as the tokenizer's tables
(:mod:`reactor_fabric.discovery.tokens`).

Resource handling: none; a few library calls, once at start (and on each release).

Error handling: nothing here raises. Where the C library is not glibc (musl, macOS) or cannot
be loaded, the settings are left as they are and :func:`tune` says so; the orchestrator works
the same, with a larger resident size.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass
from typing import Final

# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8

# glibc's own initial threshold: blocks this large are mapped apart and unmapped on free.
MMAP_THRESHOLD: Final = 128 * 1024
# The free top of the heap beyond this is returned at once.
TRIM_THRESHOLD: Final = 256 * 1024
ARENA_MAX: Final = 2


@dataclass(frozen=True)
class Tuning:
    """What :func:`tune` did: ``tuned`` with glibc, else the reason it did nothing."""

    tuned: bool
    reason: str = ""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    # mallopt and malloc_trim are glibc's; musl has neither (and does not need them).
    if not all(hasattr(libc, symbol) for symbol in ("mallopt", "malloc_trim")):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def tune() -> Tuning:
    """Fix the allocator's thresholds and arena count (see the module). Call it first, before
    threads are made: an arena is chosen when a thread first allocates."""
    libc = _glibc()
    if libc is None:
        return Tuning(False, "the C library is not glibc")
    settings = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (M_ARENA_MAX, ARENA_MAX),
    )
    refused = [param for param, value in settings if libc.mallopt(param, value) != 1]
    if refused:
        return Tuning(False, f"mallopt refused parameter(s) {refused}")
    return Tuning(True)


def release_free_memory() -> bool:
    """Return the free memory inside the allocator's heaps to the system; whether any was
    (False too where the C library is not glibc). Costs a walk over the heaps: call it after
    a large one-off allocation was freed, not per message."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1
