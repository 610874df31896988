"""The fake Kubernetes API server (tests/kube_fake), as the product's clients see it: kr8s for
the REST calls and watches, a WebSocket client (trio-websocket) for ``pods/attach``; the pods
run on the real Docker engine, the MCP server is the repository's time server image.

Every test ends with no Docker container of its fake left, checked after the fake's exit; the
tests of deletion also check that the deletion itself removed the container.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import kr8s
import kr8s.asyncio
import pytest
import trio
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    RejectConnection,
    RejectData,
)

from tests.fakes import RawWebSocket
from tests.integration.harness import BUNDLED
from tests.kube_fake import FakeKubernetes, fake_kubernetes
from tests.messages import INITIALIZE

pytestmark = pytest.mark.integration

IMAGE = BUNDLED["mcp_services"]["time"]["image"]
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
SUCCESS = {"metadata": {}, "status": "Success"}
# A user as the product's pods run (UNPRIVILEGED), everything dropped.
SECURITY = {
    "runAsUser": 65534,
    "runAsGroup": 65534,
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def manifest(
    name: str,
    *,
    command: Sequence[str] | None = None,
    image: str = IMAGE,
    pull: str = "Never",
    labels: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "server",
        "image": image,
        "imagePullPolicy": pull,
        "stdin": True,
        "stdinOnce": True,
        "tty": False,
        "securityContext": SECURITY,
        "volumeMounts": mounts or [],
    }
    if command is not None:
        container["command"] = list(command)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "kube-fake-test"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "containers": [container],
            "volumes": volumes or [],
            **spec,
        },
    }


def unschedulable(name: str, **labels: str) -> dict[str, Any]:
    """A pod that never reaches Docker: its claim does not exist."""
    return manifest(
        name,
        labels=labels,
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "missing"}}],
        mounts=[{"name": "data", "mountPath": "/data"}],
    )


@asynccontextmanager
async def running(
    tmp_path: Path, docker_client: docker.DockerClient, **options: Any
) -> AsyncIterator[tuple[FakeKubernetes, Any]]:
    """A fake API server and a kr8s client of it; afterwards no container of it is left."""
    projects = tmp_path / "projects"
    projects.mkdir(exist_ok=True)
    label = ""
    async with fake_kubernetes(claims={"projects": projects}, **options) as fake:
        label = fake.label
        api = await kr8s.asyncio.api(kubeconfig=str(fake.write_kubeconfig(tmp_path / "config")))
        try:
            yield fake, api
        finally:
            if api._session is not None:  # kr8s has no close of its own
                await api._session.aclose()
    left = docker_client.containers.list(all=True, filters={"label": label})
    assert not left, f"containers left: {[c.name for c in left]}"


async def create(api: Any, pod: dict[str, Any]) -> dict[str, Any]:
    async with api.call_api("POST", version="v1", namespace="default", url="pods", json=pod) as r:
        assert r.status_code == 201
        created: dict[str, Any] = r.json()
        return created


async def get(api: Any, name: str) -> dict[str, Any]:
    async with api.call_api("GET", version="v1", namespace="default", url=f"pods/{name}") as r:
        found: dict[str, Any] = r.json()
        return found


async def refusal(api: Any, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
    """The Status of a request kr8s reports as refused (a ServerError)."""
    with pytest.raises(kr8s.ServerError) as refused:
        async with api.call_api(method, version="v1", namespace="default", url=url, **kwargs):
            pass
    status: Any = refused.value.status  # kr8s types it str; for a 4xx it is the decoded body
    assert isinstance(status, dict)
    assert status["kind"] == "Status"
    response = refused.value.response
    assert response is not None
    assert response.status_code == status["code"]
    return status


WAIT_SECONDS = 30


async def watch(
    api: Any, params: dict[str, str], until: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The events of one watch, until one that ``until`` accepts (or until the watch ends).

    The iteration ends by a cancellation, not by breaking out: under trio, httpx's streamed
    body is a chain of async generators (aiter_lines, aiter_text, ..., httpcore's) that a
    break leaves to the garbage collector — a ResourceWarning each, even with ``aclosing`` on
    the outer one — while a cancellation runs every one of them to its end.
    """
    events: list[dict[str, Any]] = []
    with trio.fail_after(WAIT_SECONDS), trio.CancelScope() as enough:
        async with api.call_api(
            "GET", version="v1", namespace="default", url="pods", params=params, stream=True
        ) as response:
            async for line in response.aiter_lines():
                events.append(json.loads(line))
                if until(events[-1]):
                    enough.cancel()
    return events


