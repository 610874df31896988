"""Who holds the other end of a loopback TCP connection: whether the stdio bridge may send its
token to the listener it reached.

Why: on loopback, a port is not a credential. Any local user may bind ``127.0.0.1:PORT`` while
the orchestrator is not running (not started yet, restarting, stopped), and ``[::1]:PORT`` —
a separate socket — while it runs on ``127.0.0.1``; a bridge dialling the port (``localhost``
resolves to ``::1`` first on Debian and Ubuntu) would send the user's token to that other user.
So before sending anything the bridge asks the kernel who owns the socket that accepted its
connection: the uid in ``/proc/net/tcp`` (``tcp6``) of the entry whose local address is the
bridge's peer and whose remote address is the bridge's own end. That uid is the one the
listener was created with (an accepted socket inherits it), which no unprivileged process can
choose. The connection is the one the bridge then uses: no window between the check and the
use.

Trusted: the bridge's own user (who can read the token file anyway), root (who can read
everything), and an account the user names (``connect --orchestrator-user``, for an
orchestrator run as a service account). Anything else — another user's listener, an entry not
found, a socket that is no longer a live connection (a time-wait entry shows uid 0: a listener
that closed at once must not pass for root's) — is not the user's orchestrator.

I/O: reads ``/proc/net/tcp`` and ``/proc/net/tcp6`` of this process's network namespace, line
by line (bounded: it stops at the match). Blocking: callers run it in a worker thread.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass

ROOT = 0
PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
# The states of a socket that still has its owner's uid in the table: established, and the
# request socket of a connection not yet accepted (syn-recv, shown with its listener's uid).
# Everything else may be a time-wait entry, printed with uid 0.
_LIVE_STATES = frozenset({"01", "03"})
# /proc/net/tcp's columns: sl, local, remote, st, tx:rx queue, tr:when, retrnsmt, uid, ...
_UID_COLUMN = 7

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Endpoint:
    """One end of a TCP connection: an address and a port."""

    address: Address
    port: int

    @classmethod
    def of(cls, sockname: tuple[object, ...]) -> Endpoint:
        """From a socket's ``getsockname()`` / ``getpeername()`` (IPv4 or IPv6 form)."""
        return cls(_plain(ipaddress.ip_address(str(sockname[0]))), int(str(sockname[1])))

    def __str__(self) -> str:
        if isinstance(self.address, ipaddress.IPv6Address):
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


def _plain(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (a dual-stack listener's view of 127.0.0.1) as IPv4."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _endpoint(field: str) -> Endpoint | None:
    """``0100007F:2255`` (IPv4) or 32 hex digits and a port (IPv6), as the kernel prints them:
    each 32-bit word of the address in the host's byte order."""
    text, _, port = field.partition(":")
    try:
        words = [int(text[i : i + 8], 16) for i in range(0, len(text), 8)]
        packed = b"".join(struct.pack("=I", word) for word in words)
        address = ipaddress.ip_address(packed)
        return Endpoint(_plain(address), int(port, 16))
    except ValueError:
        return None


def connection_owner(lines: Iterable[str], server: Endpoint, client: Endpoint) -> int | None:
    """The uid owning the server side of the connection ``client`` → ``server`` among
    ``/proc/net/tcp``-style ``lines``; None when no live entry is that connection. Pure."""
    for line in lines:
        fields = line.split()
        if len(fields) <= _UID_COLUMN or fields[3] not in _LIVE_STATES:
            continue
        if _endpoint(fields[1]) != server or _endpoint(fields[2]) != client:
            continue
        try:
            return int(fields[_UID_COLUMN])
        except ValueError:
            return None
    return None


def read_connection_owner(server: Endpoint, client: Endpoint) -> int | None:
    """:func:`connection_owner` from this network namespace's tables; None when they cannot be
    read (no /proc: nothing is sent to an owner that cannot be told). Blocking."""
    for table in PROC_NET_TCP:
        try:
            with open(table, encoding="ascii", errors="replace") as lines:
                next(lines, None)  # the heading
                owner = connection_owner(lines, server, client)
        except OSError:
            continue
        if owner is not None:
            return owner
    return None


def trusted_owner(owner: int | None, *, own_uid: int, also: Iterable[int] = ()) -> bool:
    """Whether a listener owned by ``owner`` may be sent the user's token: the user's own,
    root's, or one the user named. Pure."""
    return owner is not None and (owner in (own_uid, ROOT) or owner in set(also))
