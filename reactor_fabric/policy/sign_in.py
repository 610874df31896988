"""``orchestrator.auth`` in oidc mode made into what the gate checks (:class:`~reactor_fabric.
policy.auth.SignIn`): the token rules and the protected resource. Pure.

The resource is ``public_url`` when the suite gives one; listening on a loopback address
without it, the orchestrator's loopback URLs on its port (``127.0.0.1``, ``localhost``,
``[::1]``: a client given any of them finds metadata naming that one, and its token is for
that one). Elsewhere without ``public_url`` the orchestrator cannot know the URL clients use,
and does not start (:class:`SignInUnconfigured`). Tokens must name the resource in ``aud`` —
or ``auth.audience`` when the provider puts its own identifier there (Entra ID's
``api://…``).
"""

from __future__ import annotations

from ..config.hosts import is_loopback_name
from ..config.structs import Orchestrator
from .auth import SignIn
from .principal import ASYMMETRIC, TokenRules
from .resource_metadata import ProtectedResource

OPERATOR_GROUP_PREFIX = "group:"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


class SignInUnconfigured(ValueError):
    """oidc mode cannot work as configured (the message says what to set)."""


def sign_in_for(orchestrator: Orchestrator, listen_host: str, port: int) -> SignIn | None:
    """The sign-in of an orchestrator listening on ``listen_host:port``; None unless oidc."""
    auth = orchestrator.auth_settings
    if auth.mode != "oidc":
        return None
    if auth.issuer is None:  # the schema requires it; a struct made by hand may lack it
        raise SignInUnconfigured("auth.mode: oidc needs auth.issuer")
    if orchestrator.public_url is not None:
        resources: tuple[str, ...] = (orchestrator.public_url.rstrip("/"),)
    elif is_loopback_name(listen_host):
        resources = tuple(f"http://{name}:{port}" for name in LOOPBACK_NAMES)
    else:
        raise SignInUnconfigured(
            f"auth.mode: oidc on {listen_host!r} needs orchestrator.public_url: the URL "
            "clients reach the orchestrator at, which their access tokens are for"
        )
    audiences = frozenset((auth.audience,) if auth.audience is not None else resources)
    operators = [name for name in auth.operators if not name.startswith(OPERATOR_GROUP_PREFIX)]
    groups = [
        name.removeprefix(OPERATOR_GROUP_PREFIX)
        for name in auth.operators
        if name.startswith(OPERATOR_GROUP_PREFIX)
    ]
    rules = TokenRules(
        issuer=auth.issuer,
        audiences=audiences,
        algorithms=frozenset(auth.algorithms) & ASYMMETRIC,
        leeway=auth.leeway_seconds,
        user_claim=auth.user_claim,
        groups_claim=auth.groups_claim,
        scopes=tuple(auth.scopes),
        operator_users=frozenset(operators),
        operator_groups=frozenset(groups),
    )
    resource = ProtectedResource(resources, auth.issuer, tuple(auth.scopes))
    return SignIn(rules, resource, auth.page_client_id)
