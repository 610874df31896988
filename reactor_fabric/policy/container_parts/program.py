"""The program part: what runs in the container, as whom, with which environment and config.

Nothing from the orchestrator's environment reaches a container: only the image's own (its
PATH and the like), the suite's ``env``, the service's ``config`` (as JSON in one variable)
and, from their own parts, the egress proxy's, the secrets' and the child session's variables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...config.structs import Service
from ...config.suite import SERVICE_CONFIG_ENV
from .context import SpecContext

SERVER_HOME = "/tmp"  # noqa: S108 - inside the container


@dataclass(frozen=True)
class ProgramPart:
    image: str
    command: list[str] | None
    # When the image is pulled: never, missing, always.
    pull: str
    # The user the server runs as ("uid:gid", or the suite's own `user` as given).
    user: str | None
    # The service's own variables (the other parts add theirs: see ContainerSpec.environment).
    environment: dict[str, str]


def program(service: Service, context: SpecContext) -> ProgramPart:
    """The image and command as the suite gives them; the server runs as the suite's ``user``,
    else as the context's account, which the image does not know: it gets a writable HOME and
    a name (git and Python's getpass ask for one and fail on a uid missing from /etc/passwd),
    which the suite's ``env`` may still override."""
    account = context.account
    environment: dict[str, str] = {}
    if service.user is None:
        environment |= {"HOME": SERVER_HOME, "USER": account.name, "LOGNAME": account.name}
    environment |= service.env
    environment[SERVICE_CONFIG_ENV] = json.dumps(service.config, separators=(",", ":"))
    return ProgramPart(
        image=service.image,
        command=list(service.command) if service.command is not None else None,
        pull=service.pull,
        user=service.user if service.user is not None else account.docker_user,
        environment=environment,
    )
