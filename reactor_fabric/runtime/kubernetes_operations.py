"""What each of the Kubernetes runtime's steps asks of the API server, and what its answer means.

A session's pod is created, watched until its server runs, listed and deleted; a pod of an
egress service has its NetworkPolicy made before it and deleted after it; a service with
secrets has its Secret, made once per orchestrator and removed when it stops
(:class:`ServiceSecretObjects`). Which of these a start asks, and in which order, is the
runtime's (:mod:`.kubernetes`); the objects' bodies are :mod:`.kubernetes_manifests`' (pure);
each call goes through :class:`~.kubernetes_calls.KubernetesCalls`.

Bounds: the watch until a pod runs is bounded by the start bound (and each watch request by the
start bound and one call's); every delete by ``DELETE_BOUND``, so one in a ``finally`` block
cannot hold a shutdown; a delete after a failed start asks once more, a moment later, for a
create whose answer was lost and that lands after the first delete.

Error handling: a refused call is the product's error (:mod:`.kubernetes_errors`); a pod whose
state says it cannot run, or that ended or was deleted before it ran, fails its start
(ContainerStartFailure); a NetworkPolicy or a Secret that cannot be made fails the start of the
pods that need it (``egress_unavailable``, ``secret_unavailable``). Deletions never raise: a
failed one is logged (``container_remove_failed``, ``network_policy_remove_failed``,
``secret_remove_failed``), and the sweeper finds by its labels what is left.
"""

from __future__ import annotations

import calendar
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import trio

from .._errors import FabricError
from ..policy.container_parts.ownership import LABEL_SERVICE
from ..policy.container_spec import ContainerSpec
from ..protocol.k8s_pod_state import (
    Exited,
    PodProgress,
    Running,
    StartFailed,
    Starting,
    pod_progress,
)
from . import kubernetes_errors as errors
from .base import ManagedContainer
from .kubernetes_calls import KubernetesCalls, watch_events
from .kubernetes_manifests import (
    NETWORKING,
    delete_query,
    managed_selector,
    network_policy_manifest,
    secret_manifest,
    watch_query,
)

# Logged under the runtime's name, as before its modules were split (operators filter the log
# by it).
log = logging.getLogger("reactor_fabric.runtime.kubernetes")

# How long a delete in a finally block may take before it is left to the sweeper.
DELETE_BOUND: Final = 10.0
# A create whose answer was lost may land at the server after our first delete: ask again.
LATE_CREATE_RECHECK: Final = 1.0

# --- a session's pod ------------------------------------------------------------------------


async def create_pod(calls: KubernetesCalls, manifest: dict[str, Any]) -> dict[str, Any]:
    """Create the pod; the API server's answer (the pod as created)."""
    status, body = await calls.json("create", "POST", "pods", json=manifest)
    if status not in (200, 201, 202):
        raise errors.refused("create", status, body)
    return body


async def until_running(
    calls: KubernetesCalls, name: str, created: dict[str, Any], *, start_timeout: float
) -> None:
    """Watch the pod until its server runs; ContainerStartFailure when it cannot."""
    last: PodProgress = Starting()
    with trio.move_on_after(start_timeout):
        pod = created
        while True:
            last = pod_progress(pod)
            if isinstance(last, Running):
                return
            if isinstance(last, StartFailed):
                raise errors.start_failed(name, last)
            if isinstance(last, Exited):
                raise errors.exited_before_attach(name, last)
            version = str(_mapping(pod.get("metadata")).get("resourceVersion", ""))
            pod = await _next_version(calls, name, version, start_timeout=start_timeout)
    raise errors.not_running_in_time(name, start_timeout, last)


async def _next_version(
    calls: KubernetesCalls, name: str, version: str, *, start_timeout: float
) -> dict[str, Any]:
    """The pod's next version after ``version`` (a watch), or its current one when the
    watch ends without news (re-read, as a watch's end may have lost none or some)."""
    async with calls.request(
        "watch",
        "GET",
        "pods",
        params=watch_query(name, version, start_timeout=start_timeout),
        stream=True,
        time_bound=start_timeout + calls.call_timeout,
    ) as response:
        if response.status_code == 200:
            found: dict[str, Any] | None = None
            deleted = False
            # Leaving the watch early by cancelling, not by returning from inside the loop:
            # cancelled, each of httpx's stream generators finishes at its checkpoint, where
            # a return would leave them to the garbage collector (a ResourceWarning each).
            with trio.CancelScope() as reading:
                async for event in watch_events(response):
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
                raise errors.deleted_while_starting(name)
            if found is not None:
                return found
    status, body = await calls.json("inspect", "GET", f"pods/{quote(name)}")
    if status != 200:
        raise errors.refused("inspect", status, body)
    return body


async def read_pod(calls: KubernetesCalls, name: str) -> dict[str, Any] | None:
    """The pod as the API server has it now; None if it has none of that name."""
    status, body = await calls.json("inspect", "GET", f"pods/{quote(name)}")
    if status == 404:
        return None
    if status != 200:
        raise errors.refused("inspect", status, body)
    return body


