"""A session's container as a Pod: what maps, validated against Kubernetes' own schemas."""

from __future__ import annotations

import dataclasses
from typing import Any

import kubernetes_validate
import pytest

from reactor_fabric.config.structs import Security, Service
from reactor_fabric.policy.container_parts.context import RuntimeCapabilities
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.runtime.kubernetes_manifests import ManifestError, label_value, pod_manifest
from tests.unit.policy.test_container_spec import spec_for

KUBERNETES = "1.30.0"  # the oldest API server whose attach speaks v5 (half-close)
CLAIMS = {"/home": "homes", "/home/team/shared": "team-shared", "/srv/projects": "projects"}


def valid(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest, once the real schema of a Pod (strict: no unknown field) accepted it."""
    kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    return manifest


def server(manifest: dict[str, Any]) -> dict[str, Any]:
    [container] = manifest["spec"]["containers"]
    return dict(container)


def test_a_session_pod_runs_one_unprivileged_server_with_stdin_open_for_one_attach() -> None:
    pod = valid(pod_manifest(spec_for(Service(image="reactor-fabric/git:1")), namespace="mcp"))
    assert pod["metadata"]["name"] == "rf-git-0123456789ab-0"
    assert pod["metadata"]["namespace"] == "mcp"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    container = server(pod)
    assert (container["stdin"], container["stdinOnce"], container["tty"]) == (True, True, False)
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert (security["runAsUser"], security["runAsGroup"]) == (65534, 65534)
    assert security["runAsNonRoot"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}  # as Docker's default
    assert "args" not in container  # the image's own CMD
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["HOME"] == "/tmp"


def test_limits_are_reserved_and_the_read_only_root_keeps_a_bounded_tmp() -> None:
    service = Service(image="img", security=Security(read_only_rootfs=True))
    pod = valid(pod_manifest(spec_for(service), namespace="mcp"))
    container = server(pod)
    limits = container["resources"]["limits"]
    assert container["resources"]["requests"] == limits
    assert limits["memory"] == str(spec_for(service).memory_bytes)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    [tmp] = [v for v in pod["spec"]["volumes"] if "emptyDir" in v]
    assert tmp["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}
    assert {"name": tmp["name"], "mountPath": "/tmp"} in container["volumeMounts"]


def test_the_suites_command_replaces_the_images_cmd_not_its_entrypoint() -> None:
    pod = valid(pod_manifest(spec_for(Service(image="img", command=["--x", "1"])), namespace="n"))
    assert server(pod)["args"] == ["--x", "1"]
    assert "command" not in server(pod)


@pytest.mark.parametrize(
    ("pull", "policy"), [("never", "Never"), ("missing", "IfNotPresent"), ("always", "Always")]
)
def test_pull_maps_to_the_image_pull_policy(pull: str, policy: str) -> None:
    plain = spec_for(Service(image="img"))
    spec = dataclasses.replace(plain, program=dataclasses.replace(plain.program, pull=pull))
    assert server(valid(pod_manifest(spec, namespace="n")))["imagePullPolicy"] == policy


def test_a_mount_is_its_roots_claim_with_the_validated_path_as_sub_path() -> None:
    mounts = (
        MountSpec(source="/home/ann/project", target="/workspace"),
        MountSpec(source="/home/team/shared/docs", target="/projects/docs", read_only=True),
        MountSpec(source="/srv/projects", target="/projects/all"),
    )
    spec = spec_for(Service(image="img"), mounts=mounts)
    pod = valid(pod_manifest(spec, namespace="n", claims=CLAIMS))
    volumes = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    placed = {
        m["mountPath"]: (volumes[m["name"]], m.get("subPath"), m["readOnly"])
        for m in server(pod)["volumeMounts"]
        if m["name"] in volumes
    }
    assert placed == {
        "/workspace": ("homes", "ann/project", False),
        # The deepest root holds it: the team's own claim, not the homes'.
        "/projects/docs": ("team-shared", "docs", True),
        "/projects/all": ("projects", None, False),  # the whole claim
    }


def test_a_projects_guarded_git_is_a_read_only_sub_path_of_the_same_claim_after_the_project() -> (
    None
):
    mounts = (
        MountSpec(source="/home/ann/project", target="/workspace"),
        MountSpec(
            source="/home/ann/project/.git",
            target="/workspace/.git",
            read_only=True,
            git_guard=True,
        ),
    )
    spec = spec_for(Service(image="img"), mounts=mounts)
    pod = valid(pod_manifest(spec, namespace="n", claims=CLAIMS))
    claimed = [m for m in server(pod)["volumeMounts"] if m["name"].startswith("claim-")]
    assert [(m["mountPath"], m.get("subPath"), m["readOnly"]) for m in claimed] == [
        ("/workspace", "ann/project", False),
        ("/workspace/.git", "ann/project/.git", True),
    ]
    assert {m["name"] for m in claimed} == {"claim-0"}


def test_a_mount_no_claim_holds_is_refused() -> None:
    mounts = (MountSpec(source="/home2/ann", target="/workspace"),)  # /home2 is not in /home
    with pytest.raises(ManifestError, match="/home2/ann"):
        pod_manifest(spec_for(Service(image="img"), mounts=mounts), namespace="n", claims=CLAIMS)


def test_an_in_cluster_orchestrator_owns_its_pods_and_their_life_is_bounded() -> None:
    pod = valid(
        pod_manifest(
            spec_for(Service(image="img")),
            namespace="n",
            owner={"name": "reactor-fabric-7d9f", "uid": "0c1d2e3f-aaaa-bbbb-cccc-0123456789ab"},
            deadline_seconds=86_400,
        )
    )
    [reference] = pod["metadata"]["ownerReferences"]
    assert (reference["kind"], reference["name"]) == ("Pod", "reactor-fabric-7d9f")
    assert pod["spec"]["activeDeadlineSeconds"] == 86_400


def test_labels_become_valid_label_values() -> None:
    assert label_value("host.example:8080/x") == "host.example_8080_x"
    assert label_value("-" + "a" * 80) == "a" * 63
    assert label_value("0123abcd.b") == "0123abcd.b"  # a replica's session id stays readable
    labels = valid(pod_manifest(spec_for(Service(image="img")), namespace="n"))["metadata"][
        "labels"
    ]
    assert labels["reactor-fabric.managed"] == "true"


def test_a_non_numeric_user_is_refused() -> None:
    plain = spec_for(Service(image="img"))
    spec = dataclasses.replace(plain, program=dataclasses.replace(plain.program, user="node"))
    with pytest.raises(ManifestError, match="numeric"):
        pod_manifest(spec, namespace="n")


def test_the_schema_check_would_catch_a_field_kubernetes_does_not_know() -> None:
    pod = pod_manifest(spec_for(Service(image="img")), namespace="n")
    pod["spec"]["containers"][0]["stdinOpen"] = True  # Docker's name for it
    with pytest.raises(kubernetes_validate.ValidationError):
        valid(pod)


def test_a_gvisor_pod_names_the_suites_runtime_class_and_another_names_none() -> None:
    capabilities = RuntimeCapabilities(stdio="attach", gvisor_runtime="gvisor")
    isolated = spec_for(Service(image="x", isolation="gvisor"), capabilities=capabilities)
    assert valid(pod_manifest(isolated, namespace="ns"))["spec"]["runtimeClassName"] == "gvisor"
    plain = spec_for(Service(image="x"), capabilities=capabilities)
    assert "runtimeClassName" not in valid(pod_manifest(plain, namespace="ns"))["spec"]
