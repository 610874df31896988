"""Isolated workspaces with the real Claude Code CLI on the real engine (issue 50): each task of
an ``llm_agent`` works on a copy of the client's project, its changes come back as a branch
named in the answer and audited, tasks at once never see each other's files, ``base`` chains
them, and nothing a task writes reaches the client's checkout or its ``.git``.

The client is the MCP Python SDK 2.x on ``/mcp``; the model is the scripted Messages API
(tests/messages_api.py), which answers each request by what the request says (two CLIs at once
send theirs in any order).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from reactor_fabric.trio.workspaces import default_parent
from tests.integration.harness import (
    Orchestrator,
    git_repo,
    give_to_client,
    orchestrator,
    python2_client,
    wait_until,
)
from tests.integration.test_agent_claude_code_e2e import run_task
from tests.integration.test_agent_specialists_e2e import agent, specialist_suite
from tests.messages_api import Block, Hold, Step, Text, ToolUse, scripted_messages_api

pytestmark = pytest.mark.integration

TARGET = "/projects/app"
AREAS = Path(default_parent())  # (the orchestrators here run as root, as the tests)


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RF_TEST_WORK_KEY", "sk-test-work-account-not-real")
    monkeypatch.setenv("RF_TEST_HOME_KEY", "sk-test-home-account-not-real")


def git(project: Path, *args: str) -> str:
    # (safe.directory: the tests are root, the repository the client's)
    command = ["git", "-c", "safe.directory=*", "-C", str(project), *args]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def repository(tmp_path: Path) -> Path:
    project = git_repo(tmp_path / "projects" / "app", ["the client's commit"])
    (project / "log.txt").write_text("the client's uncommitted edit\n")
    project.chmod(0o755)
    # An ordinary user's, as on a developer's machine: git in the orchestrator runs as them,
    # and they cannot reach the copies.
    return give_to_client(project)


def the_task(request: dict[str, Any]) -> str:
    """The task a request of the CLI is about (its first user message)."""
    return json.dumps(request["messages"][0]["content"])


def answered(request: dict[str, Any]) -> bool:
    """Whether the request carries a tool's result (the model's turn after its call)."""
    last = request["messages"][-1]["content"]
    return isinstance(last, list) and any(block.get("type") == "tool_result" for block in last)


def tool_results(request: dict[str, Any]) -> str:
    return json.dumps(
        [
            block.get("content")
            for message in request["messages"]
            if isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        ]
    )


def copies_left(running: Orchestrator) -> list[str]:
    """The tasks' copies still in the orchestrator's area (not its spare copies: one per
    project is kept after a session, for the next; tests/unit/trio/test_workspaces.py)."""
    area = AREAS / running.instance
    if not area.exists():
        return []
    return sorted(
        p.name for p in area.iterdir() if p.name != "owner.json" and not p.name.startswith("spare-")
    )


def branch_files(project: Path, branch: str) -> list[str]:
    return git(project, "ls-tree", "-r", "--name-only", branch).split()


def client_state(project: Path) -> tuple[str, str, str, str, bytes]:
    """HEAD, the branch checked out, the index, the other refs and the working tree's file."""
    return (
        git(project, "rev-parse", "HEAD"),
        git(project, "symbolic-ref", "HEAD"),
        git(project, "ls-files", "-s"),
        git(project, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/main"),
        (project / "log.txt").read_bytes(),
    )


def test_two_tasks_at_once_get_a_branch_each_and_a_third_starts_from_the_first(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    before = client_state(project)

    def write_by_task(request: dict[str, Any]) -> list[Block]:
        task = the_task(request)
        if answered(request):
            return [Text("done: " + tool_results(request)[:300])]
        if "pipeline step" in task:
            return [ToolUse("Read", {"file_path": f"{TARGET}/same.txt"})]
        word = "alpha" if "write alpha" in task else "beta"
        return [ToolUse("Write", {"file_path": f"{TARGET}/same.txt", "content": f"{word}\n"})]

    with scripted_messages_api([write_by_task] * 6) as api:
        suite = specialist_suite(
            tmp_path, {"writer": agent(api.url, "work", "You write.", workspace="isolated")}
        )
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            client = python2_client(f"{running.http_url}/mcp?mount={project}:{TARGET}")
            try:
                assert client.ask({"op": "initialize"})["ok"]
                both = client.ask(
                    {
                        "op": "call_many",
                        "calls": [
                            {"name": "writer__run_task", "arguments": {"task": f"write {w}"}}
                            for w in ("alpha", "beta")
                        ],
                    },
                    timeout=300,
                )
            finally:
                client.close()
            assert both["ok"], both
            alpha, beta = (result["structured"]["workspace"] for result in both["results"])
            assert alpha["branch"] != beta["branch"], both
            for workspace in (alpha, beta):
                assert workspace["mode"] == "isolated"
                assert workspace["base"] == before[0]
                assert workspace["branch"].startswith("reactor-fabric/writer/")
                assert workspace["commit"] == git(project, "rev-parse", workspace["branch"])
                assert (workspace["files_changed"], workspace["insertions"]) == (1, 1)
            assert git(project, "show", f"{alpha['branch']}:same.txt") == "alpha"
            assert git(project, "show", f"{beta['branch']}:same.txt") == "beta"
            # The client's uncommitted edit is the branch's first commit, the task's the next.
            assert git(project, "show", f"{alpha['branch']}~1:log.txt") == (
                "the client's uncommitted edit"
            )
            text = json.dumps(both["results"][0]["content"])
            assert f"on branch {alpha['branch']}" in text
            # A pipeline: the next specialist starts from the first one's branch.
            answer, _ = run_task(
                running,
                project,
                {"task": "pipeline step: read same.txt", "base": alpha["branch"]},
                "writer__run_task",
            )
            assert answer["ok"], answer
            assert "alpha" in json.dumps(answer["content"])
            assert answer["structured"]["workspace"]["base"] == alpha["commit"]
            assert answer["structured"]["workspace"]["commit"] is None  # it changed nothing
            wait_until(lambda: copies_left(running) == [], what="the copies removed")
            wait_until(
                lambda: len([r for r in running.audit() if r["event"] == "workspace"]) == 3,
                what="the three tasks' workspace records",
            )
            trail = running.audit()
    assert api.refusals == [], api.refusals
    assert client_state(project) == before
    assert not (project / "same.txt").exists()
    records = [r for r in trail if r["event"] == "workspace"]
    assert sorted(r["branch"] or "" for r in records) == sorted(
        ["", alpha["branch"], beta["branch"]]
    )
    for record in records:
        assert record["service"] == "writer"
        assert record["error"] if "error" in record else record["base"]
    [alpha_record] = [r for r in records if r["branch"] == alpha["branch"]]
    assert alpha_record["files_changed"] == 1
    assert len(alpha_record["diff_sha256"]) == 64


def test_a_task_cannot_plant_git_hooks_or_config_and_its_filesystem_writes_land_on_its_branch(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    before = client_state(project)
    hooks_before = sorted(os.listdir(project / ".git" / "hooks"))
    config_before = (project / ".git" / "config").read_bytes()
    planted = "#!/bin/sh\ntouch /tmp/planted-by-agent\n"
    script: list[Step] = [
        [ToolUse("Write", {"file_path": f"{TARGET}/.git/hooks/post-checkout", "content": planted})],
        [ToolUse("Write", {"file_path": f"{TARGET}/.git/config", "content": "[core]\n"})],
        [
            ToolUse(
                "mcp__fabric__filesystem__write_file",
                {"path": f"{TARGET}/.git/hooks/pre-commit", "content": planted},
            )
        ],
        [
            ToolUse(
                "mcp__fabric__filesystem__write_file",
                {"path": f"{TARGET}/review.txt", "content": "reviewed\n"},
            )
        ],
        [Text("done")],
    ]
    with scripted_messages_api(script) as api:
        suite = specialist_suite(
            tmp_path,
            {
                # danger_mode: Claude Code's own check of "sensitive files" (.git) is off, so
                # its Write reaches the file system (the copy's), as a shell's would.
                "reviewer": agent(
                    api.url,
                    "work",
                    "You review.",
                    uses=["filesystem"],
                    workspace="isolated",
                    config={"danger_mode": True},
                )
            },
        )
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            answer, _ = run_task(running, project, {"task": "Review."}, "reviewer__run_task")
            wait_until(lambda: copies_left(running) == [], what="the copy removed")
    assert api.refusals == [], api.refusals
    # The writes under .git reached the copy (nothing refused them there), and went no further.
    results = json.dumps(list(api.tool_results().values()))
    assert "sensitive file" not in results, results
    workspace = answer["structured"]["workspace"]
    # The file written through the filesystem service (in the task's child session) is on
    # the task's branch, not in the client's checkout; nothing under .git is anywhere.
    assert branch_files(project, workspace["branch"]) == ["log.txt", "review.txt"]
    assert git(project, "show", f"{workspace['branch']}:review.txt") == "reviewed"
    assert not (project / "review.txt").exists()
    assert sorted(os.listdir(project / ".git" / "hooks")) == hooks_before
    assert (project / ".git" / "config").read_bytes() == config_before
    assert client_state(project) == before
    assert not Path("/tmp/planted-by-agent").exists()


def test_a_project_that_is_not_a_repository_is_refused_and_nothing_starts(
    tmp_path: Path,
) -> None:
    project = tmp_path / "projects" / "app"
    project.mkdir(parents=True)
    (project / "notes.txt").write_text("notes\n")
    with scripted_messages_api([[Text("never")]]) as api:
        suite = specialist_suite(
            tmp_path, {"writer": agent(api.url, "work", "You write.", workspace="isolated")}
        )
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            answer, _ = run_task(running, project, {"task": "Write."}, "writer__run_task")
            assert copies_left(running) == []
    assert answer["ok"] is False
    error = answer["error"]
    assert error["code"] == -32002, answer
    assert error["data"]["reason"] == "workspace_not_a_repository"
    assert "git init" in error["message"]
    assert api.messages_requests() == []
    assert sorted(os.listdir(project)) == ["notes.txt"]


def test_a_cancelled_task_leaves_a_branch_only_if_it_changed_something_and_no_copy(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    before = client_state(project)
    never = threading.Event()
    script: list[Step] = [
        [ToolUse("Write", {"file_path": f"{TARGET}/half.txt", "content": "half done\n"})],
        Hold(never, [Text("too late")]),
        Hold(never, [Text("too late")]),  # the second task: cancelled before any change
    ]
    with scripted_messages_api(script) as api:
        suite = specialist_suite(
            tmp_path, {"writer": agent(api.url, "work", "You write.", workspace="isolated")}
        )
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            for expected_requests in (2, 3):
                client = python2_client(f"{running.http_url}/mcp?mount={project}:{TARGET}")
                try:
                    assert client.ask({"op": "initialize"})["ok"]
                    call = {"name": "writer__run_task", "arguments": {"task": "Write."}}
                    assert client.ask({"op": "start", **call})["ok"]
                    asked = expected_requests
                    wait_until(
                        lambda: len(api.messages_requests()) >= asked,  # noqa: B023
                        what="the model asked for its next turn",
                    )
                    assert client.ask({"op": "cancel"}, timeout=120)["cancelled"]
                finally:
                    client.close()
            wait_until(
                lambda: len([r for r in running.audit() if r["event"] == "workspace"]) == 2,
                what="both tasks' workspace records",
            )
            assert copies_left(running) == []
            records = [r for r in running.audit() if r["event"] == "workspace"]
    never.set()
    changed, unchanged = records
    assert changed["branch"].startswith("reactor-fabric/writer/")
    assert git(project, "show", f"{changed['branch']}:half.txt") == "half done"
    assert (unchanged["branch"], unchanged["commit"]) == (None, None)
    assert git(project, "branch", "--list", "reactor-fabric/*").split() == [changed["branch"]]
    assert client_state(project) == before


def test_a_shared_agent_cannot_plant_git_hooks_with_its_own_tools_either(tmp_path: Path) -> None:
    project = repository(tmp_path)
    project.chmod(0o777)  # (shared: the agent writes the project itself, as its account)
    hooks_before = sorted(os.listdir(project / ".git" / "hooks"))
    config_before = (project / ".git" / "config").read_bytes()
    planted = "#!/bin/sh\ntouch /tmp/planted-by-shared-agent\n"
    script: list[Step] = [
        [ToolUse("Write", {"file_path": f"{TARGET}/.git/hooks/post-checkout", "content": planted})],
        [ToolUse("Write", {"file_path": f"{TARGET}/.git/config", "content": "[core]\n"})],
        [ToolUse("Write", {"file_path": f"{TARGET}/notes.txt", "content": "shared edit\n"})],
        [Text("done")],
    ]
    with scripted_messages_api(script) as api:
        # danger_mode: Claude Code's own check of "sensitive files" (.git) is off: the write
        # reaches the file system, and the read-only .git is what stops it.
        pair = agent(api.url, "work", "You pair.", config={"danger_mode": True})
        suite = specialist_suite(tmp_path, {"pair": pair})
        with orchestrator(suite, tmp_path / "orchestrator.log") as running:
            answer, _ = run_task(running, project, {"task": "Pair."}, "pair__run_task")
            assert copies_left(running) == []
    assert api.refusals == [], api.refusals
    assert answer["ok"], answer
    assert (answer["structured"] or {}).get("workspace") is None  # shared: no copy, no branch
    # The CLI's writes under .git failed (read-only: EROFS, or EACCES under gVisor, the agent's
    # isolation where the engine has it), the one in the project itself did not.
    results = json.dumps(list(api.tool_results().values()))
    refusals = ("read-only file system", "erofs", "eacces: permission denied, open")
    assert any(refusal in results.lower() for refusal in refusals), results
    assert ".git/hooks/post-checkout" in results, results
    assert sorted(os.listdir(project / ".git" / "hooks")) == hooks_before
    assert (project / ".git" / "config").read_bytes() == config_before
    assert (project / "notes.txt").read_text() == "shared edit\n"
    assert not Path("/tmp/planted-by-shared-agent").exists()
