"""A session's container as a Kubernetes Pod: the manifest, decided without a cluster. Pure.

The first piece of the Kubernetes runtime (a pod per session, attached through the API server):
the same :class:`~reactor_fabric.policy.container_spec.ContainerSpec` the Docker runtime turns
into API calls becomes a Pod here. What maps, and how:

- the server runs alone in the pod (``restartPolicy: Never``), its stdin open for the one
  attach that will ever come (``stdin``, ``stdinOnce``: closing it ends the server's input, as
  closing a Docker attach does), no TTY;
- the suite's ``command`` replaces the image's CMD, which Kubernetes calls ``args``
  (``command`` would replace the ENTRYPOINT);
- the user is numeric (``runAsUser``/``runAsGroup``, ``runAsNonRoot``); every capability is
  dropped and the suite's ``cap_add`` added back; ``allowPrivilegeEscalation: false`` is
  no-new-privileges; the root file system is read-only when the suite says so, with the same
  bounded ``/tmp`` (a memory ``emptyDir`` with the same size limit);
- memory and CPU limits are ``resources.limits`` (requests equal to them, so the scheduler
  reserves what the container may use); the service account token is not mounted, and no
  service links are injected into the environment;
- ``pull`` maps to ``imagePullPolicy`` (``never`` → ``Never``, ``missing`` → ``IfNotPresent``,
  ``always`` → ``Always``); the runtime's default seccomp profile, as Docker applies its own;
- mounts: each allowed root is a PersistentVolumeClaim (``claims``: root → claim name), and the
  validated path below it becomes the volume's ``subPath``.

- secrets: never in the pod. A service's secrets are one Secret of its own
  (:func:`secret_manifest`, labelled like its pods, owned by the orchestrator's pod when it
  runs in the cluster); the pod names it — an environment variable of a secret is a
  ``secretKeyRef`` to it, and the files are a ``secret`` volume at ``/run/secrets``, which
  the kubelet keeps in memory (tmpfs), mode 0440 with the pod's ``fsGroup`` the server's group
  (a Secret volume's files belong to root: the group is how the server, never root, reads
  them; for a user given as a uid alone, the uid's own number, which the kubelet adds to the
  server's groups).

- egress: a pod of a service with an ``egress`` list has its NetworkPolicy
  (:func:`network_policy_manifest`, named like the pod, labelled and owned like it, created
  before it): no ingress, and egress to the orchestrator's egress proxy alone (its address
  and port), which the pod names in its proxy variables with a token of its own. The pod is
  selected by a label of its own (``reactor-fabric.egress-pod``: a hash of its name).

- the queries that find a session's objects again, as the API server reads them: the label
  selector of our pods (:func:`managed_selector`), a watch of one pod from a version
  (:func:`watch_query`), a pod's attach (:func:`attach_path`), a delete's grace period
  (:func:`delete_query`).

What a pod does not enforce that a Docker container does: the pids limit (a kubelet setting,
``podPidsLimit``, for every pod of a node) and ``network: none`` (a NetworkPolicy denying all
traffic to and from the pods of the namespace, or of the ``reactor-fabric.service`` label, does
that). Mounts are not pinned by descriptor either: the kubelet resolves ``subPath`` itself.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlencode

from ..config.secrets import SECRETS_DIR
from ..policy.container_parts.ownership import LABEL_INSTANCE, LABEL_MANAGED, LABEL_SERVICE
from ..policy.container_spec import ContainerSpec
from ..policy.mount_spec import MountSpec
from ..protocol.k8s_pod_state import CONTAINER

PULL_POLICIES: Final = {"never": "Never", "missing": "IfNotPresent", "always": "Always"}
# The API group and version of NetworkPolicies (pods and Secrets are the core group's v1).
NETWORKING: Final = "networking.k8s.io/v1"
# The orchestrator's own pod (in-cluster): its pods are its dependents, removed with it.
OWNER_KIND: Final = "Pod"
_LABEL_VALUE: Final = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_QUANTITY_PLAIN: Final = re.compile(r"[0-9]+")
_POD_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class ManifestError(ValueError):
    """The spec cannot be a Pod (a mount outside every claimed root, a name Kubernetes refuses)."""


def label_value(value: str) -> str:
    """``value`` as Kubernetes accepts a label value (at most 63 of ``[A-Za-z0-9-_.]``, starting
    and ending alphanumeric); other characters become ``_``, the excess is cut."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", value).strip("-_.")[:63].rstrip("-_.")
    assert _LABEL_VALUE.fullmatch(cleaned)
    return cleaned


