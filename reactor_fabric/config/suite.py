"""Validation of a suite file: JSON Schema first, then the checks a schema cannot express.

:func:`check_suite_text` is pure (text in, typed suite or a list of problems out) so that every
rule is tested without touching the disk. :func:`load_suite` adds the file reading and turns the
outcome into exceptions: :class:`SuiteUnreadable` when the file cannot be read at all (exit code 2
of ``validate-config``) and :class:`~reactor_fabric.InvalidSuiteConfiguration` (code -32003, exit
code 1) listing every problem, each with file, line, column and key path.
"""

from __future__ import annotations

import difflib
import functools
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard

import jsonschema
import msgspec

from .._errors import InvalidSuiteConfiguration
from .._reasons import INVALID_SUITE_CONFIGURATION
from ..protocol.egress import parse_destination
from .hosts import https_or_loopback
from .positions import KeyPath, LoadedYaml, YamlSyntaxError, load_yaml_with_positions
from .structs import Resources, Suite
from .suite_messages import name_message, schema_message
from .units import parse_duration, parse_size

SCHEMA_RESOURCE = "claude-mcp-suite.schema.json"
# The environment variable that carries a service's `config` into its container.
SERVICE_CONFIG_ENV = "REACTOR_FABRIC_SERVICE_CONFIG"
# The environment variable that marks a container for gVisor (policy/container_parts/isolation.py:
# Podman's dispatching runtime reads it, so a suite must neither set it nor take it away).
ISOLATION_ENV = "REACTOR_FABRIC_ISOLATION"
# The variables of ours a suite may not set (env, secrets), with why.
RESERVED_ENV = {
    SERVICE_CONFIG_ENV: "it carries the service's `config` as JSON",
    ISOLATION_ENV: "it marks a container for gVisor (set it with `isolation`)",
}


def _reserved(name: str) -> str:
    return f"{name} is reserved: {RESERVED_ENV[name]}"


# Docker refuses memory limits below 6 MiB.
MIN_MEMORY_BYTES = 6 * 1024 * 1024
MIN_TMP_BYTES = 1024 * 1024
MAX_REFILL_HOLD_SECONDS = 10.0
MIN_MESSAGE_BYTES = 1024
MIN_AUDIT_BYTES = 64 * 1024
MIN_WORKSPACE_BYTES = 1 << 20  # the schema's minimum, also for sizes given with a unit


@dataclass(frozen=True)
class SuiteIssue:
    """One problem in a suite file, printable as ``file:line:column: key.path: message``."""

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.path}: {self.message}"


@dataclass(frozen=True)
class SuiteCheck:
    suite: Suite | None
    issues: list[SuiteIssue]
    # What is valid but will not work as written (an agent's account the suite does not
    # define): validate-config prints them and exits 0; the service is refused at run time.
    warnings: list[SuiteIssue] = field(default_factory=list)


class SuiteUnreadable(OSError):
    """The suite file could not be read (missing, a directory, no permission, not UTF-8)."""


@functools.cache
def suite_schema() -> dict[str, Any]:
    """The suite's JSON Schema (2020-12), shipped inside the package."""
    text = resources.files("reactor_fabric.config").joinpath(SCHEMA_RESOURCE).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(suite_schema())


def format_path(path: KeyPath) -> str:
    """``("mcp_services", "git", "command", 0)`` → ``mcp_services.git.command[0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


# Names a service cannot have: their URLs mean something else.
# The fabric endpoint's name in URLs (/mcp/fabric/{key}); no service may take it.
FABRIC_ENDPOINT = "fabric"
RESERVED_SERVICE_NAMES = frozenset({FABRIC_ENDPOINT})


def check_suite_text(text: str, *, source: str) -> SuiteCheck:
    """Validate the text of a suite file named ``source``; never raises for bad content."""
    try:
        loaded = load_yaml_with_positions(text)
    except YamlSyntaxError as exc:
        issue = SuiteIssue(source, exc.position.line, exc.position.column, "(top level)", str(exc))
        return SuiteCheck(None, [issue])

    collector = _Collector(source, loaded)
    for problem in loaded.problems:
        collector.add_at(
            problem.path, problem.position.line, problem.position.column, problem.message
        )
    if loaded.data is None:
        collector.add(
            (), "the file is empty; expected a mapping with version, orchestrator and mcp_services"
        )
        return collector.result(None)

    for error in _validator().iter_errors(loaded.data):
        collector.add_schema_error(error)
    _check_logic(loaded.data, collector)
    if collector.issues:
        return collector.result(None)
    return collector.result(msgspec.convert(loaded.data, Suite))


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file.

    Raises :class:`SuiteUnreadable` if it cannot be read, and
    :class:`~reactor_fabric.InvalidSuiteConfiguration` (with ``issues``) if it is invalid.
    """
    text = read_suite_file(path)
    check = check_suite_text(text, source=str(path))
    if check.suite is None:
        raise InvalidSuiteConfiguration(
            f"{path}: {len(check.issues)} problem(s) in the suite file",
            reason=INVALID_SUITE_CONFIGURATION,
            issues=[str(issue) for issue in check.issues],
        )
    return check.suite


