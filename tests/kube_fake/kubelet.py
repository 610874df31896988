"""The fake's one node: what the scheduler and a kubelet do with a pod, done with Docker.

:func:`docker_plan` maps a Pod onto ``create_container`` / ``create_host_config`` arguments the
way the kubelet maps it onto a CRI container config (environment with ``$(VAR)`` expansion and
the ``kubernetes`` service's variables, ``command``/``args`` onto entrypoint/cmd, the security
context, limits, volumes, ``subPath`` resolved inside its volume). :class:`Kubelet` runs a pod's
life: scheduling (claims, node selector, capacity), the image policy, create and start, the
status the API shows at each step, the exit, ``activeDeadlineSeconds``, and deletion.
"""

from __future__ import annotations

import math
import os
import stat
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, Final

import docker
import docker.errors
import docker.types
import requests
import trio

from .api import ceil_int, docker_time, parse_quantity, timestamp
from .engine import CALL_TIMEOUT, DockerPool
from .network_policies import Allowed, NetworkPolicyStore, iptables_rules
from .pods import FakePod, PodStore
from .secret_store import SecretStore
from .secret_volumes import SecretVolumes, VolumeSetupError, payload

NODE_NAME: Final = "kube-fake"
# The holder of a pod's network namespace when a NetworkPolicy limits its egress (the real
# kubelet's "pause" container): any local image with `sleep` (every product image is built on
# this one); never pulled.
HOLDER_IMAGE: Final = "reactor-fabric/base:bookworm"
# The Docker network such pods are on (its gateway is the host, where a test's proxy listens).
POD_NETWORK: Final = "bridge"
FAKE_LABEL: Final = "reactor-fabric.kube-fake"
# The labels the kubelet's runtimes put on a pod's containers.
POD_NAME_LABEL: Final = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL: Final = "io.kubernetes.pod.namespace"
POD_UID_LABEL: Final = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL: Final = "io.kubernetes.container.name"
# What every pod's environment holds about the API server (the ``kubernetes`` service of the
# default namespace, which the kubelet injects even with enableServiceLinks: false). The
# address is a typical cluster's; nothing answers there (the fake's pods have no network).
SERVICE_ENV: Final = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_SERVICE_PORT_HTTPS": "443",
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
    "KUBERNETES_PORT_443_TCP_PORT": "443",
    "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
}
# The kubelet's back-off between attempts at an image it could not get (10 s doubling to 300).
IMAGE_BACKOFF_FIRST: Final = 10.0
IMAGE_BACKOFF_MAX: Final = 300.0
WAIT_ROUND: Final = 5  # seconds of one Docker wait call (a cancelled wait frees its thread then)
DEADLINE_MESSAGE: Final = "Pod was active on the node longer than the specified deadline"


class ContainerConfigError(Exception):
    """What the kubelet reports as ``CreateContainerConfigError``: the container cannot be
    configured (a subPath outside its volume, runAsNonRoot with a root user, a Secret or a key
    of it that an environment variable refers to and that does not exist)."""


@dataclass(frozen=True)
class Node:
    """The node every pod is scheduled on: this machine, as Docker reports it."""

    name: str
    cpu_millis: int
    memory_bytes: int

    @property
    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64" if os.uname().machine == "x86_64" else "arm64",
        }


@dataclass(frozen=True)
class DockerPlan:
    """A pod's container as Docker API arguments."""

    name: str
    create: dict[str, Any]  # create_container's, except host_config
    host: dict[str, Any]  # create_host_config's


# --- the pod as a Docker container (pure but for subPath resolution) -------------------------


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, an undefined reference
    stays as written, ``$$`` is a literal ``$`` (k8s.io/kubernetes third_party expansion)."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":
                out.append("$")
                advance = 1
            elif rest[0] == "(" and (close := rest.find(")", 1)) != -1:
                name = rest[1:close]
                value = lookup(name)
                out.append(f"$({name})" if value is None else value)
                advance = close + 1
            else:
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


SecretLookup = Callable[[str], Mapping[str, bytes] | None]


def _no_secrets(_name: str) -> Mapping[str, bytes] | None:
    return None


