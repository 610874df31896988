from __future__ import annotations

from pathlib import Path

import docker.errors
import pytest
import requests

from reactor_fabric import (
    ClientDidNotAnswer,
    ContainerStartFailure,
    DockerUnavailable,
    FabricError,
)
from reactor_fabric.protocol.session import too_many_requests_to_client
from reactor_fabric.runtime.docker import translate_docker_error

USAGE = Path(__file__).resolve().parents[2] / "docs" / "USAGE.md"


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


def _error_classes() -> list[type[FabricError]]:
    """Every concrete error class (one with a code), wherever it is defined."""
    import reactor_fabric.protocol.fabric_server  # noqa: PLC0415 - defines its errors too
    import reactor_fabric.protocol.session  # noqa: F401, PLC0415

    found: list[type[FabricError]] = []
    todo: list[type[FabricError]] = [FabricError]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "code" in vars(cls):
            found.append(cls)
    return found


def test_minus_32001_means_only_that_the_engine_cannot_be_reached() -> None:
    # A server's request the client never answered was -32001 too.
    assert [c for c in _error_classes() if c.code == -32001] == [DockerUnavailable]


def test_a_request_the_client_never_answered_has_a_code_of_its_own() -> None:
    error = too_many_requests_to_client(256)
    assert isinstance(error, ClientDidNotAnswer)
    assert error.to_jsonrpc_error() == {
        "code": -32006,
        "message": "Client Did Not Answer",
        "data": {
            "reason": "too_many_requests_to_client",
            "detail": "256 requests to the client are already waiting",
        },
    }


def test_every_error_class_has_its_code_and_message_in_the_error_table() -> None:
    section = USAGE.read_text().split("\n## Errors\n")[1].split("\n## ")[0]
    rows = {
        (int(cells[1]), cells[2])
        for line in section.splitlines()
        if line.startswith("| -3")
        for cells in [[c.strip() for c in line.split("|")]]
    }
    assert {(c.code, c.title) for c in _error_classes()} <= rows
