"""The egress part: a service's egress allowlist (``host:port`` entries) and its proxy.

A container with one has no network (:mod:`.network`); the runtime serves it a forward proxy
that lets it reach the listed destinations alone (:mod:`reactor_fabric.runtime.egress_proxy`;
the decisions in :mod:`reactor_fabric.protocol.egress`), which its clients find in the usual
variables. Refused before anything is made (-32002 ``egress_unavailable``) where the runtime
cannot give it its proxy: rather than started with a network, or without the destinations it
needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..._reasons import EGRESS_UNAVAILABLE
from ...config.structs import Service
from .context import SpecContext, SpecRefusal

# Where a container with an egress allowlist finds its proxy: a port on its own loopback, where
# fabric-stdio forwards each connection to the orchestrator (reactor_fabric.runtime.egress_proxy).
EGRESS_PROXY_PORT = 3128
EGRESS_PROXY_URL = f"http://127.0.0.1:{EGRESS_PROXY_PORT}"


def proxy_environment(url: str = EGRESS_PROXY_URL) -> dict[str, str]:
    """The variables clients read their proxy (``url``) from, both spellings (curl reads only
    the lower case http_proxy, Go only upper case on some paths); NO_PROXY empty, so that
    nothing — not even loopback — is reached past the proxy (there is no route past it
    anyway)."""
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
    environment = dict.fromkeys(names, url)
    environment |= {name.lower(): url for name in names}
    environment |= {"NO_PROXY": "", "no_proxy": ""}
    return environment


@dataclass(frozen=True)
class EgressPart:
    allowlist: tuple[str, ...]
    # Where the container's clients find the proxy: its loopback port, unless the runtime
    # gives it another address (the Kubernetes runtime: the proxy in the cluster, with the
    # pod's token).
    proxy_url: str = EGRESS_PROXY_URL

    @property
    def environment(self) -> dict[str, str]:
        return proxy_environment(self.proxy_url)


def egress(service: Service, context: SpecContext) -> EgressPart | SpecRefusal | None:
    """The allowlist in force (None: no proxy, the network decides; an empty list too: no
    network, nothing to proxy), or why the runtime cannot have it."""
    allowlist = service.egress_in_force
    if not allowlist:
        return None
    missing = context.capabilities.egress_missing
    if missing:
        name = context.service_name
        message = f"service {name!r} has an egress allowlist, and {missing}"
        return SpecRefusal(name, EGRESS_UNAVAILABLE, message)
    return EgressPart(tuple(allowlist))
