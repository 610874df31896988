"""docs/DEVELOPMENT.md's module map is true: it names every module of the package, and only
modules that exist (a map that misses one, or names one long gone, misleads a newcomer)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "reactor_fabric"
DEVELOPMENT = REPO / "docs" / "DEVELOPMENT.md"
# Modules that are not a layer's concept, only Python's plumbing.
PLUMBING = {"__main__.py", "_version.py"}
_DIRECTORY = re.compile(r"^  ([a-z_]+)/\s")
# A module of a subpackage is named by its path below the layer (container_parts/egress.py).
_FILES = re.compile(r"^( {2}| {4})((?:[A-Za-z_][\w./]*\.py)(?:, [A-Za-z_][\w./-]*)*)\s")


def mapped_modules(text: str) -> set[str]:
    """The modules the map names (``dir/name.py``, or ``name.py`` at the package's top), from
    the first ``text`` block below "## The layers"."""
    section = text.split("## The layers", 1)[1]
    block = section.split("```text", 1)[1].split("```", 1)[0]
    found: set[str] = set()
    directory = ""
    for line in block.splitlines():
        heading = _DIRECTORY.match(line)
        if heading:
            directory = heading.group(1)
            continue
        files = _FILES.match(line)
        if files is None:
            continue
        indent, names = files.groups()
        for name in names.split(", "):
            if not name.endswith(".py"):
                continue  # a data file beside its module (status.html)
            found.add(f"{directory}/{name}" if len(indent) == 4 else name)
    return found


def package_modules() -> set[str]:
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and path.name not in PLUMBING
    }


def test_the_development_map_names_every_module_and_no_other() -> None:
    mapped = mapped_modules(DEVELOPMENT.read_text())
    assert sorted(package_modules() - mapped) == [], "modules missing from DEVELOPMENT.md"
    assert sorted(mapped - package_modules()) == [], "DEVELOPMENT.md names modules that are gone"


def test_the_map_reader_finds_directories_files_and_shared_lines() -> None:
    text = (
        "## The layers\n\n```text\nreactor_fabric/\n  protocol/     pure\n"
        "    jsonrpc.py            peeking\n                          more words.py\n"
        "    otel.py, tracing.py   spans\n    page.py, status.html  the page\n"
        "  _errors.py    the tree\n```\n"
    )
    assert mapped_modules(text) == {
        "protocol/jsonrpc.py",
        "protocol/otel.py",
        "protocol/tracing.py",
        "protocol/page.py",
        "_errors.py",
    }
