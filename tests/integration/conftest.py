"""Real-engine tests: they need a Docker engine and the local images (`make images`).

They are skipped only when REACTOR_FABRIC_SKIP_INTEGRATION=1 says so; otherwise a missing engine
or image makes them fail, with a message saying what to run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.integration.harness import STARTED, containers_of, engine_is_podman

SKIP = os.environ.get("REACTOR_FABRIC_SKIP_INTEGRATION") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)
            if SKIP:
                item.add_marker(
                    pytest.mark.skip(reason="REACTOR_FABRIC_SKIP_INTEGRATION=1 was set")
                )


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env(version="auto", timeout=30)
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"no Docker engine answers ({exc}); run `make docker` (scripts/ensure-docker)")
    yield client
    client.close()


@pytest.fixture(autouse=True)
def no_container_of_this_test_is_left() -> Iterator[None]:
    """After each real-engine test, no container of the orchestrators it started may remain.

    Counted per orchestrator instance (its label), so that containers of anything else on the
    machine — another test run, a developer's `make run` — neither hide a leak nor fake one.
    """
    STARTED.clear()
    yield
    if SKIP or not STARTED:
        return
    client = docker.from_env(version="auto", timeout=30)
    try:
        for running in STARTED:
            if running.process.poll() is None:
                continue  # still running: the test's own context will stop it
            instance = running.instance
            left = containers_of(client, instance=instance, include_probes=True)
            assert not left, f"instance {instance} left containers: {[c.name for c in left]}"
    finally:
        STARTED.clear()
        client.close()


@pytest.fixture(autouse=True)
def _docker_only(request: pytest.FixtureRequest) -> None:
    """``@pytest.mark.docker_only(reason)``: skipped on Podman, here rather than in the test: a
    skip raised inside an async test reaches pytest through trio without its reason."""
    marker = request.node.get_closest_marker("docker_only")
    if marker is not None and engine_is_podman(request.getfixturevalue("docker_client")):
        pytest.skip(marker.args[0])


@pytest.fixture
def project_root(tmp_path: Path) -> Path:
    root = tmp_path / "projects"
    root.mkdir()
    return root
