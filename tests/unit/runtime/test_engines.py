"""Which engine the Docker runtime reaches, and what the engine says it is."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from reactor_fabric._cli_parser import build_parser
from reactor_fabric._runtime_choice import engine_runtime
from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.config.suite import check_suite_text
from reactor_fabric.runtime.docker import DockerRuntime
from reactor_fabric.runtime.engines import EngineAddressError, engine_url, identify

# GET /version as the two engines answered it on a test machine (Debian 12's packages).
DATA = Path(__file__).resolve().parents[1] / "data"  # tests/unit/data, shared
PODMAN_VERSION = json.loads((DATA / "version-podman-4.3.1.json").read_text())
DOCKER_VERSION = json.loads((DATA / "version-docker-20.10.24.json").read_text())


def test_docker_is_reached_wherever_docker_py_looks() -> None:
    assert engine_url("docker", {"CONTAINER_HOST": "unix:///p.sock"}, uid=0) is None


def test_podman_is_reached_at_container_host_first() -> None:
    environ = {"CONTAINER_HOST": "unix:///srv/podman.sock", "XDG_RUNTIME_DIR": "/run/user/7"}
    assert engine_url("podman", environ, uid=7) == "unix:///srv/podman.sock"


def test_podman_is_reached_at_the_rootful_socket_as_root_and_the_rootless_one_otherwise() -> None:
    assert engine_url("podman", {}, uid=0) == "unix:///run/podman/podman.sock"
    rootless = engine_url("podman", {"XDG_RUNTIME_DIR": "/run/user/1000"}, uid=1000)
    assert rootless == "unix:///run/user/1000/podman/podman.sock"
    assert engine_url("podman", {}, uid=1000) == "unix:///run/user/1000/podman/podman.sock"


def test_a_remote_ssh_podman_is_refused_with_what_can_be_used_instead() -> None:
    with pytest.raises(EngineAddressError, match=r"unix:// and tcp://"):
        engine_url("podman", {"CONTAINER_HOST": "ssh://core@host/run/podman.sock"}, uid=0)


def test_podman_says_it_is_podman_by_its_engine_component() -> None:
    identity = identify(PODMAN_VERSION)
    assert (identity.name, identity.version, identity.api_version) == ("podman", "4.3.1", "1.41")
    assert str(identity) == "podman 4.3.1"


def test_docker_is_docker() -> None:
    identity = identify(DOCKER_VERSION)
    assert (identity.name, identity.version) == ("docker", "20.10.24+dfsg1")


@pytest.mark.parametrize(
    "answer", [{}, {"Components": None}, {"Components": ["junk", {"Name": 3}]}, {"Version": 2}]
)
def test_an_odd_version_answer_is_taken_for_docker_without_failing(answer: dict[str, Any]) -> None:
    assert identify(answer).name == "docker"


def test_a_podman_behind_docker_host_is_named_podman_and_the_mismatch_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = DockerRuntime()
    assert runtime.name == "docker"
    with caplog.at_level(logging.INFO, logger="reactor_fabric.runtime.docker"):
        runtime._identified(identify(PODMAN_VERSION))
        runtime._identified(identify(PODMAN_VERSION))  # known: not logged again
    assert runtime.name == "podman"
    assert [r.message for r in caplog.records] == [
        "container_engine",
        "container_engine_not_as_selected",
    ]


def test_podman_selected_and_found_is_logged_once_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = DockerRuntime(engine="podman")
    with caplog.at_level(logging.INFO, logger="reactor_fabric.runtime.docker"):
        runtime._identified(identify(PODMAN_VERSION))
    assert [r.message for r in caplog.records] == ["container_engine"]
    assert runtime.identity is not None
    assert str(runtime.identity) == "podman 4.3.1"


def suite_with(runtime: str) -> Suite:
    return Suite(
        version="1.0",
        orchestrator=Orchestrator(allowed_mount_roots=["/tmp"], runtime=runtime),  # type: ignore[arg-type]
        mcp_services={"time": Service(image="reactor-fabric/mcp-server-time:x")},
    )


def test_the_flag_or_its_variable_wins_over_the_suites_runtime() -> None:
    environ = {"CONTAINER_HOST": "unix:///srv/podman.sock"}
    from_suite = engine_runtime(suite_with("podman"), None, environ)
    assert isinstance(from_suite, DockerRuntime)
    assert (from_suite.selected, from_suite._base_url) == ("podman", "unix:///srv/podman.sock")
    overridden = engine_runtime(suite_with("podman"), "docker", environ)
    assert isinstance(overridden, DockerRuntime)
    assert (overridden.selected, overridden._base_url) == ("docker", None)
    parser = build_parser({"REACTOR_FABRIC_RUNTIME": "podman"})
    assert parser.parse_args([]).runtime == "podman"
    assert parser.parse_args(["--runtime", "docker"]).runtime == "docker"


def test_an_unknown_runtime_in_the_suite_is_an_invalid_suite() -> None:
    check = check_suite_text(
        'version: "1.0"\norchestrator: {allowed_mount_roots: ["/tmp"], runtime: rkt}\n'
        "mcp_services: {time: {image: x}}\n",
        source="suite.yaml",
    )
    assert check.suite is None
    assert any("runtime" in str(issue) for issue in check.issues)
