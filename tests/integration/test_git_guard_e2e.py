"""No container writes the client's ``.git`` (issue 48, item 2), on the real engine with the real
servers and, for agents, the real Claude Code CLI against the scripted Messages API.

The attack: a hook (``.git/hooks/post-checkout``), a config key or an attributes filter written
into the mounted project's ``.git`` runs on the host, as the user, the next time they use git:
an escape from the container. The client's repository is opened to every uid here (so that only
the read-only mount stands in the way, whoever the server runs as), and after each attack its
``.git`` must be byte for byte what it was — while the rest of the project stays writable.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from reactor_fabric.runtime import host_mounts
from tests.integration.harness import (
    Orchestrator,
    git_repo,
    orchestrator,
    python2_client,
    text_of,
    wait_until,
    write_suite,
)
from tests.integration.test_agent_claude_code_e2e import (
    KEY,
    KEY_VARIABLE,
    agent_suite,
    run_task,
    tool_result_text,
)
from tests.integration.test_agent_specialists_e2e import agent, keys, specialist_suite
from tests.integration.test_warm_pool_e2e import wait_for_pool
from tests.messages_api import Step, Text, ToolUse, scripted_messages_api

pytestmark = pytest.mark.integration

__all__ = ["keys"]  # a fixture, used by name

TARGET = "/projects/app"
HOOK = "#!/bin/sh\ntouch /tmp/planted-by-a-container\n"
# What a planted .git would make the user's git run: a hook, fsmonitor, a filter driver.
PLANTS = {
    ".git/hooks/post-checkout": HOOK,
    ".git/config": "[core]\n\tfsmonitor = touch /tmp/planted-by-a-container\n",
    ".git/info/attributes": "* filter=planted\n",
}


def open_repository(path: Path) -> Path:
    """The client's repository, writable by every uid (files and directories alike)."""
    repo = git_repo(path, ["the client's own commit"])
    (repo / ".git" / "info").mkdir(exist_ok=True)
    for directory, subdirectories, files in os.walk(repo):
        os.chmod(directory, 0o777)
        for name in (*subdirectories, *files):
            target = Path(directory) / name
            if not target.is_symlink():
                target.chmod(0o777 if target.is_dir() else 0o666)
    return repo


def snapshot(git_dir: Path) -> dict[str, str]:
    """Every entry below ``git_dir``: a file's content hash, a directory's or link's kind."""
    found: dict[str, str] = {}
    for path in sorted(git_dir.rglob("*")):
        relative = str(path.relative_to(git_dir))
        if path.is_symlink():
            found[relative] = f"link:{os.readlink(path)}"
        elif path.is_dir():
            found[relative] = "dir"
        else:
            found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


# --- agents --------------------------------------------------------------------------------


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    return KEY


def test_a_danger_mode_agents_shell_cannot_plant_anything_in_the_clients_git(
    tmp_path: Path, key: str
) -> None:
    repo = open_repository(tmp_path / "projects" / "app")
    before = snapshot(repo / ".git")
    writes = "; ".join(
        f"(printf %s {json.dumps(text)} >> {TARGET}/{name}) 2>/dev/null "
        f"&& echo WROTE {name} || echo REFUSED {name}"
        for name, text in PLANTS.items()
    )
    command = (
        f"{writes}; "
        f"(mv {TARGET}/.git {TARGET}/.git-aside) 2>/dev/null && echo WROTE rename "
        f"|| echo REFUSED rename; "
        f"(rm -rf {TARGET}/.git/hooks) 2>/dev/null; "
        f"test -d {TARGET}/.git/hooks && echo KEPT hooks; "
        f"echo reviewed > {TARGET}/review.txt && echo WROTE review.txt"
    )
    script: list[Step] = [
        [ToolUse("Bash", {"command": command, "description": "plant a hook"})],
        [Text("done")],
    ]
    with scripted_messages_api(script) as api:
        suite = agent_suite(tmp_path, api.url, {"danger_mode": True})
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            answer, _progress = run_task(running, repo, {"task": "Tidy the repository."})
        results = tool_result_text(api)

    assert api.refusals == [], api.refusals
    assert answer["ok"], answer
    # Every write into .git was refused inside the container; the project itself is writable.
    for name in PLANTS:
        assert f"REFUSED {name}" in results, results
        assert f"WROTE {name}" not in results, results
    assert "REFUSED rename" in results, results
    assert "KEPT hooks" in results, results
    assert "WROTE review.txt" in results, results
    assert (repo / "review.txt").read_text() == "reviewed\n"
    # And the client's repository is what it was.
    assert snapshot(repo / ".git") == before
    assert not (repo / ".git-aside").exists()


