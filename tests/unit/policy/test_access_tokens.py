"""An OpenID provider's access token checked: every way a token can be wrong is refused with
its reason, and a right one names its user and groups. Tokens are signed here with real keys
(RSA, EC) by PyJWT, as a provider signs them; the clock is the test's."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from reactor_fabric.policy.access_tokens import MAX_TOKEN_BYTES, KeySet, check_access_token
from reactor_fabric.policy.principal import Principal, TokenProblem, TokenRules, UnknownKey

ISSUER = "https://login.example.com/realms/team"
RESOURCE = "https://fabric.example.com"
NOW = 1_900_000_000.0
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def public_jwk(key: Any, kid: str, alg: str | None = None) -> dict[str, Any]:
    algorithm = jwt.algorithms.RSAAlgorithm if alg is None or alg.startswith(("RS", "PS")) else None
    if isinstance(key, ec.EllipticCurvePrivateKey):
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    else:
        assert algorithm is not None
        jwk = json.loads(algorithm.to_jwk(key.public_key()))
    jwk["kid"] = kid
    if alg is not None:
        jwk["alg"] = alg
    return dict(jwk)


KEYS = KeySet.from_document(
    {
        "keys": [
            public_jwk(RSA_KEY, "rsa-1", "RS256"),
            public_jwk(EC_KEY, "ec-1"),
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},  # a symmetric key: never used
            {**public_jwk(OTHER_RSA_KEY, "enc-1"), "use": "enc"},  # for encryption: left out
        ]
    }
)
RULES = TokenRules(
    issuer=ISSUER,
    audiences=frozenset({RESOURCE}),
    operator_users=frozenset({"root-user"}),
    operator_groups=frozenset({"ops"}),
)


def claims(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": RESOURCE,
        "sub": "alice",
        "groups": ["team-a"],
        "exp": NOW + 300,
        "iat": NOW - 10,
        "scope": "mcp",
    }
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


def signed(
    payload: dict[str, Any], key: Any = RSA_KEY, alg: str = "RS256", kid: str | None = "rsa-1"
) -> str:
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(payload, key, algorithm=alg, headers=headers)


def check(token: str, rules: TokenRules = RULES, now: float = NOW) -> Any:
    return check_access_token(token, KEYS, rules, now)


def refused(token: str, rules: TokenRules = RULES, now: float = NOW) -> TokenProblem:
    outcome = check(token, rules, now)
    assert isinstance(outcome, TokenProblem), outcome
    assert not token or token not in outcome.detail
    return outcome


def b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_a_token_signed_by_the_issuer_for_this_orchestrator_names_its_user_and_groups() -> None:
    assert check(signed(claims())) == Principal("alice", ("team-a",), False, NOW + 300)
    ec_token = signed(claims(sub="bob", groups="team-b"), EC_KEY, "ES256", "ec-1")
    assert check(ec_token) == Principal("bob", ("team-b",), False, NOW + 300)


def test_operators_are_named_by_user_or_by_group() -> None:
    by_user = check(signed(claims(sub="root-user")))
    by_group = check(signed(claims(groups=["team-a", "ops"])))
    assert isinstance(by_user, Principal)
    assert isinstance(by_group, Principal)
    assert by_user.operator
    assert by_group.operator


def test_an_expired_token_is_refused_as_expired_beyond_the_leeway_only() -> None:
    token = signed(claims(exp=NOW - 30))
    assert isinstance(check(token), Principal)  # 30 s late: within the 60 s leeway
    problem = refused(signed(claims(exp=NOW - 61)))
    assert (problem.reason, problem.status) == ("token_expired", 401)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (claims(aud="https://other.example.com"), "another resource"),
        (claims(aud=["https://other.example.com", "api://x"]), "another resource"),
        (claims(aud=None), "another resource"),
        (claims(iss="https://evil.example.com/realms/team"), "another issuer"),
        (claims(iss=ISSUER + "/"), "another issuer"),  # character for character
        (claims(exp=None), "no expiry"),
        (claims(exp="soon"), "no expiry"),
        (claims(exp=True), "no expiry"),
        (claims(nbf=NOW + 120), "not valid yet"),
        (claims(iat=NOW + 120), "issued in the future"),
        (claims(sub=None), "not a user name"),
        (claims(sub=""), "not a user name"),
        (claims(sub=12), "not a user name"),
        (claims(sub="x" * 257), "not a user name"),
        (claims(groups={"a": 1}), "not a list of names"),
        (claims(groups=[1, 2]), "not a list of names"),
        (claims(groups=["g"] * 257), "not a list of names"),
    ],
)
def test_a_token_with_wrong_claims_is_refused_saying_what_is_wrong(
    payload: dict[str, Any], words: str
) -> None:
    problem = refused(signed(payload))
    assert (problem.reason, problem.status) == ("token_invalid", 401)
    assert words in problem.detail


def test_a_token_for_one_of_several_audiences_is_accepted() -> None:
    assert isinstance(check(signed(claims(aud=["api://other", RESOURCE]))), Principal)


def test_an_unsigned_token_is_refused() -> None:
    unsigned = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims())}."
    assert "not accepted" in refused(unsigned).detail
    also = f"{b64({'alg': 'none', 'kid': 'rsa-1'})}.{b64(claims())}.c2ln"
    assert "not accepted" in refused(also).detail


def test_an_hmac_token_keyed_with_the_issuers_public_key_is_refused() -> None:
    """The classic forgery: HS256 with the public key's PEM as the shared secret."""
    pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "kid": "rsa-1", "typ": "JWT"}
    signing_input = f"{b64(header)}.{b64(claims())}".encode()
    signature = base64.urlsafe_b64encode(hmac.new(pem, signing_input, hashlib.sha256).digest())
    forged = signing_input.decode() + "." + signature.rstrip(b"=").decode()
    assert "not accepted" in refused(forged).detail
    # Nor under the symmetric key's own id (the set never holds an "oct" key).
    assert (
        "not accepted" in refused(jwt.encode(claims(), "s" * 32, "HS256", {"kid": "hmac"})).detail
    )


