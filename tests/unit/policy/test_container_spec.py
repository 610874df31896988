from __future__ import annotations

import json
from pathlib import Path

import pytest

from reactor_fabric._errors import ContainerStartFailure
from reactor_fabric.config.structs import Resources, Security, Service
from reactor_fabric.policy.accounts import UNPRIVILEGED, Account
from reactor_fabric.policy.container_parts.context import RuntimeCapabilities
from reactor_fabric.policy.container_parts.egress import EgressPart
from reactor_fabric.policy.container_parts.ownership import LABEL_SESSION, ContainerIdentity
from reactor_fabric.policy.container_spec import ContainerSpec, container_spec_for
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.pinning import pin_mounts
from reactor_fabric.runtime.docker_payload import host_config
from tests.fakes import EVERY_CAPABILITY


def spec_for(
    service: Service,
    *,
    default_network: str = "bridge",
    mounts: tuple[MountSpec, ...] = (),
    sequence: int = 0,
    account: Account = UNPRIVILEGED,
    capabilities: RuntimeCapabilities = EVERY_CAPABILITY,
) -> ContainerSpec:
    identity = ContainerIdentity(
        instance_id="inst1",
        owner_host="host",
        owner_pid=42,
        owner_start="12345",
        default_network=default_network,
    )
    return container_spec_for(
        "git",
        service,
        session_id="0123456789abcdef0123",
        identity=identity,
        mounts=mounts,
        sequence=sequence,
        account=account,
        capabilities=capabilities,
    )


def test_every_container_carries_the_four_ownership_labels() -> None:
    spec = spec_for(Service(image="img"))
    assert spec.labels["reactor-fabric.managed"] == "true"
    assert spec.labels["reactor-fabric.instance"] == "inst1"
    assert spec.labels["reactor-fabric.session"] == "0123456789abcdef0123"
    assert spec.labels["reactor-fabric.service"] == "git"
    assert spec.labels["reactor-fabric.owner-pid"] == "42"
    assert spec.labels["reactor-fabric.owner-start"] == "12345"


def test_the_environment_is_only_the_suite_env_plus_config_as_json_and_the_account() -> None:
    service = Service(image="img", env={"A": "1"}, config={"account": "work", "n": [1, 2]})
    env = spec_for(service, account=Account(1000, 1000, "alice")).environment
    assert env == {
        "A": "1",
        "REACTOR_FABRIC_SERVICE_CONFIG": '{"account":"work","n":[1,2]}',
        "HOME": "/tmp",
        "USER": "alice",
        "LOGNAME": "alice",
    }
    assert json.loads(env["REACTOR_FABRIC_SERVICE_CONFIG"]) == {"account": "work", "n": [1, 2]}


def test_the_server_runs_as_the_chosen_account_by_number() -> None:
    spec = spec_for(Service(image="img"), account=Account(1000, 100, "alice"))
    assert spec.user == "1000:100"
    assert spec_for(Service(image="img")).user == "65534:65534"


def test_the_suites_env_wins_over_the_accounts_home_and_name() -> None:
    service = Service(image="img", env={"HOME": "/data", "USER": "svc"})
    env = spec_for(service, account=Account(1000, 1000, "alice")).environment
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/data", "svc", "alice")


def test_a_user_named_by_the_suite_is_used_as_is_and_the_image_keeps_its_home() -> None:
    spec = spec_for(Service(image="img", user="app"), account=Account(1000, 1000, "alice"))
    assert spec.user == "app"
    assert not {"HOME", "USER", "LOGNAME"} & set(spec.environment)


def test_safe_defaults_drop_every_capability_and_forbid_new_privileges() -> None:
    host = host_config(spec_for(Service(image="img")))
    assert host["CapDrop"] == ["ALL"]
    assert "CapAdd" not in host
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["Memory"] == host["MemorySwap"] == 512 * 1024**2
    assert host["NanoCpus"] == 1_000_000_000
    assert host["PidsLimit"] == 256
    assert host["NetworkMode"] == "bridge"
    assert host["ReadonlyRootfs"] is True
    assert host["Tmpfs"] == {"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"}