def environment(
    container: Mapping[str, Any], secrets: SecretLookup = _no_secrets, namespace: str = ""
) -> dict[str, str]:
    """The container's environment as the kubelet makes it (makeEnvironmentVariables): its
    ``env`` in order, a ``value`` expanded against the variables before it and the service
    variables, a ``secretKeyRef`` read from the Secret (``secrets``: name → its data, None
    when there is none) as it is, unexpanded; then the service variables it did not set.

    Error handling: a missing Secret or key that is not ``optional`` raises
    ContainerConfigError with the kubelet's message.
    """
    env: dict[str, str] = {}
    for variable in container.get("env") or []:
        name = variable["name"]
        value = variable.get("value") or ""
        reference = (variable.get("valueFrom") or {}).get("secretKeyRef")
        if value or reference is None:
            env[name] = expand(value, lambda known: env.get(known, SERVICE_ENV.get(known)))
            continue
        optional = bool(reference.get("optional"))
        data = secrets(reference["name"])
        if data is None:
            if optional:
                continue
            # The secret manager's NotFound (resource "secret", singular).
            raise ContainerConfigError(f'secret "{reference["name"]}" not found')
        if reference["key"] not in data:
            if optional:
                continue
            raise ContainerConfigError(
                f"couldn't find key {reference['key']} in Secret {namespace}/{reference['name']}"
            )
        env[name] = data[reference["key"]].decode(errors="replace")
    for name, value in SERVICE_ENV.items():
        env.setdefault(name, value)
    return env


def pod_ref(pod: Mapping[str, Any]) -> str:
    """``name_namespace(uid)``, as the kubelet names a pod in its messages."""
    meta = pod["metadata"]
    return f"{meta['name']}_{meta['namespace']}({meta['uid']})"


def docker_user(
    pod: Mapping[str, Any], container: Mapping[str, Any], image_user: str
) -> str | None:
    """Docker's ``user`` for the effective security context; raises ContainerConfigError when
    ``runAsNonRoot`` cannot hold (kubelet's verifyRunAsNonRoot)."""
    pod_context = pod["spec"].get("securityContext") or {}
    context = container.get("securityContext") or {}

    def effective(key: str) -> Any:
        return context[key] if context.get(key) is not None else pod_context.get(key)

    uid, gid, non_root = effective("runAsUser"), effective("runAsGroup"), effective("runAsNonRoot")
    where = f"(pod: {pod_ref(pod)!r}, container: {container['name']})".replace("'", '"')
    if non_root:
        image_name = image_user.partition(":")[0]
        if uid is not None:
            if uid == 0:
                raise ContainerConfigError(f"container's runAsUser breaks non-root policy {where}")
        elif image_name in ("", "0"):
            raise ContainerConfigError(
                f"container has runAsNonRoot and image will run as root {where}"
            )
        elif not image_name.isdigit():
            raise ContainerConfigError(
                f"container has runAsNonRoot and image has non-numeric user ({image_name}), "
                f"cannot verify user is non-root {where}"
            )
    if uid is None and gid is None:
        return None
    user = str(uid) if uid is not None else (image_user.partition(":")[0] or "0")
    return f"{user}:{gid}" if gid is not None else user


def resolve_sub_path(root: Path, sub_path: str, failure: str) -> Path:
    """``sub_path`` below the volume at ``root``, as the kubelet prepares it: every existing
    component resolved (symlinks followed) must stay inside the volume; missing directories are
    made with the volume's permissions. Raises ContainerConfigError(``failure``) otherwise."""
    base = Path(os.path.realpath(root))
    current = base
    for part in PurePosixPath(sub_path).parts:
        if part in ("", "."):
            continue
        candidate = current / part
        if os.path.lexists(candidate):
            resolved = Path(os.path.realpath(candidate))
            if (resolved != base and base not in resolved.parents) or not resolved.exists():
                raise ContainerConfigError(failure)
            current = resolved
        else:
            candidate.mkdir()
            candidate.chmod(stat.S_IMODE(base.stat().st_mode))
            current = candidate
    return current


