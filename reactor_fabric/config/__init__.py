"""The suite file: its typed structures, and validation with errors that point at the file."""

from .structs import Limits, Orchestrator, Resources, Security, Service, Suite
from .suite import SuiteIssue, SuiteUnreadable, check_suite_text, load_suite, read_suite_file

__all__ = [
    "Limits",
    "Orchestrator",
    "Resources",
    "Security",
    "Service",
    "Suite",
    "SuiteIssue",
    "SuiteUnreadable",
    "check_suite_text",
    "load_suite",
    "read_suite_file",
]
