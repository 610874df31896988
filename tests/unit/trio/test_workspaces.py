"""Isolated calls on the fabric endpoint end to end on the in-memory runtime and real git: the
container works on a copy, its changes come back as a branch named in the answer, the client's
checkout is untouched, and the copy is gone after."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import posixpath
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import outcome
import pytest
import trio

from reactor_fabric.config.structs import Service, Workspaces
from reactor_fabric.observe.observer import Observer
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.pinning import pin_mounts
from reactor_fabric.runtime.memory import MemoryServer
from reactor_fabric.trio.background_thread import BackgroundThread
from reactor_fabric.trio.spares import (
    SESSION_SPARE_DELAY_SECONDS,
    SpareRecipe,
    Spares,
    SpareSlot,
)
from reactor_fabric.trio.workspaces import (
    TaskWorkspaces,
    close_workspaces,
    open_workspaces,
    own_directory,
)
from reactor_fabric.workspace import Begun, TaskFacts
from reactor_fabric.workspace.spare import Spare, make_spare
from tests.fakes import _answer
from tests.http_client import WebSocketClient
from tests.messages import INITIALIZE, INITIALIZED, request
from tests.served import Served, served

AGENT = {"agent": Service(image="fake/agent:1", service_type="llm_agent")}
WRITE_TOOL = {
    "name": "write",
    "description": "write a file in the project",
    "inputSchema": {"type": "object"},
}


async def writing_server(container: MemoryServer) -> None:
    """A server whose one tool writes a file into its mount's source (as a container writing
    its /workspace would), after ``wait`` seconds; a call it is told is cancelled stops there
    and is not answered (as the MCP specification asks)."""
    scopes: dict[Any, trio.CancelScope] = {}

    async def handle(message: dict[str, Any]) -> None:
        with scopes.setdefault(message["id"], trio.CancelScope()):
            await _handle(container, message)

    async with trio.open_nursery() as nursery:
        while (line := await container.read_line()) is not None:
            message = json.loads(line)
            if message.get("method") == "notifications/cancelled":
                scopes.setdefault(message["params"]["requestId"], trio.CancelScope()).cancel()
            if "id" not in message or "method" not in message:
                continue
            nursery.start_soon(handle, message)
        nursery.cancel_scope.cancel()


async def _handle(container: MemoryServer, message: dict[str, Any]) -> None:
    method, request_id = message["method"], message["id"]
    if method == "initialize":
        result = {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "writer", "version": "1"},
        }
        await _answer(container, request_id, result)
    elif method == "tools/list":
        await _answer(container, request_id, {"tools": [WRITE_TOOL]})
    elif method == "tools/call":
        arguments = message["params"]["arguments"]
        await trio.sleep(arguments.get("wait", 0))
        if "wait_for_object" in arguments:  # (in a repository: until it is there, at most 10 s)
            repository, oid = arguments["wait_for_object"]
            with trio.move_on_after(10):
                for _ in itertools.count():  # (polled: git says nothing when it is written)
                    if await _has_object(repository, oid):
                        break
                    await trio.sleep(0.01)
        [mount] = [m for m in container.spec.mounts if m.target == "/workspace"]
        target = Path(mount.source) / arguments["path"]
        target.write_text(arguments["text"])
        text = f"wrote {arguments['path']} in {mount.source}"
        if "base" in arguments:
            text += f" (my own base argument: {arguments['base']})"
        await _answer(container, request_id, {"content": [{"type": "text", "text": text}]})
    else:
        await _answer(container, request_id, {})


async def _has_object(repository: str, oid: str) -> bool:
    done = await trio.run_process(
        ["git", "-C", repository, "cat-file", "-e", oid], check=False, capture_stderr=True
    )
    return done.returncode == 0


def git(project: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(project), *args], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def repository(root: Path) -> Path:
    project = root / "project"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    git(project, "config", "user.email", "t@example.com")
    git(project, "config", "user.name", "T")
    (project / "README.md").write_text("hello\n")
    git(project, "add", "README.md")
    git(project, "commit", "-q", "-m", "first")
    return project


@asynccontextmanager
async def isolated_served(
    root: Path,
    services: dict[str, Service] | None = None,
    *,
    bounds: Workspaces | None = None,
    server: Callable[[MemoryServer], Awaitable[None]] = writing_server,
    session_spare_delay: float = 0.0,
) -> AsyncIterator[Served]:
    async with served(root, learn_catalog=True, services=services or AGENT, server=server) as http:
        owner = {"reactor-fabric.owner-host": "test"}
        workspaces = await open_workspaces(
            "i1",
            owner,
            bounds or http.fabric.suite.orchestrator.workspaces,
            http.fabric.observer,
            parent=str(root / "areas"),
        )
        assert workspaces is not None
        # (a session's spare is begun at once: the tests ask for what they need when)
        workspaces.spares.session_delay = session_spare_delay
        http.fabric.starter.workspaces = workspaces
        try:
            yield http
        finally:
            assert workspaces.helper is not None
            await trio.to_thread.run_sync(workspaces.helper.close)  # (its process)


async def session(http: Served, project: Path) -> WebSocketClient:
    ws, _ = await http.websocket(f"/mcp?tools=all&mount={project}:/workspace")
    await ws.send_json(INITIALIZE)
    await ws.hear()
    await ws.send_json(INITIALIZED)
    return ws


def write(request_id: int, path: str, text: str, **more: Any) -> dict[str, Any]:
    arguments = {"path": path, "text": text, **more}
    return request(request_id, "tools/call", {"name": "agent__write", "arguments": arguments})


def open_descriptors() -> list[str]:
    """This process's open descriptors: what each is (a socket's number left out: the copy
    helper's is a new one after it was killed and started again)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # (listdir's own, closed)
            target = os.readlink(f"/proc/self/fd/{fd}")
            found.append("socket" if target.startswith("socket:") else f"{fd} {target}")
    return sorted(found)


