"""Where a session's pod is in its start, from the status the API server reports."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_fabric.protocol.k8s_pod_state import (
    Exited,
    Running,
    StartFailed,
    Starting,
    pod_progress,
)


def pod(phase: str, state: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    """A Pod as the API returns it, with the server container's ``state``."""
    containers = [] if state is None else [{"name": "server", "state": state, "ready": False}]
    return {
        "kind": "Pod",
        "metadata": {"name": "rf-time-0123456789ab-0"},
        "status": {"phase": phase, "containerStatuses": containers, **status},
    }


def test_a_pod_being_scheduled_or_created_is_starting() -> None:
    assert pod_progress(pod("Pending")) == Starting()
    creating = pod("Pending", {"waiting": {"reason": "ContainerCreating"}})
    assert pod_progress(creating) == Starting("ContainerCreating")


def test_a_pod_nowhere_to_run_is_still_starting_with_the_reason_for_the_deadline_to_name() -> None:
    unschedulable = pod(
        "Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory.",
            }
        ],
    )
    assert pod_progress(unschedulable) == Starting(
        "Unschedulable: 0/3 nodes are available: 3 Insufficient memory."
    )


def test_a_running_server_is_attached() -> None:
    assert pod_progress(pod("Running", {"running": {"startedAt": "2026-11-22T10:00:00Z"}})) == (
        Running()
    )


@pytest.mark.parametrize(
    "reason", ["ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"]
)
def test_an_image_that_cannot_be_had_is_image_not_found(reason: str) -> None:
    waiting = {"waiting": {"reason": reason, "message": 'Container image "x:1" is not present'}}
    progress = pod_progress(pod("Pending", waiting))
    assert progress == StartFailed(
        "image_not_found", f'{reason}: Container image "x:1" is not present'
    )


@pytest.mark.parametrize(
    "reason",
    ["CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff"],
)
def test_a_container_that_cannot_be_made_or_run_is_start_failed(reason: str) -> None:
    progress = pod_progress(pod("Pending", {"waiting": {"reason": reason}}))
    assert progress == StartFailed("start_failed", reason)


def test_a_server_that_exited_says_how() -> None:
    exited = pod("Failed", {"terminated": {"exitCode": 2, "reason": "Error"}})
    assert pod_progress(exited) == Exited(2, False, "Error")
    killed = pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    assert pod_progress(killed) == Exited(137, True, "OOMKilled")


def test_a_pod_that_ended_without_a_container_state_has_exited_unknown() -> None:
    evicted = pod("Failed", None, reason="Evicted", message="The node was low on memory.")
    assert pod_progress(evicted) == Exited(-1, False, "Evicted: The node was low on memory.")
    deadline = pod("Failed", None, reason="DeadlineExceeded")
    assert pod_progress(deadline) == Exited(-1, False, "DeadlineExceeded")


@pytest.mark.parametrize(
    "odd",
    [
        {},
        {"status": None},
        {"status": {"containerStatuses": [None, "x", {"name": "server", "state": []}]}},
        {"status": {"conditions": ["junk"], "phase": 3}},
    ],
)
def test_an_odd_status_is_starting_never_an_error(odd: dict[str, Any]) -> None:
    assert pod_progress(odd) == Starting()


def test_only_the_server_containers_state_counts() -> None:
    status = {
        "phase": "Running",
        "containerStatuses": [
            {"name": "sidecar", "state": {"terminated": {"exitCode": 1}}},
            {"name": "server", "state": {"running": {}}},
        ],
    }
    assert pod_progress({"status": status}) == Running()
