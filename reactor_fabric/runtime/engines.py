"""Which container engine the Docker runtime talks to, and where it listens.

The Docker runtime speaks Docker's Engine API. Two engines serve it: Docker, and Podman
(``podman system service``), whose compatible API runs the same containers with the same
flags. The suite's ``orchestrator.runtime`` (or ``--runtime``) says which one to reach:

- ``docker``: where Docker's own tools look (``DOCKER_HOST``, else ``/var/run/docker.sock``);
- ``podman``: ``CONTAINER_HOST`` (Podman's own variable), else the rootful service's socket
  ``/run/podman/podman.sock`` when running as root, else the rootless one under
  ``XDG_RUNTIME_DIR``.

Whichever was chosen, the engine that answers says what it is (``GET /version``: Podman lists
a "Podman Engine" component): a Podman behind ``DOCKER_HOST`` is found to be Podman, and that
is what the health report and the logs name. Whether the engine is on this machine (a Unix
socket) decides what the Docker runtime can give a container of its own (socket stdio, file
secrets): :func:`engine_is_local`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from ..policy.mounts import PODMAN_ROOTFUL_SOCKET, rootless_podman_socket

EngineName = Literal["docker", "podman"]
ENGINE_NAMES: Final[tuple[str, ...]] = get_args(EngineName)
PODMAN_COMPONENT: Final = "Podman Engine"


class EngineAddressError(ValueError):
    """The engine's address cannot be used (e.g. a remote ``ssh://`` Podman)."""


def engine_url(engine: EngineName, environ: Mapping[str, str], uid: int) -> str | None:
    """The API address for ``engine``; None: Docker's default (``DOCKER_HOST``…, see
    :meth:`.engine_api.EngineAddress.parse`)."""
    if engine == "docker":
        return None
    host = environ.get("CONTAINER_HOST", "")
    if host:
        if not host.startswith(("unix://", "tcp://")):
            # Podman's ssh:// connections carry an identity file and a remote socket path that
            # our engine client does not follow; a tunnelled socket works (unix://…).
            raise EngineAddressError(
                f"CONTAINER_HOST={host!r}: only unix:// and tcp:// addresses can be used"
            )
        return host
    if uid == 0:
        return f"unix://{PODMAN_ROOTFUL_SOCKET}"
    return f"unix://{rootless_podman_socket(environ, uid)}"


def engine_is_local(base_url: str | None, environ: Mapping[str, str]) -> bool:
    """Whether the engine is on this machine (a Unix socket): only then can a container be
    given a socket of ours by path."""
    address = base_url if base_url is not None else environ.get("DOCKER_HOST", "unix://")
    return address.startswith(("unix://", "/"))


@dataclass(frozen=True)
class EngineIdentity:
    """What the engine says it is."""

    name: EngineName
    version: str
    api_version: str

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def identify(version_info: Mapping[str, Any]) -> EngineIdentity:
    """The engine behind a ``GET /version`` answer."""
    components = version_info.get("Components")
    for component in components if isinstance(components, list) else ():
        if isinstance(component, Mapping) and component.get("Name") == PODMAN_COMPONENT:
            version = component.get("Version") or version_info.get("Version")
            return EngineIdentity("podman", str(version or "unknown"), _api(version_info))
    return EngineIdentity(
        "docker", str(version_info.get("Version") or "unknown"), _api(version_info)
    )


def _api(version_info: Mapping[str, Any]) -> str:
    return str(version_info.get("ApiVersion") or "unknown")
