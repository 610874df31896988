"""What the orchestrator tells about itself: the audit trail, the metrics, and what the status
page shows — fed from one place.

The session drivers and the orchestrator call an :class:`Observer` when something happens (a
session starts or ends, a container starts or stops, a tool call ends, an error is answered).
It turns each event into an audit record (:mod:`.audit`), updates the metrics
(:mod:`.metrics`) from the very same event — so the counters match the audit by construction —
and keeps the recent past in memory, bounded, for the status page. A tool call is kept as its
audit record is written: without a secret's value (:mod:`.redaction`), whatever field of it a
client or a server filled in (arguments, the tool's name, the request id, an error's reason).

Synchronous and cheap: it runs on the trio thread; the audit file is written by the writer's
own thread.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._reasons import IDLE
from ..protocol.egress import EgressRecord
from ..protocol.tool_calls import ToolCall, ToolCallDone
from .audit import AuditWriter, now_iso
from .metrics import Metrics
from .redaction import SECRET_VALUES

if TYPE_CHECKING:
    from ..workspace import Recorded
    from .tracing import Tracing

log = logging.getLogger(__name__)

RECENT_CALLS: Final = 1000
# Audit records and tool calls held for a later batch (see Observer.defer_audit), at most;
# beyond, handed over. The answers held with their calls (to read their outcome): at most so
# many bytes.
MAX_DEFERRED: Final = 10_000
MAX_DEFERRED_BYTES: Final = 4 * 1024 * 1024
# What the status page's charts cover, and at most how many events they keep for it.
HISTORY_SECONDS: Final = 3600.0
HISTORY_EVENTS: Final = 50_000


def token_id(token: str | None) -> str:
    """How the audit names a client's token: a short hash, never the token ("none": no auth)."""
    if token is None:
        return "none"
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Client:
    """Who a session's client is, as far as the orchestrator can tell."""

    token: str  # token_id() of the token it presented ("oidc": a signed-in user's)
    peer: str  # address:port
    transport: str  # websocket, streamable-http
    user_agent: str = ""
    # Who signed in (auth.mode: oidc; None: the orchestrator's token, or no authentication).
    user: str | None = None
    groups: tuple[str, ...] = ()

    @functools.cached_property
    def _record(self) -> dict[str, Any]:
        client: dict[str, Any] = {
            "token": self.token,
            "peer": self.peer,
            "transport": self.transport,
        }
        if self.user is not None:
            client["user"] = self.user
            client["groups"] = list(self.groups)
        if self.user_agent:
            client["user_agent"] = self.user_agent[:200]
        return client

    def record(self) -> dict[str, Any]:
        """As the audit writes it (made once: every call's record carries it; not to be
        changed)."""
        return self._record


@dataclass(frozen=True)
class CallEvent:
    """A finished tool call in the recent past (status page, charts)."""

    at: float  # wall clock, when it ended
    duration: float
    service: str
    outcome: str
    record: dict[str, Any]  # its audit record, redacted as the trail has it


@dataclass(frozen=True, slots=True)
class _HeldCall:
    """A finished tool call held back (see :meth:`Observer.defer_audit`), and where it ran."""

    done: ToolCallDone
    session: str
    endpoint: str
    service: str
    container: str | None
    client: Client | None
    trace_id: str
    ended: float  # wall clock, when the call ended (it may be recorded a little later)
    # An agent's child session's call: the parent session and call (ChildGrant.record()).
    parent: dict[str, Any] | None = None


@dataclass(frozen=True)
class StartEvent:
    at: float
    service: str
    seconds: float