def read_suite_file(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SuiteUnreadable(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except IsADirectoryError as exc:
        raise SuiteUnreadable(f"{path}: is a directory, not a suite file") from exc
    except FileNotFoundError as exc:
        raise SuiteUnreadable(f"{path}: no such file") from exc
    except OSError as exc:
        raise SuiteUnreadable(f"{path}: cannot read: {exc.strerror or exc}") from exc


class _Collector:
    def __init__(self, source: str, loaded: LoadedYaml) -> None:
        self.source = source
        self.loaded = loaded
        self.issues: list[SuiteIssue] = []
        self.warnings: list[SuiteIssue] = []
        # Paths the schema already complained about; logical checks skip them so that one
        # mistake yields one message.
        self.flagged: set[KeyPath] = set()

    def add_at(self, path: KeyPath, line: int, column: int, message: str) -> None:
        self.flagged.add(path)
        self.issues.append(SuiteIssue(self.source, line, column, format_path(path), message))

    def add(self, path: KeyPath, message: str, *, at_key: bool = False) -> None:
        position = self.loaded.position_of(path, key=at_key)
        self.add_at(path, position.line, position.column, message)

    def warn(self, path: KeyPath, message: str) -> None:
        position = self.loaded.position_of(path)
        issue = SuiteIssue(self.source, position.line, position.column, format_path(path), message)
        self.warnings.append(issue)

    def add_schema_error(self, error: jsonschema.ValidationError) -> None:
        path: KeyPath = tuple(error.absolute_path)
        validator = error.validator
        instance: Any = error.instance
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        if validator == "additionalProperties" and isinstance(instance, dict):
            allowed = sorted(schema.get("properties", {}))
            for key in instance:
                if key in allowed:
                    continue
                hint = difflib.get_close_matches(key, allowed, n=1)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
                where = "" if not allowed else f" (known keys: {', '.join(allowed)})"
                self.add((*path, key), f"unknown key {key!r}{suggestion or where}", at_key=True)
            return
        if validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else error.message
            self.add(path, f"missing required key {missing!r}", at_key=True)
            return
        if "propertyNames" in error.relative_schema_path:
            name = str(instance)
            self.add((*path, name), name_message(path, name, RESERVED_SERVICE_NAMES), at_key=True)
            return
        if path in self.flagged:  # one message per value: the first failed keyword says most
            return
        self.add(path, schema_message(error, path))

    def result(self, suite: Suite | None) -> SuiteCheck:
        def order(issue: SuiteIssue) -> tuple[int, int, str]:
            return (issue.line, issue.column, issue.path)

        return SuiteCheck(suite, sorted(self.issues, key=order), sorted(self.warnings, key=order))


def _check_orchestrator(orchestrator: dict[str, Any], collector: _Collector) -> None:
    """The rules of ``orchestrator`` (see :func:`_check_logic`)."""
    _check_roots(orchestrator.get("allowed_mount_roots"), collector)
    _check_size(orchestrator, ("orchestrator", "max_message_size"), MIN_MESSAGE_BYTES, collector)
    limits = orchestrator.get("limits")
    if isinstance(limits, dict):
        for key in ("buffer_to_server", "buffer_to_client"):
            _check_size(limits, ("orchestrator", "limits", key), MIN_MESSAGE_BYTES, collector)
        for key in ("first_message_timeout", "client_write_timeout", "shutdown_timeout"):
            _check_duration(limits, ("orchestrator", "limits", key), collector)
    audit = orchestrator.get("audit")
    if isinstance(audit, dict):
        # Room for the largest record (a tool call with its arguments in full).
        _check_size(audit, ("orchestrator", "audit", "max_size"), MIN_AUDIT_BYTES, collector)
    workspaces = orchestrator.get("workspaces")
    if isinstance(workspaces, dict):
        for key in ("max_size", "spare_max_size"):
            path: KeyPath = ("orchestrator", "workspaces", key)
            _check_size(workspaces, path, MIN_WORKSPACE_BYTES, collector)
    kubernetes = orchestrator.get("kubernetes")
    if isinstance(kubernetes, dict):
        _check_duration(kubernetes, ("orchestrator", "kubernetes", "start_timeout"), collector)
    pool = orchestrator.get("warm_pool")
    if isinstance(pool, dict):
        path = ("orchestrator", "warm_pool", "refill_hold")
        why = "the pool would stay empty that long after each hand-out"
        _check_duration(pool, path, collector, at_most=(MAX_REFILL_HOLD_SECONDS, why))
    auth = orchestrator.get("auth")
    if isinstance(auth, dict):
        _check_auth(auth, collector)
    fabric = orchestrator.get("fabric")
    assist = fabric.get("model_assist") if isinstance(fabric, dict) else None
    if isinstance(assist, dict):
        path = ("orchestrator", "fabric", "model_assist", "timeout")
        _check_duration(assist, path, collector)


def _check_auth(auth: dict[str, Any], collector: _Collector) -> None:
    """An issuer over plain http only on this machine (a token's keys fetched in clear from
    elsewhere could be anyone's), and a clock leeway that does not make exp meaningless."""
    issuer = auth.get("issuer")
    path: KeyPath = ("orchestrator", "auth", "issuer")
    if isinstance(issuer, str) and path not in collector.flagged and not https_or_loopback(issuer):
        collector.add(path, f"{issuer!r}: an issuer is https, or http on a loopback address")
    why = "a token would outlive its expiry by that much"
    _check_duration(auth, ("orchestrator", "auth", "leeway"), collector, at_most=(300.0, why))


def _check_logic(data: object, collector: _Collector) -> None:
    """Rules a JSON Schema cannot say; each looks only at values of the right type."""
    if not isinstance(data, dict):
        return
    orchestrator = data.get("orchestrator")
    if isinstance(orchestrator, dict):
        _check_orchestrator(orchestrator, collector)
    services = data.get("mcp_services")
    if isinstance(services, dict):
        for name, service in services.items():
            if isinstance(service, dict):
                _check_service(str(name), service, collector)
        _check_profiles(data.get("profiles"), set(services), collector)
        _check_requires(services, collector)
        _check_uses(services, collector)
        _check_git_writable(services, collector)
        accounts = orchestrator.get("accounts") if isinstance(orchestrator, dict) else None
        _check_accounts(services, accounts if isinstance(accounts, dict) else {}, collector)
        users = orchestrator.get("users") if isinstance(orchestrator, dict) else None
        if isinstance(users, dict):
            known = accounts if isinstance(accounts, dict) else {}
            _check_users(users, set(services), set(known), collector)


def _check_users(
    users: dict[str, Any], services: set[str], accounts: set[str], collector: _Collector
) -> None:
    """Each entry names services and accounts the suite has, and roots that could be roots."""
    for key, entry in users.items():
        if not isinstance(entry, dict):
            continue
        base: KeyPath = ("orchestrator", "users", str(key))
        if str(key).startswith("group:") and not str(key)[len("group:") :]:
            collector.add(base, "a group entry names its group: 'group:NAME'")
        for key_name, known, what in (
            ("services", services, "service in mcp_services"),
            ("accounts", accounts, "account in orchestrator.accounts"),
        ):
            names = entry.get(key_name)
            for index, name in enumerate(names if isinstance(names, list) else []):
                path: KeyPath = (*base, key_name, index)
                if isinstance(name, str) and name not in known and path not in collector.flagged:
                    collector.add(path, f"no {what} is named {name!r}")
        roots = entry.get("allowed_mount_roots")
        for index, root in enumerate(roots if isinstance(roots, list) else []):
            path = (*base, "allowed_mount_roots", index)
            if isinstance(root, str) and path not in collector.flagged:
                problem = _root_problem(root.replace("{user}", "user"))
                if problem is not None:
                    collector.add(path, problem)


def _check_uses(services: dict[str, Any], collector: _Collector) -> None:
    """``uses`` is an agent's, and names other services of the suite."""
    for name, service in services.items():
        used = service.get("uses") if isinstance(service, dict) else None
        if not isinstance(used, list) or not used:
            continue
        if service.get("service_type", "tool_service") != "llm_agent":
            collector.add(
                ("mcp_services", name, "uses"),
                "only an agent (service_type: llm_agent) uses other services",
                at_key=True,
            )
            continue
        for index, member in enumerate(used):
            path: KeyPath = ("mcp_services", name, "uses", index)
            if not isinstance(member, str) or path in collector.flagged:
                continue
            if member == name:
                collector.add(path, f"{name!r} cannot use itself")
            elif member not in services:
                known = ", ".join(sorted(services))
                collector.add(path, f"no service named {member!r} in mcp_services ({known})")


def _check_git_writable(services: dict[str, Any], collector: _Collector) -> None:
    """An agent never writes the project's .git (code it plants there runs on the host)."""
    for name, service in services.items():
        if not isinstance(service, dict) or service.get("service_type") != "llm_agent":
            continue
        security = service.get("security")
        if isinstance(security, dict) and security.get("git_writable") is True:
            collector.add(
                ("mcp_services", name, "security", "git_writable"),
                "an agent never gets the project's .git writable: what it writes there (hooks, "
                "config) would run on your machine the next time you use git",
            )


def _check_accounts(
    services: dict[str, Any], accounts: dict[str, Any], collector: _Collector
) -> None:
    """An agent's ``config.account`` is a name; one the suite does not define is a warning
    (suites written for the reference design name accounts set up elsewhere): that agent is
    refused at run time, the rest serve. Its account's secrets and its own must not share a
    name, nor take one of its ``env`` (which value would the agent get?)."""
    for name, service in services.items():
        if not isinstance(service, dict) or service.get("service_type") != "llm_agent":
            continue
        config = service.get("config")
        account = config.get("account") if isinstance(config, dict) else None
        path: KeyPath = ("mcp_services", name, "config", "account")
        if account is None:
            continue
        if not isinstance(account, str):
            collector.add(path, "an agent's account is the name of one of orchestrator.accounts")
            continue
        defined = accounts.get(account)
        if not isinstance(defined, dict):
            known = ", ".join(sorted(accounts)) or "none defined"
            collector.warn(
                path,
                f"account {account!r} is not defined under orchestrator.accounts ({known}): "
                f"{name} will be unavailable (account_unavailable) until it is",
            )
            continue
        account_secrets = defined.get("secrets")
        if not isinstance(account_secrets, dict):
            continue
        own = service.get("secrets")
        env = service.get("env")
        for secret in account_secrets:
            if isinstance(own, dict) and secret in own:
                collector.add(
                    ("mcp_services", name, "secrets", secret),
                    f"{secret!r} is also a secret of account {account!r}: the agent would get "
                    "one of two values; remove one",
                    at_key=True,
                )
            elif isinstance(env, dict) and secret in env:
                collector.add(
                    ("mcp_services", name, "env", secret),
                    f"{secret!r} is a secret of account {account!r}: the agent would get one "
                    f"of two values; remove env.{secret}",
                    at_key=True,
                )
            elif secret in RESERVED_ENV:
                collector.add(
                    ("orchestrator", "accounts", account, "secrets", secret),
                    _reserved(secret),
                    at_key=True,
                )


def _check_requires(services: dict[str, Any], collector: _Collector) -> None:
    """``requires`` names other services of the suite."""
    for name, service in services.items():
        required = service.get("requires") if isinstance(service, dict) else None
        if not isinstance(required, list):
            continue
        for index, member in enumerate(required):
            path: KeyPath = ("mcp_services", name, "requires", index)
            if not isinstance(member, str) or path in collector.flagged:
                continue
            if member == name:
                collector.add(path, f"{name!r} cannot require itself")
            elif member not in services:
                known = ", ".join(sorted(services))
                collector.add(path, f"no service named {member!r} in mcp_services ({known})")


def _check_profiles(profiles: object, services: set[str], collector: _Collector) -> None:
    if not isinstance(profiles, dict):
        return
    for name, profile in profiles.items():
        members = profile.get("services") if isinstance(profile, dict) else None
        if not isinstance(members, list):
            continue
        for index, member in enumerate(members):
            path: KeyPath = ("profiles", name, "services", index)
            if isinstance(member, str) and member not in services and path not in collector.flagged:
                known = ", ".join(sorted(services))
                collector.add(path, f"no service named {member!r} in mcp_services ({known})")


def _check_roots(roots: object, collector: _Collector) -> None:
    if not isinstance(roots, list):
        return
    for index, root in enumerate(roots):
        path: KeyPath = ("orchestrator", "allowed_mount_roots", index)
        if not isinstance(root, str) or path in collector.flagged:
            continue
        problem = _root_problem(root)
        if problem is not None:
            collector.add(path, problem)


def _root_problem(root: str) -> str | None:
    """Why ``root`` cannot be a mount root, if it cannot."""
    if "\0" in root:
        return "a mount root must not contain a NUL character"
    if ".." in root.split("/"):
        return f"{root!r} must not contain '..' components"
    if posixpath.normpath(root) == "/":
        return "'/' cannot be a mount root: it would allow every host path"
    return None


def _check_size(
    mapping: dict[str, Any], path: KeyPath, minimum: int, collector: _Collector
) -> None:
    key = path[-1]
    if key not in mapping or path in collector.flagged:
        return
    value = mapping[key]
    if isinstance(value, bool):  # YAML "yes" is a boolean, and bool is an int in Python
        collector.add(path, f"expected a size such as '512m', got a boolean ({value!r})")
        return
    try:
        size = parse_size(value)
    except ValueError as exc:
        collector.add(path, str(exc))
        return
    if size < minimum:
        collector.add(path, f"{value!r} is too small: the minimum is {minimum} bytes")


def _check_duration(
    mapping: dict[str, Any],
    path: KeyPath,
    collector: _Collector,
    *,
    at_most: tuple[float, str] | None = None,
) -> None:
    """A duration that parses (and, ``at_most``, is no longer than its seconds, else why)."""
    value = mapping.get(str(path[-1]))
    if isinstance(value, str) and path not in collector.flagged:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            collector.add(path, str(exc))
            return
        if at_most is not None and seconds > at_most[0]:
            collector.add(path, f"{value!r} is longer than {at_most[0]:g}s: {at_most[1]}")


def _check_service(name: str, service: dict[str, Any], collector: _Collector) -> None:
    base: KeyPath = ("mcp_services", name)
    _check_duration(service, (*base, "timeout"), collector)
    resources = service.get("resources")
    if isinstance(resources, dict):
        _check_size(resources, (*base, "resources", "memory"), MIN_MEMORY_BYTES, collector)
    security = service.get("security")
    if isinstance(security, dict):  # (a size of 0 would be an unbounded tmpfs)
        _check_size(security, (*base, "security", "tmp_size"), MIN_TMP_BYTES, collector)
    env = service.get("env")
    if isinstance(env, dict):
        for reserved in sorted(RESERVED_ENV.keys() & env.keys()):
            collector.add((*base, "env", reserved), _reserved(reserved), at_key=True)
    _check_secrets(service, base, collector)
    _check_egress(service, base, collector)
    _check_lifecycle(name, service, collector)


def _check_egress(service: dict[str, Any], base: KeyPath, collector: _Collector) -> None:
    """Each entry is host:port; a service with an allowlist has no network of its own, so a
    ``network`` other than none would contradict it."""
    egress = service.get("egress")
    if not isinstance(egress, list):
        return
    for index, entry in enumerate(egress):
        path: KeyPath = (*base, "egress", index)
        if isinstance(entry, str) and path not in collector.flagged:
            try:
                parse_destination(entry)
            except ValueError as exc:
                collector.add(path, str(exc))
    network = service.get("network")
    if isinstance(network, str) and network != "none":
        collector.add(
            (*base, "network"),
            f"network {network!r} and egress exclude each other: with egress the container has "
            "no network of its own and reaches the listed destinations through the "
            "orchestrator's proxy; remove network",
        )


def _check_secrets(service: dict[str, Any], base: KeyPath, collector: _Collector) -> None:
    """A secret delivered as the environment variable NAME must not fight over NAME with
    ``env`` (which value would the server get?) nor take the `config` variable."""
    secrets = service.get("secrets")
    if not isinstance(secrets, dict):
        return
    env = service.get("env")
    env_names = set(env) if isinstance(env, dict) else set()
    for secret in secrets:
        path: KeyPath = (*base, "secrets", secret)
        if path in collector.flagged:
            continue
        if secret in RESERVED_ENV:
            collector.add(path, _reserved(secret), at_key=True)
        elif secret in env_names:
            collector.add(
                path,
                f"{secret!r} is also set under env: the server would get one of two values; "
                f"remove env.{secret}",
                at_key=True,
            )


# smart_refresh's bounds: when a container is replaced. Meaningless under another strategy.
REFRESH_BOUNDS = ("max_calls_per_container", "max_container_age", "memory_threshold")
# The raw data's strategy in force, as Service.strategy gives it once the suite is loaded.
_TYPE_DEFAULT_STRATEGY = {"tool_service": "reuse_per_session", "llm_agent": "fresh_per_call"}


def _check_lifecycle(name: str, service: dict[str, Any], collector: _Collector) -> None:
    """The container lifecycle's fields agree with each other.

    A bound set under a strategy that does not read it would be silently ignored, and a
    smart_refresh without any bound would never refresh: both are errors, naming the fix.
    """
    base: KeyPath = ("mcp_services", name)
    _check_duration(service, (*base, "max_container_age"), collector)
    _check_size(service, (*base, "memory_threshold"), MIN_MEMORY_BYTES, collector)
    _check_threshold_below_limit(service, base, collector)
    strategy = service.get("container_strategy")
    service_type = service.get("service_type", "tool_service")
    if {(*base, "container_strategy"), (*base, "service_type")} & collector.flagged:
        return  # the schema already said what is wrong there; the strategy in force is unknown
    if strategy is None:
        strategy = _TYPE_DEFAULT_STRATEGY.get(str(service_type))
        in_force = f"{strategy}, the default for service_type {service_type}"
    else:
        in_force = str(strategy)
    if service.get("workspace") == "isolated" and strategy != "fresh_per_call":
        # A copy per task, handed back when the task ends: a container that outlives its call
        # would keep working on a copy nobody reads again.
        collector.add(
            (*base, "workspace"),
            f"isolated needs container_strategy: fresh_per_call (a copy of the project per "
            f"call), and this service's strategy is {in_force}; set container_strategy: "
            "fresh_per_call, or workspace: shared",
        )
    bounds = [key for key in REFRESH_BOUNDS if service.get(key) is not None]
    if strategy == "smart_refresh":
        if not bounds:
            collector.add(
                (*base, "container_strategy"),
                "smart_refresh needs at least one of max_calls_per_container, "
                "max_container_age or memory_threshold (when to replace the container), "
                "e.g. max_calls_per_container: 20",
            )
        return
    for key in bounds:
        collector.add(
            (*base, key),
            f"only read with container_strategy: smart_refresh, and this service's strategy "
            f"is {in_force}; set container_strategy: smart_refresh, or remove {key}",
            at_key=True,
        )


def _check_threshold_below_limit(
    service: dict[str, Any], base: KeyPath, collector: _Collector
) -> None:
    """A memory threshold at or above the memory limit is never reached: the engine stops the
    container at its limit first (a crash under the call in flight instead of a replacement
    between calls)."""
    path: KeyPath = (*base, "memory_threshold")
    threshold = service.get("memory_threshold")
    resources = service.get("resources")
    limit = resources.get("memory") if isinstance(resources, dict) else None
    if limit is None:
        limit = Resources().memory
    if path in collector.flagged or (*base, "resources", "memory") in collector.flagged:
        return  # the value itself is wrong, and said so
    if not _is_size(threshold) or not _is_size(limit):
        return
    if parse_size(threshold) >= parse_size(limit):
        collector.add(
            path,
            f"{threshold!r} is not below the memory limit ({limit!r}, resources.memory): the "
            "container would be stopped at its limit before it is replaced; lower "
            "memory_threshold or raise resources.memory",
        )


def _is_size(value: object) -> TypeGuard[str | int]:
    if isinstance(value, bool) or not isinstance(value, str | int):
        return False
    try:
        parse_size(value)
    except ValueError:
        return False
    return True
