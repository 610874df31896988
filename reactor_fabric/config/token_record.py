"""Each running orchestrator's token, recorded for its own user and keyed by the port it listens
on, so that ``reactor-fabric connect`` finds it with no environment.

Why: MCP clients (the Python SDKs, fastmcp, langchain, the Inspector) start a stdio server with a
handful of variables (``HOME``, ``PATH``, ``USER``, …), so ``REACTOR_FABRIC_TOKEN`` never reaches
the bridge; an orchestrator started with ``--token`` or the variable would refuse it. The
orchestrator writes ``port-PORT.token`` at start and removes it at exit; the bridge dialling a
loopback URL reads the record of the URL's port after ``REACTOR_FABRIC_TOKEN`` and before the
default token file (:func:`find_bridge_token`).

Where: the first of ``$XDG_RUNTIME_DIR``, ``/run/user/UID`` that is a directory of the user's own
(no access for others), else the configuration directory; then ``reactor-fabric/`` in it. The
bridge's client rarely passes ``XDG_RUNTIME_DIR``, so ``/run/user/UID`` (what it normally is)
is looked at in any case; ``HOME`` is passed, so the configuration directory agrees too.

Safety: the ``reactor-fabric`` directory must be the user's, not a symlink, writable by nobody
else (made 0700 when missing); a record is written to a private temporary file (0600)
and renamed into place, so a reader never sees half a token, and read with ``O_NOFOLLOW`` under
the same checks as the token file. Anything else is refused with a :class:`TokenError` — never
used, never replaced. The orchestrator removes the record at exit only while it is still the file
it wrote (same inode and content, which holds a random mark of its own); the bridge removes
nothing. A record left by a killed orchestrator is replaced by the next start on that port.

Two orchestrators of one user on one port (possible only on two different addresses, e.g.
127.0.0.1 and 192.168.1.5) share the record: the later start's token is there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from .token import (
    MAX_TOKEN_LENGTH,
    TOKEN_ENV,
    Token,
    TokenError,
    find_token,
    read_token_file,
    token_file,
    user_config_dir,
)
from .xdg import APP_DIR

RUN_USER = Path("/run/user")
# The record: the token's line, then a line naming the orchestrator that wrote it.
_MAX_RECORD = MAX_TOKEN_LENGTH + 128


@dataclass(frozen=True)
class TokenRecord:
    """A record this process wrote: what :func:`remove_record` checks before removing it."""

    path: Path
    device: int
    inode: int
    content: bytes


def record_name(port: int) -> str:
    return f"port-{port}.token"


def record_directories(environ: dict[str, str], euid: int, run_user: Path = RUN_USER) -> list[Path]:
    """The directories a record may be in, in order: the usable runtime directories, then the
    configuration directory (always; made when written)."""
    bases: list[Path] = []
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        bases.append(Path(runtime))
    bases.append(run_user / str(euid))
    found: list[Path] = []
    for base in bases:
        candidate = base / APP_DIR
        if candidate not in found and _usable_runtime(base, euid):
            found.append(candidate)
    config = user_config_dir(environ)
    if config not in found:
        found.append(config)
    return found


def _usable_runtime(base: Path, euid: int) -> bool:
    """A runtime directory as XDG says it must be: the user's own, no access for others."""
    try:
        info = os.lstat(base)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == euid and not info.st_mode & 0o077


