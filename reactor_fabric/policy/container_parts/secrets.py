"""The secrets part: a service's secrets, as variables, files at /run/secrets, or both; and
who a server with secrets runs as.

Refused before anything is made (-32002): a service whose secrets could not be resolved
(``secret_unavailable``, or ``account_unavailable`` for an agent naming an account the suite
does not define), rather than a server started without its credentials; one with file secrets
on a runtime that cannot deliver files (``secret_unavailable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..._reasons import SECRET_UNAVAILABLE
from ...config.secrets import Secret, ServiceSecrets
from ...config.structs import Service
from ..accounts import Account
from .context import SpecContext, SpecRefusal
from .ownership import ContainerIdentity


@dataclass(frozen=True)
class SecretsPart:
    secrets: tuple[Secret, ...] = field(default=(), repr=False)

    @property
    def environment(self) -> dict[str, str]:
        """Those delivered as environment variables."""
        return {secret.name: secret.value for secret in self.secrets if secret.as_env}

    @property
    def files(self) -> tuple[Secret, ...]:
        """Those delivered as files (/run/secrets/NAME)."""
        return tuple(secret for secret in self.secrets if secret.as_file)


def server_account(service: Service, context: SpecContext) -> Account:
    """Who a server runs as, the context's account being the session's choice (see
    :mod:`reactor_fabric.policy.accounts`): a service with secrets and no ``user`` of its own
    runs as the secrets' account — a secret in the environment is as readable as a file by
    whoever shares the server's uid (``/proc/PID/environ``), so never the project's owner's,
    nor nobody's."""
    return runs_as(context.service_name, service, context.identity, context.account)


def runs_as(
    service_name: str, service: Service, identity: ContainerIdentity, account: Account
) -> Account:
    """:func:`server_account` from what a start has before its spec (an isolated task's copy
    belongs to whom its container runs as)."""
    found = identity.secrets.get(service_name)
    if (
        found is not None
        and found.secrets
        and service.user is None
        and identity.secrets_account is not None
    ):
        return identity.secrets_account
    return account


def secrets(service: Service, context: SpecContext) -> SecretsPart | SpecRefusal:
    """The service's resolved secrets, or why it is refused."""
    name = context.service_name
    found = context.identity.secrets.get(name, ServiceSecrets())
    if found.problems:
        problems = "; ".join(found.problems)
        return SpecRefusal(name, found.reason, f"service {name!r} is refused: {problems}")
    return SecretsPart(found.secrets)


def file_delivery(part: SecretsPart, context: SpecContext) -> SpecRefusal | None:
    """Why ``part``'s file secrets cannot be delivered by the runtime, if they cannot (asked
    after the egress part: a service refused for both is refused for its egress, as it was
    when the runtime refused them at spawn)."""
    missing = context.capabilities.file_secrets_missing
    if part.files and missing:
        name = context.service_name
        return SpecRefusal(name, SECRET_UNAVAILABLE, f"service {name!r}: {missing}")
    return None
