"""The OpenID provider's signing keys (``auth.mode: oidc``), fetched when first needed and kept.

OpenID Connect Discovery: ``{issuer}/.well-known/openid-configuration`` names the ``jwks_uri``;
the key set there (a JWK set) verifies access tokens (:mod:`reactor_fabric.policy.
access_tokens`). The discovery document must name the same issuer, character for character
(OpenID Connect Discovery §4.3: otherwise a provider could speak for another), and its
``jwks_uri`` is https, or http on a loopback address, as the issuer is.

Kept for ``max_age`` (10 minutes), then fetched again at the next token. A token naming a key
the set lacks makes the set fetched again — the issuer may have rotated its keys — but at most
once per ``min_interval`` (30 s): a stream of tokens with made-up key ids cannot make the
orchestrator hammer the issuer. One fetch at a time: requests that need keys while one is under
way wait for it and share its result.

Imported only in oidc mode (with :mod:`~reactor_fabric.policy.access_tokens`: PyJWT and
cryptography are 20 MB).

Resource handling: every fetch is bounded in time (``timeout`` for the whole exchange) and in
bytes (``max_bytes``, counted while reading; more is refused, not read). A fetch opens its own
HTTP client and closes it before returning (fetches are rare: one client per orchestrator
would be held for hours for nothing). Error handling: whatever fails — the network, a status,
a body that is not what it must be — is :class:`IssuerUnavailable` with a message saying what;
a set fetched before is kept and used while a later fetch fails.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from typing import Protocol

import httpx
import trio

from .._errors import IssuerUnavailable
from ..config.hosts import https_or_loopback
from ..policy.access_tokens import KeySet

log = logging.getLogger(__name__)

DISCOVERY_PATH = "/.well-known/openid-configuration"
MAX_DOCUMENT_BYTES = 256 * 1024
FETCH_SECONDS = 10.0


class JsonFetcher(Protocol):
    async def get_json(self, url: str) -> object:
        """The JSON document at ``url``; IssuerUnavailable when it cannot be had."""
        ...


class HttpFetcher:
    """:class:`JsonFetcher` over HTTP with httpx.

    Redirects are not followed (a discovery document or key set that moves is refused rather
    than fetched from wherever it points); the proxy settings of the environment apply
    (``HTTPS_PROXY``: a company's network may reach its provider only through one)."""

    def __init__(self, *, timeout: float = FETCH_SECONDS, max_bytes: int = MAX_DOCUMENT_BYTES):
        self.timeout = timeout
        self.max_bytes = max_bytes

    async def get_json(self, url: str) -> object:

        body = bytearray()
        with trio.move_on_after(self.timeout) as bound:
            try:
                async with (
                    httpx.AsyncClient(timeout=self.timeout, follow_redirects=False) as client,
                    client.stream("GET", url, headers={"accept": "application/json"}) as answer,
                ):
                    if answer.status_code != 200:
                        raise IssuerUnavailable(f"{url} answered HTTP {answer.status_code}")
                    too_much = f"{url} sent more than {self.max_bytes} bytes"
                    declared = answer.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > self.max_bytes:
                        raise IssuerUnavailable(too_much)  # not a byte of it read
                    # Closed when left early (too much): the response's generators hold the
                    # connection until they are.
                    chunks = answer.aiter_bytes()
                    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                        async for chunk in chunks:
                            body += chunk
                            if len(body) > self.max_bytes:
                                raise IssuerUnavailable(too_much)
            except httpx.HTTPError as exc:
                raise IssuerUnavailable(f"{url} cannot be fetched: {type(exc).__name__}") from exc
        if bound.cancelled_caught:
            raise IssuerUnavailable(f"{url} did not answer within {self.timeout:g}s")
        try:
            return json.loads(body)
        except ValueError as exc:
            raise IssuerUnavailable(f"{url} did not send JSON") from exc


class IssuerKeys:
    """The key set of ``issuer``, fetched through ``fetcher`` (see module docs); ``clock``:
    trio's by default (the driver's tests pass the autojump clock's)."""

    def __init__(
        self,
        issuer: str,
        fetcher: JsonFetcher,
        *,
        max_age: float = 600.0,
        min_interval: float = 30.0,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.issuer = issuer
        self.fetcher = fetcher
        self.max_age = max_age
        self.min_interval = min_interval
        self.clock = clock
        self._keys: KeySet | None = None
        self._fetched_at = -float("inf")
        self._attempted_at = -float("inf")
        self._failure = "the issuer's keys were not fetched yet"
        self._lock = trio.Lock()

    async def current(self) -> KeySet:
        """The keys: kept ones while fresh, else fetched (a kept set outlives a failed fetch).
        IssuerUnavailable when there are none to give. A failed fetch is not tried again
        within ``min_interval``: while the issuer is down, requests are answered at once (with
        the kept keys, or refused), not each after a fetch's time-out."""
        now = self.clock()
        if self._keys is not None and now - self._fetched_at < self.max_age:
            return self._keys
        if now - self._attempted_at < self.min_interval:
            if self._keys is not None:
                return self._keys
            raise IssuerUnavailable(self._failure)
        return await self._fetch()

    async def after_unknown_key(self) -> KeySet | None:
        """Fetched again because a token named a key the set lacks; None when the set was
        fetched (or tried) within ``min_interval`` — it would not have changed."""
        if self.clock() - self._attempted_at < self.min_interval:
            return None
        return await self._fetch()

    async def _fetch(self) -> KeySet:
        attempted = self._attempted_at
        async with self._lock:
            if self._attempted_at != attempted:
                # Another request fetched (or tried) while this one waited: its result will do.
                if self._keys is None:
                    raise IssuerUnavailable(self._failure)
                return self._keys
            self._attempted_at = self.clock()
            try:
                keys = await self._fetch_keys()
            except IssuerUnavailable as exc:
                self._failure = str(exc)
                log.warning(
                    "issuer_keys_unavailable", extra={"issuer": self.issuer, "detail": str(exc)}
                )
                if self._keys is not None:
                    return self._keys
                raise
            self._keys, self._fetched_at = keys, self.clock()
            log.info("issuer_keys_fetched", extra={"issuer": self.issuer, "keys": len(keys.keys)})
            return keys

    async def _fetch_keys(self) -> KeySet:
        discovery_url = self.issuer.rstrip("/") + DISCOVERY_PATH
        discovery = await self.fetcher.get_json(discovery_url)
        if not isinstance(discovery, dict):
            raise IssuerUnavailable(f"{discovery_url} is not a JSON object")
        if discovery.get("issuer") != self.issuer:
            raise IssuerUnavailable(
                f"{discovery_url} names the issuer {str(discovery.get('issuer'))[:200]!r}, "
                f"not {self.issuer!r}"
            )
        jwks_uri = discovery.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not https_or_loopback(jwks_uri):
            raise IssuerUnavailable(
                f"{discovery_url}: jwks_uri is not an https URL (or http on loopback)"
            )
        try:
            return KeySet.from_document(await self.fetcher.get_json(jwks_uri))
        except ValueError as exc:
            raise IssuerUnavailable(f"{jwks_uri}: {exc}") from exc
