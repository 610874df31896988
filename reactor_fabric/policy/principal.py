"""Who a request is from (:class:`Principal`), and the words of an access token's check
(:mod:`.access_tokens`, which only oidc mode imports: PyJWT and cryptography cost 20 MB). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._reasons import TOKEN_INSUFFICIENT_SCOPE

# The algorithms accepted at most: those the suite may list (config.structs).
ASYMMETRIC = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


@dataclass(frozen=True)
class Principal:
    """Who a request is from. ``user`` None: the holder of the orchestrator's token (or
    anyone, with authentication off), who may see and join every session, as before users
    existed."""

    user: str | None = None
    groups: tuple[str, ...] = ()
    operator: bool = True
    # The token's expiry (wall clock), when it has one.
    expires: float | None = None

    def may_use(self, owner: str | None) -> bool:
        """Whether this principal may reach what ``owner`` holds (a session, a keyed URL): its
        own, or anything when it is the token's holder. Operators see others' sessions on the
        status page, but never use them."""
        return self.user is None or owner == self.user


TOKEN_HOLDER = Principal()


@dataclass(frozen=True)
class TokenRules:
    """What :func:`check_access_token` accepts (built once from ``orchestrator.auth``)."""

    issuer: str
    audiences: frozenset[str]
    algorithms: frozenset[str] = ASYMMETRIC
    leeway: float = 60.0
    user_claim: str = "sub"
    groups_claim: str = "groups"
    scopes: tuple[str, ...] = ()
    operator_users: frozenset[str] = frozenset()
    operator_groups: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TokenProblem:
    """Why a token is refused: ``reason`` from the one list, ``detail`` safe to show."""

    reason: str
    detail: str

    @property
    def status(self) -> int:
        return 403 if self.reason == TOKEN_INSUFFICIENT_SCOPE else 401


@dataclass(frozen=True)
class UnknownKey:
    """The token names a key the set does not have (``kid``; None: it names none)."""

    kid: str | None
