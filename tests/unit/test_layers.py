"""The package's layers, enforced: the protocol core does no I/O and knows nothing above it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "reactor_fabric"


def imports_of(path: Path) -> set[str]:
    """Every module a source file imports, absolute (relative imports resolved)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            else:
                assert node.module is not None
                found.add(node.module)
    return found


# What each pure layer may import besides the standard library (its own layer included).
ALLOWED = {
    "protocol": (
        "msgspec",
        "reactor_fabric._errors",
        "reactor_fabric._reasons",
        "reactor_fabric.protocol",
        "reactor_fabric.discovery",
    ),
    # The ranking engine: pure computation over a catalog (its stemmer and tokenizer included).
    "discovery": ("numpy", "snowballstemmer", "tiktoken", "reactor_fabric.discovery"),
}
IO_MODULES = ("trio", "socket", "threading", "asyncio", "subprocess", "docker", "selectors")


@pytest.mark.parametrize("path", sorted((PACKAGE / "protocol").glob("*.py")), ids=lambda p: p.name)
def test_the_protocol_layer_imports_nothing_that_does_io(path: Path) -> None:
    for module in imports_of(path):
        top = module.split(".")[0]
        assert top not in IO_MODULES, f"{path.name} imports {module}"
        if top == "reactor_fabric" or top not in _stdlib():
            assert module.startswith(ALLOWED["protocol"]), f"{path.name} imports {module}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "discovery").glob("*.py")), ids=lambda p: p.name)
def test_the_discovery_layer_imports_nothing_that_does_io_nor_any_layer_above(path: Path) -> None:
    for module in imports_of(path):
        top = module.split(".")[0]
        assert top not in IO_MODULES, f"{path.name} imports {module}"
        if top == "reactor_fabric" or top not in _stdlib():
            assert module.startswith(ALLOWED["discovery"]), f"{path.name} imports {module}"


def _stdlib() -> frozenset[str]:
    return frozenset(sys.stdlib_module_names)


def test_the_import_reader_sees_a_trio_import_when_there_is_one(tmp_path: Path) -> None:
    # The check above must be able to fail.
    fake = PACKAGE / "protocol" / "__probe_for_layers_test__.py"
    fake.write_text("import trio\nfrom ..runtime import base\n")
    try:
        assert {"trio", "reactor_fabric.runtime"} <= imports_of(fake)
    finally:
        fake.unlink()
