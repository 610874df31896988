"""Words of a task or of a catalog, as the ranking compares them.

``terms("createPullRequest for my repo")`` → ``["creat", "pull", "request", "repositori"]``:

- split on anything that is not a letter or digit, and inside identifiers on ``snake_case``,
  ``kebab-case`` and ``camelCase`` / ``PascalCase`` boundaries (``getHTTPResponse`` → get, http,
  response), so a tool named ``git_create_branch`` meets a task that says "create a branch";
- lower-cased; English stop words and the filler of requests ("please", "can you") dropped;
- a few abbreviations developers type expanded to the words catalogs use (``repo`` →
  repository, ``k8s`` → kubernetes, ``pr`` → pull request);
- stemmed with the Snowball (Porter 2) English stemmer, so "commits", "committed" and
  "committing" meet "commit".

The word lists are generic — the Snowball project's English stop words, and abbreviations
from developer usage — and were written before any evaluation task existed; nothing here is
fitted to the evaluation set (docs/DISCOVERY.md).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
import re
import sys
import types
from typing import Any

# Pieces of identifiers and words: runs of letters or digits, split before an upper-case letter
# that starts a lower-case run (camelCase, HTTPServer → HTTP, Server).
_PIECES = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_WORDS = re.compile(r"[^\W_]+", re.UNICODE)
MAX_TERM = 40  # longer pieces are ids or hashes, not words

# The Snowball English stop word list (snowballstem.org/algorithms/english/stop.txt).
_SNOWBALL_STOP_WORDS = """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his
    himself she her hers herself it its itself they them their theirs themselves what which
    who whom this that these those am is are was were be been being have has had having do
    does did doing would should could ought i'm you're he's she's it's we're they're i've
    you've we've they've i'd you'd he'd she'd we'd they'd i'll you'll he'll she'll we'll
    they'll isn't aren't wasn't weren't hasn't haven't hadn't doesn't don't didn't won't
    wouldn't shan't shouldn't can't cannot couldn't mustn't let's that's who's what's here's
    there's when's where's why's how's a an the and but if or because as until while of at
    by for with about against between into through during before after above below to from
    up down in out on off over under again further then once here there when where why how
    all any both each few more most other some such no nor not only own same so than too
    very
"""
# What people wrap a request in, and letters left by splitting contractions.
_REQUEST_FILLER = """
    please can could would will want need needs let lets help me us i'd like kindly just
    also s t d ll m re ve e g eg ie etc
