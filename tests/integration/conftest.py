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


@pytest.fixture(scope="session", autouse=True)
def no_managed_container_is_left_behind() -> Iterator[None]:
    """After every real-engine test, no container labelled as ours may remain."""
    yield
    if SKIP:
        return
    client = docker.from_env(version="auto", timeout=30)
    try:
        left = client.containers.list(all=True, filters={"label": "reactor-fabric.managed=true"})
        assert not left, f"managed containers left behind: {[c.name for c in left]}"
    finally:
        client.close()


@pytest.fixture
def project_root(tmp_path: Path) -> Path:
    root = tmp_path / "projects"
    root.mkdir()
    return root
