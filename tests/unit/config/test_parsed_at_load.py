"""The suite's durations and sizes are parsed once, when the suite is loaded: what the
orchestrator builds from the suite after that (its settings, the warm pool's, each container's
spec, the runtime, the audit trail's writer) reads numbers, never a unit string."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reactor_fabric._operator_cli import open_audit
from reactor_fabric._runtime_choice import engine_runtime
from reactor_fabric.config import units
from reactor_fabric.config.settings import pooling_of, settings_for
from reactor_fabric.config.structs import Suite
from reactor_fabric.config.suite import load_suite
from reactor_fabric.policy.container_parts.ownership import ContainerIdentity
from reactor_fabric.policy.container_spec import container_spec_for, pooled_spec_for
from reactor_fabric.runtime.docker import DockerRuntime
from reactor_fabric.runtime.kubernetes import KubernetesRuntime
from tests.fakes import EVERY_CAPABILITY

MIB = 1024**2

# Every duration and size the suite has, each set to a value other than its default.
EVERY_QUANTITY = """\
version: "1.0"
orchestrator:
  allowed_mount_roots: ["/projects"]
  max_message_size: 8m
  limits:
    first_message_timeout: 12s
    buffer_to_server: 2m
    buffer_to_client: 3m
    client_write_timeout: 40s
    shutdown_timeout: 7s
  audit:
    path: {audit}
    max_size: 5m
  kubernetes:
    volumes: {{/projects: work}}
    start_timeout: 90s
  fabric:
    model_assist:
      timeout: 1m30s
mcp_services:
  postgres:
    image: "reactor-fabric/mcp-server-time:2026.10.19"
    timeout: 5m30s
    warm: 1
    resources:
      memory: 1g
    container_strategy: smart_refresh
    max_container_age: 45m
    memory_threshold: 200MiB
  time:
    image: "reactor-fabric/mcp-server-time:2026.10.19"
    resources:
      memory: 268435456
"""


def identity() -> ContainerIdentity:
    return ContainerIdentity(
        instance_id="0123456789abcdef",
        owner_host="host",
        owner_pid=42,
        owner_start="12345",
        default_network="bridge",
    )


@pytest.fixture
def loaded_then_no_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Suite:
    """The suite above, loaded; from then on a unit string parsed anywhere in the package
    fails the test (the parse functions are replaced wherever they were imported)."""
    path = tmp_path / "suite.yaml"
    path.write_text(EVERY_QUANTITY.format(audit=tmp_path / "audit.jsonl"), encoding="utf-8")
    suite = load_suite(path)

    def parsed_after_load(text: object) -> float:
        raise AssertionError(f"{text!r} parsed after the suite was loaded")

    parsers = (units.parse_duration, units.parse_size)
    for name, module in list(sys.modules.items()):
        if name != "reactor_fabric" and not name.startswith("reactor_fabric."):
            continue
        for function in parsers:
            if getattr(module, function.__name__, None) is function:
                monkeypatch.setattr(module, function.__name__, parsed_after_load)
    return suite


def test_the_settings_built_from_a_loaded_suite_read_numbers_parsed_at_load(
    loaded_then_no_parsing: Suite,
) -> None:
    settings = settings_for(loaded_then_no_parsing, token_id="t")
    limits = settings.limits
    assert limits.max_message_bytes == 8 * MIB
    assert (limits.buffer_to_server_bytes, limits.buffer_to_client_bytes) == (2 * MIB, 3 * MIB)
    assert (limits.first_message_seconds, limits.client_write_seconds) == (12.0, 40.0)
    assert limits.shutdown_seconds == 7.0
    assert settings.idle_timeouts == {"postgres": 330.0, "time": 60.0}
    assert settings.assist.timeout == 90.0
    lifecycle = settings.lifecycles["postgres"]
    assert (lifecycle.max_age, lifecycle.memory_threshold) == (45 * 60.0, 200 * MIB)
    assert pooling_of(loaded_then_no_parsing).targets == {"postgres": 1, "time": 0}


def test_a_containers_spec_takes_its_memory_limit_parsed_at_load(
    loaded_then_no_parsing: Suite,
) -> None:
    services = loaded_then_no_parsing.mcp_services
    for _ in range(2):  # every start reads the same number: none parses the suite's text again
        spec = container_spec_for(
            "postgres",
            services["postgres"],
            session_id="s" * 20,
            identity=identity(),
            capabilities=EVERY_CAPABILITY,
        )
        assert spec.memory_bytes == 1024 * MIB
    pooled = pooled_spec_for(
        "time", services["time"], token=1, identity=identity(), capabilities=EVERY_CAPABILITY
    )
    assert pooled.memory_bytes == 256 * MIB


def test_the_runtimes_and_the_audit_writer_take_their_bounds_parsed_at_load(
    loaded_then_no_parsing: Suite,
) -> None:
    docker = engine_runtime(loaded_then_no_parsing, "docker", {})
    assert isinstance(docker, DockerRuntime)
    kubernetes = engine_runtime(loaded_then_no_parsing, "kubernetes", {})
    assert isinstance(kubernetes, KubernetesRuntime)
    assert kubernetes.start_timeout == 90.0
    writer = open_audit(loaded_then_no_parsing, {})
    assert writer is not None
    try:
        assert writer.max_bytes == 5 * MIB
    finally:
        writer.close()


def test_every_duration_and_size_of_a_loaded_suite_reads_as_its_number(
    loaded_then_no_parsing: Suite,
) -> None:
    orchestrator = loaded_then_no_parsing.orchestrator
    limits = orchestrator.limits
    postgres = loaded_then_no_parsing.mcp_services["postgres"]
    read = [
        orchestrator.max_message_bytes,
        limits.first_message_seconds,
        limits.buffer_to_server_bytes,
        limits.buffer_to_client_bytes,
        limits.client_write_seconds,
        limits.shutdown_seconds,
        orchestrator.audit.max_bytes,
        orchestrator.kubernetes.start_timeout_seconds,
        orchestrator.fabric.model_assist.timeout_seconds,
        postgres.idle_timeout_seconds,
        postgres.resources.memory_bytes,
        postgres.max_container_age_seconds,
        postgres.memory_threshold_bytes,
    ]
    assert read == [
        8 * MIB, 12.0, 2 * MIB, 3 * MIB, 40.0, 7.0, 5 * MIB, 90.0, 90.0,
        330.0, 1024 * MIB, 45 * 60.0, 200 * MIB,
    ]  # fmt: skip
    # The suite's own words stay as written (what a message quotes).
    assert (postgres.timeout, postgres.resources.memory) == ("5m30s", "1g")
    assert loaded_then_no_parsing.mcp_services["time"].resources.memory == 268435456