def test_a_safe_mode_agent_cannot_write_the_clients_git_through_the_services_it_uses(
    tmp_path: Path, keys: dict[str, str], docker_client: docker.DockerClient
) -> None:
    # Safe mode has no shell, but it uses the suite: filesystem's write_file is one of the
    # tools it is allowed by name, and git (which may write Git for a client) commits. In the
    # agent's child session neither may write the client's .git.
    repo = open_repository(tmp_path / "projects" / "app")
    (repo / "log.txt").write_text("changed by the agent\n")
    before = snapshot(repo / ".git")
    # (At /workspace: the filesystem server's own root before it learns the session's roots,
    # which it asks for just after its start; a first call elsewhere may come before them.)
    target = "/workspace"
    script: list[Step] = [[ToolUse("mcp__fabric__filesystem__list_allowed_directories", {})]]
    script += [
        [
            ToolUse(
                "mcp__fabric__filesystem__write_file",
                {"path": f"{target}/{name}", "content": text},
            )
        ]
        for name, text in PLANTS.items()
    ]
    script += [
        [ToolUse("mcp__fabric__git__git_add", {"repo_path": target, "files": ["log.txt"]})],
        [ToolUse("mcp__fabric__git__git_commit", {"repo_path": target, "message": "planted"})],
        [
            ToolUse(
                "mcp__fabric__filesystem__write_file",
                {"path": f"{target}/review.txt", "content": "reviewed"},
            )
        ],
        [Text("done")],
    ]
    with scripted_messages_api(script) as api:
        suite = specialist_suite(
            tmp_path,
            {"reviewer": agent(api.url, "work", "You review.", uses=["filesystem", "git"])},
        )
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            answer, _progress = run_task(
                running, repo, {"task": "Review."}, "reviewer__run_task", target
            )
            wait_until(
                lambda: (
                    not docker_client.containers.list(
                        all=True, filters={"label": f"reactor-fabric.instance={running.instance}"}
                    )
                ),
                what="the agent's and its child's containers removed",
            )
        results = list(api.tool_results().values())

    assert api.refusals == [], api.refusals
    assert answer["ok"], answer
    assert len(results) == len(PLANTS) + 4, results
    assert target in json.dumps(results[0]), results[0]
    plants, (add, _commit, review) = results[1 : 1 + len(PLANTS)], results[1 + len(PLANTS) :]
    # The three plants and git's writes failed; the edit of the project went through.
    for result in plants:
        assert "read-only file system" in json.dumps(result).lower(), result
    assert "index.lock': Read-only file system" in json.dumps(add), add
    assert "Successfully wrote" in json.dumps(review), review
    assert (repo / "review.txt").read_text() == "reviewed"
    assert snapshot(repo / ".git") == before


# --- a client's own session, fresh and pooled -----------------------------------------------


def host_mount_points() -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return {line.split(" ")[4] for line in table}


def call(running: Orchestrator, repo: Path, name: str, arguments: dict[str, Any]) -> Any:
    """One call in a session of its own; the host's mount table is looked at while the
    session's container still runs."""
    client = python2_client(f"{running.http_url}/mcp?mount={repo}:/workspace")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        answer = client.ask({"op": "call", "name": name, "arguments": arguments}, timeout=120)
        # The guard is the container's alone: nothing is mounted over the user's own .git on
        # the host (a copy of a shared mount is its source's peer).
        assert str(repo / ".git") not in host_mount_points()
        return answer
    finally:
        assert client.close() == 0


@pytest.fixture
def shared_projects(tmp_path: Path) -> Iterator[Path]:
    """The projects' directory as a shared mount, as everything is on a systemd host (``/`` is
    shared there): a copy of such a mount is its peer, so what is mounted onto the copy would
    propagate back to the user's own tree unless the copy is made private first."""
    projects = tmp_path / "projects"
    projects.mkdir()
    host_mounts.make_shared_mount(str(projects))
    try:
        yield projects
    finally:
        for point in host_mounts.mount_points_below(str(projects)):
            host_mounts.detach(point)


@pytest.mark.parametrize("warm", [0, 1], ids=["fresh", "pooled"])
def test_a_service_not_allowed_git_cannot_write_it_and_git_itself_still_commits(
    tmp_path: Path, shared_projects: Path, warm: int
) -> None:
    repo = open_repository(shared_projects / "app")
    before = snapshot(repo / ".git")
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(tmp_path / "projects")],
        service_fields={"filesystem": {"warm": warm}} if warm else None,
    )
    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        for name, text in PLANTS.items():
            if warm:
                wait_for_pool(running, "filesystem", 1)
            answer = call(
                running,
                repo,
                "filesystem__write_file",
                {"path": f"/workspace/{name}", "content": text},
            )
            assert "read-only file system" in text_of(answer).lower(), answer
        if warm:
            wait_for_pool(running, "filesystem", 1)
        written = call(
            running,
            repo,
            "filesystem__write_file",
            {"path": "/workspace/notes.txt", "content": "a note"},
        )
        assert "rror" not in text_of(written), written
        assert snapshot(repo / ".git") == before
        # The git service may write Git (its suite entry says so): a client's commit works.
        (repo / "log.txt").write_text("second\n")
        commit: list[tuple[str, dict[str, Any]]] = [
            ("git__git_add", {"repo_path": "/workspace", "files": ["log.txt"]}),
            ("git__git_commit", {"repo_path": "/workspace", "message": "second"}),
        ]
        for name, arguments in commit:
            answer = call(running, repo, name, arguments)
            assert "rror" not in text_of(answer), answer
        starts = [
            r
            for r in running.audit()
            if r["event"] == "container_start" and r["service"] == "filesystem"
        ]
    assert snapshot(repo / ".git") != before  # the commit
    assert (repo / "notes.txt").read_text() == "a note"
    # Each way in was taken: a fresh container, or the pool's (guarded in its staging area).
    assert {bool(r.get("pooled")) for r in starts} == {bool(warm)}, starts
