"""No container writes the user's ``.git``: the project's Git directory bound read-only over
itself.

Why: a ``.git`` is code the user runs. A hook (``.git/hooks/post-checkout``), a config key
(``core.fsmonitor``, ``core.hooksPath``, an alias, a filter in ``.git/info/attributes``) written
by a container runs on the host, as the user, the next time they use git in the project — an
escape from the container that no sandbox of the container's own can stop. So whenever a
session's mount is writable, its ``.git`` (a directory, or the file a worktree or submodule has)
is bound read-only over itself in the container: the server reads the history, status and diff
it needs, and cannot write, rename or remove the Git directory (a mount point cannot be
renamed or removed either).

Who may write it (:func:`guards_git`): only a service whose suite entry says
``security.git_writable: true`` (the bundled ``git`` service commits) — and never an agent
(``service_type: llm_agent``, refused by validation too) nor any container of an agent's child
session, whatever its service says: an agent is steered by the text it reads.

What cannot be guarded is refused (``git_dir_unguardable``) rather than served writable: a
``.git`` that is a symlink (a container could replace it with a directory of its own), and a
mount whose source is inside a Git directory or is one (a path with a ``.git`` component, a
bare repository). The rest is plain files the container may write as before — including a new
``.git`` in a directory that has none (docs/USAGE.md says what that means).

Pure; the pins are made by :func:`reactor_fabric.policy.pinning.pin_git_guards`.
"""

from __future__ import annotations

from ..config.structs import Service
from .mount_spec import MountSpec

GIT_DIR = ".git"


def guards_git(service: Service, *, child_session: bool) -> bool:
    """Whether a container of ``service`` gets the project's ``.git`` read-only: always, unless
    the suite lets the service write it and the container is neither an agent's nor started
    for an agent's child session."""
    if child_session or service.service_type == "llm_agent":
        return True
    return not service.security.git_writable


def guard_target(mount: MountSpec) -> str:
    """Where the read-only Git directory of ``mount`` goes in the container."""
    return mount.target.rstrip("/") + "/" + GIT_DIR


def needs_guard(mount: MountSpec, mounts: tuple[MountSpec, ...]) -> bool:
    """Whether ``mount`` (one of a session's ``mounts``) gets its ``.git`` guarded: it is
    writable, and no other mount of the session is already at its ``.git``."""
    if mount.read_only or mount.git_guard:
        return False
    target = guard_target(mount)
    return not any(other.target == target for other in mounts)


def inside_git_dir(source: str) -> bool:
    """Whether the (resolved) ``source`` is a Git directory's or below one, by its path."""
    return GIT_DIR in source.split("/")
