"""Typed structures of the suite file (``claude-mcp-suite.yaml``).

These mirror ``schemas/claude-mcp-suite.schema.json`` field for field (a test fails if they
drift); defaults here equal the schema's ``default`` values. Instances are only ever built from
data that already passed validation (see :mod:`reactor_fabric.config.suite`), so the durations and
sizes parsed when they are made (:class:`_ParsedOnce`) parse without failing.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import msgspec

from .units import parse_duration, parse_size

DEFAULT_TIMEOUT = "1m"
DEFAULT_MAX_MESSAGE_SIZE = "16m"

# A service's container lifecycle (the reference design's names, kept so that its suite files
# work): one container per client session; a fresh one for every call; or per session, but
# replaced between calls after a number of calls, an age or a memory use.
ContainerStrategy = Literal["reuse_per_session", "fresh_per_call", "smart_refresh"]
# What the service is: an MCP tool server, or an agent (a model behind MCP tools), which gets a
# fresh context (a fresh container) for every call by default.
ServiceType = Literal["tool_service", "llm_agent"]
# Where a call's container works on the client's project: on a copy of its own, handed back as
# a branch (isolated), or on the project itself (shared; see docs/USAGE.md "Workspaces").
WorkspaceMode = Literal["isolated", "shared"]
# What stands between the server and the host's kernel: the engine's default runtime (runc:
# namespaces, cgroups, seccomp), gVisor (runsc: a kernel in user space; refused where the
# engine has none), or gVisor where the engine has it and runc where not (said at the start).
Isolation = Literal["runc", "gvisor", "prefer-gvisor"]


class _ParsedOnce(msgspec.Struct, frozen=True, dict=True):
    """A struct with durations or sizes, each parsed once, when the struct is made: the suite's
    are made by msgspec.convert when the suite is loaded, right after it was validated
    (:func:`~reactor_fabric.config.suite.check_suite_text`), and nothing parses a unit string
    after that. The fields keep the suite's words (the schema's types, what a message quotes);
    each number is a functools.cached_property (``dict=True`` gives it room on the frozen
    instance) that this hook fills at once, so a container start or a setting reads the
    number, never the text."""

    def __post_init__(self) -> None:
        for klass in type(self).__mro__:
            for name, attribute in vars(klass).items():
                if isinstance(attribute, functools.cached_property):
                    getattr(self, name)


class Resources(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    memory: str | int = "512m"
    cpus: float = 1.0
    pids: int = 256

    @functools.cached_property
    def memory_bytes(self) -> int:
        return parse_size(self.memory)


class Security(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    no_new_privileges: bool = True
    cap_add: list[str] = msgspec.field(default_factory=list)
    read_only_rootfs: bool = True
    # The project's .git stays writable (policy/git_guard.py): the git service commits.
    git_writable: bool = False
    # The read-only root's /tmp (HOME, caches; a worker's session environment): its pages count
    # against the memory limit.
    tmp_size: str | int = "64m"
    # Programs and shared libraries on that /tmp may run (noexec otherwise): the worker's
    # session environment is there (console scripts, compiled extension modules).
    tmp_exec: bool = False

    @functools.cached_property
    def tmp_bytes(self) -> int:
        return parse_size(self.tmp_size)


# How a secret reaches the server: a file /run/secrets/NAME, the environment variable NAME, or
# both (the default: many servers read only their environment).
SecretDelivery = Literal["env", "file", "both"]


class SecretSource(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Where a secret's value comes from: exactly one of ``env`` (a variable of the
    orchestrator's environment) or ``file`` (a file only the orchestrator's user may read);
    see :mod:`reactor_fabric.config.secrets`."""

    env: str | None = None
    file: str | None = None
    # "as" is a keyword in Python: the field is as_ here, "as" in the suite.
    as_: SecretDelivery = msgspec.field(default="both", name="as")


# Where an agent reaches its model when the suite says nothing (no egress, no network): the
# Messages API, and nothing else.
DEFAULT_AGENT_EGRESS = ("api.anthropic.com:443",)


