"""Who may use the orchestrator: the Origin/Host checks and the token, for every route. Pure.

A loopback port is reachable by every process of every user on the machine, and through the
Docker socket a session can read whatever the orchestrator's user may. So, as Jupyter does for
its loopback servers, every request carries a secret token (see :mod:`reactor_fabric.config.token`
for where it is kept): ``Authorization: Bearer TOKEN``, or ``?token=TOKEN`` in the URL for clients
that cannot set headers (the MCP SDKs' WebSocket clients). It is compared in constant time.

:func:`admit` is the one gate in front of every route and transport, in this order:

1. ``Origin`` / ``Host`` (:mod:`.origins`): a browser page, a DNS-rebinding name → 403. First, so
   that a page never learns whether it guessed a token.
2. The token → 401 with ``WWW-Authenticate: Bearer`` and a JSON body saying where the token is.
   Nothing is started, nothing about the orchestrator is told.

``/healthz`` is the one route open without a token, and then answers only its status (the caller
decides that: :attr:`Refusal.status` 401 with ``reason`` tells it why).

With ``auth.mode: oidc`` (:class:`SignIn`) the token is an OpenID provider's access token, in
the ``Authorization`` header only; :func:`admit` hands it on as a :class:`BearerToken`, which
the caller checks against the issuer's keys (:mod:`.access_tokens`: fetching them is I/O). A
request without one gets the 401 whose challenge names the resource metadata
(:mod:`.resource_metadata`), from which an MCP client finds the issuer and signs in. The
metadata itself is open, like ``/healthz``.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from urllib.parse import parse_qs

from .._errors import SecurityViolation
from .._reasons import TOKEN_INVALID, TOKEN_MISSING
from ..protocol.jsonrpc import error_response
from .origins import request_allowed
from .principal import TOKEN_HOLDER, Principal, TokenProblem, TokenRules
from .resource_metadata import ProtectedResource

log = logging.getLogger(__name__)

TOKEN_PARAMETER = "token"  # noqa: S105 - a name, not a secret
AUTH_SCHEME = "Bearer"
# Where a client is told to look; the orchestrator's own start-up line prints it ready to use.
HOW_TO_AUTHENTICATE = (
    "Send the orchestrator's token as 'Authorization: Bearer TOKEN', or add ?token=TOKEN to the "
    "URL. The orchestrator prints it at start-up; it is kept in "
    "${XDG_CONFIG_HOME:-~/.config}/reactor-fabric/token of the user running it (or set with "
    "REACTOR_FABRIC_TOKEN / --token)."
)


@dataclass(frozen=True)
class Refusal:
    """An HTTP answer that ends a request before any route sees it."""

    status: int
    reason: str
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(frozen=True)
class SignIn:
    """``auth.mode: oidc``: what an access token must be, and what a client is told."""

    rules: TokenRules
    resource: ProtectedResource
    # The status page's client at the issuer (None: the page registers itself).
    page_client_id: str | None = None


@dataclass(frozen=True)
class Gate:
    """What :func:`admit` checks: the allowed origins and hosts, and the token (None: no auth)
    or, signing in with an OpenID provider, the access token's rules."""

    allowed_origins: frozenset[str]
    allowed_hosts: frozenset[str] | None
    token: str | None
    sign_in: SignIn | None = None


@dataclass(frozen=True)
class BearerToken:
    """An access token a request presented (``auth.mode: oidc``), not checked yet; ``resource``:
    the orchestrator's URL the request reached (what a refusal's challenge names)."""

    value: str
    resource: str


def bearer_credentials(headers: dict[bytes, str]) -> str | None:
    """What an ``Authorization: Bearer`` header carries (None: no such header)."""
    authorization = headers.get(b"authorization")
    if authorization is None:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    return credentials.strip() if scheme.lower() == AUTH_SCHEME.lower() else None


def presented_token(headers: dict[bytes, str], query: str) -> str | None:
    """The token a request carries: the ``Authorization: Bearer`` header, else ``?token=``."""
    credentials = bearer_credentials(headers)
    if credentials is not None:
        return credentials
    if TOKEN_PARAMETER in query:  # cheap test first: most requests carry none
        values = parse_qs(query, max_num_fields=64).get(TOKEN_PARAMETER)
        if values:
            return values[0]
    return None