def copies(root: Path) -> list[str]:
    return [
        str(path.relative_to(root / "areas"))
        for path in (root / "areas").glob("*/*")
        if path.name != "owner.json"
    ]


async def sessions_over(http: Served) -> None:
    with trio.fail_after(10):
        while http.fabric.registry.sessions:
            await http.fabric.registry.changed.wait()


async def no_copies_left(http: Served, root: Path) -> None:
    """Once the sessions are over (a session's end, shortly after its client left, keeps its
    spare copy when it was made, else removes it): no copy is left in the area but the
    spares kept for the next session, at most one per project."""
    await sessions_over(http)
    workspaces = http.fabric.starter.workspaces
    assert workspaces is not None
    kept = [spare.directory for spare in workspaces.spares.kept()]
    assert sorted(copies(root)) == sorted(f"i1/{posixpath.basename(k)}" for k in kept)


def making(slot: SpareSlot) -> BackgroundThread[Spare]:
    """The thread making ``slot``'s spare (one made for its session, not a kept one)."""
    assert slot.making is not None
    return slot.making


async def spare_made(http: Served) -> str:
    """The one spare copy, once it is made: its directory."""
    workspaces = http.fabric.starter.workspaces
    assert workspaces is not None
    [slot] = workspaces.spares.slots()
    with trio.fail_after(10):
        await making(slot).result()
    return slot.directory


def spared(caplog: pytest.LogCaptureFixture) -> list[bool]:
    """Whether each isolated container so far started on a spare copy."""
    return [
        record.workspace_spare
        for record in caplog.records
        if record.msg == "container_started" and hasattr(record, "workspace_spare")
    ]


