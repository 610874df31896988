"""Which browser origins and Host names may reach the endpoint (DNS rebinding defence).

MCP servers must validate ``Origin``: a request whose ``Origin`` header is present and not
allowed is refused with HTTP 403. A missing header (every non-browser client) is allowed.
Loopback origins are always allowed; others only when listed in the suite.

The ``Host`` header is checked too: a DNS-rebinding page reaches a loopback server under a
foreign host name. Allowed: loopback names and the address the orchestrator listens on (any
port); when it listens on a wildcard address, every host is accepted. Pure.
"""

from __future__ import annotations

import functools
import logging
from typing import Any
from urllib.parse import urlsplit

from .._reasons import ORIGIN_OR_HOST_NOT_ALLOWED

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    if origin is None:
        return True
    normalised = origin.strip().rstrip("/").lower()
    if normalised in allowed:
        return True
    try:
        parts = urlsplit(normalised)
        host = parts.hostname
        _ = parts.port  # raises ValueError for a malformed port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and host in LOOPBACK_HOSTS


def normalise_origins(origins: list[str]) -> frozenset[str]:
    return frozenset(origin.strip().rstrip("/").lower() for origin in origins)


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 (recognised, not bound)


def allowed_hosts(bind_host: str) -> frozenset[str] | None:
    """The Host names to accept for a server bound to ``bind_host`` (None: accept any)."""
    host = bind_host.strip("[]").lower()
    if host in WILDCARD_HOSTS:
        return None
    return LOOPBACK_HOSTS | {host}


def host_allowed(host_header: str | None, allowed: frozenset[str] | None) -> bool:
    if allowed is None:
        return True
    if not host_header:
        return False  # HTTP/1.1 requires Host; only a hand-made request lacks it
    return _host_in(host_header, allowed)


# A client sends the same Host on every request: its verdict is remembered (a bounded cache, so
# Hosts that change on every request only cost what they cost without it).
@functools.lru_cache(maxsize=64)
def _host_in(host_header: str, allowed: frozenset[str]) -> bool:
    try:
        name = urlsplit(f"//{host_header.strip()}").hostname
    except ValueError:
        return False
    return name is not None and name.lower() in allowed


def request_headers(scope: dict[str, Any]) -> dict[bytes, str]:
    """An ASGI request's headers by lower-case name (the last of repeated ones wins)."""
    return {bytes(key).lower(): bytes(value).decode("latin-1") for key, value in scope["headers"]}


def request_allowed(
    headers: dict[bytes, str],
    *,
    allowed_origins: frozenset[str],
    allowed_hosts: frozenset[str] | None,
    path: str,
) -> bool:
    """The Origin and Host checks every endpoint applies before anything else; logs a refusal."""
    origin, host = headers.get(b"origin"), headers.get(b"host")
    if origin_allowed(origin, allowed_origins) and host_allowed(host, allowed_hosts):
        return True
    log.warning(
        "request_refused",
        extra={
            "origin": origin,
            "host": host,
            "path": path,
            "code": -32004,
            "reason": ORIGIN_OR_HOST_NOT_ALLOWED,
        },
    )
    return False
