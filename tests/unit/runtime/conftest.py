"""Fixtures of the tests that run fabric-stdio on this host (its egress forwarder, its hold)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reactor_fabric.runtime.stdio_sockets import BUNDLED_HELPER

REPO = Path(__file__).resolve().parents[3]
SOURCE = BUNDLED_HELPER.with_name("fabric-stdio.c")


@pytest.fixture(scope="module")
def program() -> Path:
    """fabric-stdio, built by scripts/build-stdio-helper; skipped without gcc and a static C
    library."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc: fabric-stdio cannot be built here")
    subprocess.run([str(REPO / "scripts" / "build-stdio-helper")], check=True, timeout=300)
    if not BUNDLED_HELPER.exists() or BUNDLED_HELPER.stat().st_mtime < SOURCE.stat().st_mtime:
        pytest.skip("no static C library: scripts/build-stdio-helper did not build fabric-stdio")
    return BUNDLED_HELPER


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory with a path short enough for socket addresses (108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="fse-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
