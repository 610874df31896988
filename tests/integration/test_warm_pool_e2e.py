"""The warm pool on the real engine: real clients on both endpoints get pooled containers, and
the mount guarantees hold for containers that were started before their session.

The orchestrator runs as root here, so sessions' mounts are attached to pooled containers
through its staging area (see :mod:`reactor_fabric.runtime.staging`); one test runs it as a
user, where they cannot be, and sessions with mounts get fresh containers instead.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from reactor_fabric.runtime.staging import STAGING_PARENT
from tests.integration import harness
from tests.integration.harness import (
    Orchestrator,
    bridged_client,
    claude_shows_connected,
    containers_of,
    orchestrator,
    orchestrator_fixture,
    python2_client,
    python_client,
    text_of,
    time_call_through_fabric,
    ts_client,
    wait_until,
    write_suite,
)
from tests.integration.test_accounts_e2e import USER, give, scratch  # noqa: F401 - a fixture
from tests.integration.test_fabric_e2e import inspector_calls_time

pytestmark = pytest.mark.integration


def pooled_suite(path: Path, roots: list[str], warm: dict[str, int], **orchestrator_: Any) -> Path:
    write_suite(path, roots, **orchestrator_)
    suite = yaml.safe_load(path.read_text())
    for name, count in warm.items():
        suite["mcp_services"][name]["warm"] = count
    path.write_text(yaml.safe_dump(suite))
    return path


def ready(running: Orchestrator) -> dict[str, int]:
    """Pooled containers ready, by service, as /metrics reports them."""
    request = urllib.request.Request(f"{running.http_url}/metrics", headers=running.auth_header)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    found = re.findall(r'^reactor_fabric_pooled_containers\{service="([^"]+)"\} (\S+)$', text, re.M)
    return {service: int(float(value)) for service, value in found}


def wait_for_pool(running: Orchestrator, service: str, count: int) -> None:
    wait_until(lambda: ready(running).get(service, 0) >= count, 120, f"{count} pooled {service}")


def session_starts(running: Orchestrator, service: str) -> list[dict[str, Any]]:
    return [
        e
        for e in running.logs()
        if e["event"] == "container_started" and e.get("backend", e.get("service")) == service
    ]


def staging_mounts(instance: str) -> list[str]:
    """Mount points in the host's table below one orchestrator's staging area (those of any
    other orchestrator on the host, the Podman run's beside this one, are theirs)."""
    area = f"{STAGING_PARENT}/{instance}"
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        points = [line.split(" ")[4] for line in table]
    return [point for point in points if point == area or point.startswith(area + "/")]


time_pool = orchestrator_fixture(roots="home", service_fields={"time": {"warm": 2}})


def test_every_real_client_gets_a_pooled_container_on_both_endpoints(
    time_pool: Orchestrator, tmp_path: Path
) -> None:
    running = time_pool
    call = {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
    fabric_call = {**call, "name": "time__get_current_time"}
    home = tmp_path / "home"
    home.mkdir()

    def per_service(client: harness.LineProcess) -> None:
        try:
            assert client.ask({"op": "initialize"})["ok"]
            answer = client.ask(call)
            assert answer["ok"], answer
            assert '"timezone": "UTC"' in text_of(answer)
        finally:
            assert client.close() == 0

    clients: dict[str, Callable[[], object]] = {
        "SDK 1.x, WebSocket": lambda: per_service(python_client(f"{running.ws_url}/mcp/time")),
        "SDK 1.x, HTTP": lambda: per_service(python_client(f"{running.http_url}/mcp/time")),
        "TypeScript SDK, HTTP": lambda: per_service(ts_client(f"{running.http_url}/mcp/time")),
        "TypeScript SDK, WebSocket": lambda: per_service(ts_client(f"{running.ws_url}/mcp/time")),
        "stdio bridge, SDK 2.x": lambda: per_service(
            bridged_client(running.ws_url, "--service", "time", "--no-mount")
        ),
        "fabric endpoint, SDK 2.x": lambda: time_call_through_fabric(
            python2_client(f"{running.http_url}/mcp")
        ),
        "fabric endpoint, TypeScript SDK": lambda: _fabric_ts(running, fabric_call),
        "fabric endpoint, MCP Inspector": lambda: inspector_calls_time(
            running, f"{running.http_url}/mcp?tools=all", home
        ),
        "Claude Code (mcp list)": lambda: claude_shows_connected(
            tmp_path, "time", f"{running.http_url}/mcp/time"
        ),
    }
    for name, use in clients.items():
        wait_for_pool(running, "time", 1)
        before = len(session_starts(running, "time"))
        use()
        wait_until(functools.partial(_more_starts, running, before), 30, name)
        latest = session_starts(running, "time")[before:]
        assert all(start["pooled"] for start in latest), (name, latest)


def _more_starts(running: Orchestrator, than: int) -> bool:
    return len(session_starts(running, "time")) > than


def _fabric_ts(running: Orchestrator, fabric_call: dict[str, Any]) -> None:
    client = ts_client(f"{running.http_url}/mcp?tools=all")
    try:
        assert client.ask({"op": "initialize"})["server"] == "reactor-fabric"
        answer = client.ask(fabric_call)
        assert answer["ok"], answer
    finally:
        client.close()


def filesystem_client(running: Orchestrator, project: Path, mode: str = "") -> harness.LineProcess:
    client = python_client(f"{running.ws_url}/mcp/filesystem?mount={project}:/workspace{mode}")
    assert client.ask({"op": "initialize"})["ok"]
    return client


def listing(client: harness.LineProcess, path: str = "/workspace") -> str:
    answer = client.ask({"op": "call", "name": "list_directory", "arguments": {"path": path}})
    assert answer["ok"], answer
    return text_of(answer)


def test_pooled_sessions_each_see_their_own_project_and_nothing_of_the_others(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    projects = [tmp_path / "alpha", tmp_path / "beta"]
    for project in projects:
        project.mkdir()
        (project / f"{project.name}.txt").write_text(project.name)
    suite = pooled_suite(tmp_path / "suite.yaml", [str(tmp_path)], {"filesystem": 3})
    with orchestrator(suite, tmp_path / "o.log") as running:
        instance = running.instance
        wait_for_pool(running, "filesystem", 3)
        clients = [filesystem_client(running, project) for project in projects]
        try:
            assert "alpha.txt" in listing(clients[0])
            assert "beta.txt" not in listing(clients[0])
            assert "beta.txt" in listing(clients[1])
            assert "alpha.txt" not in listing(clients[1])
            starts = session_starts(running, "filesystem")
            assert [start["pooled"] for start in starts] == [True, True]
            by_name = {c.name: c for c in containers_of(docker_client, instance=running.instance)}
            for start, project, other in zip(starts, projects, reversed(projects), strict=True):
                container = by_name[start["container_name"]]
                pid = container.attrs["State"]["Pid"]
                # The kernel's view inside each container: its own project at /workspace...
                inside = os.stat(f"/proc/{pid}/root/workspace")
                assert (inside.st_dev, inside.st_ino) == (
                    project.stat().st_dev,
                    project.stat().st_ino,
                )
                # ...and no trace of the other session's directory in its mount table.
                table = Path(f"/proc/{pid}/mountinfo").read_text()
                assert str(other) not in table
                assert table.count(str(project)) == 1
            # The still idle pooled container sees an empty, unwritable directory only (once
            # running: the pool's refill may be listed between its create and its start).
            taken = {start["container_name"] for start in starts}

            def idle_running() -> list[Any]:
                return [
                    c
                    for c in containers_of(docker_client, instance=running.instance, pooled="true")
                    if c.name not in taken and c.attrs["State"]["Pid"]
                ]

            wait_until(lambda: bool(idle_running()), 30, "an idle pooled container running")
            for container in idle_running():
                pid = container.attrs["State"]["Pid"]
                assert os.listdir(f"/proc/{pid}/root/workspace") == []
        finally:
            for client in clients:
                client.close()
        wait_until(lambda: running_sessions(running) == 0, 30, "sessions over")
        # Each session's mount left with its container: only the idle ones' staging binds
        # remain, and no session directory is mounted anywhere below the staging area.
        for project in projects:
            assert not any(project.name in point for point in staging_mounts(instance))
    assert staging_mounts(instance) == []
    assert not (Path(STAGING_PARENT) / instance).exists()


def running_sessions(running: Orchestrator) -> int:
    request = urllib.request.Request(f"{running.http_url}/healthz", headers=running.auth_header)
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["sessions"])


def test_a_pooled_read_only_mount_is_not_written_and_what_is_written_belongs_to_the_owner(
    scratch: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
    docker_client: docker.DockerClient,
) -> None:
    project = scratch / "project"
    project.mkdir()
    give(project, USER)
    suite = pooled_suite(scratch / "suite.yaml", [str(scratch)], {"filesystem": 2})
    write = {
        "op": "call",
        "name": "write_file",
        "arguments": {"path": "/workspace/note.txt", "content": "from the pool"},
    }
    with orchestrator(suite, tmp_path / "o.log") as running:
        wait_for_pool(running, "filesystem", 2)
        # The project's owner is who the server must run as: the pool's containers (nobody)
        # do not fit; the first session starts fresh, and the pool turns to that account.
        _write_is_refused(running, project, write)
        assert session_starts(running, "filesystem")[0]["pooled"] is False
        owners = functools.partial(_pool_has_account, running, docker_client, USER)
        wait_until(owners, 120, "a pooled container for the project's owner")
        _write_is_refused(running, project, write)
        wait_for_pool(running, "filesystem", 1)
        wait_until(owners, 120, "a pooled container for the project's owner")
        third = filesystem_client(running, project)
        try:
            written = third.ask(write)
            assert written["ok"], written
        finally:
            third.close()
        note = project / "note.txt"
        assert note.read_text() == "from the pool"
        assert (note.stat().st_uid, note.stat().st_gid) == USER
        pooled = [start["pooled"] for start in session_starts(running, "filesystem")]
        assert pooled == [False, True, True]


def _write_is_refused(running: Orchestrator, project: Path, write: dict[str, Any]) -> None:
    """A session that mounts ``project`` read-only is refused ``write`` (the client shows the
    file system's error) and nothing is written."""
    client = filesystem_client(running, project, ":ro")
    try:
        refused = client.ask(write)
        assert "read-only" in json.dumps(refused).lower(), refused
    finally:
        client.close()
    assert not (project / "note.txt").exists()


def _pool_has_account(
    running: Orchestrator, client: docker.DockerClient, owner: tuple[int, int]
) -> bool:
    """Whether a pooled filesystem container not handed out runs as ``owner``."""
    idle = containers_of(client, instance=running.instance, pooled="true")
    handed = {start["container_name"] for start in session_starts(running, "filesystem")}
    user = f"{owner[0]}:{owner[1]}"
    return any(
        c.attrs["Config"]["User"] == user and c.name not in handed and c.status == "running"
        for c in idle
    )


def test_the_staging_area_is_closed_to_other_users_of_the_host(time_pool: Orchestrator) -> None:
    wait_for_pool(time_pool, "time", 2)
    parent = Path(STAGING_PARENT)
    assert (parent / time_pool.instance).is_dir()
    assert parent.stat().st_uid == 0
    assert parent.stat().st_mode & 0o777 == 0o700
    # Another local user cannot even look, let alone reach a session's directory through it.
    done = subprocess.run(
        ["ls", str(parent / time_pool.instance)],
        user=65534,
        group=65534,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "Permission denied" in done.stderr


def test_an_orchestrator_run_by_a_user_pools_only_sessions_without_mounts_and_says_why_once(
    scratch: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    project = scratch / "project"
    project.mkdir()
    (project / "seen.txt").write_text("fresh")
    give(project, USER)
    suite = pooled_suite(scratch / "suite.yaml", [str(scratch)], {"time": 1, "filesystem": 1})
    home = scratch / "home"
    home.mkdir()
    give(home, USER)
    with orchestrator(suite, tmp_path / "o.log", run_as=USER, env={"HOME": str(home)}) as running:
        wait_for_pool(running, "time", 1)
        wait_for_pool(running, "filesystem", 1)
        timed = python_client(f"{running.ws_url}/mcp/time")
        try:
            assert timed.ask({"op": "initialize"})["ok"]
        finally:
            timed.close()
        for _ in range(2):
            client = filesystem_client(running, project)
            try:
                assert "seen.txt" in listing(client)
            finally:
                client.close()
        assert [s["pooled"] for s in session_starts(running, "time")] == [True]
        assert [s["pooled"] for s in session_starts(running, "filesystem")] == [False, False]
        said = [e for e in running.logs() if e["event"] == "pool_mounts_unavailable"]
        assert [e["reason"] for e in said] == ["not_root"]


def test_pooled_containers_and_mounts_of_a_killed_orchestrator_are_cleaned_by_the_next(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "kept.txt").write_text("still here")
    suite = pooled_suite(tmp_path / "suite.yaml", [str(tmp_path)], {"filesystem": 2})
    with orchestrator(suite, tmp_path / "first.log", expect_clean_exit=False) as first:
        wait_for_pool(first, "filesystem", 2)
        client = filesystem_client(first, project)
        assert "kept.txt" in listing(client)
        instance = first.instance
        # Its staging area is mounted, with the session's project attached in it; the kill
        # leaves it so. (Looked at before the kill: once it is dead, any orchestrator starting
        # on this host, the Podman run's too, may clean its area.)
        area = f"{STAGING_PARENT}/{instance}/"
        assert any(point.startswith(area) for point in staging_mounts(instance))
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        client.close()
    assert len(containers_of(docker_client, instance=instance)) >= 2
    with orchestrator(suite, tmp_path / "second.log") as second:
        wait_until(lambda: not containers_of(docker_client, instance=instance), 60, "the sweep")
        wait_for_pool(second, "filesystem", 2)
        assert not (Path(STAGING_PARENT) / instance).exists()
    assert (project / "kept.txt").read_text() == "still here"  # detached, never deleted
    assert staging_mounts(instance) == []
