"""Egress on Kubernetes without a cluster: a pod's NetworkPolicy (validated against Kubernetes'
own schema, and admitted by the fake API server as kube-apiserver admits one), what the fake's
kubelet makes of policies for a pod, and the runtime's settings."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from reactor_fabric._errors import ContainerStartFailure
from reactor_fabric._reasons import EGRESS_UNAVAILABLE
from reactor_fabric._runtime_choice import engine_runtime
from reactor_fabric.config.structs import (
    Kubernetes,
    KubernetesEgressProxy,
    Orchestrator,
    Service,
    Suite,
)
from reactor_fabric.runtime.engines import EngineAddressError
from reactor_fabric.runtime.kubernetes import KubernetesRuntime
from reactor_fabric.runtime.kubernetes_manifests import (
    LABEL_EGRESS_POD,
    network_policy_manifest,
    pod_manifest,
)
from tests.kube_fake.api import ApiError
from tests.kube_fake.network_policies import (
    Allowed,
    admit_network_policy,
    egress_of,
    iptables_rules,
)
from tests.unit.policy.test_container_spec import spec_for
from tests.unit.runtime.test_kubernetes_manifests import KUBERNETES

OWNER = {"name": "reactor-fabric-7d9f", "uid": "0c1d2e3f-aaaa-bbbb-cccc-0123456789ab"}


def egress_pod(sequence: int = 0) -> dict[str, Any]:
    spec = spec_for(Service(image="img", egress=["api.github.com:443"]), sequence=sequence)
    return pod_manifest(spec, namespace="mcp", owner=OWNER)


def policy_of(pod: dict[str, Any]) -> dict[str, Any]:
    return network_policy_manifest(pod, proxy_address="10.244.0.7", proxy_port=3128)


def test_a_pods_policy_selects_that_pod_alone_and_lets_it_reach_the_proxy_alone() -> None:
    pod, other = egress_pod(0), egress_pod(1)
    policy = policy_of(pod)
    kubernetes_validate.validate(policy, KUBERNETES, strict=True)
    assert policy["metadata"]["name"] == pod["metadata"]["name"]
    assert policy["metadata"]["labels"] == pod["metadata"]["labels"]
    assert policy["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]
    assert policy["spec"] == {
        "podSelector": {
            "matchLabels": {LABEL_EGRESS_POD: pod["metadata"]["labels"][LABEL_EGRESS_POD]}
        },
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [
            {
                "to": [{"ipBlock": {"cidr": "10.244.0.7/32"}}],
                "ports": [{"protocol": "TCP", "port": 3128}],
            }
        ],
    }
    assert (
        other["metadata"]["labels"][LABEL_EGRESS_POD] != pod["metadata"]["labels"][LABEL_EGRESS_POD]
    )


def test_a_pod_without_egress_carries_no_egress_label() -> None:
    pod = pod_manifest(spec_for(Service(image="img")), namespace="mcp")
    assert LABEL_EGRESS_POD not in pod["metadata"]["labels"]


def test_an_ipv6_proxy_is_one_address_too() -> None:
    policy = network_policy_manifest(egress_pod(), proxy_address="fd00::7", proxy_port=3128)
    assert policy["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "fd00::7/128"}}]


# --- the fake API server's admission and its kubelet's reading ---------------------------------


def test_the_fake_admits_the_runtimes_policy_as_given_with_server_fields() -> None:
    policy = policy_of(egress_pod())
    admitted = admit_network_policy(copy.deepcopy(policy), namespace="mcp")
    assert admitted["spec"] == policy["spec"]
    assert admitted["metadata"]["uid"]
    assert admitted["metadata"]["creationTimestamp"]


def test_the_fake_defaults_policy_types_and_port_protocol_as_the_api_server_does() -> None:
    body = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "p"},
        "spec": {"podSelector": {}, "egress": [{"ports": [{"port": 53}]}]},
    }
    admitted = admit_network_policy(body, namespace="mcp")
    assert admitted["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert admitted["spec"]["egress"][0]["ports"] == [{"port": 53, "protocol": "TCP"}]
    body["spec"] = {"podSelector": {}}
    assert admit_network_policy(body, namespace="mcp")["spec"]["policyTypes"] == ["Ingress"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            lambda s: s["egress"][0]["ports"][0].update(protocol="ICMP"),
            "spec.egress[0].ports[0].protocol",
        ),
        (lambda s: s["egress"][0]["ports"][0].update(port=70000), "spec.egress[0].ports[0].port"),
        (
            lambda s: s["egress"][0]["ports"][0].update(port="No_Name"),
            "spec.egress[0].ports[0].port",
        ),
        (
            lambda s: s["egress"][0]["to"][0]["ipBlock"].update(cidr="10.0.0.300/32"),
            "spec.egress[0].to[0].ipBlock.cidr",
        ),
        (
            lambda s: s["egress"][0]["to"][0]["ipBlock"].update(cidr=""),
            "spec.egress[0].to[0].ipBlock.cidr",
        ),
        (
            lambda s: s["egress"][0]["to"][0]["ipBlock"].update(
                cidr="10.0.0.0/8", **{"except": ["11.0.0.0/16"]}
            ),
            "spec.egress[0].to[0].ipBlock.except[0]",
        ),
        (lambda s: s["egress"][0]["to"].__setitem__(0, {}), "spec.egress[0].to[0]"),
        (lambda s: s["egress"][0]["to"][0].update(podSelector={}), "spec.egress[0].to[0]"),
        (lambda s: s.update(policyTypes=["Egress", "Sideways"]), "spec.policyTypes[1]"),
        (lambda s: s.update(policyTypes=["Ingress", "Egress", "Ingress"]), "spec.policyTypes"),
        (
            lambda s: s["podSelector"]["matchLabels"].update({"bad key!": "x"}),
            "spec.podSelector.matchLabels",
        ),
        (lambda s: s.pop("podSelector"), "spec.podSelector"),
    ],
)
def test_the_fake_refuses_a_malformed_policy_422_naming_the_field(change: Any, field: str) -> None:
    policy = policy_of(egress_pod())
    change(policy["spec"])
    with pytest.raises(ApiError) as refused:
        admit_network_policy(policy, namespace="mcp")
    assert refused.value.code == 422
    assert field in [cause["field"] for cause in (refused.value.details or {})["causes"]]


def test_the_fake_refuses_another_kind_or_namespace_400() -> None:
    policy = policy_of(egress_pod())
    with pytest.raises(ApiError) as refused:
        admit_network_policy(policy | {"apiVersion": "v1"}, namespace="mcp")
    assert refused.value.code == 400
    with pytest.raises(ApiError) as refused:
        admit_network_policy(policy, namespace="elsewhere")
    assert refused.value.code == 400


def test_the_kubelet_gives_a_selected_pod_its_policys_destinations_and_others_nothing() -> None:
    pod = egress_pod()
    policy = admit_network_policy(policy_of(pod), namespace="mcp")
    assert egress_of([policy], pod["metadata"]["labels"]) == [Allowed("10.244.0.7/32", "TCP", 3128)]
    assert egress_of([policy], egress_pod(1)["metadata"]["labels"]) is None
    assert egress_of([], pod["metadata"]["labels"]) is None


def test_the_pods_rules_drop_everything_but_loopback_answers_and_the_allowed() -> None:
    rules = iptables_rules([Allowed("10.244.0.7/32", "TCP", 3128)])
    assert rules[:3] == [
        ["-P", "INPUT", "DROP"],
        ["-P", "FORWARD", "DROP"],
        ["-P", "OUTPUT", "DROP"],
    ]
    assert [
        "-A",
        "OUTPUT",
        "-d",
        "10.244.0.7/32",
        "-p",
        "tcp",
        "--dport",
        "3128",
        "-j",
        "ACCEPT",
    ] in rules
    accepted = [rule for rule in rules if rule[-1] == "ACCEPT" and rule[1] == "OUTPUT"]
    assert len(accepted) == 3  # loopback, answers, the proxy


# --- the settings ------------------------------------------------------------------------------


def suite(egress_proxy: KubernetesEgressProxy | None) -> Suite:
    return Suite(
        version="1.0",
        orchestrator=Orchestrator(
            allowed_mount_roots=[],
            runtime="kubernetes",
            kubernetes=Kubernetes(namespace="mcp", egress_proxy=egress_proxy),
        ),
        mcp_services={"gh": Service(image="img", egress=["api.github.com:443"])},
    )


def test_with_the_setting_the_runtime_has_a_proxy_listening_where_told() -> None:
    runtime = engine_runtime(
        suite(KubernetesEgressProxy(listen="0.0.0.0:3128", address="10.244.0.7:3128")), None, {}
    )
    assert isinstance(runtime, KubernetesRuntime)
    assert runtime.egress is not None
    assert runtime._egress_address == ("10.244.0.7", 3128)


def test_without_the_setting_the_runtime_has_no_proxy() -> None:
    runtime = engine_runtime(suite(None), None, {})
    assert runtime.egress is None


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("0.0.0.0:3128", "proxy.mcp.svc:3128"),
        ("0.0.0.0", "10.0.0.1:3128"),
        ("0.0.0.0:3128", "10.0.0.1:0"),
        ("0.0.0.0:3128", None),  # no address, and no REACTOR_FABRIC_POD_IP either
    ],
)
def test_a_proxy_address_that_is_not_ip_and_port_refuses_to_start(
    listen: str, address: str
) -> None:
    with pytest.raises(EngineAddressError, match="egress_proxy"):
        engine_runtime(suite(KubernetesEgressProxy(listen=listen, address=address)), None, {})


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({}, "egress_proxy is not set"),
        (
            {"egress_listen": ("127.0.0.1", 0), "egress_address": ("10.0.0.1", 3128)},
            "does not run",
        ),
    ],
)
def test_an_egress_pod_without_a_running_proxy_is_refused_before_any_api_call(
    settings: dict[str, Any], why: str
) -> None:
    # No API server at this address: an API call would fail another way. The spec is refused
    # as it is composed, from what the runtime says it can do: nothing reaches the runtime.
    runtime = KubernetesRuntime(namespace="mcp", url="http://127.0.0.1:9", **settings)
    service = Service(image="img", egress=["api.github.com:443"])
    with pytest.raises(ContainerStartFailure) as refused:
        spec_for(service, capabilities=runtime.capabilities)
    assert refused.value.reason == EGRESS_UNAVAILABLE
    assert why in str(refused.value)
