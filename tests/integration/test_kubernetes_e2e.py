"""End to end on Kubernetes: the real orchestrator with ``runtime: kubernetes``, real MCP clients,
and a cluster — the in-process fake API server of ``tests/kube_fake`` (every pod a container on
the real Docker engine; its docstring says what it does not do as a cluster would), or a real
cluster when ``REACTOR_FABRIC_KUBECONFIG`` names one (see "Against a real cluster" below).

What a client sees is asserted, and what the cluster holds: the pods, by their labels, through
the API server — the same view an operator's ``kubectl get pods -l ...`` gives.

Against a real cluster (kind, minikube, k3s or any other; the images of ``make images`` loaded
into it, e.g. ``kind load docker-image reactor-fabric/mcp-server-time:TAG``):
``REACTOR_FABRIC_KUBECONFIG=~/.kube/config REACTOR_FABRIC_KUBERNETES_NAMESPACE=rf-test
.venv/bin/pytest tests/integration/test_kubernetes_e2e.py``. The namespace must exist and the
kubeconfig's user hold the Role of ``deploy/kubernetes/role.yaml`` there. Tests that mount a
project need a claim the test machine can write to and are run against the fake only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import signal
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import kr8s
import pytest
import trio

from tests.integration.harness import (
    Orchestrator,
    build_test_image,
    git_repo,
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
from tests.integration.test_bounds_e2e import websocket
from tests.kube_fake import FakeKubernetes, fake_kubernetes
from tests.messages import request

pytestmark = pytest.mark.integration

REAL_KUBECONFIG = os.environ.get("REACTOR_FABRIC_KUBECONFIG", "")
REAL_NAMESPACE = os.environ.get("REACTOR_FABRIC_KUBERNETES_NAMESPACE", "default")
CLAIM = "projects"
LABEL_SESSION = "reactor-fabric.session"
LABEL_MANAGED = "reactor-fabric.managed"
LABEL_SERVICE = "reactor-fabric.service"
LABEL_INSTANCE = "reactor-fabric.instance"


@dataclass
class Cluster:
    """Where the pods run, as the tests reach it: the kubeconfig the orchestrator is given
    (the tests list pods through it too, with kr8s), and the namespace."""

    kind: str  # "fake" or "real"
    kubeconfig: Path
    namespace: str
    fake: FakeKubernetes | None = None

    def pods(self, **labels: str) -> list[dict[str, Any]]:
        """The pods carrying ``labels`` (with the managed label), as the API server lists them:
        the fake's with its token (it serves no discovery), a real one's through kr8s."""
        selector = ",".join(f"{k}={v}" for k, v in {LABEL_MANAGED: "true", **labels}.items())
        if self.fake is not None:
            query = urllib.parse.urlencode({"labelSelector": selector})
            request = urllib.request.Request(
                f"{self.fake.url}/api/v1/namespaces/{self.namespace}/pods?{query}",
                headers={"Authorization": f"Bearer {self.fake.token}"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                pods: list[dict[str, Any]] = json.load(response)["items"]
        else:
            api = kr8s.api(kubeconfig=str(self.kubeconfig))
            found = api.get("pods", namespace=self.namespace, label_selector=selector)
            pods = [dict(pod.raw) for pod in found if not isinstance(pod, dict)]
        return [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]

    def secrets(self, **labels: str) -> list[dict[str, Any]]:
        """The Secrets carrying ``labels`` (with the managed label), as the API server lists
        them."""
        selector = ",".join(f"{k}={v}" for k, v in {LABEL_MANAGED: "true", **labels}.items())
        if self.fake is not None:
            query = urllib.parse.urlencode({"labelSelector": selector})
            request = urllib.request.Request(
                f"{self.fake.url}/api/v1/namespaces/{self.namespace}/secrets?{query}",
                headers={"Authorization": f"Bearer {self.fake.token}"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                found: list[dict[str, Any]] = json.load(response)["items"]
                return found
        api = kr8s.api(kubeconfig=str(self.kubeconfig))
        listed = api.get("secrets", namespace=self.namespace, label_selector=selector)
        return [dict(secret.raw) for secret in listed if not isinstance(secret, dict)]


@contextmanager
def fake_cluster_in_a_thread(claims: dict[str, Path], kubeconfig: Path) -> Iterator[Cluster]:
    """The fake API server on a trio loop of its own (the orchestrator is another process)."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        try:
            async with fake_kubernetes(claims=claims, namespace="default") as api:
                api.write_kubeconfig(kubeconfig)
                state["api"] = api
                state["trio_token"] = trio.lowlevel.current_trio_token()
                state["stop"] = stop = trio.Event()
                ready.set()
                await stop.wait()
        except BaseException as exc:
            state["error"] = exc
            ready.set()
            raise

    thread = threading.Thread(target=trio.run, args=(serve,), name="fake-kubernetes")
    thread.start()
    try:
        ready.wait(60)
        if "error" in state:
            raise state["error"]
        api: FakeKubernetes = state["api"]
        yield Cluster("fake", kubeconfig, "default", fake=api)
    finally:
        if "stop" in state:
            trio.from_thread.run_sync(state["stop"].set, trio_token=state["trio_token"])
        thread.join(120)
        assert not thread.is_alive(), "the fake API server did not stop"


