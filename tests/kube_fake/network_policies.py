"""The fake's networking.k8s.io/v1 NetworkPolicies: a create request as kube-apiserver admits it
(defaulting and validation; pure), the store the API and the kubelet share, and what the
kubelet (the fake's CNI) makes of them for one pod (:func:`egress_of`).

Admission follows ``ValidateNetworkPolicy``: the name a DNS subdomain; ``podSelector`` a valid
label selector; ``policyTypes`` of ``Ingress``/``Egress`` (at most both, defaulted as the API
server does: ``Ingress``, plus ``Egress`` when the spec has egress rules); each port's protocol
TCP, UDP or SCTP (default TCP), its port 1-65535 or a name, ``endPort`` only after a numeric
port and not below it; each peer at least one of ``podSelector``/``namespaceSelector``/
``ipBlock``, an ``ipBlock`` alone, its ``cidr`` a valid CIDR and each ``except`` inside it.

What the fake does not enforce it refuses (403 Forbidden cause, as for Secrets): peers by pod
or namespace selector, ingress rules (the pods' isolation is all the fake gives: an
``Ingress`` policy type with no rules), named ports, ``endPort`` and ``matchExpressions``.
Enforcement (the kubelet): a pod that an ``Egress`` policy selects when it starts reaches only
loopback and the union of its policies' ipBlock:port destinations (traffic it started, and the
answers); nothing reaches it. A policy created after a pod started does not change it (a real
CNI would apply it to the running pod).
"""

from __future__ import annotations

import copy
import ipaddress
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .api import (
    DNS1123_SUBDOMAIN,
    DNS1123_SUBDOMAIN_MESSAGE,
    LABEL_VALUE_MESSAGE,
    Cause,
    already_exists,
    bad_request,
    forbidden,
    invalid,
    invalid_value,
    label_key_errors,
    label_value_ok,
    not_found,
    required,
    timestamp,
    unsupported,
)
from .pods import PodStore, Selection

FAKE: Final = "not supported by the fake API server (tests/kube_fake)"
GROUP_VERSION: Final = "networking.k8s.io/v1"
_PROTOCOLS: Final = ("TCP", "UDP", "SCTP")
_POLICY_TYPES: Final = ("Ingress", "Egress")
_PORT_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SERVER_OWNED: Final = (
    "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink",
)  # fmt: skip


@dataclass(frozen=True)
class Allowed:
    """One destination a pod may reach: a network (an ipBlock's CIDR, minus its excepts), a
    protocol and a port (None: every port)."""

    cidr: str
    protocol: str
    port: int | None
    excepted: tuple[str, ...] = ()


def admit_network_policy(body: object, *, namespace: str) -> dict[str, Any]:
    """The NetworkPolicy to store for ``POST .../namespaces/{namespace}/networkpolicies``.

    Error handling: raises :class:`~.api.ApiError` (400 or 422).
    """
    if not isinstance(body, dict):
        raise bad_request("the object provided is unrecognized (must be of type NetworkPolicy)")
    if body.get("kind") != "NetworkPolicy" or body.get("apiVersion") != GROUP_VERSION:
        raise bad_request(
            f"the API version in the data ({body.get('apiVersion')}) and kind "
            f"({body.get('kind')}) do not match the expected {GROUP_VERSION} NetworkPolicy"
        )
    policy = copy.deepcopy(body)
    metadata = policy.get("metadata") or {}
    spec = policy.get("spec") or {}
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise bad_request('NetworkPolicy in version "v1" cannot be handled: not objects')
    if metadata.get("namespace") and metadata["namespace"] != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    for key in _SERVER_OWNED:
        metadata.pop(key, None)
    metadata |= {
        "namespace": namespace,
        "uid": str(uuid.uuid4()),
        "creationTimestamp": timestamp(),
        "generation": 1,
    }
    policy["metadata"], policy["spec"] = metadata, spec
    if "policyTypes" not in spec or not spec["policyTypes"]:
        spec["policyTypes"] = ["Ingress", *(["Egress"] if spec.get("egress") else [])]
    for direction in ("ingress", "egress"):
        for rule in spec.get(direction) or ():
            for port in (rule.get("ports") or ()) if isinstance(rule, dict) else ():
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
    causes = _validate(metadata, spec)
    if causes:
        raise invalid(str(metadata.get("name", "")), causes, kind="NetworkPolicy")
    return policy


