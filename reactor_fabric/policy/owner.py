"""Is the orchestrator that created a container still alive? (crash recovery)

Containers carry their owner's host name, PID and process start time (see
:mod:`.container_spec`). On the same host, the owner is alive only if a process with that PID
exists *and* started at that time, so a reused PID is not mistaken for the owner. Containers
owned from another host (a shared remote engine) cannot be judged and are left alone.
"""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Callable
from pathlib import Path

from .container_parts.ownership import LABEL_OWNER_HOST, LABEL_OWNER_PID, LABEL_OWNER_START


def process_start_time(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), or None if it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after it.
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def owner_is_gone(
    labels: dict[str, str],
    *,
    this_host: str,
    start_time_of: Callable[[int], str | None] = process_start_time,
) -> bool:
    """True only when we can tell for sure that the owning process no longer exists."""
    if labels.get(LABEL_OWNER_HOST) != this_host:
        return False
    try:
        pid = int(labels.get(LABEL_OWNER_PID, ""))
    except ValueError:
        return False
    started = start_time_of(pid)
    return started is None or started != labels.get(LABEL_OWNER_START)


@functools.cache
def hostname() -> str:
    """This machine's name, as stamped on the containers an orchestrator here starts."""
    return socket.gethostname()


def read_owner_file(path: str) -> dict[str, str] | None:
    """The owner record an area keeps (``owner.json``), or None: missing, unreadable or not
    a record (an area being made, or not an area)."""
    try:
        with open(path, encoding="utf-8") as file:
            owner = json.load(file)
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None
