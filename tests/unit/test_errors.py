from __future__ import annotations

import docker.errors
import pytest
import requests

from reactor_fabric import ContainerStartFailure, DockerUnavailable, FabricError
from reactor_fabric.runtime.docker import translate_docker_error


def test_errors_carry_their_documented_code_message_and_reason() -> None:
    error = DockerUnavailable("no socket", reason="docker_unavailable", action="ping")
    assert error.to_jsonrpc_error() == {
        "code": -32001,
        "message": "Docker Daemon Unresponsive",
        "data": {"reason": "docker_unavailable", "detail": "no socket", "action": "ping"},
    }


@pytest.mark.parametrize(
    ("exc", "kind", "reason"),
    [
        (requests.exceptions.ConnectionError("refused"), DockerUnavailable, "docker_unavailable"),
        (
            docker.errors.DockerException(
                "Error while fetching server API version: "
                "('Connection aborted.', FileNotFoundError(2))"
            ),
            DockerUnavailable,
            "docker_unavailable",
        ),
        (docker.errors.ImageNotFound("No such image: x"), ContainerStartFailure, "image_not_found"),
        (docker.errors.APIError("conflict"), ContainerStartFailure, "start_failed"),
        (RuntimeError("odd"), ContainerStartFailure, "start_failed"),
    ],
)
def test_backend_errors_are_translated_at_the_boundary(
    exc: Exception, kind: type[FabricError], reason: str
) -> None:
    translated = translate_docker_error(exc, "start")
    assert isinstance(translated, kind)
    assert translated.reason == reason
