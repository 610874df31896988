"""An OpenID provider's access token, checked (``orchestrator.auth.mode: oidc``). Pure.

The orchestrator is an OAuth 2.1 resource server (the MCP authorization specification): a
request carries a JWT access token the issuer signed, and :func:`check_access_token` decides
who it names, or why it names no one. Signatures are PyJWT's (a maintained library: parsing
JOSE by hand is how forgeries happen); what is accepted is decided here, before and after it:

1. Size (at most :data:`MAX_TOKEN_BYTES`) and shape (three base64url parts), before anything
   is decoded.
2. The header's ``alg`` is one of ``rules.algorithms`` — asymmetric only: ``none`` and the
   HMAC algorithms are never accepted, whatever the suite says (the schema has no way to list
   them) — and its ``kid`` names a key of the issuer's set. A ``kid`` the set does not have
   is :class:`UnknownKey`: the caller fetches the set again (the issuer may have rotated its
   keys) and asks once more. A token without a ``kid`` is tried against the one key of a
   one-key set only.
3. The signature, with the key bound to the header's algorithm (an RSA key never verifies an
   HMAC token: PyJWT's key objects carry their algorithm).
4. The claims: ``iss`` equal to the issuer, character for character; ``aud`` naming one of
   ``rules.audiences`` (RFC 8707: a token for another resource is not ours to accept);
   ``exp`` present and not past, ``nbf`` and ``iat`` not in the future, each within
   ``rules.leeway``; the user claim a non-empty string of at most 256 characters; the
   groups claim a list of strings (or one string), bounded; every required scope in
   ``scope`` (a space-separated string) or ``scp`` (a list).

Each refusal is a :class:`TokenProblem` whose reason is from the one list
(:mod:`reactor_fabric._reasons`) and whose detail a client may be shown: it says what was
wrong with the token, never the token. Time is the caller's ``now`` (wall clock seconds), so
the checks are deterministic under test.

Imported only in oidc mode (PyJWT with cryptography is 20 MB of an orchestrator's memory):
what the rest of the package needs of a principal is :mod:`.principal`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import jwt

from .._reasons import TOKEN_EXPIRED, TOKEN_INSUFFICIENT_SCOPE, TOKEN_INVALID
from .principal import ASYMMETRIC, Principal, TokenProblem, TokenRules, UnknownKey

# A JWT of a few claims is well under 2 KiB; a provider's with many groups a few KiB. Beyond
# this the token is refused before a byte of it is decoded.
MAX_TOKEN_BYTES = 16 * 1024
MAX_HEADER_BYTES = 2 * 1024
MAX_NAME_CHARACTERS = 256
MAX_GROUPS = 256


@dataclass
class KeySet:
    """The issuer's public keys (a JWK set), by ``kid``; keys for encryption and of unknown
    types are left out. Keys made for a token's algorithm are kept (one per key and
    algorithm): building an RSA key from its JWK costs more than checking a signature."""

    keys: Mapping[str | None, Mapping[str, Any]]
    _made: dict[tuple[str | None, str], jwt.PyJWK] = field(default_factory=dict, repr=False)

    @classmethod
    def from_document(cls, document: object, *, max_keys: int = 64) -> KeySet:
        """The keys of a JWK set document (``{"keys": [...]}``); ValueError when it is not one
        or holds more than ``max_keys`` keys."""
        if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
            raise ValueError('not a JWK set (no "keys" list)')  # noqa: TRY004 - one error for all
        listed = document["keys"]
        if len(listed) > max_keys:
            raise ValueError(f"the key set lists {len(listed)} keys (at most {max_keys})")
        keys: dict[str | None, Mapping[str, Any]] = {}
        for key in listed:
            if not isinstance(key, dict) or key.get("kty") not in ("RSA", "EC", "OKP"):
                continue  # symmetric keys ("oct") and unknown types: never a token's key
            if key.get("use", "sig") != "sig":
                continue
            kid = key.get("kid")
            keys[kid if isinstance(kid, str) else None] = key
        return cls(keys)

    def key_for(self, kid: str | None, algorithm: str) -> jwt.PyJWK | None:
        """The key ``kid`` names, bound to ``algorithm``; None when the set has no such key.
        A token without a ``kid`` gets the set's only key, if it has one. Raises
        jwt.PyJWTError when the key cannot serve that algorithm."""
        if kid is None and len(self.keys) == 1:
            kid = next(iter(self.keys))
        jwk = self.keys.get(kid)
        if jwk is None:
            return None
        made = self._made.get((kid, algorithm))
        if made is None:
            declared = jwk.get("alg")
            if declared is not None and declared != algorithm:
                raise jwt.InvalidAlgorithmError("the key is for another algorithm")
            made = jwt.PyJWK(dict(jwk), algorithm=algorithm)
            self._made[(kid, algorithm)] = made
        return made


def check_access_token(
    token: str, keys: KeySet, rules: TokenRules, now: float
) -> Principal | TokenProblem | UnknownKey:
    """Who ``token`` names, or why it is refused, or which key it needs (see module docs)."""
    header = _header(token)
    if isinstance(header, TokenProblem):
        return header
    key = _key(header, keys, rules)
    if not isinstance(key, jwt.PyJWK):
        return key
    try:
        claims = jwt.decode(
            token,
            key,
            algorithms=[header["alg"]],
            # Times are checked below against the caller's clock; the audience too (PyJWT
            # compares an "aud" list with one expected value or a list, not a set of ours).
            options={
                "verify_signature": True,
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
                "verify_aud": False,
                "verify_iss": False,
                "verify_sub": False,
                "verify_jti": False,
            },
        )
    except jwt.InvalidSignatureError:
        return _invalid("the token's signature does not verify with the issuer's key")
    except jwt.PyJWTError:
        return _invalid("the token is not a well-formed signed JWT")
    return _principal(claims, rules, now)


def _header(token: str) -> dict[str, Any] | TokenProblem:
    """The token's JOSE header, decoded within bounds, or why it cannot be."""
    parts = token.split(".", 3) if len(token) <= MAX_TOKEN_BYTES else []
    if len(parts) != 3 or not all(parts[:2]) or len(parts[0]) > MAX_HEADER_BYTES:
        return _invalid(
            f"the token is not a JWT of at most {MAX_TOKEN_BYTES} bytes (three dot-separated "
            f"parts, a header of at most {MAX_HEADER_BYTES})"
        )
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (binascii.Error, ValueError):
        header = None
    if not isinstance(header, dict):
        return _invalid("the token's header is not a base64url JSON object")
    if header.get("crit"):
        # RFC 7515 §4.1.11: an extension we do not know must be refused.
        return _invalid("the token's header lists critical extensions")
    return header