def test_the_engine_keeps_no_log_of_a_servers_output() -> None:
    host = host_config(spec_for(Service(image="img")))
    assert host["LogConfig"] == {"Type": "none", "Config": {}}


def test_a_service_may_relax_the_defaults_explicitly() -> None:
    service = Service(
        image="img",
        resources=Resources(memory="1g", cpus=0.5, pids=64),
        security=Security(no_new_privileges=False, cap_add=["CHOWN"], read_only_rootfs=False),
        network="none",
    )
    host = host_config(spec_for(service))
    assert host["CapAdd"] == ["CHOWN"]
    assert host["SecurityOpt"] == []
    assert host["NanoCpus"] == 500_000_000
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is False
    assert "Tmpfs" not in host


def test_mounts_are_structured_bind_mounts_never_volume_strings() -> None:
    mounts = (MountSpec("/home/a/repo", "/workspace"), MountSpec("/home/a/docs", "/docs", True))
    host = host_config(spec_for(Service(image="img"), mounts=mounts))
    assert [(m["Type"], m["Source"], m["Target"], m["ReadOnly"]) for m in host["Mounts"]] == [
        ("bind", "/home/a/repo", "/workspace", False),
        ("bind", "/home/a/docs", "/docs", True),
    ]


def test_pinned_mounts_are_local_volumes_bound_to_the_pins_descriptor(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "docs").mkdir()
    mounts = (
        MountSpec(str(tmp_path / "repo"), "/workspace"),
        MountSpec(str(tmp_path / "docs"), "/docs", True),
    )
    pins = pin_mounts(mounts)
    spec = spec_for(Service(image="img"), mounts=mounts)
    host = host_config(spec, pins)
    try:
        for mount, pin in zip(host["Mounts"], pins.pins, strict=True):
            assert (mount["Type"], mount["Source"]) == ("volume", None)  # anonymous
            options = mount["VolumeOptions"]
            assert options["DriverConfig"]["Name"] == "local"
            assert options["DriverConfig"]["Options"]["device"] == pin.engine_source
            assert options["DriverConfig"]["Options"]["type"] == "none"
            # The image's files are never copied into the user's directory.
            assert options["NoCopy"] is True
            assert options["Labels"]["reactor-fabric.session"] == spec.labels[LABEL_SESSION]
        options = [m["VolumeOptions"]["DriverConfig"]["Options"]["o"] for m in host["Mounts"]]
        assert options == ["bind", "bind,ro"]
    finally:
        pins.close()


def test_the_service_network_wins_over_the_orchestrator_network() -> None:
    assert spec_for(Service(image="img"), default_network="fabric").network == "fabric"
    assert (
        spec_for(Service(image="img", network="none"), default_network="fabric").network == "none"
    )


def test_container_names_are_distinct_per_session_and_sequence() -> None:
    first = spec_for(Service(image="img"), sequence=0).name
    second = spec_for(Service(image="img"), sequence=1).name
    assert first == "rf-git-0123456789ab-0"
    assert first != second


@pytest.mark.parametrize("read_only", [False, True])
def test_a_tmpfs_over_the_temporary_directory_only_comes_with_a_read_only_root(
    read_only: bool,
) -> None:
    spec = spec_for(Service(image="x", security=Security(read_only_rootfs=read_only)))
    assert spec.read_only_rootfs is read_only
    # The image's own /tmp stays as it is unless the root is read-only.
    assert spec.tmpfs == ({"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"} if read_only else {})


@pytest.mark.parametrize(
    ("tmp_size", "option"),
    [("1g", "size=1g"), ("512m", "size=512m"), ("1536k", "size=1536k"), (3 << 20, "size=3m")],
)
def test_the_temporary_directory_takes_the_suites_size(tmp_size: str | int, option: str) -> None:
    spec = spec_for(Service(image="x", security=Security(tmp_size=tmp_size)))
    assert spec.tmpfs == {"/tmp": f"rw,nosuid,nodev,{option},mode=1777"}


