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
- **The service has secrets** (and the suite names no ``user``): an account that is the
  secrets' owner's, never one another user of the host holds. Whoever shares a process's uid
  may read its ``/proc/PID/environ`` and, through ``/proc/PID/root``, its
  ``/run/secrets/*`` while it runs: a server running as the project's owner, or as ``nobody``
  (the catalog probe, unmounted sessions, pooled containers), would hand every secret of the
  suite to that account — any daemon running as ``nobody``. So: an orchestrator run as a user
  gives them its own account (the secrets are its user's anyway); a root orchestrator gives
  them :func:`secrets_account`'s, a uid and gid that no account, group or subordinate range
  (``/etc/subuid``, ``/etc/subgid``) of the host holds. Such a server reads the project as
  "others" do and writes only where others may. A suite that names ``user:`` for the service
  chooses its account explicitly (that account can read its secrets).

Everything here is pure; looking a name up (:func:`account_named`) may block (NSS), so callers
run it in a worker thread.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Callable, Iterable
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


# Where the secrets' account is looked for: above the ranges systemd hands out to users, dynamic
# users and containers (up to 0x6FFFFFFF) and below its "foreign" range (0x7FFE0000), in
# 32-bit ids every engine and file system takes.
SECRETS_ID_BASE = 2_000_000_000
SECRETS_ID_TRIES = 1000
SECRETS_ACCOUNT_NAME = "reactor-fabric-secrets"
SUBORDINATE_FILES = ("/etc/subuid", "/etc/subgid")


def free_secrets_id(held: Callable[[int], bool], base: int = SECRETS_ID_BASE) -> int | None:
    """The first id from ``base`` that ``held`` says no account, group or range holds (as a
    uid *and* a gid: one number for both); None when the tries run out. Pure."""
    for candidate in range(base, base + SECRETS_ID_TRIES):
        if not held(candidate):
            return candidate
    return None


def subordinate_ranges(lines: Iterable[str]) -> list[range]:
    """The ranges of ``/etc/subuid``-style lines (``name:first:count``). Pure."""
    found: list[range] = []
    for line in lines:
        fields = line.strip().split(":")
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
            continue
        first = int(fields[1])
        found.append(range(first, first + int(fields[2])))
    return found


def host_holds(candidate: int, ranges: Iterable[range]) -> bool:
    """Whether a host account or group has id ``candidate``, or a subordinate range holds it
    (another user's user namespace could then run as it). Blocking (NSS)."""
    if any(candidate in held for held in ranges):
        return True
    try:
        pwd.getpwuid(candidate)
    except KeyError:
        pass
    else:
        return True
    try:
        grp.getgrgid(candidate)
    except KeyError:
        return False
    return True


def secrets_account() -> Account | None:
    """The account a root orchestrator runs secret-bearing servers as: a uid and gid no
    account, group or subordinate range of this host holds; None if none was found in
    :data:`SECRETS_ID_TRIES` (the caller refuses those services). Blocking (NSS, files)."""
    ranges: list[range] = []
    for path in SUBORDINATE_FILES:
        try:
            with open(path, encoding="utf-8", errors="replace") as lines:
                ranges.extend(subordinate_ranges(lines))
        except OSError:
            continue
    found = free_secrets_id(lambda candidate: host_holds(candidate, ranges))
    return None if found is None else Account(found, found, SECRETS_ACCOUNT_NAME)
