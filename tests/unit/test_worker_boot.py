"""The worker's interpreter started ahead of a run (images/worker-python/worker_boot.py): told a
directory and a script on stdin, it runs the script as ``python SCRIPT`` would in that
directory — run here with the host's Python, beside ``python SCRIPT`` itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BOOT = Path(__file__).parents[2] / "images" / "worker-python" / "worker_boot.py"


def completed(argv: list[str], told: bytes | None, cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run(argv, input=told, cwd=cwd, capture_output=True, timeout=30, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def booted(project: Path, script: Path, order: bytes | None = None) -> tuple[int, str, str]:
    """The boot program told to run ``script`` in ``project`` (started elsewhere, as the
    worker starts it: in its runs directory)."""
    told = order if order is not None else f"{project}\0{script}".encode()
    return completed([sys.executable, str(BOOT)], told, script.parent)


def plainly(project: Path, script: Path) -> tuple[int, str, str]:
    """``python SCRIPT`` in ``project``, stdin /dev/null."""
    return completed([sys.executable, str(script)], None, project)


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    project, runs = tmp_path / "project", tmp_path / "runs"
    project.mkdir()
    runs.mkdir()
    return project, runs


def script(runs: Path, text: str) -> Path:
    path = runs / "run-1.py"
    path.write_text(text)
    return path


def test_the_script_runs_in_the_project_as_main_with_its_argv_and_exit_status(
    places: tuple[Path, Path],
) -> None:
    project, runs = places
    code = script(
        runs,
        "import os, sys\n"
        "print(os.getcwd(), __name__, __file__ == sys.argv[0], len(sys.argv))\n"
        "print(sorted(k for k in globals() if not k.startswith('__')))\n"
        "print('to stderr', file=sys.stderr)\n"
        "raise SystemExit(3)\n",
    )
    status, out, err = booted(project, code)
    assert status == 3
    assert out.splitlines() == [f"{project} __main__ True 1", "['os', 'sys']"]
    assert err == "to stderr\n"
    assert (status, out, err) == plainly(project, code)


def test_the_projects_modules_import_as_with_python_dash_c(places: tuple[Path, Path]) -> None:
    project, runs = places
    (project / "helpers.py").write_text("ANSWER = 42\n")
    status, out, _ = booted(project, script(runs, "import helpers\nprint(helpers.ANSWER)\n"))
    assert (status, out) == (0, "42\n")


def test_stdin_is_empty_once_the_order_is_read(places: tuple[Path, Path]) -> None:
    project, runs = places
    code = script(runs, "import sys\nprint(repr(sys.stdin.read()))\n")
    assert booted(project, code)[:2] == (0, "''\n")


def test_a_traceback_shows_the_scripts_frames_only_and_exits_1(places: tuple[Path, Path]) -> None:
    project, runs = places
    code = script(runs, "def fail():\n    raise ValueError('no')\n\nfail()\n")
    status, out, err = booted(project, code)
    assert (status, out) == (1, "")
    assert err == plainly(project, code)[2]
    assert "worker_boot" not in err
    assert err.splitlines()[-1] == "ValueError: no"


def test_a_syntax_error_is_said_as_for_a_script(places: tuple[Path, Path]) -> None:
    project, runs = places
    code = script(runs, "print(1\n")
    status, _, err = booted(project, code)
    assert status == 1
    assert err == plainly(project, code)[2]
    assert "SyntaxError" in err


def test_the_script_is_compiled_without_the_boot_programs_future_flags(
    places: tuple[Path, Path],
) -> None:
    project, runs = places
    code = script(runs, "def f(x: undefined_name) -> None: ...\nprint(f.__annotations__)\n")
    status, _, err = booted(project, code)
    # Evaluated annotations (no `from __future__ import annotations` leaking in): a NameError.
    assert status == 1
    assert "NameError" in err


def test_an_interpreter_told_nothing_exits_quietly(places: tuple[Path, Path]) -> None:
    _, runs = places
    status, out, err = completed([sys.executable, str(BOOT)], b"", runs)
    assert (status, out, err) == (0, "", "")
