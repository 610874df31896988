"""Egress allowlists: what a container's forward proxy lets through, decided without I/O.

A service with ``egress: ["api.github.com:443", "127.0.0.1:8080", …]`` runs with no network of
its own; its clients reach the listed destinations only through the orchestrator's forward
proxy (:mod:`reactor_fabric.runtime.egress_proxy`). This module is that proxy's whole judgement, as
pure functions the tests explore exhaustively:

1. :func:`read_request` — the client's request head (``CONNECT host:port`` for a tunnel, or an
   absolute-form ``http://host:port/…`` request to forward), parsed by h11 (a well-kept
   HTTP/1.1 parser; no hand-written HTTP here) within a byte bound.
2. :func:`judge_target` — the destination as the client named it must be listed: a name as a
   name (``api.github.com:443``), an address as that address (``127.0.0.1:8080``).
3. :func:`choose_address` — the proxy resolves a name itself and checks what it resolved to,
   so that a listed name pointing at a loopback, link-local (``169.254.169.254``: the cloud's
   metadata service), private or otherwise special address is refused unless that very address
   (and port) is itself listed. DNS that changes between two lookups cannot help: the address
   checked is the address connected to.

Every refusal carries a reason from one list (``_reasons.py``); the proxy answers it 403 (400
for a request it cannot read, 502 when the connection fails) with the reason in the body, and
records it in the audit trail.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import h11

from .._reasons import (
    EGRESS_ADDRESS_REFUSED,
    EGRESS_BAD_REQUEST,
    EGRESS_NOT_LISTED,
    EGRESS_UNAUTHORIZED,
)

T = TypeVar("T")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# A request head (request line, header lines and the blank line ending them) larger than this
# is refused, measured before it is parsed: h11's own bound holds only for an incomplete head.
MAX_REQUEST_HEAD = 16 * 1024
# Where a head ends: the first blank line, as h11 finds it (a line feed, an optional carriage
# return, a line feed).
_BLANK_LINE = re.compile(b"\n\r?\n")
# A DNS name's longest textual form (RFC 1035), and one label's.
_MAX_NAME = 253
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
# Headers about the hop to the proxy, never forwarded to the destination.
_HOP_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


class EgressRefused(Exception):
    """The proxy refuses a request: ``reason`` from the list, ``status`` the HTTP answer."""

    def __init__(self, message: str, *, reason: str, status: int = 403) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


@dataclass(frozen=True, order=True)
class Destination:
    """One allowlist entry, or a destination a client asked for: a host (a lower-case name
    without a trailing dot, or an address in its canonical text) and a port."""

    host: str
    port: int

    @property
    def address(self) -> IPAddress | None:
        """The host as an address when it is one (``127.0.0.1``, ``::1``), else None."""
        return _as_address(self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _as_address(host: str) -> IPAddress | None:
    try:
        found = ipaddress.ip_address(host)
    except ValueError:
        return None
    # An IPv4 address written as IPv6 (::ffff:127.0.0.1) is that IPv4 address.
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


def normal_host(host: str) -> str:
    """``host`` as entries and requests are compared: an address in canonical text, a name
    lower-case without its trailing dot. Raises ValueError for anything else (a name with
    characters DNS does not have, an empty one, one too long)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    address = _as_address(bare)
    if address is not None:
        return str(address)
    name = bare.lower().removesuffix(".")
    if not name or len(name) > _MAX_NAME or not all(_LABEL.match(p) for p in name.split(".")):
        raise ValueError(f"{host!r} is not a host name or an address")
    if name.replace(".", "").isdigit():
        # 127.1 or 2130706433: resolvers read these as addresses; listing them as names
        # would let an address through that nobody wrote down as one.
        raise ValueError(f"{host!r} is neither a dotted-quad address nor a name")
    return name


def parse_destination(text: str) -> Destination:
    """An entry ``host:port`` (``[v6]:port`` for an IPv6 address); ValueError saying what is
    wrong (for the suite's validation)."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: write host:port (e.g. api.github.com:443)")
    if ":" in host and not host.startswith("["):
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, [::1]:8080")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return Destination(normal_host(host), int(port_text))


@dataclass(frozen=True)
class Allowlist:
    """A service's ``egress`` entries, parsed."""

    entries: frozenset[Destination]

    @classmethod
    def of(cls, texts: Iterable[str]) -> Allowlist:
        return cls(frozenset(parse_destination(text) for text in texts))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def texts(self) -> list[str]:
        return [str(entry) for entry in sorted(self.entries)]


