"""Which process's root shows a container's mounts (reactor_fabric/runtime/docker_pin_check.py):
the container's first process under runc; under gVisor, where that process is the sandbox
(an empty root), the root gofer beside it — never a look-alike another user started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reactor_fabric.runtime.docker_pin_check import files_process

SHIM = 50


def process(proc: Path, pid: int, argv0: str, parent: int, *, uid: int = 0) -> None:
    directory = proc / str(pid)
    directory.mkdir()
    (directory / "cmdline").write_bytes(argv0.encode() + b"\0--root=/run/x\0create\0")
    # comm may hold spaces and parentheses: the parent is read after the last ')'.
    (directory / "stat").write_text(f"{pid} (exe (x) y) S {parent} {pid} {pid} 0 -1\n")
    os.chown(directory, uid, uid)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("the fake /proc's owners are set with chown")
    return tmp_path


def test_a_runc_containers_first_process_is_looked_through_itself(proc: Path) -> None:
    process(proc, 100, "/usr/bin/python3", SHIM)
    assert files_process(100, str(proc)) == 100


def test_a_gvisor_sandbox_is_looked_through_its_gofer(proc: Path) -> None:
    process(proc, 100, "runsc-sandbox", SHIM, uid=65534)
    process(proc, 99, "runsc-gofer", SHIM)
    process(proc, 98, "runsc-gofer", 7)  # another container's
    assert files_process(100, str(proc)) == 99


def test_a_look_alike_gofer_of_another_user_is_never_taken(proc: Path) -> None:
    process(proc, 100, "runsc-sandbox", SHIM, uid=65534)
    process(proc, 97, "runsc-gofer", SHIM, uid=1000)
    # No gofer: the sandbox itself, whose root has no target (the check refuses: unverifiable).
    assert files_process(100, str(proc)) == 100
    process(proc, 99, "runsc-gofer", SHIM)
    assert files_process(100, str(proc)) == 99
