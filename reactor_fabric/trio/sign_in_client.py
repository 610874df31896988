"""The stdio bridge signing its user in (``auth.mode: oidc``): an OAuth 2.1 public client, as
the MCP authorization specification has clients do it.

From the orchestrator's 401 (``WWW-Authenticate: Bearer resource_metadata="…"``):

1. its Protected Resource Metadata (RFC 9728): the resource — which must be the orchestrator
   the bridge dialled (same scheme family, host and port: a server cannot have the bridge get
   a token for someone else and hand it over) — and its issuer;
2. the issuer's discovery document (OpenID Connect Discovery, else RFC 8414), naming itself
   exactly, its endpoints https (http on loopback only);
3. a token kept from before (:mod:`reactor_fabric.config.sign_in_store`), refreshed when it
   has expired; else
4. a client registered with the issuer (dynamic registration, RFC 7591: a public native
   client, loopback redirect, kept per issuer; or ``REACTOR_FABRIC_OIDC_CLIENT_ID``), and the
   user's sign-in: the authorization code flow with PKCE (S256) and ``state`` through the
   system browser (``$BROWSER``, else ``xdg-open`` / ``open``: see :func:`browser_command`) and
   a redirect to a
   one-shot listener on 127.0.0.1, or — without a browser, or with ``--login device`` — the
   device authorization grant (RFC 8628), its code and address printed on stderr. Every
   token is asked for the resource (RFC 8707).

Resource handling: every HTTP exchange is bounded in time and in bytes; the redirect listener
accepts on 127.0.0.1 only, reads at most 8 KiB of one request, and is closed when the sign-in
ends, whatever ends it. Error handling: :class:`SignInError`, whose message says what to do
(notably: sign in again, ``reactor-fabric login URL``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import trio

from ..config.hosts import https_or_loopback
from ..config.sign_in_store import load_sign_in, save_sign_in, sign_in_file
from ..config.token import TokenError

Login = Literal["browser", "device", "none"]
HTTP_SECONDS = 30.0
MAX_DOCUMENT_BYTES = 256 * 1024
SIGN_IN_SECONDS = 300.0
MAX_CALLBACK_BYTES = 8 * 1024
# A token this close to its expiry is refreshed before use.
EXPIRY_MARGIN_SECONDS = 30.0
CLIENT_ID_ENV = "REACTOR_FABRIC_OIDC_CLIENT_ID"
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
SIGNED_IN_PAGE = (
    b"<!doctype html><title>Signed in</title><p>Reactor-Fabric: you are signed in. "
    b"You may close this tab.</p>"
)


class SignInError(Exception):
    """The user cannot be signed in now; the message says why and what to do."""


def resource_metadata_url(challenge: str) -> str | None:
    """The ``resource_metadata`` of a ``WWW-Authenticate: Bearer`` challenge, if it has one."""
    scheme, _, rest = challenge.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    for part in rest.split(","):
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "resource_metadata":
            return value.strip().strip('"') or None
    return None


def same_server(resource: str, dialled: str) -> bool:
    """Whether ``resource`` (http/https) is the server at ``dialled`` (ws/wss/http/https)."""
    a, b = urlsplit(resource), urlsplit(dialled)
    secure = {"http": False, "ws": False, "https": True, "wss": True}
    return (
        a.scheme in secure
        and b.scheme in secure
        and secure[a.scheme] == secure[b.scheme]
        and (a.hostname or "").lower() == (b.hostname or "").lower()
        and (a.port or (443 if secure[a.scheme] else 80))
        == (b.port or (443 if secure[b.scheme] else 80))
    )


class SignInClient:
    """Signs the bridge's user in to the orchestrator at ``dialled`` (see the module docs);
    ``notify`` tells the user what to do (stderr: what their MCP client shows)."""

    def __init__(
        self,
        environ: dict[str, str],
        dialled: str,
        *,
        login: Login = "browser",
        notify: Callable[[str], None] = print,
        sign_in_seconds: float = SIGN_IN_SECONDS,
    ) -> None:
        self.environ = environ
        self.dialled = dialled
        self.login = login
        self.notify = notify
        self.sign_in_seconds = sign_in_seconds

    async def access_token(self, metadata_url: str, *, fresh: bool = False) -> str:
        """An access token for the orchestrator whose 401 named ``metadata_url``: a kept one
        (unless ``fresh``: the orchestrator refused it), refreshed, or a new sign-in."""
        if not https_or_loopback(metadata_url) or not same_server(metadata_url, self.dialled):
            raise SignInError(
                f"the orchestrator at {self.dialled} names resource metadata elsewhere "
                f"({metadata_url}): not signing in for it"
            )
        async with httpx.AsyncClient(timeout=HTTP_SECONDS, follow_redirects=False) as http:
            metadata = await _get_json(http, metadata_url)
            resource, issuer, scopes = self._resource(metadata)
            server = await self._server(http, issuer)
            path = sign_in_file(self.environ, issuer)
            record = _loaded(path) or {"issuer": issuer, "tokens": {}}
            tokens = record.setdefault("tokens", {})
            kept = tokens.get(resource)
            if isinstance(kept, dict) and not fresh:
                if float(kept.get("expires_at", 0)) - EXPIRY_MARGIN_SECONDS > time.time():
                    return str(kept["access_token"])
                refreshed = await self._refresh(http, server, record, resource, kept)
                if refreshed is not None:
                    tokens[resource] = refreshed
                    _saved(path, record)
                    return str(refreshed["access_token"])
            if self.login == "none":
                raise SignInError(
                    f"you are not signed in to {resource} (or your sign-in has expired): run "
                    f"`reactor-fabric login {self.dialled}`"
                )
            client = await self._client(http, server, record)
            _saved(path, record)
            scope = " ".join(dict.fromkeys(["openid", "offline_access", *scopes]))
            if self.login == "device" or not self._can_open_browser():
                got = await self._device_flow(http, server, client, resource, scope)
            else:
                got = await self._browser_flow(http, server, client, resource, scope)
            tokens[resource] = got
            _saved(path, record)
            return str(got["access_token"])

    # --- what the orchestrator and the issuer say ------------------------------------------

    def _resource(self, metadata: object) -> tuple[str, str, list[str]]:
        if not isinstance(metadata, dict):
            raise SignInError("the orchestrator's resource metadata is not a JSON object")
        resource, servers = metadata.get("resource"), metadata.get("authorization_servers")
        if not isinstance(resource, str) or not same_server(resource, self.dialled):
            raise SignInError(
                f"the orchestrator's resource metadata names another resource ({resource!r})"
            )
        if not isinstance(servers, list) or not servers or not https_or_loopback(servers[0]):
            raise SignInError("the orchestrator's resource metadata names no usable issuer")
        scopes = metadata.get("scopes_supported")
        listed = [s for s in scopes if isinstance(s, str)] if isinstance(scopes, list) else []
        return resource, str(servers[0]), listed

    async def _server(self, http: httpx.AsyncClient, issuer: str) -> dict[str, Any]:
        base = issuer.rstrip("/")
        last: SignInError | None = None
        for suffix in (
            "/.well-known/openid-configuration",
            "/.well-known/oauth-authorization-server",
        ):
            try:
                document = await _get_json(http, base + suffix)
            except SignInError as exc:
                last = exc
                continue
            if not isinstance(document, dict) or document.get("issuer") != issuer:
                raise SignInError(f"{base + suffix} does not name the issuer {issuer!r}")
            for name in ("token_endpoint", "authorization_endpoint"):
                if not https_or_loopback(document.get(name)):
                    raise SignInError(f"the issuer's {name} is not an https URL")
            return document
        raise SignInError(f"the issuer {issuer} has no discovery document ({last})")

    # --- the client ---------------------------------------------------------------------------

    async def _client(
        self, http: httpx.AsyncClient, server: dict[str, Any], record: dict[str, Any]
    ) -> dict[str, Any]:
        """The client the bridge is, at this issuer: given, kept, or registered now."""
        given = self.environ.get(CLIENT_ID_ENV)
        if given:
            return {"client_id": given}
        kept = record.get("client")
        if isinstance(kept, dict) and isinstance(kept.get("client_id"), str):
            return kept
        endpoint = server.get("registration_endpoint")
        if not https_or_loopback(endpoint):
            raise SignInError(
                "the issuer does not let clients register themselves: register the bridge as "
                f"a public client with a loopback redirect URI, and set {CLIENT_ID_ENV}"
            )
        grants = ["authorization_code", "refresh_token"]
        if https_or_loopback(server.get("device_authorization_endpoint")):
            grants.append(DEVICE_GRANT)
        metadata = {
            "client_name": "Reactor-Fabric bridge",
            "application_type": "native",
            "redirect_uris": ["http://127.0.0.1/callback"],
            "grant_types": grants,
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
        answer = await _post(http, str(endpoint), json_body=metadata)
        if not isinstance(answer.get("client_id"), str):
            raise SignInError("the issuer's registration gave no client_id")
        client = {"client_id": answer["client_id"]}
        if isinstance(answer.get("client_secret"), str):
            client["client_secret"] = answer["client_secret"]
        record["client"] = client
        return client

    def _can_open_browser(self) -> bool:
        return browser_command(self.environ, "https://x") is not None

    # --- the flows ----------------------------------------------------------------------------

    async def _browser_flow(
        self,
        http: httpx.AsyncClient,
        server: dict[str, Any],
        client: dict[str, Any],
        resource: str,
        scope: str,
    ) -> dict[str, Any]:
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        state = secrets.token_urlsafe(24)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        try:
            port = listeners[0].socket.getsockname()[1]
            redirect_uri = f"http://127.0.0.1:{port}/callback"
            query = {
                "response_type": "code",
                "client_id": client["client_id"],
                "redirect_uri": redirect_uri,
                "scope": scope,
                "state": state,
                "code_challenge": challenge.rstrip(b"=").decode(),
                "code_challenge_method": "S256",
                "resource": resource,
                "prompt": "consent",
            }
            url = f"{server['authorization_endpoint']}?{urlencode(query)}"
            self.notify(f"sign in to {resource} in your browser: {url}")
            opened = await trio.to_thread.run_sync(open_browser, self.environ, url)
            if not opened:
                self.notify("no browser could be opened: open the address above yourself")
            with trio.move_on_after(self.sign_in_seconds) as waited:
                answer = await _callback(listeners[0], state)
            if waited.cancelled_caught:
                raise SignInError(f"nobody signed in within {self.sign_in_seconds:g} s")
        finally:
            for listener in listeners:
                await listener.aclose()
        if "error" in answer:
            raise SignInError(f"the sign-in was refused: {answer.get('error')}")
        if "iss" in answer and answer["iss"] != server["issuer"]:
            raise SignInError("the sign-in's answer comes from another issuer (iss)")
        grant = {
            "grant_type": "authorization_code",
            "code": answer.get("code", ""),
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
            "resource": resource,
        }
        return _tokens(await self._token_request(http, server, client, grant))

    async def _device_flow(
        self,
        http: httpx.AsyncClient,
        server: dict[str, Any],
        client: dict[str, Any],
        resource: str,
        scope: str,
    ) -> dict[str, Any]:
        endpoint = server.get("device_authorization_endpoint")
        if not https_or_loopback(endpoint):
            raise SignInError("no browser, and the issuer offers no device sign-in")
        asked = {"client_id": client["client_id"], "scope": scope, "resource": resource}
        device = await _post(http, str(endpoint), form=asked)
        where = device.get("verification_uri_complete") or device.get("verification_uri")
        self.notify(
            f"to sign in to {resource}, visit {where} and enter the code {device.get('user_code')}"
        )
        interval = float(device.get("interval") or 5)
        deadline = trio.current_time() + min(
            float(device.get("expires_in") or self.sign_in_seconds), self.sign_in_seconds
        )
        grant = {
            "grant_type": DEVICE_GRANT,
            "device_code": device.get("device_code"),
            "resource": resource,
        }
        while trio.current_time() < deadline:
            await trio.sleep(interval)
            answer = await self._token_request(http, server, client, grant, pending_ok=True)
            error = answer.get("error")
            if error == "authorization_pending":
                continue
            if error == "slow_down":
                interval += 5
                continue
            if error is not None:
                raise SignInError(f"the device sign-in ended: {error}")
            return _tokens(answer)
        raise SignInError(f"nobody signed in within {self.sign_in_seconds:g} s")

    async def _refresh(
        self,
        http: httpx.AsyncClient,
        server: dict[str, Any],
        record: dict[str, Any],
        resource: str,
        kept: dict[str, Any],
    ) -> dict[str, Any] | None:
        """A refreshed token for ``resource``; None when there is no refresh token or the issuer
        refuses it (the user signs in again)."""
        refresh_token = kept.get("refresh_token")
        client = record.get("client")
        if not isinstance(refresh_token, str) or not isinstance(client, dict):
            return None
        grant = {
            "grant_type": "refresh_token",
            "refresh_token": refresh_token,
            "resource": resource,
        }
        try:
            answer = await self._token_request(http, server, client, grant)
        except SignInError as exc:
            self.notify(f"your sign-in could not be renewed ({exc}): signing in again")
            return None
        renewed = _tokens(answer)
        renewed.setdefault("refresh_token", refresh_token)
        return renewed

    async def _token_request(
        self,
        http: httpx.AsyncClient,
        server: dict[str, Any],
        client: dict[str, Any],
        grant: dict[str, Any],
        *,
        pending_ok: bool = False,
    ) -> dict[str, Any]:
        form = {**grant, "client_id": client["client_id"]}
        auth = None
        if "client_secret" in client:
            auth = (client["client_id"], client["client_secret"])
        return await _post(
            http, server["token_endpoint"], form=form, auth=auth, errors_ok=pending_ok
        )


def browser_command(environ: dict[str, str], url: str) -> list[str] | None:
    """How to open ``url`` in the user's graphical browser: the first entry of ``$BROWSER``
    (``%s`` replaced by the URL, else the URL appended), else ``xdg-open`` or ``open``; None
    when there is none. Never :mod:`webbrowser`'s console browsers (lynx, w3m…): the bridge's
    stdin and stdout are its MCP client's, which a browser in the terminal would read and
    write."""
    configured = environ.get("BROWSER", "").split(os.pathsep)[0].strip()
    if configured:
        words = shlex.split(configured)
        if any("%s" in word for word in words):
            return [word.replace("%s", url) for word in words]
        return [*words, url]
    for opener in ("xdg-open", "open"):
        found = shutil.which(opener, path=environ.get("PATH"))
        if found is not None:
            return [found, url]
    return None


def open_browser(environ: dict[str, str], url: str) -> bool:
    """Start the browser on ``url`` (blocking; a thread's work): with nothing of the bridge's
    stdio — its stdin from /dev/null, its output to stderr — in a session of its own. Whether
    it started and said it opened the page (exit status 0, or still running after 5 s)."""
    if not url.startswith(("https://", "http://")):
        return False
    command = browser_command(environ, url)
    if command is None:
        return False
    try:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr.fileno(),
            stderr=sys.stderr.fileno(),
            start_new_session=True,
            env=environ,
        )
    except OSError:
        return False
    try:
        return child.wait(timeout=5) == 0
    except subprocess.TimeoutExpired:
        return True  # (a browser that stays: it is showing the page)


def _tokens(answer: dict[str, Any]) -> dict[str, Any]:
    token = answer.get("access_token")
    if not isinstance(token, str) or not token:
        raise SignInError("the issuer's token answer holds no access token")
    kept: dict[str, Any] = {
        "access_token": token,
        "expires_at": time.time() + float(answer.get("expires_in") or 300),
    }
    if isinstance(answer.get("refresh_token"), str):
        kept["refresh_token"] = answer["refresh_token"]
    return kept


def _loaded(path: Path) -> dict[str, Any] | None:
    try:
        return load_sign_in(path)
    except TokenError as exc:
        raise SignInError(str(exc)) from exc


def _saved(path: Path, record: dict[str, Any]) -> None:
    try:
        save_sign_in(path, record)
    except TokenError as exc:
        raise SignInError(str(exc)) from exc


async def _get_json(http: httpx.AsyncClient, url: str) -> object:
    try:
        answer = await http.get(url, headers={"accept": "application/json"})
    except httpx.HTTPError as exc:
        raise SignInError(f"{url} cannot be fetched: {type(exc).__name__}") from exc
    if answer.status_code != 200:
        raise SignInError(f"{url} answered HTTP {answer.status_code}")
    return _json_of(answer, url)


async def _post(
    http: httpx.AsyncClient,
    url: str,
    *,
    form: dict[str, Any] | None = None,
    json_body: dict[str, Any] | None = None,
    auth: tuple[str, str] | None = None,
    errors_ok: bool = False,
) -> dict[str, Any]:
    try:
        basic = httpx.BasicAuth(*auth) if auth is not None else httpx.USE_CLIENT_DEFAULT
        answer = await http.post(url, data=form, json=json_body, auth=basic)
    except httpx.HTTPError as exc:
        raise SignInError(f"{url} cannot be reached: {type(exc).__name__}") from exc
    body = _json_of(answer, url)
    if not isinstance(body, dict):
        raise SignInError(f"{url} did not answer a JSON object")
    if answer.status_code >= 400 and not (errors_ok and "error" in body):
        detail = body.get("error_description") or body.get("error") or answer.status_code
        raise SignInError(f"{url} refused: {detail}")
    return body


def _json_of(answer: httpx.Response, url: str) -> object:
    if len(answer.content) > MAX_DOCUMENT_BYTES:
        raise SignInError(f"{url} sent more than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return json.loads(answer.content)
    except ValueError as exc:
        raise SignInError(f"{url} did not send JSON") from exc


async def _callback(listener: trio.SocketListener, state: str) -> dict[str, str]:
    """The query of the first request to ``/callback`` on ``listener`` that carries ``state``,
    after answering it with a page saying the sign-in is done. Anything else — another path, a
    request without this sign-in's state (any local process can reach the port) — is answered
    404 and waited past."""
    while True:
        stream = await listener.accept()
        async with stream:
            request = bytearray()
            with trio.move_on_after(10):
                while b"\r\n\r\n" not in request and len(request) < MAX_CALLBACK_BYTES:
                    data = await stream.receive_some(MAX_CALLBACK_BYTES)
                    if not data:
                        break
                    request += data
            line = bytes(request).split(b"\r\n", 1)[0].decode("latin-1")
            method, _, rest = line.partition(" ")
            parts = urlsplit(rest.partition(" ")[0])
            try:
                query = parse_qs(parts.query, max_num_fields=32)
            except ValueError:
                query = {}
            answer = {name: values[-1] for name, values in query.items()}
            found = method == "GET" and parts.path == "/callback" and answer.get("state") == state
            status = b"200 OK" if found else b"404 Not Found"
            body = SIGNED_IN_PAGE if found else b"not found"
            head = (
                b"HTTP/1.1 " + status + b"\r\ncontent-type: text/html; charset=utf-8\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            )
            with trio.move_on_after(10):
                await stream.send_all(head + body)
            if found:
                return answer
