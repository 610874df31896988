"""A client session on trio, for both endpoints: its first message, its admission, its
machine, and a crash contained.

:func:`serve_session` runs the admission's steps (:mod:`reactor_fabric.policy.admission`
decides; the mounts' validation and the capacity's count are the I/O done here), answers a
refusal and closes, or builds the session's machine — the relay's
:class:`~reactor_fabric.protocol.session.SessionMachine` or the fabric endpoint's
:class:`~reactor_fabric.protocol.fabric_server.FabricServer` — and hands it to the one driver
(:class:`~reactor_fabric.trio.driver.SessionDriver`), which moves the bytes::

    serve_session
    └── SessionDriver.run       (see trio/driver.py for its tasks)

What a session uses of the orchestrator is :class:`SessionParts`: the suite, the settings, the
session registry, the catalog service, the container starter and the observer, nothing else.

Resource handling: the session is registered with the orchestrator's registry from its
admission to its end (``finally``); the driver removes its containers, shielded and bounded.

Error handling: :func:`serve_session` never raises except :class:`trio.Cancelled`. What a client
or a container does is answered as the machine decides; anything unexpected (a bug) is logged
with its traceback, every request the session owed is answered with a JSON-RPC error and the
connection closed — other sessions never notice.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import trio

from .._errors import (
    FabricError,
    SessionCrashed,
)
from .._reasons import INTERNAL_ERROR
from .._version import __version__
from ..config.structs import Service, Suite
from ..config.suite import FABRIC_ENDPOINT
from ..observe.observer import Client, Observer, trace_of
from ..observe.redaction import SECRET_VALUES
from ..policy.admission import (
    Admission,
    FabricOptions,
    Refusal,
    admission,
    service_not_allowed,
)
from ..policy.child_grant import ChildGrant
from ..policy.container_parts.secrets import runs_as
from ..policy.mount_spec import MountSpec
from ..policy.principal import TOKEN_HOLDER, Principal
from ..policy.user_policy import Allowance, allowance_for
from ..protocol.call_rates import UserCallRate
from ..protocol.catalog import Catalog
from ..protocol.fabric_server import FabricServer
from ..protocol.fabric_setup import FabricSetup
from ..protocol.jsonrpc import error_response
from ..protocol.session import SessionMachine
from ..protocol.settings import Settings
from ..protocol.tool_calls import valid_traceparent
from .catalog_service import CatalogService
from .channel import ChannelClosed, ClientChannel, LeasedClient
from .containers import ContainerHost, ContainerStarter
from .driver import SessionDriver
from .http_server import Request
from .identity import new_session_id
from .registry import SessionRecord, SessionRegistry

__all__ = ["ClientChannel", "SessionParts", "client_of", "refuse", "serve_session"]

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_INTERNAL_ERROR = 1011
# How long a fabric-endpoint session that opens while the catalog is still being learned waits.
CATALOG_WAIT_SECONDS = 30.0


class SessionParts(Protocol):
    """What a session uses of the orchestrator (the serving's composition,
    :class:`~reactor_fabric.trio.serve.Fabric`, is one): the suite (admission reads it), the
    settings, the registry it is admitted to, the catalog the fabric endpoint serves, the
    starter of its containers, and the observer that audits it."""

    @property
    def suite(self) -> Suite: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def registry(self) -> SessionRegistry: ...

    @property
    def catalog(self) -> CatalogService: ...

    @property
    def starter(self) -> ContainerStarter: ...

    @property
    def observer(self) -> Observer: ...


async def serve_session(
    parts: SessionParts,
    channel: ClientChannel,
    service_name: str,
    query_mounts: list[str],
    *,
    first_frame: bytes | None = None,
    session_id: str | None = None,
    transport: str = "websocket",
    query: Mapping[str, list[str]] | None = None,
    client: Client | None = None,
    traceparent: str | None = None,
    lease: LeasedClient | None = None,
    child: ChildGrant | None = None,
) -> None:
    """Run one client session from its first message to its end (see the module docstring).

    ``first_frame`` is the first message when the transport already has it (otherwise it is
    received here); ``session_id`` is chosen here unless the transport needs it beforehand
    (Streamable HTTP announces it in a header of the first response). ``client`` and the W3C
    ``traceparent`` of the request that opened the session go into the audit trail.
    ``child``: an agent's child session (see :mod:`.child_sessions`): the parent's mounts and
    trace, only the granted services, every tool listed.
    """
    session_id = session_id or new_session_id(parts.settings.replica)
    progress = _Progress()
    try:
        await _serve_session(
            parts,
            channel,
            service_name,
            query_mounts,
            first_frame=first_frame,
            session_id=session_id,
            transport=transport,
            query=query,
            progress=progress,
            client=client,
            traceparent=traceparent,
            lease=lease,
            child=child,
        )
    except* Exception as failure:
        log.error(
            "session_crashed",
            extra={"session": session_id, "service": service_name},
            exc_info=failure,
        )
        with trio.move_on_after(5) as cleanup:
            cleanup.shield = True
            await _tell_client_of_crash(channel, progress, session_id)


@dataclass
class _Progress:
    """How far a session got, for the answers to give if it crashes."""

    first_request_id: object = None
    driver: _Driver | None = None


class _Driver(Protocol):
    """What the crash path needs of a session's driver (the tests give it one that fails)."""

    async def run(self, first_frame: bytes, first: object) -> None: ...

    def owed_frames(self, error: FabricError) -> list[bytes]:
        """The answers the client is owed if the session ends now with ``error``."""


