"""deploy/kubernetes: the kustomize base, checked offline (no cluster, no kubectl).

Every manifest against Kubernetes' own schemas; the Role's exact rules; the NetworkPolicies
against the labels the product really puts on session pods; the ConfigMap's suite against the
product's own loader; the Deployment's hardening, mounts, token and ports.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import yaml

from reactor_fabric._runtime_choice import engine_runtime
from reactor_fabric._version import __version__
from reactor_fabric.config.structs import Service
from reactor_fabric.config.suite import check_suite_text
from reactor_fabric.policy.accounts import Account
from reactor_fabric.policy.container_parts.ownership import ContainerIdentity
from reactor_fabric.policy.container_spec import container_spec_for, pooled_spec_for
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.runtime.kubernetes import KubernetesRuntime, PodOwner
from reactor_fabric.runtime.kubernetes_manifests import pod_manifest
from tests.fakes import EVERY_CAPABILITY

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
KUBERNETES = "1.30.0"  # as tests/unit/runtime/test_kubernetes_manifests.py
SUITE_KEY = "claude-mcp-suite.yaml"
TOKEN_SECRET = "reactor-fabric-token"
# What the orchestrator does through the API: session pods and attaching to them. Nothing else.
NEEDED_RULES = {
    ("", "pods", "create"),
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods", "delete"),
    ("", "pods/attach", "get"),
    ("", "pods/attach", "create"),
    # A Secret per service with secrets (never read back: no get, list or watch).
    ("", "secrets", "create"),
    ("", "secrets", "delete"),
    # A NetworkPolicy per session pod of a service with egress.
    ("networking.k8s.io", "networkpolicies", "create"),
    ("networking.k8s.io", "networkpolicies", "delete"),
}


def kustomization() -> dict[str, Any]:
    data = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def documents() -> list[dict[str, Any]]:
    """Every manifest of the base, in the order kustomization.yaml lists the files."""
    found: list[dict[str, Any]] = []
    for name in kustomization()["resources"]:
        text = (BASE / name).read_text(encoding="utf-8")
        found += [doc for doc in yaml.safe_load_all(text) if doc is not None]
    return found


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents() if doc["kind"] == kind]


def the(kind: str) -> dict[str, Any]:
    [doc] = of_kind(kind)
    return doc


def suite_text() -> str:
    text = the("ConfigMap")["data"][SUITE_KEY]
    assert isinstance(text, str)
    return text


def raw_suite() -> dict[str, Any]:
    data = yaml.safe_load(suite_text())
    assert isinstance(data, dict)
    return data


def pod_template() -> dict[str, Any]:
    template = the("Deployment")["spec"]["template"]
    assert isinstance(template, dict)
    return template


def orchestrator_container() -> dict[str, Any]:
    [container] = pod_template()["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions) selects ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        matched = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not matched:
            return False
    return True


def session_pods() -> Iterator[dict[str, Any]]:
    """The pods the product makes for the ConfigMap's services: a session's, with a project
    mounted from the suite's claim, and a pooled one's."""
    suite = raw_suite()
    claims = suite["orchestrator"]["kubernetes"]["volumes"]
    root = next(iter(claims))
    identity = ContainerIdentity(
        instance_id="0123abcd",
        owner_host="reactor-fabric-5d8c7b9f4-x2x7q",
        owner_pid=1,
        owner_start="4242",
        default_network="bridge",
    )
    account = Account(1000, 1000, "reactor-fabric")
    for name, raw in suite["mcp_services"].items():
        service = msgspec.convert(raw, Service)
        mounts = (MountSpec(source=posixpath.join(root, "myrepo"), target="/workspace"),)
        session = container_spec_for(
            name,
            service,
            session_id="0123456789abcdef0123456789abcdef.a",
            identity=identity,
            mounts=mounts,
            account=account,
            capabilities=EVERY_CAPABILITY,
        )
        pooled = pooled_spec_for(
            name,
            service,
            token=0,
            identity=identity,
            account=account,
            capabilities=EVERY_CAPABILITY,
        )
        for spec in (session, pooled):
            yield pod_manifest(spec, namespace="reactor-fabric", claims=claims)


def test_every_yaml_file_of_the_base_is_listed_in_the_kustomization_and_exists() -> None:
    listed = set(kustomization()["resources"])
    on_disk = {
        path.name
        for path in BASE.iterdir()
        if path.suffix in (".yaml", ".yml") and path.name != "kustomization.yaml"
    }
    assert listed == on_disk


def test_every_manifest_is_valid_for_kubernetes_1_30_with_no_unknown_field() -> None:
    docs = documents()
    assert {doc["kind"] for doc in docs} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "RuntimeClass",
    }
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_gvisor_runtime_class_is_shown_and_named_by_the_suite_only_once_uncommented() -> None:
    [runtime_class] = [doc for doc in documents() if doc["kind"] == "RuntimeClass"]
    assert (runtime_class["metadata"]["name"], runtime_class["handler"]) == ("gvisor", "runsc")
    # Named in the suite, commented out: a cluster without runsc keeps working.
    suite = raw_suite()
    assert "gvisor_runtime_class" not in suite["orchestrator"]["kubernetes"]
    assert "# gvisor_runtime_class: gvisor" in (BASE / "configmap.yaml").read_text()


def test_the_base_holds_no_secret_namespace_or_claim_and_no_common_labels() -> None:
    # The token, the namespace and the projects' claim are the user's: `kubectl delete -k`
    # must not remove them, and no token is ever committed.
    assert not {"Secret", "Namespace", "PersistentVolumeClaim"} & {d["kind"] for d in documents()}
    # commonLabels would be added to the NetworkPolicies' selectors: the session policy would
    # then select no session pod.
    assert "commonLabels" not in kustomization()
    assert kustomization()["namespace"]


def test_the_role_allows_exactly_session_pods_and_attaching_to_them() -> None:
    role = the("Role")
    granted = set()
    for rule in role["rules"]:
        assert not rule.get("resourceNames")
        assert not rule.get("nonResourceURLs")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((group, resource, verb))
    # Anything more (reading secrets, pods/exec, pods/log, patch, "*") fails here.
    assert granted == NEEDED_RULES
    assert not of_kind("ClusterRole")
    assert not of_kind("ClusterRoleBinding")


def test_the_role_is_bound_to_the_orchestrators_own_service_account_in_its_namespace() -> None:
    binding, role, account = the("RoleBinding"), the("Role"), the("ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    [subject] = binding["subjects"]
    assert (subject["kind"], subject["name"]) == ("ServiceAccount", account["metadata"]["name"])
    # kustomize fills in the namespace (an explicit one would survive an overlay's namespace).
    assert "namespace" not in subject
    spec = pod_template()["spec"]
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is True
    assert spec["automountServiceAccountToken"] is True


def test_the_configmaps_suite_is_accepted_by_the_products_own_suite_loader() -> None:
    check = check_suite_text(suite_text(), source=f"configmap.yaml:{SUITE_KEY}")
    assert check.issues == []
    assert check.suite is not None
    assert check.suite.orchestrator.runtime == "kubernetes"


def test_the_orchestrator_makes_its_kubernetes_runtime_from_that_suite_and_the_pods_env() -> None:
    check = check_suite_text(suite_text(), source=f"configmap.yaml:{SUITE_KEY}")
    assert check.suite is not None
    # What the downward API gives the pod (see the Deployment's env).
    fields = {
        item["valueFrom"]["fieldRef"]["fieldPath"]: item["name"]
        for item in orchestrator_container()["env"]
        if "fieldRef" in item.get("valueFrom", {})
    }
    environ = {
        fields["metadata.name"]: "reactor-fabric-5d8c7b9f4-x2x7q",
        fields["metadata.uid"]: "0c1d2e3f-aaaa-bbbb-cccc-0123456789ab",
        fields["status.podIP"]: "10.244.1.17",
    }
    runtime = engine_runtime(check.suite, None, environ)
    assert isinstance(runtime, KubernetesRuntime)
    # Session pods with egress reach the proxy at the pod's own IP, on the port it listens on.
    assert runtime.egress is not None
    assert runtime._egress_address == ("10.244.1.17", 3128)
    assert runtime.claims == raw_suite()["orchestrator"]["kubernetes"]["volumes"]
    assert runtime.owner == PodOwner(
        "reactor-fabric-5d8c7b9f4-x2x7q", "0c1d2e3f-aaaa-bbbb-cccc-0123456789ab"
    )


def test_the_suite_runs_the_bundled_services_images_on_kubernetes_in_the_own_namespace() -> None:
    suite = raw_suite()
    orchestrator = suite["orchestrator"]
    assert orchestrator["runtime"] == "kubernetes"
    # Session pods must share the orchestrator's namespace: claims and ownerReferences are
    # namespaced.
    assert "namespace" not in orchestrator["kubernetes"]
    assert "kubeconfig" not in orchestrator["kubernetes"]  # in-cluster: the service account
    bundled = yaml.safe_load((ROOT / "claude-mcp-suite.yaml").read_text(encoding="utf-8"))
    images = {name: s["image"] for name, s in suite["mcp_services"].items()}
    assert images == {name: s["image"] for name, s in bundled["mcp_services"].items()}
    for service in suite["mcp_services"].values():
        # A pooled pod serves only sessions without mounts (a pod's volumes are fixed when it
        # is created), and reserves its memory and CPU meanwhile.
        assert "warm" not in service


def test_every_claimed_root_is_an_allowed_mount_root_the_orchestrator_mounts_its_claim_at() -> None:
    orchestrator = raw_suite()["orchestrator"]
    claims: dict[str, str] = orchestrator["kubernetes"]["volumes"]
    assert claims
    # Each allowed root is a claim's root, named exactly as in volumes (the runtime looks it up).
    assert set(orchestrator["allowed_mount_roots"]) == set(claims)
    roots = {posixpath.normpath(root) for root in orchestrator["allowed_mount_roots"]}
    spec = pod_template()["spec"]
    claim_of_volume = {
        volume["name"]: volume["persistentVolumeClaim"]["claimName"]
        for volume in spec["volumes"]
        if "persistentVolumeClaim" in volume
    }
    mounted = {
        posixpath.normpath(mount["mountPath"]): claim_of_volume[mount["name"]]
        for mount in orchestrator_container()["volumeMounts"]
        if mount["name"] in claim_of_volume
    }
    assert mounted == {posixpath.normpath(root): claim for root, claim in claims.items()}
    assert set(mounted) == roots
    for mount in orchestrator_container()["volumeMounts"]:
        if mount["name"] in claim_of_volume:
            assert mount.get("readOnly") is True  # the orchestrator only checks paths there
            assert "subPath" not in mount


def test_the_orchestrator_reads_that_suite_and_no_flag_overrides_its_runtime() -> None:
    container = orchestrator_container()
    args: list[str] = container["args"]
    suite_volume = next(v for v in pod_template()["spec"]["volumes"] if "configMap" in v)
    assert suite_volume["configMap"]["name"] == the("ConfigMap")["metadata"]["name"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == suite_volume["name"]]
    assert f"--config={posixpath.join(mount['mountPath'], SUITE_KEY)}" in args
    assert not any(arg.startswith("--runtime") and arg != "--runtime=kubernetes" for arg in args)
    env = {item["name"]: item for item in container["env"]}
    assert env.get("REACTOR_FABRIC_RUNTIME", {"value": "kubernetes"})["value"] == "kubernetes"
    assert not any(arg.startswith(("--token", "--no-auth")) for arg in args)


def test_the_deployment_runs_this_versions_image_as_one_replica_replaced_not_rolled() -> None:
    deployment = the("Deployment")
    assert orchestrator_container()["image"] == f"reactor-fabric:{__version__}"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert selects(deployment["spec"]["selector"], pod_template()["metadata"]["labels"])


def test_the_orchestrator_is_hardened() -> None:
    pod = pod_template()["spec"]["securityContext"]
    container = orchestrator_container()["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "fsGroup" not in pod  # the kubelet would re-own every file of the claim
    assert container["runAsNonRoot"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["privileged"] is False
    assert container["readOnlyRootFilesystem"] is True
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert container["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod_template()["spec"]
    resources = orchestrator_container()["resources"]
    assert resources["requests"]["cpu"]
    assert resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    # A read-only root: what it writes (HOME: the audit trail, the catalog cache; /tmp) are
    # volumes.
    mounted = {m["mountPath"] for m in orchestrator_container()["volumeMounts"]}
    home = {e["name"]: e.get("value") for e in orchestrator_container()["env"]}["HOME"]
    assert {home, "/tmp"} <= mounted


def test_the_token_comes_from_a_secret_and_the_pod_learns_its_own_name_and_uid() -> None:
    env = {item["name"]: item for item in orchestrator_container()["env"]}
    assert "value" not in env["REACTOR_FABRIC_TOKEN"]
    assert env["REACTOR_FABRIC_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": TOKEN_SECRET, "key": "token"}
    }
    assert env["REACTOR_FABRIC_POD_NAME"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    assert env["REACTOR_FABRIC_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_the_service_and_the_probes_reach_the_port_the_orchestrator_listens_on() -> None:
    container = orchestrator_container()
    [port] = container["ports"]
    assert f"--port={port['containerPort']}" in container["args"]
    assert "--host=0.0.0.0" in container["args"]  # the pod's address, not loopback
    named = {port["name"]: port["containerPort"]}

    def number(value: int | str) -> int:
        return named[value] if isinstance(value, str) else value

    [service_port] = the("Service")["spec"]["ports"]
    assert number(service_port["targetPort"]) == port["containerPort"]
    assert service_port["port"] == port["containerPort"]
    assert selects(
        {"matchLabels": the("Service")["spec"]["selector"]}, pod_template()["metadata"]["labels"]
    )
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["httpGet"]["path"] == "/healthz"
    assert number(readiness["httpGet"]["port"]) == port["containerPort"]
    # /healthz is 503 while the API server is unreachable: not ready, but not restarted for it.
    assert "httpGet" not in liveness
    assert number(liveness["tcpSocket"]["port"]) == port["containerPort"]


def test_session_pods_are_selected_by_a_policy_that_denies_all_their_traffic() -> None:
    policies = of_kind("NetworkPolicy")
    deny = [p for p in policies if "ingress" not in p["spec"] and "egress" not in p["spec"]]
    [no_network] = deny
    assert sorted(no_network["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    pods = list(session_pods())
    assert pods
    for pod in pods:
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)
        labels = pod["metadata"]["labels"]
        assert selects(no_network["spec"]["podSelector"], labels), labels
        # Policies add up: no policy that allows anything may select a session pod.
        for policy in policies:
            if policy is not no_network:
                assert not selects(policy["spec"]["podSelector"], labels), policy["metadata"]


def test_the_orchestrator_is_not_cut_off_by_the_session_policy_and_gets_its_port_in() -> None:
    policies = {p["metadata"]["name"]: p for p in of_kind("NetworkPolicy")}
    labels = pod_template()["metadata"]["labels"]
    no_network = policies.pop("reactor-fabric-sessions-no-network")
    assert not selects(no_network["spec"]["podSelector"], labels)
    [own] = [p for p in policies.values() if selects(p["spec"]["podSelector"], labels)]
    [ingress, from_sessions] = own["spec"]["ingress"]
    [port] = orchestrator_container()["ports"]
    assert [p["port"] for p in ingress["ports"]] == [port["name"]]
    # Session pods in, to the egress proxy's port alone (their own policies let them out).
    assert [p["port"] for p in from_sessions["ports"]] == [3128]
    assert selects(
        from_sessions["from"][0]["podSelector"], no_network["spec"]["podSelector"]["matchLabels"]
    )
    egress_ports = {p["port"] for rule in own["spec"]["egress"] for p in rule["ports"]}
    assert {443, 6443} <= egress_ports  # the API server, as most clusters serve it
