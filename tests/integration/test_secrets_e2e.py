"""Secrets on the real engine (Docker; Podman with DOCKER_HOST at its socket): a secret reaches
the server as its environment variable and as /run/secrets/NAME (memory-backed, 0400, the
server's own), and its value appears nowhere else: not in the orchestrator's log (the server's
stderr line with it is redacted), the audit trail, /api/sessions, /metrics, the status page,
the catalog cache, nor — for ``as: file`` — in what the engine shows of the container."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import secrets
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import docker
import pytest
import trio

from tests.integration.harness import (
    Orchestrator,
    build_test_image,
    containers_of,
    orchestrator,
    wait_until,
    write_suite,
)
from tests.integration.test_bounds_e2e import websocket
from tests.messages import request

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def probe_image() -> str:
    return build_test_image("probe")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def two_secrets(tmp_path: Path) -> tuple[str, str, dict[str, Any]]:
    """Fresh values for the probe's two secrets (one from the environment variable
    RF_E2E_GITHUB_TOKEN, delivered both ways; one from a private file, ``as: file``), and the
    service's ``secrets:`` naming them."""
    env_value = "rf-env-" + secrets.token_hex(16)
    file_value = "rf-file-" + secrets.token_hex(16)
    secret_file = tmp_path / "db-password"
    secret_file.write_text(file_value + "\n")
    secret_file.chmod(0o600)
    return (
        env_value,
        file_value,
        {
            "GITHUB_TOKEN": {"env": "RF_E2E_GITHUB_TOKEN"},
            "DB_PASSWORD": {"file": str(secret_file), "as": "file"},
        },
    )


def fetched(running: Orchestrator, path: str) -> str:
    asked = urllib.request.Request(f"{running.http_url}{path}", headers=running.auth_header)
    with urllib.request.urlopen(asked, timeout=30) as answer:
        return str(answer.read().decode())


@pytest.mark.parametrize("warm", [0, 1], ids=["fresh", "pooled"])
def test_a_secret_reaches_the_server_as_env_and_file_and_appears_nowhere_else(
    tmp_path: Path, probe_image: str, warm: int
) -> None:
    env_value, file_value, probe_secrets = two_secrets(tmp_path)
    cache = tmp_path / "cache"
    suite = write_suite(
        tmp_path / "suite.yaml",
        [],
        test_services={
            "probe": {
                "image": probe_image,
                "warm": warm,
                "secrets": probe_secrets,
            }
        },
    )
    env = {"RF_E2E_GITHUB_TOKEN": env_value, "XDG_CACHE_HOME": str(cache)}
    client = docker.from_env(version="auto", timeout=60)

    async def ask(running: Orchestrator) -> tuple[dict[str, Any], dict[str, Any]]:
        ws = await websocket(running, "/mcp/probe")
        await ws.send_json(request(1, "secret", {"name": "GITHUB_TOKEN"}))
        token = (await ws.hear())["result"]
        await ws.send_json(request(2, "secret", {"name": "DB_PASSWORD"}))
        password = (await ws.hear())["result"]
        # While the session runs: what the operators' pages and the engine show.
        pages = [fetched(running, path) for path in ("/api/sessions", "/metrics", "/")]
        # The session's container (with a pool: the pooled one it was given, and the next).
        inspected = json.dumps(
            [
                client.api.inspect_container(container.id)
                for container in containers_of(client, instance=running.instance)
            ]
        )
        await ws.aclose()
        return {"token": token, "password": password}, {"pages": pages, "inspect": inspected}

    before = shared_memory_dirs()
    try:
        with orchestrator(suite, tmp_path / "orchestrator.log", env=env) as running:
            if warm:
                wait_until(
                    lambda: any(e["event"] == "pooled_container_ready" for e in running.logs()),
                    what="a pooled container",
                )
            seen, shown = trio.run(ask, running)
            wait_until(
                lambda: any(
                    e["event"] == "container_stderr" and "DB_PASSWORD" in e.get("line", "")
                    for e in running.logs()
                ),
                what="the server's debug lines in the log",
            )
    finally:
        client.close()

    token, password = seen["token"], seen["password"]
    assert isinstance(token, dict)
    assert isinstance(password, dict)
    # As the environment variable and as a file, the server's own, read-only, in memory.
    assert token["env_sha256"] == sha(env_value)
    assert token["file"] == {
        "sha256": sha(env_value),
        "uid": token["uid"],
        "gid": token["gid"],
        "mode": 0o400,
        "fs": "tmpfs",
    }
    # as: file: no environment variable; the file without the trailing newline.
    assert password["env_sha256"] is None
    assert password["file"]["sha256"] == sha(file_value)
    assert password["file"]["mode"] == 0o400
    assert password["file"]["uid"] == password["uid"]

    # The engine shows the environment to whoever reaches it (as documented), never a file's.
    assert env_value in shown["inspect"]
    assert file_value not in shown["inspect"]
    # Nowhere else: the log (with the server's debug lines redacted), the trail, the pages,
    # the catalog cache.
    log_text = (tmp_path / "orchestrator.log").read_text()
    assert "probe debug: GITHUB_TOKEN=[REDACTED]" in log_text
    assert "probe debug: DB_PASSWORD=[REDACTED]" in log_text
    places = {
        "log": log_text,
        "audit": running.audit_path.read_text() if running.audit_path.exists() else "",
        **{f"page {n}": page for n, page in enumerate(shown["pages"])},
        **{
            f"cache {path.name}": path.read_text(errors="replace")
            for path in cache.rglob("*")
            if path.is_file()
        },
    }
    for where, text in places.items():
        assert env_value not in text, where
        assert file_value not in text, where
    # The memory-backed copies went with the orchestrator: its directory, the one its
    # containers were given (another orchestrator on the host, the Podman run's, has its own).
    given = set(re.findall(r"/dev/shm/reactor-fabric-secrets-[^/\"]+", shown["inspect"]))
    assert len(given) == 1, given
    assert given.isdisjoint(str(path) for path in before)
    assert not any(Path(path).exists() for path in given)


