"""The suite lock on one relay session: what the per-service relay checks of its server's
messages when ``orchestrator.lock`` is ``warn`` or ``enforce``. Pure: no I/O.

The relay passes frames through untouched and decodes no list — unless a lock is on. Then every
message of the server whose ``result`` holds tools, prompts or resource templates, whatever its
id or shape, is checked against the lock before it goes on (:func:`.suite_lock.checked_list`:
under ``enforce`` what differs is left out of the list and withheld from calls), each drift is
reported once per session (a :class:`~.events.ToolsChanged`, which the driver logs and audits),
and the server's responses are matched to the client's requests as clients match them (an id in
any spelling a client reads as the same: :meth:`.ledger.Ledger.answering`). A response that
answers no request in flight is dropped: no client may take it for the answer to something it
asked (a ``tools/list`` answer whose check was dodged).

:class:`RelayLock` is one session's; :class:`~.session.SessionMachine` holds one when a lock is
on and asks it :meth:`~RelayLock.withheld_call` of each ``tools/call`` and
:meth:`~RelayLock.server_message` of each server message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from .catalog import Redact
from .events import Action, Log, ToolsChanged
from .fabric_refresh import ToolChanges
from .jsonrpc import RESPONSE, Peek
from .ledger import Ledger
from .suite_lock import Mode, SuiteLock, checked_list, listed_kinds

# A server's id is logged cut to this many characters (a response dropped under a suite lock).
MAX_LOGGED_ID_CHARS = 128

Drift = tuple[str, str, str, tuple[str, ...]]


@dataclass
class Checked:
    """A server message that may go on: as the books take it (its id the one of the request
    it answers), the line to relay (a list as the lock lets it through), and the drift to
    report."""

    message: Peek
    line: bytes
    drift: list[Action]


@dataclass
class RelayLock:
    """The suite lock's checks on one relay session (see the module's docs)."""

    service: str
    lock: SuiteLock
    mode: Mode
    # The suite's secret values out of what is compared with the lock, which hashes the tools
    # as /mcp serves them (see .catalog: Redact); the answer itself passes as it is.
    redact: Redact
    # The tools it withholds under enforce (name → why; see suite_lock.py), and the drift
    # reported in this session already.
    withheld: dict[str, dict[str, Any]] = field(default_factory=dict)
    drift_seen: set[Drift] = field(default_factory=set)

    def withheld_call(self, message: Peek) -> dict[str, Any] | None:
        """Why the lock withholds the tool this tools/call names (None: it does not)."""
        if not self.withheld or message.params is None:
            return None
        try:
            params = msgspec.json.decode(message.params)
        except (msgspec.DecodeError, RecursionError):
            return None
        name = params.get("name") if isinstance(params, dict) else None
        return self.withheld.get(self.redact(name)) if isinstance(name, str) else None

    def server_message(self, message: Peek, line: bytes, ledger: Ledger) -> Checked | Log:
        """A server message checked: what goes on, or the log of a response dropped because it
        answers no request in flight."""
        if message.kind == RESPONSE:
            answered = ledger.answering(message.id)
            if answered is None:
                return _unanswerable(message)
            if answered != message.id:
                # Its id spells a request's in flight otherwise ("41" for 41), and clients take
                # it for that request's answer: so is it taken here (the books, the route of an
                # HTTP answer), and it goes on as the server wrote it.
                message = Peek(
                    RESPONSE, answered, None, None, failed=message.failed, result=message.result
                )
        drift: list[Action] = []
        for kind in listed_kinds(message.result):
            # Checked whatever it answers, or whether it is an answer at all: what a client
            # takes for a list answer is its to decide, not the ledger's.
            line, found = self._checked_list(line, kind)
            drift += found
        return Checked(message, line, drift)

    def _checked_list(self, line: bytes, kind: str) -> tuple[bytes, list[Action]]:
        """The server's list of ``kind`` (tools, prompts, resource templates) against the
        lock: what to pass on, and the drift not reported yet in this session."""
        line, drifts = checked_list(
            self.service,
            self.lock,
            self.mode,
            line,
            kind=kind,
            withheld=self.withheld,
            redact=self.redact,
        )
        fresh = []
        for drift in drifts:
            seen = (drift.kind, drift.name, drift.change, drift.parts)
            if seen not in self.drift_seen:
                self.drift_seen.add(seen)
                fresh.append({**drift.record(), "mode": self.mode})
        if not fresh:
            return line, []
        return line, [ToolsChanged(ToolChanges(self.service, drift=tuple(fresh)))]

    def clone(self) -> RelayLock:
        return RelayLock(
            self.service,
            self.lock,
            self.mode,
            self.redact,
            dict(self.withheld),
            set(self.drift_seen),
        )

    def fingerprint(self) -> tuple[object, ...]:
        return (tuple(sorted(self.withheld)), tuple(sorted(self.drift_seen)))


def _unanswerable(message: Peek) -> Log:
    """A server's response that answers no request in flight, by its id in any spelling: the
    log of its drop."""
    said = message.id
    if isinstance(said, str) and len(said) > MAX_LOGGED_ID_CHARS:
        said = said[:MAX_LOGGED_ID_CHARS] + "…"  # (the server chose it: as long as it liked)
    fields = {"id": said, "error": message.failed, "lists": listed_kinds(message.result)}
    return Log("warning", "server_response_unmatched", fields)
