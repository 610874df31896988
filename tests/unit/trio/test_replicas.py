"""Several orchestrators behind one proxy: a session id names the replica that owns it."""

from __future__ import annotations

import re

import pytest

from reactor_fabric._cli_parser import build_parser
from reactor_fabric.trio.identity import new_session_id
from reactor_fabric.trio.serve import assemble
from tests.fakes import AnsweringRuntime
from tests.unit.trio.test_app import SUITE, get


def test_a_replicas_session_ids_end_with_its_name_after_128_random_bits() -> None:
    session_id = new_session_id("east-1")
    assert re.fullmatch(r"[0-9a-f]{32}\.east-1", session_id)
    assert re.fullmatch(r"[0-9a-f]{32}", new_session_id())  # alone: as before
    assert len({new_session_id("a") for _ in range(100)}) == 100


@pytest.mark.parametrize("name", ["A", "-a", "a_b", "a.b", "x" * 33, ""])
def test_a_replica_name_a_proxy_could_not_match_safely_is_refused(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args([f"--replica={name}"])
    assert "not a replica name" in capsys.readouterr().err


def test_the_replica_comes_from_the_flag_or_its_variable() -> None:
    assert build_parser({"REACTOR_FABRIC_REPLICA": "b"}).parse_args([]).replica == "b"
    assert build_parser({}).parse_args(["--replica", "a-2"]).replica == "a-2"
    assert build_parser({}).parse_args([]).replica is None


async def test_healthz_names_the_replica() -> None:
    fabric = assemble(suite=SUITE, runtime=AnsweringRuntime(), network="bridge", replica="b")
    assert (await get(fabric, "/healthz")).json()["replica"] == "b"
