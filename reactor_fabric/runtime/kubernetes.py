"""Session containers as Kubernetes Pods, reached through the API server.

``orchestrator.runtime: kubernetes``: each container the product would start on Docker becomes a
Pod (:func:`~.kubernetes_manifests.pod_manifest`: the same spec, limits and labels) in one
namespace; the runtime watches it until its server runs (:func:`~reactor_fabric.protocol.
k8s_pod_state.pod_progress`), then attaches to its stdio through ``pods/attach``
(:mod:`.kubernetes_attach`, framed by :class:`~reactor_fabric.protocol.k8s_attach.
AttachChannels`). :class:`KubernetesRuntime` meets :class:`~.base.Runtime`: it decides what a
start asks of the API server and in which order (the Secret, the NetworkPolicy, the pod, the
watch, the attach), answers what the rest of the product asks of a pod, removes it, and lists
those labelled as ours. The rest is in its parts:

- :mod:`.kubernetes_calls` — kr8s's client (kubeconfig or in-cluster credentials, loaded
  again on a 401), every call bounded in time, the attach's handshake;
- :mod:`.kubernetes_operations` — what each step asks of the API server and what its answer
  means (a pod created, watched, read, listed, deleted; its NetworkPolicy; the Secrets);
- :mod:`.kubernetes_manifests` — the spec as a Pod, its Secret and NetworkPolicy, and the
  queries that find them again (pure);
- :mod:`.kubernetes_errors` — what the API server's failures mean, as the product's errors
  (pure);
- :mod:`.kubernetes_container` — a started pod's attach as stdin, stdout and stderr.

What differs from Docker, on purpose or by necessity:

- the server starts before the attach (Kubernetes cannot attach to a container not yet
  running); its stdin stays open until the first attach (``stdinOnce``), so a stdio server,
  which speaks only when spoken to, loses nothing;
- mounts are PersistentVolumeClaims with a ``subPath`` (``orchestrator.kubernetes.volumes``);
  the orchestrator validates the path below an allowed root on its own mount of the claim, as it
  does on Docker, but the pins it takes cannot travel to another node: the kubelet resolves the
  ``subPath`` itself (refusing symlinks that leave the volume), so one claim should hold the
  directories of one trust domain only;
- not enforced by a pod: the pids limit (the kubelet's ``podPidsLimit``), ``network`` (a
  NetworkPolicy does it: ``deploy/kubernetes``), the check that a mount target does not shadow
  a path of the image, and a CPU weight change (pooled pods keep their request);
- the image id is not known (the API has no image inspection): the catalog is learned again at
  each start instead of cached by image, and the warm pool does not notice a retagged image.

Resource handling: :meth:`KubernetesRuntime.spawn` deletes the pod whenever the start fails or
is cancelled (shielded, bounded); a create whose answer a cancellation lost is deleted by name
all the same, and the sweeper (labels, as on Docker) is the backstop for one that lands after.
An egress pod's NetworkPolicy and proxy token go with the pod (:meth:`KubernetesRuntime.remove`,
or the failed start). :meth:`KubernetesRuntime.close` deletes the services' Secrets it made and
closes the HTTP client.

Error handling: an API server that does not answer, or credentials that cannot be loaded, are
DockerUnavailable (-32001, ``kubernetes_unavailable`` / ``kubernetes_timeout``); anything
about one pod is ContainerStartFailure (-32002) with the reasons a Docker start has
(``image_not_found``, ``start_failed``, ``container_exited``, ``create_failed`` …), translated
in one place (:mod:`.kubernetes_errors`). A 401 makes the runtime load its credentials again
and repeat the call once (tokens rotate). Removal never raises (it runs in ``finally`` blocks).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import trio

from ..observe.redaction import SECRET_VALUES
from ..policy.container_parts.context import RuntimeCapabilities
from ..policy.container_parts.ownership import LABEL_SERVICE
from ..policy.container_spec import ContainerSpec
from ..policy.pinning import PinSet
from ..protocol.egress import Allowlist, proxy_url
from ..protocol.k8s_attach import AttachStatus
from ..protocol.k8s_pod_state import Exited, pod_progress
from . import kubernetes_errors as errors
from .base import ContainerExit, Gate, ManagedContainer
from .child_sockets import ChildSockets
from .egress_proxy import EgressProxy
from .kubernetes_calls import API_CALL_TIMEOUT, KubernetesCalls
from .kubernetes_container import OUTPUT_BUFFER_BYTES, KubernetesContainer
from .kubernetes_manifests import ManifestError, pod_manifest
from .kubernetes_operations import (
    DELETE_BOUND,
    ServiceSecretObjects,
    create_network_policy,
    create_pod,
    delete_after_failed_start,
    delete_network_policy,
    delete_pod,
    list_pods,
    read_pod,
    until_running,
)

log = logging.getLogger(__name__)

# How long an ended server's pod may take to show its exit (the kubelet relists each second).
EXIT_REPORT_BOUND: Final = 5.0
EXIT_REPORT_POLL: Final = 0.5


@dataclass(frozen=True)
class PodOwner:
    """The orchestrator's own pod, when it runs in the cluster (its session pods' owner).

    An owner must be in its dependents' namespace (the garbage collector takes one elsewhere
    for gone, and deletes the dependents at once): with ``namespace`` known and different from
    the sessions', pods get no owner and the sweeper alone removes what a crash leaves.
    """

    name: str
    uid: str
    namespace: str | None = None


class KubernetesRuntime:
    """Pods in one namespace, through the API server named by a kubeconfig or the cluster.

    ``claims`` maps each allowed mount root to its PersistentVolumeClaim; ``owner`` is the
    orchestrator's own pod (session pods are garbage-collected with it); ``start_timeout``
    bounds a pod's way from creation to a running server (scheduling and pulls included).
    ``url`` overrides the kubeconfig's server (tests).
    """

    # The proxy of pods with an egress allowlist (reached over TCP, see egress_proxy), when
    # the settings say where; None: such services are refused (see capabilities).
    egress: EgressProxy | None = None
    # A pod has no socket of ours to bind: agents there run without the suite's services.
    children: ChildSockets | None = None

    def __init__(
        self,
        *,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        claims: Mapping[str, str] | None = None,
        owner: PodOwner | None = None,
        start_timeout: float = 120.0,
        call_timeout: float = API_CALL_TIMEOUT,
        max_frame_bytes: int = 16 * 1024 * 1024,
        url: str | None = None,
        egress_listen: tuple[str, int] | None = None,
        egress_address: tuple[str, int] | None = None,
        gvisor_runtime_class: str | None = None,
    ) -> None:
        """``egress_listen``: where this process binds the egress proxy for pods;
        ``egress_address``: the IP and port pods reach it at (their NetworkPolicy's one
        destination). Both or neither. ``gvisor_runtime_class``: the RuntimeClass that runs a
        pod under gVisor (None: the cluster has none)."""
        self.name = "kubernetes"
        self._gvisor_runtime_class = gvisor_runtime_class
        if egress_listen is not None and egress_address is not None:
            self.egress = EgressProxy(listen=egress_listen)
        self._egress_address = egress_address
        # Each egress pod's token (by pod name), forgotten by the redactor with the pod.
        self._tokens: dict[str, str] = {}
        self._calls = KubernetesCalls(
            namespace=namespace, kubeconfig=kubeconfig, url=url, call_timeout=call_timeout
        )
        self.claims = dict(claims or {})
        self.owner = owner
        self.start_timeout = start_timeout
        self._max_frame = max_frame_bytes
        # How each live pod's attach ended, for exit_status if the kubelet does not report the
        # container's end in time (dropped on remove: bounded by the live pods).
        self._attach_status: dict[str, AttachStatus] = {}
        # The Secrets this runtime made (one per service with secrets), removed at close.
        self._secrets = ServiceSecretObjects(self._calls)

    @property
    def capabilities(self) -> RuntimeCapabilities:
        """Stdio through the API server's attach; egress through the proxy in this process,
        when the settings say where and it runs; file secrets as a Secret volume; no child
        sessions (a pod has no socket of ours to bind); mounts are claims the kubelet mounts,
        not this host's; gVisor by the RuntimeClass the suite names."""
        missing = ""
        if self.egress is None or self._egress_address is None:
            missing = "orchestrator.kubernetes.egress_proxy is not set"
        elif not self.egress.running:
            missing = "the egress proxy does not run in this process"
        return RuntimeCapabilities(
            stdio="attach",
            egress_missing=missing,
            gvisor_runtime=self._gvisor_runtime_class or "",
            gvisor_missing="orchestrator.kubernetes.gvisor_runtime_class is not set",
        )

    @property
    def namespace(self) -> str:
        """The session pods' namespace (known once the client is made)."""
        return self._calls.namespace

    # --- the Runtime interface --------------------------------------------------------------

    async def verify_isolation(self, image: str, labels: dict[str, str]) -> None:
        """Nothing to check here: the RuntimeClass is the cluster's (a pod naming one that
        does not exist is refused by the API server, and its start fails with why)."""
        del image, labels

    async def ping(self, *, time_bound: float | None = None) -> str:
        return await self._calls.version(time_bound=time_bound)

    async def image_id(self, image: str) -> str | None:
        """Only a reference by digest names its image for sure; the API inspects no images."""
        return image.rpartition("@")[2] if "@sha256:" in image else None

    async def spawn(
        self, spec: ContainerSpec, pins: PinSet | None = None, *, gate: Gate | None = None
    ) -> KubernetesContainer:
        """Create the pod, wait until its server runs, attach (see the module's notes). A pod
        runs its command as soon as it is made: a ``gate`` is waited for first."""
        if pins is not None:
            # The kubelet mounts the claim's subPath itself: descriptors cannot travel there.
            pins.close()
        if gate is not None:
            await gate()
        token: str | None = None
        if spec.egress is not None:
            # The composer refused the spec where the proxy is not there (capabilities).
            assert self._egress_address is not None
            # The pod's credential at the proxy: in its proxy URL (its environment), never
            # logged; worth nothing once the pod is removed (unregistered).
            token = secrets.token_urlsafe(32)
            host, port = self._egress_address
            spec = dataclasses.replace(
                spec,
                egress=dataclasses.replace(spec.egress, proxy_url=proxy_url(token, host, port)),
            )
        if spec.secrets.secrets:
            await self._ensure_secret(spec)
        try:
            manifest = pod_manifest(
                spec,
                namespace=self.namespace,
                claims=self.claims,
                owner=self._owner_reference(),
            )
        except ManifestError as exc:
            raise errors.not_a_pod(exc) from None
        name = manifest["metadata"]["name"]
        if token is not None:
            # Redacted wherever it could be written (an API error echoing the pod, say).
            SECRET_VALUES.register([token])
            self._tokens[name] = token
        try:
            if token is not None and spec.egress is not None:
                # Before the pod: it never runs a moment without its policy.
                assert self._egress_address is not None
                await create_network_policy(self._calls, manifest, proxy=self._egress_address)
                assert self.egress is not None
                self.egress.register(
                    token,
                    name,
                    spec.labels.get(LABEL_SERVICE, ""),
                    Allowlist.of(spec.egress.allowlist),
                )
            created = await create_pod(self._calls, manifest)
            await until_running(self._calls, name, created, start_timeout=self.start_timeout)
            return await self._attach(name)
        except BaseException:
            with trio.CancelScope(shield=True):
                await delete_after_failed_start(self._calls, name)
                if token is not None:
                    await self._forget_egress(name)
            raise

    async def _ensure_secret(self, spec: ContainerSpec) -> None:
        """The Secret of ``spec``'s service, made once (see ServiceSecretObjects.ensure)."""
        await self._secrets.ensure(spec, owner=self._owner_reference())

    async def _forget_egress(self, name: str) -> None:
        """The pod's proxy credential and NetworkPolicy, gone (after its pod)."""
        if self.egress is not None:
            self.egress.unregister(name)
        token = self._tokens.pop(name, None)
        if token is not None:
            SECRET_VALUES.forget([token])
        with trio.move_on_after(DELETE_BOUND):
            await delete_network_policy(self._calls, name)

    def _owner_reference(self) -> dict[str, str] | None:
        owner = self.owner
        if owner is None:
            return None
        if owner.namespace is not None and owner.namespace != self.namespace:
            return None
        return {"name": owner.name, "uid": owner.uid}

    async def _attach(self, name: str) -> KubernetesContainer:
        # A stdout message carries at most one frame's worth, plus its channel byte.
        socket = await self._calls.attach(name, max_message=self._max_frame + 1)
        return KubernetesContainer(
            name,
            socket,
            max_buffered=OUTPUT_BUFFER_BYTES,
            on_status=lambda status: self._attach_status.__setitem__(name, status),
        )

    async def exit_status(self, container_id: str) -> ContainerExit:
        """How the pod's server ended, from its container state. Asked once its output ended:
        the kubelet reports the end a moment later (its relist), so this waits for it, a
        bounded while, then falls back on what the attach's status said (an exit code only
        when it failed: an attach's Success says its streams ended, not how)."""
        with trio.move_on_after(EXIT_REPORT_BOUND):
            while True:
                pod = await read_pod(self._calls, container_id)
                if pod is None:
                    break
                progress = pod_progress(pod)
                if isinstance(progress, Exited):
                    return ContainerExit(progress.exit_code, progress.oom_killed, progress.detail)
                await trio.sleep(EXIT_REPORT_POLL)
        ended = self._attach_status.get(container_id)
        if ended is not None and ended.exit_code is not None:
            return ContainerExit(ended.exit_code, False, ended.message)
        return ContainerExit(None, False)

    async def set_cpu_shares(self, container_id: str, shares: int) -> None:
        """A pod's CPU request cannot change in place on the clusters this supports."""

    async def main_pid(self, container_id: str) -> int:
        return 0  # the process runs on a node: nothing to look at through /proc here

    async def memory_usage(self, container_id: str) -> int | None:
        return None  # the metrics API is not the kubelet's to ask here: no figure

    async def remove(self, container: str, *, grace: float | None = None) -> None:
        self._attach_status.pop(container, None)
        await delete_pod(self._calls, container, grace=grace)
        if self.egress is not None:
            # The pod's NetworkPolicy shares its name (none for a pod without egress: a 404).
            await self._forget_egress(container)

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[ManagedContainer]:
        return await list_pods(self._calls, extra_labels)

    async def close(self) -> None:
        await self._secrets.remove_all()
        await self._calls.close()