async def test_an_agents_call_works_on_a_copy_and_its_changes_become_a_branch_named_in_the_answer(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    (project / "README.md").write_text("hello, uncommitted\n")  # the client's own edit
    head = git(project, "rev-parse", "HEAD")
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "notes.txt", "from the agent\n", task="write the notes"))
        answer = await ws.hear()
        workspace = answer["result"]["structuredContent"]["workspace"]
        branch = workspace["branch"]
        assert branch.startswith("reactor-fabric/agent/")
        assert (workspace["mode"], workspace["base"]) == ("isolated", head)
        assert (workspace["files_changed"], workspace["insertions"]) == (1, 1)
        assert workspace["commit"] == git(project, "rev-parse", branch)
        assert answer["result"]["content"][-1]["text"].startswith(
            f"Workspace: the task's changes are on branch {branch} (commit"
        )
        # The container wrote into its copy, not into the project.
        assert str(project) not in answer["result"]["content"][0]["text"]
        assert not (project / "notes.txt").exists()
        # The branch: the client's uncommitted state, then the task's change.
        assert git(project, "show", f"{branch}:notes.txt") == "from the agent"
        assert git(project, "show", f"{branch}~1:README.md") == "hello, uncommitted"
        assert git(project, "log", "-1", "--format=%s", branch) == "agent: write the notes"
        # Nothing else of the client's repository moved.
        assert git(project, "rev-parse", "HEAD") == head
        assert git(project, "symbolic-ref", "HEAD") == "refs/heads/main"
        assert git(project, "status", "--porcelain") == "M README.md"
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_task_that_rewrites_the_client_s_uncommitted_file_at_once_keeps_it_on_its_branch(
    tmp_path: Path,
) -> None:
    # The start does not wait for the uncommitted blobs to be written into the repository:
    # they are held from the copy's making, whatever the server does to the copy meanwhile.
    project = repository(tmp_path)
    (project / "README.md").write_text("hello, uncommitted\n")
    (project / "draft.txt").write_text("the client's untracked draft\n")
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "README.md", "the agent's\n"))
        await ws.send_json(write(3, "draft.txt", "the agent's draft\n"))
        answers = {a["id"]: a for a in [await ws.hear(), await ws.hear()]}
        for request_id, path in ((2, "README.md"), (3, "draft.txt")):
            branch = answers[request_id]["result"]["structuredContent"]["workspace"]["branch"]
            assert git(project, "show", f"{branch}:{path}").startswith("the agent's")
            assert git(project, "show", f"{branch}~1:README.md") == "hello, uncommitted"
            assert git(project, "show", f"{branch}~1:draft.txt") == "the client's untracked draft"
        assert (project / "README.md").read_text() == "hello, uncommitted\n"
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_the_uncommitted_blobs_are_written_while_the_task_runs_not_at_its_end(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    (project / "README.md").write_text("hello, uncommitted\n")
    uncommitted = git(project, "hash-object", "README.md")
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        # The tool answers once the client's uncommitted blob is in the repository (or after
        # ten seconds): the settling runs beside the server, the recording only after it.
        waiting = {"wait_for_object": [str(project), uncommitted]}
        await ws.send_json(write(2, "notes.txt", "x\n", **waiting))
        with trio.fail_after(8):
            answer = await ws.hear()
        branch = answer["result"]["structuredContent"]["workspace"]["branch"]
        assert git(project, "show", f"{branch}~1:README.md") == "hello, uncommitted"
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_two_calls_at_once_writing_one_file_each_get_their_own_branch(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "same.txt", "first\n", wait=0.2))
        await ws.send_json(write(3, "same.txt", "second\n"))
        answers = {a["id"]: a for a in [await ws.hear(), await ws.hear()]}
        branches = {
            i: answers[i]["result"]["structuredContent"]["workspace"]["branch"] for i in (2, 3)
        }
        assert branches[2] != branches[3]
        assert git(project, "show", f"{branches[2]}:same.txt") == "first"
        assert git(project, "show", f"{branches[3]}:same.txt") == "second"
        assert not (project / "same.txt").exists()
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_task_on_a_base_starts_from_that_branch(tmp_path: Path) -> None:
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "step1.txt", "one\n"))
        first = (await ws.hear())["result"]["structuredContent"]["workspace"]
        await ws.send_json(write(3, "step2.txt", "two\n", base=first["branch"]))
        second = (await ws.hear())["result"]["structuredContent"]["workspace"]
        assert second["base"] == first["commit"]
        tree = git(project, "ls-tree", "--name-only", second["branch"]).split()
        assert tree == ["README.md", "step1.txt", "step2.txt"]
        await ws.send_json(write(4, "x.txt", "x\n", base="no-such-branch"))
        refused = await ws.hear()
        assert refused["error"]["code"] == -32002
        assert refused["error"]["data"]["reason"] == "workspace_base_unknown"
        await ws.send_json(write(5, "x.txt", "x\n", base="--upload-pack=touch /tmp/pwned"))
        refused = await ws.hear()
        assert refused["error"]["data"]["reason"] == "workspace_base_unknown"
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_project_that_is_not_a_repository_is_refused_with_its_reason(
    tmp_path: Path,
) -> None:
    project = tmp_path / "plain"
    project.mkdir()
    (project / "a.txt").write_text("a\n")
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "b.txt", "b\n"))
        refused = await ws.hear()
        assert refused["error"]["code"] == -32002
        assert refused["error"]["data"]["reason"] == "workspace_not_a_repository"
        assert http.runtime.spawned == []
        assert os.listdir(project) == ["a.txt"]
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_task_that_changes_nothing_makes_no_branch(tmp_path: Path) -> None:
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "README.md", "hello\n"))
        workspace = (await ws.hear())["result"]["structuredContent"]["workspace"]
        assert (workspace["branch"], workspace["commit"]) == (None, None)
        assert git(project, "branch", "--list", "reactor-fabric/*") == ""
        await ws.aclose()


async def relay_session(http: Served, project: Path) -> WebSocketClient:
    ws, _ = await http.websocket(f"/mcp/agent?mount={project}:/workspace")
    await ws.send_json(INITIALIZE)
    await ws.hear()
    await ws.send_json(INITIALIZED)
    return ws


def relayed_write(request_id: int, path: str, text: str, **more: Any) -> dict[str, Any]:
    arguments = {"path": path, "text": text, **more}
    return request(request_id, "tools/call", {"name": "write", "arguments": arguments})


