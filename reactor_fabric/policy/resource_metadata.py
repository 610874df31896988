"""What an MCP client is told about signing in (``auth.mode: oidc``): the orchestrator's
Protected Resource Metadata (RFC 9728) and the ``WWW-Authenticate`` challenge of its 401s. Pure.

The orchestrator is one protected resource: every endpoint (``/mcp``, ``/mcp/{service}``, the
keyed URLs, WebSocket and Streamable HTTP) takes the same access token, whose audience is the
orchestrator's URL (``public_url``; listening on loopback without one, each of its loopback
URLs, so that ``http://localhost:PORT/mcp`` and ``http://127.0.0.1:PORT/mcp`` both work). A
client derives the resource from the URL it was given (the MCP SDKs accept metadata whose
``resource`` is a parent of that URL), asks the issuer for a token for it (RFC 8707), and
sends it in the ``Authorization`` header — never the query string in this mode.

The metadata is served at ``/.well-known/oauth-protected-resource`` and at its path forms
(RFC 9728 §3.1: the well-known segment inserted before the resource's path), for the
orchestrator's URL's own path and for every MCP route under it; all say the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

WELL_KNOWN = "/.well-known/oauth-protected-resource"
RESOURCE_NAME = "Reactor-Fabric"
# RFC 6750 §3: a quoted-string's characters (printable ASCII without '"' and '\\').
_QUOTABLE = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}


@dataclass(frozen=True)
class ProtectedResource:
    """The orchestrator as a protected resource: its URLs (the first is the one named when a
    request's Host matches none), the issuer, and the scopes a token must carry."""

    resources: tuple[str, ...]
    issuer: str
    scopes: tuple[str, ...] = ()

    def resource_for(self, host: str | None) -> str:
        """The resource a request with this ``Host`` header reaches (its authority's)."""
        if host:
            wanted = host.strip().lower()
            for resource in self.resources:
                if urlsplit(resource).netloc.lower() == wanted:
                    return resource
        return self.resources[0]

    def metadata_url(self, resource: str) -> str:
        """Where ``resource``'s metadata is (RFC 9728 §3.1)."""
        parts = urlsplit(resource)
        return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{parts.path.rstrip('/')}"

    def metadata(self, resource: str) -> bytes:
        """The metadata document of ``resource`` (RFC 9728 §2), as JSON."""
        document: dict[str, object] = {
            "resource": resource,
            "authorization_servers": [self.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": RESOURCE_NAME,
        }
        if self.scopes:
            document["scopes_supported"] = list(self.scopes)
        return json.dumps(document).encode()

    def serves_metadata_at(self, path: str, resource: str) -> bool:
        """Whether ``path`` is ``resource``'s metadata or a path form of it under one of its
        MCP routes (``/mcp``, ``/mcp/{service}``, ``/mcp/{service}/{key}``)."""
        if not path.startswith(WELL_KNOWN):
            return False
        rest = path[len(WELL_KNOWN) :]
        if rest in ("", "/"):
            return True
        base = urlsplit(resource).path.rstrip("/")
        if base and rest == base:
            return True
        rest = rest[len(base) :] if base and rest.startswith(base + "/") else rest
        if rest == "/mcp":
            return True
        parts = rest.split("/")  # "", "mcp", service[, key]
        return len(parts) in (3, 4) and parts[1] == "mcp" and all(parts[2:])

    def challenge(
        self, resource: str, *, error: str | None = None, description: str | None = None
    ) -> str:
        """A 401's (or 403's) ``WWW-Authenticate``: where the metadata is, the scopes asked
        for, and for a refused token its RFC 6750 error code and why."""
        value = f'Bearer resource_metadata="{_quoted(self.metadata_url(resource))}"'
        if self.scopes:
            value += f', scope="{_quoted(" ".join(self.scopes))}"'
        if error is not None:
            value += f', error="{error}"'
        if description is not None:
            value += f', error_description="{_quoted(description)}"'
        return value


def _quoted(text: str) -> str:
    """``text`` as a quoted-string's content: what cannot be in one dropped."""
    return "".join(c for c in text if c in _QUOTABLE)