async def list_pods(
    calls: KubernetesCalls, extra_labels: Mapping[str, str] | None
) -> list[ManagedContainer]:
    """Our pods (with ``extra_labels`` too), but those already being deleted."""
    selector = managed_selector(extra_labels)
    status, body = await calls.json("list", "GET", "pods", params={"labelSelector": selector})
    if status != 200:
        raise errors.refused("list", status, body)
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


async def delete_pod(calls: KubernetesCalls, name: str, *, grace: float | None) -> bool:
    """Delete the pod; whether there was one. Logs and swallows errors."""
    try:
        status, body = await calls.json(
            "remove",
            "DELETE",
            f"pods/{quote(name)}",
            params=delete_query(grace),
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
            extra={"container": name, "detail": errors.failure_detail(status, body)},
        )
    return True


async def delete_after_failed_start(calls: KubernetesCalls, name: str) -> None:
    """Delete a pod whose start failed; once more shortly after if it was not there yet
    (its create's answer was lost, and the create may still land)."""
    with trio.move_on_after(DELETE_BOUND):
        if not await delete_pod(calls, name, grace=None):
            await trio.sleep(LATE_CREATE_RECHECK)
            await delete_pod(calls, name, grace=None)


# --- an egress pod's NetworkPolicy ----------------------------------------------------------


async def create_network_policy(
    calls: KubernetesCalls, pod: dict[str, Any], *, proxy: tuple[str, int]
) -> None:
    """The pod's NetworkPolicy (see network_policy_manifest), letting it reach ``proxy``
    alone; one an earlier try left is replaced. ContainerStartFailure
    (``egress_unavailable``) if it cannot be made: a pod of an egress list never runs
    without one."""
    host, port = proxy
    policy = network_policy_manifest(pod, proxy_address=host, proxy_port=port)
    name = policy["metadata"]["name"]
    status, body = await calls.json(
        "create", "POST", "networkpolicies", version=NETWORKING, json=policy
    )
    if status == 409:
        await delete_network_policy(calls, name)
        status, body = await calls.json(
            "create", "POST", "networkpolicies", version=NETWORKING, json=policy
        )
    if status not in (200, 201, 202):
        service = pod["metadata"]["labels"].get(LABEL_SERVICE, "")
        raise errors.network_policy_not_made(service, name, status, body)


async def delete_network_policy(calls: KubernetesCalls, name: str) -> None:
    """Delete the pod ``name``'s NetworkPolicy if it has one; logs and swallows errors."""
    try:
        status, body = await calls.json(
            "remove",
            "DELETE",
            f"networkpolicies/{quote(name)}",
            version=NETWORKING,
            time_bound=DELETE_BOUND,
        )
    except FabricError as exc:
        log.warning("network_policy_remove_failed", extra={"container": name, "detail": str(exc)})
        return
    if status >= 300 and status != 404:
        log.warning(
            "network_policy_remove_failed",
            extra={"container": name, "detail": errors.failure_detail(status, body)},
        )


# --- the services' Secrets ------------------------------------------------------------------


class ServiceSecretObjects:
    """The Secrets this runtime made (one per service with secrets), removed at close."""

    def __init__(self, calls: KubernetesCalls) -> None:
        self._calls = calls
        self._made: set[str] = set()
        self._lock = trio.Lock()

    async def ensure(self, spec: ContainerSpec, *, owner: Mapping[str, str] | None) -> None:
        """The Secret of ``spec``'s service, made once (the pod refers to it, never holds a
        value); one left by an earlier try is replaced."""
        manifest = secret_manifest(spec, namespace=self._calls.namespace, owner=owner)
        name = manifest["metadata"]["name"]
        async with self._lock:
            if name in self._made:
                return
            status, body = await self._calls.json("create", "POST", "secrets", json=manifest)
            if status == 409:  # an earlier try's: replaced (the Role grants no update)
                await self._calls.json("remove", "DELETE", f"secrets/{quote(name)}")
                status, body = await self._calls.json("create", "POST", "secrets", json=manifest)
            if status not in (200, 201, 202):
                raise errors.secret_not_made(spec.labels.get(LABEL_SERVICE, ""), name, status, body)
            self._made.add(name)

    async def remove_all(self) -> None:
        """The services' Secrets go with the orchestrator (in the cluster, its pod owns them
        too: the garbage collector removes them if it dies first)."""
        for name in sorted(self._made):
            with trio.CancelScope(shield=True), trio.move_on_after(DELETE_BOUND):
                try:
                    await self._calls.json("remove", "DELETE", f"secrets/{quote(name)}")
                except FabricError as exc:
                    log.warning("secret_remove_failed", extra={"secret": name, "detail": str(exc)})
        self._made.clear()


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _epoch(timestamp: object) -> float:
    """An RFC 3339 UTC timestamp (``2026-11-23T10:00:00Z``) in seconds since the epoch."""
    if isinstance(timestamp, str):
        with contextlib.suppress(ValueError):
            return float(calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")))
    return 0.0
