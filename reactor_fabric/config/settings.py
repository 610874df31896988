"""A suite read into the orchestrator's settings (:class:`~reactor_fabric.protocol.settings.
Settings`), once, when the suite is loaded: durations and sizes as the numbers the structs
parsed at load (:class:`~reactor_fabric.config.structs._ParsedOnce`), each service's lifecycle
made, the facts the ranking reads collected. The serving assembly builds them
(:func:`reactor_fabric.trio.serve.assemble`); nothing reads the suite's settings after.

Resource handling: none. Error handling: none beyond what a valid suite cannot raise (the
suite was validated before: :mod:`reactor_fabric.config.suite`).
"""

from __future__ import annotations

from ..protocol.agent_slots import AgentLimits
from ..protocol.fabric_discovery import AssistSettings, ServiceFacts
from ..protocol.lifecycle import Lifecycle
from ..protocol.settings import Limits, Pooling, Settings
from ..protocol.suite_lock import Mode, SuiteLock
from .structs import Service, Suite


def settings_for(
    suite: Suite,
    *,
    token_id: str,
    audited: bool = False,
    lock: SuiteLock | None = None,
    lock_mode: Mode = "off",
    replica: str | None = None,
) -> Settings:
    """The settings of an orchestrator serving ``suite``; ``token_id``: its token as the audit
    names it (:func:`~reactor_fabric.observe.observer.token_id`); ``audited``: it writes an
    audit trail (else the sessions keep nothing of a call's arguments)."""
    orchestrator = suite.orchestrator
    limits = orchestrator.limits
    services = suite.mcp_services
    assist = orchestrator.fabric.model_assist
    agents = orchestrator.agents
    return Settings(
        limits=Limits(
            max_sessions=orchestrator.max_sessions,
            max_message_bytes=orchestrator.max_message_bytes,
            max_connections=limits.max_connections,
            max_pending_connections=limits.max_pending_connections,
            first_message_seconds=limits.first_message_seconds,
            buffer_to_server_bytes=limits.buffer_to_server_bytes,
            buffer_to_client_bytes=limits.buffer_to_client_bytes,
            client_write_seconds=limits.client_write_seconds,
            shutdown_seconds=limits.shutdown_seconds,
        ),
        lifecycles={name: lifecycle_of(service) for name, service in services.items()},
        idle_timeouts={name: service.idle_timeout_seconds for name, service in services.items()},
        pooling=pooling_of(suite),
        facts=suite_facts(suite),
        profiles={name: tuple(profile.services) for name, profile in suite.profiles.items()},
        token_budget=orchestrator.fabric.token_budget,
        assist=AssistSettings(
            enabled=assist.enabled,
            below_confidence=assist.below_confidence,
            timeout=assist.timeout_seconds,
            candidates=assist.candidates,
        ),
        isolated=frozenset(n for n, s in services.items() if s.workspace_mode == "isolated"),
        agents=frozenset(n for n, s in services.items() if s.service_type == "llm_agent"),
        agent_limits=AgentLimits(agents.max_concurrent, agents.max_concurrent_per_session),
        max_agent_depth=agents.max_depth,
        audit_arguments=orchestrator.audit.arguments if audited else "none",
        token_id=token_id,
        lock=lock,
        lock_mode=lock_mode,
        replica=replica,
    )


def lifecycle_of(service: Service) -> Lifecycle:
    """A service's container lifecycle, for either machine (smart_refresh's bounds only with
    it: validation refuses them otherwise)."""
    if service.strategy != "smart_refresh":
        return Lifecycle(service.strategy)
    return Lifecycle(
        service.strategy,
        max_calls=service.max_calls_per_container,
        max_age=service.max_container_age_seconds,
        memory_threshold=service.memory_threshold_bytes,
    )


def pooling_of(suite: Suite) -> Pooling:
    """What the warm pool keeps of ``suite``'s services (the services refused for their
    secrets are taken out where those are known: :meth:`Pooling.without`)."""
    services = suite.mcp_services
    per_call = frozenset(
        name
        for name, service in services.items()
        if service.strategy == "fresh_per_call" and service.warm
    )
    return Pooling(
        targets={name: service.warm for name, service in services.items()},
        max_containers=suite.orchestrator.warm_pool.max_containers,
        parallel_starts=suite.orchestrator.warm_pool.parallel_starts,
        refill_hold_seconds=suite.orchestrator.warm_pool.refill_hold_seconds,
        fixed_shape=frozenset(n for n, service in services.items() if service.user is not None),
        greets=per_call,
        per_call=per_call,
    )


def suite_facts(suite: Suite) -> dict[str, ServiceFacts]:
    """What the suite says about each service, as the ranking and meta-tools read it."""
    return {
        name: ServiceFacts(
            description=service.description,
            categories=tuple(service.categories),
            keywords=tuple(service.keywords),
            example_tasks=tuple(service.example_tasks),
            requires=tuple(service.requires),
        )
        for name, service in suite.mcp_services.items()
    }
