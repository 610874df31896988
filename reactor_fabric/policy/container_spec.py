"""What a session's container looks like, decided without talking to Docker.

:func:`container_spec_for` turns a suite service plus the session's context (id, mounts, network)
into a :class:`ContainerSpec`: labels, safe defaults, limits and the environment. Pure, so the
security-relevant choices are unit-tested without an engine; the Docker backend only translates
the spec into API calls.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from .._errors import ContainerStartFailure
from .._reasons import EGRESS_UNAVAILABLE, SECRET_UNAVAILABLE
from ..config.secrets import Secret, ServiceSecrets
from ..config.structs import Service
from ..config.suite import SERVICE_CONFIG_ENV
from .accounts import UNPRIVILEGED, Account
from .mount_spec import MountSpec

LABEL_MANAGED = "reactor-fabric.managed"
LABEL_INSTANCE = "reactor-fabric.instance"
LABEL_SESSION = "reactor-fabric.session"
LABEL_SERVICE = "reactor-fabric.service"
# On containers of the warm pool, which are created before any session (see warm_pool).
LABEL_POOLED = "reactor-fabric.pooled"
# A pooled container's CPU weight until it is handed out (the engine's minimum; the default is
# 1024): starting and waiting servers yield the CPU to the sessions' containers whenever it is
# contended, and take all of it when it is not. Set back to DEFAULT_CPU_SHARES at hand-out.
POOLED_CPU_SHARES = 2
DEFAULT_CPU_SHARES = 1024
# The host, PID and process start time of the orchestrator that owns a container, so that a
# later instance can tell whether the owner is gone (crash recovery), even if the PID was reused.
LABEL_OWNER_HOST = "reactor-fabric.owner-host"
LABEL_OWNER_PID = "reactor-fabric.owner-pid"
LABEL_OWNER_START = "reactor-fabric.owner-start"
# A read-only root still needs somewhere for temporary files, HOME and caches: bounded, counted
# against the container's memory limit, writable by whichever user the server runs as.
READ_ONLY_ROOT_TMPFS = {"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"}  # noqa: S108 - in the container
SERVER_HOME = "/tmp"  # noqa: S108 - inside the container


@dataclass(frozen=True)
class ContainerIdentity:
    """Who owns the containers an orchestrator starts, and where they go by default."""

    instance_id: str
    owner_host: str
    owner_pid: int
    owner_start: str
    default_network: str
    # Each service's secrets, resolved once at the start (services without any are absent).
    secrets: Mapping[str, ServiceSecrets] = field(default_factory=dict, repr=False)
    # Who a server with secrets runs as when the suite names no user (see .accounts): the
    # orchestrator's own account when it is not root (the only one it can give the files to:
    # a file secret is owned by the server's user, mode 0400), else an account no user of the
    # host holds. None when the suite has no secrets.
    secrets_account: Account | None = None

    def labels(self) -> dict[str, str]:
        return {
            LABEL_MANAGED: "true",
            LABEL_INSTANCE: self.instance_id,
            LABEL_OWNER_HOST: self.owner_host,
            LABEL_OWNER_PID: str(self.owner_pid),
            LABEL_OWNER_START: self.owner_start,
        }


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    command: list[str] | None
    environment: dict[str, str]
    labels: dict[str, str]
    mounts: tuple[MountSpec, ...]
    network: str
    memory_bytes: int
    nano_cpus: int
    pids_limit: int
    cap_add: tuple[str, ...] = ()
    no_new_privileges: bool = True
    read_only_rootfs: bool = False
    user: str | None = None
    pull: str = "missing"
    tmpfs: dict[str, str] = field(default_factory=dict)
    # The CPU weight against other containers when the CPU is contended (None: the engine's
    # default, 1024). The warm pool starts its containers at the lowest weight (see below).
    cpu_shares: int | None = None
    # The service's secrets: those delivered as environment variables are in `environment`
    # too; those delivered as files are `secret_files` (/run/secrets/NAME).
    secrets: tuple[Secret, ...] = field(default=(), repr=False)
    # Why the service's secrets are unavailable: the runtime refuses to create the container
    # (-32002 secret_unavailable) rather than start a server without its credentials.
    secret_problem: str | None = None
    # The reason the start is refused with then: secret_unavailable, or account_unavailable
    # (an agent naming an account the suite does not define).
    secret_reason: str = SECRET_UNAVAILABLE
    # The service's egress allowlist (``host:port`` entries; None: no proxy, `network` as
    # given). With one, `network` is "none" and the runtime serves the container a forward
    # proxy at EGRESS_PROXY_URL inside it (see reactor_fabric.runtime.egress_proxy), or refuses it
    # (egress_unavailable) where it cannot.
    egress: tuple[str, ...] | None = None
    # An agent's container with a child session: the runtime binds a socket of its own at
    # CHILD_SOCKET_TARGET (see reactor_fabric.runtime.child_sockets), or starts it without
    # (the agent then has no suite to use) where it cannot.
    child_fabric: bool = False

    @property
    def secret_files(self) -> tuple[Secret, ...]:
        """The secrets delivered as files (see reactor_fabric.runtime.secret_files)."""
        return tuple(secret for secret in self.secrets if secret.as_file)


def refuse_unavailable_secrets(spec: ContainerSpec) -> None:
    """Raise ContainerStartFailure (``secret_unavailable``) for a spec whose service's
    secrets could not be resolved; every runtime calls it before creating anything."""
    if spec.secret_problem is not None:
        _refuse(spec, f"is refused: {spec.secret_problem}", spec.secret_reason)


def refuse_egress(spec: ContainerSpec, why: str) -> None:
    """Raise ContainerStartFailure (``egress_unavailable``) for a spec with an egress
    allowlist, where the runtime cannot give it its proxy (``why``): refused rather than
    started with a network, or without the destinations it needs."""
    if spec.egress is not None:
        _refuse(spec, f"has an egress allowlist, and {why}", EGRESS_UNAVAILABLE)


def _refuse(spec: ContainerSpec, what: str, reason: str) -> NoReturn:
    service = spec.labels.get(LABEL_SERVICE, "")
    raise ContainerStartFailure(f"service {service!r} {what}", reason=reason, service=service)


def server_account(
    identity: ContainerIdentity, service_name: str, service: Service, account: Account
) -> Account:
    """Who a server of ``service_name`` runs as, ``account`` being the session's choice (see
    :mod:`.accounts`): a service with secrets and no ``user`` of its own runs as the secrets'
    account — a secret in the environment is as readable as a file by whoever shares the
    server's uid (``/proc/PID/environ``), so never the project's owner's, nor nobody's."""
    secrets = identity.secrets.get(service_name)
    if (
        secrets is not None
        and secrets.secrets
        and service.user is None
        and identity.secrets_account is not None
    ):
        return identity.secrets_account
    return account


def container_spec_for(
    service_name: str,
    service: Service,
    *,
    session_id: str,
    identity: ContainerIdentity,
    mounts: tuple[MountSpec, ...] = (),
    account: Account = UNPRIVILEGED,
    sequence: int = 0,
    child_token: str | None = None,
) -> ContainerSpec:
    """The container for ``service_name`` in session ``session_id``.

    ``child_token``: an agent's container that reaches a child session of the session (see
    :mod:`reactor_fabric.trio.child_sessions`): its relay finds the socket and the token in
    its environment.

    ``account`` is who the server runs as unless the suite names a ``user`` (see
    :mod:`.accounts`). ``sequence`` counts the containers a session has had (after idle
    teardown or a crash a new one starts), so that each gets a distinct, recognisable name.
    """
    # Nothing from the orchestrator's environment reaches a container: only the image's own
    # (its PATH and the like), the suite's `env`, the service's `config` and its secrets.
    secrets = identity.secrets.get(service_name, ServiceSecrets())
    account = server_account(identity, service_name, service, account)
    environment: dict[str, str] = {}
    if service.user is None:
        # An account the image does not know: give it a writable HOME and a name (git and
        # Python's getpass ask for one and fail on a uid missing from /etc/passwd). The suite's
        # `env` still wins.
        environment |= {"HOME": SERVER_HOME, "USER": account.name, "LOGNAME": account.name}
    environment |= service.env
    environment[SERVICE_CONFIG_ENV] = json.dumps(service.config, separators=(",", ":"))
    egress = service.egress_in_force
    if egress:
        environment |= proxy_environment()
    environment |= {secret.name: secret.value for secret in secrets.secrets if secret.as_env}
    if child_token is not None:
        environment |= {CHILD_SOCKET_ENV: CHILD_SOCKET_TARGET, CHILD_TOKEN_ENV: child_token}
    labels = identity.labels()
    labels[LABEL_SESSION] = session_id
    labels[LABEL_SERVICE] = service_name
    return ContainerSpec(
        name=f"rf-{service_name}-{session_id[:12]}-{sequence}",
        image=service.image,
        command=list(service.command) if service.command is not None else None,
        environment=environment,
        labels=labels,
        mounts=mounts,
        network="none" if egress is not None else service.network or identity.default_network,
        memory_bytes=service.resources.memory_bytes,
        nano_cpus=round(service.resources.cpus * 1_000_000_000),
        pids_limit=service.resources.pids,
        cap_add=tuple(service.security.cap_add),
        no_new_privileges=service.security.no_new_privileges,
        read_only_rootfs=service.security.read_only_rootfs,
        user=service.user if service.user is not None else account.docker_user,
        pull=service.pull,
        # Otherwise (read-only root off) the image's own /tmp is left as it is.
        tmpfs=READ_ONLY_ROOT_TMPFS if service.security.read_only_rootfs else {},
        secrets=secrets.secrets,
        secret_problem="; ".join(secrets.problems) or None,
        secret_reason=secrets.reason,
        egress=tuple(egress) if egress else None,
        child_fabric=child_token is not None,
    )


# Where an agent's relay finds its child session's socket, and the token it opens it with
# (images/README.md, "Agent images"). The socket's place in the container is the runtime's.
CHILD_SOCKET_ENV = "REACTOR_FABRIC_FABRIC_SOCKET"
CHILD_TOKEN_ENV = "REACTOR_FABRIC_FABRIC_TOKEN"  # noqa: S105 - the variable's name
CHILD_SOCKET_TARGET = "/.reactor-fabric/fabric.sock"

# Where a container with an egress allowlist finds its proxy: a port on its own loopback, where
# fabric-stdio forwards each connection to the orchestrator (reactor_fabric.runtime.egress_proxy).
EGRESS_PROXY_PORT = 3128
EGRESS_PROXY_URL = f"http://127.0.0.1:{EGRESS_PROXY_PORT}"


def proxy_environment(url: str = EGRESS_PROXY_URL) -> dict[str, str]:
    """The variables clients read their proxy (``url``) from, both spellings (curl reads only
    the lower case http_proxy, Go only upper case on some paths); NO_PROXY empty, so that
    nothing — not even loopback — is reached past the proxy (there is no route past it
    anyway). The Kubernetes runtime gives its own ``url`` (the proxy's address in the cluster,
    with the pod's token)."""
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
    environment = dict.fromkeys(names, url)
    environment |= {name.lower(): url for name in names}
    environment |= {"NO_PROXY": "", "no_proxy": ""}
    return environment


def pooled_spec_for(
    service_name: str,
    service: Service,
    *,
    token: int,
    identity: ContainerIdentity,
    staging: tuple[MountSpec, ...] = (),
    account: Account = UNPRIVILEGED,
) -> ContainerSpec:
    """A warm pool container of ``service_name``: what a session's container would be with
    ``account`` (image, command, environment, limits, network, user), but created before any
    session, so labelled as pooled rather than with a session, named after its pool ``token``,
    with the staging binds (see :mod:`reactor_fabric.runtime.staging`) as its mounts, and the
    lowest CPU weight until it is handed out (``POOLED_CPU_SHARES``)."""
    spec = container_spec_for(
        service_name, service, session_id="", identity=identity, mounts=staging, account=account
    )
    labels = {key: value for key, value in spec.labels.items() if key != LABEL_SESSION}
    labels[LABEL_POOLED] = "true"
    return dataclasses.replace(
        spec,
        name=f"rf-{service_name}-pool-{identity.instance_id[:8]}-{token}",
        labels=labels,
        cpu_shares=POOLED_CPU_SHARES,
    )