@dataclass(frozen=True)
class EgressRecord:
    """One connection through the proxy, as the audit trail and the metrics get it.

    ``outcome``: ``connected`` (bytes passed; ``reason`` empty) or ``refused`` / ``failed``
    with the reason. ``sent``: bytes from the container to the destination; ``received``:
    back."""

    container: str
    service: str
    destination: str
    address: str
    outcome: str
    reason: str
    sent: int
    received: int
    seconds: float


# --- the request head ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProxyRequest:
    """What the client asked the proxy for.

    ``tunnel``: a CONNECT (bytes both ways once connected). ``forward``: a plain-HTTP request
    in absolute form; ``head`` is the request as the destination gets it (origin-form target,
    hop headers dropped, ``Connection: close``: one request per connection, so that a kept-alive
    client cannot send its next request, to another host, down this one). ``rest``: bytes the
    client sent after the head (the start of a tunnelled stream or of the body), to pass on.
    """

    kind: Literal["tunnel", "forward"]
    destination: Destination
    head: bytes
    rest: bytes
    # The request's Proxy-Authorization (b"" without one): who asks, on the TCP way in.
    authorization: bytes = b""


def read_request(data: bytes) -> ProxyRequest | None:
    """The request in ``data`` (everything the client sent so far): None while its head is
    incomplete; EgressRefused (400 ``egress_bad_request``) when it is not one the proxy
    serves or the head exceeds MAX_REQUEST_HEAD, and (403 ``egress_not_listed`` from
    :func:`judge_target` later) for the destination.

    The head is measured before it is parsed, however it arrived: a complete head over the
    bound read at once is refused like one that grows past it (h11 bounds only what it is
    still waiting to complete). Only the head goes to h11; what follows it is ``rest``."""
    if not data:
        return None  # (to h11, b"" would be the end of the connection)
    # Only a blank line ending within the bound ends a head that may be read.
    end = _BLANK_LINE.search(data, 0, MAX_REQUEST_HEAD)
    if end is None and len(data) >= MAX_REQUEST_HEAD:
        raise EgressRefused(
            f"the request head is over {MAX_REQUEST_HEAD} bytes",
            reason=EGRESS_BAD_REQUEST,
            status=400,
        )
    head = data if end is None else data[: end.end()]
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
    connection.receive_data(head)
    try:
        # (Given an incomplete head, h11 still refuses one that cannot be HTTP at once: a TLS
        # hello sent to the proxy in the clear is answered now, not at the bound.)
        event = connection.next_event()
    except h11.RemoteProtocolError as exc:
        raise EgressRefused(
            f"not an HTTP/1.1 request the proxy reads: {exc}",
            reason=EGRESS_BAD_REQUEST,
            status=400,
        ) from exc
    if event is h11.NEED_DATA and end is None:
        return None
    if not isinstance(event, h11.Request):
        raise EgressRefused("no request", reason=EGRESS_BAD_REQUEST, status=400)
    rest = data[len(head) :]
    target = event.target.decode("ascii", "replace")
    authorization = b"".join(
        value for name, value in event.headers.raw_items() if name.lower() == b"proxy-authorization"
    )
    if event.method == b"CONNECT":
        request = ProxyRequest("tunnel", _destination(target, default_port=None), b"", bytes(rest))
    else:
        request = _forward(event, target, bytes(rest))
    return ProxyRequest(
        request.kind, request.destination, request.head, request.rest, authorization
    )


def _destination(authority: str, *, default_port: int | None) -> Destination:
    host, sep, port_text = authority.rpartition(":")
    if not sep or (host.count(":") and not host.endswith("]")):
        # No port (or the colons of a bare IPv6 address): the default when there is one.
        host, port_text = authority, "" if default_port is None else str(default_port)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise EgressRefused(f"{authority!r} names no port", reason=EGRESS_BAD_REQUEST, status=400)
    try:
        return Destination(normal_host(host), int(port_text))
    except ValueError as exc:
        raise EgressRefused(str(exc), reason=EGRESS_BAD_REQUEST, status=400) from exc


def _forward(event: h11.Request, target: str, rest: bytes) -> ProxyRequest:
    if not target.lower().startswith("http://"):
        raise EgressRefused(
            "the proxy forwards http:// requests in absolute form and tunnels the rest with "
            "CONNECT",
            reason=EGRESS_BAD_REQUEST,
            status=400,
        )
    after = target[len("http://") :]
    cut = min((i for i in (after.find("/"), after.find("?")) if i >= 0), default=len(after))
    authority, path = after[:cut], after[cut:] or "/"
    if path.startswith("?"):
        path = "/" + path
    if "@" in authority:
        raise EgressRefused(
            "credentials in the URL are not forwarded", reason=EGRESS_BAD_REQUEST, status=400
        )
    destination = _destination(authority, default_port=80)
    headers = [(k, v) for k, v in event.headers.raw_items() if k.lower() not in _HOP_HEADERS]
    headers.append((b"Connection", b"close"))
    client = h11.Connection(h11.CLIENT)
    head = client.send(
        h11.Request(method=event.method, target=path.encode("ascii"), headers=headers)
    )
    assert head is not None  # a Request always has bytes
    return ProxyRequest("forward", destination, head, rest)


