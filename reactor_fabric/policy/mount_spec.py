"""A validated bind mount, as every layer passes it on (a leaf: it imports nothing).

Made by :class:`~reactor_fabric.policy.mounts.MountPolicy`, pinned by :mod:`.pinning`, put into
a :class:`~reactor_fabric.policy.container_spec.ContainerSpec` and mounted by the runtimes. Its
own module so that none of those depends on another to name it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MountSpec:
    """A bind mount that already passed validation: source is resolved and allowed."""

    source: str
    target: str
    read_only: bool = False
    # The target is allowed only as the source's own path (not under allowed_mount_targets):
    # the runtime refuses it if the image has anything there, which the mount would hide.
    check_in_image: bool = False
    # A plain bind's propagation ("rslave": mounts made below the source later appear in the
    # container; the warm pool's staging binds). None: the engine's default (private).
    propagation: str | None = None
    # A read-only bind of a writable mount's own Git directory over itself (target: the other
    # mount's target + "/.git"; see policy/git_guard.py): it rides on that mount.
    git_guard: bool = False
