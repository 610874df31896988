"""Every reason is a constant of one module, and that module and docs/USAGE.md say the same.

The error table of docs/USAGE.md ("## Errors", one row per reason) and its table of the reasons
only the log carries are read here; each documented reason must be a constant of
``reactor_fabric._reasons`` and each constant there must be documented, once.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from reactor_fabric import _reasons

ROOT = Path(__file__).resolve().parents[2]
USAGE = ROOT / "docs" / "USAGE.md"
PACKAGE = ROOT / "reactor_fabric"
# What a reason looks like: snake_case, or a template with {placeholders}.
REASON = re.compile(r"[a-z0-9_{}]+")
_CELL = re.compile(r"`([^`]+)`")


class DocFormatError(AssertionError):
    """A row of a reason table whose reason cell is not exactly one reason in backticks."""


def errors_section(markdown: str) -> str:
    """The text of the "## Errors" section, up to the next level-2 heading."""
    start = markdown.index("\n## Errors\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else len(markdown)]


def documented_reasons(section: str) -> list[str]:
    """Every reason the section's tables list: the cell under a header starting "Reason", in
    every row (in order, repeats kept)."""
    found: list[str] = []
    column: int | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            column = None  # a table ended
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if column is None:
            headers = [i for i, cell in enumerate(cells) if cell.startswith("Reason")]
            column = headers[0] if headers else -1
            continue
        if column == -1 or set(line) <= set("|-: "):
            continue  # not a table of reasons, or the header's separator
        match = _CELL.fullmatch(cells[column])
        if match is None or not REASON.fullmatch(match.group(1)):
            raise DocFormatError(f"not one reason in backticks: {line!r}")
        found.append(match.group(1))
    return found


def module_reasons() -> list[str]:
    """Every constant of reactor_fabric._reasons (upper-case names bound to a string)."""
    return [
        value for name, value in vars(_reasons).items() if name.isupper() and isinstance(value, str)
    ]


def test_every_documented_reason_is_a_constant_and_every_constant_is_documented() -> None:
    documented = documented_reasons(errors_section(USAGE.read_text()))
    constants = module_reasons()
    assert sorted(set(documented) - set(constants)) == [], "documented, not in _reasons.py"
    assert sorted(set(constants) - set(documented)) == [], "in _reasons.py, not documented"


def test_each_reason_is_documented_once_and_defined_once() -> None:
    documented = documented_reasons(errors_section(USAGE.read_text()))
    assert sorted(r for r in set(documented) if documented.count(r) > 1) == []
    constants = module_reasons()
    assert sorted(r for r in set(constants) if constants.count(r) > 1) == []


def test_the_doc_reader_finds_the_reasons_of_both_tables_and_nothing_else() -> None:
    # The checks above must be able to fail: the reader sees reasons, and only in reason columns.
    sample = """
intro, `not_a_reason` in prose

## Errors

| Code | Message | Reason (`data.reason`) | When |
|---|---|---|---|
| -32001 | Docker Daemon Unresponsive | `docker_unavailable` | see `max_message_size` |
| -32002 | Container Start Failure | `{action}_failed` | an engine call |

| Setting | Meaning |
|---|---|
| `not_a_reason_either` | x |

| Reason | Where | When |
|---|---|---|
| `idle` | `container_stop` | idle |

## Security
| Reason | x |
|---|---|
| `after_the_section` | x |
"""
    assert documented_reasons(errors_section(sample)) == [
        "docker_unavailable",
        "{action}_failed",
        "idle",
    ]
    real = documented_reasons(errors_section(USAGE.read_text()))
    assert {"docker_unavailable", "client_did_not_answer", "too_many_sessions", "idle"} <= set(real)


@pytest.mark.parametrize(
    "row",
    [
        "| -32002 | Container Start Failure | `a`, `b` | two in one row |",
        "| -32002 | Container Start Failure | plain_words | no backticks |",
        "| -32002 | Container Start Failure | `Not A Reason` | not snake_case |",
    ],
)
def test_the_doc_reader_refuses_a_row_that_is_not_one_reason(row: str) -> None:
    table = "| Code | Message | Reason | When |\n|---|---|---|---|\n" + row
    with pytest.raises(DocFormatError):
        documented_reasons(table)


def _reason_literals(path: Path, root: Path = ROOT) -> list[str]:
    """snake_case string literals a source file gives as a reason: ``reason="x"``, a
    ``"reason": "x"`` entry, or ``... if ... else "x"`` in either place."""
    found: list[str] = []

    def literals(node: ast.expr) -> list[tuple[int, str]]:
        if isinstance(node, ast.IfExp):
            return literals(node.body) + literals(node.orelse)
        if isinstance(node, ast.JoinedStr):
            return [(node.lineno, "<f-string>")]  # made up on the spot: not a constant
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.lineno, node.value)]
        return []

    for node in ast.walk(ast.parse(path.read_text())):
        values: list[ast.expr] = []
        if isinstance(node, ast.keyword) and node.arg in ("reason", "stop_reason"):
            values.append(node.value)
        elif isinstance(node, ast.Dict):
            values += [
                v
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == "reason"
            ]
        for value in values:
            for line, text in literals(value):
                # Prose (MCP's notifications/cancelled reason is free text) is not a reason.
                if text == "<f-string>" or REASON.fullmatch(text):
                    found.append(f"{path.relative_to(root)}:{line}: {text}")
    return sorted(found)


def test_the_code_names_reasons_by_their_constants() -> None:
    literals = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_reasons.py"
        for hit in _reason_literals(path)
    ]
    assert literals == []


def test_the_literal_finder_sees_a_reason_given_as_a_string(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        'raise E("x", reason="mount_changed")\n'
        'log.info("e", extra={"reason": "a" if b else "c"})\n'
        'raise E("x", reason=f"{action}_failed")\n'
        'note = {"reason": "no answer in time"}\n'
        "raise E('x', reason=MOUNT_CHANGED)\n"
    )
    assert _reason_literals(source, tmp_path) == [
        "sample.py:1: mount_changed",
        "sample.py:2: a",
        "sample.py:2: c",
        "sample.py:3: <f-string>",
    ]


def _engine_actions() -> set[str]:
    """The actions the runtimes name in their engine calls (the ``{action}`` of a reason)."""
    calls = {"docker.py": "call", "kubernetes_operations.py": "refused"}
    actions: set[str] = set()
    for name, function in calls.items():
        for node in ast.walk(ast.parse((PACKAGE / "runtime" / name).read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == function
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                actions.add(node.args[0].value)
    return actions


def test_every_engine_calls_failure_reason_is_documented() -> None:
    actions = _engine_actions()
    assert {"create", "start", "attach", "pull", "inspect", "remove", "list"} <= actions
    section = errors_section(USAGE.read_text())
    [row] = [line for line in section.splitlines() if "`{action}_failed`" in line]
    listed = set(_CELL.findall(row.split("|")[4]))
    named = set(module_reasons())
    for action in actions:
        reason = _reasons.engine_call_failed(action)
        assert reason in named or action in listed, f"{reason} is not documented"
