"""Who this orchestrator is, as its containers and sessions carry it: the instance id stamped on
every container, the owner labels and the account secret-bearing servers run as, the suite's
secrets resolved once, and the session ids it mints (with its replica's name).

Resource handling: none held. Error handling: nothing raised for a missing secret or a missing
account: the services concerned are refused (``secret_unavailable``), said in the log once, and
each start or probe of them fails with that reason.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Mapping

from .._reasons import SECRET_UNAVAILABLE
from ..config.secrets import ServiceSecrets, resolve_suite_secrets
from ..config.structs import Suite
from ..observe.redaction import SECRET_VALUES
from ..policy.accounts import ROOT, Account, account_named, orchestrator_ids, secrets_account
from ..policy.container_parts.ownership import ContainerIdentity
from ..policy.owner import hostname, process_start_time

# The logger these lines were always written under (operators may filter on it).
log = logging.getLogger("reactor_fabric.trio.fabric")

# A replica's name, as it ends the session ids it mints (see new_session_id).
REPLICA_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def new_instance_id() -> str:
    """A random id for this orchestrator run, stamped on every container it creates."""
    return secrets.token_hex(8)


def new_session_id(replica: str | None = None) -> str:
    """A session id: random, 128 bits, safe in URLs, headers and container names; with
    ``replica``, ``HEX.REPLICA``: a proxy in front of several orchestrators routes a Streamable
    HTTP session's requests (its ``Mcp-Session-Id``) to the one that owns it (docs/SCALING.md).
    The name goes last so that what container names take from an id (its start) stays random.
    """
    random_part = secrets.token_hex(16)
    return random_part if replica is None else f"{random_part}.{replica}"


def process_identity(
    instance_id: str, network: str, secrets: Mapping[str, ServiceSecrets] | None = None
) -> ContainerIdentity:
    """The owner labels of containers this process starts (see ContainerIdentity), with the
    suite's resolved ``secrets`` and the account their servers run as: the orchestrator's own
    when it is not root (its user's secrets, and the only account it can give a file to), else
    one no account of the host holds (:func:`~reactor_fabric.policy.accounts.secrets_account`;
    without one the services with secrets are refused). Blocking (NSS) when there are
    secrets."""
    pid = os.getpid()
    uid, gid = orchestrator_ids()
    owner: Account | None = None
    if secrets and uid != ROOT:
        owner = account_named(uid, gid)
    elif secrets:
        owner = secrets_account()
        if owner is None:
            why = (
                "no uid and gid are free for the secrets' own account (every id tried is a host "
                "account's, group's or subordinate range's): a server with secrets would run as "
                "an account another user of this host holds"
            )
            secrets = {name: ServiceSecrets(problems=(why,)) for name in secrets}
    return ContainerIdentity(
        instance_id=instance_id,
        owner_host=hostname(),
        owner_pid=pid,
        owner_start=process_start_time(pid) or "",
        default_network=network,
        secrets=secrets or {},
        secrets_account=owner,
    )


def resolve_secrets(suite: Suite) -> dict[str, ServiceSecrets]:
    """The suite's secrets, resolved once (blocking: files): every value registered with
    the redactor (no log line, record or page shows it), each service refused for a missing
    one said in the log, by name and source, never by value."""
    resolved = resolve_suite_secrets(suite)
    for name, service_secrets in resolved.items():
        SECRET_VALUES.register(service_secrets.values())
        if not service_secrets.available:
            log.warning(
                "service_secrets_unavailable",
                extra={
                    "service": name,
                    "reason": SECRET_UNAVAILABLE,
                    "problems": list(service_secrets.problems),
                },
            )
    return resolved