def _check_directory(path: Path, euid: int) -> bool:
    """Whether ``path`` exists (False: it does not); raises TokenError unless it is a real
    directory of ``euid``'s that nobody else may enter."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise TokenError(f"cannot use {path}: {exc.strerror}") from exc
    if stat.S_ISLNK(info.st_mode):
        raise TokenError(f"{path} is a symlink; token records are kept only in a real directory")
    if not stat.S_ISDIR(info.st_mode):
        raise TokenError(f"{path} is not a directory; remove it")
    if info.st_uid != euid:
        raise TokenError(f"{path} belongs to uid {info.st_uid}, not to you; remove it")
    # Not writable by others is what matters: nobody else can put or replace a file there
    # (a record itself is checked to be ours and 0600). Readable is allowed: the user's own
    # ~/.config/reactor-fabric, which also holds their suite, is often 0755; we make it 0700.
    if info.st_mode & 0o022:
        raise TokenError(
            f"{path} is writable by other users (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"run: chmod 700 {path}"
        )
    return True


def write_record(
    environ: dict[str, str], port: int, token: str, *, run_user: Path = RUN_USER
) -> TokenRecord:
    """Record ``token`` for ``port`` in the first record directory (replacing a record there);
    raises TokenError when the directory is not safe to write in."""
    euid = os.geteuid()
    directory = record_directories(environ, euid, run_user)[0]
    if not _check_directory(directory, euid):
        try:
            directory.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass  # made meanwhile: checked below
        except OSError as exc:
            raise TokenError(f"cannot make {directory}: {exc.strerror}") from exc
        _check_directory(directory, euid)
    path = directory / record_name(port)
    content = f"{token}\norchestrator {os.getpid()} {secrets.token_hex(8)}\n".encode()
    scratch = directory / f".{path.name}.{secrets.token_hex(8)}"
    try:
        fd = os.open(
            scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        raise TokenError(f"cannot write the token record {path}: {exc.strerror}") from exc
    try:
        try:
            os.write(fd, content)
            info = os.fstat(fd)
        finally:
            os.close(fd)
        os.rename(scratch, path)  # replaces a record left by an orchestrator that was killed
    except OSError as exc:
        scratch.unlink(missing_ok=True)
        raise TokenError(f"cannot write the token record {path}: {exc.strerror}") from exc
    return TokenRecord(path, info.st_dev, info.st_ino, content)


def remove_record(record: TokenRecord) -> bool:
    """Remove ``record`` if it is still the file this process wrote; whether it was removed.

    Another orchestrator started on the port since (on another address) has replaced it: that
    one's record stays. Never raises: the orchestrator is stopping anyway.
    """
    try:
        fd = os.open(record.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (record.device, record.inode):
            return False
        if os.read(fd, _MAX_RECORD + 1) != record.content:
            return False
    except OSError:
        return False
    finally:
        os.close(fd)
    # Another start renaming its record into place between the check and this unlink would
    # lose its record: two orchestrators of one user on one port, stopping and starting in the
    # same instant; its bridges then use the variable or the token file.
    with contextlib.suppress(OSError):
        os.unlink(record.path)
        return True
    return False


def read_record(environ: dict[str, str], port: int, *, run_user: Path = RUN_USER) -> Token | None:
    """The token recorded for ``port``, from the first record directory that holds one; None
    when none does. Raises TokenError for a record or directory that is not safe to read."""
    euid = os.geteuid()
    for directory in record_directories(environ, euid, run_user):
        path = directory / record_name(port)
        try:
            if not _check_directory(directory, euid):
                continue
        except TokenError:
            # Refused only when it holds a record for the port: a bridge that never needed
            # one goes on to the default file as before.
            if os.path.lexists(path):
                raise
            continue
        value = read_token_file(path, kind="token record", euid=euid, limit=_MAX_RECORD)
        if value is not None:
            return Token(value, str(path))
    return None


def find_bridge_token(
    environ: dict[str, str], port: int | None, *, run_user: Path = RUN_USER
) -> Token | None:
    """The token the bridge sends: ``REACTOR_FABRIC_TOKEN``, else — for an orchestrator on this
    machine's loopback (``port`` given; None: another host) — the record of the orchestrator
    on ``port``, else the default token file; None when none is there (the bridge never makes
    one).

    Both files hold a local orchestrator's token: another machine is sent only what the user
    gave in the variable. On loopback the bridge sends it only to a listener that is the
    user's (``trio.bridge.open_orchestrator_stream``): a port is not a credential."""
    if environ.get(TOKEN_ENV):
        return find_token(environ)
    if port is None:
        return None
    recorded = read_record(environ, port, run_user=run_user)
    if recorded is not None:
        return recorded
    return find_token(environ)


def searched(environ: dict[str, str], port: int | None, *, run_user: Path = RUN_USER) -> str:
    """Where :func:`find_bridge_token` looks, in words (for a refused token's detail)."""
    places = [TOKEN_ENV]
    if port is None:
        return f"{TOKEN_ENV} only (the URL is not this machine's loopback)"
    places.extend(
        str(directory / record_name(port))
        for directory in record_directories(environ, os.geteuid(), run_user)
    )
    places.append(str(token_file(environ)))
    return ", then ".join(places)