def _key(
    header: dict[str, Any], keys: KeySet, rules: TokenRules
) -> jwt.PyJWK | TokenProblem | UnknownKey:
    """The issuer's key for the header's ``kid`` and ``alg``, or why there is none."""
    algorithm = header.get("alg")
    if algorithm not in rules.algorithms or algorithm not in ASYMMETRIC:
        return _invalid(f"the token's algorithm {str(algorithm)[:20]!r} is not accepted")
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        return _invalid("the token's key id is not a string")
    try:
        key = keys.key_for(kid, algorithm)
    except (jwt.PyJWTError, ValueError, TypeError):
        return _invalid("the issuer's key named by the token cannot verify its algorithm")
    return UnknownKey(kid) if key is None else key


def _principal(claims: dict[str, Any], rules: TokenRules, now: float) -> Principal | TokenProblem:
    problem = _issued_problem(claims, rules) or _time_problem(claims, rules, now)
    if problem is not None:
        return problem
    user = claims.get(rules.user_claim)
    if not isinstance(user, str) or not user or len(user) > MAX_NAME_CHARACTERS:
        return _invalid(f"the token's {rules.user_claim!r} claim is not a user name")
    groups = _groups(claims.get(rules.groups_claim))
    if groups is None:
        return _invalid(f"the token's {rules.groups_claim!r} claim is not a list of names")
    missing = [scope for scope in rules.scopes if scope not in _scopes(claims)]
    if missing:
        return TokenProblem(
            TOKEN_INSUFFICIENT_SCOPE, f"the token lacks the scope {' '.join(missing)!r}"
        )
    operator = user in rules.operator_users or not rules.operator_groups.isdisjoint(groups)
    return Principal(user, groups, operator, float(claims["exp"]))


def _issued_problem(claims: dict[str, Any], rules: TokenRules) -> TokenProblem | None:
    """The issuer and the audience: this issuer's token for this resource."""
    if claims.get("iss") != rules.issuer:
        return _invalid("the token was issued by another issuer")
    if not _names_audience(claims.get("aud"), rules.audiences):
        return _invalid("the token is for another resource (its aud is not this orchestrator)")
    return None


def _time_problem(claims: dict[str, Any], rules: TokenRules, now: float) -> TokenProblem | None:
    """exp present and not past; nbf and iat, when present, not in the future (leeway)."""
    expires = claims.get("exp")
    if not _is_time(expires):
        return _invalid("the token has no expiry (exp)")
    if now > float(expires) + rules.leeway:
        return TokenProblem(TOKEN_EXPIRED, "the token has expired: sign in again")
    for name, what in (("nbf", "is not valid yet"), ("iat", "was issued in the future")):
        value = claims.get(name)
        if value is not None and (not _is_time(value) or float(value) > now + rules.leeway):
            return _invalid(f"the token {what} ({name})")
    return None


def _is_time(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _names_audience(aud: object, audiences: frozenset[str]) -> bool:
    if isinstance(aud, str):
        return aud in audiences
    if isinstance(aud, list) and len(aud) <= MAX_GROUPS:
        return any(isinstance(one, str) and one in audiences for one in aud)
    return False


def _groups(value: object) -> tuple[str, ...] | None:
    """A groups claim as names: absent is none; a string is one; a list of strings, bounded."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > MAX_GROUPS:
        return None
    if not all(isinstance(g, str) and 0 < len(g) <= MAX_NAME_CHARACTERS for g in value):
        return None
    return tuple(value)


def _scopes(claims: dict[str, Any]) -> Iterable[str]:
    scope, scp = claims.get("scope"), claims.get("scp")
    if isinstance(scope, str):
        return scope.split()
    if isinstance(scp, list):
        return [s for s in scp if isinstance(s, str)]
    if isinstance(scp, str):
        return scp.split()
    return ()


def _invalid(detail: str) -> TokenProblem:
    return TokenProblem(TOKEN_INVALID, detail)