class Observer:
    """The audit trail, the metrics and the recent past of one orchestrator."""

    def __init__(
        self,
        *,
        services: Iterable[str] = (),
        audit: AuditWriter | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.audit = audit
        self.tracing = tracing
        self.metrics = metrics if metrics is not None else Metrics(services)
        if audit is not None:
            self.metrics.audit_dropped = lambda: audit.dropped
        self.calls: collections.deque[CallEvent] = collections.deque(maxlen=HISTORY_EVENTS)
        self._deferred: list[dict[str, Any] | _HeldCall] = []
        self._deferred_bytes = 0  # of the answers held with their calls
        self._wake: Callable[[], None] | None = None
        self.starts: collections.deque[StartEvent] = collections.deque(maxlen=HISTORY_EVENTS)

    def _write(self, record: dict[str, Any]) -> None:
        if self.audit is None:
            return
        if self._wake is None:
            self.audit.submit(record)
            return
        self._hold(record)

    def _hold(self, item: dict[str, Any] | _HeldCall) -> None:
        self._deferred.append(item)
        if isinstance(item, _HeldCall):
            self._deferred_bytes += item.done.held_bytes
        if len(self._deferred) == 1:
            assert self._wake is not None
            self._wake()
        elif len(self._deferred) >= MAX_DEFERRED or self._deferred_bytes >= MAX_DEFERRED_BYTES:
            self.flush()

    def defer_audit(self, wake: Callable[[], None] | None) -> None:
        """Hold audit records and finished tool calls back until :meth:`flush`, calling
        ``wake`` when the first one of a batch is held (None: take each as it comes, those
        held so far now).

        Why: a call ends where its answer passes, on the event loop, and everything done
        there — reading the answer's outcome, making the record, the metrics, the status
        page, handing the record to the writer (encoding, chaining, queueing) — would delay
        that answer; see :func:`reactor_fabric.trio.audit_batches.hand_audit_over_later`.
        Order is kept: every record passes through the same list.
        """
        self.flush()
        self._wake = wake

    def flush(self) -> None:
        """Take the tool calls held back and hand the records to the audit writer, in
        order."""
        if not self._deferred:
            return
        held, self._deferred, self._deferred_bytes = self._deferred, [], 0
        records: list[bytes] = []
        for item in held:
            if isinstance(item, dict):
                records.append(SECRET_VALUES.redacted_json(item))
                continue
            try:
                line = self._record_call(item)
            except Exception:
                # This runs in the orchestrator's own task, not the session's: a call that
                # cannot be recorded (a tracing exporter failing, say) is logged and left out,
                # and the others, and the orchestrator, go on. It counts as dropped, so that
                # the trail says so (audit_dropped), not only the log.
                log.exception("tool_call_not_recorded", extra={"session": item.session})
                if self.audit is not None:
                    self.audit.count_dropped(1)
                continue
            if line is not None:
                records.append(line)
        if self.audit is not None:
            self.audit.submit_encoded(records)

    # --- sessions -----------------------------------------------------------------------------

    def session_started(
        self,
        session: str,
        *,
        endpoint: str,
        service: str,
        client: Client,
        mounts: list[dict[str, Any]],
        trace_id: str,
        traceparent: str | None = None,
        parent: dict[str, Any] | None = None,
    ) -> None:
        """A session admitted (``traceparent``: the valid one of the request that opened it,
        whose trace ``trace_id`` then is; ``parent``: an agent's child session's parent)."""
        record: dict[str, Any] = {
            "ts": now_iso(),
            "event": "session_start",
            "session": session,
            "endpoint": endpoint,
            "service": service,
            "client": client.record(),
            "mounts": mounts,
            "trace_id": trace_id,
        }
        if parent is not None:
            record["parent"] = parent
        self._write(record)
        if self.tracing is not None:
            self.tracing.session_started(
                session,
                endpoint=endpoint,
                service=service,
                transport=client.transport,
                peer=client.peer,
                trace_id=trace_id,
                traceparent=traceparent,
            )

    def session_ended(
        self, session: str, *, endpoint: str, service: str, seconds: float, calls: int
    ) -> None:
        self._write(
            {
                "ts": now_iso(),
                "event": "session_end",
                "session": session,
                "endpoint": endpoint,
                "service": service,
                "duration_ms": round(seconds * 1000, 3),
                "tool_calls": calls,
            }
        )
        if self.tracing is not None:
            self.tracing.session_ended(session, calls=calls)

    def session_refused(
        self, *, service: str, client: Client | None, code: int, reason: str
    ) -> None:
        """A session refused at its first message (a forbidden mount, an unknown service…)."""
        record: dict[str, Any] = {"ts": now_iso(), "event": "session_refused", "service": service}
        if client is not None:
            record["client"] = client.record()
        record |= {"code": code, "reason": reason}
        self._write(record)
        self.error_sent(code, reason)

    # --- containers ---------------------------------------------------------------------------

    def container_started(
        self,
        *,
        session: str,
        service: str,
        container: str,
        image: str,
        seconds: float,
        respawn: bool,
        pooled: bool = False,
        call: dict[str, object] | None = None,
    ) -> None:
        record: dict[str, object] = {
            "ts": now_iso(),
            "event": "container_start",
            "session": session,
            "service": service,
            "container": container,
            "image": image,
            "start_ms": round(seconds * 1000, 3),
            "respawn": respawn,
            "pooled": pooled,
        }
        if call is not None:
            record["call"] = call  # a per-call container: the one call it serves
        self._write(record)
        label = self.metrics.service_label(service)
        source = "pool" if pooled else "fresh"
        self.metrics.container_start.labels(label, source).observe(seconds)
        if respawn:
            self.metrics.respawns.inc()
        self.starts.append(StartEvent(time.time(), service, seconds))
        if self.tracing is not None:
            self.tracing.container_started(
                session=session,
                service=service,
                container=container,
                image=image,
                seconds=seconds,
                respawn=respawn,
            )

    def container_stopped(
        self,
        *,
        session: str,
        service: str,
        container: str,
        reason: str,
        exit_code: int | None,
    ) -> None:
        self._write(
            {
                "ts": now_iso(),
                "event": "container_stop",
                "session": session,
                "service": service,
                "container": container,
                "reason": reason,
                "exit_code": exit_code,
            }
        )
        if reason == IDLE:
            self.metrics.idle_teardowns.inc()

    def workspace(
        self,
        *,
        session: str,
        service: str,
        call: object,
        recorded: Recorded | None,
        failure: str | None,
    ) -> None:
        """An isolated task's copy at its end: the branch its changes became (``commit``
        None: nothing changed), or why nothing was recorded."""
        record: dict[str, Any] = {
            "ts": now_iso(),
            "event": "workspace",
            "session": session,
            "service": service,
            "call": call if isinstance(call, str | int) else None,
        }
        if recorded is None:
            record["error"] = failure
        else:
            record.update(
                branch=recorded.branch,
                base=recorded.base,
                commit=recorded.commit,
                diff_sha256=recorded.diff_sha256,
                files_changed=recorded.files_changed,
                insertions=recorded.insertions,
                deletions=recorded.deletions,
            )
        self._write(record)

    def orphans_removed(self, count: int) -> None:
        self.metrics.orphans_removed.inc(count)

    # --- what servers offer -------------------------------------------------------------------

    def tools_changed(
        self,
        *,
        session: str,
        endpoint: str,
        service: str,
        container: str | None,
        changes: dict[str, Any],
    ) -> None:
        """A session's backend listed other tools than before (after its list_changed):
        ``changes`` names what was added, removed or changed (fields and hashes, no text) —
        a server that rewrites its descriptions mid-session leaves this trace."""
        self._write(
            {
                "ts": now_iso(),
                "event": "tools_changed",
                "session": session,
                "endpoint": endpoint,
                "service": service,
                "container": container,
                **changes,
            }
        )

    def drift(self, *, mode: str, where: str, drift: dict[str, Any]) -> None:
        """Something differs from the suite lock (an image's id, a tool's definition…):
        ``drift`` names it and the parts that changed (hashes compared, never the text)."""
        self._write({"ts": now_iso(), "event": "drift", "mode": mode, "where": where, **drift})

    def egress(self, record: EgressRecord, *, session: str) -> None:
        """A connection of a container through its egress proxy (``session``: the container's
        session, ``""`` for a pooled one not handed out yet)."""
        self._write(
            {
                "ts": now_iso(),
                "event": "egress",
                "session": session,
                "service": record.service,
                "container": record.container[:12],
                "destination": record.destination,
                "address": record.address,
                "outcome": record.outcome,
                "reason": record.reason,
                "bytes_sent": record.sent,
                "bytes_received": record.received,
                "ms": round(record.seconds * 1000, 3),
            }
        )
        self.metrics.egress(
            record.service, record.outcome, sent=record.sent, received=record.received
        )

    # --- calls and errors ---------------------------------------------------------------------

    def tool_call(
        self,
        call: ToolCall | ToolCallDone,
        *,
        session: str,
        endpoint: str,
        service: str,
        container: str | None,
        client: Client | None,
        trace_id: str,
        parent: dict[str, Any] | None = None,
    ) -> None:
        """One finished tools/call: its audit record, its metrics, the status page's view
        (held back with the audit records while they are, see :meth:`defer_audit`).
        ``parent``: the call was an agent's, through its child session of that parent."""
        held = _HeldCall(
            call if isinstance(call, ToolCallDone) else ToolCallDone(call),
            session,
            endpoint,
            service,
            container,
            client,
            trace_id,
            time.time(),
            parent,
        )
        if self._wake is not None:
            self._hold(held)
            return
        line = self._record_call(held)
        if self.audit is not None and line is not None:
            self.audit.submit_encoded([line])

    def _record_call(self, held: _HeldCall) -> bytes | None:
        """The call's metrics and status page entry, and its audit record (returned encoded,
        and redacted: None without a trail). The status page keeps the record as the trail
        has it: one redaction, and one encoding, for both."""
        call = held.done.call
        session, service, container = held.session, held.service, held.container
        now = held.ended
        record: dict[str, Any] = {
            "ts": now_iso(now - call.duration),
            "event": "tool_call",
            "session": session,
            "endpoint": held.endpoint,
            "client": held.client.record() if held.client is not None else None,
            "service": service,
            "container": container,
            "tool": call.tool,
            "request_id": call.request_id,
            "arguments_sha256": call.arguments.sha256,
        }
        if call.arguments.full is not None:
            record["arguments"] = call.arguments.full
        elif call.arguments.truncated:
            record["arguments_truncated"] = True
        elif call.arguments.too_deep:
            record["arguments_too_deep"] = True
        record |= {
            "duration_ms": round(call.duration * 1000, 3),
            "outcome": call.outcome,
            "error_code": call.error_code,
            "error_reason": call.error_reason,
            "bytes_in": call.bytes_in,
            "bytes_out": call.bytes_out,
            "trace_id": trace_of(call.traceparent) or held.trace_id,
        }
        if held.parent is not None:
            record["parent"] = held.parent
            self.metrics.agent_call(str(held.parent.get("agent", "")), service, call.outcome)
        self.metrics.tool_call(service, call.tool, call.outcome, call.duration)
        line: bytes | None = None
        if self.audit is not None:
            kept, line = SECRET_VALUES.redacted_encoded(record)
        else:
            kept = SECRET_VALUES.redacted(record)
        self.calls.append(CallEvent(now, call.duration, service, call.outcome, kept))
        if self.tracing is not None:
            self.tracing.tool_call(
                call,
                session=session,
                trace_id=record["trace_id"],
                service=service,
                container=container,
                ended=now,
            )
        return line

    def error_sent(self, code: int, reason: str) -> None:
        """The orchestrator answered a client with an error of its own."""
        self.metrics.errors.labels(str(code), reason[:64]).inc()

    def close(self) -> None:
        self.defer_audit(None)
        if self.tracing is not None:
            self.tracing.close()
        if self.audit is not None:
            self.audit.close()


def trace_of(traceparent: str | None) -> str | None:
    """The trace id of a (valid) W3C traceparent."""
    return traceparent.split("-")[1] if traceparent is not None else None