def test_the_temporary_directory_runs_programs_only_when_the_suite_says_so() -> None:
    spec = spec_for(Service(image="x", security=Security(tmp_exec=True)))
    assert spec.tmpfs == {"/tmp": "rw,nosuid,nodev,exec,size=64m,mode=1777"}


def test_a_service_with_an_egress_list_has_no_network_and_is_told_its_proxy() -> None:
    spec = spec_for(Service(image="x", egress=["api.github.com:443"]))
    assert spec.network == "none"
    assert spec.egress == EgressPart(("api.github.com:443",))
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY"):
        assert spec.environment[name] == "http://127.0.0.1:3128"
    assert spec.environment["NO_PROXY"] == ""
    assert spec.environment["no_proxy"] == ""


def test_an_empty_egress_list_is_no_network_at_all_and_no_proxy() -> None:
    spec = spec_for(Service(image="x", egress=[]))
    assert spec.network == "none"
    assert spec.egress is None
    assert not any(name.lower().endswith("_proxy") for name in spec.environment)


def test_a_service_without_egress_keeps_its_network_and_gets_no_proxy() -> None:
    spec = spec_for(Service(image="x"), default_network="bridge")
    assert spec.network == "bridge"
    assert spec.egress is None
    assert not any(name.lower().endswith("_proxy") for name in spec.environment)


# --- isolation: runc or gVisor --------------------------------------------------------------

WITH_GVISOR = RuntimeCapabilities(stdio="", gvisor_runtime="runsc")
WITHOUT_GVISOR = RuntimeCapabilities(stdio="", gvisor_missing="the engine has no runtime 'runsc'")


@pytest.mark.parametrize(
    ("isolation", "service_type", "gvisor", "runtime"),
    [
        ("runc", "tool_service", True, None),
        ("runc", "llm_agent", True, None),
        ("gvisor", "tool_service", True, "runsc"),
        ("prefer-gvisor", "tool_service", True, "runsc"),
        ("prefer-gvisor", "tool_service", False, None),
        (None, "tool_service", True, None),  # a tool server's default: runc
        (None, "llm_agent", True, "runsc"),  # an agent's: prefer-gvisor
        (None, "llm_agent", False, None),
    ],
)
def test_the_runtime_is_gvisors_where_asked_for_and_there_is_one(
    isolation: str | None, service_type: str, gvisor: bool, runtime: str | None
) -> None:
    service = Service(image="x", isolation=isolation, service_type=service_type)  # type: ignore[arg-type]
    spec = spec_for(service, capabilities=WITH_GVISOR if gvisor else WITHOUT_GVISOR)
    assert spec.runtime == runtime
    assert host_config(spec).get("Runtime") == runtime
    # The mark Podman's dispatching runtime reads (deploy/podman/oci-dispatch): on gVisor's only.
    marked = spec.environment.get("REACTOR_FABRIC_ISOLATION")
    assert marked == ("gvisor" if runtime else None)


def test_gvisors_mark_is_the_environments_last_word() -> None:
    # Whatever the program's variables say (a suite cannot name it: config/suite.py refuses it,
    # and this is the second line), the mark stays: the dispatcher must see it to run runsc.
    service = Service(image="x", isolation="gvisor", env={"REACTOR_FABRIC_ISOLATION": "runc"})
    spec = spec_for(service, capabilities=WITH_GVISOR)
    assert spec.environment["REACTOR_FABRIC_ISOLATION"] == "gvisor"


def test_gvisor_asked_for_where_there_is_none_is_refused_with_its_reason_never_run_as_runc() -> (
    None
):
    service = Service(image="x", isolation="gvisor")
    with pytest.raises(ContainerStartFailure) as refused:
        spec_for(service, capabilities=WITHOUT_GVISOR)
    assert refused.value.reason == "isolation_unavailable"
    assert "asks for isolation: gvisor, and the engine has no runtime 'runsc'" in str(refused.value)