async def _tell_client_of_crash(
    channel: ClientChannel, progress: _Progress, session_id: str
) -> None:
    """Every request the crashed session owed gets the error; then the connection closes.

    Contained, not silent: what fails here too (a second bug, a channel that breaks) is logged
    with its traceback, and the steps after it still run.
    """
    fields = {"session": session_id}
    error = SessionCrashed(
        "the orchestrator failed while serving this session; see its log",
        reason=INTERNAL_ERROR,
    )
    frames = [error_response(progress.first_request_id, error)]
    if progress.driver is not None:
        try:
            frames = progress.driver.owed_frames(error)
        except Exception:
            # The first request is still answered; the others are not known.
            log.exception("session_crash_answers_failed", extra=fields)
    try:
        for frame in frames:
            await channel.send(frame)
    except ChannelClosed:
        log.info("session_crash_untold", extra={**fields, "detail": "the client is gone"})
    except Exception:
        log.exception("session_crash_untold", extra=fields)
    try:
        await channel.close(CLOSE_INTERNAL_ERROR, "internal error")
    except ChannelClosed:
        pass  # the client is gone: there is nothing left to close
    except Exception:
        log.exception("session_crash_close_failed", extra=fields)


async def _serve_session(
    parts: SessionParts,
    channel: ClientChannel,
    service_name: str,
    query_mounts: list[str],
    *,
    first_frame: bytes | None,
    session_id: str,
    transport: str,
    query: Mapping[str, list[str]] | None,
    progress: _Progress,
    client: Client | None,
    traceparent: str | None,
    lease: LeasedClient | None,
    child: ChildGrant | None = None,
) -> None:
    observer = parts.observer
    client = client or Client(parts.settings.token_id, "", transport)

    async def refused(request_id: object, error: FabricError) -> None:
        observer.session_refused(
            service=service_name, client=client, code=error.code, reason=error.reason
        )
        await refuse(channel, request_id, error, service=service_name)

    if first_frame is None:
        received = await channel.receive()
        if not isinstance(received, bytes):
            return  # gone (a Handover comes only once a driver has taken the channel)
        first_frame = received
    # What the session is and asks for: decided in policy.admission, steps 1-4.
    decision = admission(
        first_frame,
        endpoint=service_name,
        suite=parts.suite,
        query=query or {},
        query_mounts=query_mounts,
    )
    request_id = progress.first_request_id = decision.request_id
    if isinstance(decision, Refusal):
        await refused(request_id, decision.error)
        return
    # What its user may do (orchestrator.users), and the mounts it may have.
    granted = await _granted(parts, decision, service_name, client, child)
    if isinstance(granted, FabricError):
        await refused(request_id, granted)
        return
    decision, mounts, allowed, allowance = granted
    traceparent = traceparent if traceparent and valid_traceparent(traceparent) else None
    record = SessionRecord(
        service_name,
        transport,
        id=session_id,
        client=client,
        mounts=mounts,
        trace_id=(child.trace_id if child is not None else trace_of(traceparent))
        or secrets.token_hex(16),
        started_at=time.time(),
        last_active=trio.current_time(),
        parent=child,
        services=allowed,
        call_rate=(
            UserCallRate(parts.registry.call_rates, client.user, allowance.calls_per_minute)
            if client.user is not None and allowance.calls_per_minute is not None
            else None
        ),
    )
    # Step 5, and the session counted if admitted.
    full = parts.registry.admit(session_id, record, user_limit=allowance.max_sessions)
    if full is not None:
        await refused(request_id, full)
        return
    observer.session_started(
        session_id,
        endpoint=record.endpoint,
        service=service_name,
        client=client,
        mounts=record.mount_records(),
        trace_id=record.trace_id,
        traceparent=traceparent,
        parent=child.record() if child is not None else None,
    )
    try:
        log.info(
            "session_started",
            extra={
                "session": session_id,
                "service": service_name,
                "transport": transport,
                "mounts": [m.target for m in mounts],
                "trace_id": record.trace_id,
                **({"user": client.user} if client.user is not None else {}),
            },
        )
        driver: _Driver
        if decision.options is not None:
            driver = await _fabric_driver(parts, channel, record, decision.options, lease=lease)
        else:
            assert decision.service is not None
            driver = _relay_driver(
                parts, channel, service_name, decision.service, record, lease=lease
            )
        progress.driver = driver
        # The copy its first isolated task starts on: kept, or begun a second from now (spares.py).
        relayed = {service_name: decision.service} if decision.service is not None else None
        await _begin_spares(parts.starter, record, relayed or parts.suite.mcp_services)
        await driver.run(first_frame, decision.first)
    finally:
        try:
            if parts.starter.workspaces is not None:
                # Its spare copies (shielded, bounded), before it is counted out: a waiter for
                # the registry's change finds them gone.
                await parts.starter.workspaces.spares.end_session(session_id)
        finally:
            parts.registry.release(session_id)
        log.info("session_ended", extra={"session": session_id, "service": service_name})
        observer.session_ended(
            session_id,
            endpoint=record.endpoint,
            service=service_name,
            seconds=time.time() - record.started_at,
            calls=record.tool_calls,
        )


