"""A real OpenID provider (oidc-provider 9.x on Node 22, tests/oidc/provider.mjs) for the tests
of the orchestrator as an OAuth 2.1 resource server (MCP authorization: RFC 9728 protected
resource metadata, RFC 8707 resource indicators, RFC 9068 JWT access tokens).

``running_provider(directory)`` starts it on 127.0.0.1 (any free port) with a fresh RSA signing
key, two accounts (alice in team-a, bob in team-b) and one pre-registered public client, and
yields an ``OpenIdProvider`` that drives its pages without a browser (``login``), gets tokens
(``access_token``, ``refresh``, the device flow) and signs tokens with the issuer's own key
(``sign``, ``claims_for``) for the negative cases (expired, wrong audience...).

What the provider grants: an authorization request or device authorization carrying
``resource`` = a loopback http(s) URL, any port and path, gives a JWT access token (RS256,
``typ`` at+jwt) with ``iss`` the issuer, ``aud`` exactly that resource string, ``sub`` the login
name, ``groups`` (and ``email``) of the account, ``client_id``, ``scope`` = the resource's
granted scopes (``mcp`` when asked for), ``exp`` after ``access_token_ttl``. A non-loopback
resource is refused with ``invalid_target``; a token request naming a resource the authorization
did not is refused the same way; without ``resource`` at the token endpoint, the authorized one
is used. Without any resource the access token is opaque (for userinfo only). PKCE S256 is
required of every client; a refresh token is issued to every client allowed the grant.

Quirks worth knowing:
- Native clients (``application_type`` native, the SDK's default) may register loopback ``http``
  redirect URIs, and oidc-provider ignores the port when it matches them (RFC 8252 §7.3): the
  pre-registered ``http://127.0.0.1/callback`` accepts ``http://127.0.0.1:PORT/callback``.
- ``offline_access`` survives an authorization request only with ``prompt=consent`` (the SDK
  adds it); refresh tokens are issued regardless here, but the granted scope says so.
- A registered client's ``scope`` may only name scopes the provider lists, so ``mcp`` is one of
  its scopes (the SDK registers with the scope it is about to ask for).
- Every authorization response carries ``iss`` (RFC 9207); discovery says
  ``authorization_response_iss_parameter_supported``, so an SDK callback handler that drops
  ``iss`` makes the SDK fail with "missing iss parameter".
- Sessions and interactions are cookies, over plain http on loopback; each ``login`` uses a new
  cookie jar, so every login asks for the password and the consent again.
- State is in memory (oidc-provider warns about its in-memory adapter on stderr): a restart
  forgets clients registered dynamically, grants and refresh tokens.
- The calls here are synchronous (httpx, ``time.sleep`` in the device poll): from a trio test,
  run them with ``trio.to_thread.run_sync`` if the orchestrator shares the test's event loop.

The MCP Python SDK 2.x (``mcp`` 2.3) as an OAuth client, for the tests that drive it:
- ``mcp.client.auth.OAuthClientProvider(server_url, client_metadata, storage,
  redirect_handler=None, callback_handler=None, client_metadata_url=None,
  validate_resource_url=None)`` is an ``httpx2.Auth`` (httpx2, the SDK's fork of httpx, not
  httpx): ``client_metadata`` is ``mcp.shared.auth.OAuthClientMetadata(redirect_uris=[...],
  grant_types=["authorization_code", "refresh_token"], token_endpoint_auth_method=None|"none"|...,
  application_type="native", client_name=..., scope=...)``; ``storage`` implements
  ``mcp.client.auth.TokenStorage`` (async ``get_tokens``/``set_tokens(OAuthToken)``,
  ``get_client_info``/``set_client_info(OAuthClientInformationFull)``);
  ``redirect_handler: async (authorization_url: str) -> None`` and ``callback_handler: async ()
  -> AuthorizationCodeResult(code, state, iss)`` (``mcp.client.auth.AuthorizationCodeResult``).
  With this fixture: the redirect handler runs ``provider.login(url, user)`` (in a thread) and
  keeps the redirect URL; the callback handler returns its ``code``, ``state`` and ``iss``.
- Passing it to Streamable HTTP: ``async with httpx2.AsyncClient(auth=oauth) as http:`` then
  ``mcp.client.streamable_http.streamable_http_client(url, http_client=http)`` as the transport,
  e.g. ``mcp.Client(streamable_http_client(url, http_client=http))``
  (``mcp.shared._httpx_utils.create_mcp_http_client(auth=oauth)`` gives the SDK's timeouts).
- On a 401 it reads ``resource_metadata`` (and ``scope``) from ``WWW-Authenticate``, then tries
  that URL, ``/.well-known/oauth-protected-resource{path}`` and
  ``/.well-known/oauth-protected-resource`` on the server's origin; takes the first
  ``authorization_servers`` entry; fetches ``/.well-known/oauth-authorization-server`` then
  ``/.well-known/openid-configuration`` of that issuer (path-aware variants for an issuer with a
  path), and requires metadata ``issuer`` == that entry as a string (pydantic keeps it as
  written: no trailing slash added). Without protected resource metadata it falls back to the
  2025-03-26 way (the server's origin as the issuer; ``/authorize``, ``/token``, ``/register``).
- Scope asked: ``WWW-Authenticate``'s ``scope``, else the PRM's ``scopes_supported``, else the
  AS's ``scopes_supported``, plus ``offline_access`` when the AS lists it and the client's
  grant types include ``refresh_token``; with ``offline_access`` it adds ``prompt=consent``. A 403
  ``insufficient_scope`` makes it re-authorize with the union of scopes (step-up).
- Registration: dynamic (RFC 7591 POST to ``registration_endpoint``, else ``/register``) with
  the metadata above (``scope`` set to the chosen scope) unless ``client_metadata_url`` is given
  and the AS says ``client_id_metadata_document_supported`` (CIMD, https only). With
  ``token_endpoint_auth_method`` left None oidc-provider registers it ``client_secret_basic``
  and issues a secret, which the SDK then sends (Basic auth).
- Authorization code + PKCE S256 + ``state`` (checked) + ``resource`` (RFC 8707: the server URL,
  or the PRM ``resource`` when it is a parent of it) on the authorization, token and refresh
  requests, whenever PRM was found or the protocol version is 2025-06-18 or later. The
  ``resource`` check against PRM is a prefix match of the server URL (else ``OAuthFlowError``).
  Expired tokens are refreshed before a request (``refresh_token`` grant, same ``resource``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import selectors
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from tests.clients import envs

SCRIPT = Path(__file__).resolve().parent / "oidc" / "provider.mjs"
DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
DEFAULT_SCOPE = "openid mcp offline_access"
DEFAULT_ACCOUNTS: dict[str, dict[str, Any]] = {
    "alice": {"groups": ["team-a"], "email": "alice@example.test"},
    "bob": {"groups": ["team-b"], "email": "bob@example.test"},
}
CLIENT_ID = "rf-tests"
REDIRECT_URI = "http://127.0.0.1/callback"
# The status page's client (auth.page_client_id): a browser cannot register itself here (the
# provider allows no cross-origin registration), so the page's client is registered ahead, as a
# deployment registers its single-page apps.
PAGE_CLIENT_ID = "rf-status-page"
# Pages a login or a device approval goes through: login, consent, the device forms, and the
# redirects between them are well under this; more means a loop (e.g. a login that never sticks).
MAX_STEPS = 24
HTTP_TIMEOUT = 15.0


class OidcError(RuntimeError):
    """The provider answered with an error (its status and body are in the message)."""


class LoginRefused(OidcError):
    """The provider's login page did not accept the login (unknown user)."""


