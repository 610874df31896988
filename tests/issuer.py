"""A fake OpenID provider for the unit tests: its documents served to the orchestrator's
fetcher (:class:`~reactor_fabric.trio.issuer_keys.JsonFetcher`) from memory, misbehaving on
demand (slow, failing, lying), and a real RSA key signing the access tokens it would issue.
The integration tests use a real provider instead (tests/oidc_provider.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import jwt
import trio
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from reactor_fabric._errors import IssuerUnavailable

ISSUER = "https://login.example.com/realms/team"
DISCOVERY = ISSUER + "/.well-known/openid-configuration"
JWKS = ISSUER + "/protocol/openid-connect/certs"


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    return {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, "alg": "RS256"}


class FakeIssuer:
    """Answers discovery and the key set; ``delay`` slows each answer, ``failing`` makes each
    fail, ``documents`` may be changed to lie; ``fetched`` lists what was asked for."""

    def __init__(self, issuer: str = ISSUER) -> None:
        self.issuer = issuer
        self.key = new_key()
        self.kid = "k1"
        self.documents: dict[str, object] = {
            issuer + "/.well-known/openid-configuration": {
                "issuer": issuer,
                "jwks_uri": issuer + "/protocol/openid-connect/certs",
            },
            issuer + "/protocol/openid-connect/certs": {"keys": [jwk(self.key, self.kid)]},
        }
        self.fetched: list[str] = []
        self.delay = 0.0
        self.failing = False

    async def get_json(self, url: str) -> object:
        self.fetched.append(url)
        await trio.sleep(self.delay)
        if self.failing:
            raise IssuerUnavailable(f"{url} answered HTTP 502")
        if url not in self.documents:
            raise IssuerUnavailable(f"{url} answered HTTP 404")
        return self.documents[url]

    def rotate(self) -> None:
        """A new signing key, published beside the old one (as providers rotate)."""
        self.key, self.kid = new_key(), f"k{len(self.fetched) + 2}"
        keys = self.documents[self.issuer + "/protocol/openid-connect/certs"]
        assert isinstance(keys, dict)
        keys["keys"] = [*keys["keys"], jwk(self.key, self.kid)]

    def token(self, user: str, audience: str, *, lifetime: float = 300, **claims: Any) -> str:
        """An access token this issuer would give ``user`` for ``audience`` (the wall clock's
        now; ``claims`` added, or removed when None)."""
        now = time.time()
        payload: dict[str, Any] = {
            "iss": self.issuer,
            "aud": audience,
            "sub": user,
            "groups": [f"team-{user}"],
            "iat": int(now),
            "exp": int(now + lifetime),
            "scope": "mcp",
        }
        payload.update(claims)
        payload = {name: value for name, value in payload.items() if value is not None}
        return jwt.encode(payload, self.key, algorithm="RS256", headers={"kid": self.kid})
