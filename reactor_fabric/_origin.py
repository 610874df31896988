"""Which browser origins may open a connection (DNS rebinding / cross-site hijacking defence).

MCP servers must validate ``Origin``: a request whose ``Origin`` header is present and not
allowed is refused with HTTP 403. A missing header (every non-browser client) is allowed.
Loopback origins are always allowed; others only when listed in the suite. Pure.
"""

from __future__ import annotations

from urllib.parse import urlsplit

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