def shared_memory_dirs() -> set[Path]:
    return set(Path("/dev/shm").glob("reactor-fabric-secrets-*"))


OWNER = 4000  # the project's owner: a user of the host like any other
NOBODY = 65534
# Both forms of a running server's secrets, as another process of its uid finds them.
PLACES = ("environ", "root/run/secrets/GITHUB_TOKEN", "root/run/secrets/DB_PASSWORD")


def read_as(uid: int, path: str) -> tuple[int, str]:
    """``cat PATH`` as the host's user ``uid`` (exit status, what it printed)."""
    done = subprocess.run(
        ["cat", path],
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
        timeout=30,
    )
    return done.returncode, done.stdout + done.stderr


def test_neither_the_projects_owner_nor_nobody_reads_a_running_servers_secrets(
    tmp_path: Path, probe_image: str
) -> None:
    # The attack: a host account sharing the server's uid reads /proc/PID/environ and, through
    # /proc/PID/root, /run/secrets/* while it runs. A root orchestrator ran servers as the
    # project's owner (a mounted session) or as nobody (unmounted sessions, the catalog probe,
    # pooled containers): any daemon running as nobody got every secret of the suite.
    env_value, file_value, probe_secrets = two_secrets(tmp_path)
    project = tmp_path / "projects" / "app"
    project.mkdir(parents=True)
    os.chown(project, OWNER, OWNER)
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path / "projects")],
        test_services={
            "probe": {
                "image": probe_image,
                "secrets": probe_secrets,
            }
        },
    )
    client = docker.from_env(version="auto", timeout=60)

    async def attack(running: Orchestrator, path: str, readers: tuple[int, ...]) -> Any:
        ws = await websocket(running, path)
        await ws.send_json(request(1, "secret", {"name": "GITHUB_TOKEN"}))
        seen = (await ws.hear())["result"]
        [container] = containers_of(client, instance=running.instance)
        pid = client.api.inspect_container(container.id)["State"]["Pid"]
        tried = {
            (uid, place): await trio.to_thread.run_sync(read_as, uid, f"/proc/{pid}/{place}")
            for uid in readers
            for place in (
                "environ",
                "root/run/secrets/GITHUB_TOKEN",
                "root/run/secrets/DB_PASSWORD",
            )
        }
        await ws.aclose()
        wait_until(lambda: not containers_of(client, instance=running.instance), what="removed")
        return seen, tried

    try:
        with orchestrator(
            suite, tmp_path / "orchestrator.log", env={"RF_E2E_GITHUB_TOKEN": env_value}
        ) as running:
            mounted = trio.run(
                attack, running, f"/mcp/probe?mount={project}:/workspace", (OWNER, NOBODY)
            )
            unmounted = trio.run(attack, running, "/mcp/probe", (NOBODY,))
    finally:
        client.close()

    for seen, tried in (mounted, unmounted):
        # Neither the project's owner nor nobody could read either form...
        for (uid, place), (status, output) in tried.items():
            assert env_value not in output, (uid, place)
            assert file_value not in output, (uid, place)
            assert status != 0, (uid, place, output)
            assert "Permission denied" in output, (uid, place, output)
        # ...though the server got its secret: it runs as a uid no account of this host holds.
        assert seen["env_sha256"] == sha(env_value)
        assert seen["uid"] not in (OWNER, NOBODY, 0), seen
        with pytest.raises(KeyError):
            pwd.getpwuid(seen["uid"])
