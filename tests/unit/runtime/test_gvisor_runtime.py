"""What the orchestrator concludes about an engine's gVisor (reactor_fabric/runtime/
gvisor_runtime.py): listed, then honoured by the check's container — by name, or by Podman's
dispatching runtime — or dropped, with the refused client's words."""

from __future__ import annotations

import logging

import pytest

from reactor_fabric.runtime.gvisor_runtime import GvisorRuntime

PODMAN_LISTS = frozenset({"runc", "crun", "runsc", "reactor-fabric-dispatch"})


def test_gvisor_is_not_found_before_the_engine_lists_its_runtimes() -> None:
    gvisor = GvisorRuntime("runsc")
    assert not gvisor.found
    assert gvisor.missing() == "the engine has not answered since the orchestrator started"


def test_an_engine_without_the_runtime_has_no_gvisor_and_says_how_to_get_it() -> None:
    gvisor = GvisorRuntime("runsc")
    gvisor.listed(frozenset({"runc"}))
    assert not gvisor.found
    assert "no runtime 'runsc'" in gvisor.missing()
    assert "scripts/ensure-gvisor" in gvisor.missing()


def test_a_container_run_under_the_named_runtime_leaves_gvisor_found() -> None:
    gvisor = GvisorRuntime("runsc")
    gvisor.listed(PODMAN_LISTS)
    gvisor.ran_under("runsc", "docker 20.10.24")
    assert gvisor.found
    assert gvisor.missing() == ""


def test_podmans_dispatching_default_runtime_counts_as_gvisor_for_marked_containers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gvisor = GvisorRuntime("runsc")
    gvisor.listed(PODMAN_LISTS)
    with caplog.at_level(logging.INFO):
        gvisor.ran_under("reactor-fabric-dispatch", "podman 4.3.1")
    assert gvisor.found
    assert [r.message for r in caplog.records if r.message == "gvisor_by_dispatch"]


@pytest.mark.parametrize("given", ["runc", "", "crun", "reactor-fabric-dispatch-not"])
def test_any_other_runtime_means_the_engine_drops_gvisor_and_the_refusal_says_why(
    given: str,
) -> None:
    gvisor = GvisorRuntime("runsc")
    gvisor.listed(PODMAN_LISTS)
    gvisor.ran_under(given, "podman 4.3.1")
    assert not gvisor.found
    said = gvisor.missing()
    assert f"under {given or 'its default'!r}" in said
    assert "deploy/podman/oci-dispatch" in said


def test_a_dropped_runtime_stays_dropped_when_the_engine_lists_its_runtimes_again() -> None:
    gvisor = GvisorRuntime("runsc")
    gvisor.listed(PODMAN_LISTS)
    gvisor.ran_under("runc", "podman 4.3.1")
    gvisor.listed(PODMAN_LISTS)  # (a new connection)
    assert not gvisor.found