def pod_name(name: str) -> str:
    """``name`` as a pod may be named (a DNS-1123 subdomain): service names may hold ``_``,
    which becomes ``-``, with a few characters of the original's hash so that two services
    that differ only there do not collide."""
    if _POD_NAME.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    cleaned = re.sub(r"[^a-z0-9.-]", "-", name.lower()).strip("-.")[:240]
    return f"{cleaned}-{digest}"


# A secret volume's files: the owner (root) and the pod's fsGroup (the server's group) may read.
SECRET_FILE_MODE: Final = 0o440
SECRET_VOLUME: Final = "secrets"  # noqa: S105 - a volume's name


def secret_name(spec: ContainerSpec) -> str:
    """The Secret holding ``spec``'s service's secrets: one per service and orchestrator."""
    service = spec.labels.get(LABEL_SERVICE, "service")
    instance = spec.labels.get(LABEL_INSTANCE, "")[:8]
    return pod_name(f"rf-secrets-{service}-{instance}")


def secret_manifest(
    spec: ContainerSpec, *, namespace: str, owner: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The Secret of ``spec``'s service: every secret by name (base64, as the API wants it),
    labelled like the service's pods (managed, instance, service)."""
    labels = {
        key: label_value(value)
        for key, value in spec.labels.items()
        if key in (LABEL_MANAGED, LABEL_INSTANCE, LABEL_SERVICE)
    }
    metadata: dict[str, Any] = {"name": secret_name(spec), "namespace": namespace, "labels": labels}
    if owner is not None:
        metadata["ownerReferences"] = [_owner_reference(owner)]
    data = {s.name: base64.b64encode(s.value.encode()).decode() for s in spec.secrets.secrets}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": data,
    }


def _owner_reference(owner: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": OWNER_KIND,
        "name": owner["name"],
        "uid": owner["uid"],
        "blockOwnerDeletion": False,
    }


# The label a NetworkPolicy selects its one pod by (pod names are too long for label values).
LABEL_EGRESS_POD: Final = "reactor-fabric.egress-pod"


def egress_pod_label(name: str) -> str:
    """The value of LABEL_EGRESS_POD for the pod ``name``."""
    return hashlib.sha256(name.encode()).hexdigest()[:40]