async def test_on_the_relay_each_calls_container_works_on_a_copy_and_the_answer_names_its_branch(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    head = git(project, "rev-parse", "HEAD")
    async with isolated_served(tmp_path) as http:
        ws = await relay_session(http, project)
        branches = []
        for request_id, text in ((2, "one\n"), (3, "two\n")):
            await ws.send_json(relayed_write(request_id, "out.txt", text, task=f"write {text}"))
            answer = await ws.hear()
            assert answer["id"] == request_id
            workspace = answer["result"]["structuredContent"]["workspace"]
            assert workspace["base"] == head
            branches.append(workspace["branch"])
            assert git(project, "show", f"{workspace['branch']}:out.txt") == text.strip()
        assert branches[0] != branches[1]
        assert not (project / "out.txt").exists()
        assert len(http.runtime.spawned) == 2  # a container (and a copy) per call
        await ws.send_json(relayed_write(4, "x.txt", "x\n", base=branches[0]))
        refused = await ws.hear()
        assert refused["error"]["code"] == -32002
        assert refused["error"]["data"]["reason"] == "workspace_failed"
        assert "honoured on /mcp" in refused["error"]["message"]
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_the_container_is_made_while_its_copy_fills_and_its_server_starts_on_the_whole_copy(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    for index in range(400):
        (project / f"f{index}.txt").write_text(f"{index}\n")  # untracked: copied too
    seen_at_start: list[int] = []

    async def counting_server(container: MemoryServer) -> None:
        # Its first instruction: what the copy holds (the catalog's container has none).
        seen_at_start.extend(
            sum(len(files) for _, _, files in os.walk(m.source))
            for m in container.spec.mounts
            if m.target == "/workspace"
        )
        await writing_server(container)

    async with isolated_served(tmp_path, server=counting_server) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "notes.txt", "x\n"))
        answer = await ws.hear()
        assert answer["result"]["structuredContent"]["workspace"]["files_changed"] == 1
        # The start waited at its gate (the runtime held the server), which opened once the
        # copy was whole: 400 files and the README.
        assert http.runtime.held == [http.runtime.spawned[0].name]
        assert seen_at_start == [401]
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_copy_that_fails_while_its_container_is_made_is_answered_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    for index in range(40):
        (project / f"f{index}.txt").write_text(f"{index}\n")
    async with isolated_served(tmp_path, bounds=Workspaces(max_files=20)) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "notes.txt", "x\n"))
        refused = await ws.hear()
        assert refused["error"]["code"] == -32002
        assert refused["error"]["data"]["reason"] == "workspace_too_large"
        assert "max_files" in refused["error"]["message"]
        # Made and held, never run, removed.
        assert len(http.runtime.held) == 1
        assert all(s.removed for s in http.runtime.servers.values())  # (the catalog's too)
        # The task's copy is gone at once; the session's spare (begun at its start, over the
        # bound too, told to stop by the task) is removed by its own thread or the session's end.
        assert [c for c in copies(tmp_path) if not c.startswith("i1/spare-")] == []
        assert git(project, "branch", "--list", "reactor-fabric/*") == ""
        await ws.aclose()
        await no_copies_left(http, tmp_path)
        assert copies(tmp_path) == []


