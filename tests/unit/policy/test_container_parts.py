"""The container spec's parts, each decided by its own module (policy/container_parts/), their
refusals (reason and the words the client reads), the composer that returns the first one
before anything is spawned, and the list of places an option touches (docs/DEVELOPMENT.md,
"Adding a service option"), kept true."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

from reactor_fabric._errors import ContainerStartFailure
from reactor_fabric.config.secrets import Secret, ServiceSecrets
from reactor_fabric.config.structs import Resources, Security, Service
from reactor_fabric.policy.accounts import UNPRIVILEGED, Account
from reactor_fabric.policy.container_parts.child_session import (
    CHILD_SOCKET_TARGET,
    ChildSessionPart,
    child_session,
)
from reactor_fabric.policy.container_parts.confinement import confinement
from reactor_fabric.policy.container_parts.context import (
    RuntimeCapabilities,
    SpecContext,
    SpecRefusal,
)
from reactor_fabric.policy.container_parts.egress import EgressPart, egress
from reactor_fabric.policy.container_parts.lifecycle import lifecycle
from reactor_fabric.policy.container_parts.mounts import mounts
from reactor_fabric.policy.container_parts.network import network
from reactor_fabric.policy.container_parts.ownership import ContainerIdentity
from reactor_fabric.policy.container_parts.program import program
from reactor_fabric.policy.container_parts.resources import POOLED_CPU_SHARES, resources
from reactor_fabric.policy.container_parts.secrets import (
    SecretsPart,
    file_delivery,
    secrets,
    server_account,
)
from reactor_fabric.policy.container_spec import ContainerSpec, compose, spec_for
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.runtime import docker_payload, kubernetes_manifests
from tests.fakes import EVERY_CAPABILITY

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "reactor_fabric"
PARTS_DIR = PACKAGE / "policy" / "container_parts"
RUNTIME_DIR = PACKAGE / "runtime"
DEVELOPMENT = REPO / "docs" / "DEVELOPMENT.md"
# The modules of container_parts/ that are not a part: what the parts read, who owns containers.
NOT_PARTS = {"context", "ownership"}

TOKEN = Secret("GITHUB_TOKEN", "both", "ghp_value")
FILE_ONLY = Secret("KEY_FILE", "file", "key-value")
SECRETS_ACCOUNT = Account(4321, 4321, "rf-secrets")


def identity(secrets_of: dict[str, ServiceSecrets] | None = None) -> ContainerIdentity:
    return ContainerIdentity(
        instance_id="0123456789abcdef",
        owner_host="host",
        owner_pid=42,
        owner_start="12345",
        default_network="bridge",
        secrets=secrets_of or {},
        secrets_account=SECRETS_ACCOUNT if secrets_of else None,
    )


def context(
    *,
    secrets_of: dict[str, ServiceSecrets] | None = None,
    capabilities: RuntimeCapabilities = EVERY_CAPABILITY,
    **fields: object,
) -> SpecContext:
    values: dict[str, object] = {"session_id": "s" * 20} | fields
    return SpecContext("gh", identity(secrets_of), capabilities, **values)  # type: ignore[arg-type]


# --- each part --------------------------------------------------------------------------------


def test_the_lifecycle_part_names_a_sessions_a_pooled_and_a_probe_container_apart() -> None:
    service = Service(image="img")
    session = lifecycle(service, context(sequence=3))
    assert session.name == "rf-gh-ssssssssssss-3"
    assert session.labels["reactor-fabric.session"] == "s" * 20
    pooled = lifecycle(service, context(session_id="", pool_token=7))
    assert pooled.name == "rf-gh-pool-01234567-7"
    assert "reactor-fabric.session" not in pooled.labels
    assert pooled.labels["reactor-fabric.pooled"] == "true"
    probe = lifecycle(service, context(probe_token="beef"))
    assert probe.name == "rf-catalog-gh-beef"
    for part in (session, pooled, probe):
        assert part.labels["reactor-fabric.service"] == "gh"
        assert part.labels["reactor-fabric.instance"] == "0123456789abcdef"


def test_the_program_part_runs_as_the_account_with_a_home_unless_the_suite_names_a_user() -> None:
    alice = Account(1000, 1000, "alice")
    run = program(Service(image="img", command=["serve"]), context(account=alice))
    assert (run.image, run.command, run.user) == ("img", ["serve"], "1000:1000")
    assert run.environment["USER"] == "alice"
    named = program(Service(image="img", user="app"), context(account=alice))
    assert named.user == "app"
    assert "HOME" not in named.environment


def test_the_mounts_part_carries_the_contexts_mounts_in_order() -> None:
    given = (MountSpec("/a", "/workspace"), MountSpec("/a/.git", "/workspace/.git", True))
    assert mounts(Service(image="img"), context(mounts=given)) == given


@pytest.mark.parametrize(
    ("service", "probe", "expected"),
    [
        (Service(image="img"), None, "bridge"),
        (Service(image="img", network="backend"), None, "backend"),
        (Service(image="img", network="backend", egress=[]), None, "none"),
        (Service(image="img", egress=["a.example:443"]), None, "none"),
        (Service(image="img", network="backend"), "beef", "none"),
    ],
)
def test_the_network_part_is_none_with_egress_and_for_the_probe(
    service: Service, probe: str | None, expected: str
) -> None:
    assert network(service, context(probe_token=probe)) == expected


def test_the_resources_part_parses_the_limits_and_lowers_a_pooled_containers_weight() -> None:
    service = Service(image="img", resources=Resources(memory="1g", cpus=0.5, pids=64))
    part = resources(service, context())
    assert (part.memory_bytes, part.nano_cpus, part.pids_limit) == (1 << 30, 500_000_000, 64)
    assert part.cpu_shares is None
    assert resources(service, context(pool_token=1)).cpu_shares == POOLED_CPU_SHARES


def test_the_confinement_part_keeps_a_tmp_only_for_a_read_only_root() -> None:
    strict = confinement(Service(image="img"), context())
    assert strict.read_only_rootfs
    assert set(strict.tmpfs) == {"/tmp"}
    relaxed = confinement(
        Service(image="img", security=Security(read_only_rootfs=False, cap_add=["CHOWN"])),
        context(),
    )
    assert (relaxed.read_only_rootfs, relaxed.tmpfs, relaxed.cap_add) == (False, {}, ("CHOWN",))


def test_the_secrets_part_delivers_variables_and_files_and_a_secret_bearer_runs_as_theirs() -> None:
    given = {"gh": ServiceSecrets(secrets=(TOKEN, FILE_ONLY))}
    part = secrets(Service(image="img"), context(secrets_of=given))
    assert isinstance(part, SecretsPart)
    assert part.environment == {"GITHUB_TOKEN": "ghp_value"}
    assert [s.name for s in part.files] == ["GITHUB_TOKEN", "KEY_FILE"]
    assert server_account(Service(image="img"), context(secrets_of=given)) == SECRETS_ACCOUNT
    assert server_account(Service(image="img", user="app"), context(secrets_of=given)) == (
        UNPRIVILEGED
    )


@pytest.mark.parametrize("reason", ["secret_unavailable", "account_unavailable"])
def test_the_secrets_part_refuses_a_service_whose_secrets_did_not_resolve(reason: str) -> None:
    given = {
        "gh": ServiceSecrets(problems=("GITHUB_TOKEN: not set", "X: unreadable"), reason=reason)
    }
    refusal = secrets(Service(image="img"), context(secrets_of=given))
    assert refusal == SpecRefusal(
        "gh", reason, "service 'gh' is refused: GITHUB_TOKEN: not set; X: unreadable"
    )


def test_file_secrets_are_refused_where_the_runtime_cannot_deliver_files() -> None:
    remote = RuntimeCapabilities(stdio="attach", file_secrets_missing="no files here")
    as_files = {"gh": ServiceSecrets(secrets=(FILE_ONLY,))}
    part = secrets(Service(image="img"), context(secrets_of=as_files, capabilities=remote))
    assert isinstance(part, SecretsPart)
    refusal = file_delivery(part, context(secrets_of=as_files, capabilities=remote))
    assert refusal == SpecRefusal("gh", "secret_unavailable", "service 'gh': no files here")
    as_env = {"gh": ServiceSecrets(secrets=(Secret("T", "env", "value"),))}
    in_env = secrets(Service(image="img"), context(secrets_of=as_env, capabilities=remote))
    assert isinstance(in_env, SecretsPart)
    assert file_delivery(in_env, context(secrets_of=as_env, capabilities=remote)) is None


def test_the_egress_part_tells_the_proxy_or_refuses_where_the_runtime_has_none() -> None:
    service = Service(image="img", egress=["api.github.com:443"])
    part = egress(service, context())
    assert part == EgressPart(("api.github.com:443",))
    assert part.environment["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert egress(Service(image="img", egress=[]), context()) is None  # no network, no proxy
    assert egress(Service(image="img"), context()) is None
    lacking = RuntimeCapabilities(stdio="attach", egress_missing="the proxy is not here")
    assert egress(service, context(capabilities=lacking)) == SpecRefusal(
        "gh",
        "egress_unavailable",
        "service 'gh' has an egress allowlist, and the proxy is not here",
    )


def test_the_child_session_part_tells_the_relay_its_socket_and_token() -> None:
    assert child_session(Service(image="img"), context()) is None
    part = child_session(Service(image="img"), context(child_token="tok"))
    assert part == ChildSessionPart("tok")
    assert part.environment["REACTOR_FABRIC_FABRIC_SOCKET"] == CHILD_SOCKET_TARGET
    assert "tok" not in repr(part)


# --- the composer -----------------------------------------------------------------------------


def test_the_composer_refuses_unresolved_secrets_then_egress_then_undeliverable_files() -> None:
    # The order the runtimes refused them in at spawn before the parts decided them.
    nothing = RuntimeCapabilities(
        stdio="attach", egress_missing="no proxy", file_secrets_missing="no files here"
    )
    unresolved = {"gh": ServiceSecrets(problems=("GITHUB_TOKEN: not set",))}
    service = Service(image="img", egress=["a.example:443"])
    refusal = compose(service, context(secrets_of=unresolved, capabilities=nothing))
    assert isinstance(refusal, SpecRefusal)
    assert refusal.reason == "secret_unavailable"
    as_files = {"gh": ServiceSecrets(secrets=(FILE_ONLY,))}
    with pytest.raises(ContainerStartFailure) as raised:
        spec_for(service, context(secrets_of=as_files, capabilities=nothing))
    assert raised.value.reason == "egress_unavailable"
    assert str(raised.value) == "service 'gh' has an egress allowlist, and no proxy"
    without_egress = compose(
        Service(image="img"), context(secrets_of=as_files, capabilities=nothing)
    )
    assert without_egress == SpecRefusal("gh", "secret_unavailable", "service 'gh': no files here")


def test_the_composed_environment_is_the_programs_then_the_proxys_secrets_and_childs() -> None:
    given = {"gh": ServiceSecrets(secrets=(TOKEN,))}
    spec = spec_for(
        Service(image="img", env={"A": "1"}, egress=["a.example:443"]),
        context(secrets_of=given, child_token="tok"),
    )
    names = list(spec.environment)
    assert names[: names.index("REACTOR_FABRIC_SERVICE_CONFIG") + 1] == [
        "HOME",
        "USER",
        "LOGNAME",
        "A",
        "REACTOR_FABRIC_SERVICE_CONFIG",
    ]
    assert names.index("HTTPS_PROXY") < names.index("GITHUB_TOKEN")
    assert names[-2:] == ["REACTOR_FABRIC_FABRIC_SOCKET", "REACTOR_FABRIC_FABRIC_TOKEN"]
    assert spec.user == "4321:4321"  # the secrets' account


# --- the places an option touches, kept true ----------------------------------------------------


def part_names() -> list[str]:
    return [spec_field.name for spec_field in dataclasses.fields(ContainerSpec)]


def test_every_part_of_the_spec_has_its_module_and_function_and_every_part_module_is_one() -> None:
    modules = {path.stem for path in PARTS_DIR.glob("*.py")} - {"__init__"} - NOT_PARTS
    assert sorted(modules) == sorted(part_names())
    for name in part_names():
        module = importlib.import_module(f"reactor_fabric.policy.container_parts.{name}")
        function = getattr(module, name)
        assert list(function.__annotations__)[:2] == ["service", "context"], name


@pytest.mark.parametrize("translation", [docker_payload, kubernetes_manifests])
def test_each_runtime_translation_realises_every_part_in_one_function_named_after_it(
    translation: ModuleType,
) -> None:
    realisations = translation.PART_REALISATIONS
    assert list(realisations) == part_names()
    for name, function in realisations.items():
        assert getattr(function, "__name__", None) == name
        assert getattr(translation, name) is function


def test_no_runtime_reads_the_suites_service_options_but_through_the_spec() -> None:
    # An option added the old way (read off the suite by a runtime, or refused at spawn)
    # fails here: a runtime knows a service only as its spec's parts.
    for path in sorted(RUNTIME_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                names = {alias.name for alias in node.names}
                assert not (node.module.endswith("config.structs") and "Service" in names), path
                assert "SpecRefusal" not in names, path


def test_the_development_guide_lists_the_places_an_option_touches() -> None:
    section = DEVELOPMENT.read_text().split("**A service option**", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([\w/.-]+\.(?:py|json|md))`", section))
    assert {
        "schemas/claude-mcp-suite.schema.json",
        "config/structs.py",
        "policy/container_parts/NAME.py",
        "policy/container_spec.py",
        "runtime/docker_payload.py",
        "runtime/kubernetes_manifests.py",
        "docs/USAGE.md",
    } <= named
    for place in named - {"policy/container_parts/NAME.py"}:
        top = place.split("/", 1)[0]
        where = REPO / place if top in {"schemas", "docs", "tests"} else PACKAGE / place
        assert where.exists(), place