def network_policy_manifest(
    pod: Mapping[str, Any], *, proxy_address: str, proxy_port: int
) -> dict[str, Any]:
    """The NetworkPolicy of ``pod`` (its manifest, from :func:`pod_manifest` for a spec with
    an egress list): that pod alone, no ingress, egress only to ``proxy_address`` (an IP) on
    TCP ``proxy_port``. Named, labelled and owned like the pod (the sweeper and the garbage
    collector find it as they find the pod)."""
    metadata = pod["metadata"]
    labels = dict(metadata["labels"])
    address = ipaddress.ip_address(proxy_address)
    cidr = f"{address}/{address.max_prefixlen}"
    policy_metadata: dict[str, Any] = {
        "name": metadata["name"],
        "namespace": metadata["namespace"],
        "labels": labels,
    }
    if "ownerReferences" in metadata:
        policy_metadata["ownerReferences"] = [dict(o) for o in metadata["ownerReferences"]]
    return {
        "apiVersion": NETWORKING,
        "kind": "NetworkPolicy",
        "metadata": policy_metadata,
        "spec": {
            "podSelector": {"matchLabels": {LABEL_EGRESS_POD: labels[LABEL_EGRESS_POD]}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [
                {
                    "to": [{"ipBlock": {"cidr": cidr}}],
                    "ports": [{"protocol": "TCP", "port": proxy_port}],
                }
            ],
        },
    }


@dataclass
class PodFragment:
    """What one part asks of a pod: its metadata's labels, keys of its container, of its
    container's securityContext and of its spec, its volumes and their mounts, and (the
    secrets') variables that refer to a Secret rather than hold a value."""

    labels: dict[str, str] = field(default_factory=dict)
    container: dict[str, Any] = field(default_factory=dict)
    security: dict[str, Any] = field(default_factory=dict)
    pod: dict[str, Any] = field(default_factory=dict)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    env_refs: dict[str, dict[str, Any]] = field(default_factory=dict)


def pod_manifest(
    spec: ContainerSpec,
    *,
    namespace: str,
    claims: Mapping[str, str] | None = None,
    owner: Mapping[str, str] | None = None,
    deadline_seconds: int | None = None,
) -> dict[str, Any]:
    """The Pod for ``spec`` in ``namespace``: each part's fragment (one function per part,
    :data:`PART_REALISATIONS`), put together.

    ``claims`` maps each allowed mount root (a host path as the suite names it) to the
    PersistentVolumeClaim that holds it; ``owner`` is the orchestrator's own pod (``name`` and
    ``uid``) when it runs in the cluster; ``deadline_seconds`` bounds the pod's life
    (``activeDeadlineSeconds``).

    Error handling: raises :class:`ManifestError` for a mount no claim covers, or a user that
    is not numeric.
    """
    name = pod_name(spec.name)
    named = lifecycle(spec)
    mounted = mounts(spec, claims or {})  # a mount no claim covers is said first
    run = program(spec)
    limited = resources(spec)
    confined = confinement(spec)
    secret = secrets(spec, run.security)
    fragments = [named, run, mounted, network(spec), limited, confined, secret]
    isolated = isolation(spec)
    fragments += [egress(spec, name), child_session(spec), isolated]
    security: dict[str, Any] = {**confined.security, **run.security}
    container: dict[str, Any] = {
        "name": CONTAINER,
        **run.container,
        "stdin": True,
        "stdinOnce": True,
        "tty": False,
        "env": _environment(spec, secret.env_refs),
        **limited.container,
        "securityContext": security,
        "volumeMounts": [m for f in (mounted, confined, secret) for m in f.volume_mounts],
    }
    if spec.command is not None:
        container["args"] = list(spec.command)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {key: value for f in fragments for key, value in f.labels.items()},
    }
    if owner is not None:
        metadata["ownerReferences"] = [_owner_reference(owner)]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
        "volumes": [v for f in (mounted, confined, secret) for v in f.volumes],
    }
    if deadline_seconds is not None:
        pod_spec["activeDeadlineSeconds"] = deadline_seconds
    pod_spec |= secret.pod
    pod_spec |= isolated.pod
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def lifecycle(spec: ContainerSpec) -> PodFragment:
    """The spec's labels, as label values."""
    return PodFragment(labels={key: label_value(value) for key, value in spec.labels.items()})


def program(spec: ContainerSpec) -> PodFragment:
    """The image and its pull policy; the user, numeric (``runAsUser``/``runAsGroup``,
    ``runAsNonRoot``); the command is ``args`` and the environment ``env`` (see
    :func:`pod_manifest`, :func:`_environment`)."""
    security: dict[str, Any] = {}
    if spec.user is not None:
        uid, _, gid = spec.user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise ManifestError(f"user {spec.user!r}: a pod's user must be numeric (uid[:gid])")
        security |= {"runAsUser": int(uid), "runAsNonRoot": int(uid) != 0}
        if gid:
            security["runAsGroup"] = int(gid)
    return PodFragment(
        container={
            "image": spec.image,
            "imagePullPolicy": PULL_POLICIES.get(spec.pull, "IfNotPresent"),
        },
        security=security,
    )