def test_a_token_signed_with_another_key_under_the_issuers_key_id_is_refused() -> None:
    problem = refused(signed(claims(), OTHER_RSA_KEY))
    assert "signature does not verify" in problem.detail


def test_a_token_with_a_tampered_payload_is_refused() -> None:
    header, _, signature = signed(claims()).split(".")
    tampered = f"{header}.{b64(claims(sub='root-user'))}.{signature}"
    assert "signature does not verify" in refused(tampered).detail


def test_a_token_naming_an_unknown_key_asks_for_the_keys_again() -> None:
    assert check(signed(claims(), OTHER_RSA_KEY, kid="rotated-2")) == UnknownKey("rotated-2")
    # No kid and a set of several keys: which one is not for us to guess.
    assert check(signed(claims(), kid=None)) == UnknownKey(None)


def test_a_token_without_a_kid_is_checked_with_the_only_key_of_a_one_key_set() -> None:
    single = KeySet.from_document({"keys": [public_jwk(RSA_KEY, "only")]})
    assert isinstance(check_access_token(signed(claims(), kid=None), single, RULES, NOW), Principal)


def test_a_key_serves_only_its_declared_algorithm_and_the_suites_list_holds() -> None:
    # rsa-1 is declared RS256: a PS256 token under it is refused.
    problem = refused(signed(claims(), alg="PS256"))
    assert "cannot verify its algorithm" in problem.detail
    only_ec = TokenRules(ISSUER, frozenset({RESOURCE}), algorithms=frozenset({"ES256"}))
    assert "not accepted" in refused(signed(claims()), only_ec).detail
    # An algorithm the suite could never list, even if a bad rule said so.
    sloppy = TokenRules(ISSUER, frozenset({RESOURCE}), algorithms=frozenset({"HS256", "RS256"}))
    assert "not accepted" in refused(jwt.encode(claims(), "k" * 32, "HS256"), sloppy).detail
    # An EC key cannot stand for an RSA algorithm.
    assert "cannot verify" in refused(signed(claims(), alg="RS256", kid="ec-1")).detail


def test_a_missing_scope_is_refused_with_403() -> None:
    rules = TokenRules(ISSUER, frozenset({RESOURCE}), scopes=("mcp", "fabric:use"))
    problem = refused(signed(claims(scope="mcp")), rules)
    assert (problem.reason, problem.status) == ("token_insufficient_scope", 403)
    assert "fabric:use" in problem.detail
    assert isinstance(check(signed(claims(scope="fabric:use mcp")), rules), Principal)
    assert isinstance(
        check(signed(claims(scope=None, scp=["mcp", "fabric:use"])), rules), Principal
    )


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not-a-jwt",
        "a.b",
        "a.b.c.d",
        ".x.y",
        "!!!.e30.",
        f"{b64({'alg': 'RS256'})[:-2]}.e30.x",
        base64.urlsafe_b64encode(b"[1,2]").decode() + ".e30.x",
        "x" * (MAX_TOKEN_BYTES + 1),
        f"{'e' * 3000}.e30.x",
    ],
)
def test_garbage_and_oversized_tokens_are_refused_before_any_signature_work(token: str) -> None:
    problem = refused(token)
    assert problem.reason == "token_invalid"


def test_a_token_with_critical_header_extensions_is_refused() -> None:
    token = jwt.encode(claims(), RSA_KEY, "RS256", {"kid": "rsa-1", "crit": ["exp"], "exp": 1})
    assert "critical" in refused(token).detail


def test_a_key_set_keeps_only_signing_keys_of_asymmetric_types_and_is_bounded() -> None:
    assert set(KEYS.keys) == {"rsa-1", "ec-1"}
    with pytest.raises(ValueError, match="at most"):
        KeySet.from_document({"keys": [public_jwk(RSA_KEY, f"k{i}") for i in range(65)]})
    documents: list[object] = [[], {"keys": "x"}, {"nokeys": []}, "text"]
    for document in documents:
        with pytest.raises(ValueError, match="JWK set"):
            KeySet.from_document(document)
