"""Where the stdio bridge keeps its sign-ins (``auth.mode: oidc``): one private file per issuer,
``${XDG_CONFIG_HOME:-~/.config}/reactor-fabric/sign-in/<hash of the issuer>.json``, holding the
client the bridge registered with that issuer and the tokens it got for each orchestrator.

The file holds refresh tokens — credentials that last — so it is kept as the orchestrator's
token file is (:mod:`.token`): written to a private temporary file (0600, in a 0700 directory)
and renamed into place, read with ``O_NOFOLLOW``, and refused, with what to do, when it is a
symlink, not a regular file, not the user's, or open to others. At most
:data:`MAX_RECORD_BYTES`.

Error handling: everything wrong is a :class:`~.token.TokenError` whose message says what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from .token import TokenError, read_private_file, user_config_dir

SIGN_IN_DIRECTORY = "sign-in"
MAX_RECORD_BYTES = 256 * 1024


def sign_in_file(environ: dict[str, str], issuer: str) -> Path:
    """The file of ``issuer``'s sign-ins (named by a hash: an issuer URL is no file name)."""
    name = hashlib.sha256(issuer.encode()).hexdigest()[:32]
    return user_config_dir(environ) / SIGN_IN_DIRECTORY / f"{name}.json"


def load_sign_in(path: Path) -> dict[str, Any] | None:
    """The record at ``path`` (None: there is none); TokenError when it cannot be trusted."""
    data = read_private_file(
        path,
        kind="sign-in file",
        limit=MAX_RECORD_BYTES + 1,
        widened="remove it and sign in again",
    )
    if data is None:
        return None
    try:
        record = json.loads(data) if len(data) <= MAX_RECORD_BYTES else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise TokenError(f"{path} is not a sign-in record; remove it and sign in again")
    return record


def save_sign_in(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` whole (a reader sees the old file or the new one)."""
    data = json.dumps(record, indent=1).encode()
    if len(data) > MAX_RECORD_BYTES:
        raise TokenError(f"the sign-in record for {path} would be over {MAX_RECORD_BYTES} bytes")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    scratch = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    try:
        fd = os.open(
            scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(scratch, path)
    except OSError as exc:
        raise TokenError(f"cannot write the sign-in file {path}: {exc.strerror}") from exc
    finally:
        scratch.unlink(missing_ok=True)
