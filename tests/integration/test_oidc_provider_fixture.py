"""The OpenID provider fixture (tests/oidc_provider.py) works: discovery, the code flow with
PKCE and resource indicators, refresh, dynamic registration, the device flow, refused logins,
its own signing key, and the MCP Python SDK's OAuth client against it.

It needs Node (from npm, cached) and loopback only: no Docker engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import httpx2
import jwt
import pytest
import trio
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.shared.auth import OAuthClientMetadata
from pydantic import AnyUrl

from tests.oidc_provider import (
    AuthorizationDenied,
    LoginRefused,
    MemoryTokenStorage,
    OidcError,
    OpenIdProvider,
    running_provider,
)

pytestmark = pytest.mark.integration

RESOURCE = "http://127.0.0.1:9/mcp"


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenIdProvider]:
    with running_provider(tmp_path_factory.mktemp("oidc")) as running:
        yield running


def verified(provider: OpenIdProvider, token: str, audience: str) -> dict[str, Any]:
    """The claims of ``token`` once verified against the keys the provider publishes."""
    key = jwt.PyJWKClient(provider.jwks_uri).get_signing_key_from_jwt(token)
    claims: dict[str, Any] = jwt.decode(
        token, key.key, algorithms=["RS256"], audience=audience, issuer=provider.issuer
    )
    return claims


def test_discovery_names_the_endpoints_an_mcp_client_needs(provider: OpenIdProvider) -> None:
    for path in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"):
        document = httpx.get(provider.issuer + path, trust_env=False).json()
        assert document["issuer"] == provider.issuer
        assert document["jwks_uri"].startswith(provider.issuer)
        assert document["registration_endpoint"].startswith(provider.issuer)
        assert document["device_authorization_endpoint"].startswith(provider.issuer)
        assert document["code_challenge_methods_supported"] == ["S256"]
        assert {"openid", "offline_access", "mcp"} <= set(document["scopes_supported"])


def test_the_code_flow_gives_a_jwt_for_the_resource_and_a_refresh_token_that_renews_it(
    provider: OpenIdProvider,
) -> None:
    token = provider.access_token("alice", RESOURCE)
    claims = verified(provider, token["access_token"], RESOURCE)
    assert claims["iss"] == provider.issuer
    assert claims["aud"] == RESOURCE
    assert claims["sub"] == "alice"
    assert claims["groups"] == ["team-a"]
    assert claims["scope"] == "mcp"
    assert claims["client_id"] == provider.client_id
    assert claims["exp"] - claims["iat"] == provider.access_token_ttl
    assert jwt.get_unverified_header(token["access_token"])["typ"] == "at+jwt"

    renewed = provider.refresh(token["refresh_token"], RESOURCE)
    again = verified(provider, renewed["access_token"], RESOURCE)
    assert again["sub"] == "alice"
    assert again["jti"] != claims["jti"]
    # A public client's refresh token rotates: the spent one is refused.
    assert renewed["refresh_token"] != token["refresh_token"]
    with pytest.raises(OidcError, match="invalid_grant"):
        provider.refresh(token["refresh_token"], RESOURCE)


def test_any_loopback_resource_is_an_audience_and_others_are_refused(
    provider: OpenIdProvider,
) -> None:
    other = "http://localhost:40000/"
    token = provider.access_token("bob", other, scope="mcp")
    claims = verified(provider, token["access_token"], other)
    assert (claims["sub"], claims["groups"]) == ("bob", ["team-b"])
    with pytest.raises(AuthorizationDenied, match="invalid_target"):
        provider.access_token("bob", "https://example.com/mcp")


def test_an_unknown_user_cannot_log_in(provider: OpenIdProvider) -> None:
    with pytest.raises(LoginRefused, match="mallory"):
        provider.access_token("mallory", RESOURCE)


def test_a_dynamically_registered_public_client_does_the_flow(provider: OpenIdProvider) -> None:
    client = provider.register_client(client_name="registered in a test")
    assert client["token_endpoint_auth_method"] == "none"
    token = provider.access_token("bob", RESOURCE, client_id=client["client_id"])
    claims = verified(provider, token["access_token"], RESOURCE)
    assert (claims["sub"], claims["client_id"]) == ("bob", client["client_id"])
    assert token["refresh_token"]

    confidential = provider.register_client(token_endpoint_auth_method="client_secret_basic")
    token = provider.access_token(
        "alice",
        RESOURCE,
        client_id=confidential["client_id"],
        client_secret=confidential["client_secret"],
    )
    assert verified(provider, token["access_token"], RESOURCE)["sub"] == "alice"


@pytest.mark.parametrize("by", ["verification_uri_complete", "user_code"])
def test_the_device_flow_gives_a_jwt_for_the_resource(provider: OpenIdProvider, by: str) -> None:
    device = provider.device_authorization(RESOURCE)
    provider.approve_device_code(device[by], "alice")
    token = provider.device_token(device["device_code"], resource=RESOURCE)
    claims = verified(provider, token["access_token"], RESOURCE)
    assert (claims["sub"], claims["aud"], claims["groups"]) == ("alice", RESOURCE, ["team-a"])


def test_tokens_signed_with_the_issuers_key_verify_as_its_own(provider: OpenIdProvider) -> None:
    expired = provider.sign(provider.claims_for("alice", RESOURCE, exp=1, iat=0))
    with pytest.raises(jwt.ExpiredSignatureError):
        verified(provider, expired, RESOURCE)
    elsewhere = provider.sign(provider.claims_for("alice", "http://127.0.0.1:10/mcp"))
    with pytest.raises(jwt.InvalidAudienceError):
        verified(provider, elsewhere, RESOURCE)
    assert verified(provider, provider.sign(provider.claims_for("bob", RESOURCE)), RESOURCE)[
        "groups"
    ] == ["team-b"]


class _ProtectedResource(httpx2.AsyncBaseTransport):
    """An MCP server's HTTP face as the SDK sees it (RFC 9728: 401 naming the metadata, the
    metadata naming the provider), answered in-process for its origin; anything else (the
    provider) goes over loopback."""

    def __init__(self, provider: OpenIdProvider) -> None:
        self.provider = provider
        self.origin = "127.0.0.1:9"
        self.bearers: list[str] = []
        self.network = httpx2.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.netloc.decode() != self.origin:
            return await self.network.handle_async_request(request)
        if request.url.path == "/.well-known/oauth-protected-resource/mcp":
            metadata = {
                "resource": RESOURCE,
                "authorization_servers": [self.provider.issuer],
                "scopes_supported": ["mcp"],
            }
            return httpx2.Response(200, json=metadata)
        authorization = request.headers.get("authorization", "")
        if not authorization.startswith("Bearer "):
            challenge = (
                f'Bearer resource_metadata="http://{self.origin}'
                '/.well-known/oauth-protected-resource/mcp"'
            )
            return httpx2.Response(401, headers={"WWW-Authenticate": challenge})
        self.bearers.append(authorization.removeprefix("Bearer "))
        return httpx2.Response(200, json={"jsonrpc": "2.0", "id": 1, "result": {}})

    async def aclose(self) -> None:
        await self.network.aclose()


async def test_the_mcp_sdk_oauth_client_registers_itself_and_gets_a_jwt_for_the_server(
    provider: OpenIdProvider,
) -> None:
    redirects: list[str] = []

    async def redirect_handler(authorization_url: str) -> None:
        asked = parse_qs(urlsplit(authorization_url).query)
        assert asked["resource"] == [RESOURCE]
        assert asked["scope"] == ["mcp offline_access"]
        redirects.append(await trio.to_thread.run_sync(provider.login, authorization_url, "bob"))

    async def callback_handler() -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(redirects[-1]).query)
        return AuthorizationCodeResult(
            code=query["code"][0], state=query["state"][0], iss=query["iss"][0]
        )

    storage = MemoryTokenStorage()
    oauth = OAuthClientProvider(
        server_url=RESOURCE,
        client_metadata=OAuthClientMetadata(
            redirect_uris=[AnyUrl("http://127.0.0.1:33418/callback")], client_name="mcp sdk test"
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    server = _ProtectedResource(provider)
    async with httpx2.AsyncClient(auth=oauth, transport=server) as http:
        answer = await http.post(RESOURCE, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert answer.status_code == 200
    (bearer,) = server.bearers
    claims = verified(provider, bearer, RESOURCE)
    assert (claims["sub"], claims["groups"], claims["scope"]) == ("bob", ["team-b"], "mcp")
    assert storage.client is not None
    assert storage.client.client_id == claims["client_id"]
    # Registered without an auth method, it was given a secret (sent as Basic auth since).
    assert storage.client.token_endpoint_auth_method == "client_secret_basic"
    assert storage.tokens is not None
    assert storage.tokens.refresh_token
