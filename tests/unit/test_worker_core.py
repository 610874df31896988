"""The Python worker's decisions (images/worker-python/worker_core.py) and its pytest report
plugin, on the host: which paths a client may name (and what a link swapped in after the check
does), the bounds of outputs, which package requirements reach pip, and the reading of ruff's
and pip's reports. The tools themselves run in the image:
tests/integration/test_worker_python_e2e.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

IMAGE = Path(__file__).resolve().parents[2] / "images" / "worker-python"
_spec = importlib.util.spec_from_file_location("worker_core", IMAGE / "worker_core.py")
assert _spec is not None
assert _spec.loader is not None
core: Any = importlib.util.module_from_spec(_spec)
sys.modules["worker_core"] = core  # (dataclasses look their module up while the class is made)
_spec.loader.exec_module(core)


@pytest.fixture
def workspace(tmp_path: Path) -> Any:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hi')\n")
    (root / "link_in").symlink_to("src")
    (root / "link_out").symlink_to(tmp_path)
    (tmp_path / "secret.txt").write_text("not the client's to read")
    return core.Workspace(str(root))


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/etc/passwd", "absolute paths are not allowed"),
        ("../secret.txt", "'..' is not allowed"),
        ("src/../../secret.txt", "'..' is not allowed"),
        ("src/\0x", "a NUL character is not allowed"),
        ("a/" * 3000, "longer than 4096 bytes"),
        ("link_out/secret.txt", "leads out of the workspace"),
        ("link_out", "leads out of the workspace"),
    ],
)
def test_a_path_outside_the_workspace_is_refused_with_its_reason(
    workspace: Any, path: str, said: str
) -> None:
    with pytest.raises(core.Refused, match=said):
        workspace.read(path)


def test_a_link_inside_the_workspace_is_followed_and_named_by_where_it_leads(
    workspace: Any,
) -> None:
    read = workspace.read("link_in/app.py")
    assert (read["path"], read["content"]) == ("src/app.py", "print('hi')\n")
    assert read["truncated"] is False


def test_a_link_swapped_in_after_the_check_fails_the_open_instead_of_leading_out(
    workspace: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = workspace.resolve("src/app.py")
    root = Path(workspace.root)
    # Between the check and the open: src becomes a link to the directory above.
    (root / "src" / "app.py").unlink()
    (root / "src").rmdir()
    (root / "src").symlink_to(tmp_path)
    (tmp_path / "app.py").write_text("outside")
    monkeypatch.setattr(workspace.__class__, "resolve", lambda self, path: checked)
    with pytest.raises(core.Refused, match="is a link, not followed here"):
        workspace.read("src/app.py")
    with pytest.raises(core.Refused, match="is a link, not followed here"):
        workspace.write("src/app.py", "planted")
    assert (tmp_path / "app.py").read_text() == "outside"


def test_a_file_swapped_for_a_link_after_the_check_is_not_opened_through_it(
    workspace: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = workspace.resolve("src/app.py")
    (Path(workspace.root) / "src" / "app.py").unlink()
    (Path(workspace.root) / "src" / "app.py").symlink_to(tmp_path / "secret.txt")
    monkeypatch.setattr(workspace.__class__, "resolve", lambda self, path: checked)
    with pytest.raises(core.Refused, match="a link is in the way"):
        workspace.read("src/app.py")
    with pytest.raises(core.Refused, match="a link is in the way"):
        workspace.write("src/app.py", "planted")
    assert (tmp_path / "secret.txt").read_text() == "not the client's to read"


def test_a_file_is_written_with_its_directories_and_appended_to(workspace: Any) -> None:
    assert workspace.write("new/dir/file.txt", "one\n") == {
        "path": "new/dir/file.txt", "bytes_written": 4, "size": 4
    }  # fmt: skip
    assert workspace.write("new/dir/file.txt", "two\n", append=True)["size"] == 8
    assert (Path(workspace.root) / "new/dir/file.txt").read_text() == "one\ntwo\n"


def test_a_final_link_is_not_written_through(workspace: Any, tmp_path: Path) -> None:
    (Path(workspace.root) / "dangling").symlink_to(tmp_path / "made-outside")
    with pytest.raises(core.Refused, match="leads out of the workspace"):
        workspace.write("dangling", "x")
    assert not (tmp_path / "made-outside").exists()


def test_reading_is_bounded_and_says_what_is_left(workspace: Any) -> None:
    (Path(workspace.root) / "big.bin").write_bytes(b"\xff" * 10 + b"a" * 100)
    head = workspace.read("big.bin", limit=10)
    assert (head["encoding"], head["bytes"], head["size"], head["truncated"]) == (
        "base64", 10, 110, True
    )  # fmt: skip
    rest = workspace.read("big.bin", offset=10)
    assert (rest["content"], rest["truncated"]) == ("a" * 100, False)
    with pytest.raises(core.Refused, match=r"is a directory|not a regular file"):
        workspace.read("src")


def test_a_listing_does_not_enter_links_or_git_and_is_bounded(workspace: Any) -> None:
    root = Path(workspace.root)
    (root / ".git" / "objects").mkdir(parents=True)
    listed = workspace.list("", recursive=True)
    assert [(e["path"], e["type"]) for e in listed["entries"]] == [
        (".git", "directory"),
        ("link_in", "link"),
        ("link_out", "link"),
        ("src", "directory"),
        ("src/app.py", "file"),
    ]
    assert listed["truncated"] is False
    assert workspace.list("", recursive=True, limit=2)["truncated"] is True
    with pytest.raises(core.Refused, match="not a directory"):
        workspace.list("src/app.py")


@pytest.mark.parametrize(
    "package",
    ["requests", "attrs==24.2", "rich[jupyter]>=13,<14", "zope.interface", "a_b-c~=1.0"],
)
def test_a_plain_requirement_reaches_pip(package: str) -> None:
    assert core.requirements([package]) == [package]


@pytest.mark.parametrize(
    "package",
    [
        "--index-url=http://elsewhere/",
        "-r requirements.txt",
        "pkg @ https://example.com/pkg.whl",
        "./local-dir",
        "/abs/pkg.whl",
        "pkg; python_version>'3'",
        "",
        "x" * 201,
    ],
)
def test_anything_but_a_requirement_is_refused_before_pip_runs(package: str) -> None:
    with pytest.raises(core.Refused, match="is not a package requirement"):
        core.requirements([package])


def test_the_number_of_packages_and_arguments_is_bounded() -> None:
    with pytest.raises(core.Refused, match="at most 50 packages"):
        core.requirements(["a"] * 51)
    with pytest.raises(core.Refused, match="name at least one package"):
        core.requirements([])
    with pytest.raises(core.Refused, match="at most 64 arguments"):
        core.test_arguments(["-q"] * 65)


@pytest.mark.parametrize("asked", [0, -1, float("nan"), 601])
def test_a_timeout_outside_its_bounds_is_refused(asked: float) -> None:
    with pytest.raises(core.Refused, match="timeout"):
        core.timeout_of(asked, core.PYTHON_TIMEOUT, "run_python")


def test_output_keeps_its_first_or_last_bytes_and_says_how_many_there_were() -> None:
    head = core.Bounded(limit=5)
    for chunk in (b"abc", b"defg", b"hij"):
        head.add(chunk)
    assert head.truncated
    assert head.text().startswith("abcde\n[… truncated: 10 bytes in all")
    tail = core.Bounded(limit=5, tail=True)
    for chunk in (b"abc", b"defg", b"hij"):
        tail.add(chunk)
    assert tail.text().endswith("the last 5 kept]\nfghij")
    whole = core.Bounded(limit=5)
    whole.add(b"abcde")
    assert (whole.truncated, whole.text()) == (False, "abcde")


def test_ruffs_report_becomes_findings_relative_to_the_workspace() -> None:
    report = [
        {
            "filename": "/workspace/src/b.py",
            "location": {"row": 3, "column": 1},
            "code": "E711",
            "message": "Comparison to `None`",
            "fix": None,
        },
        {
            "filename": "/workspace/a.py",
            "location": {"row": 1, "column": 8},
            "code": "F401",
            "message": "`os` imported but unused",
            "fix": {"applicability": "safe"},
        },
    ]
    assert core.lint_findings(json.dumps(report), "/workspace") == {
        "findings": [
            {"file": "a.py", "line": 1, "column": 8, "code": "F401",
             "message": "`os` imported but unused", "fixable": True},
            {"file": "src/b.py", "line": 3, "column": 1, "code": "E711",
             "message": "Comparison to `None`", "fixable": False},
        ],
        "total": 2,
        "truncated": False,
    }  # fmt: skip
    with pytest.raises(core.Refused, match="not JSON"):
        core.lint_findings("{", "/workspace")


def test_pips_report_names_what_it_installed() -> None:
    report = {"install": [{"metadata": {"name": "Zeta", "version": "2"}},
                          {"metadata": {"name": "alpha", "version": "1.0"}}]}  # fmt: skip
    assert core.installed_of(json.dumps(report)) == [
        {"name": "alpha", "version": "1.0"},
        {"name": "Zeta", "version": "2"},
    ]
    assert core.installed_of("not json") == []


def test_the_report_plugin_counts_outcomes_and_names_failing_tests(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "test_things.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert 1 == 2, 'not equal'\n"
        "@pytest.mark.skip\n"
        "def test_skipped(): pass\n"
        "@pytest.mark.xfail\n"
        "def test_xfails(): assert False\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('fixture broke')\n"
        "def test_errors(broken): pass\n"
    )
    (project / "test_unimportable.py").write_text("import not_a_module_anywhere\n")
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "worker_pytest_report", "-p", "no:cacheprovider",
         "--continue-on-collection-errors", "-q", str(project)],
        env={**os.environ, "PYTHONPATH": str(IMAGE), "WORKER_PYTEST_REPORT": str(report)},
        capture_output=True,
        check=False,
    )  # fmt: skip
    outcome = json.loads(report.read_text())
    counts = {k: outcome[k] for k in ("passed", "failed", "errors", "skipped", "xfailed")}
    assert counts == {"passed": 1, "failed": 1, "errors": 2, "skipped": 1, "xfailed": 1}
    by_id = {f["id"].rpartition("/")[2]: f for f in outcome["failures"]}
    assert "not equal" in by_id["test_things.py::test_fails"]["message"]
    assert by_id["test_things.py::test_errors"]["outcome"] == "error"
    assert "fixture broke" in by_id["test_things.py::test_errors"]["message"]
    assert "not_a_module_anywhere" in by_id["test_unimportable.py"]["message"]
    assert outcome["exit_status"] == 1
