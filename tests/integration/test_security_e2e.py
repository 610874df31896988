"""Attacks on isolation, on the real engine: each one used to work; each must fail now.

The probe image (``images/probe``) is a tiny stdio server that answers every request with the
entries of a directory in its container: what a mount really holds, as the server sees it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import random
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import docker
import pytest
import trio

from reactor_fabric import SecurityViolation, Service
from reactor_fabric.policy.accounts import UNPRIVILEGED, Account
from reactor_fabric.policy.container_parts.ownership import LABEL_SESSION
from reactor_fabric.policy.container_spec import container_spec_for
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.pinning import PinSet, pin_mounts
from reactor_fabric.runtime.docker import DockerRuntime
from tests.fakes import EVERY_CAPABILITY
from tests.http_client import HttpClient
from tests.integration.harness import (
    Orchestrator,
    build_test_image,
    containers_of,
    mounted_directories,
    orchestrator,
    python2_client,
    python_client,
    wait_until,
    write_suite,
)
from tests.integration.test_bounds_e2e import host_port, websocket
from tests.integration.test_docker_api_stdio import TEST_IDENTITY, StdioPeer
from tests.leaks import descriptors_of
from tests.messages import INITIALIZE, request

pytestmark = pytest.mark.integration

MARKER = "VALIDATED"
WRONG_TOKEN = "wrong-token-0123456789abcdef"


@pytest.fixture(scope="module")
def probe_image() -> str:
    return build_test_image("probe")


def probe_suite(path: Path, root: Path, image: str, *, timeout: str = "1m", warm: int = 0) -> Path:
    return write_suite(
        path,
        [str(root)],
        test_services={"probe": {"image": image, "timeout": timeout, "warm": warm}},
    )


class Swapper(threading.Thread):
    """Swaps ``project`` between the real directory and symlinks to ``decoys``.

    Each state lasts a random 0-2 ms, so that every moment of a start (validation, pinning,
    the engine's create and start) sometimes sees the link and sometimes the directory.
    """

    def __init__(self, project: Path, decoys: list[Path]) -> None:
        super().__init__(daemon=True)
        self.project = project
        self.decoys = decoys
        self.swaps = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        aside = self.project.with_name(self.project.name + ".aside")
        while not self.stopped.is_set():
            decoy = self.decoys[self.swaps % len(self.decoys)]
            time.sleep(random.uniform(0, 0.002))
            os.rename(self.project, aside)
            os.symlink(decoy, self.project)
            time.sleep(random.uniform(0, 0.002))
            os.unlink(self.project)
            os.rename(aside, self.project)
            self.swaps += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)


def mount_of(project: Path) -> dict[str, Any]:
    return {"mounts": [{"source": str(project), "target": "/workspace"}]}


@pytest.mark.parametrize("warm", [0, 4], ids=["fresh", "pooled"])
def test_a_project_swapped_for_symlinks_never_gets_anything_else_mounted(
    tmp_path: Path, project_root: Path, probe_image: str, warm: int
) -> None:
    """≥ 200 container starts race a loop that swaps the project for links to a directory
    outside the allowed roots and to the Docker socket's directory: every container that
    answers sees the validated project, or the client is told the mount changed. With a warm
    pool, the project is attached to containers started before the session (most starts)."""
    project = project_root / "project"
    project.mkdir()
    (project / MARKER).write_text("the directory that was validated")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "DECOY").write_text("not allowed")
    docker_socket_dir = Path("/run")
    assert (docker_socket_dir / "docker.sock").exists()
    suite = probe_suite(tmp_path / "suite.yaml", project_root, probe_image, warm=warm)

    seen: collections.Counter[str] = collections.Counter()
    escapes: list[Any] = []

    async def one_session(running: Orchestrator, rounds: int) -> None:
        while True:  # until the registration itself is not raced
            ws = await websocket(running, "/mcp/probe")
            await ws.send_json(request(1, "fabric/registerClient", mount_of(project)))
            registered = await ws.hear()
            if "result" in registered:
                break
            assert registered["error"]["code"] == -32004, registered
            seen["refused at registration: " + registered["error"]["data"]["reason"]] += 1
            await ws.aclose()
        for index in range(rounds):
            await ws.send_json(request(100 + index, "look", {"path": "/workspace"}))
            answer = await ws.hear()
            if "error" in answer:
                # The start was refused: what the client reads is a documented error.
                assert answer["error"]["code"] in (-32004, -32002), answer
                seen["refused at start: " + answer["error"]["data"]["reason"]] += 1
                continue
            entries = answer["result"]["entries"]
            if entries != [MARKER]:
                escapes.append(entries)
            seen["served the validated project"] += 1
            # Kill the container (the probe exits on "exit"): the next round is a respawn.
            await ws.send_json(request(10_000 + index, "exit"))
            await ws.hear()
        await ws.aclose()

    async def attack(running: Orchestrator) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one_session, running, 24)

    def started(running: Orchestrator) -> list[dict[str, Any]]:
        return [e for e in running.logs() if e["event"] == "container_started"]

    swapper = Swapper(project, [outside, docker_socket_dir])
    with orchestrator(suite, tmp_path / "o.log") as running:
        swapper.start()
        try:
            # How many starts the pool serves depends on how fast it refills against back-to-back
            # respawns (18 of 111 once, on a loaded machine): with a pool, attack again until it
            # served enough of them to judge, at most four times.
            for _ in range(4):
                trio.run(attack, running)
                if not warm or sum(1 for e in started(running) if e["pooled"]) >= 20:
                    break
        finally:
            swapper.stop()
        starts = started(running)
        refused = [e for e in running.logs() if e["event"] == "container_start_failed"]

    assert escapes == [], f"containers saw something else than the project: {escapes[:5]}"
    assert len(starts) + len(refused) >= 200, (len(starts), len(refused), seen)
    # Both sides of the race happened: it was really run, not dodged.
    assert seen["served the validated project"] > 0, seen
    assert seen["refused at start: mount_changed"] > 0, seen
    assert swapper.swaps > 100, swapper.swaps
    pooled = sum(1 for start in starts if start["pooled"])
    if warm:
        assert pooled >= 20, (pooled, len(starts))
    else:
        assert pooled == 0


def test_a_respawn_after_idle_teardown_validates_the_mount_again(
    tmp_path: Path, project_root: Path, probe_image: str
) -> None:
    """Mounts used to be validated once per session: a swap while the container was torn down
    for idleness was mounted at the next start."""
    project = project_root / "project"
    project.mkdir()
    (project / MARKER).write_text("validated")
    outside = tmp_path / "outside"
    outside.mkdir()
    suite = probe_suite(tmp_path / "suite.yaml", project_root, probe_image, timeout="1s")

    async def scenario(running: Orchestrator) -> None:
        ws = await websocket(running, "/mcp/probe")
        await ws.send_json(request(1, "fabric/registerClient", mount_of(project)))
        assert "result" in await ws.hear()
        await ws.send_json(request(2, "look"))
        assert (await ws.hear())["result"]["entries"] == [MARKER]
        # Idle teardown (Docker has no event to wait on here).
        await trio.to_thread.run_sync(
            functools.partial(
                wait_until,
                lambda: any(e["event"] == "container_removed" for e in running.logs()),
                timeout=30,
                what="the idle container to be removed",
            )
        )
        project.rename(project.with_name("aside"))
        project.symlink_to(outside)
        await ws.send_json(request(3, "look"))
        refused = await ws.hear()
        assert refused["error"]["code"] == -32004
        assert refused["error"]["data"]["reason"] == "mount_changed"
        # Put back, the session goes on with its own project.
        project.unlink()
        project.with_name("aside").rename(project)
        await ws.send_json(request(4, "look"))
        assert (await ws.hear())["result"]["entries"] == [MARKER]
        await ws.aclose()

    with orchestrator(suite, tmp_path / "o.log") as running:
        trio.run(scenario, running)


def _probe_spec(
    project: Path, image: str, *, read_only: bool = False, account: Account = UNPRIVILEGED
) -> Any:
    return container_spec_for(
        "probe",
        Service(image=image, pull="never", network="none"),
        session_id=secrets.token_hex(8),
        identity=TEST_IDENTITY,
        mounts=(MountSpec(str(project), "/workspace", read_only),),
        account=account,
        capabilities=EVERY_CAPABILITY,
    )


async def _ask(container: Any, method: str, path: str) -> dict[str, Any]:
    peer = StdioPeer(container)
    await peer.send({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"path": path}})
    return (await peer.response(1))["result"]  # type: ignore[no-any-return]


async def test_the_engine_mounts_the_pinned_directory_not_what_the_path_names_later(
    tmp_path: Path, probe_image: str, docker_client: docker.DockerClient
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / MARKER).write_text("validated")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "DECOY").write_text("not this")
    spec = _probe_spec(project, probe_image)
    pins = pin_mounts(spec.mounts)
    # The path now names something else: what was pinned is what gets mounted.
    project.rename(tmp_path / "aside")
    project.symlink_to(outside)
    assert len(descriptors_of(tmp_path / "aside")) == 1  # the pin
    engine = DockerRuntime()
    try:
        container = await engine.spawn(spec, pins)
        try:
            with trio.fail_after(60):
                assert (await _ask(container, "look", "/workspace"))["entries"] == [MARKER]
            # The mount is a volume of ours (labelled, so that leftovers can be found)...
            assert len(_volumes_of(docker_client, spec)) == 1
        finally:
            await container.aclose()
            await engine.remove(container.id)
    finally:
        await engine.close()
    assert pins.closed
    assert descriptors_of(tmp_path / "aside") == []
    assert not _volumes_of(docker_client, spec)  # ...removed with the container


async def test_a_container_that_did_not_get_the_pinned_directory_is_refused_and_removed(
    tmp_path: Path, probe_image: str, docker_client: docker.DockerClient
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    spec = _probe_spec(project, probe_image)
    [pin] = pin_mounts(spec.mounts).pins
    # A pin that claims another identity stands for an engine that mounted something else.
    wrong = PinSet([dataclasses.replace(pin, inode=pin.inode + 1)])
    engine = DockerRuntime()
    try:
        with pytest.raises(SecurityViolation) as caught:
            await engine.spawn(spec, wrong)
    finally:
        await engine.close()
    assert caught.value.reason == "mount_changed"
    assert caught.value.to_jsonrpc_error()["code"] == -32004
    assert wrong.closed
    assert not containers_of(docker_client, session=spec.labels[LABEL_SESSION])
    assert not _volumes_of(docker_client, spec)


async def test_a_read_only_pinned_mount_cannot_be_written_and_a_writable_one_can(
    tmp_path: Path, probe_image: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # The server runs as the project's owner, as a session's would (see test_accounts_e2e).
    owner = project.stat()
    account = Account(owner.st_uid, owner.st_gid, "owner")
    engine = DockerRuntime()
    try:
        for read_only in (True, False):
            spec = _probe_spec(project, probe_image, read_only=read_only, account=account)
            container = await engine.spawn(spec, pin_mounts(spec.mounts))
            try:
                with trio.fail_after(60):
                    answer = await _ask(container, "write", f"/workspace/{read_only}")
            finally:
                await container.aclose()
                await engine.remove(container.id)
            if read_only:
                assert "Read-only file system" in answer["error"], answer
            else:
                assert answer["error"] is None, answer
    finally:
        await engine.close()
    assert sorted(os.listdir(project)) == ["False"]


def _volumes_of(client: docker.DockerClient, spec: Any) -> list[Any]:
    session = spec.labels[LABEL_SESSION]
    return client.volumes.list(filters={"label": f"{LABEL_SESSION}={session}"})


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("/opt/mcp/bin", "mount_target_not_allowed"),  # the bundled server's own command
        ("/opt", "mount_target_not_allowed"),
        ("/usr/local/bin", "mount_target_forbidden"),
        ("/app", "mount_target_not_allowed"),
    ],
)
def test_a_client_cannot_mount_its_own_files_over_the_services_command(
    tmp_path: Path, project_root: Path, docker_client: docker.DockerClient, target: str, reason: str
) -> None:
    """`?mount=ROOT/evilbin:/opt/mcp/bin:ro` used to make the time container run the client's
    script, with the suite's env and config in reach."""
    evil = project_root / "evilbin"
    evil.mkdir()
    (evil / "mcp-server-time").write_text("#!/bin/sh\necho pwned\n")
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])

    async def attempt(running: Orchestrator) -> dict[str, Any]:
        ws = await websocket(running, f"/mcp/time?mount={evil}:{target}:ro")
        await ws.send_json(request(1, "initialize", {"protocolVersion": "2025-06-18"}))
        answer: dict[str, Any] = await ws.hear()
        await ws.aclose()
        return answer

    with orchestrator(suite, tmp_path / "o.log") as running:
        answer = trio.run(attempt, running)
        assert answer["error"]["code"] == -32004
        assert answer["error"]["data"]["reason"] == reason
        assert not containers_of(docker_client, instance=running.instance)