async def _begin_spares(
    starter: ContainerStarter, record: SessionRecord, services: Mapping[str, Service]
) -> None:
    """When ``services`` has one that works on a copy of the session's project (``workspace:
    isolated``), begin the spare copy its first task will start on — one per account such
    tasks run as. Quick (the mounts pinned, a thread started); never fails the session: a
    spare that cannot be begun is logged, and the task copies the project whole. Not for an
    agent's child session: its project is its task's copy, which has no repository."""
    if record.parent is not None:
        return
    workspaces = starter.workspaces
    isolated = {n: s for n, s in services.items() if s.workspace_mode == "isolated"}
    writable = [m for m in record.mounts if not m.read_only and not m.git_guard]
    if workspaces is None or not workspaces.spares.wanted or not isolated or len(writable) != 1:
        return
    try:
        pins, account, _mounts = await starter.prepare_start(record.mounts)
    except (FabricError, OSError) as exc:
        log.info("workspace_spare_not_begun", extra={"session": record.id, "detail": str(exc)})
        return
    if pins is None:
        return
    try:
        project = pins.for_target(writable[0].target)
        assert project is not None  # every mount is pinned
        owners = {runs_as(n, s, starter.identity, account) for n, s in isolated.items()}
        for owner in owners:
            user = record.client.user if record.client is not None else None
            workspaces.spares.make_for_session(record.id, project, (owner.uid, owner.gid), user)
    except OSError as exc:  # (e.g. out of descriptors: the tasks copy the project whole)
        log.info("workspace_spare_not_begun", extra={"session": record.id, "detail": str(exc)})
    finally:
        pins.close()


def _relay_driver(
    parts: SessionParts,
    channel: ClientChannel,
    service_name: str,
    service: Service,
    record: SessionRecord,
    *,
    lease: LeasedClient | None,
) -> SessionDriver:
    """The driver of a new relay session: its machine, run against the session's host."""
    now = trio.current_time()
    settings = parts.settings
    machine = SessionMachine(
        settings.relay(service_name),
        service_name=service_name,
        now=now,
        session_id=record.id,
        client_lease=lease.lease_seconds if lease is not None else None,
        agent_slots=parts.registry.agent_slots if service.service_type == "llm_agent" else None,
        redact=SECRET_VALUES.redacted,
        call_rate=record.call_rate,
    )
    record.served, record.served_since = machine.served, now
    host = _host(parts, record)
    return SessionDriver(machine, channel, host, record=record, endpoint=service_name, lease=lease)


def _host(parts: SessionParts, record: SessionRecord) -> ContainerHost:
    """The orchestrator as the session's driver sees it."""
    return ContainerHost(
        record,
        starter=parts.starter,
        registry=parts.registry,
        observer=parts.observer,
        max_message_bytes=parts.settings.limits.max_message_bytes,
        compute_limiter=parts.catalog.refresh_limiter,
    )


