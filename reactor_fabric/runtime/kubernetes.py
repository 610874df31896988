"""Session containers as Kubernetes Pods, reached through the API server.

``orchestrator.runtime: kubernetes``: each container the product would start on Docker becomes a
Pod (:func:`~.kubernetes_manifests.pod_manifest`: the same spec, limits and labels) in one
namespace; the runtime watches it until its server runs (:func:`~reactor_fabric.protocol.
k8s_pod_state.pod_progress`), then attaches to its stdio through ``pods/attach``
(:mod:`.kubernetes_attach`, framed by :class:`~reactor_fabric.protocol.k8s_attach.
AttachChannels`). REST calls go through kr8s, which reads the kubeconfig (or the in-cluster
service account), including client certificates and exec plugins, and runs on trio (anyio).

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
:meth:`KubernetesRuntime.close` closes the HTTP client.

Error handling: an API server that does not answer, or credentials that cannot be loaded, are
DockerUnavailable (-32001, ``kubernetes_unavailable`` / ``kubernetes_timeout``); anything
about one pod is ContainerStartFailure (-32002) with the reasons a Docker start has
(``image_not_found``, ``start_failed``, ``container_exited``, ``create_failed`` …). A 401
makes the runtime load its credentials again and repeat the call once (tokens rotate).
"""

from __future__ import annotations

import calendar
import contextlib
import dataclasses
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlencode

import httpx
import msgspec
import trio

from .._errors import ContainerStartFailure, DockerUnavailable, FabricError
from .._reasons import (
    ATTACH_FAILED,
    CONTAINER_EXITED,
    EGRESS_UNAVAILABLE,
    KUBERNETES_TIMEOUT,
    KUBERNETES_UNAVAILABLE,
    SECRET_UNAVAILABLE,
    START_FAILED,
    engine_call_failed,
)
from ..observe.redaction import SECRET_VALUES
from ..policy.container_spec import (
    LABEL_MANAGED,
    LABEL_SERVICE,
    ContainerSpec,
    proxy_environment,
    refuse_egress,
    refuse_unavailable_secrets,
)
from ..policy.pinning import PinSet
from ..protocol.egress import Allowlist, proxy_url
from ..protocol.framing import FramingError, LineSplitter, LineTooLong
from ..protocol.k8s_attach import (
    AttachChannels,
    AttachProtocolError,
    AttachStatus,
    Output,
)
from ..protocol.k8s_pod_state import (
    CONTAINER,
    Exited,
    PodProgress,
    Running,
    StartFailed,
    Starting,
    pod_progress,
)
from .base import ContainerExit, ManagedContainer
from .child_sockets import ChildSockets
from .demux import Demultiplexer
from .egress_proxy import EgressProxy
from .kubernetes_attach import AttachRefused, AttachSocket, open_attach
from .kubernetes_manifests import (
    ManifestError,
    network_policy_manifest,
    pod_manifest,
    secret_manifest,
)

log = logging.getLogger(__name__)