class Account(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A model account (``orchestrator.accounts.NAME``): the credentials of the agents that
    name it in ``config.account``, as secrets (see :mod:`reactor_fabric.config.secrets`)."""

    secrets: dict[str, SecretSource]
    description: str = ""


class Service(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    image: str
    description: str = ""
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    timeout: str = DEFAULT_TIMEOUT
    warm: int = 0
    command: list[str] | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    secrets: dict[str, SecretSource] = msgspec.field(default_factory=dict)
    resources: Resources = msgspec.field(default_factory=Resources)
    # None: `network` decides; a list (even empty): no network but the proxy to these.
    egress: list[str] | None = None
    network: str | None = None
    pull: Literal["never", "missing", "always"] = "missing"
    user: str | None = None
    security: Security = msgspec.field(default_factory=Security)
    local_command: list[str] | None = None
    categories: list[str] = msgspec.field(default_factory=list)
    keywords: list[str] = msgspec.field(default_factory=list)
    example_tasks: list[str] = msgspec.field(default_factory=list)
    requires: list[str] = msgspec.field(default_factory=list)
    # An agent's: the services its child session may use (see docs/USAGE.md).
    uses: list[str] = msgspec.field(default_factory=list)
    service_type: ServiceType = "tool_service"
    # None: the service type's default (see :attr:`strategy`).
    container_strategy: ContainerStrategy | None = None
    # smart_refresh's bounds (only meaningful with it; validation says so otherwise).
    max_calls_per_container: int | None = None
    max_container_age: str | None = None
    memory_threshold: str | int | None = None
    # None: the service type's default (see :attr:`workspace_mode`).
    workspace: WorkspaceMode | None = None
    # None: the service type's default (see :attr:`isolation_in_force`).
    isolation: Isolation | None = None

    @functools.cached_property
    def idle_timeout_seconds(self) -> float:
        return parse_duration(self.timeout)

    @property
    def strategy(self) -> ContainerStrategy:
        """The container lifecycle in force: the one given, else the service type's default
        (``fresh_per_call`` for an agent, ``reuse_per_session`` for a tool server)."""
        if self.container_strategy is not None:
            return self.container_strategy
        return "fresh_per_call" if self.service_type == "llm_agent" else "reuse_per_session"

    @property
    def workspace_mode(self) -> WorkspaceMode:
        """Where a call's container works: the mode given, else ``isolated`` for an agent with
        a container per call (a copy of the project per task, its changes a branch) and
        ``shared`` (the project itself) for a tool server, or an agent whose container serves
        several calls (a copy per task needs a container per task)."""
        if self.workspace is not None:
            return self.workspace
        per_task = self.service_type == "llm_agent" and self.strategy == "fresh_per_call"
        return "isolated" if per_task else "shared"

    @property
    def isolation_in_force(self) -> Isolation:
        """The isolation asked for: the one given, else ``prefer-gvisor`` for an agent (it runs
        a model's commands) and ``runc`` for a tool server."""
        if self.isolation is not None:
            return self.isolation
        return "prefer-gvisor" if self.service_type == "llm_agent" else "runc"

    @property
    def account(self) -> str | None:
        """The model account an agent names (``config.account``); None for a tool server,
        whose ``config`` is its own, passed through untouched."""
        if self.service_type != "llm_agent":
            return None
        name = self.config.get("account")
        return name if isinstance(name, str) else None

    @property
    def egress_in_force(self) -> list[str] | None:
        """The egress allowlist in force: the one given; for an agent with neither an
        allowlist nor a network, the model API's (:data:`DEFAULT_AGENT_EGRESS`); else None
        (the network decides)."""
        if self.egress is not None:
            return self.egress
        if self.service_type == "llm_agent" and self.network is None:
            return list(DEFAULT_AGENT_EGRESS)
        return None

    @functools.cached_property
    def max_container_age_seconds(self) -> float | None:
        return None if self.max_container_age is None else parse_duration(self.max_container_age)

    @functools.cached_property
    def memory_threshold_bytes(self) -> int | None:
        return None if self.memory_threshold is None else parse_size(self.memory_threshold)


class Limits(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    max_connections: int = 512
    # Half of max_connections: a burst of 200 clients connecting at once is upgraded before
    # any first message is read (measured: with 64, 136 of 200 were refused with 503); each
    # waiting connection costs a few KB and is closed after first_message_timeout.
    max_pending_connections: int = 256
    first_message_timeout: str = "30s"
    buffer_to_server: str | int = "1m"
    buffer_to_client: str | int = "1m"
    client_write_timeout: str = "30s"
    shutdown_timeout: str = "10s"

    @functools.cached_property
    def first_message_seconds(self) -> float:
        return parse_duration(self.first_message_timeout)

    @functools.cached_property
    def buffer_to_server_bytes(self) -> int:
        return parse_size(self.buffer_to_server)

    @functools.cached_property
    def buffer_to_client_bytes(self) -> int:
        return parse_size(self.buffer_to_client)

    @functools.cached_property
    def client_write_seconds(self) -> float:
        return parse_duration(self.client_write_timeout)

    @functools.cached_property
    def shutdown_seconds(self) -> float:
        return parse_duration(self.shutdown_timeout)


# Where in a container client mounts may go (besides the source's own path): directories the
# images keep for the client's files (empty or absent), so a mount never shadows a server's own.
DEFAULT_MOUNT_TARGETS = ("/workspace", "/projects")


class ModelAssist(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """analyze_task may ask the client's own model (sampling) when its confidence is low."""

    enabled: bool = False
    below_confidence: float = 0.5
    timeout: str = "20s"
    candidates: int = 5

    @functools.cached_property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout)


class FabricSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    default_exposure: Literal["discover", "all"] = "discover"
    token_budget: int | None = None
    model_assist: ModelAssist = msgspec.field(default_factory=ModelAssist)


class Audit(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The audit trail (see :mod:`reactor_fabric.observe.audit`)."""

    enabled: bool = True
    path: str | None = None
    arguments: Literal["none", "hash", "full"] = "hash"
    max_size: str | int = "50m"
    keep: int = 5

    @functools.cached_property
    def max_bytes(self) -> int:
        return parse_size(self.max_size)


class WarmPool(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Started, idle containers kept ready (see :mod:`reactor_fabric.trio.warm_pool`)."""

    max_containers: int = 16
    parallel_starts: int = 2
    # After a pooled container is handed out, refills wait this long (None: not at all).
    refill_hold: str | None = "500ms"

    @functools.cached_property
    def refill_hold_seconds(self) -> float:
        return 0.0 if self.refill_hold is None else parse_duration(self.refill_hold)


class KubernetesEgressProxy(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Where pods of services with an ``egress`` list reach the orchestrator's egress proxy:
    ``listen`` (HOST:PORT) is where the orchestrator binds it, ``address`` (IP:PORT) how pods
    reach it, the one destination their NetworkPolicy allows; None: the orchestrator pod's IP
    (REACTOR_FABRIC_POD_IP, from the downward API's status.podIP) and ``listen``'s port."""

    listen: str
    address: str | None = None


class Kubernetes(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The Kubernetes runtime (see :mod:`reactor_fabric.runtime.kubernetes`)."""

    namespace: str | None = None
    kubeconfig: str | None = None
    volumes: dict[str, str] = msgspec.field(default_factory=dict)
    start_timeout: str = "2m"
    # None: services with an egress list are refused (egress_unavailable).
    egress_proxy: KubernetesEgressProxy | None = None
    # The RuntimeClass that runs pods under gVisor (its handler runsc); None: the cluster has
    # none, and services with isolation: gvisor are refused (isolation_unavailable).
    gvisor_runtime_class: str | None = None

    @functools.cached_property
    def start_timeout_seconds(self) -> float:
        return parse_duration(self.start_timeout)


class Agents(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Limits on agent calls in flight (calls to ``llm_agent`` services): in the whole
    orchestrator, and in one session (see :mod:`reactor_fabric.protocol.agent_slots`)."""

    max_concurrent: int = 4
    max_concurrent_per_session: int = 2
    # How many agents deep a client's session may go (see ContainerStarter.child_services).
    max_depth: int = 1


class Workspaces(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Bounds on the copies isolated tasks work on (``orchestrator.workspaces``): a project
    over either is refused (``workspace_too_large``) rather than copied slowly."""

    max_size: str | int = "2g"
    max_files: int = 100_000
    # A spare copy per session and project (reactor_fabric.workspace.spare), made at the
    # session's start and after each task from the working tree, that the session's next such
    # task takes and brings up to date, kept after the session for the next one on the
    # project (trio/spares.py); at most spare_max_size (a larger project: no spare).
    spare: bool = True
    spare_max_size: str | int = "256m"
    # Where the copies are made (None: memory-backed /dev/shm when it is a tmpfs, else on
    # disk; see reactor_fabric.trio.workspaces.default_parent).
    directory: str | None = None

    @functools.cached_property
    def max_size_bytes(self) -> int:
        return parse_size(self.max_size)

    @functools.cached_property
    def spare_max_size_bytes(self) -> int:
        return parse_size(self.spare_max_size)


# The JWS algorithms an access token may be signed with in oidc mode: asymmetric only ("none"
# and the HMAC ones never: a symmetric key is a secret the orchestrator would have to share
# with the issuer, and "HS256 with the public key as the secret" is the classic forgery).
ASYMMETRIC_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
AuthMode = Literal["token", "none", "oidc"]


class Auth(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """How clients authenticate (docs/USAGE.md, "Users and sign-in"): the orchestrator's one
    token, nothing (loopback only), or as an OAuth 2.1 resource server accepting an OpenID
    provider's JWT access tokens (``oidc``)."""

    mode: AuthMode
    issuer: str | None = None
    # The resource tokens must name in "aud" (None: the orchestrator's public_url, or on
    # loopback its loopback URLs).
    audience: str | None = None
    user_claim: str = "sub"
    groups_claim: str = "groups"
    # Users, or "group:NAME" for every member of a group, who see every session.
    operators: list[str] = msgspec.field(default_factory=list)
    # Scopes every token must carry (said in the metadata and in a 401's challenge).
    scopes: list[str] = msgspec.field(default_factory=list)
    algorithms: list[str] = msgspec.field(default_factory=lambda: list(ASYMMETRIC_ALGORITHMS))
    # How far a token's exp / nbf / iat may be off this machine's clock.
    leeway: str = "60s"
    # The status page's client at the issuer (a public client whose redirect URI is the page,
    # PUBLIC_URL/); None: the page registers itself, where the issuer lets a browser.
    page_client_id: str | None = None

    @functools.cached_property
    def leeway_seconds(self) -> float:
        return parse_duration(self.leeway)


class UserEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """What one user (or a group's members, or everyone: ``default``) may do when users sign
    in (``orchestrator.users``); a field left out is the ``default`` entry's, else the
    orchestrator's (see :mod:`reactor_fabric.policy.user_policy`)."""

    # "{user}" stands for the user's name, e.g. "/home/{user}/".
    allowed_mount_roots: list[str] | None = None
    services: list[str] | None = None
    accounts: list[str] | None = None
    max_sessions: int | None = None
    calls_per_minute: int | None = None


class Orchestrator(_ParsedOnce, forbid_unknown_fields=True, frozen=True, kw_only=True):
    allowed_mount_roots: list[str]
    allowed_mount_targets: list[str] = msgspec.field(
        default_factory=lambda: list(DEFAULT_MOUNT_TARGETS)
    )
    # "token" and "none" are short for {mode: token} and {mode: none} (see auth_settings).
    auth: Literal["token", "none"] | Auth = "token"
    # Where clients reach the orchestrator (behind a proxy, its public address): the resource
    # oidc mode's tokens must be for.
    public_url: str | None = None
    # Per-user policy (auth.mode: oidc): "default", a user's name, or "group:NAME".
    users: dict[str, UserEntry] = msgspec.field(default_factory=dict)
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    max_sessions: int = 64
    max_message_size: str | int = DEFAULT_MAX_MESSAGE_SIZE
    network: str = "bridge"
    runtime: Literal["docker", "podman", "kubernetes"] = "docker"
    # The engine's runtime that runs a container under gVisor (Docker's daemon.json
    # "runtimes", Podman's containers.conf; scripts/ensure-gvisor registers it as runsc).
    gvisor_runtime: str = "runsc"
    # None: warn when the lock file exists, off when it does not; "enforce" or "warn" said here
    # need the file (protocol/suite_lock.py: lock_mode, missing_lock).
    lock: Literal["enforce", "warn", "off"] | None = None
    limits: Limits = msgspec.field(default_factory=Limits)
    fabric: FabricSettings = msgspec.field(default_factory=FabricSettings)
    audit: Audit = msgspec.field(default_factory=Audit)
    warm_pool: WarmPool = msgspec.field(default_factory=WarmPool)
    kubernetes: Kubernetes = msgspec.field(default_factory=Kubernetes)
    accounts: dict[str, Account] = msgspec.field(default_factory=dict)
    agents: Agents = msgspec.field(default_factory=Agents)
    workspaces: Workspaces = msgspec.field(default_factory=Workspaces)

    @functools.cached_property
    def max_message_bytes(self) -> int:
        return parse_size(self.max_message_size)

    @functools.cached_property
    def auth_settings(self) -> Auth:
        """``auth`` whichever way the suite wrote it."""
        return self.auth if isinstance(self.auth, Auth) else Auth(mode=self.auth)


class Profile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    services: list[str]
    description: str = ""


class Suite(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    version: str
    orchestrator: Orchestrator
    mcp_services: dict[str, Service]
    profiles: dict[str, Profile] = msgspec.field(default_factory=dict)
