"""Which user a session's MCP server runs as.

A server runs as an ordinary user, never as root: a server that escaped its container, or that
writes into the user's project, does so with a user's rights, not the host's. Which user:

- **The suite says** (``user:`` of a service): as given, the image decides the rest.
- **No mount:** :data:`UNPRIVILEGED` (65534, "nobody"): the server sees no host file, so it
  needs nobody's rights.
- **The orchestrator runs as a user** (the usual set-up: a member of the ``docker`` group): that
  user. A session acts for whoever holds the orchestrator's token, which is that user, so the
  server gets exactly that user's access to the mounted files — never more (a mounted directory
  of another user stays as closed to the server as it is to the user), and files it writes
  belong to the user. It is also the only account whose container the orchestrator may inspect
  through ``/proc/PID/root`` to verify its mounts (same uid *and* gid, see :mod:`.pinning`).
- **The orchestrator runs as root** (a system service): the owner of the session's first mount
  source, so that files the server writes into the project belong to the project's owner; a
  source owned by root gives :data:`UNPRIVILEGED` instead — root-owned files stay read-only.

Everything here is pure; looking a name up (:func:`account_named`) may block (NSS), so callers
run it in a worker thread.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

ROOT = 0


@dataclass(frozen=True)
class Account:
    """A numeric user and group, with the name the server sees in ``USER`` / ``LOGNAME``."""

    uid: int
    gid: int
    name: str

    @property
    def docker_user(self) -> str:
        # Numeric on purpose: the image's /etc/passwd need not know the user.
        return f"{self.uid}:{self.gid}"


UNPRIVILEGED = Account(65534, 65534, "nobody")


def server_ids(
    *, first_mount_owner: tuple[int, int] | None, orchestrator: tuple[int, int]
) -> tuple[int, int]:
    """The (uid, gid) a server runs as when the suite does not say (see the module's rules)."""
    if first_mount_owner is None:
        return UNPRIVILEGED.uid, UNPRIVILEGED.gid
    if orchestrator[0] != ROOT:
        return orchestrator
    uid, gid = first_mount_owner
    if uid == ROOT:
        return UNPRIVILEGED.uid, UNPRIVILEGED.gid
    # A user's file in root's group (unusual) must not make the server a member of it.
    return uid, gid if gid != ROOT else UNPRIVILEGED.gid


def account_named(uid: int, gid: int) -> Account:
    """The account for ``uid:gid``, named after the host's user of that uid when there is one.

    The name only fills ``USER`` / ``LOGNAME`` in the container (git and Python's ``getpass``
    ask for it, and fail when ``/etc/passwd`` in the image does not know the uid). Blocking.
    """
    if (uid, gid) == (UNPRIVILEGED.uid, UNPRIVILEGED.gid):
        return UNPRIVILEGED
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"user{uid}"
    return Account(uid, gid, name)


def orchestrator_ids() -> tuple[int, int]:
    """This process's own (uid, gid): the real ones, which also decide what it may open."""
    return os.getuid(), os.getgid()