@pytest.fixture(params=["fake", "real"])
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, project_root: Path
) -> Iterator[Cluster]:
    if request.param == "real":
        if not REAL_KUBECONFIG:
            pytest.skip(
                "no real cluster: set REACTOR_FABRIC_KUBECONFIG (and "
                "REACTOR_FABRIC_KUBERNETES_NAMESPACE) to run these against one"
            )
        yield Cluster("real", Path(REAL_KUBECONFIG).expanduser(), REAL_NAMESPACE)
        return
    with fake_cluster_in_a_thread({CLAIM: project_root}, tmp_path / "kubeconfig") as fake:
        yield fake


def on_cluster(cluster: Cluster, project_root: Path) -> dict[str, Any]:
    """The suite's settings for the cluster (the project root its claim)."""
    return {
        "runtime": "kubernetes",
        "kubernetes": {
            "kubeconfig": str(cluster.kubeconfig),
            "namespace": cluster.namespace,
            "volumes": {str(project_root): CLAIM},
            "start_timeout": "60s",
        },
    }


def kubernetes_suite(tmp_path: Path, cluster: Cluster, project_root: Path, **fields: Any) -> Path:
    return write_suite(
        tmp_path / "suite.yaml", [str(project_root)], **on_cluster(cluster, project_root), **fields
    )


def every_pod_deleted(cluster: Cluster) -> None:
    wait_until(lambda: not cluster.pods(), what="every session pod to be deleted")


fabric = orchestrator_fixture(given=on_cluster, after=every_pod_deleted)


@pytest.fixture
def on_kubernetes(fabric: Orchestrator, cluster: Cluster) -> tuple[Orchestrator, Cluster]:
    return fabric, cluster


def mounts(source: Path, target: str = "/workspace") -> str:
    return json.dumps([{"source": str(source), "target": target, "readOnly": False}])


def test_the_fabric_endpoint_calls_a_tool_in_a_pod_of_its_own_that_goes_with_the_session(
    on_kubernetes: tuple[Orchestrator, Cluster],
) -> None:
    running, cluster = on_kubernetes
    session = time_call_through_fabric(python2_client(f"{running.http_url}/mcp"))
    wait_until(
        lambda: not cluster.pods(**{LABEL_SESSION: session}),
        what="the session's pod to be deleted after the client left",
    )
    started = [e for e in running.logs() if e["event"] == "container_started"]
    assert started, "no container_started in the log"