async def test_a_start_cancelled_while_its_copy_is_made_leaves_no_copy_and_no_descriptor(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    for index in range(3000):
        (project / f"f{index}.txt").write_text(f"{index}\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "many")
    owner = {"reactor-fabric.owner-host": "test"}
    workspaces = await open_workspaces(
        "i1", owner, Workspaces(), Observer(), parent=str(tmp_path / "areas")
    )
    assert workspaces is not None
    facts = TaskFacts(service="agent", task="t", session="s", call="1", trace="-")
    mount = MountSpec(str(project), "/workspace")
    descriptors = open_descriptors()
    outcomes = []
    for delay in (0.0, 0.005, 0.02, 0.05, 10.0):
        pins = pin_mounts([mount])
        with trio.move_on_after(delay) as scope:
            handed, _mounts, copy = await workspaces.make(
                f"c{delay}", pins, (mount,), base=None, facts=facts, call=1, account=(0, 0)
            )
        if not scope.cancelled_caught:  # (made before the cancellation: ours to discard)
            handed.close()
            await workspaces.discard(copy)
        outcomes.append(scope.cancelled_caught)
        assert copies(tmp_path) == []
        assert pins.closed or not scope.cancelled_caught
    # Cancelled before, while and (the last) not at all while the copy was made.
    assert outcomes[0]
    assert outcomes[-1] is False
    assert open_descriptors() == descriptors
    await close_workspaces(workspaces)
    assert not (tmp_path / "areas" / "i1").exists()


async def test_a_start_cancelled_while_it_takes_its_spare_or_refreshes_it_leaves_nothing(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    for index in range(3000):
        (project / f"f{index}.txt").write_text(f"{index}\n")
    owner = {"reactor-fabric.owner-host": "test"}
    workspaces = await open_workspaces(
        "i1", owner, Workspaces(), Observer(), parent=str(tmp_path / "areas")
    )
    assert workspaces is not None
    workspaces.spares.session_delay = 0.0
    facts = TaskFacts(service="agent", task="t", session="s", call="1", trace="-")
    mount = MountSpec(str(project), "/workspace")
    descriptors = open_descriptors()
    outcomes = []
    for delay in (0.0, 0.01, 0.05, 0.2, 10.0):
        session_pins = pin_mounts([mount])
        workspaces.spares.make_for_session("s", session_pins.pins[0], (0, 0))
        session_pins.close()
        [slot] = workspaces.spares.slots()
        await making(slot).wait()  # (made: the start takes it, and is cancelled in its refresh)
        pins = pin_mounts([mount])
        made = None
        with trio.move_on_after(delay) as scope:
            made = await workspaces.make(
                f"c{delay}", pins, (mount,), base=None, facts=facts, call=1, account=(0, 0)
            )
            await made[2].filled()  # (the spare, refreshed)
        if made is not None:  # (made before the cancellation: ours to discard)
            handed, _mounts, copy = made
            assert copy.spared
            handed.close()
            await workspaces.discard(copy)
        outcomes.append(scope.cancelled_caught)
        await workspaces.spares.end_session("s")
        assert copies(tmp_path) == []
        assert pins.closed or made is not None  # (closed by make, or handed over)
    assert outcomes[0]
    assert outcomes[-1] is False
    assert open_descriptors() == descriptors
    await close_workspaces(workspaces)


def test_the_copies_directory_is_refused_when_another_user_could_reach_or_swap_it(
    tmp_path: Path,
) -> None:
    shm = tmp_path / "shm"  # as /dev/shm: everyone may write, sticky
    shm.mkdir()
    shm.chmod(0o1777)
    fresh = shm / "reactor-fabric" / "workspaces"
    own_directory(str(fresh))
    assert oct(fresh.stat().st_mode & 0o7777) == "0o700"
    assert oct((shm / "reactor-fabric").stat().st_mode & 0o7777) == "0o700"
    # Another user made the name first (in a sticky directory they may): refused.
    squatted = shm / "squatted"
    squatted.mkdir(mode=0o777)
    squatted.chmod(0o777)
    os.chown(squatted, 1234, 1234)
    with pytest.raises(OSError, match="not a directory only root or this user controls"):
        own_directory(str(squatted / "workspaces"))
    assert not (squatted / "workspaces").exists() or (squatted / "workspaces").stat().st_uid == 0
    # A link there (to a directory of theirs, or anywhere): refused, not followed.
    (shm / "linked").symlink_to(tmp_path)
    with pytest.raises(OSError, match="linked is not a directory only root"):
        own_directory(str(shm / "linked" / "workspaces"))
    # A directory of ours left open: closed again.
    mine = shm / "mine"
    mine.mkdir()
    mine.chmod(0o755)
    own_directory(str(mine))
    assert oct(mine.stat().st_mode & 0o7777) == "0o700"
    # A writable, non-sticky directory on the way (others could rename in it): refused.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(OSError, match="open is not a directory only root"):
        own_directory(str(open_dir / "workspaces"))


TOOL_SERVICE = {
    "tool": Service(image="fake/tool:1", container_strategy="fresh_per_call", workspace="isolated")
}
SHARED_AGENT = {
    "agent": Service(image="fake/agent:1", service_type="llm_agent", workspace="shared")
}


async def test_another_servers_base_argument_is_its_own_and_its_copy_starts_from_the_working_tree(
    tmp_path: Path,
) -> None:
    # Only an agent's run_task has a base of the orchestrator's: an isolated tool server's
    # argument of that name reaches it untouched (no checkout of "16" was tried).
    project = repository(tmp_path)
    (project / "draft.txt").write_text("uncommitted\n")
    async with isolated_served(tmp_path, TOOL_SERVICE) as http:
        ws = await session(http, project)
        arguments = {"path": "out.txt", "text": "x\n", "base": "16"}
        await ws.send_json(
            request(2, "tools/call", {"name": "tool__write", "arguments": arguments})
        )
        answer = await ws.hear()
        assert "my own base argument: 16" in answer["result"]["content"][0]["text"]
        workspace = answer["result"]["structuredContent"]["workspace"]
        assert workspace["base"] == git(project, "rev-parse", "HEAD")
        # (started from the working tree: the uncommitted file is in the branch)
        assert git(project, "show", f"{workspace['branch']}:draft.txt") == "uncommitted"
        await ws.aclose()


async def test_a_base_given_to_an_agent_that_works_in_the_project_itself_is_refused_on_both_ends(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    async with isolated_served(tmp_path, SHARED_AGENT) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "x.txt", "x\n", base="main"))
        refused = await ws.hear()
        assert refused["error"]["code"] == -32002
        assert refused["error"]["data"]["reason"] == "workspace_failed"
        assert "workspace: isolated" in refused["error"]["message"]
        await ws.aclose()
        relay = await relay_session(http, project)
        await relay.send_json(relayed_write(2, "x.txt", "x\n", base="main"))
        refused = await relay.hear()
        assert refused["error"]["data"]["reason"] == "workspace_failed"
        assert "workspace: isolated" in refused["error"]["message"]
        await relay.aclose()
        assert not (project / "x.txt").exists()  # nothing ran


async def test_on_the_relay_calls_sent_together_still_get_a_copy_each(tmp_path: Path) -> None:
    # The second call waits while the first is in its container: two tasks in one copy could
    # trample each other's files.
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await relay_session(http, project)
        await ws.send_json(relayed_write(2, "same.txt", "first\n", wait=0.2))
        await ws.send_json(relayed_write(3, "same.txt", "second\n"))
        answers = {}
        for _ in range(2):
            answer = await ws.hear()
            answers[answer["id"]] = answer["result"]["structuredContent"]["workspace"]
        assert answers[2]["branch"] != answers[3]["branch"]
        assert git(project, "show", f"{answers[2]['branch']}:same.txt") == "first"
        assert git(project, "show", f"{answers[3]['branch']}:same.txt") == "second"
        assert len(http.runtime.spawned) == 2
        await ws.aclose()


async def test_on_the_relay_a_cancel_reaches_the_container_working_on_its_call_not_the_next(
    tmp_path: Path,
) -> None:
    # The second call waits for the next container; the client cancels the first: the cancel
    # goes to the first's container at once (it stops, writes nothing, answers nothing), not
    # behind the second call to the next one.
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await relay_session(http, project)
        await ws.send_json(relayed_write(2, "first.txt", "first\n", wait=30))
        await ws.send_json(relayed_write(3, "second.txt", "second\n"))
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
        await ws.send_json(note)
        answer = await ws.hear()
        assert answer["id"] == 3
        workspace = answer["result"]["structuredContent"]["workspace"]
        assert git(project, "show", f"{workspace['branch']}:second.txt") == "second"
        assert "first.txt" not in git(project, "ls-tree", "-r", "--name-only", workspace["branch"])
        with trio.move_on_after(0.5):
            assert await ws.hear() is None  # nothing more: no answer to the cancelled call
        assert len(http.runtime.spawned) == 2
        await ws.aclose()


# --- spare copies ---------------------------------------------------------------------------


async def test_a_session_s_tasks_start_on_spare_copies_brought_up_to_date(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="reactor_fabric")
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        spare = await spare_made(http)  # (begun at the session's start)
        # The client works on: a task sees the working tree as it is when the task starts.
        (project / "README.md").write_text("edited after the spare was made\n")
        await ws.send_json(write(2, "notes.txt", "the first task's\n"))
        first = (await ws.hear())["result"]["structuredContent"]["workspace"]
        assert git(project, "show", f"{first['branch']}~1:README.md") == (
            "edited after the spare was made"
        )
        assert f"i1/{posixpath.basename(spare)}" not in copies(tmp_path)  # (taken: the task's)
        second_spare = await spare_made(http)  # (begun once the first task's container started)
        assert second_spare != spare
        (project / "added.txt").write_text("new\n")
        await ws.send_json(write(3, "more.txt", "the second task's\n"))
        second = (await ws.hear())["result"]["structuredContent"]["workspace"]
        assert spared(caplog) == [True, True]
        branch = second["branch"]
        assert git(project, "show", f"{branch}~1:added.txt") == "new"
        assert git(project, "show", f"{branch}:more.txt") == "the second task's"
        # The first task's work is on its own branch only.
        assert "notes.txt" not in git(project, "ls-tree", "--name-only", branch)
        assert git(project, "show", f"{first['branch']}:notes.txt") == "the first task's"
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_spare_copy_is_its_session_s_only(tmp_path: Path) -> None:
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        first = await session(http, project)
        other = await session(http, project)
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        slots = workspaces.spares.slots()
        assert len({slot.session for slot in slots}) == 2  # one each
        [theirs] = [slot for slot in slots if slot.session != slots[-1].session]
        await other.send_json(write(2, "b.txt", "b\n"))
        await other.hear()
        await making(theirs).wait()
        assert theirs in workspaces.spares.slots()  # not taken by the other session's task
        assert f"i1/{posixpath.basename(theirs.directory)}" in copies(tmp_path)
        await first.aclose()
        await other.aclose()
        await no_copies_left(http, tmp_path)


async def test_without_spares_every_task_copies_the_whole_project(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="reactor_fabric")
    project = repository(tmp_path)
    async with isolated_served(tmp_path, bounds=Workspaces(spare=False)) as http:
        ws = await session(http, project)
        for request_id in (2, 3):
            await ws.send_json(write(request_id, f"{request_id}.txt", "x\n"))
            await ws.hear()
            workspaces = http.fabric.starter.workspaces
            assert workspaces is not None
            assert workspaces.spares.slots() == []  # (none begun: it would be by the answer)
        assert spared(caplog) == [False, False]
        await ws.aclose()


async def test_a_project_over_the_spares_bound_gets_none_for_a_while_and_is_copied_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="reactor_fabric")
    project = repository(tmp_path)
    (project / "large.bin").write_bytes(b"x" * (2 << 20))
    bounds = Workspaces(spare_max_size="1m")
    async with isolated_served(tmp_path, bounds=bounds) as http:
        ws = await session(http, project)
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        [slot] = workspaces.spares.slots()
        await making(slot).wait()
        for request_id in (2, 3):
            await ws.send_json(write(request_id, f"{request_id}.txt", "x\n"))
            answer = await ws.hear()
            assert answer["result"]["structuredContent"]["workspace"]["files_changed"] == 1
            assert workspaces.spares.slots() == []  # (not tried again for this project)
        assert spared(caplog) == [False, False]
        other = await session(http, project)  # (nor for another session, for a while)
        assert workspaces.spares.slots() == []
        await other.aclose()
        await ws.aclose()
        await no_copies_left(http, tmp_path)


def _held_spares(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Spares made only once ``release`` is set, or stopped: (release, stopped while made)."""
    release, stopped_while_made = threading.Event(), threading.Event()

    def held_spare(begun: Begun, stopped: Callable[[], bool]) -> Spare:
        deadline = time.monotonic() + 10
        while not stopped() and not release.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)
        if stopped():
            stopped_while_made.set()
        return make_spare(begun, stopped)  # (stopped: removes its directory, raises)

    monkeypatch.setattr("reactor_fabric.trio.spares.make_spare", held_spare)
    return release, stopped_while_made


async def test_a_task_that_comes_while_its_spare_is_made_stops_it_and_copies_the_project_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="reactor_fabric")
    _release, stopped_while_made = _held_spares(monkeypatch)
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "notes.txt", "x\n"))
        answer = await ws.hear()  # (the spare is never released: answered all the same)
        assert answer["result"]["structuredContent"]["workspace"]["files_changed"] == 1
        assert spared(caplog) == [False]
        assert stopped_while_made.is_set()
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_task_asked_for_before_the_session_s_spare_began_copies_the_project_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A session's first spare is begun a second after it opened: a task asked for at once
    stops it before it began and copies as it would without spares, nothing beside it."""
    caplog.set_level("INFO", logger="reactor_fabric")
    project = repository(tmp_path)
    async with isolated_served(tmp_path, session_spare_delay=SESSION_SPARE_DELAY_SECONDS) as http:
        ws = await session(http, project)
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        [slot] = workspaces.spares.slots()
        await ws.send_json(write(2, "notes.txt", "x\n"))
        await ws.hear()
        assert spared(caplog) == [False]
        with trio.fail_after(1):  # (well before it would have begun)
            await making(slot).wait()
        stopped = making(slot).outcome
        assert isinstance(stopped, outcome.Error)
        assert isinstance(stopped.error, InterruptedError)
        await ws.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_session_that_ends_while_its_spare_is_made_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _release, stopped_while_made = _held_spares(monkeypatch)
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        assert [making(slot).done for slot in workspaces.spares.slots()] == [False]  # (being made)
        await ws.aclose()
        await no_copies_left(http, tmp_path)
        assert workspaces.spares.slots() == []
        assert stopped_while_made.is_set()


async def test_a_relay_session_begins_a_spare_too_and_a_suite_with_no_isolated_service_none(
    tmp_path: Path,
) -> None:
    project = repository(tmp_path)
    shared_agent = {"agent": Service(image="fake/agent:1", service_type="llm_agent",
                                     workspace="shared")}  # fmt: skip
    async with isolated_served(tmp_path, services=shared_agent) as http:
        ws = await session(http, project)
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        assert workspaces.spares.slots() == []
        await ws.aclose()
    relayed = tmp_path / "relayed"
    relayed.mkdir()
    async with isolated_served(relayed) as http:
        relay = await relay_session(http, repository(relayed))
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        assert len(workspaces.spares.slots()) == 1
        await relay.aclose()
        await no_copies_left(http, relayed)


async def test_a_spare_that_cannot_be_begun_leaves_the_session_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="reactor_fabric")

    def out_of_descriptors(*_args: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(Spares, "make_for_session", out_of_descriptors)
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await ws.send_json(write(2, "notes.txt", "x\n"))
        answer = await ws.hear()
        assert answer["result"]["structuredContent"]["workspace"]["files_changed"] == 1
        assert spared(caplog) == [False]
        assert [r for r in caplog.records if r.msg == "workspace_spare_not_begun"]
        await ws.aclose()
        await no_copies_left(http, tmp_path)


# --- spares kept after their session -----------------------------------------------------------


@asynccontextmanager
async def keeping(http: Served) -> AsyncIterator[TaskWorkspaces]:
    """The served workspaces with their keeper running (serve.py starts it in the root
    nursery), cancelled at the block's end."""
    workspaces = http.fabric.starter.workspaces
    assert workspaces is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(workspaces.spares.run)
        yield workspaces
        nursery.cancel_scope.cancel()


async def test_a_session_s_spare_is_kept_for_the_next_session_whose_first_task_starts_on_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's next session on the project (as when it reconnects, or opens another
    conversation) takes the spare its last one left: a task asked for at once starts on it,
    brought up to the working tree as it is now."""
    caplog.set_level("INFO", logger="reactor_fabric")
    project = repository(tmp_path)
    (project / "gone.txt").write_text("removed before the next session\n")
    async with isolated_served(tmp_path) as http:
        first = await session(http, project)
        spare = await spare_made(http)
        await first.aclose()
        await sessions_over(http)
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        assert [kept.directory for kept in workspaces.spares.kept()] == [spare]
        # The client works on between its sessions.
        (project / "gone.txt").unlink()
        (project / "README.md").write_text("edited between the sessions\n")
        second = await session(http, project)
        assert workspaces.spares.kept() == []  # (the session's now)
        await second.send_json(write(2, "notes.txt", "at once\n"))
        answer = (await second.hear())["result"]["structuredContent"]["workspace"]
        assert spared(caplog) == [True]
        assert [r for r in caplog.records if r.msg == "workspace_spare_kept_taken"]
        branch = answer["branch"]
        assert git(project, "show", f"{branch}~1:README.md") == "edited between the sessions"
        listed = git(project, "ls-tree", "-r", "--name-only", branch).split()
        assert sorted(listed) == ["README.md", "notes.txt"]  # (gone.txt: gone)
        await second.aclose()
        await no_copies_left(http, tmp_path)


async def test_a_kept_spare_goes_only_to_a_session_on_the_same_project(tmp_path: Path) -> None:
    project = repository(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other_project = repository(elsewhere)
    async with isolated_served(tmp_path) as http:
        first = await session(http, project)
        spare = await spare_made(http)
        await first.aclose()
        await sessions_over(http)
        other = await session(http, other_project)
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        [slot] = workspaces.spares.slots()
        assert slot.kept is None  # (its own, being made)
        assert slot.directory != spare
        assert [kept.directory for kept in workspaces.spares.kept()] == [spare]
        await making(slot).wait()
        await other.aclose()
        await sessions_over(http)
        assert len(workspaces.spares.kept()) == 2  # (one per project)
        await no_copies_left(http, tmp_path)


async def test_a_session_ending_while_its_spare_is_made_leaves_it_kept_once_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, stopped_while_made = _held_spares(monkeypatch)
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http, keeping(http) as workspaces:
        ws = await session(http, project)
        [slot] = workspaces.spares.slots()
        await ws.aclose()
        await sessions_over(http)
        assert workspaces.spares.kept() == []  # (still being made)
        release.set()
        with trio.fail_after(10):
            await making(slot).wait()
            while not workspaces.spares.kept():  # noqa: ASYNC110 - kept by its keeper's task
                await trio.sleep(0.01)
        assert [kept.directory for kept in workspaces.spares.kept()] == [slot.directory]
        assert not stopped_while_made.is_set()
        await no_copies_left(http, tmp_path)


async def test_kept_spares_are_removed_when_they_expire_and_beyond_their_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("reactor_fabric.trio.spares.KEPT_SPARES", 1)
    projects = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        projects.append(repository(tmp_path / name))
    async with isolated_served(tmp_path) as http, keeping(http) as workspaces:
        made = []
        for project in projects:
            ws = await session(http, project)
            made.append(await spare_made(http))
            await ws.aclose()
            await sessions_over(http)
        # The older one went when the newer was kept (one at most, here).
        assert [kept.directory for kept in workspaces.spares.kept()] == [made[1]]
        assert copies(tmp_path) == [f"i1/{posixpath.basename(made[1])}"]
        monkeypatch.setattr("reactor_fabric.trio.spares.KEPT_SPARE_SECONDS", 0.2)
        ws = await session(http, projects[0])
        await ws.aclose()  # (its spare, made meanwhile or not, is kept for 0.2 s, or dropped)
        with trio.fail_after(10):
            while workspaces.spares.kept() or copies(tmp_path):  # noqa: ASYNC110 - expiry
                await trio.sleep(0.05)


async def test_kept_spares_are_removed_with_the_serving(tmp_path: Path) -> None:
    project = repository(tmp_path)
    async with isolated_served(tmp_path) as http:
        ws = await session(http, project)
        await spare_made(http)
        await ws.aclose()
        await sessions_over(http)
        workspaces = http.fabric.starter.workspaces
        assert workspaces is not None
        assert len(copies(tmp_path)) == 1
        await workspaces.spares.close()
        assert workspaces.spares.kept() == []
        assert copies(tmp_path) == []


def test_a_kept_spare_is_found_only_by_a_session_of_the_same_user() -> None:
    """A session's own tasks find its spare by the session; a later session finds a kept one
    by user, account and project: a copy made in alice's session is never bob's."""
    alices = SpareRecipe("s1", (1000, 1000), (64, 12), (1000, 1000), "alice")
    bobs = SpareRecipe("s2", (1000, 1000), (64, 12), (1000, 1000), "bob")
    token_holders = SpareRecipe("s3", (1000, 1000), (64, 12), (1000, 1000))
    assert len({alices.kept_as, bobs.kept_as, token_holders.kept_as}) == 3
    assert (
        alices.kept_as == SpareRecipe("s4", (1000, 1000), (64, 12), (1000, 1000), "alice").kept_as
    )
    # Within the session, the recipe is the session's whoever asks (the user is its own).
    assert alices == SpareRecipe("s1", (1000, 1000), (64, 12), (1000, 1000))
