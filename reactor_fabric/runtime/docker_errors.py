"""What the Docker engine's failures mean: the one translation into the product's errors.

Every failure of a call to the engine (:mod:`.docker_calls` runs each call and hands its
exception here) becomes one of the product's errors, with its reason (see ``_reasons.py`` and
docs/USAGE.md's error table):

- the engine not reached (no socket, refused, reset, an answer that is not HTTP) and
  every call that outran its bound or waited too long for a slot: DockerUnavailable (-32001,
  ``docker_unavailable`` / ``docker_timeout``);
- an image the engine does not have: ContainerStartFailure (-32002, ``image_not_found``);
- anything else the engine refused, or that failed about one container: ContainerStartFailure
  (``{action}_failed``).

And what some answers mean where they are not failures: a container already gone (Docker's
404, Podman's 500 saying so), a removal already in progress (409), and Podman's answers that
are only a moment early (a container still exiting, a process ending during an inspect) and
are asked again by the caller.

Pure: no I/O, no trio; the engine client only for its exception types.
"""

from __future__ import annotations

from .._errors import ContainerStartFailure, DockerUnavailable, FabricError
from .._reasons import DOCKER_TIMEOUT, DOCKER_UNAVAILABLE, IMAGE_NOT_FOUND, engine_call_failed
from .engine_api import EngineError, ImageNotFound, NotFound

_CONNECTION_ERRORS = (
    ConnectionError,  # (EngineUnreachable)
    TimeoutError,  # (socket.timeout)
    FileNotFoundError,
)
# Podman answers a force-remove that meets a container exiting on its own with this (HTTP 500)
# instead of removing it; asked again a moment later, it does.
_PODMAN_EXITING = "container state improper"
# Podman 4 answers an inspect that meets the container's process exiting with this (HTTP 500:
# "read /proc/PID/cgroup: no such process") instead of its state; asked again, it reports the
# exit. Seen in the integration tests, at a session's end.
_PODMAN_PROCESS_GONE = "no such process"


def translate_docker_error(exc: BaseException, action: str) -> FabricError:
    """Map an engine client's exception into the product's error tree."""
    if isinstance(exc, ImageNotFound) or (
        isinstance(exc, NotFound) and action in ("create", "pull")
    ):
        return ContainerStartFailure(
            f"image not found: {explain(exc)}", reason=IMAGE_NOT_FOUND, action=action
        )
    if isinstance(exc, EngineError):
        return ContainerStartFailure(
            f"Docker refused to {action}: {explain(exc)}",
            reason=engine_call_failed(action),
            action=action,
            status=exc.status_code,
        )
    if isinstance(exc, _CONNECTION_ERRORS):
        return DockerUnavailable(
            f"cannot reach the Docker engine ({action}): {exc}",
            reason=DOCKER_UNAVAILABLE,
            action=action,
        )
    return ContainerStartFailure(
        f"Docker {action} failed: {exc}", reason=engine_call_failed(action), action=action
    )


def engine_timed_out(action: str, bound: float) -> DockerUnavailable:
    """A call that had begun and did not end within its bound."""
    return DockerUnavailable(
        f"the Docker engine did not answer {action} within {bound:g} s",
        reason=DOCKER_TIMEOUT,
        action=action,
    )


def engine_busy(action: str, waited: float, slots: float) -> DockerUnavailable:
    """A call that never began: all ``slots`` stayed taken for ``waited`` seconds."""
    return DockerUnavailable(
        f"the Docker engine is busy: {action} waited {waited:g} s for one "
        f"of the {slots:g} calls it may have at once",
        reason=DOCKER_TIMEOUT,
        action=action,
    )


def container_gone(exc: EngineError) -> bool:
    """Whether the engine said the container does not exist: Docker with 404, Podman also with
    500 "no such container" when the container went while it looked (a removal racing)."""
    if isinstance(exc, NotFound):
        return True
    return exc.status_code == 500 and "no such container" in exc.explanation


def removal_in_progress(exc: EngineError) -> bool:
    """Whether a remove met another removal of the same container (409): whoever removes it
    removes its volumes too."""
    return exc.status_code == 409


def podman_still_exiting(exc: EngineError) -> bool:
    """Whether Podman refused a force-remove only because the container was exiting."""
    return exc.status_code == 500 and _PODMAN_EXITING in exc.explanation


def podman_process_ending(exc: EngineError) -> bool:
    """Whether Podman failed an inspect only because the container's process was ending."""
    return exc.status_code == 500 and _PODMAN_PROCESS_GONE in exc.explanation


def explain(exc: EngineError) -> str:
    """The engine's own words for an error, said once."""
    return _said_once(exc.explanation or str(exc))


def _said_once(text: str) -> str:
    """``text`` without an engine's repetition of itself: Docker wraps an error in its own
    words ("no such image: X: No such image: X"), and a user reads it on one line."""
    parts = text.split(": ")
    half, odd = divmod(len(parts), 2)
    if not odd and half and [p.lower() for p in parts[:half]] == [p.lower() for p in parts[half:]]:
        return ": ".join(parts[:half])
    return text
