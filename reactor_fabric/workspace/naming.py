"""What an isolated task's work is called in the client's repository: its branch, its commit
messages, and which ``base`` names a client may give (pure: no I/O).

A ``base`` comes from a client's call, so it is untrusted text that ends up on git's command
line: it must be a plain ref name or object name (letters, digits, ``._/-``), may not begin
with ``-`` (it could be read as an option), and may not use revision syntax (``..``, ``@{``,
``^``, ``~``, ``:``): one branch, tag or commit, nothing computed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

BRANCH_PREFIX = "reactor-fabric"
MAX_BASE_CHARS = 200
_BASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
AUTHOR_NAME = "Reactor-Fabric"
AUTHOR_EMAIL = "reactor-fabric@localhost"
# The task's text in a commit message, at most this many characters (its first line).
MAX_SUBJECT_CHARS = 72
MAX_TASK_CHARS = 2000


def valid_base(text: str) -> bool:
    """Whether ``text`` may name a task's base (see the module's docstring)."""
    if not 0 < len(text) <= MAX_BASE_CHARS or not _BASE.fullmatch(text):
        return False
    if ".." in text or "//" in text or text.endswith(("/", ".", ".lock")):
        return False
    return not any(part.startswith(".") for part in text.split("/"))


def branch_name(service: str, started: float, short_id: str) -> str:
    """``reactor-fabric/<service>/<UTC time>-<short id>``: sortable by time, unique by id."""
    stamp = datetime.fromtimestamp(started, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{BRANCH_PREFIX}/{service}/{stamp}-{short_id}"


@dataclass(frozen=True)
class TaskFacts:
    """What the commit messages say of a task: the service, the task's text, and the
    session, call and trace it ran for (trailers: ``git log --format=%(trailers)`` reads
    them)."""

    service: str
    task: str
    session: str
    call: str
    trace: str


def working_tree_message(facts: TaskFacts) -> bytes:
    return (
        f"Working tree before {facts.service}'s task\n\n"
        "The client's uncommitted changes (tracked and untracked files, ignored ones left out)\n"
        "when the task started: the task's commit on top of this one holds only its own work.\n"
        f"\n{_trailers(facts)}"
    ).encode()


def task_message(facts: TaskFacts) -> bytes:
    text = " ".join(facts.task.split())
    subject = text if len(text) <= MAX_SUBJECT_CHARS else text[: MAX_SUBJECT_CHARS - 1] + "…"
    body = facts.task.strip()
    if len(body) > MAX_TASK_CHARS:
        body = body[:MAX_TASK_CHARS] + "\n[…]"
    return f"{facts.service}: {subject or 'task'}\n\n{body}\n\n{_trailers(facts)}".encode()


def _trailers(facts: TaskFacts) -> str:
    fields = (
        ("Service", facts.service),
        ("Session", facts.session),
        ("Call", facts.call),
        ("Trace", facts.trace),
    )
    return "".join(f"Reactor-Fabric-{key}: {_one_line(value)}\n" for key, value in fields)


def _one_line(value: str) -> str:
    """A trailer's value: one line of printable text (a call's id is the client's)."""
    return "".join(c if c.isprintable() else " " for c in value)[:200].strip() or "-"
