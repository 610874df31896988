"""The orchestrator's own image (``images/orchestrator``, ``scripts/build-images orchestrator``),
run the way ``deploy/kubernetes/deployment.yaml`` runs it, with the suite of
``deploy/kubernetes/configmap.yaml``, against the fake API server of ``tests/kube_fake``.

What the deployment relies on is checked on the image itself: its ``command`` and ``args``, a
non-root numeric user, a read-only root with only the Deployment's volumes writable, no
capability, no new privileges, no Docker client or socket; and that the bundled configuration
works in it: a real client (the Python SDK 1.x over WebSocket) reaches a server in a session pod
that mounts the client's project from the claim, the pod names the orchestrator's pod as its
owner, and a stop (SIGTERM, as the kubelet sends) deletes it.

The image runs in the host's network namespace only so that it reaches the fake API server on
loopback (in a cluster it reaches the API server through its Service): the Deployment's
``--host=0.0.0.0`` becomes ``127.0.0.1`` for the same reason, and ``--port`` a free port.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.harness import REPO, TEST_TOKEN, python_client, text_of, wait_until
from tests.integration.test_kubernetes_e2e import Cluster, fake_cluster_in_a_thread

pytestmark = pytest.mark.integration

DEPLOY = REPO / "deploy" / "kubernetes"
VERSION = re.search(r'"(.+)"', (REPO / "reactor_fabric" / "_version.py").read_text())
IMAGE = f"reactor-fabric:{VERSION.group(1) if VERSION else '?'}"
CLAIM = "reactor-fabric-projects"
POD_NAME = "reactor-fabric-7d4b9c-x2v5q"
POD_UID = "6f1c2a44-0b7e-4c1e-9a55-2f0d8e1b7c3a"


def deployment_container() -> dict[str, Any]:
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def configmap_suite() -> str:
    configmap = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())
    return str(configmap["data"]["claude-mcp-suite.yaml"])


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout


def container_logs(name: str) -> str:
    """What the container wrote, stdout (where it says where it serves) and stderr (its log)."""
    done = subprocess.run(
        ["docker", "logs", name], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def image() -> str:
    if not docker("image", "inspect", IMAGE, check=False):
        pytest.fail(f"{IMAGE} is missing: scripts/build-images orchestrator (make test does it)")
    return IMAGE


def run_as_deployed(
    image: str, name: str, *, suite: Path, projects: Path, kubeconfig: Path, token: str
) -> list[str]:
    """``docker run`` arguments that give the container what the Deployment gives its pod."""
    container = deployment_container()
    security = container["securityContext"]
    pod_security = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())["spec"]["template"][
        "spec"
    ]["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    args = [
        re.sub(r"^--host=.*", "--host=127.0.0.1", re.sub(r"^--port=.*", "--port=0", arg))
        for arg in container["args"]
    ]
    # An optional Secret's variable (the specialist's API key) is left unset when the Secret is
    # absent, as here.
    env = {
        e["name"]: e.get("value")
        for e in container["env"]
        if not e.get("valueFrom", {}).get("secretKeyRef", {}).get("optional")
    }
    # What the downward API and the Secret would fill in.
    env.update(
        REACTOR_FABRIC_TOKEN=token,
        REACTOR_FABRIC_POD_NAME=POD_NAME,
        REACTOR_FABRIC_POD_UID=POD_UID,
        REACTOR_FABRIC_POD_NAMESPACE="default",
        REACTOR_FABRIC_POD_IP="127.0.0.1",
        # In a cluster kr8s reads the service account; here the fake's kubeconfig.
        KUBECONFIG="/etc/kube/config",
    )
    assert all(value is not None for value in env.values()), env
    return [
        "run",
        "--detach",
        f"--name={name}",
        "--network=host",
        f"--user={pod_security['runAsUser']}:{pod_security['runAsGroup']}",
        "--read-only",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        # The Deployment's emptyDir volumes (world-writable, as the kubelet makes them): the
        # only places it may write.
        f"--tmpfs={mounts['tmp']['mountPath']}:mode=1777",
        f"--tmpfs={mounts['state']['mountPath']}:mode=1777",
        f"--volume={suite}:{mounts['suite']['mountPath']}:ro",
        f"--volume={projects}:{mounts['projects']['mountPath']}:ro",
        f"--volume={kubeconfig}:/etc/kube/config:ro",
        *(f"--env={key}={value}" for key, value in env.items()),
        f"--entrypoint={container['command'][0]}",
        image,
        *container["command"][1:],
        *args,
    ]


@pytest.fixture
def deployed(
    image: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Cluster, Path]]:
    """The image serving the Deployment's suite against the fake: (its URL, the cluster, the
    projects directory, owned by the Deployment's user as the claim's files should be)."""
    uid = int(deployment_container()["securityContext"].get("runAsUser", 1000))
    projects = tmp_path_factory.mktemp("projects")
    os.chown(projects, uid, uid)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "claude-mcp-suite.yaml").write_text(configmap_suite())
    kubeconfig = tmp_path / "kubeconfig"
    name = f"reactor-fabric-image-test-{secrets.token_hex(4)}"
    with fake_cluster_in_a_thread({CLAIM: projects}, kubeconfig) as cluster:
        kubeconfig.chmod(0o644)
        docker(
            *run_as_deployed(
                image, name, suite=suite, projects=projects, kubeconfig=kubeconfig, token=TEST_TOKEN
            )
        )
        try:
            url = ""

            def serving() -> bool:
                nonlocal url
                found = re.search(r"on (http://[^ ]+) ", container_logs(name))
                url = found.group(1) if found else ""
                running = docker("inspect", "--format", "{{.State.Running}}", name)
                assert running.strip() == "true", container_logs(name)[-3000:]
                return bool(url)

            wait_until(serving, what="the orchestrator in its image to serve")
            yield url, cluster, projects
        finally:
            docker("stop", "--time=30", name, check=False)
            logs = container_logs(name)
            code = docker("inspect", "--format", "{{.State.ExitCode}}", name, check=False)
            docker("rm", "--force", name, check=False)
        assert code.strip() == "0", logs[-3000:]
        wait_until(lambda: not cluster.pods(), what="the session pods to be deleted at the stop")


def test_the_image_runs_as_a_non_root_user_with_no_docker_client_in_it(image: str) -> None:
    config = json.loads(docker("image", "inspect", image))[0]["Config"]
    assert config["User"] == "1000:1000"  # numeric: runAsNonRoot can check it
    assert config["Entrypoint"] == deployment_container()["command"]
    found = docker(
        "run",
        "--rm",
        "--read-only",
        "--entrypoint=/bin/sh",
        image,
        "-c",
        "command -v docker dockerd podman kubectl || true",
    )
    assert found.strip() == ""


def test_the_deployments_suite_serves_a_client_from_a_pod_that_mounts_its_project(
    deployed: tuple[str, Cluster, Path],
) -> None:
    url, cluster, projects = deployed
    uid = int(deployment_container()["securityContext"].get("runAsUser", 1000))
    project = projects / "alpha"
    project.mkdir()
    (project / "notes.txt").write_text("written on the claim\n")
    for path in (project, project / "notes.txt"):
        os.chown(path, uid, uid)
    # The path as the orchestrator sees it: below the claim's mount in its own pod.
    mounts = json.dumps([{"source": "/projects/alpha", "target": "/workspace", "readOnly": True}])
    ws_url = "ws" + url.removeprefix("http")
    client = python_client(f"{ws_url}/mcp/filesystem", "--register", mounts)
    try:
        registered = client.read_json()
        assert registered["ok"], registered
        session = registered["result"]["sessionId"]
        assert client.ask({"op": "initialize"})["ok"]
        listed = client.ask(
            {"op": "call", "name": "list_directory", "arguments": {"path": "/workspace"}}
        )
        assert listed["ok"], listed
        assert "notes.txt" in text_of(listed)
        [pod] = cluster.pods(**{"reactor-fabric.session": session})
        # Removed with the orchestrator's pod by the garbage collector.
        assert pod["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": POD_NAME,
                "uid": POD_UID,
                "blockOwnerDeletion": False,
            }
        ]
        [volume_mount] = [
            m
            for m in pod["spec"]["containers"][0]["volumeMounts"]
            if m["mountPath"] == "/workspace"
        ]
        assert volume_mount["subPath"] == "alpha"
        assert volume_mount["readOnly"] is True
    finally:
        assert client.close() == 0
