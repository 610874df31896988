from __future__ import annotations

from pathlib import Path

import pytest

from reactor_fabric import (
    ClientDidNotAnswer,
    ContainerStartFailure,
    DockerUnavailable,
    FabricError,
    SecurityViolation,
    SessionCrashed,
    SessionEnding,
    SessionRefused,
)
from reactor_fabric._errors import MAX_MESSAGE_CHARS, TITLE_BY_REASON
from reactor_fabric._reasons import (
    INTERNAL_ERROR,
    ORCHESTRATOR_STOPPING,
    SESSION_ENDED_BY_OPERATOR,
    TOO_MANY_SESSIONS,
)
from reactor_fabric.protocol.answers import (
    container_exited,
    session_ending,
    too_many_requests_to_client,
)
from reactor_fabric.runtime.docker_errors import translate_docker_error
from reactor_fabric.runtime.engine_api import (
    EngineError,
    EngineUnreachable,
    ImageNotFound,
    NotFound,
)

USAGE = Path(__file__).resolve().parents[2] / "docs" / "USAGE.md"


def test_errors_carry_their_documented_code_message_and_reason() -> None:
    error = DockerUnavailable("no socket", reason="docker_unavailable", action="ping")
    assert error.to_jsonrpc_error() == {
        "code": -32001,
        "message": "Docker Daemon Unresponsive: no socket",
        "data": {"reason": "docker_unavailable", "detail": "no socket", "action": "ping"},
    }


@pytest.mark.parametrize(
    ("exc", "kind", "reason"),
    [
        (EngineUnreachable("refused"), DockerUnavailable, "docker_unavailable"),
        (FileNotFoundError(2, "No such file"), DockerUnavailable, "docker_unavailable"),
        (TimeoutError("timed out"), DockerUnavailable, "docker_unavailable"),
        (ImageNotFound(404, "No such image: x"), ContainerStartFailure, "image_not_found"),
        (EngineError(409, "conflict"), ContainerStartFailure, "start_failed"),
        (NotFound(404, "No such container: x"), ContainerStartFailure, "start_failed"),
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
        "message": "Client Did Not Answer: 256 requests to the client are already waiting",
        "data": {
            "reason": "too_many_requests_to_client",
            "detail": "256 requests to the client are already waiting",
        },
    }


@pytest.mark.parametrize(
    ("error", "kind", "title"),
    [
        (SessionRefused("full", reason=TOO_MANY_SESSIONS), SessionRefused, "Too Many Sessions"),
        (SessionCrashed("a bug", reason=INTERNAL_ERROR), SessionCrashed, "Internal Error"),
        (session_ending(ORCHESTRATOR_STOPPING), SessionEnding, "Orchestrator Stopping"),
        (
            session_ending(SESSION_ENDED_BY_OPERATOR),
            SessionEnding,
            "Session Ended by Operator",
        ),
    ],
)
def test_a_refused_or_ended_session_is_not_a_start_failure_but_keeps_its_wire_code(
    error: FabricError, kind: type[FabricError], title: str
) -> None:
    assert isinstance(error, kind)
    assert not isinstance(error, ContainerStartFailure)
    wire = error.to_jsonrpc_error()
    assert wire["code"] == -32002
    assert wire["message"] == f"{title}: {error}"


def test_the_message_is_the_title_and_what_happened_in_words_and_data_keeps_the_rest() -> None:
    exited = container_exited("everything", 137, False, ["Killed"])
    assert exited.to_jsonrpc_error() == {
        "code": -32002,
        "message": "Container Exited: the everything server exited with code 137 before answering",
        "data": {
            "reason": "container_exited",
            "detail": "the everything server exited with code 137 before answering",
            "exit_code": 137,
            "oom_killed": False,
            "stderr": ["Killed"],
        },
    }
    refused = SecurityViolation(
        "mount '/etc' resolves outside the allowed mount roots",
        reason="mount_outside_allowed_roots",
    )
    assert refused.to_jsonrpc_error()["message"] == (
        "Security Violation: mount '/etc' resolves outside the allowed mount roots"
    )


def test_a_message_is_one_bounded_line_and_the_detail_stays_whole() -> None:
    text = "Docker refused to create:\n" + "x" * 2000
    wire = ContainerStartFailure(text, reason="create_failed").to_jsonrpc_error()
    assert "\n" not in wire["message"]
    assert len(wire["message"]) == MAX_MESSAGE_CHARS
    assert wire["message"].startswith("Container Start Failure: Docker refused to create: xxx")
    assert wire["message"].endswith("…")
    assert wire["data"]["detail"] == text


def test_each_reason_in_the_error_table_shows_the_title_its_message_starts_with() -> None:
    section = USAGE.read_text().split("\n## Errors\n")[1].split("\n## ")[0]
    code_titles = {c.code: c.title for c in _error_classes()}
    rows = [
        (int(cells[1]), cells[2], cells[3].strip("`"))
        for line in section.splitlines()
        if line.startswith("| -3")
        for cells in [[c.strip() for c in line.split("|")]]
    ]
    assert len(rows) > 60
    wrong = [
        (reason, title)
        for code, title, reason in rows
        if title != TITLE_BY_REASON.get(reason, code_titles[code])
    ]
    assert wrong == []
    assert set(TITLE_BY_REASON) <= {reason for _, _, reason in rows}


def test_every_error_class_has_its_code_and_message_in_the_error_table() -> None:
    section = USAGE.read_text().split("\n## Errors\n")[1].split("\n## ")[0]
    rows = {
        (int(cells[1]), cells[2])
        for line in section.splitlines()
        if line.startswith("| -3")
        for cells in [[c.strip() for c in line.split("|")]]
    }
    assert {(c.code, c.title) for c in _error_classes()} <= rows


def test_an_engine_error_that_repeats_itself_is_said_once() -> None:
    exc = ImageNotFound(404, "no such image: ghost:none: No such image: ghost:none")
    translated = translate_docker_error(exc, "create")
    assert str(translated) == "image not found: no such image: ghost:none"
    other = EngineError(409, "conflict: name in use")
    assert str(translate_docker_error(other, "create")) == (
        "Docker refused to create: conflict: name in use"
    )
