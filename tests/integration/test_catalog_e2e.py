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
        # The bundled specialist's account has a key (one no model ever sees: its probe asks the
        # agent image's server for its tools, nothing more).
        env={**os.environ, "XDG_CACHE_HOME": str(cache), "ANTHROPIC_API_KEY": "sk-test-unused"},
    )
    return done.returncode, json.loads(done.stdout)["services"]


def rank(catalog_file: Path, *tasks: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "reactor_fabric", "rank", "--catalog", str(catalog_file)],
        input="\n".join(tasks) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


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
        "python_worker": "probe",
        "code_reviewer": "probe",
        "absent": "error",
    }
    # The documented catalog form: each service's own tool names, the suite's words about it.
    names = {name: [t["name"] for t in s["tools"]] for name, s in services.items()}
    assert names["time"] == ["get_current_time", "convert_time"]
    assert "git_log" in names["git"]
    assert "read_text_file" in names["filesystem"]
    assert "echo" in names["everything"]
    assert names["code_reviewer"] == ["run_task"]  # the agent image's one tool
    assert "run_python" in names["python_worker"]
    assert "version-control" in services["git"]["categories"]
    assert services["git"]["example_tasks"]
    assert services["git"]["requires"] == []
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
        "python_worker": "cache",
        "code_reviewer": "cache",
    }
    assert again["git"]["tools"] == services["git"]["tools"]
    _, refreshed = catalog(suite, tmp_path / "cache", "--refresh")
    assert refreshed["time"]["source"] == "probe"


def test_the_printed_catalog_is_what_rank_reads(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "suite.yaml", [str(tmp_path)])
    code, services = catalog(suite, tmp_path / "cache")
    assert code == 0
    catalog_file = tmp_path / "catalog.json"
    catalog_file.write_text(json.dumps({"services": services}))
    first, second = rank(
        catalog_file,
        "show me the last commits of this repository",
        "what time is it in Tokyo right now",
    )
    assert first["recommended_servers"] == ["git"]
    assert second["recommended_servers"] == ["time"]
    assert set(first) == {
        "task",
        "recommended_servers",
        "ranked_servers",
        "confidence",
        "latency_ms",
    }
    assert 0.0 <= first["confidence"] <= 1.0
    assert first["latency_ms"] > 0