IMAGE_DIRECTORY = Path("/srv/rf-shadow-probe")  # also in the probe image (its Dockerfile)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a directory under /srv")
def test_a_same_path_mount_cannot_hide_what_the_image_has_at_that_path(
    tmp_path: Path, probe_image: str, docker_client: docker.DockerClient
) -> None:
    if IMAGE_DIRECTORY.exists():
        pytest.fail(f"{IMAGE_DIRECTORY} exists on this host; this test needs it for itself")
    IMAGE_DIRECTORY.mkdir(parents=True)
    elsewhere = tmp_path / "projects" / "fresh"
    elsewhere.mkdir(parents=True)
    try:
        suite = write_suite(
            tmp_path / "suite.yaml",
            [str(IMAGE_DIRECTORY), str(tmp_path / "projects")],
            test_services={"probe": {"image": probe_image}},
        )

        async def start(running: Orchestrator, source: Path) -> dict[str, Any]:
            ws = await websocket(running, f"/mcp/probe?mount={source}:{source}")
            await ws.send_json(request(1, "initialize", {"protocolVersion": "2025-06-18"}))
            answer: dict[str, Any] = await ws.hear()
            await ws.aclose()
            return answer

        with orchestrator(suite, tmp_path / "o.log") as running:
            answer = trio.run(start, running, IMAGE_DIRECTORY)
            assert answer["error"]["code"] == -32004
            assert answer["error"]["data"]["reason"] == "mount_target_in_image"
            # Nothing left: neither the session's container nor the one that asked the image.
            assert not containers_of(docker_client, instance=running.instance)
            # A same-path mount where the image has nothing goes on.
            assert "result" in trio.run(start, running, elsewhere)
    finally:
        IMAGE_DIRECTORY.rmdir()


