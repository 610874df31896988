"""The orchestrator's access token: where it comes from, and how its file is kept private.

In order: ``--token``, then ``REACTOR_FABRIC_TOKEN``, then the file
``${XDG_CONFIG_HOME:-~/.config}/reactor-fabric/token``, which the orchestrator creates on its
first start (32 random bytes, URL-safe base64) and which ``reactor-fabric connect`` reads.

The file is a secret: it is created with ``O_EXCL`` (mode 0600, in a 0700 directory), read with
``O_NOFOLLOW``, and refused — not silently used — when it is a symlink, not a regular file, not
the user's own, or readable by group or others, since then someone else may have it or may have
chosen it. Two orchestrators starting at once agree on one token (the loser of ``O_EXCL`` reads
the winner's file).

Error handling: everything wrong is a :class:`TokenError` whose message says what to do.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import string
from dataclasses import dataclass
from pathlib import Path

from .xdg import xdg_dir

TOKEN_ENV = "REACTOR_FABRIC_TOKEN"  # noqa: S105 - a name, not a secret
TOKEN_FILE_NAME = "token"  # noqa: S105 - a name, not a secret
MIN_TOKEN_LENGTH = 16
MAX_TOKEN_LENGTH = 512
# Header- and URL-safe without quoting: what token_urlsafe makes, plus a few harmless extras.
TOKEN_ALPHABET = frozenset(string.ascii_letters + string.digits + "-_.~+/=")
TOKEN_BYTES = 32


class TokenError(Exception):
    """The token cannot be used as it is; the message says what to fix."""


@dataclass(frozen=True)
class Token:
    value: str
    origin: str  # "--token", the variable's name, or the file's path — for the start-up line


def user_config_dir(environ: dict[str, str]) -> Path:
    """``${XDG_CONFIG_HOME:-~/.config}/reactor-fabric``: the user's own configuration."""
    return xdg_dir(environ, "XDG_CONFIG_HOME", ".config")


def token_file(environ: dict[str, str]) -> Path:
    return user_config_dir(environ) / TOKEN_FILE_NAME


def check_token(value: str, origin: str) -> str:
    value = value.strip()
    if not MIN_TOKEN_LENGTH <= len(value) <= MAX_TOKEN_LENGTH:
        raise TokenError(
            f"the token from {origin} must be {MIN_TOKEN_LENGTH} to {MAX_TOKEN_LENGTH} characters "
            f"long (it is {len(value)})"
        )
    if not set(value) <= TOKEN_ALPHABET:
        raise TokenError(
            f"the token from {origin} may only hold letters, digits and '-_.~+/=' (it must "
            "travel in a header and a URL as it is)"
        )
    return value


def find_token(environ: dict[str, str], explicit: str | None = None) -> Token | None:
    """The token from ``--token``, the environment or the file; None when there is none yet."""
    if explicit is not None:
        return Token(check_token(explicit, "--token"), "--token")
    from_env = environ.get(TOKEN_ENV)
    if from_env:
        return Token(check_token(from_env, TOKEN_ENV), TOKEN_ENV)
    path = token_file(environ)
    value = read_token_file(path)
    return None if value is None else Token(value, str(path))


def load_or_create_token(environ: dict[str, str], explicit: str | None = None) -> Token:
    """:func:`find_token`, creating the file with a fresh token when there is none."""
    found = find_token(environ, explicit)
    if found is not None:
        return found
    path = token_file(environ)
    return Token(create_token_file(path), str(path))


def read_token_file(
    path: Path, *, kind: str = "token file", euid: int | None = None, limit: int = 0
) -> str | None:
    """The token on the first line of ``path``; None if it does not exist.

    Refuses, with what to do, a symlink, anything but a regular file, a file not ``euid``'s
    (default: this process's) and one others could read or write: the token file, and the
    records of :mod:`.token_record` (``kind`` names which in the messages; ``limit``: how many
    bytes it may hold, default a token and its newline).
    """
    data = read_private_file(
        path,
        kind=kind,
        limit=(limit or MAX_TOKEN_LENGTH + 1) + 1,
        euid=euid,
        widened=f"run: chmod 600 {path}",
    )
    if data is None:
        return None
    try:
        first = data.decode("ascii").partition("\n")[0]
    except UnicodeDecodeError:
        raise TokenError(f"{path} does not hold a token; remove it") from None
    return check_token(first, str(path))


def read_private_file(
    path: Path, *, kind: str, limit: int, euid: int | None = None, widened: str
) -> bytes | None:
    """At most ``limit`` bytes of the private file ``path`` (a secret of the user's); None if it
    does not exist. TokenError, saying what to do, for a symlink, anything but a regular file,
    a file not ``euid``'s (default: this process's), and one others could read or write
    (``widened``: what to do then)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TokenError(
                f"{path} is a symlink; remove it (a {kind} must be a plain file)"
            ) from exc
        raise TokenError(f"cannot read the {kind} {path}: {exc.strerror}") from exc
    owner = os.geteuid() if euid is None else euid
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TokenError(f"{path} is not a regular file; remove it")
        if info.st_uid != owner:
            raise TokenError(f"{path} belongs to uid {info.st_uid}, not to you; remove it")
        if info.st_mode & 0o077:
            raise TokenError(
                f"{path} is readable or writable by others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); {widened}"
            )
        return os.read(fd, limit)
    finally:
        os.close(fd)


def create_token_file(path: Path) -> str:
    """Write a fresh token to ``path`` (0600; its directory made 0700); if another process made
    the file first, its token.

    The token is written to a private temporary file first and then linked into place, so that
    nobody ever reads a half-written token file, and ``link`` (which never replaces) decides
    atomically between two orchestrators starting at once.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    value = secrets.token_urlsafe(TOKEN_BYTES)
    scratch = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    try:
        fd = os.open(
            scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        raise TokenError(f"cannot create the token file {path}: {exc.strerror}") from exc
    try:
        try:
            os.write(fd, f"{value}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(scratch, path)
    except FileExistsError:
        existing = read_token_file(path)
        if existing is None:  # made and removed again meanwhile: try once more
            return create_token_file(path)
        return existing
    except OSError as exc:
        raise TokenError(f"cannot create the token file {path}: {exc.strerror}") from exc
    finally:
        scratch.unlink(missing_ok=True)
    return value