API_CALL_TIMEOUT: Final = 30.0
NETWORKING: Final = "networking.k8s.io/v1"
OUTPUT_BUFFER_BYTES: Final = 256 * 1024
# A watch event is one pod: large ones (many env vars, long messages) stay far below this.
MAX_WATCH_EVENT_BYTES: Final = 4 * 1024 * 1024
# How long a delete in a finally block may take before it is left to the sweeper.
DELETE_BOUND: Final = 10.0
# A create whose answer was lost may land at the server after our first delete: ask again.
LATE_CREATE_RECHECK: Final = 1.0
UNAUTHORIZED: Final = 401
# How long an ended server's pod may take to show its exit (the kubelet relists each second).
EXIT_REPORT_BOUND: Final = 5.0
EXIT_REPORT_POLL: Final = 0.5
SERVICE_ACCOUNT_NAMESPACE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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

    mounts_on_host_reach_containers = False
    stdio = "attach"  # through the API server's attach
    # The proxy of pods with an egress allowlist (reached over TCP, see egress_proxy), when
    # the settings say where; None: such services are refused (egress_unavailable).
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
    ) -> None:
        """``egress_listen``: where this process binds the egress proxy for pods;
        ``egress_address``: the IP and port pods reach it at (their NetworkPolicy's one
        destination). Both or neither."""
        self.name = "kubernetes"
        if egress_listen is not None and egress_address is not None:
            self.egress = EgressProxy(listen=egress_listen)
        self._egress_address = egress_address
        # Each egress pod's token (by pod name), forgotten by the redactor with the pod.
        self._tokens: dict[str, str] = {}
        self._namespace = namespace
        self._kubeconfig = kubeconfig
        self._url = url
        self.claims = dict(claims or {})
        self.owner = owner
        self.start_timeout = start_timeout
        self._call_timeout = call_timeout
        self._max_frame = max_frame_bytes
        self._api: Any = None
        self._api_lock = trio.Lock()
        # How each live pod's attach ended, for exit_status if the kubelet does not report the
        # container's end in time (dropped on remove: bounded by the live pods).
        self._attach_status: dict[str, AttachStatus] = {}
        # The Secrets this runtime made (one per service with secrets), removed at close.
        self._secrets: set[str] = set()
        self._secrets_lock = trio.Lock()

    # --- the API client ---------------------------------------------------------------------

    async def _client(self) -> Any:
        """kr8s's API object, made once credentials load (again after a failure)."""
        async with self._api_lock:
            if self._api is None:
                import kr8s.asyncio  # noqa: PLC0415  (an optional dependency, imported when chosen)

                try:
                    with trio.fail_after(self._call_timeout):
                        # Not kr8s.asyncio.api(): its per-thread cache would share one HTTP
                        # client between runtimes (and between trio runs); and not awaiting the
                        # Api itself, whose version check warns on versions it has not seen.
                        api = kr8s.asyncio.Api(
                            bypass_factory=True,
                            url=self._url,
                            kubeconfig=self._kubeconfig,
                            namespace=self._namespace,
                        )
                        await api.auth
                except trio.TooSlowError:
                    raise DockerUnavailable(
                        "the Kubernetes credentials did not load in time",
                        reason=KUBERNETES_TIMEOUT,
                        action="connect",
                    ) from None
                except (OSError, ValueError, KeyError, httpx.HTTPError) as exc:
                    raise DockerUnavailable(
                        f"cannot load Kubernetes credentials: {exc}",
                        reason=KUBERNETES_UNAVAILABLE,
                        action="connect",
                    ) from exc
                api.timeout = self._call_timeout
                if self._namespace is None:
                    self._namespace = await _default_namespace(api)
                self._api = api
            return self._api

    @property
    def namespace(self) -> str:
        """The session pods' namespace (known once the client is made)."""
        if self._namespace is not None:
            return self._namespace
        if self._api is not None:
            return str(self._api.auth.namespace)
        return "default"

    @contextlib.asynccontextmanager
    async def _request(
        self,
        action: str,
        method: str,
        url: str,
        *,
        time_bound: float | None = None,
        stream: bool = False,
        version: str = "v1",
        base: str = "",
        namespaced: bool = True,
        **kwargs: Any,
    ) -> AsyncIterator[httpx.Response]:
        """One API call (in the session namespace unless ``namespaced`` is false); errors
        become the product's.

        Yields the response whatever its status (the caller decides what a 404 means), except
        a first 401: the credentials are loaded again and the call made once more, since
        in-cluster tokens are rotated and a kubeconfig's exec plugin hands out expiring ones.
        """
        import kr8s  # noqa: PLC0415

        api = await self._client()
        bound = self._call_timeout if time_bound is None else time_bound
        with trio.move_on_after(bound) as scope:
            try:
                for attempt in range(2):
                    async with api.call_api(
                        method,
                        version=version,
                        base=base,
                        namespace=self.namespace if namespaced else None,
                        url=url,
                        raise_for_status=False,
                        stream=stream,
                        **kwargs,
                    ) as response:
                        if response.status_code != UNAUTHORIZED or attempt:
                            yield response
                            break
                    await self._reauthenticate(api)
            except (httpx.TransportError, kr8s.APITimeoutError, OSError) as exc:
                raise DockerUnavailable(
                    f"cannot reach the Kubernetes API server ({action}): {exc}",
                    reason=KUBERNETES_UNAVAILABLE,
                    action=action,
                ) from exc
        if scope.cancelled_caught:
            raise DockerUnavailable(
                f"the Kubernetes API server did not answer {action} within {bound:g} s",
                reason=KUBERNETES_TIMEOUT,
                action=action,
            )

    async def _reauthenticate(self, api: Any) -> None:
        """Load the credentials again and make kr8s's HTTP client carry them (as kr8s does
        itself on a 401 when it raises for status, which we do not let it do)."""
        try:
            await api.auth.reauthenticate()
            # kr8s's own way to renew the headers its HTTP client sends.
            await api._create_session()
        except (OSError, ValueError, KeyError) as exc:
            raise DockerUnavailable(
                f"cannot load Kubernetes credentials again: {exc}",
                reason=KUBERNETES_UNAVAILABLE,
                action="connect",
            ) from exc

    async def _json(
        self, action: str, method: str, url: str, **kwargs: Any
    ) -> tuple[int, dict[str, Any]]:
        async with self._request(action, method, url, **kwargs) as response:
            status = response.status_code
            try:
                body = msgspec.json.decode(response.content)
            except msgspec.DecodeError:
                body = {"message": response.text[:500]}
        return status, body if isinstance(body, dict) else {}

    # --- the Runtime interface --------------------------------------------------------------

    async def ping(self, *, time_bound: float | None = None) -> str:
        async with self._request(
            "ping", "GET", "", time_bound=time_bound, version="", base="/version", namespaced=False
        ) as response:
            if response.status_code != 200:
                raise DockerUnavailable(
                    f"the Kubernetes API server answered /version with HTTP {response.status_code}",
                    reason=KUBERNETES_UNAVAILABLE,
                    action="ping",
                )
            try:
                version = msgspec.json.decode(response.content)
            except msgspec.DecodeError:
                version = {}
        return str(version.get("gitVersion", "unknown") if isinstance(version, dict) else "unknown")

    async def image_id(self, image: str) -> str | None:
        """Only a reference by digest names its image for sure; the API inspects no images."""
        return image.rpartition("@")[2] if "@sha256:" in image else None

    async def spawn(self, spec: ContainerSpec, pins: PinSet | None = None) -> KubernetesContainer:
        """Create the pod, wait until its server runs, attach (see the module's notes)."""
        if pins is not None:
            # The kubelet mounts the claim's subPath itself: descriptors cannot travel there.
            pins.close()
        refuse_unavailable_secrets(spec)
        token: str | None = None
        if spec.egress is not None:
            proxy, address = self.egress, self._egress_address
            if proxy is None or address is None or not proxy.running:
                refuse_egress(
                    spec,
                    "orchestrator.kubernetes.egress_proxy is not set"
                    if proxy is None or address is None
                    else "the egress proxy does not run in this process",
                )
                raise AssertionError("refuse_egress raises for a spec with egress")
            # The pod's credential at the proxy: in its proxy URL (its environment), never
            # logged; worth nothing once the pod is removed (unregistered).
            token = secrets.token_urlsafe(32)
            host, port = address
            spec = dataclasses.replace(
                spec, environment=spec.environment | proxy_environment(proxy_url(token, host, port))
            )
        if spec.secrets:
            await self._ensure_secret(spec)
        try:
            manifest = pod_manifest(
                spec,
                namespace=self.namespace,
                claims=self.claims,
                owner=self._owner_reference(),
            )
        except ManifestError as exc:
            raise ContainerStartFailure(
                f"the session cannot be a pod: {exc}", reason=START_FAILED, action="create"
            ) from None
        name = manifest["metadata"]["name"]
        if token is not None:
            # Redacted wherever it could be written (an API error echoing the pod, say).
            SECRET_VALUES.register([token])
            self._tokens[name] = token
        try:
            if token is not None and spec.egress is not None:
                # Before the pod: it never runs a moment without its policy.
                await self._create_network_policy(manifest)
                assert self.egress is not None
                self.egress.register(
                    token, name, spec.labels.get(LABEL_SERVICE, ""), Allowlist.of(spec.egress)
                )
            await self._until_running(name, await self._create(manifest))
            return await self._attach(name)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._delete_after_failed_start(name)
                if token is not None:
                    await self._forget_egress(name)
            raise

    async def _create_network_policy(self, pod: dict[str, Any]) -> None:
        """The pod's NetworkPolicy (see network_policy_manifest); one an earlier try left is
        replaced. ContainerStartFailure (``egress_unavailable``) if it cannot be made: a pod
        of an egress list never runs without one."""
        assert self._egress_address is not None
        host, port = self._egress_address
        policy = network_policy_manifest(pod, proxy_address=host, proxy_port=port)
        name = policy["metadata"]["name"]
        status, body = await self._json(
            "create", "POST", "networkpolicies", version=NETWORKING, json=policy
        )
        if status == 409:
            await self._delete_network_policy(name)
            status, body = await self._json(
                "create", "POST", "networkpolicies", version=NETWORKING, json=policy
            )
        if status not in (200, 201, 202):
            service = pod["metadata"]["labels"].get(LABEL_SERVICE, "")
            raise ContainerStartFailure(
                f"service {service!r}: the NetworkPolicy {name} of its pod could not be made "
                f"(HTTP {status}: {str(body.get('message', ''))[:300]})",
                reason=EGRESS_UNAVAILABLE,
                service=service,
            )

    async def _delete_network_policy(self, name: str) -> None:
        """Delete the pod ``name``'s NetworkPolicy if it has one; logs and swallows errors."""
        try:
            status, body = await self._json(
                "remove",
                "DELETE",
                f"networkpolicies/{quote(name)}",
                version=NETWORKING,
                time_bound=DELETE_BOUND,
            )
        except FabricError as exc:
            log.warning(
                "network_policy_remove_failed", extra={"container": name, "detail": str(exc)}
            )
            return
        if status >= 300 and status != 404:
            log.warning(
                "network_policy_remove_failed",
                extra={"container": name, "detail": f"HTTP {status}: {body.get('message', '')}"},
            )

    async def _forget_egress(self, name: str) -> None:
        """The pod's proxy credential and NetworkPolicy, gone (after its pod)."""
        if self.egress is not None:
            self.egress.unregister(name)
        token = self._tokens.pop(name, None)
        if token is not None:
            SECRET_VALUES.forget([token])
        with trio.move_on_after(DELETE_BOUND):
            await self._delete_network_policy(name)

    async def _ensure_secret(self, spec: ContainerSpec) -> None:
        """The Secret of ``spec``'s service, made once (the pod refers to it, never holds a
        value); one left by an earlier try is replaced."""
        manifest = secret_manifest(spec, namespace=self.namespace, owner=self._owner_reference())
        name = manifest["metadata"]["name"]
        async with self._secrets_lock:
            if name in self._secrets:
                return
            status, body = await self._json("create", "POST", "secrets", json=manifest)
            if status == 409:  # an earlier try's: replaced (the Role grants no update)
                await self._json("remove", "DELETE", f"secrets/{quote(name)}")
                status, body = await self._json("create", "POST", "secrets", json=manifest)
            if status not in (200, 201, 202):
                service = spec.labels.get(LABEL_SERVICE, "")
                raise ContainerStartFailure(
                    f"service {service!r}: its Secret {name} could not be made "
                    f"(HTTP {status}: {str(body.get('message', ''))[:300]})",
                    reason=SECRET_UNAVAILABLE,
                    service=service,
                )
            self._secrets.add(name)

    def _owner_reference(self) -> dict[str, str] | None:
        owner = self.owner
        if owner is None:
            return None
        if owner.namespace is not None and owner.namespace != self.namespace:
            return None
        return {"name": owner.name, "uid": owner.uid}

    async def _create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        status, body = await self._json("create", "POST", "pods", json=manifest)
        if status not in (200, 201, 202):
            raise _refused("create", status, body)
        return body

    async def _until_running(self, name: str, created: dict[str, Any]) -> None:
        """Watch the pod until its server runs; ContainerStartFailure when it cannot."""
        last: PodProgress = Starting()
        with trio.move_on_after(self.start_timeout):
            pod = created
            while True:
                last = pod_progress(pod)
                if isinstance(last, Running):
                    return
                if isinstance(last, StartFailed):
                    raise ContainerStartFailure(
                        f"pod {name}: {last.detail}", reason=last.reason, action="start"
                    )
                if isinstance(last, Exited):
                    raise ContainerStartFailure(
                        f"pod {name} ended before it could be attached: {last.detail}",
                        reason=CONTAINER_EXITED,
                        action="start",
                        exit_code=last.exit_code,
                    )
                version = str(_mapping(pod.get("metadata")).get("resourceVersion", ""))
                pod = await self._next_version(name, version)
        raise ContainerStartFailure(
            f"pod {name} did not run within {self.start_timeout:g} s"
            + (f" ({last.detail})" if isinstance(last, Starting) and last.detail else ""),
            reason=START_FAILED,
            action="start",
        )

    async def _next_version(self, name: str, version: str) -> dict[str, Any]:
        """The pod's next version after ``version`` (a watch), or its current one when the
        watch ends without news (re-read, as a watch's end may have lost none or some)."""
        params = {
            "watch": "1",
            "fieldSelector": f"metadata.name={name}",
            "resourceVersion": version,
            "timeoutSeconds": str(max(1, math.ceil(self.start_timeout))),
            "allowWatchBookmarks": "false",
        }
        async with self._request(
            "watch",
            "GET",
            "pods",
            params=params,
            stream=True,
            time_bound=self.start_timeout + self._call_timeout,
        ) as response:
            if response.status_code == 200:
                found: dict[str, Any] | None = None
                deleted = False
                # Leaving the watch early by cancelling, not by returning from inside the loop:
                # cancelled, each of httpx's stream generators finishes at its checkpoint, where
                # a return would leave them to the garbage collector (a ResourceWarning each).
                with trio.CancelScope() as reading:
                    async for event in _watch_events(response):
                        if found is not None or deleted:
                            continue  # cancelled: the stream is ending
                        kind = event.get("type")
                        if kind in ("ADDED", "MODIFIED"):
                            found = dict(_mapping(event.get("object")))
                        elif kind == "DELETED":
                            deleted = True
                        # ERROR (the version is too old, 410): read the pod again, below.
                        reading.cancel()
                if deleted:
                    raise ContainerStartFailure(
                        f"pod {name} was deleted while it started",
                        reason=START_FAILED,
                        action="start",
                    )
                if found is not None:
                    return found
        status, body = await self._json("inspect", "GET", f"pods/{quote(name)}")
        if status != 200:
            raise _refused("inspect", status, body)
        return body

    async def _attach(self, name: str) -> KubernetesContainer:
        api = await self._client()
        target = (
            f"/api/v1/namespaces/{quote(self.namespace)}/pods/{quote(name)}/attach?"
            + urlencode(
                {"container": CONTAINER, "stdin": "true", "stdout": "true", "stderr": "true"}
            )
        )
        try:
            with trio.fail_after(self._call_timeout):
                try:
                    socket = await self._open_attach(api, target)
                except AttachRefused as exc:
                    if exc.status != UNAUTHORIZED:
                        raise
                    # A rotated token (in-cluster tokens expire): load it again, once.
                    await self._reauthenticate(api)
                    socket = await self._open_attach(api, target)
        except trio.TooSlowError:
            raise DockerUnavailable(
                f"the Kubernetes API server did not accept the attach to {name} in time",
                reason=KUBERNETES_TIMEOUT,
                action="attach",
            ) from None
        except AttachRefused as exc:
            raise ContainerStartFailure(
                f"the API server refused to attach to pod {name}: {exc}",
                reason=ATTACH_FAILED,
                action="attach",
                status=exc.status,
            ) from None
        except (OSError, trio.BrokenResourceError) as exc:
            raise DockerUnavailable(
                f"cannot reach the Kubernetes API server (attach): {exc}",
                reason=KUBERNETES_UNAVAILABLE,
                action="attach",
            ) from exc
        return KubernetesContainer(
            name,
            socket,
            max_buffered=OUTPUT_BUFFER_BYTES,
            on_status=lambda status: self._attach_status.__setitem__(name, status),
        )

    async def _open_attach(self, api: Any, target: str) -> AttachSocket:
        return await open_attach(
            str(api.auth.server),
            target,
            token=api.auth.token or None,
            ssl_context=await api.auth.ssl_context(),
            tls_server_name=api.auth.tls_server_name or None,
            # A stdout message carries at most one frame's worth, plus its channel byte.
            max_message=self._max_frame + 1,
        )

    async def _delete_after_failed_start(self, name: str) -> None:
        """Delete a pod whose start failed; once more shortly after if it was not there yet
        (its create's answer was lost, and the create may still land)."""
        with trio.move_on_after(DELETE_BOUND):
            if not await self._delete(name, grace=None):
                await trio.sleep(LATE_CREATE_RECHECK)
                await self._delete(name, grace=None)

    async def _delete(self, name: str, *, grace: float | None) -> bool:
        """Delete the pod; whether there was one. Logs and swallows errors."""
        seconds = 0 if grace is None else max(0, math.ceil(grace))
        try:
            status, body = await self._json(
                "remove",
                "DELETE",
                f"pods/{quote(name)}",
                params={"gracePeriodSeconds": str(seconds)},
                time_bound=DELETE_BOUND,
            )
        except FabricError as exc:
            log.warning("container_remove_failed", extra={"container": name, "detail": str(exc)})
            return True
        if status == 404:
            return False
        if status >= 300:
            log.warning(
                "container_remove_failed",
                extra={"container": name, "detail": f"HTTP {status}: {body.get('message', '')}"},
            )
        return True

    async def exit_status(self, container_id: str) -> ContainerExit:
        """How the pod's server ended, from its container state. Asked once its output ended:
        the kubelet reports the end a moment later (its relist), so this waits for it, a
        bounded while, then falls back on what the attach's status said (an exit code only
        when it failed: an attach's Success says its streams ended, not how)."""
        with trio.move_on_after(EXIT_REPORT_BOUND):
            while True:
                status, body = await self._json("inspect", "GET", f"pods/{quote(container_id)}")
                if status == 404:
                    break
                if status != 200:
                    raise _refused("inspect", status, body)
                progress = pod_progress(body)
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
        await self._delete(container, grace=grace)
        if self.egress is not None:
            # The pod's NetworkPolicy shares its name (none for a pod without egress: a 404).
            await self._forget_egress(container)

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[ManagedContainer]:
        selector = ",".join(
            f"{key}={value}"
            for key, value in {LABEL_MANAGED: "true", **(extra_labels or {})}.items()
        )
        status, body = await self._json("list", "GET", "pods", params={"labelSelector": selector})
        if status != 200:
            raise _refused("list", status, body)
        found: list[ManagedContainer] = []
        for item in body.get("items") or ():
            metadata = _mapping(_mapping(item).get("metadata"))
            if metadata.get("deletionTimestamp"):
                continue  # on its way out already
            name = str(metadata.get("name", ""))
            labels = {str(k): str(v) for k, v in _mapping(metadata.get("labels")).items()}
            found.append(
                ManagedContainer(name, name, labels, _epoch(metadata.get("creationTimestamp")))
            )
        return found

    async def close(self) -> None:
        # The services' Secrets go with the orchestrator (in the cluster, its pod owns them
        # too: the garbage collector removes them if it dies first).
        for name in sorted(self._secrets):
            with trio.CancelScope(shield=True), trio.move_on_after(DELETE_BOUND):
                try:
                    await self._json("remove", "DELETE", f"secrets/{quote(name)}")
                except FabricError as exc:
                    log.warning("secret_remove_failed", extra={"secret": name, "detail": str(exc)})
        self._secrets.clear()
        api, self._api = self._api, None
        session = getattr(api, "_session", None) if api is not None else None
        if session is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(DELETE_BOUND):
                await session.aclose()


