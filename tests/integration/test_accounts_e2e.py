"""Servers run as the user a session acts for, never as root: on the real engine, with the
bundled servers and a real client, for an orchestrator run by root and one run by a user.

Files are given to made-up uids (4000, 4001), which needs root: these tests run as root, like
the rest of the real-engine suite (the engine itself needs root or the docker group).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.integration.harness import (
    containers_of,
    git_repo,
    orchestrator,
    python_client,
    text_of,
    write_suite,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="giving files to other uids needs root"),
]

USER = (4000, 4000)
OTHER_USER = (4001, 4001)
NOBODY = "65534:65534"


def give(path: Path, owner: tuple[int, int]) -> None:
    for directory, _dirs, files in os.walk(path):
        os.chown(directory, *owner)
        for name in files:
            os.chown(Path(directory) / name, *owner)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory every user may enter (pytest's own tmp_path is root's, mode 0700); the
    orchestrator's log stays in tmp_path, read after this is gone."""
    path = Path(tempfile.mkdtemp(prefix="rf-accounts-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def server_user(client: docker.DockerClient, instance: str) -> list[str]:
    """Who the servers of the instance's client sessions run as (not its catalog probes,
    which run as nobody by design)."""
    return [c.attrs["Config"]["User"] for c in containers_of(client, instance=instance)]


def test_files_a_server_writes_into_a_project_belong_to_the_projects_owner(
    scratch: Path, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    project = scratch / "project"
    project.mkdir()
    give(project, USER)
    suite = write_suite(scratch / "suite.yaml", [str(scratch)])
    with orchestrator(suite, tmp_path / "o.log") as running:
        client = python_client(f"{running.ws_url}/mcp/filesystem?mount={project}:/workspace")
        try:
            assert client.ask({"op": "initialize"})["ok"]
            created = client.ask(
                {
                    "op": "call",
                    "name": "create_directory",
                    "arguments": {"path": "/workspace/notes"},
                }
            )
            assert created["ok"], created
            written = client.ask(
                {
                    "op": "call",
                    "name": "write_file",
                    "arguments": {"path": "/workspace/notes/new.txt", "content": "x"},
                }
            )
            assert written["ok"], written
            [attrs] = [c.attrs for c in containers_of(docker_client, instance=running.instance)]
            assert attrs["Config"]["User"] == "4000:4000"
            assert attrs["HostConfig"]["ReadonlyRootfs"] is True
        finally:
            assert client.close() == 0
    for made in (project / "notes", project / "notes" / "new.txt"):
        found = made.stat()
        assert (found.st_uid, found.st_gid) == USER, made


def test_git_commits_as_the_projects_owner_without_complaining_about_ownership(
    scratch: Path, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    repo = git_repo(scratch / "repo", ["first"])
    (repo / "log.txt").write_text("second")
    give(repo, USER)
    suite = write_suite(scratch / "suite.yaml", [str(scratch)])
    with orchestrator(suite, tmp_path / "o.log") as running:
        client = python_client(f"{running.ws_url}/mcp/git?mount={repo}:/workspace")
        try:
            assert client.ask({"op": "initialize"})["ok"]
            for name, arguments in [
                ("git_add", {"repo_path": "/workspace", "files": ["log.txt"]}),
                ("git_commit", {"repo_path": "/workspace", "message": "second"}),
            ]:
                answer = client.ask({"op": "call", "name": name, "arguments": arguments})
                assert answer["ok"], answer
                assert "rror" not in text_of(answer), answer
            history = client.ask(
                {"op": "call", "name": "git_log", "arguments": {"repo_path": "/workspace"}}
            )
            assert "Message: second" in text_of(history)
        finally:
            assert client.close() == 0
    objects = [path for path in (repo / ".git" / "objects").rglob("*") if path.is_file()]
    assert {(path.stat().st_uid, path.stat().st_gid) for path in objects} == {USER}


def test_a_server_without_a_mount_or_on_roots_files_runs_as_nobody(
    scratch: Path, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    rooted = scratch / "rooted"
    rooted.mkdir()
    (rooted / "mine.txt").write_text("root's")
    suite = write_suite(scratch / "suite.yaml", [str(scratch)])
    with orchestrator(suite, tmp_path / "o.log") as running:
        bare = python_client(f"{running.ws_url}/mcp/time", "--register", "[]")
        on_root = python_client(f"{running.ws_url}/mcp/filesystem?mount={rooted}:/workspace")
        try:
            bare.read_json()
            assert bare.ask({"op": "initialize"})["ok"]
            assert on_root.ask({"op": "initialize"})["ok"]
            assert server_user(docker_client, running.instance) == [NOBODY, NOBODY]
            read = on_root.ask(
                {
                    "op": "call",
                    "name": "read_text_file",
                    "arguments": {"path": "/workspace/mine.txt"},
                }
            )
            assert "root's" in text_of(read)
            # Root's files stay root's: nobody may read them (mode 0644), not change them.
            written = on_root.ask(
                {
                    "op": "call",
                    "name": "write_file",
                    "arguments": {"path": "/workspace/mine.txt", "content": "changed"},
                }
            )
            assert not written["ok"] or "denied" in text_of(written), written
        finally:
            assert bare.close() == 0
            assert on_root.close() == 0
    assert (rooted / "mine.txt").read_text() == "root's"


def test_a_users_orchestrator_runs_its_servers_as_that_user_and_verifies_their_mounts(
    scratch: Path, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    home = scratch / "home"
    project = home / "project"
    project.mkdir(parents=True)
    give(home, USER)
    suite = write_suite(scratch / "suite.yaml", [str(scratch)])
    with orchestrator(suite, tmp_path / "o.log", run_as=USER, env={"HOME": str(home)}) as running:
        client = python_client(f"{running.ws_url}/mcp/filesystem?mount={project}:/workspace")
        try:
            # Only a container of the orchestrator's own uid and gid can be inspected through
            # /proc/PID/root: initialize going through means the mount was verified.
            initialized = client.ask({"op": "initialize"})
            assert initialized["ok"], initialized
            written = client.ask(
                {
                    "op": "call",
                    "name": "write_file",
                    "arguments": {"path": "/workspace/new.txt", "content": "x"},
                }
            )
            assert written["ok"], written
            assert server_user(docker_client, running.instance) == ["4000:4000"]
        finally:
            assert client.close() == 0
    found = (project / "new.txt").stat()
    assert (found.st_uid, found.st_gid) == USER
    assert "mount_unverifiable" not in (tmp_path / "o.log").read_text()


def test_another_users_private_directory_is_not_mountable_through_a_users_orchestrator(
    scratch: Path, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    """The engine runs as root and could mount it; the session acts for the orchestrator's
    user, who may not list it, and neither may its server."""
    home = scratch / "home"
    home.mkdir()
    give(home, USER)
    theirs = scratch / "theirs"
    theirs.mkdir()
    (theirs / "secret.txt").write_text("not for user 4000")
    give(theirs, OTHER_USER)
    theirs.chmod(0o700)
    suite = write_suite(scratch / "suite.yaml", [str(scratch)])
    with orchestrator(suite, tmp_path / "o.log", run_as=USER, env={"HOME": str(home)}) as running:
        client = python_client(f"{running.ws_url}/mcp/filesystem?mount={theirs}:/workspace:ro")
        try:
            answer = client.ask({"op": "initialize"})
            assert not answer["ok"], answer
            assert answer["error"]["code"] == -32004
            assert answer["error"]["data"]["reason"] == "mount_not_permitted"
            assert not containers_of(docker_client, instance=running.instance)
        finally:
            client.close()


@pytest.mark.parametrize(
    ("orchestrator_user", "repo_owner", "server"),
    [
        (None, (0, 0), NOBODY),  # root's orchestrator, root's repo: the server runs as nobody
        (USER, OTHER_USER, "4000:4000"),  # a user's orchestrator, another user's repo
    ],
    ids=["root-repo-nobody-server", "other-users-repo-users-server"],
)
def test_git_reads_a_repository_owned_by_another_uid_than_its_server_without_complaining(
    scratch: Path,
    tmp_path: Path,
    docker_client: docker.DockerClient,
    orchestrator_user: tuple[int, int] | None,
    repo_owner: tuple[int, int],
    server: str,
) -> None:
    """git refuses a repository owned by someone else ("dubious ownership") unless told it is
    safe: the git image says so for every repository, since mounts belong to other uids."""
    repo = git_repo(scratch / "repo", ["first", "second"])
    (repo / "log.txt").write_text("changed, not committed")
    give(repo, repo_owner)
    home = scratch / "home"
    home.mkdir()
    give(home, USER)
    suite = write_suite(scratch / "suite.yaml", [str(scratch)])
    with orchestrator(
        suite, tmp_path / "o.log", run_as=orchestrator_user, env={"HOME": str(home)}
    ) as running:
        client = python_client(f"{running.ws_url}/mcp/git?mount={repo}:/workspace:ro")
        try:
            assert client.ask({"op": "initialize"})["ok"]
            answers = {
                name: client.ask(
                    {"op": "call", "name": name, "arguments": {"repo_path": "/workspace"}}
                )
                for name in ("git_status", "git_log")
            }
            assert server_user(docker_client, running.instance) == [server]
        finally:
            assert client.close() == 0
    for answer in answers.values():
        assert answer["ok"], answer
        assert "dubious" not in text_of(answer).lower(), answer
    assert "On branch main" in text_of(answers["git_status"]), answers
    assert "modified:   log.txt" in text_of(answers["git_status"]), answers
    log = text_of(answers["git_log"])
    assert log.index("Message: second") < log.index("Message: first"), log
