"""The mounts part: the session's directories, as the mount policy validated them (and their
Git directories' read-only guards), or a pooled container's staging binds.

Which mounts a session may have, and their pins, are decided before the spec
(:mod:`reactor_fabric.policy.mounts`, :mod:`reactor_fabric.policy.pinning`,
:mod:`reactor_fabric.policy.git_guard`): this part carries them into the container.
"""

from __future__ import annotations

from ...config.structs import Service
from ..mount_spec import MountSpec
from .context import SpecContext


def mounts(service: Service, context: SpecContext) -> tuple[MountSpec, ...]:
    """The context's mounts, in order (the runtime binds them so)."""
    return context.mounts
