"""A Pod create request as kube-apiserver admits it: decoding, defaulting, validation. Pure.

:func:`admit_pod` returns the object to store, or raises :class:`~.api.ApiError` with the
status the API server would answer: 400 for what does not decode as a Pod, 422 Invalid with
field causes for what Kubernetes' validation refuses — and also 422, with a ``Forbidden`` cause
saying so, for what this fake cannot honour (see the package's FIDELITY notes).
"""

from __future__ import annotations

import copy
import re
import secrets
import uuid
from typing import Any, Final, TypeVar

from .api import (
    DNS1123_LABEL,
    DNS1123_LABEL_MESSAGE,
    DNS1123_SUBDOMAIN,
    DNS1123_SUBDOMAIN_MESSAGE,
    LABEL_VALUE_MESSAGE,
    Cause,
    bad_request,
    duplicate,
    field_not_found,
    forbidden,
    invalid,
    invalid_value,
    label_key_errors,
    label_value_ok,
    parse_quantity,
    required,
    timestamp,
    unsupported,
)
from .secret_store import config_key_errors

FAKE: Final = "not supported by the fake API server (tests/kube_fake)"
PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
RESTART_POLICIES: Final = ("Always", "OnFailure", "Never")
_ENV_NAME: Final = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_ENV_NAME_MESSAGE: Final = (
    "a valid environment variable name must consist of alphabetic characters, digits, '_', "
    "'-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or "
    "'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"
)
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
_MAX_INT32: Final = 2_147_483_647
# Volume sources the fake maps onto Docker; any other is refused.
_SUPPORTED_VOLUMES: Final = ("persistentVolumeClaim", "emptyDir", "secret")
_KNOWN_VOLUMES: Final = (
    *_SUPPORTED_VOLUMES,
    "hostPath", "configMap", "projected", "downwardAPI", "nfs", "iscsi", "csi",
    "ephemeral", "image", "gitRepo", "glusterfs", "rbd", "cephfs", "cinder", "fc", "flocker",
    "flexVolume", "awsElasticBlockStore", "gcePersistentDisk", "azureDisk", "azureFile",
    "vsphereVolume", "quobyte", "photonPersistentDisk", "portworxVolume", "scaleIO",
    "storageos",
)  # fmt: skip
_UNSUPPORTED_CONTAINER_FIELDS: Final = (
    "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "envFrom", "volumeDevices",
    "resizePolicy", "restartPolicy",
)  # fmt: skip
_SERVER_OWNED: Final = (
    "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink",
)  # fmt: skip
_UNSUPPORTED_SECURITY: Final = ("seLinuxOptions", "windowsOptions")
_UNSUPPORTED_POD_SECURITY: Final = (
    "fsGroupChangePolicy", "sysctls", "seLinuxOptions", "windowsOptions",
    "seLinuxChangePolicy",
)  # fmt: skip
_FILE_MODE_MESSAGE: Final = "must be a number between 0 and 0777 (octal), both inclusive"
_IDS: Final = ("runAsUser", "runAsGroup")
_ENV_SOURCES: Final = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
T = TypeVar("T")


def admit_pod(body: object, *, namespace: str) -> dict[str, Any]:
    """The Pod to store for ``POST /api/v1/namespaces/{namespace}/pods`` with ``body``.

    Sets what the API server sets (uid, resourceVersion placeholder, creationTimestamp, the
    defaults of the v1 types and of the default admission plugins, ``status.phase: Pending``).
    Error handling: raises :class:`ApiError` (400 or 422).
    """
    pod = _decode(body, namespace)
    _default(pod)
    causes = _validate(pod)
    if causes:
        raise invalid(pod["metadata"]["name"], causes)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod)}
    return pod


# --- decoding --------------------------------------------------------------------------------

_JSON_TYPES: Final = {dict: "object", list: "array", str: "string", bool: "bool"}


def _typed(value: object, kind: type[T], field: str, go_type: str) -> T | None:
    """``value`` if it is a ``kind`` (None when absent or null); else the decoding error."""
    if value is None:
        return None
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        found = "number" if isinstance(value, int | float) else _JSON_TYPES.get(type(value), "?")
        raise bad_request(
            f'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal {found} '
            f"into Go struct field {field} of type {go_type}"
        )
    return value  # type: ignore[return-value]


