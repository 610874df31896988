"""What the Kubernetes API server's failures mean: the one translation into the product's errors.

Every failure of the Kubernetes runtime becomes one of the product's errors here, with its
reason (see ``_reasons.py`` and docs/USAGE.md's error table), as :mod:`.docker_errors` does
for Docker:

- the API server not reached (refused, reset, TLS, kr8s's own timeout), no answer within a
  call's bound, credentials that cannot be loaded, or an answer of HTTP 5xx: DockerUnavailable
  (-32001, ``kubernetes_unavailable`` / ``kubernetes_timeout``);
- anything the API server refused (HTTP 4xx; for 401 and 403 the message names the Role to
  check): ContainerStartFailure (-32002, ``{action}_failed``, with the status); a refused
  attach is ``attach_failed``;
- what a pod's state says about its start (:mod:`reactor_fabric.protocol.k8s_pod_state`): a
  start that cannot succeed (its reason: ``image_not_found``, ``start_failed`` …), a server
  that ended before the attach (``container_exited``, with its exit code), a pod not running
  within the start bound or deleted meanwhile, a watch event over its bound, a spec that cannot
  be a pod (``start_failed``);
- the objects a pod needs that could not be made: its NetworkPolicy (``egress_unavailable``),
  its service's Secret (``secret_unavailable``).

Pure: no I/O, no trio, no client library. The exceptions are taken as given: which of httpx's,
kr8s's and the socket's exceptions mean that the API server was not reached is decided where
the call is made (:mod:`.kubernetes_calls`), which raises what this module returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
from ..protocol.k8s_pod_state import Exited, PodProgress, StartFailed, Starting

# --- the API server and its credentials -----------------------------------------------------


def unreachable(action: str, exc: BaseException) -> DockerUnavailable:
    """The API server was not reached for ``action`` (the connection failed or broke)."""
    return DockerUnavailable(
        f"cannot reach the Kubernetes API server ({action}): {exc}",
        reason=KUBERNETES_UNAVAILABLE,
        action=action,
    )


def no_answer(action: str, bound: float) -> DockerUnavailable:
    """The API server did not answer ``action`` within its bound."""
    return DockerUnavailable(
        f"the Kubernetes API server did not answer {action} within {bound:g} s",
        reason=KUBERNETES_TIMEOUT,
        action=action,
    )


def credentials_too_slow() -> DockerUnavailable:
    return DockerUnavailable(
        "the Kubernetes credentials did not load in time",
        reason=KUBERNETES_TIMEOUT,
        action="connect",
    )


def credentials_failed(exc: BaseException, *, again: bool = False) -> DockerUnavailable:
    """The kubeconfig (or the service account) did not give credentials; ``again``: when
    they were loaded anew after a 401."""
    return DockerUnavailable(
        f"cannot load Kubernetes credentials{' again' if again else ''}: {exc}",
        reason=KUBERNETES_UNAVAILABLE,
        action="connect",
    )


def version_refused(status: int) -> DockerUnavailable:
    """``/version`` (the ping) answered with something else than 200."""
    return DockerUnavailable(
        f"the Kubernetes API server answered /version with HTTP {status}",
        reason=KUBERNETES_UNAVAILABLE,
        action="ping",
    )


def refused(action: str, status: int, body: Mapping[str, Any]) -> FabricError:
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


def failure_detail(status: int, body: Mapping[str, Any]) -> str:
    """A refused removal as its log record's ``detail`` says it."""
    return f"HTTP {status}: {body.get('message', '')}"


# --- the attach -----------------------------------------------------------------------------


def attach_too_slow(name: str) -> DockerUnavailable:
    return DockerUnavailable(
        f"the Kubernetes API server did not accept the attach to {name} in time",
        reason=KUBERNETES_TIMEOUT,
        action="attach",
    )


def attach_refused(name: str, refusal: BaseException, status: int) -> ContainerStartFailure:
    """The attach's handshake was refused (``status``: the HTTP status; 0: no answer)."""
    return ContainerStartFailure(
        f"the API server refused to attach to pod {name}: {refusal}",
        reason=ATTACH_FAILED,
        action="attach",
        status=status,
    )


# --- one pod's start ------------------------------------------------------------------------


def not_a_pod(exc: ValueError) -> ContainerStartFailure:
    """The spec cannot be a pod (:class:`~.kubernetes_manifests.ManifestError`)."""
    return ContainerStartFailure(
        f"the session cannot be a pod: {exc}", reason=START_FAILED, action="create"
    )


def start_failed(name: str, failed: StartFailed) -> ContainerStartFailure:
    """The pod's state says its server cannot start (its reason, as the pod state gives it)."""
    return ContainerStartFailure(
        f"pod {name}: {failed.detail}", reason=failed.reason, action="start"
    )


def exited_before_attach(name: str, exited: Exited) -> ContainerStartFailure:
    return ContainerStartFailure(
        f"pod {name} ended before it could be attached: {exited.detail}",
        reason=CONTAINER_EXITED,
        action="start",
        exit_code=exited.exit_code,
    )


def not_running_in_time(name: str, bound: float, last: PodProgress) -> ContainerStartFailure:
    """The pod's server did not run within ``bound``; ``last``: what its state said last
    (a waiting reason, pulling say, is told)."""
    return ContainerStartFailure(
        f"pod {name} did not run within {bound:g} s"
        + (f" ({last.detail})" if isinstance(last, Starting) and last.detail else ""),
        reason=START_FAILED,
        action="start",
    )


def deleted_while_starting(name: str) -> ContainerStartFailure:
    return ContainerStartFailure(
        f"pod {name} was deleted while it started", reason=START_FAILED, action="start"
    )


def watch_event_too_large(exc: BaseException) -> ContainerStartFailure:
    return ContainerStartFailure(
        f"a watch event over the bound: {exc}", reason=START_FAILED, action="watch"
    )


# --- the objects a pod needs ----------------------------------------------------------------


def network_policy_not_made(
    service: str, name: str, status: int, body: Mapping[str, Any]
) -> ContainerStartFailure:
    """The NetworkPolicy of an egress pod could not be made: the pod never runs without it."""
    return ContainerStartFailure(
        f"service {service!r}: the NetworkPolicy {name} of its pod could not be made "
        f"(HTTP {status}: {str(body.get('message', ''))[:300]})",
        reason=EGRESS_UNAVAILABLE,
        service=service,
    )


def secret_not_made(
    service: str, name: str, status: int, body: Mapping[str, Any]
) -> ContainerStartFailure:
    """The Secret of a service with secrets could not be made: its pods would not start."""
    return ContainerStartFailure(
        f"service {service!r}: its Secret {name} could not be made "
        f"(HTTP {status}: {str(body.get('message', ''))[:300]})",
        reason=SECRET_UNAVAILABLE,
        service=service,
    )