def _volume_mounts(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    claims: Mapping[str, Path],
    secret_dirs: Mapping[str, Path],
) -> tuple[list[docker.types.Mount], dict[str, str]]:
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
    memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    mounts: list[docker.types.Mount] = []
    tmpfs: dict[str, str] = {}
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        if volume.get("secret") is not None:
            # Set up in shared memory before; read-only whatever the mount says, as the
            # kubelet mounts every Secret volume.
            mounts.append(
                docker.types.Mount(
                    target=mount["mountPath"],
                    source=str(secret_dirs[mount["name"]]),
                    type="bind",
                    read_only=True,
                )
            )
            continue
        claim = volume.get("persistentVolumeClaim")
        if claim is not None:
            failure = (
                f'failed to prepare subPath for volumeMount "{mount["name"]}" of container '
                f'"{container["name"]}"'
            )
            source = resolve_sub_path(
                claims[claim["claimName"]], mount.get("subPath") or "", failure
            )
            read_only = bool(mount.get("readOnly")) or bool(claim.get("readOnly"))
            mounts.append(
                docker.types.Mount(
                    target=mount["mountPath"], source=str(source), type="bind", read_only=read_only
                )
            )
            continue
        # An emptyDir is a tmpfs of its sizeLimit, else of the container's memory limit.
        size = volume["emptyDir"].get("sizeLimit") or memory
        options = ["ro" if mount.get("readOnly") else "rw", "exec", "mode=0777"]
        if size is not None:
            options.append(f"size={ceil_int(parse_quantity(size))}")
        tmpfs[mount["mountPath"]] = ",".join(options)
    return mounts, tmpfs


def _groups(pod_context: Mapping[str, Any]) -> list[str]:
    """The container's supplementary groups: the pod's ``fsGroup`` (the kubelet adds it, so
    that the process may use what the volumes give to that group) and supplementalGroups."""
    fs_group = pod_context.get("fsGroup")
    groups = [fs_group] if fs_group is not None else []
    groups += [g for g in pod_context.get("supplementalGroups") or [] if g not in groups]
    return [str(group) for group in groups]