class AuthorizationDenied(OidcError):
    """The authorization ended in a redirect to the client carrying ``error``."""

    def __init__(self, message: str, redirect_url: str) -> None:
        super().__init__(message)
        self.redirect_url = redirect_url


@dataclass
class _Form:
    action: str
    method: str
    ident: str | None
    hidden: dict[str, str] = field(default_factory=dict)
    visible: list[str] = field(default_factory=list)


class _Page(HTMLParser):
    """The forms of a page (their hidden values, the names of their other inputs) and the text
    of its ``id="error"`` element."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.forms: list[_Form] = []
        self.error = ""
        self._in_error = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {key: value or "" for key, value in attrs}
        if tag == "form":
            self.forms.append(
                _Form(named.get("action", ""), named.get("method", "get").upper(), named.get("id"))
            )
        elif tag == "input" and self.forms and named.get("name"):
            form = self.forms[-1]
            if named.get("type", "text") == "hidden":
                form.hidden[named["name"]] = named.get("value", "")
            else:
                form.visible.append(named["name"])
        self._in_error = named.get("id") == "error"

    def handle_data(self, data: str) -> None:
        if self._in_error:
            self.error += data

    def handle_endtag(self, tag: str) -> None:
        self._in_error = False


def _excerpt(response: httpx.Response) -> str:
    # The status and body first: the URL (an authorization request's) can be long.
    request = response.request
    return f"{response.status_code} {response.text[:500]!r} from {request.method} {request.url}"


def pkce_pair() -> tuple[str, str]:
    """A PKCE code verifier and its S256 code challenge."""
    verifier = secrets.token_urlsafe(64)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).decode().rstrip("=")


@dataclass
class OpenIdProvider:
    """A running provider: its issuer, signing key, pre-registered client and the flows.

    ``client_id``/``redirect_uri`` are the pre-registered public native client's (auth method
    ``none``; grants authorization_code, refresh_token, device_code). ``metadata`` is the
    discovery document. Every HTTP failure raises ``OidcError`` (or a subclass) with the
    provider's answer.
    """

    issuer: str
    port: int
    private_key: rsa.RSAPrivateKey
    private_jwk: dict[str, Any]
    accounts: dict[str, dict[str, Any]]
    access_token_ttl: int
    metadata: dict[str, Any]
    client_id: str = CLIENT_ID
    redirect_uri: str = REDIRECT_URI

    @property
    def kid(self) -> str:
        return str(self.private_jwk["kid"])

    @property
    def public_jwk(self) -> dict[str, Any]:
        """The signing key's public JWK (as the provider's ``jwks_uri`` publishes it)."""
        private = {"d", "p", "q", "dp", "dq", "qi"}
        return {name: value for name, value in self.private_jwk.items() if name not in private}

    @property
    def jwks_uri(self) -> str:
        return str(self.metadata["jwks_uri"])

    @property
    def token_endpoint(self) -> str:
        return str(self.metadata["token_endpoint"])

    def _http(self) -> httpx.Client:
        # trust_env=False: no proxy from the environment may stand between a test and loopback.
        return httpx.Client(timeout=HTTP_TIMEOUT, follow_redirects=False, trust_env=False)

    def _own(self, url: str) -> bool:
        ours, other = urlsplit(self.issuer), urlsplit(url)
        return (ours.scheme, ours.netloc) == (other.scheme, other.netloc)

    # --- tokens signed with the issuer's key, for negative tests -------------------------------

    def claims_for(self, user: str, resource: str, **overrides: Any) -> dict[str, Any]:
        """The claims of an access token the provider would issue to ``user`` for ``resource``
        (``iss``, ``sub``, ``aud``, ``iat``, ``exp``, ``jti``, ``client_id``, ``scope``,
        ``groups``), with ``overrides`` applied: a value of None removes that claim."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": user,
            "aud": resource,
            "iat": now,
            "exp": now + self.access_token_ttl,
            "jti": secrets.token_urlsafe(16),
            "client_id": self.client_id,
            "scope": "mcp",
            "groups": list(self.accounts.get(user, {}).get("groups", [])),
        }
        claims.update(overrides)
        return {key: value for key, value in claims.items() if value is not None}

    def sign(
        self,
        claims: dict[str, Any],
        *,
        kid: str | None = None,
        headers: dict[str, Any] | None = None,
    ) -> str:
        """``claims`` as a JWT signed RS256 with the issuer's real key. The header is the
        provider's (``kid`` of its key, ``typ`` at+jwt) updated with ``kid`` and ``headers``."""
        header: dict[str, Any] = {"kid": kid or self.kid, "typ": "at+jwt"}
        header.update(headers or {})
        return jwt.encode(claims, self.private_key, algorithm="RS256", headers=header)

    # --- the browser's part ------------------------------------------------------------------

    def _walk(self, http: httpx.Client, response: httpx.Response, user: str) -> httpx.Response:
        """Follow the provider's redirects and fill its forms as ``user`` until the answer is a
        redirect away from the provider or a page with no form; that answer is returned.

        Forms: the login (``login`` = user, password ignored), the consent, the device pages'
        (hidden fields only: posting them confirms). A 401 with the login form again is a
        refused login (``LoginRefused``); any other 4xx/5xx answer, or a device page asking for
        the code again (the code was not accepted), raises ``OidcError``.
        """
        for _ in range(MAX_STEPS):
            if response.is_redirect:
                location = urljoin(str(response.url), response.headers["location"])
                if not self._own(location):
                    return response
                response = http.get(location)
                continue
            page = _Page(response.text)
            # 401 with the login form again: the login was refused (401 without it, e.g. an
            # unknown client_id at the authorization endpoint, is another error).
            if response.status_code == 401 and any(f.ident == "login" for f in page.forms):
                raise LoginRefused(f"{user!r} cannot log in: {page.error.strip()}")
            if response.status_code >= 400:
                raise OidcError(_excerpt(response))
            if not page.forms:
                return response
            form = page.forms[0]
            if "login" in form.visible:
                data = {**form.hidden, "login": user, "password": "ignored"}
            elif form.visible:
                raise OidcError(f"the provider asks for {form.visible}: {page.error.strip()!r}")
            else:
                data = form.hidden
            target = urljoin(str(response.url), form.action)
            response = http.request(form.method, target, data=data)
        raise OidcError(f"more than {MAX_STEPS} pages without an end (last {response.url})")

    def login(self, authorization_url: str, user: str) -> str:
        """Log in as ``user`` and consent, from an authorization URL built by anyone (the SDK's
        included); returns the redirect URL to the client carrying ``code``, ``state``, ``iss``.

        With a new cookie jar each time, so the provider always asks for login and consent.
        Raises ``LoginRefused`` for an unknown user, ``AuthorizationDenied`` when the redirect
        carries an ``error`` (e.g. invalid_target, access_denied), ``OidcError`` for an error
        page (e.g. an unknown client or redirect_uri, which the provider does not redirect).
        """
        with self._http() as http:
            final = self._walk(http, http.get(authorization_url), user)
        if not final.is_redirect:
            raise OidcError(f"the authorization ended on a page, not a redirect: {_excerpt(final)}")
        location = urljoin(str(final.url), final.headers["location"])
        query = parse_qs(urlsplit(location).query)
        if "error" in query:
            raise AuthorizationDenied(f"the authorization was refused: {query}", location)
        return location

    # --- the client's part -------------------------------------------------------------------

    def _token_request(
        self, data: dict[str, str], client_secret: str | None = None
    ) -> httpx.Response:
        with self._http() as http:
            if client_secret is None:
                return http.post(self.token_endpoint, data=data)
            # client_secret_basic, the method oidc-provider gives a registration naming none.
            return http.post(
                self.token_endpoint, data=data, auth=(data["client_id"], client_secret)
            )

    def _token(self, data: dict[str, str], client_secret: str | None = None) -> dict[str, Any]:
        response = self._token_request(data, client_secret)
        if response.status_code != 200:
            raise OidcError(_excerpt(response))
        token: dict[str, Any] = response.json()
        return token

    def authorization_url(
        self,
        resource: str | None,
        *,
        scope: str = DEFAULT_SCOPE,
        state: str,
        code_challenge: str,
        client_id: str | None = None,
        redirect_uri: str | None = None,
    ) -> str:
        """An authorization request URL (code, PKCE S256; ``prompt=consent`` with
        ``offline_access``, as the SDK does, without which the provider drops that scope)."""
        params = {
            "response_type": "code",
            "client_id": client_id or self.client_id,
            "redirect_uri": redirect_uri or self.redirect_uri,
            "scope": scope,
            "state": state,
            "code_challenge": code_challenge,
            "code_challenge_method": "S256",
        }
        if resource is not None:
            params["resource"] = resource
        if "offline_access" in scope.split():
            params["prompt"] = "consent"
        return f"{self.metadata['authorization_endpoint']}?{urlencode(params)}"

    def access_token(
        self,
        user: str,
        resource: str,
        scope: str = DEFAULT_SCOPE,
        *,
        client_id: str | None = None,
        client_secret: str | None = None,
        redirect_uri: str | None = None,
    ) -> dict[str, Any]:
        """The authorization code flow with PKCE for ``user`` and ``resource`` (by default with
        the pre-registered client): the token response (``access_token``, ``refresh_token``,
        ``expires_in``, ``scope``, ``id_token`` with ``openid``...). The redirect's ``state``
        and ``iss`` are checked. Raises as ``login`` does, or ``OidcError`` if the token request
        is refused."""
        client_id = client_id or self.client_id
        redirect_uri = redirect_uri or self.redirect_uri
        verifier, challenge = pkce_pair()
        state = secrets.token_urlsafe(16)
        url = self.authorization_url(
            resource,
            scope=scope,
            state=state,
            code_challenge=challenge,
            client_id=client_id,
            redirect_uri=redirect_uri,
        )
        query = parse_qs(urlsplit(self.login(url, user)).query)
        if query.get("state") != [state] or query.get("iss") != [self.issuer]:
            raise OidcError(f"unexpected authorization response {query}")
        return self._token(
            {
                "grant_type": "authorization_code",
                "code": query["code"][0],
                "redirect_uri": redirect_uri,
                "client_id": client_id,
                "code_verifier": verifier,
                "resource": resource,
            },
            client_secret,
        )

    def refresh(
        self,
        refresh_token: str,
        resource: str | None = None,
        *,
        client_id: str | None = None,
        client_secret: str | None = None,
    ) -> dict[str, Any]:
        """The refresh_token grant (with ``resource`` if given, else the granted one): the new
        token response. Public clients' refresh tokens rotate: the old one is then spent."""
        data = {
            "grant_type": "refresh_token",
            "refresh_token": refresh_token,
            "client_id": client_id or self.client_id,
        }
        if resource is not None:
            data["resource"] = resource
        return self._token(data, client_secret)

    def register_client(self, **metadata: Any) -> dict[str, Any]:
        """Dynamic client registration (RFC 7591, open): by default a public native client
        (auth method ``none``, redirect ``REDIRECT_URI``, the three grants) updated with
        ``metadata``; returns the registration response (``client_id``, ``client_secret`` for
        a confidential one...). Raises ``OidcError`` when refused (invalid_client_metadata...)."""
        body: dict[str, Any] = {
            "application_type": "native",
            "redirect_uris": [REDIRECT_URI],
            "grant_types": ["authorization_code", "refresh_token", DEVICE_CODE_GRANT],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
        body.update(metadata)
        with self._http() as http:
            response = http.post(str(self.metadata["registration_endpoint"]), json=body)
        if response.status_code != 201:
            raise OidcError(_excerpt(response))
        registered: dict[str, Any] = response.json()
        return registered

    # --- the device flow ---------------------------------------------------------------------

    def device_authorization(
        self, resource: str | None, scope: str = DEFAULT_SCOPE, *, client_id: str | None = None
    ) -> dict[str, Any]:
        """A device authorization request (RFC 8628): ``device_code``, ``user_code``,
        ``verification_uri(_complete)``, ``expires_in``, ``interval``."""
        data = {"client_id": client_id or self.client_id, "scope": scope}
        if resource is not None:
            data["resource"] = resource
        with self._http() as http:
            response = http.post(str(self.metadata["device_authorization_endpoint"]), data=data)
        if response.status_code != 200:
            raise OidcError(_excerpt(response))
        answer: dict[str, Any] = response.json()
        return answer

    def approve_device_code(self, verification_uri_complete_or_user_code: str, user: str) -> None:
        """On the provider's device pages, as ``user``: enter the code (or open the complete
        verification URI), confirm it, log in and consent. Raises ``LoginRefused`` for an
        unknown user, ``OidcError`` when the code is not accepted (unknown, expired, used)."""
        given = verification_uri_complete_or_user_code
        if given.startswith(("http://", "https://")):
            url = given
        else:
            url = urljoin(self.issuer, "/device") + "?" + urlencode({"user_code": given})
        with self._http() as http:
            final = self._walk(http, http.get(url), user)
        if final.is_redirect or 'id="device-approved"' not in final.text:
            raise OidcError(
                f"the device approval did not end on its success page: {_excerpt(final)}"
            )

    def device_token(
        self,
        device_code: str,
        *,
        resource: str | None = None,
        client_id: str | None = None,
        interval: float = 5.0,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Poll the token endpoint with the device code, at once and then every ``interval``
        seconds (the device authorization's ``interval``; ``slow_down`` adds 5 s, as RFC 8628
        says) while ``authorization_pending``, until a token response. ``OidcError`` on another
        error or after ``timeout`` seconds. A code approved first gives its token at once."""
        data = {
            "grant_type": DEVICE_CODE_GRANT,
            "device_code": device_code,
            "client_id": client_id or self.client_id,
        }
        if resource is not None:
            data["resource"] = resource
        deadline = time.monotonic() + timeout
        while True:
            response = self._token_request(data)
            if response.status_code == 200:
                token: dict[str, Any] = response.json()
                return token
            error = response.json().get("error") if response.status_code == 400 else None
            if error not in {"authorization_pending", "slow_down"}:
                raise OidcError(_excerpt(response))
            if error == "slow_down":
                interval += 5.0
            if time.monotonic() + interval > deadline:
                raise OidcError(f"no device token within {timeout}s: {_excerpt(response)}")
            time.sleep(interval)


def _signing_key() -> tuple[rsa.RSAPrivateKey, dict[str, Any]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = dict(RSAAlgorithm.to_jwk(key, as_dict=True))
    jwk.update(kid=f"rf-{secrets.token_hex(4)}", alg="RS256", use="sig")
    return key, jwk


def _read_first_line(process: subprocess.Popen[str], deadline: float, log: Path) -> str:
    """The process's first stdout line, waited for with a deadline (a bare readline would wait
    forever on a provider that hangs): it prints exactly that line, at once, when listening."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OidcError(f"the OpenID provider did not start in time:\n{_tail(log)}")
            if selector.select(timeout=min(remaining, 0.5)):
                line = process.stdout.readline()
                if line:
                    return line
            if process.poll() is not None:
                raise OidcError(f"the OpenID provider exited ({process.returncode}):\n{_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-4000:]
    except OSError:
        return "(no log)"


@contextmanager
def running_provider(
    directory: Path,
    accounts: dict[str, dict[str, Any]] | None = None,
    access_token_ttl: int = 300,
    *,
    port: int = 0,
    start_timeout: float = 60.0,
) -> Iterator[OpenIdProvider]:
    """Start the provider (its npm environment is installed first if not cached) with its
    configuration and stderr log (``oidc-provider.log``) in ``directory``; yield it once it
    listens and answers discovery; stop it on exit (SIGTERM, then SIGKILL after 5 s).

    ``accounts`` maps login names to ``{"groups": [...], "email": ...}`` (default alice in
    team-a, bob in team-b). ``port`` 0 takes any free one. Raises ``OidcError`` with the log's
    tail if it exits or does not print its address within ``start_timeout`` seconds.
    """
    accounts = DEFAULT_ACCOUNTS if accounts is None else accounts
    key, jwk = _signing_key()
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / "oidc-provider.json"
    config = {
        "jwks": {"keys": [jwk]},
        "accounts": accounts,
        "access_token_ttl": access_token_ttl,
        "clients": [
            {
                "client_id": CLIENT_ID,
                "client_name": "reactor-fabric tests",
                "application_type": "native",
                "token_endpoint_auth_method": "none",
                "redirect_uris": [REDIRECT_URI, "http://localhost/callback"],
                "grant_types": ["authorization_code", "refresh_token", DEVICE_CODE_GRANT],
                "response_types": ["code"],
            },
            {
                "client_id": PAGE_CLIENT_ID,
                "client_name": "reactor-fabric status page",
                "application_type": "native",
                "token_endpoint_auth_method": "none",
                "redirect_uris": ["http://127.0.0.1/"],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
            },
        ],
    }
    config_path.write_text(json.dumps(config))
    config_path.chmod(0o600)  # it holds the private key
    argv = [*envs.oidc_provider_command(SCRIPT), str(config_path), str(port)]
    log = directory / "oidc-provider.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True
        )
    try:
        first = json.loads(_read_first_line(process, time.monotonic() + start_timeout, log))
        issuer = str(first["issuer"])
        with httpx.Client(timeout=HTTP_TIMEOUT, trust_env=False) as http:
            discovery = http.get(f"{issuer}/.well-known/openid-configuration")
        discovery.raise_for_status()
        yield OpenIdProvider(
            issuer=issuer,
            port=int(first["port"]),
            private_key=key,
            private_jwk=jwk,
            accounts=accounts,
            access_token_ttl=access_token_ttl,
            metadata=discovery.json(),
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        if process.stdout is not None:
            process.stdout.close()


class MemoryTokenStorage:
    """The MCP SDK's OAuth ``TokenStorage``, in memory: one client's registration and tokens
    (``client``, ``tokens``), for the tests that let the SDK sign in."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


__all__ = [
    "CLIENT_ID",
    "DEFAULT_ACCOUNTS",
    "DEVICE_CODE_GRANT",
    "PAGE_CLIENT_ID",
    "REDIRECT_URI",
    "AuthorizationDenied",
    "LoginRefused",
    "MemoryTokenStorage",
    "OidcError",
    "OpenIdProvider",
    "pkce_pair",
    "running_provider",
]
