"""tests/integration/engines.py, the list of real-engine tests that run on Docker only (deselected
on Podman), names tests that exist, each with its reason: an entry left behind by a rename or a
removal would say a test is Docker-only while the renamed one runs on both, unseen."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.integration.engines import DOCKER_ONLY_MODULES, DOCKER_ONLY_TESTS, docker_only_reason

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def functions_of(module: str) -> set[str]:
    tree = ast.parse((INTEGRATION / module).read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_docker_only_module_and_test_exists() -> None:
    missing = [m for m in DOCKER_ONLY_MODULES if not (INTEGRATION / m).is_file()]
    missing += [m for m in DOCKER_ONLY_TESTS if not (INTEGRATION / m).is_file()]
    assert missing == [], "engines.py names test files that do not exist"
    gone = [
        f"{module}::{function}"
        for module, functions in DOCKER_ONLY_TESTS.items()
        for function in functions
        if function not in functions_of(module)
    ]
    assert gone == [], "engines.py names tests that do not exist"


def test_a_module_is_listed_whole_or_by_some_of_its_tests_not_both() -> None:
    assert set(DOCKER_ONLY_MODULES) & set(DOCKER_ONLY_TESTS) == set()
    # A module all of whose tests are listed one by one belongs in the modules' list.
    whole = [m for m, functions in DOCKER_ONLY_TESTS.items() if set(functions) == functions_of(m)]
    assert whole == []


def test_every_entry_says_why_it_runs_on_docker_only() -> None:
    reasons = list(DOCKER_ONLY_MODULES.values()) + [
        reason for functions in DOCKER_ONLY_TESTS.values() for reason in functions.values()
    ]
    assert all(reason.strip() for reason in reasons)


def test_a_listed_module_covers_each_of_its_tests_and_an_unlisted_test_runs_on_both() -> None:
    assert docker_only_reason(
        "test_auth_e2e.py", "test_a_forged_origin_is_refused_even_with_the_token"
    )
    assert docker_only_reason(
        "test_relay_e2e.py",
        "test_an_unreachable_docker_engine_answers_32001_and_the_orchestrator_keeps_serving",
    )
    assert (
        docker_only_reason(
            "test_relay_e2e.py",
            "test_killing_the_container_mid_request_answers_32002_and_the_next_call_respawns",
        )
        is None
    )
    assert docker_only_reason("test_warm_pool_e2e.py", "test_a_new_test") is None
