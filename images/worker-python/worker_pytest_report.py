"""A pytest plugin of the Python worker's (``-p worker_pytest_report``): the run's outcome as
JSON in the file the environment's ``WORKER_PYTEST_REPORT`` names — counts by outcome, and
each failing or erroring test's node id with its report's first lines — so that ``run_tests``
reads exact test ids rather than parsing pytest's text.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

REPORT_ENV = "WORKER_PYTEST_REPORT"
MAX_FAILURES = 100
MESSAGE_LINES = 10
MESSAGE_CHARS = 2000

_counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "xfailed": 0, "xpassed": 0}
_failures: list[dict[str, Any]] = []


def _first_lines(report: Any) -> str:
    text = getattr(report, "longreprtext", "") or ""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = f"{crash.path}:{crash.lineno}: {crash.message}"
    lines = text.strip("\n").splitlines()[:MESSAGE_LINES]
    return "\n".join(lines)[:MESSAGE_CHARS]


def _failure(nodeid: str, kind: str, report: Any) -> None:
    if len(_failures) < MAX_FAILURES:
        _failures.append({"id": nodeid, "outcome": kind, "message": _first_lines(report)})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            _counts["xpassed" if xfail else "passed"] += 1
        elif report.failed:
            _counts["failed"] += 1
            _failure(report.nodeid, "failed", report)
        elif report.skipped:
            _counts["xfailed" if xfail else "skipped"] += 1
    elif report.failed:  # setup or teardown
        _counts["errors"] += 1
        _failure(report.nodeid, "error", report)
    elif report.when == "setup" and report.skipped:
        _counts["xfailed" if xfail else "skipped"] += 1


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _counts["errors"] += 1
        _failure(report.nodeid or ".", "error", report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    with open(path, "w", encoding="utf-8") as report:
        json.dump(
            {
                **_counts,
                "collected": session.testscollected,
                "exit_status": int(exitstatus),
                "failures": _failures,
                "failures_truncated": _counts["failed"] + _counts["errors"] > len(_failures),
            },
            report,
        )