def _limits(container: Mapping[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests_ = resources.get("requests") or {}
    host: dict[str, Any] = {}
    if "memory" in limits:
        host["mem_limit"] = host["memswap_limit"] = ceil_int(parse_quantity(limits["memory"]))
    if "cpu" in limits:
        host["nano_cpus"] = ceil_int(parse_quantity(limits["cpu"]) * 1_000_000_000)
    # The kubelet's cpu.shares: the request in millicores * 1024 / 1000, at least 2.
    millis = ceil_int(parse_quantity(requests_["cpu"]) * 1000) if "cpu" in requests_ else 0
    host["cpu_shares"] = max(2, millis * 1024 // 1000)
    return host


def docker_plan(
    pod: Mapping[str, Any],
    *,
    image_user: str,
    claims: Mapping[str, Path],
    labels: Mapping[str, str],
    secrets: SecretLookup = _no_secrets,
    secret_dirs: Mapping[str, Path] | None = None,
) -> DockerPlan:
    """The Docker container for ``pod`` (whose claims were checked at scheduling, whose
    secret volumes are set up at ``secret_dirs``: volume name → host directory).

    Error handling: raises ContainerConfigError (the kubelet's CreateContainerConfigError).
    """
    meta = pod["metadata"]
    spec = pod["spec"]
    container = spec["containers"][0]
    env = environment(container, secrets, meta["namespace"])

    def lookup(name: str) -> str | None:
        return env.get(name)

    command = [expand(item, lookup) for item in container.get("command") or []]
    args = [expand(item, lookup) for item in container.get("args") or []]
    context = container.get("securityContext") or {}
    capabilities = context.get("capabilities") or {}
    security_opt = []
    if context.get("allowPrivilegeEscalation") is False:
        security_opt.append("no-new-privileges")
    seccomp = (
        context.get("seccompProfile")
        or (spec.get("securityContext") or {}).get("seccompProfile")
        or {}
    ).get("type")
    if seccomp != "RuntimeDefault":
        # A kubelet without --seccomp-default runs containers Unconfined unless told otherwise.
        security_opt.append("seccomp=unconfined")
    mounts, tmpfs = _volume_mounts(pod, container, claims, secret_dirs or {})
    user = docker_user(pod, container, image_user)
    name = f"k8s_{container['name']}_{meta['name']}_{meta['namespace']}_{meta['uid']}_0"
    stdin_once = bool(container.get("stdin")) and bool(container.get("stdinOnce"))
    create: dict[str, Any] = {
        "image": container["image"],
        "entrypoint": command or None,
        "command": args or None,
        "environment": [f"{key}={value}" for key, value in env.items()],
        "user": user,
        "working_dir": container.get("workingDir") or None,
        "hostname": meta["name"][:63].rstrip("-."),
        "labels": {
            **(meta.get("labels") or {}),
            POD_NAME_LABEL: meta["name"],
            POD_NAMESPACE_LABEL: meta["namespace"],
            POD_UID_LABEL: meta["uid"],
            CONTAINER_NAME_LABEL: container["name"],
            **labels,
        },
        "name": name,
        "stdin_open": bool(container.get("stdin")),
        # docker-py sets StdinOnce for a container created attached (detach=False) with stdin.
        "detach": not stdin_once,
        "tty": False,
    }
    host: dict[str, Any] = {
        "network_mode": "none",
        "mounts": mounts or None,
        "tmpfs": tmpfs or None,
        "cap_add": list(capabilities.get("add") or []) or None,
        "cap_drop": list(capabilities.get("drop") or []) or None,
        "security_opt": security_opt or None,
        "read_only": bool(context.get("readOnlyRootFilesystem")),
        "group_add": _groups(spec.get("securityContext") or {}) or None,
        **_limits(container),
    }
    return DockerPlan(name=name, create=create, host=host)


# --- status ----------------------------------------------------------------------------------


def _condition(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "lastProbeTime": None,
        "lastTransitionTime": timestamp(),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _set_conditions(status: dict[str, Any], *conditions: dict[str, Any]) -> None:
    """Replace conditions by type, keeping a transition time when the status did not change."""
    current = {c["type"]: c for c in status.get("conditions") or []}
    for condition in conditions:
        old = current.get(condition["type"])
        if old is not None and old["status"] == condition["status"]:
            condition["lastTransitionTime"] = old["lastTransitionTime"]
        current[condition["type"]] = condition
    order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
    status["conditions"] = sorted(current.values(), key=lambda c: order.index(c["type"]))


def _container_status(
    pod: Mapping[str, Any], state: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    container = pod["spec"]["containers"][0]
    previous = (pod.get("status", {}).get("containerStatuses") or [{}])[0]
    return {
        "name": container["name"],
        "state": state,
        "lastState": {},
        "ready": False,
        "restartCount": 0,
        "image": container["image"],
        "imageID": previous.get("imageID", ""),
        "started": False,
        **({"containerID": previous["containerID"]} if previous.get("containerID") else {}),
        **extra,
    }


def _waiting(pod: dict[str, Any], reason: str, message: str = "") -> None:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    pod["status"]["containerStatuses"] = [_container_status(pod, {"waiting": waiting})]


def waiting(reason: str, message: str = "") -> Callable[[dict[str, Any]], None]:
    """The change to a pod whose container waits for ``reason``."""
    return lambda pod: _waiting(pod, reason, message)


def terminated_state(inspected: Mapping[str, Any], container_id: str) -> dict[str, Any]:
    """A container's ``state.terminated`` from Docker's inspection of it."""
    state = inspected["State"]
    code = int(state.get("ExitCode", 0))
    reason = "OOMKilled" if state.get("OOMKilled") else ("Completed" if code == 0 else "Error")
    terminated: dict[str, Any] = {
        "exitCode": code,
        "reason": reason,
        "startedAt": docker_time(state.get("StartedAt")),
        "finishedAt": docker_time(state.get("FinishedAt")) or timestamp(),
        "containerID": f"docker://{container_id}",
    }
    if state.get("Error"):
        terminated["message"] = state["Error"]
    return terminated


def _finish(pod: dict[str, Any], terminated: dict[str, Any]) -> None:
    """The pod once its only container ended (restartPolicy Never)."""
    status = pod["status"]
    status["phase"] = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
    ids = {"containerID": terminated["containerID"]} if "containerID" in terminated else {}
    status["containerStatuses"] = [_container_status(pod, {"terminated": terminated}, **ids)]
    _set_conditions(
        status,
        _condition("PodReadyToStartContainers", False),
        _condition("Ready", False, "PodCompleted"),
        _condition("ContainersReady", False, "PodCompleted"),
    )


# --- the kubelet -----------------------------------------------------------------------------


class Kubelet:
    """Runs the pods of one fake API server on its Docker engine."""

    def __init__(
        self,
        store: PodStore,
        pool: DockerPool,
        *,
        secrets: SecretStore,
        network_policies: NetworkPolicyStore | None = None,
        node: Node,
        claims: Mapping[str, Path],
        labels: Mapping[str, str],
        created: set[str],
        volumes: SecretVolumes | None = None,
    ) -> None:
        self.store = store
        self.secrets = secrets
        self.network_policies = network_policies
        # The pods' secret volumes, in shared memory (removed with each pod, and at the end).
        self.volumes = volumes or SecretVolumes()
        self.pool = pool
        self.node = node
        self.claims = dict(claims)
        self.labels = dict(labels)
        # Every container this kubelet created (the fake removes them all at its exit).
        self.created = created
        self.errors: list[BaseException] = []

    async def run(self, pod: FakePod) -> None:
        """A pod's whole life on the node: until it is deleted and its container removed.

        Error handling: an unexpected failure (a Docker error, a bug of the fake) is recorded
        in ``errors`` — the fake raises it at its exit — and the pod stays as it was.
        """
        try:
            with pod.life:
                await self._live(pod)
            await pod.delete_requested.wait()
            await self._terminate(pod)
        except Exception as exc:
            self.errors.append(exc)

    def _update(self, pod: FakePod, change: Callable[[dict[str, Any]], None]) -> None:
        self.store.update(pod, change)

    async def _live(self, pod: FakePod) -> None:
        unschedulable = self._unschedulable(pod.object)
        if unschedulable is not None:
            refused = _condition("PodScheduled", False, "Unschedulable", unschedulable)
            self._update(pod, lambda p: _set_conditions(p["status"], refused))
            await trio.sleep_forever()
        if pod.object["spec"].get("nodeName") not in (None, self.node.name):
            await trio.sleep_forever()  # bound to a node that does not exist: nobody runs it
        self._update(pod, self._scheduled)
        deadline = pod.object["spec"].get("activeDeadlineSeconds")
        with trio.move_on_after(deadline if deadline else math.inf) as timer:
            await self._start_and_wait(pod)
        if timer.cancelled_caught:
            await self._deadline_exceeded(pod)

    def _unschedulable(self, pod: Mapping[str, Any]) -> str | None:
        """Why the scheduler would not place ``pod`` on the node (the FailedScheduling text)."""
        spec = pod["spec"]
        for volume in spec.get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is not None and claim not in self.claims:
                return (
                    f'0/1 nodes are available: persistentvolumeclaim "{claim}" not found. '
                    "preemption: 0/1 nodes are available: 1 Preemption is not helpful for "
                    "scheduling."
                )
        selector = spec.get("nodeSelector") or {}
        if any(self.node.labels.get(key) != value for key, value in selector.items()):
            return (
                "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. "
                "preemption: 0/1 nodes are available: 1 Preemption is not helpful for "
                "scheduling."
            )
        requests_ = (spec["containers"][0].get("resources") or {}).get("requests") or {}
        short = []
        if "cpu" in requests_ and parse_quantity(requests_["cpu"]) * 1000 > self.node.cpu_millis:
            short.append("1 Insufficient cpu")
        if "memory" in requests_ and parse_quantity(requests_["memory"]) > self.node.memory_bytes:
            short.append("1 Insufficient memory")
        if short:
            return (
                f"0/1 nodes are available: {', '.join(short)}. preemption: 0/1 nodes are "
                "available: 1 No preemption victims found for incoming pod."
            )
        return None

    def _scheduled(self, pod: dict[str, Any]) -> None:
        pod["spec"]["nodeName"] = self.node.name
        status = pod["status"]
        status |= {
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": timestamp(),
        }
        unready = f"containers with unready status: [{pod['spec']['containers'][0]['name']}]"
        _set_conditions(
            status,
            _condition("PodReadyToStartContainers", True),
            _condition("Initialized", True),
            _condition("Ready", False, "ContainersNotReady", unready),
            _condition("ContainersReady", False, "ContainersNotReady", unready),
            _condition("PodScheduled", True),
        )
        _waiting(pod, "ContainerCreating")

    async def _image(self, pod: FakePod) -> dict[str, Any]:
        """The image's inspection, once Docker has it. No registry is reachable from the fake:
        an image Docker lacks is reported as a kubelet reports a failed pull (or, with
        ``Never``, one it may not pull), and looked for again after each back-off."""
        container = pod.object["spec"]["containers"][0]
        image, policy = container["image"], container["imagePullPolicy"]
        backoff = IMAGE_BACKOFF_FIRST
        while True:
            found = await self.pool.run(lambda client: _inspect_image(client, image))
            if found is not None:
                return found
            if policy == "Never":
                message = f'Container image "{image}" is not present with pull policy of Never'
                self._update(pod, waiting("ErrImageNeverPull", message))
            else:
                message = (
                    f'failed to pull and unpack image "{image}": no registry is reachable from '
                    "the fake API server (tests/kube_fake)"
                )
                self._update(pod, waiting("ErrImagePull", message))
                await trio.sleep(1)
                self._update(pod, waiting("ImagePullBackOff", f'Back-off pulling image "{image}"'))
            await trio.sleep(backoff)
            backoff = min(backoff * 2, IMAGE_BACKOFF_MAX)

    async def _mount_volumes(self, pod: FakePod) -> dict[str, Path]:
        """The pod's secret volumes set up (volume name → host directory), once every Secret
        and key they need exists: until then the pod waits in ContainerCreating, and each
        change of a Secret is another try (the kubelet retries at each sync)."""
        obj = pod.object
        fs_group = (obj["spec"].get("securityContext") or {}).get("fsGroup")
        while True:
            seen = self.secrets.generation
            dirs: dict[str, Path] = {}
            try:
                for volume in obj["spec"].get("volumes") or []:
                    source = volume.get("secret")
                    if source is None:
                        continue
                    try:
                        files = payload(source, self.secrets.data(source["secretName"]))
                    except VolumeSetupError as exc:
                        raise VolumeSetupError(
                            f'MountVolume.SetUp failed for volume "{volume["name"]}" : {exc}'
                        ) from None
                    dirs[volume["name"]] = await trio.to_thread.run_sync(
                        self.volumes.set_up, obj["metadata"]["uid"], volume["name"], files, fs_group
                    )
            except VolumeSetupError as exc:
                # The kubelet reports this as a FailedMount event; the fake has no Events API
                # and shows it as the waiting container's message.
                self._update(pod, waiting("ContainerCreating", str(exc)))
                await self.secrets.changed_since(seen)
                continue
            return dirs

    async def _start_and_wait(self, pod: FakePod) -> None:
        secret_dirs = await self._mount_volumes(pod)
        image = await self._image(pod)
        image_id = (image.get("RepoDigests") or [image["Id"]])[0]
        while True:
            # Read here, in trio's thread (the API changes the store there): the plan's thread
            # sees a copy.
            seen = self.secrets.generation
            secrets = {name: self.secrets.data(name) for name in self.secrets.secrets}
            plan_pod = partial(
                docker_plan,
                pod.object,
                image_user=(image.get("Config") or {}).get("User") or "",
                claims=self.claims,
                labels=self.labels,
                secrets=secrets.get,
                secret_dirs=secret_dirs,
            )
            try:
                plan = await trio.to_thread.run_sync(plan_pod)
                break
            except ContainerConfigError as exc:
                # Tried again when a Secret changes (the kubelet retries at each sync).
                self._update(pod, waiting("CreateContainerConfigError", str(exc)))
                await self.secrets.changed_since(seen)
        allowed = (
            self.network_policies.egress_of(pod.object["metadata"].get("labels") or {})
            if self.network_policies is not None
            else None
        )
        if allowed is not None:
            # The CNI's part: the pod's network, limited before its process runs.
            try:
                holder = await self.pool.run(
                    lambda client: self._hold_network(client, pod, allowed)
                )
            except (docker.errors.APIError, OSError, RuntimeError) as exc:
                self._update(pod, waiting("CreateContainerError", f"network setup: {exc}"))
                await trio.sleep_forever()
            plan.host["network_mode"] = f"container:{holder}"
            # The holder has the pod's host name (its UTS namespace is the pod's, as pause's).
            plan.create.pop("hostname", None)
        try:
            container_id = await self.pool.run(lambda client: self._create(client, pod, plan))
        except docker.errors.APIError as exc:
            self._update(pod, waiting("CreateContainerError", str(exc.explanation or exc)))
            await trio.sleep_forever()
        try:
            await self.pool.run(lambda client: client.start(container_id))
        except docker.errors.APIError as exc:
            start_error = {
                "exitCode": 128,
                "reason": "StartError",
                "message": str(exc.explanation or exc),
                "startedAt": "1970-01-01T00:00:00Z",
                "finishedAt": timestamp(),
                "containerID": f"docker://{container_id}",
            }
            self._update(pod, lambda p: _finish(p, start_error))
            return
        inspected = await self.pool.run(lambda client: client.inspect_container(container_id))
        started = docker_time(inspected["State"].get("StartedAt")) or timestamp()
        ids = {"imageID": image_id, "containerID": f"docker://{container_id}"}
        self._update(pod, lambda p: self._running(p, started, ids))
        await self._wait_exit(container_id)
        await self._record_exit(pod, container_id)

    def _hold_network(self, client: docker.APIClient, pod: FakePod, allowed: list[Allowed]) -> str:
        """Blocking: the pod's network holder, on POD_NETWORK, its namespace's iptables set to
        ``allowed`` (see network_policies.iptables_rules) before anything else runs in it."""
        meta = pod.object["metadata"]
        created = client.create_container(
            image=HOLDER_IMAGE,
            entrypoint=["sleep", "infinity"],
            hostname=meta["name"][:63].rstrip("-."),
            name=f"k8s_POD_{meta['name']}_{meta['namespace']}_{meta['uid']}_0",
            labels={POD_NAME_LABEL: meta["name"], POD_UID_LABEL: meta["uid"], **self.labels},
            host_config=client.create_host_config(
                network_mode=POD_NETWORK, cap_drop=["ALL"], security_opt=["no-new-privileges"]
            ),
        )
        holder = str(created["Id"])
        self.created.add(holder)
        pod.holder_id = holder
        client.start(holder)
        pid = int(client.inspect_container(holder)["State"]["Pid"])
        for rule in iptables_rules(allowed):
            done = subprocess.run(
                ["nsenter", "-t", str(pid), "-n", "iptables", "-w", *rule],
                capture_output=True,
                text=True,
                timeout=CALL_TIMEOUT,
                check=False,
            )
            if done.returncode:
                raise RuntimeError(f"iptables {' '.join(rule)}: {done.stderr.strip()}")
        return holder

    def _create(self, client: docker.APIClient, pod: FakePod, plan: DockerPlan) -> str:
        host_config = client.create_host_config(**plan.host)
        created = client.create_container(**plan.create, host_config=host_config)
        container_id = str(created["Id"])
        # Recorded here, in the thread: a cancellation meanwhile must not lose it.
        self.created.add(container_id)
        pod.container_id = container_id
        return container_id

    @staticmethod
    def _running(pod: dict[str, Any], started: str, ids: dict[str, str]) -> None:
        status = pod["status"]
        status["phase"] = "Running"
        running = {"running": {"startedAt": started}}
        status["containerStatuses"] = [
            _container_status(pod, running, ready=True, started=True, **ids)
        ]
        _set_conditions(status, _condition("Ready", True), _condition("ContainersReady", True))

    async def _wait_exit(self, container_id: str) -> None:
        while not await self.pool.run(
            lambda client: _wait_round(client, container_id), abandon=True, wait=True
        ):
            pass

    async def _record_exit(self, pod: FakePod, container_id: str) -> None:
        inspected = await self.pool.run(lambda client: _inspect_container(client, container_id))
        if inspected is None:
            # Removed behind the fake's back: what the kubelet reports for a lost container.
            terminated = {
                "exitCode": 137,
                "reason": "ContainerStatusUnknown",
                "message": "The container could not be located when the pod was terminated",
                "finishedAt": timestamp(),
            }
        else:
            terminated = terminated_state(inspected, container_id)
        self._update(pod, lambda p: _finish(p, terminated))

    async def _stop_and_record(self, pod: FakePod, container_id: str, grace: int) -> None:
        """Stop the container if it runs (SIGTERM, SIGKILL after ``grace``); record how it
        ended unless the pod shows it already."""
        inspected = await self.pool.run(lambda client: _inspect_container(client, container_id))
        if inspected is None or inspected["State"].get("Status") == "created":
            return
        if inspected["State"].get("Running"):
            await self.pool.run(lambda client: _stop(client, container_id, grace))
        if "terminated" not in pod.container_state:
            await self._record_exit(pod, container_id)

    async def _deadline_exceeded(self, pod: FakePod) -> None:
        if pod.container_id is not None:
            grace = int(pod.object["spec"]["terminationGracePeriodSeconds"])
            await self._stop_and_record(pod, pod.container_id, grace)

        def failed(p: dict[str, Any]) -> None:
            p["status"] |= {
                "phase": "Failed",
                "reason": "DeadlineExceeded",
                "message": DEADLINE_MESSAGE,
            }
            _set_conditions(
                p["status"],
                _condition("PodReadyToStartContainers", False),
                _condition("Ready", False, "PodFailed"),
                _condition("ContainersReady", False, "PodFailed"),
            )

        self._update(pod, failed)

    async def _terminate(self, pod: FakePod) -> None:
        """After a deletion: stop the container with the grace period (SIGTERM, then SIGKILL),
        record how it ended, remove it, and the pod is gone."""
        container_id = pod.container_id
        if container_id is not None:
            await self._stop_and_record(pod, container_id, pod.grace_seconds)
            await self.pool.run(lambda client: _remove(client, container_id))
            self.created.discard(container_id)
        holder_id = pod.holder_id
        if holder_id is not None:
            await self.pool.run(lambda client: _remove(client, holder_id))
            self.created.discard(holder_id)
        await trio.to_thread.run_sync(self.volumes.tear_down, pod.uid)
        self.store.remove(pod)


# --- Docker calls (worker threads) -----------------------------------------------------------


def _inspect_image(client: docker.APIClient, image: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.inspect_image(image)  # type: ignore[no-untyped-call]
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.NotFound:
        return None
    return found


def _inspect_container(client: docker.APIClient, container_id: str) -> dict[str, Any] | None:
    try:
        # (The fake's pods run on Docker only: see tests/integration/engines.py.)
        found: dict[str, Any] = client.inspect_container(container_id)
    except docker.errors.NotFound:
        return None
    return found


def _wait_round(client: docker.APIClient, container_id: str) -> bool:
    """One bounded wait for the container's exit: True once it exited (or is gone)."""
    try:
        client.wait(container_id, timeout=WAIT_ROUND)
    except docker.errors.NotFound:
        return True
    except (requests.exceptions.Timeout, requests.exceptions.ConnectionError):
        return False
    return True


def _stop(client: docker.APIClient, container_id: str, grace: int) -> None:
    try:
        client.stop(container_id, timeout=grace)
    except docker.errors.NotFound:
        return


def _remove(client: docker.APIClient, container_id: str) -> None:
    try:
        client.remove_container(container_id, force=True, v=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code == 409 and "already in progress" in str(exc.explanation):
            return
        raise


def remove_all(pool: DockerPool, container_ids: set[str], label: str) -> None:
    """Blocking: remove every container in ``container_ids`` and every one with ``label``."""

    def sweep(client: docker.APIClient) -> None:
        listed = client.containers(all=True, filters={"label": label}, quiet=True)
        for container_id in container_ids | {str(c["Id"]) for c in listed}:
            _remove(client, container_id)

    pool.call(sweep)


def node_of_engine(pool: DockerPool) -> Node:
    """Blocking: the node this engine makes (its CPUs and memory)."""
    info = pool.call(lambda client: client.info())
    return Node(
        name=NODE_NAME,
        cpu_millis=int(info.get("NCPU", 1)) * 1000,
        memory_bytes=int(info.get("MemTotal", 0)) or 2**40,
    )


__all__ = ["CALL_TIMEOUT", "FAKE_LABEL", "NODE_NAME", "Kubelet", "Node", "docker_plan"]
