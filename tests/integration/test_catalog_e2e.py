"""`python -m reactor_fabric catalog` on the real engine, with the bundled servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.harness import REPO, write_suite

pytestmark = pytest.mark.integration


def catalog(suite: Path, cache: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reactor_fabric",
            "catalog",
            "--config",
            str(suite),
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )
    return done.returncode, json.loads(done.stdout)["services"]


def test_every_bundled_service_is_learned_once_then_served_from_the_cache(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path)],
        test_services={"absent": {"image": "reactor-fabric/no-such-image:0"}},
    )
    code, services = catalog(suite, tmp_path / "cache")
    assert code == 1  # one service could not be learned...
    assert "image" in services["absent"]["error"]
    # ...and every other one was, by a probe.
    assert {name: s["source"] for name, s in services.items()} == {
        "time": "probe",
        "git": "probe",
        "filesystem": "probe",
        "everything": "probe",
        "absent": "error",
    }
    names = {name: [t["name"] for t in s["tools"]] for name, s in services.items()}
    assert names["time"] == ["time__get_current_time", "time__convert_time"]
    assert "git__git_log" in names["git"]
    assert "filesystem__read_text_file" in names["filesystem"]
    assert "everything__echo" in names["everything"]
    assert all(t["description"].startswith("[git]") for t in services["git"]["tools"])
    assert services["everything"]["prompts"]
    assert services["everything"]["resources"]
    assert not docker_client.containers.list(
        all=True, filters={"label": "reactor-fabric.managed=true", "name": "rf-catalog-"}
    )
    code, again = catalog(suite, tmp_path / "cache")
    assert {name: s["source"] for name, s in again.items() if name != "absent"} == {
        "time": "cache",
        "git": "cache",
        "filesystem": "cache",
        "everything": "cache",
    }
    assert again["git"]["tools"] == services["git"]["tools"]
    _, refreshed = catalog(suite, tmp_path / "cache", "--refresh")
    assert refreshed["time"]["source"] == "probe"