def _decode(body: object, namespace: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request(
            "the object provided is unrecognized (must be of type Pod): couldn't get "
            "version/kind; json parse error: expected a JSON object"
        )
    if body.get("kind") != "Pod" or body.get("apiVersion") != "v1":
        raise bad_request(
            f"the API version in the data ({body.get('apiVersion')}) and kind "
            f"({body.get('kind')}) do not match the expected v1 Pod"
        )
    pod = copy.deepcopy(body)
    metadata = _typed(pod.get("metadata"), dict, "Pod.metadata", "v1.ObjectMeta") or {}
    given_namespace = metadata.get("namespace")
    if given_namespace and given_namespace != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    for key in ("labels", "annotations"):
        mapping = _typed(metadata.get(key), dict, f"ObjectMeta.metadata.{key}", "string")
        for item in (mapping or {}).values():
            _typed(item, str, f"ObjectMeta.metadata.{key}", "string")
    name = _typed(metadata.get("name"), str, "ObjectMeta.metadata.name", "string") or ""
    generate = _typed(
        metadata.get("generateName"), str, "ObjectMeta.metadata.generateName", "string"
    )
    if not name and generate:
        name = generate[:58] + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
    # What the server owns: whatever the client sent for these is replaced or dropped.
    for key in _SERVER_OWNED:
        metadata.pop(key, None)
    metadata |= {
        "name": name,
        "namespace": namespace,
        "uid": str(uuid.uuid4()),
        "creationTimestamp": timestamp(),
    }
    pod["metadata"] = metadata
    spec = _typed(pod.get("spec"), dict, "Pod.spec", "v1.PodSpec") or {}
    pod["spec"] = spec
    for key in ("containers", "initContainers", "ephemeralContainers", "volumes"):
        items = _typed(spec.get(key), list, f"PodSpec.spec.{key}", "[]v1.Container") or []
        for item in items:
            _typed(item, dict, f"PodSpec.spec.{key}", "v1.Container")
    for container in spec.get("containers") or []:
        _decode_container(container)
    for key in ("activeDeadlineSeconds", "terminationGracePeriodSeconds"):
        _typed(spec.get(key), int, f"PodSpec.spec.{key}", "int64")
    _typed(
        spec.get("securityContext"), dict, "PodSpec.spec.securityContext", "v1.PodSecurityContext"
    )
    _typed(spec.get("nodeSelector"), dict, "PodSpec.spec.nodeSelector", "map[string]string")
    return pod


def _decode_container(container: dict[str, Any]) -> None:
    for key in ("name", "image", "imagePullPolicy", "workingDir"):
        _typed(container.get(key), str, f"Container.spec.containers.{key}", "string")
    for key in ("command", "args"):
        for item in _typed(container.get(key), list, f"Container.{key}", "[]string") or []:
            _typed(item, str, f"Container.spec.containers.{key}", "string")
    for key in ("env", "volumeMounts"):
        for item in _typed(container.get(key), list, f"Container.{key}", "[]object") or []:
            _typed(item, dict, f"Container.spec.containers.{key}", "object")
    for key in ("stdin", "stdinOnce", "tty"):
        _typed(container.get(key), bool, f"Container.spec.containers.{key}", "bool")
    resources = _typed(
        container.get("resources"), dict, "Container.resources", "v1.ResourceRequirements"
    )
    for key in ("limits", "requests"):
        _typed((resources or {}).get(key), dict, f"ResourceRequirements.{key}", "v1.ResourceList")
    security = _typed(
        container.get("securityContext"), dict, "Container.securityContext", "v1.SecurityContext"
    )
    capabilities = _typed(
        (security or {}).get("capabilities"),
        dict,
        "SecurityContext.capabilities",
        "v1.Capabilities",
    )
    for key in ("add", "drop"):
        for item in (
            _typed((capabilities or {}).get(key), list, f"Capabilities.{key}", "[]string") or []
        ):
            _typed(item, str, f"Capabilities.{key}", "string")


# --- defaulting ------------------------------------------------------------------------------


def default_pull_policy(image: str) -> str:
    """``Always`` for ``:latest`` or an untagged image (without a digest), else ``IfNotPresent``."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _default(pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    defaults = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "enableServiceLinks": True,
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "priority": 0,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {
                "key": f"node.kubernetes.io/{taint}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
            for taint in ("not-ready", "unreachable")
        ],
    }
    for key, value in defaults.items():
        if spec.get(key) is None:
            spec[key] = value
    for container in spec.get("containers") or []:
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        if not container.get("imagePullPolicy"):
            container["imagePullPolicy"] = default_pull_policy(container.get("image") or "")
        resources = container.setdefault("resources", {})
        limits = resources.get("limits") or {}
        if limits:
            requests = resources.setdefault("requests", {})
            for resource, amount in limits.items():
                requests.setdefault(resource, amount)
    for volume in spec.get("volumes") or []:
        if isinstance(volume.get("emptyDir"), dict):
            volume["emptyDir"].setdefault("medium", "")
        if isinstance(volume.get("secret"), dict):
            volume["secret"].setdefault("defaultMode", 0o644)


def qos_class(pod: dict[str, Any]) -> str:
    """Guaranteed (every container's requests equal its cpu and memory limits), BestEffort (no
    requests nor limits at all), else Burstable."""
    containers = pod["spec"].get("containers") or []
    any_set = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        any_set = any_set or bool(limits) or bool(requests)
        for resource in ("cpu", "memory"):
            if resource not in limits or requests.get(resource) != limits[resource]:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# --- validation ------------------------------------------------------------------------------


def _validate(pod: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    metadata = pod["metadata"]
    name = metadata["name"]
    if not name:
        causes.append(
            Cause(
                "FieldValueRequired",
                "metadata.name",
                "Required value: name or generateName is required",
            )
        )
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        causes.append(invalid_value("metadata.name", name, DNS1123_SUBDOMAIN_MESSAGE))
    for key, value in (metadata.get("labels") or {}).items():
        causes += label_key_errors("metadata.labels", key)
        if not label_value_ok(value):
            causes.append(invalid_value("metadata.labels", value, LABEL_VALUE_MESSAGE))
    if metadata.get("finalizers"):
        causes.append(
            forbidden("metadata.finalizers", f"finalizers are {FAKE}: nothing would remove them")
        )
    spec = pod["spec"]
    causes += _validate_spec(spec)
    volumes = _validate_volumes(spec.get("volumes") or [], causes)
    containers = spec.get("containers") or []
    if not containers:
        causes.append(required("spec.containers"))
    elif len(containers) > 1:
        causes.append(forbidden("spec.containers", f"more than one container is {FAKE}"))
    for index, container in enumerate(containers):
        causes += _validate_container(container, f"spec.containers[{index}]", volumes)
    return causes


def _validate_spec(spec: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    policy = spec["restartPolicy"]
    if policy not in RESTART_POLICIES:
        causes.append(unsupported("spec.restartPolicy", policy, RESTART_POLICIES))
    elif policy != "Never":
        causes.append(
            forbidden(
                "spec.restartPolicy",
                f"restartPolicy {policy} is {FAKE} (only Never: containers are not restarted)",
            )
        )
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and not 1 <= deadline <= _MAX_INT32:
        causes.append(
            invalid_value(
                "spec.activeDeadlineSeconds",
                deadline,
                f"must be between 1 and {_MAX_INT32}, inclusive",
            )
        )
    grace = spec["terminationGracePeriodSeconds"]
    if grace < 0:
        causes.append(
            invalid_value(
                "spec.terminationGracePeriodSeconds", grace, "must be greater than or equal to 0"
            )
        )
    causes += [
        forbidden(f"spec.{key}", f"{key} are {FAKE}")
        for key in ("initContainers", "ephemeralContainers")
        if spec.get(key)
    ]
    causes += [
        forbidden(f"spec.{key}", f"{key} is {FAKE}")
        for key in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace")
        if spec.get(key)
    ]
    if spec.get("hostUsers") is False:
        causes.append(forbidden("spec.hostUsers", f"user namespaces are {FAKE}"))
    if spec.get("runtimeClassName"):
        causes.append(forbidden("spec.runtimeClassName", f"runtime classes are {FAKE}"))
    security = spec.get("securityContext") or {}
    causes += [
        forbidden(f"spec.securityContext.{key}", f"{key} is {FAKE}")
        for key in _UNSUPPORTED_POD_SECURITY
        if security.get(key)
    ]
    causes += _validate_ids(security, "spec.securityContext", (*_IDS, "fsGroup"))
    causes += _validate_profiles(security, "spec.securityContext")
    for group in security.get("supplementalGroups") or []:
        if not isinstance(group, int) or not 0 <= group <= _MAX_INT32:
            causes.append(
                invalid_value(
                    "spec.securityContext.supplementalGroups",
                    group,
                    f"must be between 0 and {_MAX_INT32}, inclusive",
                )
            )
    return causes


def _validate_ids(security: dict[str, Any], path: str, keys: tuple[str, ...] = _IDS) -> list[Cause]:
    causes: list[Cause] = []
    for key in keys:
        value = security.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_INT32
        ):
            causes.append(
                invalid_value(
                    f"{path}.{key}", value, f"must be between 0 and {_MAX_INT32}, inclusive"
                )
            )
    return causes


def _validate_profiles(security: dict[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    for key in ("seccompProfile", "appArmorProfile"):
        profile = security.get(key) or {}
        kind = profile.get("type") if isinstance(profile, dict) else profile
        if kind == "Localhost":
            causes.append(forbidden(f"{path}.{key}.type", f"Localhost profiles are {FAKE}"))
        elif kind not in (None, "RuntimeDefault", "Unconfined"):
            causes.append(
                unsupported(
                    f"{path}.{key}.type", kind, ("Localhost", "RuntimeDefault", "Unconfined")
                )
            )
    return causes


def _validate_volumes(
    volumes: list[dict[str, Any]], causes: list[Cause]
) -> dict[str, dict[str, Any]]:
    """The volumes by name; their errors appended to ``causes``."""
    by_name: dict[str, dict[str, Any]] = {}
    for index, volume in enumerate(volumes):
        path = f"spec.volumes[{index}]"
        name = volume.get("name") or ""
        if not name:
            causes.append(required(f"{path}.name"))
        elif len(name) > 63 or not DNS1123_LABEL.fullmatch(name):
            causes.append(invalid_value(f"{path}.name", name, DNS1123_LABEL_MESSAGE))
        elif name in by_name:
            causes.append(duplicate(f"{path}.name", name))
        by_name.setdefault(name, volume)
        sources = [key for key in _KNOWN_VOLUMES if volume.get(key) is not None]
        if not sources:
            causes.append(
                Cause("FieldValueRequired", path, "Required value: must specify a volume type")
            )
        elif len(sources) > 1:
            causes.append(
                forbidden(f"{path}.{sources[1]}", "may not specify more than 1 volume type")
            )
        elif sources[0] not in _SUPPORTED_VOLUMES:
            causes.append(forbidden(f"{path}.{sources[0]}", f"{sources[0]} volumes are {FAKE}"))
        elif sources[0] == "persistentVolumeClaim":
            claim = volume["persistentVolumeClaim"]
            if not isinstance(claim, dict) or not claim.get("claimName"):
                causes.append(required(f"{path}.persistentVolumeClaim.claimName"))
        elif sources[0] == "secret":
            causes += _validate_secret_volume(volume["secret"], f"{path}.secret")
        else:
            causes += _validate_empty_dir(volume["emptyDir"], f"{path}.emptyDir")
    return by_name


def _validate_empty_dir(empty_dir: object, path: str) -> list[Cause]:
    if not isinstance(empty_dir, dict):
        return [invalid_value(path, empty_dir, "must be an object")]
    causes: list[Cause] = []
    medium = empty_dir.get("medium") or ""
    if medium not in ("", "Memory"):
        causes.append(forbidden(f"{path}.medium", f"medium {medium} is {FAKE}"))
    size = empty_dir.get("sizeLimit")
    if size is not None:
        causes += _quantity_errors(f"{path}.sizeLimit", size)
    return causes


def _file_mode_ok(mode: object) -> bool:
    return isinstance(mode, int) and not isinstance(mode, bool) and 0 <= mode <= 0o777


def _validate_secret_volume(source: object, path: str) -> list[Cause]:
    """validateSecretVolumeSource: a secretName, modes within 0777, each item a key and a
    relative path that does not climb (validateKeyToPath)."""
    if not isinstance(source, dict):
        return [invalid_value(path, source, "must be an object")]
    causes: list[Cause] = []
    if not source.get("secretName"):
        causes.append(required(f"{path}.secretName"))
    mode = source.get("defaultMode")
    if mode is not None and not _file_mode_ok(mode):
        causes.append(invalid_value(f"{path}.defaultMode", mode, _FILE_MODE_MESSAGE))
    for index, item in enumerate(source.get("items") or []):
        where = f"{path}.items[{index}]"
        if not isinstance(item, dict):
            causes.append(invalid_value(where, item, "must be an object"))
            continue
        if not item.get("key"):
            causes.append(required(f"{where}.key"))
        item_path = item.get("path") or ""
        if not item_path:
            causes.append(required(f"{where}.path"))
        causes += _sub_path_errors(item_path, f"{where}.path")
        if item_path.startswith(".."):
            causes.append(invalid_value(f"{where}.path", item_path, "must not start with '..'"))
        if item.get("mode") is not None and not _file_mode_ok(item["mode"]):
            causes.append(invalid_value(f"{where}.mode", item["mode"], _FILE_MODE_MESSAGE))
    return causes


def _quantity_errors(field: str, value: object) -> list[Cause]:
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        return [invalid_value(field, value, str(exc))]
    if amount < 0:
        return [invalid_value(field, value, "must be greater than or equal to 0")]
    return []


def _validate_container(
    container: dict[str, Any], path: str, volumes: dict[str, dict[str, Any]]
) -> list[Cause]:
    causes: list[Cause] = []
    name = container.get("name") or ""
    if not name:
        causes.append(required(f"{path}.name"))
    elif len(name) > 63 or not DNS1123_LABEL.fullmatch(name):
        causes.append(invalid_value(f"{path}.name", name, DNS1123_LABEL_MESSAGE))
    image = container.get("image") or ""
    if not image:
        causes.append(required(f"{path}.image"))
    elif image != image.strip():
        causes.append(
            invalid_value(f"{path}.image", image, "must not have leading or trailing whitespace")
        )
    policy = container["imagePullPolicy"]
    if policy not in PULL_POLICIES:
        causes.append(unsupported(f"{path}.imagePullPolicy", policy, PULL_POLICIES))
    if container.get("tty"):
        causes.append(forbidden(f"{path}.tty", f"a TTY is {FAKE}"))
    causes += [
        forbidden(f"{path}.{key}", f"{key} is {FAKE}")
        for key in _UNSUPPORTED_CONTAINER_FIELDS
        if container.get(key)
    ]
    causes += _validate_env(container.get("env") or [], f"{path}.env")
    causes += _validate_resources(container.get("resources") or {}, f"{path}.resources")
    causes += _validate_security(container.get("securityContext") or {}, f"{path}.securityContext")
    causes += _validate_mounts(container.get("volumeMounts") or [], f"{path}.volumeMounts", volumes)
    return causes


def _validate_env(env: list[dict[str, Any]], path: str) -> list[Cause]:
    causes: list[Cause] = []
    for index, variable in enumerate(env):
        name = variable.get("name") or ""
        if not name:
            causes.append(required(f"{path}[{index}].name"))
        elif not _ENV_NAME.fullmatch(name):
            causes.append(invalid_value(f"{path}[{index}].name", name, _ENV_NAME_MESSAGE))
        if not isinstance(variable.get("value", ""), str):
            causes.append(
                invalid_value(f"{path}[{index}].value", variable.get("value"), "must be a string")
            )
        elif variable.get("valueFrom") is not None:
            causes += _validate_value_from(variable, f"{path}[{index}].valueFrom")
    return causes


def _validate_value_from(variable: dict[str, Any], path: str) -> list[Cause]:
    """validateEnvVarValueFrom: exactly one source, and no ``value`` beside it; of the
    sources, the fake resolves ``secretKeyRef`` only."""
    value_from = variable["valueFrom"]
    sources = [k for k in _ENV_SOURCES if isinstance(value_from, dict) and value_from.get(k)]
    problem = (
        "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
        if not sources
        else "may not be specified when `value` is not empty"
        if variable.get("value")
        else "may not have more than one field specified at a time"
        if len(sources) > 1
        else None
    )
    if problem is not None:
        return [invalid_value(path, "", problem)]
    if sources[0] != "secretKeyRef":
        return [forbidden(f"{path}.{sources[0]}", f"{sources[0]} is {FAKE}")]
    reference = value_from["secretKeyRef"]
    if not isinstance(reference, dict):
        return [invalid_value(f"{path}.secretKeyRef", reference, "must be an object")]
    causes: list[Cause] = []
    name = reference.get("name") or ""
    if len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        causes.append(invalid_value(f"{path}.secretKeyRef.name", name, DNS1123_SUBDOMAIN_MESSAGE))
    key = reference.get("key") or ""
    if not key:
        causes.append(required(f"{path}.secretKeyRef.key"))
    causes += [
        invalid_value(f"{path}.secretKeyRef.key", key, problem)
        for problem in (config_key_errors(key) if key else [])
    ]
    return causes


def _validate_resources(resources: dict[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    parsed: dict[str, dict[str, Any]] = {"limits": {}, "requests": {}}
    for kind in ("limits", "requests"):
        for resource, amount in (resources.get(kind) or {}).items():
            if resource not in ("cpu", "memory", "ephemeral-storage"):
                causes.append(
                    forbidden(f"{path}.{kind}[{resource}]", f"resource {resource} is {FAKE}")
                )
                continue
            errors = _quantity_errors(f"{path}.{kind}[{resource}]", amount)
            causes += errors
            if not errors:
                parsed[kind][resource] = parse_quantity(amount)
    for resource, request in parsed["requests"].items():
        limit = parsed["limits"].get(resource)
        if limit is not None and request > limit:
            causes.append(
                invalid_value(
                    f"{path}.requests",
                    str(resources["requests"][resource]),
                    f"must be less than or equal to {resource} limit of "
                    f"{resources['limits'][resource]}",
                )
            )
    return causes


def _validate_security(security: dict[str, Any], path: str) -> list[Cause]:
    causes = _validate_ids(security, path) + _validate_profiles(security, path)
    if security.get("privileged"):
        causes.append(forbidden(f"{path}.privileged", f"privileged containers are {FAKE}"))
    causes += [
        forbidden(f"{path}.{key}", f"{key} is {FAKE}")
        for key in _UNSUPPORTED_SECURITY
        if security.get(key)
    ]
    if security.get("procMount") not in (None, "Default"):
        causes.append(
            forbidden(f"{path}.procMount", f"procMount {security['procMount']} is {FAKE}")
        )
    adds = (security.get("capabilities") or {}).get("add") or []
    if security.get("allowPrivilegeEscalation") is False and any(
        c.upper().removeprefix("CAP_") == "SYS_ADMIN" for c in adds
    ):
        causes.append(
            invalid_value(
                path,
                "",
                "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` "
                "CAP_SYS_ADMIN",
            )
        )
    return causes


def _validate_mounts(
    mounts: list[dict[str, Any]], path: str, volumes: dict[str, dict[str, Any]]
) -> list[Cause]:
    causes: list[Cause] = []
    targets: set[str] = set()
    empty_dirs: set[str] = set()
    for index, mount in enumerate(mounts):
        where = f"{path}[{index}]"
        name = mount.get("name") or ""
        if not name:
            causes.append(required(f"{where}.name"))
        elif name not in volumes:
            causes.append(field_not_found(f"{where}.name", name))
        elif volumes[name].get("secret") is not None and mount.get("subPath"):
            # The kubelet binds a file of the volume, which then never sees an update.
            causes.append(forbidden(f"{where}.subPath", f"a subPath of a secret volume is {FAKE}"))
        elif volumes[name].get("emptyDir") is not None:
            # Each mount of an emptyDir is a tmpfs of its own: nothing to share, nothing below.
            if name in empty_dirs or mount.get("subPath"):
                detail = f"an emptyDir mounted twice or with a subPath is {FAKE}"
                causes.append(forbidden(f"{where}.name", detail))
            empty_dirs.add(name)
        target = mount.get("mountPath") or ""
        if not target:
            causes.append(required(f"{where}.mountPath"))
        elif target in targets:
            causes.append(invalid_value(f"{where}.mountPath", target, "must be unique"))
        targets.add(target)
        causes += _sub_path_errors(mount.get("subPath") or "", f"{where}.subPath")
        if mount.get("subPathExpr"):
            causes.append(forbidden(f"{where}.subPathExpr", f"subPathExpr is {FAKE}"))
        if mount.get("mountPropagation") not in (None, "None"):
            causes.append(forbidden(f"{where}.mountPropagation", f"mount propagation is {FAKE}"))
    return causes


def _sub_path_errors(sub_path: str, field: str) -> list[Cause]:
    """As the API validates ``subPath`` (validateLocalDescendingPath): relative, no ``..``."""
    if not sub_path:
        return []
    if sub_path.startswith("/"):
        return [invalid_value(field, sub_path, "must be a relative path")]
    if ".." in sub_path.split("/"):
        return [invalid_value(field, sub_path, "must not contain '..'")]
    return []