async def wait_for(api: Any, name: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The pod as a watch shows it, once ``done`` says so."""
    params = {
        "watch": "true",
        "fieldSelector": f"metadata.name={name}",
        "timeoutSeconds": str(WAIT_SECONDS),
    }
    events = await watch(api, params, lambda event: done(event["object"]))
    found: list[dict[str, Any]] = [e["object"] for e in events if done(e["object"])]
    assert found, f"the watch of {name} ended first: {events}"
    return found[0]


def phase(wanted: str) -> Callable[[dict[str, Any]], bool]:
    return lambda pod: pod["status"].get("phase") == wanted


def waiting_reason(wanted: str) -> Callable[[dict[str, Any]], bool]:
    def done(pod: dict[str, Any]) -> bool:
        statuses = pod["status"].get("containerStatuses") or [{}]
        reason = statuses[0].get("state", {}).get("waiting", {}).get("reason")
        return bool(reason == wanted)

    return done


def attach_url(fake: FakeKubernetes, name: str, query: str | None = None) -> str:
    query = query or "container=server&stdin=true&stdout=true&stderr=true"
    return f"ws{fake.url.removeprefix('http')}/api/v1/namespaces/default/pods/{name}/attach?{query}"


class Attached:
    """An attach as the product makes it: a wsproto client over a trio stream
    (:class:`tests.fakes.RawWebSocket`; trio-websocket leaks its socket on a server's close)."""

    def __init__(self, client: RawWebSocket, subprotocol: str | None) -> None:
        self.client = client
        self.subprotocol = subprotocol
        self.close_code: int | None = None

    async def send(self, data: bytes) -> None:
        await self.client.send_bytes(data)

    async def message(self) -> bytes | None:
        """The next whole message; None once the server closed (answered, as clients do)."""
        data = b""
        with trio.fail_after(20):
            while True:
                event = await self.client.next_event()
                if isinstance(event, CloseConnection):
                    self.close_code = event.code
                    if self.client.ws.state is ConnectionState.REMOTE_CLOSING:
                        await self.client.stream.send_all(self.client.ws.send(event.response()))
                    return None
                assert isinstance(event, BytesMessage), event
                data += event.data
                if event.message_finished:
                    return data

    async def close(self) -> None:
        await self.client.stream.send_all(self.client.ws.send(CloseConnection(code=1000)))


async def connect(
    fake: FakeKubernetes, name: str, protocols: Sequence[str], query: str | None
) -> tuple[RawWebSocket, Any]:
    return await RawWebSocket.connect(
        attach_url(fake, name, query),
        headers=[(b"authorization", f"Bearer {fake.token}".encode())],
        subprotocols=list(protocols),
    )


@asynccontextmanager
async def attached(
    fake: FakeKubernetes, name: str, protocols: Sequence[str] = (V5, V4), query: str | None = None
) -> AsyncIterator[Attached]:
    client, answer = await connect(fake, name, protocols, query)
    try:
        assert isinstance(answer, AcceptConnection), answer
        yield Attached(client, answer.subprotocol)
    finally:
        await client.aclose()


async def refused_attach(
    fake: FakeKubernetes, name: str, protocols: Sequence[str] = (V5, V4), query: str | None = None
) -> tuple[int, bytes]:
    """The HTTP status and body of an attach refused before the upgrade."""
    client, answer = await connect(fake, name, protocols, query)
    try:
        assert isinstance(answer, RejectConnection), answer
        body = b""
        while answer.has_body:
            event = await client.next_event()
            assert isinstance(event, RejectData)
            body += event.data
            if event.body_finished:
                break
        return answer.status_code, body
    finally:
        await client.aclose()


async def message(ws: Attached) -> bytes:
    received = await ws.message()
    assert received is not None, "closed"
    return received


async def stdout_line(ws: Attached) -> dict[str, Any]:
    """The next line the server wrote, from channel-1 messages."""
    line = b""
    while not line.endswith(b"\n"):
        received = await message(ws)
        if received[:1] == b"\x01":
            line += received[1:]
    answer: dict[str, Any] = json.loads(line)
    return answer


async def until_closed(ws: Attached) -> list[bytes]:
    """The messages left until the server closes the WebSocket."""
    received = []
    while (data := await ws.message()) is not None:
        received.append(data)
    return received


def status_of(messages: list[bytes]) -> dict[str, Any]:
    statuses = [m[1:] for m in messages if m[:1] == b"\x03" and len(m) > 1]
    assert len(statuses) == 1, messages
    status: dict[str, Any] = json.loads(statuses[0])
    return status


# --- the API ---------------------------------------------------------------------------------


async def test_the_version_answers_with_the_token_and_refuses_unauthorized_without_it(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        version = await api.version()
        assert version["gitVersion"] == "v1.30.0-fake"
        assert (version["major"], version["minor"]) == ("1", "30")
        # Discovery, as kr8s's get() reads it first.
        assert {"namespaces", "pods"} <= {r["name"] for r in await api.api_resources()}

        async with httpx.AsyncClient(base_url=fake.url) as anonymous:
            response = await anonymous.get("/version")
        assert response.status_code == 401
        assert response.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }

        # kr8s with a wrong token: it re-reads its credentials and retries 3 times, then fails.
        config = fake.write_kubeconfig(tmp_path / "wrong")
        config.write_text(config.read_text().replace(fake.token, "not-the-token"))
        before = sum(1 for _, target, code in fake.requests if code == 401)
        with pytest.raises(kr8s.ServerError) as refused:
            await kr8s.asyncio.api(kubeconfig=str(config))
        assert refused.value.response is not None
        assert refused.value.response.status_code == 401
        assert sum(1 for _, target, code in fake.requests if code == 401) - before == 4
        # The Api that failed keeps its httpx session (and a pooled connection) open, and
        # nobody holds it but the traceback: closed here, or its socket leaks.
        failed = {
            id(frame.f_locals["self"]): frame.f_locals["self"]
            for frame, _ in traceback.walk_tb(refused.value.__traceback__)
            if isinstance(frame.f_locals.get("self"), kr8s.asyncio.Api)
        }
        assert len(failed) == 1
        for leftover in failed.values():
            await leftover._session.aclose()


async def test_a_pod_runs_the_time_server_and_answers_initialize_over_a_v5_attach(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        created = await create(api, manifest("time-1"))
        assert created["status"]["phase"] == "Pending"
        assert created["metadata"]["uid"]
        assert created["metadata"]["resourceVersion"]
        assert created["metadata"]["creationTimestamp"].endswith("Z")

        pod = await wait_for(api, "time-1", phase("Running"))
        container = pod["status"]["containerStatuses"][0]
        assert container["ready"] is True
        assert "startedAt" in container["state"]["running"]
        assert {"type": "Ready", "status": "True"}.items() <= pod["status"]["conditions"][2].items()

        async with attached(fake, "time-1") as ws:
            assert ws.subprotocol == V5
            assert await message(ws) == b"\x01"  # the open stream's empty message
            await ws.send(b"\x00" + json.dumps(INITIALIZE).encode() + b"\n")
            answer = await stdout_line(ws)
            assert answer["id"] == 1
            assert answer["result"]["serverInfo"]["name"] == "mcp-time"
            await ws.send(b"\xff\x00")  # v5: close stdin; the server sees EOF
            rest = await until_closed(ws)
            assert status_of(rest) == SUCCESS
            assert ws.close_code == 1000

        ended = await wait_for(api, "time-1", phase("Succeeded"))
        terminated = ended["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")


async def test_a_non_zero_exit_ends_the_attach_with_success_and_fails_the_pod_with_its_code(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        await create(api, manifest("exit-3", command=["sh", "-c", "read line; exit 3"]))
        await wait_for(api, "exit-3", phase("Running"))
        async with attached(fake, "exit-3") as ws:
            assert await message(ws) == b"\x01"
            await ws.send(b"\xff\x00")
            # As the kubelet's ServeAttach: attach reports Success; the code is the pod's.
            assert status_of(await until_closed(ws)) == SUCCESS
        failed = await wait_for(api, "exit-3", phase("Failed"))
        terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")


async def test_a_v4_attach_ends_the_servers_stdin_when_the_client_closes(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        await create(api, manifest("time-v4"))
        await wait_for(api, "time-v4", phase("Running"))
        async with attached(fake, "time-v4", protocols=(V4,)) as ws:
            assert ws.subprotocol == V4
            assert await message(ws) == b"\x01"
            await ws.send(b"\x00" + json.dumps(INITIALIZE).encode() + b"\n")
            assert (await stdout_line(ws))["id"] == 1
            await ws.close()  # v4 has no half-close: closing ends stdin
            assert await until_closed(ws) == []  # the server's answer to our close
        ended = await wait_for(api, "time-v4", phase("Succeeded"))
        assert ended["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


async def test_attach_to_a_pod_that_is_not_running_is_refused_as_the_kubelet_refuses_it(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        await create(api, manifest("no-image", image="reactor-fabric/absent:1"))
        await wait_for(api, "no-image", waiting_reason("ErrImageNeverPull"))
        await create(api, unschedulable("nowhere"))

        # v4 goes to the kubelet, whose refusal the API server passes through.
        assert await refused_attach(fake, "no-image", protocols=(V4,)) == (
            500,
            b'container not found ("server")',
        )

        # v5 is upgraded by the API server first: the refusal is a status, then the close.
        async with attached(fake, "no-image") as ws:
            messages = await until_closed(ws)
        assert messages[0] == b"\x01"
        status = status_of(messages)
        assert (status["status"], status["reason"], status["code"]) == (
            "Failure",
            "InternalError",
            500,
        )
        assert 'container not found ("server")' in status["message"]

        for name, protocols, query, code in [
            ("no-image", ("v3.channel.k8s.io",), None, 403),  # no protocol both speak
            ("no-image", (V5,), "container=server", 400),  # none of stdin, stdout, stderr
            ("no-image", (V5,), "container=other&stdout=1", 400),
            ("nowhere", (V5,), None, 400),  # not scheduled: no host
            ("absent", (V5,), None, 404),
        ]:
            refused = await refused_attach(fake, name, protocols, query)
            assert refused[0] == code, (name, protocols, query, refused)
        async with httpx.AsyncClient(
            base_url=fake.url, headers={"authorization": f"Bearer {fake.token}"}
        ) as plain:
            response = await plain.get(
                "/api/v1/namespaces/default/pods/no-image/attach?stdout=true"
            )
        assert response.status_code == 400
        assert response.json()["message"] == "Upgrade request required"


async def test_a_missing_image_waits_with_the_reason_its_pull_policy_gives(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        await create(api, manifest("never", image="reactor-fabric/absent:1", pull="Never"))
        await create(api, manifest("missing", image="reactor-fabric/absent:1", pull="IfNotPresent"))
        never = await wait_for(api, "never", waiting_reason("ErrImageNeverPull"))
        assert never["status"]["phase"] == "Pending"
        assert never["status"]["containerStatuses"][0]["state"]["waiting"]["message"] == (
            'Container image "reactor-fabric/absent:1" is not present with pull policy of Never'
        )
        await wait_for(api, "missing", waiting_reason("ErrImagePull"))
        missing = await wait_for(api, "missing", waiting_reason("ImagePullBackOff"))
        assert missing["status"]["phase"] == "Pending"


async def test_a_second_pod_of_the_same_name_is_refused_with_409_already_exists(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        await create(api, unschedulable("twice"))
        status = await refusal(api, "POST", "pods", json=unschedulable("twice"))
        assert (status["reason"], status["code"]) == ("AlreadyExists", 409)
        assert status["message"] == 'pods "twice" already exists'
        assert status["details"] == {"name": "twice", "kind": "pods"}


async def test_an_invalid_pod_is_refused_with_422_and_its_field_causes(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        status = await refusal(api, "POST", "pods", json=manifest("Not_A_Name"))
        assert (status["reason"], status["code"]) == ("Invalid", 422)
        assert status["message"].startswith('Pod "Not_A_Name" is invalid: metadata.name: Invalid')
        assert status["details"]["causes"][0]["field"] == "metadata.name"

        # What the API refuses in a subPath, and what the fake cannot honour.
        pod = manifest(
            "refused",
            volumes=[
                {"name": "data", "persistentVolumeClaim": {"claimName": "projects"}},
                {"name": "host", "hostPath": {"path": "/etc"}},
            ],
            mounts=[
                {"name": "data", "mountPath": "/a", "subPath": "/etc"},
                {"name": "data", "mountPath": "/b", "subPath": "x/../../etc"},
            ],
        )
        pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        pod["spec"]["containers"].append(dict(pod["spec"]["containers"][0], name="second"))
        status = await refusal(api, "POST", "pods", json=pod)
        causes = {(c["field"], c["reason"]) for c in status["details"]["causes"]}
        assert {
            ("spec.volumes[1].hostPath", "FieldValueForbidden"),
            ("spec.containers", "FieldValueForbidden"),
            ("spec.containers[0].securityContext.privileged", "FieldValueForbidden"),
            ("spec.containers[0].volumeMounts[0].subPath", "FieldValueInvalid"),
            ("spec.containers[0].volumeMounts[1].subPath", "FieldValueInvalid"),
        } <= causes
        async with api.call_api("GET", version="v1", namespace="default", url="pods") as r:
            assert r.json()["items"] == []


async def test_pods_are_listed_by_label_and_field_selectors(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        await create(api, unschedulable("a", tier="one", team="x"))
        await create(api, unschedulable("b", tier="two", team="x"))
        await create(api, unschedulable("c", tier="one"))

        async def names(**params: str) -> list[str]:
            async with api.call_api(
                "GET", version="v1", namespace="default", url="pods", params=params
            ) as r:
                listed = r.json()
            assert listed["kind"] == "PodList"
            assert int(listed["metadata"]["resourceVersion"]) > 0
            return [item["metadata"]["name"] for item in listed["items"]]

        assert await names() == ["a", "b", "c"]
        assert await names(labelSelector="tier=one") == ["a", "c"]
        assert await names(labelSelector="tier=one,team=x") == ["a"]
        assert await names(labelSelector="tier!=one") == ["b"]
        assert await names(labelSelector="team") == ["a", "b"]
        assert await names(labelSelector="!team") == ["c"]
        assert await names(labelSelector="tier in (two,three)") == ["b"]
        assert await names(fieldSelector="metadata.name=b") == ["b"]
        assert await names(fieldSelector="status.phase=Pending", labelSelector="team=x") == [
            "a",
            "b",
        ]
        status = await refusal(api, "GET", "pods", params={"fieldSelector": "spec.image=x"})
        assert status["message"] == "field label not supported: spec.image"

        pod = await get(api, "a")
        scheduled = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert scheduled[0]["status"] == "False"
        assert scheduled[0]["reason"] == "Unschedulable"
        assert 'persistentvolumeclaim "missing" not found' in scheduled[0]["message"]


async def test_a_watch_from_a_resource_version_replays_only_what_came_after_it(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        await create(api, unschedulable("before"))
        await wait_for(api, "before", lambda p: bool(p["status"].get("conditions")))
        async with api.call_api("GET", version="v1", namespace="default", url="pods") as r:
            version = r.json()["metadata"]["resourceVersion"]
        await create(api, unschedulable("after"))

        params = {"watch": "1", "resourceVersion": version, "timeoutSeconds": "1"}
        events = await watch(api, params, lambda _event: False)  # until the watch's timeout
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "after"),
            ("MODIFIED", "after"),  # Unschedulable
        ]
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert versions == sorted(versions)
        assert versions[0] > int(version)


async def test_a_watcher_that_never_reads_is_closed_without_stalling_the_others(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client, watch_queue=4) as (fake, api):
        port = int(fake.url.rsplit(":", 1)[1])
        stalled = trio.socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await stalled.connect(("127.0.0.1", port))
        request = (
            "GET /api/v1/namespaces/default/pods?watch=1 HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nAuthorization: Bearer {fake.token}\r\n\r\n"
        )
        await stalled.send(request.encode())

        big = "x" * 100_000  # each event is about 100 kB: the stalled reader's buffers fill
        seen: set[str] = set()
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:

                async def healthy() -> None:
                    def all_seen(event: dict[str, Any]) -> bool:
                        seen.add(event["object"]["metadata"]["name"])
                        return len(seen) == 30

                    await watch(api, {"watch": "1", "timeoutSeconds": "25"}, all_seen)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(healthy)
                await fake.store.watching(2)  # the stalled watch and the healthy one
                for index in range(30):
                    pod = unschedulable(f"big-{index}")
                    pod["metadata"]["annotations"] = {"padding": big}
                    await create(api, pod)
        assert len(seen) == 30

        # The stalled watch was closed by the server: what it had buffered, then EOF.
        with trio.fail_after(10):
            while await stalled.recv(65536):
                pass
        stalled.close()


# --- the kubelet's side ----------------------------------------------------------------------


async def test_deleting_a_pod_ends_its_attach_stops_and_removes_its_container_then_it_is_gone(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        await create(api, manifest("doomed", command=["sh", "-c", "read line"]))
        await wait_for(api, "doomed", phase("Running"))
        container_id = fake.pods["doomed"].container_id
        assert container_id is not None
        assert docker_client.containers.get(container_id).status == "running"

        async with attached(fake, "doomed") as ws:
            assert await message(ws) == b"\x01"
            async with api.call_api(
                "DELETE", version="v1", namespace="default", url="pods/doomed",
                params={"gracePeriodSeconds": "1"},
            ) as r:  # fmt: skip
                deleted = r.json()
            assert deleted["metadata"]["deletionTimestamp"].endswith("Z")
            assert deleted["metadata"]["deletionGracePeriodSeconds"] == 1
            assert status_of(await until_closed(ws)) == SUCCESS

        # The watch from the deletion on: the container's end, then DELETED.
        params = {
            "watch": "1",
            "fieldSelector": "metadata.name=doomed",
            "resourceVersion": deleted["metadata"]["resourceVersion"],
            "timeoutSeconds": "15",
        }
        events = await watch(api, params, lambda event: event["type"] == "DELETED")
        assert events[-1]["type"] == "DELETED"
        last = events[-1]["object"]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert last["exitCode"] in (137, 143)  # sh ignores SIGTERM as PID 1: killed at grace
        status = await refusal(api, "GET", "pods/doomed")
        assert (status["reason"], status["code"]) == ("NotFound", 404)
        assert status["message"] == 'pods "doomed" not found'
        assert await fake.docker_containers() == []
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(container_id)
        status = await refusal(api, "DELETE", "pods/doomed")
        assert status["code"] == 404


@pytest.mark.docker_only(
    "the fake's mapping is checked on Docker: Podman's inspect does not report StdinOnce"
)
async def test_the_pod_spec_is_mapped_onto_the_docker_container(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        (tmp_path / "projects" / "repo").mkdir()
        pod = manifest(
            "mapped",
            command=["sh", "-c", "read line"],
            labels={"reactor-fabric.managed": "true", "reactor-fabric.session": "s-1"},
            volumes=[
                {"name": "work", "persistentVolumeClaim": {"claimName": "projects"}},
                {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            ],
            mounts=[
                {"name": "work", "mountPath": "/workspace", "subPath": "repo"},
                {"name": "work", "mountPath": "/more", "subPath": "new/dir", "readOnly": True},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
        )
        container = pod["spec"]["containers"][0]
        container["args"] = ["$(GREETING) world", "$$(GREETING)"]
        container["env"] = [
            {"name": "GREETING", "value": "hello"},
            {"name": "DERIVED", "value": "$(GREETING)-$(UNDEFINED)"},
        ]
        container["securityContext"] = {**SECURITY, "readOnlyRootFilesystem": True}
        container["resources"] = {"limits": {"memory": "256Mi", "cpu": "500m"}}
        await create(api, pod)
        running_pod = await wait_for(api, "mapped", phase("Running"))
        assert running_pod["status"]["qosClass"] == "Guaranteed"
        container_id = fake.pods["mapped"].container_id
        assert container_id is not None
        inspected = docker_client.api.inspect_container(container_id)
        config, host = inspected["Config"], inspected["HostConfig"]
        assert inspected["Name"] == f"/k8s_server_mapped_default_{running_pod['metadata']['uid']}_0"
        assert config["Entrypoint"] == ["sh", "-c", "read line"]
        assert config["Cmd"] == ["hello world", "$(GREETING)"]
        assert "DERIVED=hello-$(UNDEFINED)" in config["Env"]
        assert "KUBERNETES_SERVICE_HOST=10.96.0.1" in config["Env"]
        assert config["User"] == "65534:65534"
        assert (config["OpenStdin"], config["StdinOnce"], config["Tty"]) == (True, True, False)
        assert config["Hostname"] == "mapped"
        assert config["Labels"]["reactor-fabric.managed"] == "true"  # the leak check sees it
        assert config["Labels"]["io.kubernetes.pod.name"] == "mapped"
        assert config["Labels"]["reactor-fabric.kube-fake"] == fake.instance
        assert host["NetworkMode"] == "none"
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["ReadonlyRootfs"] is True
        assert host["Memory"] == host["MemorySwap"] == 256 * 2**20
        assert host["NanoCpus"] == 500_000_000
        assert host["CpuShares"] == 512
        assert host["Tmpfs"]["/tmp"] == f"rw,exec,mode=0777,size={64 * 2**20}"
        binds = {m["Target"]: m for m in host["Mounts"]}
        assert binds["/workspace"]["Source"] == str((tmp_path / "projects" / "repo").resolve())
        assert binds["/more"]["ReadOnly"] is True
        assert (tmp_path / "projects" / "new" / "dir").is_dir()  # made, as the kubelet does
        async with api.call_api(
            "DELETE", version="v1", namespace="default", url="pods/mapped",
            params={"gracePeriodSeconds": "0"},
        ):  # fmt: skip
            pass
        assert "mapped" not in fake.pods  # grace 0: gone at once


async def test_a_sub_path_that_escapes_its_volume_through_a_symlink_fails_the_container_config(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        outside = tmp_path / "outside"
        outside.mkdir()
        os.symlink(outside, tmp_path / "projects" / "escape")
        pod = manifest(
            "escaping",
            volumes=[{"name": "work", "persistentVolumeClaim": {"claimName": "projects"}}],
            mounts=[{"name": "work", "mountPath": "/workspace", "subPath": "escape/inner"}],
        )
        await create(api, pod)
        failed = await wait_for(api, "escaping", waiting_reason("CreateContainerConfigError"))
        waiting = failed["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["message"] == (
            'failed to prepare subPath for volumeMount "work" of container "server"'
        )
        assert failed["status"]["phase"] == "Pending"
        assert not (outside / "inner").exists()


async def test_active_deadline_seconds_kills_the_pod_as_deadline_exceeded(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        pod = manifest(
            "deadline",
            command=["sh", "-c", "read line"],
            activeDeadlineSeconds=1,
            terminationGracePeriodSeconds=1,
        )
        await create(api, pod)
        failed = await wait_for(api, "deadline", lambda p: p["status"].get("reason") is not None)
        assert failed["status"]["phase"] == "Failed"
        assert failed["status"]["reason"] == "DeadlineExceeded"
        terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] in (137, 143)


@pytest.mark.docker_only(
    "the fake's mapping is checked on Docker: Podman 4.3 on cgroupfs does not report "
    "OOMKilled, so the fake cannot tell an OOM kill from a SIGKILL there"
)
async def test_a_container_over_its_memory_limit_ends_oom_killed(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        pod = manifest("greedy", command=["python3", "-c", "b = bytearray(300 * 2**20)"])
        pod["spec"]["containers"][0]["resources"] = {"limits": {"memory": "32Mi"}}
        await create(api, pod)
        failed = await wait_for(api, "greedy", phase("Failed"))
        terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (137, "OOMKilled")


# --- Secrets ---------------------------------------------------------------------------------


def secret_manifest(name: str, data: dict[str, str], **labels: str) -> dict[str, Any]:
    """A Secret whose ``data`` is given in clear (encoded here, as clients must)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": labels or {"app": "kube-fake-test"}},
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


async def create_secret(api: Any, secret: dict[str, Any]) -> dict[str, Any]:
    async with api.call_api(
        "POST", version="v1", namespace="default", url="secrets", json=secret
    ) as r:
        assert r.status_code == 201
        created: dict[str, Any] = r.json()
        return created


async def delete_secret(api: Any, name: str) -> dict[str, Any]:
    async with api.call_api(
        "DELETE", version="v1", namespace="default", url=f"secrets/{name}"
    ) as r:
        deleted: dict[str, Any] = r.json()
        return deleted


async def test_secrets_are_created_read_listed_and_deleted_as_the_api_server_does(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        assert {"secrets"} <= {r["name"] for r in await api.api_resources()}
        secret = secret_manifest("creds", {"TOKEN": "t0ken"}, tier="a")
        secret["stringData"] = {"PLAIN": "in clear", "TOKEN": "from stringData"}
        created = await create_secret(api, secret)
        # stringData merged into data (its keys win), and not stored; type defaulted.
        assert created["data"] == {
            "PLAIN": base64.b64encode(b"in clear").decode(),
            "TOKEN": base64.b64encode(b"from stringData").decode(),
        }
        assert "stringData" not in created
        assert created["type"] == "Opaque"
        assert created["metadata"]["uid"]
        assert int(created["metadata"]["resourceVersion"]) > 0
        await create_secret(api, secret_manifest("other", {"K": "v"}, tier="b"))

        async with api.call_api("GET", version="v1", namespace="default", url="secrets/creds") as r:
            assert r.json() == created
        async with api.call_api(
            "GET", version="v1", namespace="default", url="secrets",
            params={"labelSelector": "tier=a"},
        ) as r:  # fmt: skip
            listing = r.json()
        assert listing["kind"] == "SecretList"
        assert [item["metadata"]["name"] for item in listing["items"]] == ["creds"]
        async with api.call_api(
            "GET", version="v1", namespace="default", url="secrets",
            params={"fieldSelector": "metadata.name!=creds,type=Opaque"},
        ) as r:  # fmt: skip
            assert [item["metadata"]["name"] for item in r.json()["items"]] == ["other"]

        status = await refusal(api, "POST", "secrets", json=secret_manifest("creds", {"K": "v"}))
        assert (status["reason"], status["code"]) == ("AlreadyExists", 409)
        assert status["message"] == 'secrets "creds" already exists'
        assert status["details"] == {"name": "creds", "kind": "secrets"}

        # Deleted at once: a Status, not the object (no graceful deletion for Secrets).
        status = await refusal(
            api, "DELETE", "secrets/creds", json={"preconditions": {"uid": "not-its-uid"}}
        )
        assert (status["reason"], status["code"]) == ("Conflict", 409)
        assert await delete_secret(api, "creds") == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": "creds", "kind": "secrets", "uid": created["metadata"]["uid"]},
        }
        assert set(fake.secrets) == {"other"}
        for method in ("GET", "DELETE"):
            status = await refusal(api, method, "secrets/creds")
            assert (status["reason"], status["code"]) == ("NotFound", 404)
            assert status["message"] == 'secrets "creds" not found'


async def test_a_secret_the_api_server_would_refuse_is_refused_with_its_status(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        # data values are base64: the JSON decoder refuses anything else (400, not 422).
        bad = secret_manifest("bad-base64", {})
        bad["data"] = {"TOKEN": "not base64!"}
        status = await refusal(api, "POST", "secrets", json=bad)
        assert (status["reason"], status["code"]) == ("BadRequest", 400)
        assert status["message"] == (
            'Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input '
            "byte 3"
        )
        unpadded = secret_manifest("unpadded", {})
        unpadded["data"] = {"TOKEN": "YQ"}
        assert (await refusal(api, "POST", "secrets", json=unpadded))["code"] == 400

        invalid = secret_manifest("Not_A_Name", {"bad key": "v", "..dots": "v", "ok.key-1": "v"})
        status = await refusal(api, "POST", "secrets", json=invalid)
        assert (status["reason"], status["code"]) == ("Invalid", 422)
        assert status["message"].startswith('Secret "Not_A_Name" is invalid: [metadata.name: ')
        assert status["details"]["kind"] == "Secret"
        causes = {(c["field"], c["reason"]) for c in status["details"]["causes"]}
        assert causes == {
            ("metadata.name", "FieldValueInvalid"),
            ("data[bad key]", "FieldValueInvalid"),
            ("data[..dots]", "FieldValueInvalid"),
        }

        elsewhere = secret_manifest("elsewhere", {"K": "v"})
        elsewhere["metadata"]["namespace"] = "other"
        assert (await refusal(api, "POST", "secrets", json=elsewhere))["code"] == 400
        assert fake.secrets == {}


# A container that reports what a secret gave it (env, file, volume) and ends.
REPORT = r"""
import json, os, stat
found = {"env": os.environ.get("TOKEN"), "groups": sorted(os.getgroups()), "gid": os.getgid()}
for path in ("/run/secrets/TOKEN", "/run/secrets/nested/key"):
    info = os.stat(path)
    found[path] = {"text": open(path).read(), "mode": stat.S_IMODE(info.st_mode),
                   "uid": info.st_uid, "gid": info.st_gid,
                   "link": os.path.islink(path)}
found["listing"] = sorted(os.listdir("/run/secrets"))
for line in open("/proc/self/mounts"):
    if line.split()[1] == "/run/secrets":
        found["mount"] = line.split()[2:4]
try:
    open("/run/secrets/new", "w")
except OSError as exc:
    found["write"] = exc.strerror
print(json.dumps(found))
"""


def secret_pod(name: str, secret: str = "creds", **spec: Any) -> dict[str, Any]:
    """A pod with TOKEN from ``secret`` as a variable and as files of a secret volume."""
    pod = manifest(
        name,
        command=["python3", "-c", REPORT],
        volumes=[
            {
                "name": "secrets",
                "secret": {
                    "secretName": secret,
                    "defaultMode": 0o400,
                    "items": [
                        {"key": "TOKEN", "path": "TOKEN"},
                        {"key": "TOKEN", "path": "nested/key", "mode": 0o600},
                    ],
                },
            }
        ],
        mounts=[{"name": "secrets", "mountPath": "/run/secrets"}],
        securityContext={"fsGroup": 65534},
        **spec,
    )
    pod["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "TOKEN"}}},
        {"name": "DERIVED", "value": "$(TOKEN)!"},
    ]
    return pod


def report_of(docker_client: docker.DockerClient, fake: FakeKubernetes, name: str) -> Any:
    container_id = fake.pods[name].container_id
    assert container_id is not None
    return json.loads(docker_client.containers.get(container_id).logs(stderr=False))


async def test_a_pod_gets_a_secret_as_env_and_as_read_only_memory_files_owned_per_fs_group(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        await create_secret(api, secret_manifest("creds", {"TOKEN": "s3cret-value"}))
        created = await create(api, secret_pod("reader"))
        ended = await wait_for(api, "reader", phase("Succeeded"))
        report = report_of(docker_client, fake, "reader")
        assert report["env"] == "s3cret-value"
        # The kubelet's fsGroup: a supplementary group of the process, the files' group.
        assert 65534 in report["groups"]
        token = report["/run/secrets/TOKEN"]
        assert token["text"] == "s3cret-value"
        # defaultMode 0400, group-readable by fsGroup; the kubelet writes as root.
        assert (token["mode"], token["uid"], token["gid"]) == (0o440, 0, 65534)
        assert token["link"] is True  # NAME -> ..data/NAME, the atomic writer's layout
        nested = report["/run/secrets/nested/key"]
        assert (nested["mode"], nested["gid"]) == (0o640, 65534)  # the item's own mode
        assert [n for n in report["listing"] if not n.startswith("..")] == ["TOKEN", "nested"]
        # Memory-backed and read-only, whatever the mount says.
        assert report["mount"][0] == "tmpfs"
        assert "ro" in report["mount"][1].split(",")
        assert report["write"] == "Read-only file system"

        # The API holds references only: the value is in no pod object, and not in what the
        # engine shows of the container's mounts (its environment has it, as a kubelet's).
        for pod in (created, ended, await get(api, "reader")):
            assert "s3cret-value" not in json.dumps(pod)
            assert base64.b64encode(b"s3cret-value").decode() not in json.dumps(pod)
        container_id = fake.pods["reader"].container_id
        assert container_id is not None
        inspected = docker_client.api.inspect_container(container_id)
        [bind] = [m for m in inspected["Mounts"] if m["Destination"] == "/run/secrets"]
        assert bind["Source"].startswith("/dev/shm/")
        assert bind["RW"] is False
        host_dir = trio.Path(bind["Source"])
        assert await host_dir.is_dir()

        async with api.call_api(
            "DELETE", version="v1", namespace="default", url="pods/reader",
            params={"gracePeriodSeconds": "0"},
        ):  # fmt: skip
            pass
        with trio.fail_after(WAIT_SECONDS):
            while await host_dir.exists():  # noqa: ASYNC110 (torn down in the background)
                await trio.sleep(0.05)


async def test_a_pod_waits_for_its_missing_secret_or_key_as_the_kubelet_reports_it(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (fake, api):
        # The volume's Secret is mounted first: without it the pod stays ContainerCreating.
        await create(api, secret_pod("patient"))
        waiting = await wait_for(
            api,
            "patient",
            lambda p: "MountVolume" in json.dumps(p["status"].get("containerStatuses")),
        )
        state = waiting["status"]["containerStatuses"][0]["state"]["waiting"]
        assert state == {
            "reason": "ContainerCreating",
            "message": 'MountVolume.SetUp failed for volume "secrets" : secret "creds" not found',
        }
        # A Secret without the key: the volume's item refers to a key it lacks.
        await create_secret(api, secret_manifest("creds", {"OTHER": "x"}))
        waiting = await wait_for(
            api, "patient", lambda p: "non-existent" in json.dumps(p["status"])
        )
        assert waiting["status"]["containerStatuses"][0]["state"]["waiting"]["message"] == (
            'MountVolume.SetUp failed for volume "secrets" : references non-existent secret '
            "key: TOKEN"
        )
        await delete_secret(api, "creds")
        await create_secret(api, secret_manifest("creds", {"TOKEN": "at last"}))
        await wait_for(api, "patient", phase("Succeeded"))
        assert report_of(docker_client, fake, "patient")["env"] == "at last"

        # An environment variable's Secret is read when the container is made: missing, it is
        # CreateContainerConfigError, with the kubelet's words.
        env_only = manifest("env-only", command=["sh", "-c", "echo $TOKEN"])
        env_only["spec"]["containers"][0]["env"] = [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "TOKEN"}}},
            {"name": "SKIPPED", "valueFrom": {
                "secretKeyRef": {"name": "gone", "key": "X", "optional": True}}},
        ]  # fmt: skip
        await create(api, env_only)
        failed = await wait_for(api, "env-only", waiting_reason("CreateContainerConfigError"))
        assert failed["status"]["containerStatuses"][0]["state"]["waiting"]["message"] == (
            'secret "gone" not found'
        )
        assert failed["status"]["phase"] == "Pending"
        await create_secret(api, secret_manifest("gone", {"OTHER": "x"}))
        failed = await wait_for(
            api, "env-only", lambda p: "couldn't find" in json.dumps(p["status"])
        )
        assert failed["status"]["containerStatuses"][0]["state"]["waiting"]["message"] == (
            "couldn't find key TOKEN in Secret default/gone"
        )
        await delete_secret(api, "gone")
        await create_secret(api, secret_manifest("gone", {"TOKEN": "found"}))
        await wait_for(api, "env-only", phase("Succeeded"))
        container_id = fake.pods["env-only"].container_id
        assert container_id is not None
        assert docker_client.containers.get(container_id).logs() == b"found\n"


async def test_a_pod_with_invalid_secret_references_is_refused_with_its_field_causes(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with running(tmp_path, docker_client) as (_fake, api):
        pod = secret_pod("refused")
        pod["spec"]["securityContext"]["fsGroup"] = -1
        volume = pod["spec"]["volumes"][0]["secret"]
        volume["defaultMode"] = 0o1000
        volume["items"] = [{"key": "", "path": "../escape", "mode": 0o777}]
        pod["spec"]["containers"][0]["env"] = [
            {
                "name": "BOTH",
                "value": "x",
                "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
            },
            {"name": "NONE", "valueFrom": {}},
            {"name": "BADKEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a b"}}},
            {"name": "FIELD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ]
        status = await refusal(api, "POST", "pods", json=pod)
        causes = {(c["field"], c["reason"]) for c in status["details"]["causes"]}
        assert causes == {
            ("spec.securityContext.fsGroup", "FieldValueInvalid"),
            ("spec.volumes[0].secret.defaultMode", "FieldValueInvalid"),
            ("spec.volumes[0].secret.items[0].key", "FieldValueRequired"),
            ("spec.volumes[0].secret.items[0].path", "FieldValueInvalid"),
            ("spec.containers[0].env[0].valueFrom", "FieldValueInvalid"),
            ("spec.containers[0].env[1].valueFrom", "FieldValueInvalid"),
            ("spec.containers[0].env[2].valueFrom.secretKeyRef.key", "FieldValueInvalid"),
            ("spec.containers[0].env[3].valueFrom.fieldRef", "FieldValueForbidden"),
        }
        messages = [c["message"] for c in status["details"]["causes"]]
        assert (
            "Invalid value: 512: must be a number between 0 and 0777 (octal), both inclusive"
            in (messages)
        )
        assert 'Invalid value: "": may not be specified when `value` is not empty' in messages