def test_two_clients_on_kubernetes_each_see_only_their_own_repository(
    on_kubernetes: tuple[Orchestrator, Cluster], project_root: Path
) -> None:
    running, cluster = on_kubernetes
    if cluster.kind == "real":
        pytest.skip("mounts need a claim this machine can write to: the fake's only")
    repo_a = git_repo(project_root / "alpha", ["alpha: first commit", "alpha: second commit"])
    repo_b = git_repo(project_root / "beta", ["beta: only commit"])
    url = f"{running.ws_url}/mcp/git"
    client_a = python_client(url, "--register", mounts(repo_a))
    client_b = ts_client(url, "--register", mounts(repo_b))
    try:
        sessions = []
        for client, mine, other in ((client_a, "alpha", "beta"), (client_b, "beta", "alpha")):
            registered = client.read_json()
            assert registered["ok"], registered
            sessions.append(registered["result"]["sessionId"])
            assert client.ask({"op": "initialize"})["ok"]
            log = client.ask(
                {"op": "call", "name": "git_log", "arguments": {"repo_path": "/workspace"}}
            )
            assert log["ok"], log
            assert f"{mine}: " in text_of(log)
            assert other not in text_of(log)
        for session, repo in zip(sessions, (repo_a, repo_b), strict=True):
            [pod] = cluster.pods(**{LABEL_SESSION: session})
            [mount] = [
                m
                for m in pod["spec"]["containers"][0]["volumeMounts"]
                if m["mountPath"] == "/workspace"
            ]
            assert mount["subPath"] == repo.name  # the path below the claim's root
            assert pod["spec"]["containers"][0]["securityContext"]["capabilities"] == {
                "drop": ["ALL"]
            }
    finally:
        assert client_a.close() == 0
        assert client_b.close() == 0


def test_a_missing_image_is_image_not_found_for_the_client_and_leaves_no_pod(
    tmp_path: Path, cluster: Cluster, project_root: Path
) -> None:
    suite = kubernetes_suite(tmp_path, cluster, project_root)
    text = suite.read_text().replace(
        "image: reactor-fabric/mcp-server-time", "image: reactor-fabric/no-such-image"
    )
    suite.write_text(text)
    with orchestrator(suite, tmp_path / "o.log") as running:
        client = python_client(f"{running.ws_url}/mcp/time")
        try:
            answer = client.ask({"op": "initialize"})
        finally:
            client.close()
        assert answer["error"]["code"] == -32002
        assert answer["error"]["data"]["reason"] == "image_not_found"
        assert "ErrImageNeverPull" in answer["error"]["data"]["detail"]
        wait_until(lambda: not cluster.pods(), what="the failed pod to be deleted")


def test_sigterm_deletes_the_session_pods_and_exits_0(
    tmp_path: Path, cluster: Cluster, project_root: Path
) -> None:
    suite = kubernetes_suite(tmp_path, cluster, project_root)
    with orchestrator(suite, tmp_path / "o.log", expect_clean_exit=False) as running:
        client = python_client(f"{running.ws_url}/mcp/time", "--register", "[]")
        try:
            session = client.read_json()["result"]["sessionId"]
            assert client.ask({"op": "initialize"})["ok"]
            assert cluster.pods(**{LABEL_SESSION: session})
            running.process.send_signal(signal.SIGTERM)
            assert running.process.wait(timeout=60) == 0
        finally:
            client.close()
    wait_until(lambda: not cluster.pods(), what="the session pod to be deleted")


def test_pods_left_by_a_killed_orchestrator_are_swept_by_the_next(
    tmp_path: Path, cluster: Cluster, project_root: Path
) -> None:
    suite = kubernetes_suite(tmp_path, cluster, project_root)
    with orchestrator(suite, tmp_path / "first.log", expect_clean_exit=False) as first:
        client = python_client(f"{first.ws_url}/mcp/time", "--register", "[]")
        try:
            session = client.read_json()["result"]["sessionId"]
            assert client.ask({"op": "initialize"})["ok"]
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(timeout=30)
        finally:
            client.close()
    assert cluster.pods(**{LABEL_SESSION: session}), "the killed orchestrator's pod is gone"
    with orchestrator(suite, tmp_path / "second.log") as second:
        wait_until(
            lambda: not cluster.pods(**{LABEL_SESSION: session}),
            what="the orphaned pod to be swept",
        )
        swept = [e for e in second.logs() if e["event"] == "orphan_removed"]
        assert swept, "the second orchestrator logged no orphan_removed"


