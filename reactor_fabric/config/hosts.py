"""Which hosts and URLs are this machine's own, for the rules that trust plain http only there
(an issuer, its keys, the endpoints the bridge signs in at) and allow no authentication only
there (a loopback listener). Pure."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback_name(host: str) -> bool:
    """Whether ``host`` (a name or an address, brackets allowed) names this machine only."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def https_or_loopback(url: object) -> bool:
    """Whether ``url`` is one to fetch from or send credentials to: https with a host, or http on
    this machine."""
    if not isinstance(url, str):
        return False
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https":
        return bool(host)
    return parts.scheme == "http" and is_loopback_name(host)