def mounts(spec: ContainerSpec, claims: Mapping[str, str]) -> PodFragment:
    """Each mount as its claim's volume (one per claim) with the path below the claimed
    root as its ``subPath``."""
    fragment = PodFragment()
    used: dict[str, str] = {}  # claim name → volume name
    for mount in spec.mounts:
        claim, sub_path = _claimed(mount, claims)
        name = used.get(claim)
        if name is None:
            name = used[claim] = f"claim-{len(used)}"
            fragment.volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim}})
        entry: dict[str, Any] = {
            "name": name,
            "mountPath": mount.target,
            "readOnly": mount.read_only,
        }
        if sub_path:
            entry["subPath"] = sub_path
        fragment.volume_mounts.append(entry)
    return fragment


def network(spec: ContainerSpec) -> PodFragment:
    """Nothing in the pod: ``network`` is a NetworkPolicy's to enforce (``deploy/kubernetes``),
    and an egress pod's is :func:`network_policy_manifest`."""
    return PodFragment()


def resources(spec: ContainerSpec) -> PodFragment:
    """Memory and CPU limits, requests equal to them (the scheduler reserves what the
    container may use); the pids limit is the kubelet's (``podPidsLimit``), the CPU weight
    fixed."""
    limits = {"memory": str(spec.memory_bytes), "cpu": f"{max(1, spec.nano_cpus // 1_000_000)}m"}
    return PodFragment(container={"resources": {"limits": limits, "requests": dict(limits)}})