async def _granted(
    parts: SessionParts,
    decision: Admission,
    service_name: str,
    client: Client,
    child: ChildGrant | None,
) -> tuple[Admission, tuple[MountSpec, ...], frozenset[str] | None, Allowance] | FabricError:
    """What an admitted session may use: its decision (a child's: the granted services, each
    tool listed), its mounts (validated against its user's roots; a child's: the parent's,
    validated at its admission and pinned again at every start), the services it may use
    (None: all) and its user's allowance; or the error refusing it (a service or a mount its
    user may not have)."""
    allowance = allowance_for(
        parts.suite.orchestrator,
        parts.suite.mcp_services,
        Principal(client.user, client.groups) if client.user is not None else TOKEN_HOLDER,
    )
    allowed = allowance.services
    if decision.options is None and not allowance.may_use(service_name):
        return service_not_allowed(service_name)
    if child is not None:
        granted = frozenset(child.services)
        allowed = granted if allowed is None else granted & allowed
        return (
            replace(decision, options=FabricOptions("all", child.services)),
            child.mounts,
            allowed,
            allowance,
        )
    roots = allowance.mount_roots if client.user is not None else None
    try:
        # The mount policy resolves paths on the file system: the one step that does I/O.
        mounts = await parts.starter.validate_mounts(decision.mounts, roots)
    except FabricError as exc:
        return exc
    return decision, mounts, allowed, allowance


async def _fabric_driver(
    parts: SessionParts,
    channel: ClientChannel,
    record: SessionRecord,
    options: FabricOptions,
    *,
    lease: LeasedClient | None,
) -> SessionDriver:
    """The driver of a new fabric-endpoint session: its machine, with the catalog it serves —
    waited for (bounded) while it is still being learned — and its ranking index: the
    start-up's, or, for a catalog not indexed yet (the wait gave up, or a re-check is
    publishing), one built in a worker thread, never on the event loop."""
    catalogs = parts.catalog
    if not catalogs.ready.is_set():
        with trio.move_on_after(CATALOG_WAIT_SECONDS):
            await catalogs.ready.wait()
    catalog = catalogs.current
    if record.services is not None:
        # Only the services the session may use exist for it: an agent's child session's
        # grant, a signed-in user's (orchestrator.users).
        granted = record.services
        catalog = Catalog({n: o for n, o in catalog.services.items() if n in granted})
    index = catalogs.indexed(catalog)
    if index is None:
        index = await trio.to_thread.run_sync(catalogs.discovery_index, catalog)
    setup = FabricSetup(
        catalog,
        record.id,
        parts.settings,
        index=index,
        mount_targets=tuple(mount.target for mount in record.mounts),
        exposure=options.exposure,
        active=frozenset(options.active),
        client_lease=lease.lease_seconds if lease is not None else None,
        agent_slots=parts.registry.agent_slots,
        call_rate=record.call_rate,
        redact=SECRET_VALUES.redacted,
        now=trio.current_time(),
        version=__version__,
    )
    machine = FabricServer(setup)
    record.served, record.served_since = machine.served, machine.started_at
    host = _host(parts, record)
    return SessionDriver(
        machine, channel, host, record=record, endpoint=FABRIC_ENDPOINT, lease=lease
    )


def client_of(
    token_id: str, request: Request, transport: str, principal: Principal = TOKEN_HOLDER
) -> Client:
    """Who opened a session, for the audit: the token it was admitted with (``token_id``: as
    the audit names it; a signed-in user's token is not named), its address, its user."""
    if principal.user is not None:
        return Client(
            "oidc",
            request.peer,
            transport,
            request.header(b"user-agent"),
            user=principal.user,
            groups=principal.groups,
        )
    return Client(token_id, request.peer, transport, request.header(b"user-agent"))


async def refuse(
    channel: ClientChannel, request_id: object, error: FabricError, *, service: str
) -> None:
    """Answer the first message with ``error`` and close, normally: nothing was started.

    The close is a normal one (1000) so that clients deliver the error to the waiting request
    instead of failing on the close (the Python SDK 1.x raises on any other code).
    """
    log.warning(
        "session_refused",
        extra={
            "service": service,
            "code": error.code,
            "reason": error.reason,
            "detail": str(error),
        },
    )
    try:
        await channel.send(error_response(request_id, error))
        await channel.close(CLOSE_NORMAL, error.reason)
    except ChannelClosed:
        return  # the client is gone: nobody to tell
