"""Where a session's pod is in its start, read from the pod's status. Pure.

The Kubernetes runtime watches its pod from creation until the server runs (then it attaches)
or the start has failed; each watched version of the pod goes through :func:`pod_progress`.
What it reads: the ``server`` container's state in ``status.containerStatuses`` (``waiting``
with a reason, ``running``, ``terminated`` with an exit code), the pod's ``phase``, and the
``PodScheduled`` condition.

Start failures map to the product's -32002 reasons, as a Docker start's do:

- the image cannot be had (``ErrImagePull``, ``ImagePullBackOff``, ``ErrImageNeverPull`` with
  ``imagePullPolicy: Never``, ``InvalidImageName``) → ``image_not_found``;
- the container cannot be made or run (``CreateContainerConfigError``,
  ``CreateContainerError``, ``RunContainerError``, ``CrashLoopBackOff``) → ``start_failed``;
- the server exited before it could be attached → ``container_exited``.

A pod that cannot be scheduled stays :class:`Starting` (the cluster may yet make room: a node
scaling up); the runtime's own start deadline decides when to give up, and names the reason
this module reports in :attr:`Starting.detail`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .._reasons import IMAGE_NOT_FOUND, START_FAILED

CONTAINER: Final = "server"
IMAGE_REASONS: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
)
START_REASONS: Final = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff"}
)


@dataclass(frozen=True, slots=True)
class Starting:
    """Not running yet; ``detail`` says what it waits for, when the cluster said."""

    detail: str = ""


@dataclass(frozen=True, slots=True)
class Running:
    """The server runs: attach now."""


@dataclass(frozen=True, slots=True)
class StartFailed:
    """The start failed for good (``reason``: the product's -32002 reason)."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Exited:
    """The server has exited (``exit_code``; ``oom_killed`` when the memory limit ended it)."""

    exit_code: int
    oom_killed: bool
    detail: str


PodProgress = Starting | Running | StartFailed | Exited


def pod_progress(pod: Mapping[str, Any]) -> PodProgress:
    """Where ``pod`` (a Pod object as the API returns it) is in its start."""
    status = _mapping(pod.get("status"))
    known = _from_container(_server_state(status))
    if known is not None:
        return known
    if status.get("phase") in ("Succeeded", "Failed"):
        # Ended with no container state left to read (evicted, its deadline passed…).
        reason = str(status.get("reason") or status.get("phase"))
        return Exited(-1, False, _detail(reason, status.get("message")))
    for item in status.get("conditions") or ():
        condition = _mapping(item)
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return Starting(_detail(str(condition.get("reason") or ""), condition.get("message")))
    waiting = _mapping(_server_state(status).get("waiting"))
    return Starting(_detail(str(waiting.get("reason") or ""), waiting.get("message")))


def _from_container(state: Mapping[str, Any]) -> PodProgress | None:
    """What the server container's own state says for sure (None: nothing decisive)."""
    terminated = _mapping(state.get("terminated"))
    if terminated:
        code = terminated.get("exitCode")
        reason = str(terminated.get("reason") or "")
        return Exited(
            exit_code=code if isinstance(code, int) else -1,
            oom_killed=reason == "OOMKilled",
            detail=_detail(reason, terminated.get("message")),
        )
    if state.get("running") is not None:
        return Running()
    waiting = _mapping(state.get("waiting"))
    reason = str(waiting.get("reason") or "")
    if reason in IMAGE_REASONS:
        return StartFailed(IMAGE_NOT_FOUND, _detail(reason, waiting.get("message")))
    if reason in START_REASONS:
        return StartFailed(START_FAILED, _detail(reason, waiting.get("message")))
    return None


def _server_state(status: Mapping[str, Any]) -> Mapping[str, Any]:
    for item in status.get("containerStatuses") or ():
        container = _mapping(item)
        if container.get("name") == CONTAINER:
            return _mapping(container.get("state"))
    return {}


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _detail(reason: str, message: object) -> str:
    text = f"{reason}: {message}" if isinstance(message, str) and message else reason
    return text[:500]
