"""Counting tokens in a child process, so that a serving orchestrator never imports tiktoken.

The tokenizer (:mod:`reactor_fabric.discovery.tokens`) loads its encoding only while a catalog is
indexed and drops it after; in the orchestrator's own process that still leaves tiktoken's
modules and Rust library resident for good (7 MB of an idle orchestrator's 60) and makes the
load peak 38 MB higher. :func:`use` makes the process's tokenizer load it in a child instead:
:class:`CountingProcess` runs our own interpreter, isolated (``-I``: no user site, no
``PYTHON*`` variables), on a fixed program that imports tiktoken alone, reads each definition
as a JSON string on its stdin and writes its count on a line.

Resource handling: the child is started when the tokenizer loads and ended (stdin closed,
killed if it does not exit within 2 s, reaped) when it drops; at most one runs. Every wait on
it is bounded: :data:`CHILD_START_SECONDS` for it to load, :data:`CHILD_SECONDS` per count.
Called from worker threads (counting blocks), under the tokenizer's lock.

Error handling: a child that cannot start makes the tokenizer use its estimate (as a missing
tiktoken does); one that fails or is too slow on a count is ended, and that count and the
rest of the batch are the estimate (the next load starts a new child).
"""

from __future__ import annotations

import contextlib
import json
import selectors
import subprocess
import sys
from collections.abc import Callable

from .discovery.tokens import ENCODING, TOKENIZER, estimate

__all__ = ["CountingProcess", "forget_child", "load_in_child", "use"]

CHILD_START_SECONDS = 30.0
CHILD_SECONDS = 10.0
_LINE_BYTES = 64  # a count, or "ready"
_PROGRAM = f"""
import json, sys
import tiktoken
encoding = tiktoken.get_encoding({ENCODING!r})
sys.stdout.write("ready\\n")
sys.stdout.flush()
for line in sys.stdin:
    count = len(encoding.encode(json.loads(line), disallowed_special=()))
    sys.stdout.write(f"{{count}}\\n")
    sys.stdout.flush()
"""


class CountingProcess:
    """tiktoken's encoding in a child process (see the module)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", _PROGRAM],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._selector = selectors.DefaultSelector()
        assert self._process.stdout is not None
        self._selector.register(self._process.stdout, selectors.EVENT_READ)
        try:
            ready = self._line(CHILD_START_SECONDS)
        except BaseException:
            self.close()
            raise
        if ready != b"ready":
            self.close()
            raise RuntimeError("the counting process did not load its encoding")

    @property
    def pid(self) -> int:
        return self._process.pid

    def _line(self, seconds: float) -> bytes:
        assert self._process.stdout is not None
        if not self._selector.select(seconds):
            raise TimeoutError("the counting process did not answer in time")
        line = self._process.stdout.readline(_LINE_BYTES)
        if not line.endswith(b"\n"):
            raise RuntimeError("the counting process ended")
        return line.strip()

    def count(self, text: str) -> int:
        """The tokens of ``text``; raises if the process failed (it is ended then)."""
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(text).encode() + b"\n")
            self._process.stdin.flush()
            return int(self._line(CHILD_SECONDS))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End it: stdin closed, killed if it does not exit within 2 s, reaped."""
        self._selector.close()
        with contextlib.suppress(OSError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        try:
            self._process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


_children: list[CountingProcess] = []  # the one running, if any


def load_in_child() -> Callable[[str], int]:
    """A counter backed by a new :class:`CountingProcess` (raises if it cannot start); once
    the process failed, it counts with the estimate."""
    process = CountingProcess()
    _children.append(process)

    def count(text: str) -> int:
        if process not in _children:
            return estimate(text)  # it failed before
        try:
            return process.count(text)
        except Exception:  # noqa: BLE001 — a failed count is the estimate's
            _children.remove(process)
            return estimate(text)

    return count


def forget_child() -> None:
    """End the counting process."""
    while _children:
        _children.pop().close()


def use() -> None:
    """The process's tokenizer counts in a child process from now on (see the module)."""
    TOKENIZER.count_with(load_in_child, forget_child)
