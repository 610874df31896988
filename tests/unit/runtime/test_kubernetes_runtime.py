"""Choosing the Kubernetes runtime, and what it decides before any API call."""

from __future__ import annotations

import pytest

from reactor_fabric._cli_parser import build_parser
from reactor_fabric._runtime_choice import (
    POD_NAME_ENV,
    POD_NAMESPACE_ENV,
    POD_UID_ENV,
    engine_runtime,
)
from reactor_fabric.config.structs import Kubernetes, Orchestrator, Service, Suite
from reactor_fabric.config.suite import check_suite_text
from reactor_fabric.runtime.engines import EngineAddressError
from reactor_fabric.runtime.kubernetes import KubernetesRuntime, PodOwner
from reactor_fabric.runtime.kubernetes_manifests import pod_name


def kubernetes_suite(roots: list[str], volumes: dict[str, str]) -> Suite:
    return Suite(
        version="1.0",
        orchestrator=Orchestrator(
            allowed_mount_roots=roots,
            runtime="kubernetes",
            kubernetes=Kubernetes(namespace="mcp", volumes=volumes, start_timeout="45s"),
        ),
        mcp_services={"time": Service(image="reactor-fabric/mcp-server-time:x")},
    )


def test_the_suite_selects_kubernetes_with_its_namespace_claims_and_start_bound() -> None:
    runtime = engine_runtime(kubernetes_suite(["/projects"], {"/projects": "work"}), None, {})
    assert isinstance(runtime, KubernetesRuntime)
    assert (runtime.name, runtime.namespace) == ("kubernetes", "mcp")
    assert runtime.claims == {"/projects": "work"}
    assert runtime.start_timeout == 45.0
    assert runtime.owner is None
    assert runtime.capabilities.mounts_on_host_reach_containers is False


def test_in_the_cluster_the_orchestrators_own_pod_owns_the_session_pods() -> None:
    environ = {POD_NAME_ENV: "reactor-fabric-7d9f", POD_UID_ENV: "0b6c-uid"}
    runtime = engine_runtime(kubernetes_suite([], {}), None, environ)
    assert isinstance(runtime, KubernetesRuntime)
    assert runtime.owner == PodOwner("reactor-fabric-7d9f", "0b6c-uid")
    assert runtime._owner_reference() == {"name": "reactor-fabric-7d9f", "uid": "0b6c-uid"}


def test_an_orchestrator_in_another_namespace_owns_no_session_pod() -> None:
    # The garbage collector would take an owner in another namespace for gone at once.
    environ = {POD_NAME_ENV: "rf-1", POD_UID_ENV: "u-1", POD_NAMESPACE_ENV: "platform"}
    runtime = engine_runtime(kubernetes_suite([], {}), None, environ)  # sessions in "mcp"
    assert isinstance(runtime, KubernetesRuntime)
    assert runtime._owner_reference() is None
    environ[POD_NAMESPACE_ENV] = "mcp"
    same = engine_runtime(kubernetes_suite([], {}), None, environ)
    assert isinstance(same, KubernetesRuntime)
    assert same._owner_reference() == {"name": "rf-1", "uid": "u-1"}


def test_an_allowed_mount_root_without_a_claim_refuses_to_start() -> None:
    suite = kubernetes_suite(["/projects", "/srv/data"], {"/projects": "work"})
    with pytest.raises(EngineAddressError, match="/srv/data"):
        engine_runtime(suite, None, {})


def test_the_flag_selects_kubernetes_over_the_suites_docker() -> None:
    suite = kubernetes_suite([], {})
    docker_suite = Suite(
        version=suite.version,
        orchestrator=Orchestrator(allowed_mount_roots=[], kubernetes=Kubernetes(namespace="x")),
        mcp_services=suite.mcp_services,
    )
    assert isinstance(engine_runtime(docker_suite, "kubernetes", {}), KubernetesRuntime)
    parser = build_parser({"REACTOR_FABRIC_RUNTIME": "kubernetes"})
    assert parser.parse_args([]).runtime == "kubernetes"


def test_the_kubernetes_block_is_checked_like_the_rest_of_the_suite() -> None:
    text = (
        'version: "1.0"\n'
        "orchestrator:\n"
        '  allowed_mount_roots: ["/projects"]\n'
        "  runtime: kubernetes\n"
        "  kubernetes:\n"
        "    namespace: Not_A_Namespace\n"
        "    volumes: {projects: work}\n"
        "    start_timeout: soon\n"
        "mcp_services: {time: {image: t}}\n"
    )
    check = check_suite_text(text, source="suite.yaml")
    assert check.suite is None
    flagged = {issue.path for issue in check.issues}
    assert "orchestrator.kubernetes.namespace" in flagged
    assert "orchestrator.kubernetes.start_timeout" in flagged
    assert any(path.startswith("orchestrator.kubernetes.volumes") for path in flagged)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("rf-time-0123456789ab-0", "rf-time-0123456789ab-0"),
        ("rf-my_tool-0123456789ab-0", None),
        ("rf-my-tool-0123456789ab-0", "rf-my-tool-0123456789ab-0"),
    ],
)
def test_pod_names_are_dns_names_and_services_differing_by_an_underscore_do_not_collide(
    name: str, expected: str | None
) -> None:
    named = pod_name(name)
    if expected is not None:
        assert named == expected
    else:
        assert named.startswith("rf-my-tool-0123456789ab-0-")
        assert named != pod_name("rf-my-tool-0123456789ab-0")
        assert named == pod_name(name)  # the same every time: a removal finds it