# --- the decisions ------------------------------------------------------------------------------


def judge_target(destination: Destination, allowlist: Allowlist) -> None:
    """Refuse (403 ``egress_not_listed``) a destination the allowlist does not name as the
    client wrote it: a name must be listed as that name, an address as that address."""
    if destination not in allowlist.entries:
        raise EgressRefused(
            f"{destination} is not in this service's egress list", reason=EGRESS_NOT_LISTED
        )


def is_special(address: IPAddress) -> bool:
    """An address a listed *name* may not lead to: anything but the public internet (loopback,
    link-local with the cloud metadata service, private and shared ranges, multicast,
    unspecified, reserved, documentation)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global or address.is_multicast


def choose_address(
    destination: Destination, resolved: Sequence[IPAddress], allowlist: Allowlist
) -> IPAddress:
    """The first of ``resolved`` (the name's addresses, in the resolver's order) that may be
    connected to; EgressRefused (403 ``egress_address_refused``) when none may.

    A public address may be, once the name is listed. A special one (:func:`is_special`) only
    when that address with this port is itself in the list: listing ``127.0.0.1:8080`` is how
    a user lets a name such as ``localhost:8080`` lead there.
    """
    refused: list[str] = []
    for address in resolved:
        plain = _as_address(str(address)) or address
        if not is_special(plain) or Destination(str(plain), destination.port) in allowlist.entries:
            return plain
        refused.append(str(plain))
    raise EgressRefused(
        f"{destination.host} resolves to {', '.join(refused) or 'nothing'}: "
        + ("an address this service's egress list does not name" if refused else "no address"),
        reason=EGRESS_ADDRESS_REFUSED,
    )


# --- who asks, on the TCP way in ----------------------------------------------------------------

# The user name of the proxy's credential: the password is the pod's token.
PROXY_USER = "rf"


def proxy_url(token: str, host: str, port: int) -> str:
    """The proxy as a pod's HTTPS_PROXY names it: clients (curl, Python's urllib and requests,
    Node's env proxy, Go) send a URL's credentials as ``Proxy-Authorization: Basic`` on every
    request and CONNECT. ``token`` is URL-safe (``secrets.token_urlsafe``)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{PROXY_USER}:{token}@{shown}:{port}"


def token_of(authorization: bytes) -> bytes | None:
    """The token in a ``Proxy-Authorization: Basic base64(rf:TOKEN)`` value; None for anything
    else (another scheme, bad base64, another user, an empty token)."""
    scheme, _, encoded = authorization.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, token = decoded.partition(b":")
    if not sep or user != PROXY_USER.encode() or not token:
        return None
    return token


def identify(authorization: bytes, registered: Iterable[tuple[str, T]]) -> T:
    """Whose the request is: the entry of ``registered`` (token, whose) whose token the
    request's Proxy-Authorization carries; EgressRefused (407 ``egress_unauthorized``) when
    none. Every token is compared, in constant time: the answer's timing says nothing about
    how close a guess came."""
    token = token_of(authorization)
    found: T | None = None
    matched = False
    for known, whose in registered:
        # (compare_digest on the empty guess too: the loop takes the same time either way.)
        if hmac.compare_digest(known.encode(), token or b"") and token is not None:
            found, matched = whose, True
    if not matched:
        raise EgressRefused(
            "no Proxy-Authorization of a pod this proxy serves"
            if token is None
            else "the Proxy-Authorization names no pod this proxy serves",
            reason=EGRESS_UNAUTHORIZED,
            status=407,
        )
    return found  # type: ignore[return-value]


def refusal_response(status: int, reason: str, message: str) -> bytes:
    """The proxy's answer to a refused request (the connection is closed after it)."""
    phrase = {
        400: b"Bad Request",
        403: b"Forbidden",
        407: b"Proxy Authentication Required",
        502: b"Bad Gateway",
    }.get(status, b"Error")
    body = f"reactor-fabric egress proxy: {reason}: {message}\n".encode()
    challenge = b'Proxy-Authenticate: Basic realm="reactor-fabric"\r\n' if status == 407 else b""
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\nX-Reactor-Fabric-Reason: %s\r\n%s\r\n%s"
        % (status, phrase, len(body), reason.encode(), challenge, body)
    )


TUNNEL_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