class _AttachStdin:
    __slots__ = ("_channels", "_socket")

    def __init__(self, socket: AttachSocket, channels: AttachChannels) -> None:
        self._socket = socket
        self._channels = channels

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._socket.send_message(self._channels.stdin(bytes(data)))

    async def send_eof(self) -> None:
        message = self._channels.close_stdin()
        if message is None:
            await self._socket.close()  # v4: no half-close, the whole attach ends
        else:
            await self._socket.send_message(message)


class _Messages(trio.abc.ReceiveStream):
    """The attach's messages as a stream for the demultiplexer: each read returns one whole
    message (channel byte first), whatever ``max_bytes`` asks, since the channel byte only
    begins a message; the message bound is the socket's."""

    def __init__(self, socket: AttachSocket) -> None:
        self._socket = socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        message = await self._socket.receive_message()
        return b"" if message is None else message

    async def aclose(self) -> None:
        await self._socket.aclose()


class KubernetesContainer:
    """A running session pod: its attach, split into stdin, stdout and stderr."""

    def __init__(
        self,
        name: str,
        socket: AttachSocket,
        *,
        max_buffered: int,
        on_status: Any,
    ) -> None:
        self._name = name
        self._socket = socket
        self._channels = AttachChannels(socket.subprotocol)
        self._stdin = _AttachStdin(socket, self._channels)
        self._on_status = on_status
        self._demux = Demultiplexer(_Messages(socket), self._decode, max_buffered=max_buffered)

    def _decode(self, message: bytes) -> list[tuple[int, bytes]]:
        try:
            event = self._channels.receive(message)
        except AttachProtocolError as exc:
            raise FramingError(f"attach: {exc}") from None
        if isinstance(event, Output):
            return [(event.channel, event.data)]
        if isinstance(event, AttachStatus):
            self._on_status(event)
        return []

    @property
    def id(self) -> str:
        return self._name

    @property
    def name(self) -> str:
        return self._name

    @property
    def stdin(self) -> _AttachStdin:
        return self._stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._demux.stdout

    @property
    def stderr(self) -> trio.abc.ReceiveStream:
        return self._demux.stderr

    @property
    def stderr_dropped(self) -> int:
        return self._demux.stderr_dropped

    @property
    def subprotocol(self) -> str:
        return self._socket.subprotocol

    async def aclose(self) -> None:
        self._demux.close()
        await self._socket.aclose()


