"""Which container served which call: a session's containers, the ones it has and the ones it
recently had, with the calls each served. Pure bookkeeping, no I/O.

Both machines keep one: the relay's (:class:`~.session.SessionMachine`, every client request
but the handshake and ping, read off its decisions) and the fabric endpoint's (kept with its
backends, :class:`~.fabric_backends.BackendTable`), told of each backend asked for
(its key, its lifecycle), its start (the container's name), each call sent to it (the client's
id, the method, the tool, prompt or URI: a :class:`~.events.CallRef`; the relay's as it was
sent, named only when shown) and its end (the stop
reason: ``call_done``, ``refresh_calls``, ``idle``, a failure's reason…). ``get_status`` and
the operators' ``/api/sessions`` (and the status page) show them, so that a ``fresh_per_call``
service's five calls show five containers, and a ``smart_refresh`` service's replacements show
which calls each container took.

Bounded: the containers that ended are kept up to :data:`MAX_ENDED` (the newest), each with its
newest :data:`MAX_CALLS_EACH` calls (``calls`` counts them all); a call's id is cut to
:data:`MAX_ID_CHARS` characters, its name is already bounded by the router. Live containers are
bounded by the router's own bounds (one per service, and at most
``MAX_PER_CALL_CONTAINERS`` per-call ones per service, plus retiring ones).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .backend import CALL_METHODS
from .events import BackendKey, CallRef
from .jsonrpc import Peek

# Containers that ended, kept per session (the newest), and calls kept per container.
MAX_ENDED = 16
MAX_CALLS_EACH = 8
# A client's request id may be any string: what is shown of one.
MAX_ID_CHARS = 64
# Characters of a task's branch it keeps (ours: reactor-fabric/<service>/<time>-<id>).
MAX_BRANCH_CHARS = 300
# Params of a relayed call up to this size are read for the tool, prompt or URI it names (what
# /api/sessions shows of the call); a larger one is shown by its method only, so that a call's
# path never decodes much more than the relay must.
NAMED_PARAMS_BYTES = 4096


class _Named(msgspec.Struct):
    name: str | None = None
    uri: str | None = None


_named_decoder = msgspec.json.Decoder(_Named)


def _named(request_id: object, method: str, params: msgspec.Raw | bytes | None) -> CallRef:
    """A relayed client request as /api/sessions names it: its id, method, and for a call
    (small params) its tool, prompt or URI."""
    name: str | None = None
    if params is not None:
        try:
            named = _named_decoder.decode(params)
        except msgspec.DecodeError:
            named = _Named()
        name = named.uri if method == "resources/read" else named.name
    return CallRef.of(request_id, method, name)


class _Unnamed:
    """A relayed call as it was sent, named only when shown (most never are: no decode on a
    call's path for a page nobody reads). Keeps a copy of its params only when they are small
    enough to be read for the name, never a view of the frame (which may be large)."""

    __slots__ = ("id", "method", "params")

    def __init__(self, message: Peek) -> None:
        self.id = message.id
        self.method = method = message.method or ""
        # The params a call is named from (none for other requests, or past the size read).
        params = message.params
        small = method in CALL_METHODS and params is not None and len(params) <= NAMED_PARAMS_BYTES
        self.params = bytes(params) if small and params is not None else None

    def record(self) -> dict[str, object]:
        return _bounded(_named(self.id, self.method, self.params)).record()


@dataclass
class _Record:
    key: BackendKey
    lifecycle: str  # the service's container_strategy
    asked_at: float
    container: str = ""  # its name, once started
    started_at: float | None = None
    ended_at: float | None = None
    stop_reason: str | None = None
    calls: int = 0
    recent: collections.deque[CallRef | _Unnamed] = field(
        default_factory=lambda: collections.deque(maxlen=MAX_CALLS_EACH)
    )
    # Its task's branch (a container working on a copy, once recorded; None: none, or nothing
    # changed).
    branch: str | None = None

    @property
    def state(self) -> str:
        if self.ended_at is not None:
            return "ended"
        return "starting" if self.started_at is None else "running"

    def json(self, since: float) -> dict[str, Any]:
        """As get_status shows it: times in seconds since ``since`` (the session's start)."""

        def offset(at: float | None) -> float | None:
            return None if at is None else round(at - since, 3)

        return {
            "server": self.key.service,
            "sequence": self.key.seq,
            "container": self.container or None,
            "lifecycle": self.lifecycle,
            "state": self.state,
            "started": offset(self.started_at),
            "ended": offset(self.ended_at),
            "stop_reason": self.stop_reason,
            "calls": self.calls,
            "recent_calls": [ref.record() for ref in self.recent],
            "workspace_branch": self.branch,
        }


def _bounded(ref: CallRef) -> CallRef:
    if isinstance(ref.id, str) and len(ref.id) > MAX_ID_CHARS:
        return CallRef(ref.id[:MAX_ID_CHARS], ref.method, ref.name)
    return ref


class Served:
    """A session's containers and the calls each served (see the module docstring)."""

    __slots__ = ("_ended", "_live")

    def __init__(self) -> None:
        self._live: dict[BackendKey, _Record] = {}
        self._ended: collections.deque[_Record] = collections.deque(maxlen=MAX_ENDED)

    def asked(self, key: BackendKey, lifecycle: str, now: float) -> None:
        """The router asked for a container (its start is under way)."""
        self._live[key] = _Record(key, lifecycle, now)

    def started(self, key: BackendKey, container: str, now: float) -> None:
        record = self._live.get(key)
        if record is not None:
            record.container, record.started_at = container, now

    def call(self, key: BackendKey, ref: CallRef) -> None:
        """A call of the client's was sent (or queued) to ``key``'s container."""
        self._noted(key, _bounded(ref))

    def relayed(self, key: BackendKey, message: Peek) -> None:
        """A client's request relayed as it came to ``key``'s container (named when shown)."""
        self._noted(key, _Unnamed(message))

    def _noted(self, key: BackendKey, call: CallRef | _Unnamed) -> None:
        record = self._live.get(key)
        if record is not None:
            record.calls += 1
            record.recent.append(call)

    def ended(self, key: BackendKey, reason: str, now: float) -> None:
        """``key``'s container is stopped (or failed); the first reason given is its."""
        record = self._live.pop(key, None)
        if record is not None:
            record.ended_at, record.stop_reason = now, reason
            self._ended.append(record)

    def recorded(self, key: BackendKey, branch: str | None) -> None:
        """``key``'s container (ended) worked on a copy, recorded as ``branch``."""
        for record in (*self._ended, *self._live.values()):
            if record.key == key:
                record.branch = branch[:MAX_BRANCH_CHARS] if branch is not None else None

    def records(self, since: float) -> list[dict[str, Any]]:
        """Every container known, in the order they were asked for (see :meth:`_Record.json`)."""
        known = sorted([*self._ended, *self._live.values()], key=lambda r: r.key.seq)
        return [record.json(since) for record in known]

    def wall_records(self, since: float, wall_since: float) -> list[dict[str, Any]]:
        """As :meth:`records`, and ``started_at``/``ended_at`` as wall-clock times (seconds),
        ``wall_since`` being the wall clock at ``since``."""
        shown = self.records(since)
        for entry in shown:
            for name in ("started", "ended"):
                offset = entry[name]
                entry[f"{name}_at"] = None if offset is None else wall_since + offset
        return shown

    def clone(self) -> Served:
        twin = Served()
        for key, record in self._live.items():
            twin._live[key] = _copy(record)
        twin._ended.extend(_copy(record) for record in self._ended)
        return twin


def _copy(record: _Record) -> _Record:
    twin = _Record(
        record.key,
        record.lifecycle,
        record.asked_at,
        record.container,
        record.started_at,
        record.ended_at,
        record.stop_reason,
        record.calls,
    )
    twin.recent.extend(record.recent)
    twin.branch = record.branch
    return twin