"""
STOP_WORDS = frozenset(_SNOWBALL_STOP_WORDS.split()) | frozenset(_REQUEST_FILLER.split())

# Abbreviations developers type → the words catalogs spell out (generic usage, not fitted).
ABBREVIATIONS: dict[str, tuple[str, ...]] = {
    "pr": ("pull", "request"),
    "prs": ("pull", "request"),
    "mr": ("merge", "request"),
    "mrs": ("merge", "request"),
    "repo": ("repository",),
    "repos": ("repository",),
    "k8s": ("kubernetes",),
    "db": ("database",),
    "dbs": ("database",),
    "env": ("environment",),
    "envs": ("environment",),
    "dir": ("directory",),
    "dirs": ("directory",),
    "docs": ("documentation",),
    "doc": ("document",),
    "config": ("configuration",),
    "msg": ("message",),
    "msgs": ("message",),
    "auth": ("authentication",),
    "js": ("javascript",),
    "ts": ("typescript",),
    "py": ("python",),
    "img": ("image",),
    "pic": ("image",),
    # Words for what a server keeps, as people ask for it.
    "remember": ("remember", "memory"),
    "remembered": ("remember", "memory"),
    "recall": ("recall", "memory"),
    "memorize": ("memorize", "memory"),
    "vm": ("virtual", "machine"),
    "url": ("url",),
    "urls": ("url",),
    "gh": ("github",),
    "info": ("information",),
    "stats": ("statistics",),
    "admin": ("administration",),
    "app": ("application",),
    "apps": ("application",),
    "calc": ("calculate",),
    "tz": ("timezone",),
    "ml": ("machine", "learning"),
    "llm": ("language", "model"),
}


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    # A snowball stemmer keeps the word it works on in itself, so one shared by two threads
    # mixes their words up (an IndexError inside it: seen when a session indexed the catalog
    # while the start-up did the same in a worker thread). A stemmer per word costs under 1 %
    # of stemming it, and the cache above is thread-safe.
    return str(_english_stemmer()().stemWord(word))


_SNOWBALL_ALIAS = "_reactor_fabric_snowball"


def _english_stemmer() -> Any:
    """snowballstemmer's English stemmer class, loaded alone.

    The package's ``__init__`` imports the stemmers of all its 35 languages (2.5 MB of an
    orchestrator's memory; English alone is 0.1 MB), and importing any of its modules runs it.
    So the package's directory is given a name of our own, as an empty package, and the English
    module and its two helpers are imported from there: the same files, their relative imports
    resolved in that package; ``snowballstemmer`` itself stays unimported (and whole for
    anyone who imports it). On the first word, not at import: indexing comes after the
    orchestrator serves. Threads at once: ``setdefault`` installs one package (atomic under
    the GIL), and Python's import lock makes them wait for one import of the module.
    """
    if _SNOWBALL_ALIAS not in sys.modules:
        spec = importlib.util.find_spec("snowballstemmer")  # (it finds the package, runs nothing)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("snowballstemmer is not installed")
        package = types.ModuleType(_SNOWBALL_ALIAS)
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules.setdefault(_SNOWBALL_ALIAS, package)
    return importlib.import_module(f"{_SNOWBALL_ALIAS}.english_stemmer").EnglishStemmer


def pieces(text: str) -> list[str]:
    """Lower-case words and identifier pieces of ``text``, before stop words and stemming.

    An identifier made of several pieces is kept whole as well (``GitHub`` → github, git, hub;
    ``k8s`` → k8s, k, 8, s), so that naming it exactly is the strongest match."""
    found: list[str] = []
    for word in _WORDS.findall(text):
        lowered = word.lower()
        if lowered in ABBREVIATIONS or lowered in STOP_WORDS or not word.isascii():
            found.append(lowered)
            continue
        parts = _PIECES.findall(word)
        if len(parts) > 1:
            found.append(lowered)
        found.extend(part.lower() for part in parts)
    return found


# Things a task mentions by their form, not by a word: each adds the word catalogs use for it.
_MARKS = (
    (re.compile(r"\b(?:https?://|www\.)\S+|\blocalhost:\d+\S*"), ("url", "web", "page")),
    (re.compile(r"(?<![\w&])#[A-Za-z][\w-]*"), ("channel",)),  # a chat channel: #deploys
    (
        # A path (~/x, ./x, /x/y) or a file name with a common extension (package.json).
        re.compile(
            r"(?:^|\s)(?:~|\.{1,2})?/[\w.-]+"
            r"|\b[\w-]+\.(?:json|ya?ml|toml|ini|cfg|conf|env|md|txt|csv|tsv|log|sql|py|js|"
            r"mjs|ts|tsx|jsx|go|rs|java|rb|php|sh|html|css|xml|pdf|docx?|xlsx?|pptx?|ipynb|"
            r"dump|lock|zip|tar|gz|png|jpe?g|svg)\b"
        ),
        ("file",),
    ),
)


def marks(text: str) -> list[str]:
    """Terms for what ``text`` mentions by its form: a URL (url, web, page), a ``#channel``
    (channel), a path or file name (file)."""
    found: list[str] = []
    for pattern, words in _MARKS:
        if pattern.search(text):
            found.extend(stem(word) for word in words)
            text = pattern.sub(" ", text)  # a URL's parts are not a path too
    return found


# Particles that make compounds with the word before them (checkout, signup, login, setup).
_PARTICLES = frozenset({"up", "out", "in", "off", "down", "on", "over"})


def compounds(text: str) -> list[str]:
    """Adjacent words written together ("check out" → checkout, "sign up" → signup): the
    caller keeps those its catalog knows."""
    words = [
        w
        for w in _WORDS.findall(text.lower())
        if w.isalpha() and (w not in STOP_WORDS or w in _PARTICLES)
    ]
    return [stem(a + b) for a, b in itertools.pairwise(words)]


def query_terms(text: str) -> list[str]:
    """A task's or query's terms: :func:`terms`, plus :func:`marks`, once each."""
    return list(dict.fromkeys([*terms(text), *marks(text)]))


def terms(text: str) -> list[str]:
    """The stemmed, filtered terms of ``text``, in order, repeats kept (see the module)."""
    result: list[str] = []
    for piece in pieces(text):
        if len(piece) > MAX_TERM or piece in STOP_WORDS:
            continue
        result.extend(stem(w) for w in ABBREVIATIONS.get(piece, (piece,)) if len(w) > 1)
    return result
