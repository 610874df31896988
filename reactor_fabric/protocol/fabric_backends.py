"""The fabric endpoint's backends of one session from their start to their stop, without I/O:
what its router (:mod:`.fabric_router`) has done with them, on the table of :mod:`.fabric_roster`
(their keys, lifecycles and bounds).

A backend is ``starting`` until the driver reports it started, ``handshaking`` while it is
greeted as a client would (``initialize``; not when the warm pool greeted it), ``ready`` once
it answered, when the requests that waited for it are sent. Every line sent to it is counted
(:meth:`BackendTable.send`).

A backend that fails to start, exits, breaks its output, refuses the handshake or stops reading
— it leaves more than ``own_backlog_bytes`` of the machine's own messages unread (answers to its
``ping`` and ``roots/list``, refusals, refreshes, the handshake), or nothing sent to it moved
for ``stall_timeout`` seconds: ``container_unresponsive``, as on the relay, rather than grow the
orchestrator's memory or hold its calls for ever — is forgotten and, when it still runs,
stopped at once (:class:`~.events.StopBackend`, logged ``backend_failed``), and what it owed is
answered with its error (:meth:`BackendTable.failed`: its calls, questions and lists go with
it); an idle one is stopped gracefully, as are per-call and retiring ones whose work is done
(:meth:`BackendTable.settle`). The next call starts a fresh one (transparent respawn), and the
session's other services are not affected.

What comes due (:meth:`BackendTable.tick`): stdin that did not move, a backend's question the
client left unanswered for :data:`~.fabric_exchanges.ASK_SECONDS` (answered to the backend
-32006 ``client_did_not_answer``), a call the client did not resume in time (see
:mod:`.input_waits`), idle backends, smart_refresh's age.

The table is made with the session's replies ledger, its requests in flight both ways and its
list refreshes (:class:`~.fabric_replies.Replies`, :class:`~.fabric_exchanges.Exchanges`,
:class:`~.fabric_refresh.Relists`): a backend's end takes its calls, questions and lists along.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .._errors import ClientDidNotAnswer, ContainerStartFailure, FabricError
from .._reasons import (
    CALL_DONE,
    CLIENT_DID_NOT_ANSWER,
    EXITED,
    HANDSHAKE_FAILED,
    IDLE,
    INPUT_WAIT_EXPIRED,
    NOT_NEEDED,
    REFRESH_AGE,
    REFRESH_CALLS,
    REFRESH_MEMORY,
    SESSION_ENDED,
)
from .answers import UNRESPONSIVE
from .backend import Role, Step
from .events import Action, BackendKey, Log, StopBackend, ToClient
from .fabric_exchanges import Exchanges
from .fabric_messages import handshake_request, notification_bytes
from .fabric_refresh import Relists
from .fabric_replies import Replies
from .fabric_roster import Limits, Roster, Routed
from .jsonrpc import error_response
from .lifecycle import Lifecycle
from .served import Served

Json = dict[str, Any]

# Stops that end a backend's work rather than a failure of it (not logged backend_failed).
QUIET_STOPS = frozenset(
    {IDLE, CALL_DONE, REFRESH_CALLS, REFRESH_AGE, REFRESH_MEMORY, NOT_NEEDED, INPUT_WAIT_EXPIRED}
)


class BackendTable:
    """A session's backends (its :class:`~.fabric_roster.Roster`) and what becomes of them
    (see the module's docs)."""

    def __init__(
        self,
        replies: Replies,
        exchanges: Exchanges,
        relists: Relists,
        *,
        version: str,
        lifecycles: Mapping[str, Lifecycle],
        idle_timeouts: Mapping[str, float],
        limits: Limits,
    ) -> None:
        self.replies, self.exchanges, self.relists = replies, exchanges, relists
        self.version = version  # (the orchestrator's, in each handshake)
        self.roster = Roster(lifecycles=lifecycles, idle_timeouts=idle_timeouts, limits=limits)
        # Which container served which call (get_status, /api/sessions), bounded.
        self.served = Served()
        # The session is ending (see end): its backends are owed nothing any more.
        self.ending: FabricError | None = None

    @property
    def now(self) -> float:
        """The time of the event being handled (the replies ledger's: the server's clock)."""
        return self.replies.now

    # --- starts ---------------------------------------------------------------------------------

    def started(self, key: BackendKey, container: str, *, greeted: bool) -> list[Action]:
        """The service's container runs: greet it as a client would, unless the warm pool did
        (``greeted``: a per-call one, its handshake done while it waited): then it is ready."""
        self.served.started(key, container, self.now)
        self.roster.had.add(key.service)
        backend = self.roster.all.get(key)
        if backend is None or self.ending is not None:
            return []
        backend.started_at = self.now
        if backend.role is not Role.CURRENT and not backend.queue:
            # Its call was cancelled while it started (or, retiring, its calls): not needed.
            self.roster.remove(key)
            return self._stop(key, NOT_NEEDED)
        backend.last_active = self.now
        if greeted:
            backend.advance(Step.STARTED_GREETED)
            note = {"backend": key.service, "sequence": key.seq}
            return [Log("info", "backend_greeted_by_pool", note), *self.send_queue(key, backend)]
        backend.advance(Step.STARTED)
        capabilities: Json = {"roots": {"listChanged": False}}
        for capability in ("sampling", "elicitation"):
            if self.replies.stateless:
                # A 2026-07-28 client says per call what it may be asked (see input_waits).
                capabilities[capability] = {}
            elif capability in self.replies.client_capabilities:
                capabilities[capability] = self.replies.client_capabilities[capability]
        our_id = self.exchanges.own(key, "initialize")
        return self.send(key, handshake_request(our_id, capabilities, self.version), own=True)

    def handshake_done(self, key: BackendKey, message: Json) -> list[Action]:
        """The backend answered its handshake: ready (what waited for it is sent), or, refused,
        removed as a failure."""
        backend = self.roster.all.get(key)
        service = key.service
        if backend is None:
            return []
        if "result" not in message:
            error = message.get("error")
            detail = error.get("message") if isinstance(error, dict) else "no result"
            refused = ContainerStartFailure(
                f"{service} refused the handshake: {detail}", reason=HANDSHAKE_FAILED
            )
            # Removed as well as forgotten: the next call starts a fresh one, and this one
            # would otherwise run beside it until the session ends.
            stop = self._stop(key, refused.reason)
            return [*stop, *self._backend_failed(key, refused)]
        backend.advance(Step.GREETED)
        initialized = notification_bytes("notifications/initialized", None)
        actions = self.send(key, initialized, own=True)
        if key not in self.roster.all:
            return actions  # it was found broken
        return actions + self.send_queue(key, backend)

    def send_queue(self, key: BackendKey, backend: Routed) -> list[Action]:
        """A backend just ready (or measured): the requests that waited for it, in order."""
        actions: list[Action] = []
        for waiting in backend.queue:
            actions += self.send(key, waiting.line)
        backend.queue = []
        return actions

    def send(self, key: BackendKey, data: bytes, *, own: bool = False) -> list[Action]:
        """One line for the backend ``key``, counted until reported written. A message of the
        endpoint's own (``own``) is within the bound on what it leaves unread: past it the
        backend has stopped reading its stdin while asking (pings, roots, refreshes…): it is
        broken, not the orchestrator's memory (one message alone may exceed the bound, as a
        client's may)."""
        backend = self.roster.all.get(key)
        if backend is None:
            return []  # forgotten (broken, stopped): nothing is owed to it any more
        if not own:
            return [backend.send(data, self.now)]
        line = backend.send_own(data, self.now, self.roster.limits.own_backlog_bytes)
        if line is None:
            unread = f"{backend.stdin.own} bytes of the orchestrator's own messages to it unread"
            return self._unresponsive(key, unread)
        return [line]

    # --- stops and failures ---------------------------------------------------------------------

    def _stop(self, key: BackendKey, reason: str, logged: str | None = None) -> list[Action]:
        """Stop a backend the table forgot, logged as failed (``backend_failed``, with
        ``logged`` or ``reason``) unless its work is done (idle, its call ended, refreshed).
        Gracefully (its stdin closed, a moment to exit) unless it no longer reads its stdin or
        has exited: those are removed at once."""
        self.served.ended(key, logged or reason, self.now)
        # Its call's answer is held until its workspace is recorded (see .workspace_answers).
        held = key in self.exchanges.held
        graceful = reason not in (UNRESPONSIVE, EXITED)
        stop = StopBackend(key, reason, graceful=graceful, report_workspace=held)
        if reason in QUIET_STOPS:
            return [stop]
        failed = {"backend": key.service, "reason": logged or reason}
        return [Log("warning", "backend_failed", failed), stop]

    def _unresponsive(self, key: BackendKey, detail: str) -> list[Action]:
        error = ContainerStartFailure(
            f"the {key.service} server stopped reading its input ({detail}); its container "
            "was removed, the next call starts a fresh one",
            reason=UNRESPONSIVE,
        )
        # Stopped first: the driver drops what waits for its stdin before the answers go out.
        stop = self._stop(key, UNRESPONSIVE)
        return [*stop, *self._backend_failed(key, error)]

    def output_ended(self, backend: Routed, error: FabricError) -> list[Action]:
        """A backend's output ended (it exited, or broke the framing): removed at once, logged
        as the failure it is, and what it owed answered with ``error``."""
        stop = self._stop(backend.key, EXITED, logged=error.reason)
        self.roster.forget(backend.key)  # (also while the session ends)
        return [*stop, *self.failed(backend.key, error)]

    def failed(self, key: BackendKey, error: FabricError) -> list[Action]:
        """A backend could not start, or ended: answer what it owed, forget it (the next call
        starts a new one). The session's other backends go on."""
        if self.ending is not None:
            self.roster.forget(key)
            return []  # it owes nothing any more
        return self.replies.with_done(self._backend_failed(key, error))

    def broken(self, key: BackendKey, error: FabricError) -> list[Action]:
        """A backend that answered what cannot be taken: what it owed answered, then stopped."""
        stop = self._stop(key, error.reason)
        return [*self._backend_failed(key, error), *stop]

    def _backend_failed(self, key: BackendKey, error: FabricError) -> list[Action]:
        self.served.ended(key, error.reason, self.now)
        current = self.roster.current.get(key.service)
        if current is not None and current.key == key:
            self.relists.forget(key.service)
        self.roster.forget(key)
        return self.exchanges.owed(key, error)

    # --- lifecycles -----------------------------------------------------------------------------

    def retire(self, backend: Routed, bound: str) -> None:
        """smart_refresh: the service's current backend takes no more calls (see
        :meth:`.Roster.retire`); the lists asked of it are moot."""
        self.roster.retire(backend, bound)
        self.relists.forget(backend.key.service)

    def settle_all(self) -> list[Action]:
        """After every event: a smart_refresh backend past its bounds with no call in flight is
        retired now rather than at the next call, what is done is removed (settle), and one
        due for a memory reading is measured."""
        roster = self.roster
        if not roster.refreshed and len(roster.all) == len(roster.current):
            # Only current backends of services that keep theirs (the common case, asked after
            # every event): nothing to retire, remove or measure.
            return []
        busy = self.exchanges.busy()
        for backend, bound in roster.spent_between_calls(self.now, busy):
            self.retire(backend, bound)
        return self.settle() + self.measure_between_calls()

    def settle(self) -> list[Action]:
        """Stop the backends whose work is done (see :meth:`.Roster.done`)."""
        if self.ending is not None:
            return []
        actions: list[Action] = []
        for key, reason in self.roster.done(self.exchanges.busy()):
            actions += self._stop(key, reason)
        return actions

    def measure_between_calls(self) -> list[Action]:
        """Read the memory of the backends due for it (see :meth:`.Roster.to_measure`)."""
        if self.ending is not None:
            return []
        return self.roster.to_measure(self.exchanges.busy())

    # --- time -----------------------------------------------------------------------------------

    def deadlines(self) -> list[float]:
        """When backends' questions to the client expire, calls stop waiting for a retry, and
        what :meth:`.Roster.deadlines` says."""
        return self.exchanges.deadlines() + self.roster.deadlines(self.exchanges.busy())

    def tick(self) -> list[Action]:
        """What came due of the backends' stdin, their questions to the client and the calls
        waiting for a retry (idle backends: :meth:`stop_idle`, last). Backends whose stdin did
        not move for the stall timeout stopped reading it: replaced at the next call, what
        they owed answered ``container_unresponsive``."""
        actions: list[Action] = []
        timeout = self.roster.limits.stall_timeout
        for key, backend in list(self.roster.all.items()):
            if key in self.roster.all and backend.stdin.stalled(self.now, timeout):
                actions += self._unresponsive(key, f"its input did not move for {timeout:g} s")
        return actions + self._expire_asked() + self._expire_waits()

    def _expire_asked(self) -> list[Action]:
        """Backends' questions the client left unanswered in time: answered to the backend."""
        actions: list[Action] = []
        asked = self.exchanges.asked
        for our_id, question in list(asked.items()):
            # (still asked: a backend found broken meanwhile took its questions along)
            if question.deadline <= self.now and our_id in asked:
                del asked[our_id]
                error = ClientDidNotAnswer(
                    "the client did not answer this request in time", reason=CLIENT_DID_NOT_ANSWER
                )
                reply = error_response(question.backend_id, error)
                actions += self.send(question.key, reply, own=True)
                note = {"requestId": our_id, "reason": "no answer in time"}
                actions.append(ToClient(notification_bytes("notifications/cancelled", note)))
        return actions

    def _expire_waits(self) -> list[Action]:
        """Calls the client did not resume in time: given up. A per-call container goes (it
        served nothing else); another is told its questions go unanswered and the call is
        cancelled, and serves on."""
        actions: list[Action] = []
        for wait in self.exchanges.waits.expired(self.now):
            backend = self.roster.all.get(wait.key)
            if backend is None:
                continue
            note = {"backend": wait.key.service, "sequence": wait.key.seq}
            actions.append(Log("info", "input_wait_expired", note))
            if backend.role is Role.CALL:
                self.roster.remove(wait.key)
                actions += self._stop(wait.key, INPUT_WAIT_EXPIRED)
                continue
            error = ClientDidNotAnswer(
                "the client did not retry its call with the answer in time",
                reason=CLIENT_DID_NOT_ANSWER,
            )
            for backend_id, _asked in wait.asked.values():
                actions += self.send(wait.key, error_response(backend_id, error), own=True)
            cancel = {"requestId": wait.call_id, "reason": "the client did not retry in time"}
            cancelled = notification_bytes("notifications/cancelled", cancel)
            actions += self.send(wait.key, cancelled, own=True)
        return actions

    def stop_idle(self) -> list[Action]:
        """Stop the current backends idle for their service's timeout."""
        actions: list[Action] = []
        for backend in self.roster.idle(self.now, self.exchanges.busy()):
            self.roster.forget(backend.key)
            self.relists.forget(backend.key.service)
            actions += self._stop(backend.key, IDLE)
        return actions

    # --- the session's end ----------------------------------------------------------------------

    def end(self, error: FabricError) -> list[Action]:
        """The session ends: every call in flight is answered ``error``, and the backends hear
        nothing more (a start that completes is not greeted, a call that waited for it is not
        sent: its client was told it failed)."""
        self.ending = error
        for backend in self.roster.all.values():
            backend.queue = []  # (their requests are answered below)
        return self.exchanges.end(error)

    def stop_all(self) -> list[Action]:
        """The client left: every backend is stopped."""
        stops: list[Action] = [
            StopBackend(b.key, SESSION_ENDED, graceful=True) for b in self.roster.all.values()
        ]
        self.roster.all.clear()
        self.roster.current.clear()
        return stops

    # --- model checking -----------------------------------------------------------------------

    def clone(self, replies: Replies, exchanges: Exchanges, relists: Relists) -> BackendTable:
        """An independent copy, with the twin's ledger, requests and refreshes."""
        twin = copy.copy(self)  # (the settings are shared: never changed in place)
        twin.replies, twin.exchanges, twin.relists = replies, exchanges, relists
        twin.roster = self.roster.clone()
        twin.served = self.served.clone()
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return (
            self.roster.fingerprint(),
            None if self.ending is None else self.ending.reason,
        )