def _validate(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> list[Cause]:
    return _validate_metadata(metadata) + _validate_spec(spec)


def _validate_metadata(metadata: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    name = metadata.get("name") or ""
    if not name:
        causes.append(required("metadata.name"))
    elif not isinstance(name, str) or len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        causes.append(invalid_value("metadata.name", name, DNS1123_SUBDOMAIN_MESSAGE))
    for key, value in (metadata.get("labels") or {}).items():
        causes += label_key_errors("metadata.labels", key)
        if not label_value_ok(value):
            causes.append(invalid_value("metadata.labels", value, LABEL_VALUE_MESSAGE))
    return causes


def _validate_spec(spec: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    if "podSelector" not in spec:
        causes.append(required("spec.podSelector"))
    else:
        causes += _selector(spec["podSelector"], "spec.podSelector")
    types = spec["policyTypes"]
    if not isinstance(types, list) or len(types) > len(_POLICY_TYPES):
        causes.append(
            forbidden("spec.policyTypes", f"may not specify more than two policyTypes: {types}")
        )
    else:
        for index, kind in enumerate(types):
            if kind not in _POLICY_TYPES:
                causes.append(unsupported(f"spec.policyTypes[{index}]", kind, _POLICY_TYPES))
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        causes += _rules(spec, direction, peers_key)
    return causes


def _rules(spec: Mapping[str, Any], direction: str, peers_key: str) -> list[Cause]:
    causes: list[Cause] = []
    rules = spec.get(direction) or []
    if not isinstance(rules, list):
        return [invalid_value(f"spec.{direction}", rules, "must be a list")]
    for index, rule in enumerate(rules):
        path = f"spec.{direction}[{index}]"
        if direction == "ingress":
            causes.append(forbidden(path, f"ingress rules are {FAKE}"))
            continue
        if not isinstance(rule, dict):
            causes.append(invalid_value(path, rule, "must be an object"))
            continue
        for p_index, port in enumerate(rule.get("ports") or []):
            causes += _port(port, f"{path}.ports[{p_index}]")
        for peer_index, peer in enumerate(rule.get(peers_key) or []):
            causes += _peer(peer, f"{path}.{peers_key}[{peer_index}]")
    return causes


def _selector(selector: object, path: str) -> list[Cause]:
    if not isinstance(selector, dict):
        return [invalid_value(path, selector, "must be a label selector")]
    causes: list[Cause] = []
    if selector.get("matchExpressions"):
        causes.append(forbidden(f"{path}.matchExpressions", f"matchExpressions are {FAKE}"))
    for key, value in (selector.get("matchLabels") or {}).items():
        causes += label_key_errors(f"{path}.matchLabels", key)
        if not label_value_ok(value):
            causes.append(invalid_value(f"{path}.matchLabels", value, LABEL_VALUE_MESSAGE))
    return causes


def _port(port: object, path: str) -> list[Cause]:
    if not isinstance(port, dict):
        return [invalid_value(path, port, "must be an object")]
    causes: list[Cause] = []
    protocol = port.get("protocol")
    if protocol not in _PROTOCOLS:
        causes.append(unsupported(f"{path}.protocol", protocol, _PROTOCOLS))
    number = port.get("port")
    if isinstance(number, bool) or not isinstance(number, int | str | None):
        causes.append(invalid_value(f"{path}.port", number, "must be a number or a name"))
    elif isinstance(number, int) and not 0 < number < 65536:
        causes.append(
            invalid_value(f"{path}.port", number, "must be between 1 and 65535, inclusive")
        )
    elif isinstance(number, str):
        if len(number) > 15 or not _PORT_NAME.fullmatch(number) or number.isdigit():
            causes.append(invalid_value(f"{path}.port", number, "must be a valid port name"))
        else:
            causes.append(forbidden(f"{path}.port", f"named ports are {FAKE}"))
    end = port.get("endPort")
    if end is not None:
        if not isinstance(number, int):
            causes.append(
                forbidden(f"{path}.endPort", "may not be specified when `port` is non-numeric")
            )
        elif not isinstance(end, int) or end < number:
            causes.append(
                invalid_value(f"{path}.endPort", end, "must be greater than or equal to `port`")
            )
        else:
            causes.append(forbidden(f"{path}.endPort", f"endPort is {FAKE}"))
    return causes


def _peer(peer: object, path: str) -> list[Cause]:
    if not isinstance(peer, dict):
        return [invalid_value(path, peer, "must be an object")]
    given = [key for key in ("podSelector", "namespaceSelector", "ipBlock") if key in peer]
    if not given:
        return [Cause("FieldValueRequired", path, "Required value: must specify a peer")]
    if "ipBlock" in peer and len(given) > 1:
        return [forbidden(path, "may not specify both ipBlock and another peer")]
    if "ipBlock" not in peer:
        return [forbidden(path, f"peers by podSelector or namespaceSelector are {FAKE}")]
    return _ip_block(peer["ipBlock"], path)


def _ip_block(block: object, path: str) -> list[Cause]:
    if not isinstance(block, dict) or not block.get("cidr"):
        return [required(f"{path}.ipBlock.cidr")]
    try:
        network = ipaddress.ip_network(str(block["cidr"]), strict=False)
    except ValueError:
        return [
            invalid_value(
                f"{path}.ipBlock.cidr",
                block["cidr"],
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            )
        ]
    causes: list[Cause] = []
    for index, text in enumerate(block.get("except") or []):
        field = f"{path}.ipBlock.except[{index}]"
        try:
            excepted = ipaddress.ip_network(str(text), strict=False)
        except ValueError:
            causes.append(invalid_value(field, text, "must be a valid CIDR value"))
            continue
        if (
            excepted.version != network.version
            or not excepted.subnet_of(network)  # type: ignore[arg-type]
            or excepted == network
        ):
            causes.append(invalid_value(field, text, "must be a strict subset of `cidr`"))
    return causes


def selects(policy: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether ``policy`` selects a pod with ``labels`` (matchLabels; an empty selector: all)."""
    wanted = (policy["spec"].get("podSelector") or {}).get("matchLabels") or {}
    return all(labels.get(key) == value for key, value in wanted.items())


def egress_of(policies: list[Mapping[str, Any]], labels: Mapping[str, str]) -> list[Allowed] | None:
    """What a pod with ``labels`` may reach under ``policies``: None when no policy with the
    Egress type selects it (not isolated for egress: the fake's pods then have no network, as
    ever); else the union of the selecting policies' rules (a rule without ``to`` or without
    ``ports``: every destination or every port; an ipv4 everything is 0.0.0.0/0)."""
    chosen = [p for p in policies if "Egress" in p["spec"]["policyTypes"] and selects(p, labels)]
    if not chosen:
        return None
    allowed: list[Allowed] = []
    for policy in chosen:
        for rule in policy["spec"].get("egress") or ():
            peers = rule.get("to") or [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
            ports = rule.get("ports") or [{"protocol": proto} for proto in _PROTOCOLS]
            allowed.extend(
                Allowed(
                    str(ipaddress.ip_network(peer["ipBlock"]["cidr"], strict=False)),
                    port.get("protocol", "TCP"),
                    port.get("port"),
                    tuple(peer["ipBlock"].get("except") or ()),
                )
                for peer in peers
                for port in ports
            )
    return allowed


def iptables_rules(allowed: list[Allowed]) -> list[list[str]]:
    """The ``iptables`` arguments that make a pod's network namespace what ``allowed`` says
    (IPv4; the fake's networks have no IPv6): loopback and answers pass, the listed
    destinations may be reached, everything else is dropped both ways."""
    rules = [
        ["-P", "INPUT", "DROP"],
        ["-P", "FORWARD", "DROP"],
        ["-P", "OUTPUT", "DROP"],
        ["-A", "INPUT", "-i", "lo", "-j", "ACCEPT"],
        ["-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT"],
        ["-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
        ["-A", "OUTPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
    ]
    for entry in allowed:
        if ipaddress.ip_network(entry.cidr).version != 4:
            continue
        rules.extend(["-A", "OUTPUT", "-d", excepted, "-j", "DROP"] for excepted in entry.excepted)
        rule = ["-A", "OUTPUT", "-d", entry.cidr, "-p", entry.protocol.lower()]
        if entry.port is not None:
            rule += ["--dport", str(entry.port)]
        rules.append([*rule, "-j", "ACCEPT"])
    return rules


class NetworkPolicyStore:
    """The NetworkPolicies of the fake's namespace."""

    def __init__(self, pods: PodStore) -> None:
        self.namespace = pods.namespace
        self.policies: dict[str, dict[str, Any]] = {}
        self._pods = pods

    def get(self, name: str) -> dict[str, Any] | None:
        found = self.policies.get(name)
        return copy.deepcopy(found) if found is not None else None

    def add(self, policy: dict[str, Any]) -> dict[str, Any]:
        name = policy["metadata"]["name"]
        if name in self.policies:
            raise already_exists(name, "networkpolicies.networking.k8s.io")
        self._pods.next_resource_version(policy)
        self.policies[name] = policy
        return copy.deepcopy(policy)

    def remove(self, name: str) -> dict[str, Any]:
        policy = self.policies.pop(name, None)
        if policy is None:
            raise not_found("networkpolicies.networking.k8s.io", name)
        self._pods.next_resource_version(policy)
        return policy

    def listing(self, selection: Selection) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(policy)
            for _, policy in sorted(self.policies.items())
            if selection.matches(policy)
        ]

    def egress_of(self, labels: Mapping[str, str]) -> list[Allowed] | None:
        return egress_of(list(self.policies.values()), labels)