def test_an_idle_pod_is_deleted_and_the_session_resumes_in_a_new_one(
    tmp_path: Path, cluster: Cluster, project_root: Path
) -> None:
    suite = kubernetes_suite(tmp_path, cluster, project_root, timeouts={"time": "3s"})
    with orchestrator(suite, tmp_path / "o.log") as running:
        client = python_client(f"{running.ws_url}/mcp/time", "--register", "[]")
        try:
            session = client.read_json()["result"]["sessionId"]
            assert client.ask({"op": "initialize"})["ok"]
            [first] = cluster.pods(**{LABEL_SESSION: session})
            wait_until(
                lambda: not cluster.pods(**{LABEL_SESSION: session}),
                what="the idle pod to be deleted",
            )
            answer = client.ask(
                {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
            )
            assert answer["ok"], answer
            [second] = cluster.pods(**{LABEL_SESSION: session})
            assert second["metadata"]["name"] != first["metadata"]["name"]
        finally:
            assert client.close() == 0


def test_the_fake_runs_pods_on_docker_with_the_pods_labels(
    on_kubernetes: tuple[Orchestrator, Cluster], docker_client: docker.DockerClient
) -> None:
    """The fake's pods are real containers: what the tests above assert of pods is what runs."""
    running, cluster = on_kubernetes
    if cluster.kind == "real":
        pytest.skip("about the fake only")
    client = python_client(f"{running.ws_url}/mcp/time", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        [pod] = cluster.pods(**{LABEL_SESSION: session})
        [container] = docker_client.containers.list(filters={"label": f"{LABEL_SESSION}={session}"})
        # Podman names a local image with its "localhost/" registry.
        image = container.attrs["Config"]["Image"].removeprefix("localhost/")
        assert image == pod["spec"]["containers"][0]["image"]
        assert container.attrs["HostConfig"]["ReadonlyRootfs"] is True
        assert container.attrs["Config"]["User"] == "{}:{}".format(
            pod["spec"]["containers"][0]["securityContext"]["runAsUser"],
            pod["spec"]["containers"][0]["securityContext"]["runAsGroup"],
        )
    finally:
        assert client.close() == 0


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_secret_reaches_the_server_in_its_pod_only_by_reference_and_goes_with_the_orchestrator(
    tmp_path: Path, cluster: Cluster, project_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service's secrets on Kubernetes: a Secret of its own, which the pod names (a
    ``secretKeyRef`` variable, a ``secret`` volume at /run/secrets); the server reads them as
    on Docker, the pod as the API server stores it holds no value, and the Secret is deleted
    when the orchestrator stops. A service whose secret is missing is refused alone."""
    probe_image = build_test_image("probe")
    env_value = "rf-k8s-env-" + secrets.token_hex(16)
    file_value = "rf-k8s-file-" + secrets.token_hex(16)
    secret_file = tmp_path / "db-password"
    secret_file.write_text(file_value + "\n")
    secret_file.chmod(0o600)
    suite = kubernetes_suite(
        tmp_path,
        cluster,
        project_root,
        test_services={
            "probe": {
                "image": probe_image,
                "secrets": {
                    "GITHUB_TOKEN": {"env": "RF_E2E_K8S_TOKEN"},
                    "DB_PASSWORD": {"file": str(secret_file), "as": "file"},
                },
            },
            "needy": {
                "image": probe_image,
                "secrets": {"API_KEY": {"env": "RF_E2E_K8S_UNSET"}},
            },
        },
    )
    env = {"RF_E2E_K8S_TOKEN": env_value}
    monkeypatch.delenv("RF_E2E_K8S_UNSET", raising=False)

    async def ask(running: Orchestrator) -> dict[str, Any]:
        ws = await websocket(running, "/mcp/probe")
        seen: dict[str, Any] = {}
        await ws.send_json(request(1, "secret", {"name": "GITHUB_TOKEN"}))
        seen["token"] = (await ws.hear())["result"]
        await ws.send_json(request(2, "secret", {"name": "DB_PASSWORD"}))
        seen["password"] = (await ws.hear())["result"]
        # While the session runs: its pod and the service's Secret, as the API server has them.
        seen["pods"] = cluster.pods(**{LABEL_SERVICE: "probe"})
        seen["secrets"] = cluster.secrets(**{LABEL_INSTANCE: running.instance[:63]})
        await ws.aclose()
        # The service whose secret is missing: refused before anything is made for it.
        needy = await websocket(running, "/mcp/needy")
        await needy.send_json(request(1, "secret", {"name": "API_KEY"}))
        seen["needy"] = await needy.hear()
        seen["needy_pods"] = cluster.pods(**{LABEL_SERVICE: "needy"})
        await needy.aclose()
        return seen

    with orchestrator(suite, tmp_path / "orchestrator.log", env=env) as running:
        seen = trio.run(ask, running)
        instance = running.instance[:63]

    token, password = seen["token"], seen["password"]
    # As the variable, and as a file of the Secret volume: in memory, the server's group may
    # read it (a Secret volume's files are root's; the pod's fsGroup is the server's group).
    assert token["env_sha256"] == sha(env_value)
    assert token["file"] == {
        "sha256": sha(env_value),
        "uid": 0,
        "gid": token["gid"],
        "mode": 0o440,
        "fs": "tmpfs",
    }
    assert password["env_sha256"] is None  # as: file
    assert password["file"]["sha256"] == sha(file_value)
    assert (password["file"]["mode"], password["file"]["gid"]) == (0o440, password["gid"])

    # The pod holds references only; the Secret holds the values, labelled like the pods.
    [secret] = seen["secrets"]
    name = secret["metadata"]["name"]
    assert secret["metadata"]["labels"][LABEL_SERVICE] == "probe"
    decoded = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert decoded == {"GITHUB_TOKEN": env_value, "DB_PASSWORD": file_value}
    assert seen["pods"]
    for pod in seen["pods"]:
        text = json.dumps(pod)
        for value in (env_value, file_value):
            assert value not in text
            assert base64.b64encode(value.encode()).decode() not in text
        [container] = pod["spec"]["containers"]
        variables = {entry["name"]: entry for entry in container["env"]}
        assert variables["GITHUB_TOKEN"] == {
            "name": "GITHUB_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": name, "key": "GITHUB_TOKEN"}},
        }
        assert "DB_PASSWORD" not in variables
        [volume] = [v for v in pod["spec"]["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == name

    # The service whose secret is missing: -32002 secret_unavailable, no pod, no Secret.
    assert seen["needy"]["error"]["code"] == -32002
    assert seen["needy"]["error"]["data"]["reason"] == "secret_unavailable"
    assert "RF_E2E_K8S_UNSET" in seen["needy"]["error"]["message"]
    assert seen["needy_pods"] == []
    assert [s["metadata"]["labels"][LABEL_SERVICE] for s in seen["secrets"]] == ["probe"]

    # The Secret went with the orchestrator.
    assert cluster.secrets(**{LABEL_INSTANCE: instance}) == []


def test_a_file_secret_is_readable_by_a_server_whose_user_names_no_group(
    tmp_path: Path, cluster: Cluster, project_root: Path
) -> None:
    """``user: "65534"`` (a uid alone): the server's group is then the image's for that uid
    (nogroup), and a Secret volume's files are root's — the pod's fsGroup must still give
    them to the server, as the Docker runtime gives them to uid:uid."""
    probe_image = build_test_image("probe")
    value = "rf-k8s-uid-" + secrets.token_hex(16)
    suite = kubernetes_suite(
        tmp_path,
        cluster,
        project_root,
        test_services={
            "probe": {
                "image": probe_image,
                "user": "65534",
                "secrets": {"DB_PASSWORD": {"env": "RF_E2E_K8S_PASSWORD", "as": "file"}},
            }
        },
    )

    async def ask(running: Orchestrator) -> dict[str, Any]:
        ws = await websocket(running, "/mcp/probe")
        await ws.send_json(request(1, "secret", {"name": "DB_PASSWORD"}))
        found: dict[str, Any] = (await ws.hear())["result"]
        await ws.aclose()
        return found

    with orchestrator(
        suite, tmp_path / "orchestrator.log", env={"RF_E2E_K8S_PASSWORD": value}
    ) as running:
        found = trio.run(ask, running)
    assert found["file_error"] is None
    assert found["uid"] == 65534
    assert found["file"]["sha256"] == sha(value)
    assert (found["file"]["uid"], found["file"]["gid"], found["file"]["mode"]) == (0, 65534, 0o440)
