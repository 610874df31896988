"""A fake Kubernetes API server, in process (trio), that runs each Pod as a container on the
real Docker engine — so that the Kubernetes runtime, the relay and real MCP clients are tested
end to end where no cluster can run.

Usage::

    async with fake_kubernetes(claims={"projects": Path(...)}, namespace="default") as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")   # server=api.url, user token=api.token
        ...                                              # any Kubernetes client, pods/attach
        api.pods["name"].object, api.pods["name"].container_id

What it serves, as kube-apiserver does (JSON, bearer token required, errors as
``metav1.Status``): ``/version``; create, get, list (label and field selectors), watch
(``resourceVersion``, ``timeoutSeconds``) and delete (grace period, preconditions) of pods in
one namespace; ``pods/attach`` over a WebSocket (v5.channel.k8s.io, v4.channel.k8s.io); create,
get, list (label and field selectors) and delete (preconditions) of Secrets (``data`` in
base64, ``stringData`` merged, keys validated; see :mod:`.secret_store`); create, get, list
(label selector) and delete of networking.k8s.io/v1 NetworkPolicies (validated; see
:mod:`.network_policies`). What a kubelet does,
done with Docker: the pod is scheduled on the one node (or stays Pending, Unschedulable), its
secret volumes set up (or it waits in ContainerCreating for their Secret or key), its image
checked against the pull policy, its container created from the spec (env with ``$(VAR)``
expansion and ``secretKeyRef`` — a missing Secret or key is CreateContainerConfigError, tried
again when a Secret changes —, command/args, security context, ``fsGroup``, limits, PVC,
emptyDir and secret volumes, subPath), started, its status (phase, conditions,
containerStatuses) kept as the kubelet reports it, its exit (code, Completed/Error/OOMKilled),
activeDeadlineSeconds and deletion (SIGTERM, grace, SIGKILL, container removed, its volumes
torn down, DELETED).

Docker containers: named ``k8s_<container>_<pod>_<namespace>_<uid>_0``, labelled with the
pod's own labels, the ``io.kubernetes.*`` labels of the kubelet's runtimes, and
``reactor-fabric.kube-fake=<instance>``. Copying the pod's labels is deliberate: a pod made by
the product carries ``reactor-fabric.managed=true`` (and its instance and owner labels), so a
container the fake leaked is exactly what CI's leak check (``.ci/run``: Docker containers
labelled ``reactor-fabric.managed=true``) finds. The same labels mean that a Docker-runtime
orchestrator's sweeper on this engine may remove a pod's container whose owning process is
gone; the fake then reports what a kubelet reports for a lost container
(``ContainerStatusUnknown``, exit code 137).

FIDELITY — what kube-apiserver and a kubelet do that this fake does not:

- One namespace (any other: ``namespaces "x" not found`` on create, empty lists), one node
  (``kube-fake``: this machine's CPUs and memory). No scheduler beyond: the claims exist, the
  nodeSelector matches the node's labels, one pod's requests fit the node (requests of pods
  are not summed; affinity, taints, tolerations are ignored); no Events API (the reasons are in
  the pod's conditions and container statuses only); no controllers (ownerReferences are kept
  but nothing garbage-collects), no finalizers (refused), no admission plugins beyond the
  defaults they add (serviceAccountName, tolerations, priority). No PATCH/PUT, no
  ``pods/log``, ``pods/exec``, ``pods/status``; discovery lists only namespaces, pods,
  pods/attach and secrets of the core group, and no other group.
- Network: always ``network_mode: none``. A real pod has a network (and an IP) unless a
  NetworkPolicy denies traffic; the fake's have none and no ``podIP``. The
  ``KUBERNETES_SERVICE_*`` variables a pod gets are set, pointing nowhere.
- No image pulls: no registry is reachable. An image Docker lacks is ``ErrImageNeverPull``
  (``Never``) or ``ErrImagePull``/``ImagePullBackOff`` (``IfNotPresent``, ``Always``), looked
  for again after each back-off; ``Always`` with a local image runs it without pulling.
- What the fake cannot honour is refused with 422 Invalid (a ``Forbidden`` cause saying "not
  supported by the fake API server"): more than one container, init or ephemeral containers,
  ``restartPolicy`` other than Never (no restarts), ``tty``, privileged, host namespaces, user
  namespaces, runtime classes, probes, lifecycle hooks, ``envFrom``, a ``valueFrom`` other
  than ``secretKeyRef``, volumes other than persistentVolumeClaim, emptyDir and secret, an
  emptyDir mounted twice or with a subPath, a secret volume with a subPath, ``subPathExpr``,
  mount propagation, ``fsGroupChangePolicy``, sysctls, SELinux/Windows options, Localhost
  seccomp/AppArmor profiles; Secrets of the built-in ``kubernetes.io/*`` types (their
  required keys are not checked), Secret finalizers.
- NetworkPolicies (the fake's CNI): enforced for egress only, and only as the pod starts: a
  pod an ``Egress`` policy selects runs in the network namespace of a holder container (the
  kubelet's "pause", image ``reactor-fabric/base:bookworm``, never pulled) on Docker's
  ``bridge`` network, whose iptables (set with ``nsenter``, so the fake needs root and the
  engine on this machine) accept loopback, answers, and the policies' ipBlock:port
  destinations, and drop everything else both ways — before the pod's container exists. A
  policy created or deleted later does not change a running pod (a CNI would). Pods no
  policy selects keep ``network: none`` (no network at all, which no cluster gives: there a
  pod without policy reaches everything). Refused as not enforced (403 Forbidden cause):
  ingress rules, peers by pod or namespace selector, named ports, ``endPort``,
  ``matchExpressions``; no watch, update or patch; IPv4 only.
- Secrets: no watch, update or patch (a watch is refused with 400); ``immutable`` is kept but
  means nothing without updates; the 1 MiB size limit is the request body's bound. A secret
  volume is written once, when the pod is set up: a Secret changed later does not reach it
  (the kubelet's sync would update it within a minute or so). A mount that waits for its
  Secret shows ``MountVolume.SetUp failed ...`` as the waiting container's message (a kubelet
  reports it as a FailedMount event and leaves the message empty). The volume's files are in
  the host's shared memory (``/dev/shm``), bound read-only; written by the fake, they are
  root's only when the fake runs as root.
- ``fsGroup``: added to the container's groups, and given to secret volumes' files (as the
  kubelet does); emptyDirs stay Docker tmpfs mounts (mode 0777, root's) and claims are left
  as they are (the kubelet would give both to the group, a claim depending on its driver).
- Validation covers what the API validates in the fields the fake maps (names, labels, images,
  pull and restart policies, env names, quantities and requests ≤ limits, volumes and mounts,
  ``subPath`` absolute or with ``..`` — refused at create, as the API refuses them); unknown
  fields are ignored, not pruned with a warning header; no ``limit``/``continue`` paging.
- resourceVersion: one counter for the store (as etcd's revision); a watch from a
  resourceVersion replays the last 1000 events and answers 410 Expired (an ERROR event) before
  them; no bookmarks, no ``sendInitialEvents``, no "too large resource version" wait. Lists
  ignore ``resourceVersion``/``resourceVersionMatch`` (always the latest).
- subPath: checked by resolving paths (``realpath``: every existing component must stay in
  the volume), then bound by that resolved path — not by the kubelet's openat walk and
  ``/proc/self/fd`` bind, so a symlink swapped in between the check and the bind is a window
  the kubelet does not have. A claim is the host directory given in ``claims``, bound directly
  (no PersistentVolume, no access modes, no capacity).
- emptyDir (either medium) is a tmpfs of ``sizeLimit`` (else the container's memory limit):
  disk-backed emptyDirs also count against memory; no eviction at ``sizeLimit``.
- Limits: memory (``mem_limit``, no swap), CPU (``nano_cpus``) and ``cpu.shares`` from the CPU
  request are set; no pids limit (a kubelet's ``podPidsLimit`` is per node), no
  ``oom_score_adj`` by QoS class, ephemeral-storage ignored.
- Seccomp: a pod without ``seccompProfile`` runs Unconfined, as under a kubelet without
  ``--seccomp-default``; ``RuntimeDefault`` is Docker's default profile (not containerd's).
  AppArmor and the capability set are Docker's defaults where the spec says nothing.
- pods/attach: v5 and v4 only; a client offering neither gets 403 (what the apiserver answers
  to protocols it does not support) — a real kubelet would also accept none and the pre-v4
  ``channel.k8s.io`` protocols. No TTY, no resize. A container that is not running is refused
  as the kubelet refuses it: v4, HTTP 500 ``container not found ("server")``; v5, the upgrade
  then an InternalError status. Attach ends with a Success status whatever the exit code (as
  the kubelet's ServeAttach does; exec's NonZeroExitCode is not attach's). The status is
  followed by a close frame and a wait of at most 5 s for the client's close.
- Deletion: an unscheduled or ended pod, or grace 0, is deleted at once (its container is
  killed after, in the background); otherwise DELETED comes after the container stopped and
  was removed. A repeated delete does not shorten a grace period already running. Grace 0
  kills at once (a kubelet still gives 2 s).
- Timing: statuses change within milliseconds of Docker's events (a kubelet reports within its
  relist period, about 1 s); ``activeDeadlineSeconds`` counts from scheduling.
"""

from __future__ import annotations

from .kubelet import FAKE_LABEL, NODE_NAME
from .pods import FakePod
from .server import FakeKubernetes, fake_kubernetes

__all__ = ["FAKE_LABEL", "NODE_NAME", "FakeKubernetes", "FakePod", "fake_kubernetes"]
