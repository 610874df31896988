"""Which runtime the command line builds: ``--runtime`` (or ``REACTOR_FABRIC_RUNTIME``), else the
suite's ``orchestrator.runtime``, else Docker; its engine's address from the environment, the
Kubernetes runtime from ``orchestrator.kubernetes`` and the pod's downward-API variables. Also
the runtime's egress proxy, run while a command (``catalog``, ``lock``) probes services."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import AsyncIterator, Mapping
from typing import Final

import trio

from .config.structs import Suite
from .runtime.base import Runtime
from .runtime.docker import DockerRuntime
from .runtime.engines import ENGINE_NAMES, EngineAddressError, EngineName, engine_url

RUNTIME_NAMES: Final = (*ENGINE_NAMES, "kubernetes")
# In the cluster, the orchestrator's own pod (the downward API sets these, see deploy/):
# session pods name it as their owner, so they are garbage-collected with it.
POD_NAME_ENV: Final = "REACTOR_FABRIC_POD_NAME"
# The orchestrator pod's IP (downward API, status.podIP): where session pods reach its egress
# proxy when orchestrator.kubernetes.egress_proxy names no address.
POD_IP_ENV: Final = "REACTOR_FABRIC_POD_IP"
POD_UID_ENV: Final = "REACTOR_FABRIC_POD_UID"
POD_NAMESPACE_ENV: Final = "REACTOR_FABRIC_POD_NAMESPACE"


def engine_runtime(suite: Suite, selected: str | None, environ: Mapping[str, str]) -> Runtime:
    """The runtime chosen (``--runtime`` or its variable, else the suite's).

    Error handling: EngineAddressError for an engine address or a Kubernetes setting that
    cannot work (a mount root no claim holds).
    """
    chosen = selected or suite.orchestrator.runtime
    if chosen == "kubernetes":
        return kubernetes_runtime(suite, environ)
    engine: EngineName = "podman" if chosen == "podman" else "docker"
    return DockerRuntime(
        engine_url(engine, environ, os.getuid()),
        engine=engine,
        max_frame_bytes=suite.orchestrator.max_message_bytes,
        gvisor_runtime=suite.orchestrator.gvisor_runtime,
    )


def kubernetes_runtime(suite: Suite, environ: Mapping[str, str]) -> Runtime:
    """The Kubernetes runtime of ``suite``'s ``orchestrator.kubernetes`` settings."""
    try:
        from .runtime.kubernetes import KubernetesRuntime, PodOwner  # noqa: PLC0415
    except ImportError as exc:  # the optional dependency is missing
        raise EngineAddressError(
            f"the Kubernetes runtime needs kr8s ({exc}): pip install 'reactor-fabric[kubernetes]'"
        ) from None
    settings = suite.orchestrator.kubernetes
    unclaimed = [
        root for root in suite.orchestrator.allowed_mount_roots if root not in settings.volumes
    ]
    if unclaimed:
        raise EngineAddressError(
            "with runtime kubernetes every allowed mount root needs its PersistentVolumeClaim "
            f"in orchestrator.kubernetes.volumes; none for {', '.join(unclaimed)}"
        )
    egress_listen = egress_address = None
    if settings.egress_proxy is not None:
        try:
            egress_listen = _host_port(settings.egress_proxy.listen)
            # Without an address, in the cluster: the orchestrator pod's own IP (the downward
            # API's podIP) and the port it listens on.
            pod_ip = environ.get(POD_IP_ENV, "")
            port = egress_listen[1]
            address = settings.egress_proxy.address or (
                f"[{pod_ip}]:{port}" if ":" in pod_ip else f"{pod_ip}:{port}"
            )
            egress_address = _host_port(address)
            ipaddress.ip_address(egress_address[0])
        except ValueError as exc:
            raise EngineAddressError(
                f"orchestrator.kubernetes.egress_proxy: {exc} (listen HOST:PORT, address IP:PORT; "
                f"without an address, {POD_IP_ENV} gives the IP)"
            ) from None
    pod_name, pod_uid = environ.get(POD_NAME_ENV, ""), environ.get(POD_UID_ENV, "")
    return KubernetesRuntime(
        egress_listen=egress_listen,
        egress_address=egress_address,
        namespace=settings.namespace,
        kubeconfig=settings.kubeconfig,
        claims=settings.volumes,
        owner=(
            PodOwner(pod_name, pod_uid, environ.get(POD_NAMESPACE_ENV) or None)
            if pod_name and pod_uid
            else None
        ),
        start_timeout=settings.start_timeout_seconds,
        max_frame_bytes=suite.orchestrator.max_message_bytes,
        gvisor_runtime_class=settings.gvisor_runtime_class,
    )


def _host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) as a host and a port; ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host, int(port)


@contextlib.asynccontextmanager
async def egress_served(runtime: Runtime) -> AsyncIterator[None]:
    """The egress proxy running for the catalog probe's containers of services with an
    `egress` list (as when serving; their connections are logged, not audited: no session)."""
    if runtime.egress is None:
        yield
        return
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.egress.run, lambda record: None)
        yield
        nursery.cancel_scope.cancel()
