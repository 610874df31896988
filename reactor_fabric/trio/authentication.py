"""Who a request is from: the gate's decision (:func:`reactor_fabric.policy.auth.admit`) and, in
``auth.mode: oidc``, its access token checked against the issuer's keys (:mod:`.issuer_keys`).

Every route and transport asks :meth:`Authenticator.admit` before anything else. A token that
was checked is remembered until it expires (at most :data:`CHECKED_TOKENS`, the oldest
forgotten first): a Streamable HTTP client sends it with every message, and a signature
costs more than the message's relaying.

Resource handling: none held but the bounded memory of checked tokens. Error handling: the
issuer's keys not to be had is a 503 refusal (``issuer_unavailable``), never an exception
out of here.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._errors import IssuerUnavailable, SecurityViolation
from .._reasons import ISSUER_UNAVAILABLE, TOKEN_INVALID
from ..policy.auth import BearerToken, Gate, Refusal, admit, sign_in_refusal
from ..policy.principal import Principal, TokenProblem, UnknownKey
from ..protocol.jsonrpc import error_response

if TYPE_CHECKING:
    from ..policy.access_tokens import KeySet
    from .issuer_keys import IssuerKeys

log = logging.getLogger(__name__)

CHECKED_TOKENS = 256


class Authenticator:
    """The gate, and the issuer's keys when it has a sign-in (``keys``: None otherwise);
    ``wall_clock``: what a token's times are compared with."""

    def __init__(
        self,
        gate: Gate,
        keys: IssuerKeys | None = None,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if (gate.sign_in is None) != (keys is None):
            raise ValueError("the issuer's keys go with a sign-in, and only with one")
        self.gate = gate
        self.keys = keys
        self.wall_clock = wall_clock
        if keys is not None:
            # Here, not at the top: PyJWT and cryptography are 20 MB that only oidc mode uses.
            from ..policy.access_tokens import check_access_token  # noqa: PLC0415

            self._check_access_token = check_access_token
        self._checked: collections.OrderedDict[str, Principal] = collections.OrderedDict()

    async def admit(self, headers: dict[bytes, str], query: str, path: str) -> Principal | Refusal:
        """Who the request is from, or the answer refusing it."""
        decision = admit(self.gate, headers, query, path)
        if not isinstance(decision, BearerToken):
            return decision
        return await self._check(decision)

    async def _check(self, bearer: BearerToken) -> Principal | Refusal:
        sign_in, keys = self.gate.sign_in, self.keys
        assert sign_in is not None  # the constructor said so
        assert keys is not None
        now = self.wall_clock()
        known = self._checked.get(bearer.value)
        if known is not None and known.expires is not None and now <= known.expires:
            return known
        try:
            key_set = await keys.current()
            outcome = self._verify(bearer.value, key_set, now)
            if isinstance(outcome, UnknownKey):
                refreshed = await keys.after_unknown_key()
                if refreshed is not None:
                    outcome = self._verify(bearer.value, refreshed, now)
        except IssuerUnavailable as exc:
            log.warning("request_refused", extra={"status": 503, "reason": ISSUER_UNAVAILABLE})
            error = SecurityViolation(
                f"the access token cannot be checked now: the issuer's keys cannot be fetched "
                f"({exc}); try again later",
                reason=ISSUER_UNAVAILABLE,
            )
            return Refusal(503, ISSUER_UNAVAILABLE, error_response(None, error))
        if isinstance(outcome, UnknownKey):
            outcome = TokenProblem(TOKEN_INVALID, "the token's key is not one of the issuer's")
        if isinstance(outcome, TokenProblem):
            log.warning(
                "request_refused",
                extra={
                    "status": outcome.status,
                    "reason": outcome.reason,
                    "detail": outcome.detail,
                },
            )
            return sign_in_refusal(sign_in.resource, bearer.resource, outcome)
        self._remember(bearer.value, outcome)
        return outcome

    def _verify(
        self, token: str, keys: KeySet, now: float
    ) -> Principal | TokenProblem | UnknownKey:
        assert self.gate.sign_in is not None  # only called with one
        return self._check_access_token(token, keys, self.gate.sign_in.rules, now)

    def _remember(self, token: str, principal: Principal) -> None:
        self._checked[token] = principal
        while len(self._checked) > CHECKED_TOKENS:
            self._checked.popitem(last=False)
