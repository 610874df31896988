"""What a test can ask about resources this process still holds."""

from __future__ import annotations

import os
from pathlib import Path


def descriptors_of(path: Path) -> list[str]:
    """This process's open descriptors that refer to ``path`` (wherever it was moved since)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
        except OSError:
            continue
    return found
