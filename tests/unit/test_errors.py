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
    SessionCrashed,
    SessionEnding,
    SessionRefused,
)
from reactor_fabric._reasons import (
    INTERNAL_ERROR,
    ORCHESTRATOR_STOPPING,
    SESSION_ENDED_BY_OPERATOR,
    TOO_MANY_SESSIONS,
)
from reactor_fabric.protocol.answers import session_ending, too_many_requests_to_client
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


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (SessionRefused("full", reason=TOO_MANY_SESSIONS), SessionRefused),
        (SessionCrashed("a bug", reason=INTERNAL_ERROR), SessionCrashed),
        (session_ending(ORCHESTRATOR_STOPPING), SessionEnding),
        (session_ending(SESSION_ENDED_BY_OPERATOR), SessionEnding),
    ],
)
def test_a_refused_or_ended_session_is_not_a_start_failure_but_keeps_its_wire_code(
    error: FabricError, kind: type[FabricError]
) -> None:
    assert isinstance(error, kind)
    assert not isinstance(error, ContainerStartFailure)
    wire = error.to_jsonrpc_error()
    assert (wire["code"], wire["message"]) == (-32002, "Container Start Failure")


def test_every_error_class_has_its_code_and_message_in_the_error_table() -> None:
    section = USAGE.read_text().split("\n## Errors\n")[1].split("\n## ")[0]
    rows = {
        (int(cells[1]), cells[2])
        for line in section.splitlines()
        if line.startswith("| -3")
        for cells in [[c.strip() for c in line.split("|")]]
    }
    assert {(c.code, c.title) for c in _error_classes()} <= rows