async def _http_without_the_token(
    running: Orchestrator, method: str, target: str, headers: dict[str, str]
) -> Any:
    client = HttpClient(await trio.open_tcp_stream(*host_port(running)))
    try:
        body = request(9, "tools/call", {"name": "get_current_time"}) if method == "POST" else None
        return await client.request(method, target, body, headers=headers)
    finally:
        await client.aclose()


def test_a_keyed_url_belongs_to_its_first_client_others_and_tokenless_requests_are_refused(
    tmp_path: Path, project_root: Path, docker_client: docker.DockerClient
) -> None:
    """A foreign key owner: B picks the URL key A uses, with its own project, with no mount, or
    registering its own mounts; a request on the key without the token or with a wrong one.
    Each is refused as its client shows it, and A's session and container go on untouched."""
    mine = project_root / "mine"
    theirs = project_root / "theirs"
    mine.mkdir()
    theirs.mkdir()
    (mine / MARKER).write_text("A's project")
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    current_time = {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
    with orchestrator(suite, tmp_path / "o.log") as running:
        key_url = f"{running.http_url}/mcp/time/agent-k"
        owner = python2_client(f"{key_url}?mount={mine}:/workspace")
        try:
            assert owner.ask({"op": "initialize"})["ok"]
            assert owner.ask(current_time)["ok"]
            [container] = containers_of(docker_client, service="time", instance=running.instance)
            assert mounted_directories(container, [mine, theirs]) == [(str(mine), "/workspace")]

            def container_is_untouched() -> None:
                [now] = containers_of(docker_client, service="time", instance=running.instance)
                assert (now.id, now.status) == (container.id, "running")
                answer = owner.ask(current_time)
                assert answer["ok"], answer

            shown: list[dict[str, Any]] = []
            for url in (f"{key_url}?mount={theirs}:/workspace", key_url):
                other = python2_client(url)
                try:
                    shown.append(other.ask({"op": "initialize"}))
                finally:
                    other.close()
            mounts = json.dumps([{"source": str(theirs), "target": "/workspace"}])
            registering = python_client(f"{key_url}?mount={mine}:/workspace", "--register", mounts)
            try:
                registered = registering.read_json()
                assert registered["op"] == "register", registered
                shown.append(registered)
            finally:
                registering.close()
            for answer in shown:
                assert not answer["ok"], answer
                assert answer["error"]["code"] == -32004, answer
                assert answer["error"]["data"]["reason"] == "session_key_in_use", answer
            container_is_untouched()

            # Without the token, or with a wrong one, even on A's very URL: 401, nothing else.
            for method, query, headers in (
                ("POST", "", {}),
                ("POST", f"&token={WRONG_TOKEN}", {}),
                ("POST", "", {"authorization": f"Bearer {WRONG_TOKEN}"}),
                ("GET", "", {}),
                ("DELETE", "", {"authorization": f"Bearer {WRONG_TOKEN}"}),
                ("DELETE", "", {}),
            ):
                target = f"/mcp/time/agent-k?mount={mine}:/workspace{query}"
                reply = trio.run(_http_without_the_token, running, method, target, headers)
                assert reply.status == 401, (method, query, headers, reply)
                assert reply.json()["error"]["data"]["reason"] in ("token_missing", "token_invalid")
            container_is_untouched()
        finally:
            assert owner.close() == 0


def test_a_keyed_session_registered_in_its_body_is_not_joined_by_its_key_alone(
    tmp_path: Path, project_root: Path, docker_client: docker.DockerClient
) -> None:
    """Its mounts are in no URL, so a client on the bare key would look like its owner: only
    the session id its registration was answered with reaches it."""
    mine = project_root / "mine"
    mine.mkdir()
    suite = write_suite(tmp_path / "suite.yaml", [str(project_root)])
    target = "/mcp/time/agent-r"

    async def as_owner(running: Orchestrator, body: dict[str, Any], session: str = "") -> Any:
        client = HttpClient(
            await trio.open_tcp_stream(*host_port(running)), headers=running.auth_header
        )
        try:
            headers = {"mcp-session-id": session} if session else {}
            return await client.request(
                "POST", target, body, headers=headers, accept="application/json"
            )
        finally:
            await client.aclose()

    with orchestrator(suite, tmp_path / "o.log") as running:
        registration = request(1, "fabric/registerClient", mount_of(mine))
        session = trio.run(as_owner, running, registration).json()["result"]["sessionId"]
        wait_until(
            lambda: len(containers_of(docker_client, instance=running.instance)) == 1,
            what="the registered session's container",
        )
        other = python2_client(f"{running.http_url}{target}")
        try:
            refused = other.ask({"op": "initialize"})
        finally:
            other.close()
        assert not refused["ok"], refused
        assert refused["error"]["code"] == -32004, refused
        assert refused["error"]["data"]["reason"] == "session_key_in_use", refused
        # The owner, with its session id, goes on in its one container.
        initialized = trio.run(as_owner, running, INITIALIZE, session)
        assert "result" in initialized.json(), initialized
        called = trio.run(
            as_owner,
            running,
            request(
                2, "tools/call", {"name": "get_current_time", "arguments": {"timezone": "UTC"}}
            ),
            session,
        )
        assert "result" in called.json(), called
        [container] = containers_of(docker_client, instance=running.instance)
        assert container.labels[LABEL_SESSION] == session
        assert mounted_directories(container, [mine]) == [(str(mine), "/workspace")]
