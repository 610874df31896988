"""The create payload we send is the one docker-py sent for the same specs, key for key.

docker-py built the Engine API's JSON from our arguments until the engine client became our
own (:mod:`reactor_fabric.runtime.engine_api`); ``data/engine_payloads.json`` holds what it
made of each case below at that commit (``de547c9``: ``create_container``'s body after its
own dropping of nulls, the pinned descriptor's PID written as ``PID``). A part that changes
what the engine is asked for changes this file, on purpose and visibly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from reactor_fabric.config.structs import Resources, Security, Service
from reactor_fabric.policy.container_spec import ContainerSpec
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.pinning import Pin, PinSet
from reactor_fabric.runtime import docker_payload
from reactor_fabric.runtime.docker_payload import SocketSources
from tests.unit.policy.test_container_spec import spec_for

GOLDEN = Path(__file__).parent / "data" / "engine_payloads.json"


class Case(NamedTuple):
    spec: ContainerSpec
    pinned: bool = False
    podman: bool = False
    secrets: str | None = None
    sockets: SocketSources | None = None
    entrypoint: list[str] | None = None


def cases() -> dict[str, Case]:
    mounts = (
        MountSpec("/home/a/repo", "/workspace"),
        MountSpec("/home/a/docs", "/docs", True),
    )
    relaxed = Service(
        image="img:2",
        command=["serve", "--stdio"],
        env={"A": "1", "B": "two words"},
        resources=Resources(memory="1g", cpus=0.5, pids=64),
        security=Security(no_new_privileges=False, cap_add=["CHOWN"], read_only_rootfs=False),
        network="none",
    )
    sockets = SocketSources(helper="/run/rf/fabric-stdio", stdio="/run/rf/s/c.sock")
    return {
        "defaults": Case(spec_for(Service(image="img"))),
        "relaxed": Case(spec_for(relaxed)),
        "bind mounts": Case(spec_for(Service(image="img"), mounts=mounts)),
        "pinned mounts": Case(spec_for(Service(image="img"), mounts=mounts), pinned=True),
        "podman's pinned mounts": Case(
            spec_for(Service(image="img"), mounts=mounts), pinned=True, podman=True
        ),
        "file secrets": Case(spec_for(Service(image="img")), secrets="/run/rf/secrets/x"),
        "socket stdio": Case(
            spec_for(relaxed, mounts=mounts),
            sockets=sockets,
            entrypoint=["/rf/fabric-stdio", "--", "serve"],
        ),
    }


def pins_of(spec: ContainerSpec) -> PinSet:
    # Descriptors 7, 8, ... stand for ours: only their numbers reach the payload.
    return PinSet(
        Pin(mount.target, mount.source, 7 + index, 1, 2 + index, (1234, 5678))
        for index, mount in enumerate(spec.mounts)
    )


def body_of(case: Case) -> dict[str, Any]:
    """The create's body for ``case``, as :func:`.docker_operations.create_container` sends
    it (its name is the create's query, added here as docker-py had it beside the body)."""
    pins = pins_of(case.spec) if case.pinned else None
    named = docker_payload.podman_pinned_volumes(case.spec, pins) if case.podman else {}
    secrets = docker_payload.secrets(case.secrets).mounts[0] if case.secrets else None
    host = docker_payload.host_config(
        case.spec, pins, named_volumes=named, secrets=secrets, sockets=case.sockets
    )
    body = docker_payload.container_config(case.spec, host, entrypoint=case.entrypoint)
    text = json.dumps({"name": case.spec.name, "body": body, "volumes": named}, sort_keys=True)
    return dict(json.loads(text.replace(f"/proc/{os.getpid()}/", "/proc/PID/")))


@pytest.mark.parametrize("name", list(cases()))
def test_the_create_payload_is_what_docker_py_sent_for_the_same_spec(name: str) -> None:
    assert body_of(cases()[name]) == json.loads(GOLDEN.read_text())[name]