def token_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison (no early exit on the first differing byte)."""
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode())


def admit_origin(gate: Gate, headers: dict[bytes, str], path: str) -> Refusal | None:
    """The Origin/Host check alone (what the open routes pass too); None: passed."""
    if request_allowed(
        headers,
        allowed_origins=gate.allowed_origins,
        allowed_hosts=gate.allowed_hosts,
        path=path,
    ):
        return None
    return Refusal(403, "origin_or_host_not_allowed", b'{"error": "origin or host not allowed"}')


def admit(
    gate: Gate, headers: dict[bytes, str], query: str, path: str
) -> Principal | BearerToken | Refusal:
    """Who the request is from, the access token to check first, or the answer that refuses
    it (see module docs)."""
    refusal = admit_origin(gate, headers, path)
    if refusal is not None:
        return refusal
    if gate.sign_in is not None:
        return _bearer(gate.sign_in, headers, path)
    if gate.token is None:
        return TOKEN_HOLDER
    try:
        presented = presented_token(headers, query)
    except ValueError:  # too many query fields to look at
        presented = None
    if token_matches(presented, gate.token):
        return TOKEN_HOLDER
    reason = TOKEN_MISSING if presented is None else TOKEN_INVALID
    # Never the presented value: a near-miss token in a log is a leak.
    log.warning("request_refused", extra={"path": path, "status": 401, "reason": reason})
    return unauthorized(reason)


def _bearer(sign_in: SignIn, headers: dict[bytes, str], path: str) -> BearerToken | Refusal:
    """oidc mode: the ``Authorization: Bearer`` token (the query string is not looked at: a
    token in a URL ends up in logs and histories), or the 401 that says how to get one."""
    resource = sign_in.resource.resource_for(headers.get(b"host"))
    credentials = bearer_credentials(headers)
    if credentials:
        return BearerToken(credentials, resource)
    log.warning("request_refused", extra={"path": path, "status": 401, "reason": TOKEN_MISSING})
    detail = "no access token was sent: sign in with the orchestrator's OpenID provider"
    return sign_in_refusal(sign_in.resource, resource, TokenProblem(TOKEN_MISSING, detail))


def sign_in_refusal(protected: ProtectedResource, resource: str, problem: TokenProblem) -> Refusal:
    """The 401 (403: a missing scope) refusing a request in oidc mode: a JSON-RPC error in the
    body, as the token's refusals have, and the challenge naming the resource metadata, from
    which an MCP client starts signing in (RFC 6750's ``invalid_token`` /
    ``insufficient_scope`` for a token that was sent)."""
    error = SecurityViolation(
        f"{problem.detail} (issuer {protected.issuer}; the resource metadata is at "
        f"{protected.metadata_url(resource)})",
        reason=problem.reason,
    )
    code = None
    if problem.reason != TOKEN_MISSING:
        code = "insufficient_scope" if problem.status == 403 else "invalid_token"
    description = problem.detail if code is not None else None
    value = protected.challenge(resource, error=code, description=description)
    return Refusal(
        problem.status,
        problem.reason,
        error_response(None, error),
        headers=((b"www-authenticate", value.encode()),),
    )


def unauthorized(reason: str) -> Refusal:
    """401, its body a JSON-RPC error (id null): what a client that reads error bodies shows
    (the MCP SDKs surface a JSON-RPC error found in a non-2xx answer), and readable as it is;
    its ``WWW-Authenticate`` challenge for the clients that read only that (see
    :func:`challenge`)."""
    message = "no token was sent" if reason == TOKEN_MISSING else "the token is wrong"
    error = SecurityViolation(f"{message}. {HOW_TO_AUTHENTICATE}", reason=reason)
    return Refusal(
        401,
        reason,
        error_response(None, error),
        headers=((b"www-authenticate", challenge(reason).encode()),),
    )


# What a 401's challenge tells a client that shows only it (an OAuth-aware client prints the
# description). A quoted-string of RFC 6750's error_description: printable ASCII without a
# double quote or a backslash.
CHALLENGE_DESCRIPTION = (
    "send the orchestrator's token as Authorization: Bearer TOKEN or ?token=TOKEN; it prints it "
    "at start-up and keeps it in ~/.config/reactor-fabric/token (or it was given by --token or "
    "REACTOR_FABRIC_TOKEN)"
)


def challenge(reason: str) -> str:
    """The ``WWW-Authenticate`` value of a 401 for ``reason``.

    RFC 6750 §3.1: a wrong token gets ``error="invalid_token"``; a request without one gets no
    error code, so a client does not report an error it did not make. Both get the
    ``error_description`` saying where the token comes from: it is the only text some clients
    show of a 401.
    """
    value = f'{AUTH_SCHEME} realm="reactor-fabric"'
    if reason == TOKEN_INVALID:
        value += ', error="invalid_token"'
    return f'{value}, error_description="{CHALLENGE_DESCRIPTION}"'
