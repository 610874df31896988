"""What the command line's pieces share: the exit codes (``_cli.py`` says what each means) and
reading a suite file with every problem said."""

from __future__ import annotations

import sys

from .config.structs import Suite
from .config.suite import SuiteUnreadable, check_suite_text, read_suite_file

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2
EXIT_CANNOT_LISTEN = 3


def optional_suite(path: str) -> Suite | None:
    """The valid suite in ``path``, if there is one (quietly None otherwise)."""
    try:
        check = check_suite_text(read_suite_file(path), source=path)
    except SuiteUnreadable:
        return None
    return check.suite


def read_suite(path: str, *, warnings: bool = False) -> Suite | int:
    """The valid suite in ``path``; else the exit code, with every problem printed on stderr
    (``warnings``: what is valid but will not work as written, too)."""
    try:
        text = read_suite_file(path)
    except SuiteUnreadable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    check = check_suite_text(text, source=path)
    if check.suite is None:
        for issue in check.issues:
            print(issue, file=sys.stderr)
        print(f"{path}: invalid ({len(check.issues)} problem(s))", file=sys.stderr)
        return EXIT_INVALID
    if warnings:
        for warning in check.warnings:
            print(f"{warning} (warning)", file=sys.stderr)
    return check.suite