def confinement(spec: ContainerSpec) -> PodFragment:
    """Every capability dropped and the suite's added back, no privilege escalation (unless
    relaxed), the runtime's default seccomp profile, a read-only root with its tmpfs as
    memory ``emptyDir`` volumes of the same size."""
    fragment = PodFragment(
        security={
            "allowPrivilegeEscalation": not spec.no_new_privileges,
            "privileged": False,
            "readOnlyRootFilesystem": spec.read_only_rootfs,
            "capabilities": {
                "drop": ["ALL"],
                **({"add": list(spec.cap_add)} if spec.cap_add else {}),
            },
            # Docker's default seccomp profile applies to every container it runs; a pod runs
            # Unconfined unless it asks (or the kubelet's seccompDefault is on).
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    )
    for index, (target, options) in enumerate(sorted(spec.tmpfs.items())):
        name = f"tmp-{index}"
        size = _tmpfs_size(options)
        fragment.volumes.append(
            {
                "name": name,
                "emptyDir": {"medium": "Memory", **({"sizeLimit": size} if size else {})},
            }
        )
        fragment.volume_mounts.append({"name": name, "mountPath": target})
    return fragment


def secrets(spec: ContainerSpec, user: Mapping[str, Any]) -> PodFragment:
    """The secrets, never in the pod: a variable refers to the service's Secret
    (``secretKeyRef``), the files are a ``secret`` volume at /run/secrets, readable by the
    pod's ``fsGroup``, the server's group (``user``: the program's securityContext)."""
    fragment = PodFragment(
        env_refs={
            s.name: {"secretKeyRef": {"name": secret_name(spec), "key": s.name}}
            for s in spec.secrets.secrets
            if s.as_env
        }
    )
    if spec.secret_files:
        items = [{"key": s.name, "path": s.name} for s in spec.secret_files]
        source = {"secretName": secret_name(spec), "defaultMode": SECRET_FILE_MODE, "items": items}
        fragment.volumes.append({"name": SECRET_VOLUME, "secret": source})
        fragment.volume_mounts.append(
            {"name": SECRET_VOLUME, "mountPath": SECRETS_DIR, "readOnly": True}
        )
        if "runAsUser" in user:
            # A user given as a uid alone runs with the image's group for it (or root's): the
            # files' group is then the uid's own, as the Docker runtime gives them to uid:uid.
            group = user.get("runAsGroup", user["runAsUser"])
            fragment.pod["securityContext"] = {"fsGroup": group}
    return fragment


def egress(spec: ContainerSpec, name: str) -> PodFragment:
    """An egress pod's label, which its NetworkPolicy (:func:`network_policy_manifest`)
    selects it by; its proxy's variables (with its token) are in the environment."""
    if spec.egress is None:
        return PodFragment()
    return PodFragment(labels={LABEL_EGRESS_POD: egress_pod_label(name)})


def child_session(spec: ContainerSpec) -> PodFragment:
    """Nothing: a pod has no socket of ours to bind (the runtime's capabilities say so, and
    the starter grants its agents no child session)."""
    return PodFragment()


def isolation(spec: ContainerSpec) -> PodFragment:
    """The pod's RuntimeClass (``runtimeClassName``) when it runs under gVisor: the class the
    suite names (``orchestrator.kubernetes.gvisor_runtime_class``, whose handler is runsc)."""
    return PodFragment(pod={"runtimeClassName": spec.runtime} if spec.runtime is not None else {})


def _environment(spec: ContainerSpec, refs: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The container's ``env``: a secret's variable refers to the service's Secret
    (``refs``), never holds the value (whoever may read pods would read it)."""
    return [
        {"name": name, "valueFrom": refs[name]} if name in refs else {"name": name, "value": value}
        for name, value in spec.environment.items()
    ]


def _claimed(mount: MountSpec, claims: Mapping[str, str]) -> tuple[str, str]:
    """The claim holding ``mount``'s source, and the source's path inside it."""
    source = posixpath.normpath(mount.source)
    best: tuple[int, str, str] | None = None  # (depth of the root, claim, path inside it)
    for given_root, claim in claims.items():
        root = posixpath.normpath(given_root)
        if source == root or source.startswith(root.rstrip("/") + "/"):
            relative = posixpath.relpath(source, root)
            # The deepest root wins: its claim is the one that holds the directory.
            if best is None or len(root) > best[0]:
                best = (len(root), claim, "" if relative == "." else relative)
    if best is None:
        raise ManifestError(f"no PersistentVolumeClaim holds {mount.source!r}")
    return best[1], best[2]


def _tmpfs_size(options: str) -> str | None:
    """A Docker tmpfs ``size=64m`` as a Kubernetes quantity (``64Mi``)."""
    for option in options.split(","):
        key, _, value = option.partition("=")
        if key == "size" and value:
            number, unit = value[:-1], value[-1].lower()
            if unit in "kmg" and _QUANTITY_PLAIN.fullmatch(number):
                return number + {"k": "Ki", "m": "Mi", "g": "Gi"}[unit]
            if _QUANTITY_PLAIN.fullmatch(value):
                return value
    return None


# --- the queries that find a session's objects again ---------------------------------------------


def managed_selector(extra_labels: Mapping[str, str] | None = None) -> str:
    """The label selector of the pods labelled as ours and with every one of ``extra_labels``."""
    return ",".join(
        f"{key}={value}" for key, value in {LABEL_MANAGED: "true", **(extra_labels or {})}.items()
    )


def watch_query(name: str, version: str, *, start_timeout: float) -> dict[str, str]:
    """A watch of the pod ``name``'s versions after ``version``, which the API server ends
    after ``start_timeout`` (whole seconds, at least 1) if nothing changes."""
    return {
        "watch": "1",
        "fieldSelector": f"metadata.name={name}",
        "resourceVersion": version,
        "timeoutSeconds": str(max(1, math.ceil(start_timeout))),
        "allowWatchBookmarks": "false",
    }


def attach_path(namespace: str, name: str) -> str:
    """The pod ``name``'s attach (its server's stdin, stdout and stderr), from the server's root."""
    return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/attach?" + urlencode(
        {"container": CONTAINER, "stdin": "true", "stdout": "true", "stderr": "true"}
    )


def delete_query(grace: float | None) -> dict[str, str]:
    """A pod's delete with ``grace`` seconds (rounded up) for its server; None: at once."""
    seconds = 0 if grace is None else max(0, math.ceil(grace))
    return {"gracePeriodSeconds": str(seconds)}


# Each part of a ContainerSpec, by its field's name, and the one function that realises it
# in a pod (tests/unit/test_container_parts.py checks that every part has one).
PART_REALISATIONS: Final = {
    "lifecycle": lifecycle,
    "program": program,
    "mounts": mounts,
    "network": network,
    "resources": resources,
    "confinement": confinement,
    "secrets": secrets,
    "egress": egress,
    "child_session": child_session,
    "isolation": isolation,
}
