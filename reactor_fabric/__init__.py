"""Reactor-Fabric: run many MCP servers for AI coding agents, one fresh container per session.

The public API is re-exported here; the private modules each hold one concept.
"""

from ._errors import (
    ClientDidNotAnswer,
    ContainerStartFailure,
    DockerUnavailable,
    FabricError,
    InvalidMessage,
    InvalidRequest,
    InvalidSuiteConfiguration,
    ParseError,
    SecurityViolation,
    ServiceNotFound,
    SessionCrashed,
    SessionEnding,
    SessionRefused,
    WorkspaceRefused,
)
from ._version import __version__
from .config.structs import Orchestrator, Resources, Security, Service, Suite
from .config.suite import SuiteIssue, SuiteUnreadable, check_suite_text, load_suite

__all__ = [
    "ClientDidNotAnswer",
    "ContainerStartFailure",
    "DockerUnavailable",
    "FabricError",
    "InvalidMessage",
    "InvalidRequest",
    "InvalidSuiteConfiguration",
    "Orchestrator",
    "ParseError",
    "Resources",
    "Security",
    "SecurityViolation",
    "Service",
    "ServiceNotFound",
    "SessionCrashed",
    "SessionEnding",
    "SessionRefused",
    "Suite",
    "SuiteIssue",
    "SuiteUnreadable",
    "WorkspaceRefused",
    "__version__",
    "check_suite_text",
    "load_suite",
]