async def _watch_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """A watch's events, one JSON object per line, each bounded before it is decoded."""
    splitter = LineSplitter(max_line=MAX_WATCH_EVENT_BYTES)
    async for chunk in response.aiter_bytes():
        try:
            lines = splitter.feed(chunk)
        except LineTooLong as exc:
            raise ContainerStartFailure(
                f"a watch event over the bound: {exc}", reason=START_FAILED, action="watch"
            ) from None
        for line in lines:
            try:
                event = msgspec.json.decode(line)
            except (msgspec.DecodeError, RecursionError):
                continue
            if isinstance(event, dict):
                yield event


def _refused(action: str, status: int, body: Mapping[str, Any]) -> FabricError:
    """What the API server's refusal of ``action`` means for the product."""
    message = str(body.get("message") or f"HTTP {status}")[:500]
    if status in (401, 403):
        return ContainerStartFailure(
            f"the Kubernetes API server refused {action} (HTTP {status}): {message}; check the "
            "orchestrator's credentials and its Role (deploy/kubernetes/role.yaml)",
            reason=engine_call_failed(action),
            action=action,
            status=status,
        )
    if status >= 500:
        return DockerUnavailable(
            f"the Kubernetes API server failed {action} (HTTP {status}): {message}",
            reason=KUBERNETES_UNAVAILABLE,
            action=action,
        )
    return ContainerStartFailure(
        f"the Kubernetes API server refused {action} (HTTP {status}): {message}",
        reason=engine_call_failed(action),
        action=action,
        status=status,
    )


async def _default_namespace(api: Any) -> str:
    """The kubeconfig context's namespace; in the cluster (no kubeconfig), the orchestrator's
    own, from its service account (kr8s answers "default" there without reading it)."""
    if api.auth.active_context:
        return str(api.auth.namespace)
    path = trio.Path(SERVICE_ACCOUNT_NAMESPACE)
    try:
        return (await path.read_text()).strip() or "default"
    except OSError:
        return "default"


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _epoch(timestamp: object) -> float:
    """An RFC 3339 UTC timestamp (``2026-11-23T10:00:00Z``) in seconds since the epoch."""
    if isinstance(timestamp, str):
        with contextlib.suppress(ValueError):
            return float(calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")))
    return 0.0
