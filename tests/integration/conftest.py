"""Real-engine tests: they need a Docker engine and the local images (`make images`).

They are skipped only when REACTOR_FABRIC_SKIP_INTEGRATION=1 says so; otherwise a missing engine
or image makes them fail, with a message saying what to run. On Podman, the tests that
tests/integration/engines.py names run on Docker only: they are deselected there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.integration.engines import docker_only_reason
from tests.integration.harness import STARTED, containers_of, engine_is_podman

SKIP = os.environ.get("REACTOR_FABRIC_SKIP_INTEGRATION") == "1"
# Every real-engine test on Podman too, the Docker-only ones included (engines.py).
PODMAN_ALL = os.environ.get("REACTOR_FABRIC_PODMAN_ALL") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    integration = [item for item in items if "tests/integration/" in str(item.path)]
    for item in integration:
        item.add_marker(pytest.mark.integration)
        if SKIP:
            item.add_marker(pytest.mark.skip(reason="REACTOR_FABRIC_SKIP_INTEGRATION=1 was set"))
    if integration and not SKIP and not PODMAN_ALL and _engine_is_podman():
        _deselect_docker_only(config, items)


def _engine_is_podman() -> bool:
    """Whether the engine the tests reach is Podman, asked once at collection. No engine:
    nothing is deselected, and the tests fail with the docker_client fixture's hint."""
    try:
        client = docker.from_env(version="auto", timeout=30)
    except docker.errors.DockerException:
        return False
    try:
        return engine_is_podman(client)
    except docker.errors.DockerException:
        return False
    finally:
        client.close()


def _deselect_docker_only(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Podman runs what differs between engines: the tests engines.py names are deselected
    (counted so by pytest, never reported as passed)."""
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        function = getattr(item, "originalname", item.name)
        on_docker_only = "tests/integration/" in str(item.path) and docker_only_reason(
            item.path.name, function
        )
        (deselected if on_docker_only else kept).append(item)
    if not deselected:
        return
    config.hook.pytest_deselected(items=deselected)
    items[:] = kept
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"Podman: {len(deselected)} real-engine tests deselected, they run on Docker only "
            "(tests/integration/engines.py; REACTOR_FABRIC_PODMAN_ALL=1 runs them here too)"
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


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """Headless Chromium (Debian's), driven by Selenium: what the status page's tests look
    through."""
    driver_path = shutil.which("chromedriver")
    assert driver_path, "chromedriver is missing: run scripts/ensure-test-tools (make test does)"
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
