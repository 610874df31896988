"""What one signed-in user may do (``orchestrator.users``): their mount roots, services, agent
accounts, sessions at once and tool calls a minute. Pure.

The entry that decides is the user's own (keyed by their name), else the first ``group:NAME``
entry, in the suite's order, of a group they are in, else ``default``; a field that entry
leaves out is ``default``'s, else the orchestrator's (its ``allowed_mount_roots``, every
service, every account, only ``max_sessions``, no rate). The holder of the orchestrator's token
(no user: token mode) may do everything, as before users existed.

``{user}`` in a mount root stands for the user's name — a name the identity provider chose,
so untrusted: one that is not a plain path component (a slash, ``.``/``..``, a NUL, control
characters, over 128 characters) makes each root that names it allow nothing (the user's
mounts are then refused as outside the allowed roots), never a path elsewhere.

An agent service that spends a model account (``config.account``) the user may not spend is
not among their services: the account is the agent's, and using it spends it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..config.structs import Orchestrator, Service, UserEntry
from .principal import Principal

DEFAULT_ENTRY = "default"
GROUP_PREFIX = "group:"
USER_PLACEHOLDER = "{user}"
# A user's name as one path component: what {user} may become.
_PATH_SAFE_NAME = re.compile(r"[A-Za-z0-9_@+=,~-][A-Za-z0-9._@+=,~-]{0,127}")


@dataclass(frozen=True)
class Allowance:
    """What a principal may do; ``services`` and ``max_sessions`` None: no limit of their own.
    ``entry``: the ``orchestrator.users`` key that decided (empty: none did)."""

    mount_roots: tuple[str, ...]
    services: frozenset[str] | None = None
    max_sessions: int | None = None
    calls_per_minute: int | None = None
    entry: str = ""

    def may_use(self, service: str) -> bool:
        return self.services is None or service in self.services


def allowance_for(
    orchestrator: Orchestrator, services: Mapping[str, Service], principal: Principal
) -> Allowance:
    """What ``principal`` may do on an orchestrator configured so (see module docs)."""
    roots = tuple(orchestrator.allowed_mount_roots)
    user = principal.user
    if user is None:
        return Allowance(roots)
    users = orchestrator.users
    key = _entry_key(users, user, principal.groups)
    entry = users.get(key, UserEntry())
    default = users.get(DEFAULT_ENTRY, UserEntry())

    def chosen(field: str) -> object:
        value = getattr(entry, field)
        return value if value is not None else getattr(default, field)

    listed_roots = chosen("allowed_mount_roots")
    if isinstance(listed_roots, list):
        expanded = (_expanded(root, user) for root in listed_roots)
        roots = tuple(root for root in expanded if root is not None)
    allowed: frozenset[str] | None = None
    listed_services = chosen("services")
    if isinstance(listed_services, list):
        allowed = frozenset(name for name in listed_services if name in services)
    accounts = chosen("accounts")
    if isinstance(accounts, list):
        spending = {
            name
            for name, service in services.items()
            if service.account is not None and service.account not in accounts
        }
        allowed = (allowed if allowed is not None else frozenset(services)) - spending
    max_sessions, rate = chosen("max_sessions"), chosen("calls_per_minute")
    return Allowance(
        roots,
        allowed,
        max_sessions if isinstance(max_sessions, int) else None,
        rate if isinstance(rate, int) else None,
        key if key in users else "",
    )


def _entry_key(users: Mapping[str, UserEntry], user: str, groups: tuple[str, ...]) -> str:
    if user in users and user != DEFAULT_ENTRY and not user.startswith(GROUP_PREFIX):
        return user
    member = set(groups)
    for key in users:
        if key.startswith(GROUP_PREFIX) and key[len(GROUP_PREFIX) :] in member:
            return key
    return DEFAULT_ENTRY


def _expanded(root: str, user: str) -> str | None:
    """``root`` with ``{user}`` made the user's name; None when the name cannot be a path
    component (the root then allows nothing)."""
    if USER_PLACEHOLDER not in root:
        return root
    if _PATH_SAFE_NAME.fullmatch(user) is None or user in (".", ".."):
        return None
    return root.replace(USER_PLACEHOLDER, user)
