"""A suite's secrets, resolved once: each service's values, or why it cannot have them.

A service's ``secrets: {NAME: {env: VAR} | {file: PATH}, as: …}`` are read here from the
orchestrator's environment and files, when it starts (and by ``validate-config --secrets``).
A service with a missing or refused source is not an error of the suite: that service alone is
refused (its containers are never created, -32002 ``secret_unavailable``), the others serve.

A file source must be a regular file owned by the orchestrator's user, readable by no one
else (no group or other permission bits): a credential others can read is already leaked, and
serving it would hide that. The message names the fix (``chmod 600 PATH``).

Nothing here ever puts a value into a message: the problems name the secret, its source and
what is wrong with it. :class:`Secret` keeps its value out of ``repr``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .._reasons import ACCOUNT_UNAVAILABLE, SECRET_UNAVAILABLE
from .structs import Account, SecretDelivery, SecretSource, Service, Suite

# Where the server finds a secret delivered as a file (Docker's and Kubernetes' convention).
SECRETS_DIR = "/run/secrets"
# A secret is a token or a key, not a document: a larger file is refused rather than read
# whole into memory and into every container.
MAX_SECRET_BYTES = 64 * 1024
# Shorter values are not redacted from text (see reactor_fabric.observe.redaction): replacing
# every "1" in a log line would say more than it hides. Such a value is refused here.
MIN_SECRET_CHARS = 4


@dataclass(frozen=True)
class Secret:
    """One resolved secret: its name, how it is delivered, and its value (never shown)."""

    name: str
    delivery: SecretDelivery
    value: str = field(repr=False)

    @property
    def as_env(self) -> bool:
        return self.delivery in ("env", "both")

    @property
    def as_file(self) -> bool:
        return self.delivery in ("file", "both")


@dataclass(frozen=True)
class ServiceSecrets:
    """A service's secrets: all of them, or the problems that refuse the service (and the
    reason its start is refused with)."""

    secrets: tuple[Secret, ...] = ()
    problems: tuple[str, ...] = ()
    reason: str = SECRET_UNAVAILABLE

    @property
    def available(self) -> bool:
        return not self.problems

    def values(self) -> list[str]:
        return [secret.value for secret in self.secrets]


class SecretUnreadable(Exception):
    """A file source cannot be used; the message says why and how to fix it (no value)."""


def read_secret_file(path: str, *, uid: int | None = None) -> str:
    """The value of the secret file ``path``: checked (a regular file, owned by ``uid``, the
    orchestrator's by default, with no group or other permissions, at most MAX_SECRET_BYTES)
    on the descriptor it is read from, so that nothing can be swapped in between. One trailing
    newline (``echo TOKEN > file``) is dropped. Blocking."""
    owner = os.geteuid() if uid is None else uid
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SecretUnreadable(f"{path}: no such file") from None
    except OSError as exc:
        raise SecretUnreadable(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretUnreadable(f"{path}: not a regular file")
        if info.st_uid != owner:
            raise SecretUnreadable(
                f"{path}: owned by uid {info.st_uid}, not by the orchestrator's user "
                f"(uid {owner}); fix: chown {owner} {path}"
            )
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            mode = stat.S_IMODE(info.st_mode)
            raise SecretUnreadable(
                f"{path}: mode {mode:04o} lets others than its owner read or change it; "
                f"fix: chmod 600 {path}"
            )
        if info.st_size > MAX_SECRET_BYTES:
            raise SecretUnreadable(
                f"{path}: {info.st_size} bytes, more than a secret may hold "
                f"({MAX_SECRET_BYTES} bytes)"
            )
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretUnreadable(f"{path}: more than {MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretUnreadable(f"{path}: not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r")


def resolve_service_secrets(
    service: Service,
    *,
    environ: Mapping[str, str],
    read_file: Callable[[str], str] = read_secret_file,
    accounts: Mapping[str, Account] | None = None,
) -> ServiceSecrets:
    """Resolve every secret of ``service``; a problem per secret that cannot be had. An agent
    naming a model account (``config.account``) gets that account's secrets before its own;
    one naming an account ``accounts`` lacks is refused (``account_unavailable``)."""
    sources: list[tuple[str, SecretSource]] = []
    account_name = service.account
    if account_name is not None:
        account = (accounts or {}).get(account_name)
        if account is None:
            return ServiceSecrets(
                problems=(f"account {account_name!r} is not defined under orchestrator.accounts",),
                reason=ACCOUNT_UNAVAILABLE,
            )
        sources += [(name, source) for name, source in account.secrets.items()]
    sources += list(service.secrets.items())
    resolved: list[Secret] = []
    problems: list[str] = []
    for name, source in sources:
        try:
            value = _value_of(source, environ, read_file)
        except SecretUnreadable as exc:
            where = f"account {account_name}'s " if name not in service.secrets else ""
            problems.append(f"{where}secret {name}: {exc}")
            continue
        resolved.append(Secret(name, source.as_, value))
    if problems:
        return ServiceSecrets(problems=tuple(problems))
    return ServiceSecrets(secrets=tuple(resolved))


def _value_of(
    source: SecretSource, environ: Mapping[str, str], read_file: Callable[[str], str]
) -> str:
    if source.env is not None:
        value = environ.get(source.env)
        if value is None:
            raise SecretUnreadable(
                f"the variable {source.env} is not set in the orchestrator's environment"
            )
    else:
        assert source.file is not None  # the schema asks for exactly one source
        value = read_file(source.file)
    if len(value) < MIN_SECRET_CHARS:
        raise SecretUnreadable(f"the value has fewer than {MIN_SECRET_CHARS} characters (empty?)")
    if "\0" in value:
        raise SecretUnreadable("the value contains a NUL character")
    return value


def resolve_suite_secrets(
    suite: Suite,
    *,
    environ: Mapping[str, str] | None = None,
    read_file: Callable[[str], str] = read_secret_file,
    services: Iterable[str] | None = None,
) -> dict[str, ServiceSecrets]:
    """Every service's secrets that has any, its account's included (``services``: only
    these). Blocking (files)."""
    env = os.environ if environ is None else environ
    names = suite.mcp_services if services is None else services
    accounts = suite.orchestrator.accounts
    return {
        name: resolve_service_secrets(
            suite.mcp_services[name], environ=env, read_file=read_file, accounts=accounts
        )
        for name in names
        if suite.mcp_services[name].secrets or suite.mcp_services[name].account is not None
    }
