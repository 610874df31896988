"""One backend of a session — a container of one service serving it — as both endpoints'
machines model it. Pure: no I/O, no clock (times are passed in).

The relay's machine (:mod:`.session`: one service, frames passed through untouched) and the
fabric endpoint's backend table (:mod:`.fabric_roster` under :mod:`.fabric_backends`: many
services, decoded and routed) keep their backends as :class:`Backend` records and decide about
them with this module's rules, so that a lifecycle, a bound or a deadline means the same on
both endpoints.

The state table
---------------

A backend's :class:`BackendState` moves only along :data:`TRANSITIONS` (in the style of h11's
state machine: a move not in the table is a bug of the machine, :class:`BackendStateError`)::

    STARTING ──STARTED──► HANDSHAKING ──GREETED──► READY
        │                      │                     │
        ├──STARTED_GREETED─────┼────────────────────►│  (the pool greeted it, or the relay
        │                      │                     │   has no handshake to replay)
        └──────────STOPPED─────┴──────STOPPED────────┴──► STOPPED

``HANDSHAKING`` is the fabric endpoint greeting a fresh container as a client would, or the
relay replaying its client's ``initialize`` to one. A backend's :class:`Role` says what it is
for: the service's ``CURRENT`` one (the calls go to it), a ``CALL`` one (``fresh_per_call`` on
the fabric endpoint: bound to its one call), or ``RETIRING`` (it takes no more calls and goes
once those it has end: smart_refresh's bounds, ``fresh_per_call`` after its call on the relay).

Lifecycle rules
---------------

:func:`spent` says why a backend takes no more calls (``call_done``, ``refresh_calls``,
``refresh_age``, ``refresh_memory``); :func:`measure_due` when a smart_refresh backend's memory
is to be read (between calls, once after each call that could have grown it);
:func:`age_deadline` when a backend between calls reaches its age.

A backend that stopped reading
------------------------------

Every line sent to a backend is counted in its :class:`StdinBook` until the driver reports it
written. One rule, :meth:`StdinBook.stalled`, says when a backend has stopped reading its
stdin, on both endpoints (the stricter of the rules the two machines had, both kept): what was
sent to it did not move for ``stall_timeout`` seconds (the relay's rule), or a message of the
machine's own (handshake, answers to its requests, refusals, refreshes) would leave more than
``own_bound`` bytes of them unread (the fabric endpoint's rule: a backend that asks and asks
without reading the answers must not grow the orchestrator's memory until the timeout).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Self

from .._reasons import CALL_DONE, REFRESH_MEMORY
from .events import BackendKey, ToBackend
from .lifecycle import Lifecycle

# The requests a backend counts as calls (smart_refresh's max_calls_per_container; an agent's
# slots; what /api/sessions names by tool, prompt or URI).
CALL_METHODS = frozenset({"tools/call", "resources/read", "prompts/get"})
# Requests that leave a backend as fresh as one just greeted: fresh_per_call keeps it after
# them (the relay's handshake container serves the first call, instead of a second start).
FRESH_AFTER = frozenset({"initialize", "ping"})


class BackendState(enum.Enum):
    STARTING = "starting"
    HANDSHAKING = "handshaking"
    READY = "ready"
    STOPPED = "stopped"


class Step(enum.Enum):
    """What happens to a backend that moves it in the state table."""

    STARTED = "started"  # its container runs; a handshake is to be made
    STARTED_GREETED = "started_greeted"  # its container runs, with nothing to greet
    GREETED = "greeted"  # it answered the handshake
    STOPPED = "stopped"  # the machine let it go (failed, exited, idle, refreshed, not needed)


TRANSITIONS: dict[tuple[BackendState, Step], BackendState] = {
    (BackendState.STARTING, Step.STARTED): BackendState.HANDSHAKING,
    (BackendState.STARTING, Step.STARTED_GREETED): BackendState.READY,
    (BackendState.HANDSHAKING, Step.GREETED): BackendState.READY,
    (BackendState.STARTING, Step.STOPPED): BackendState.STOPPED,
    (BackendState.HANDSHAKING, Step.STOPPED): BackendState.STOPPED,
    (BackendState.READY, Step.STOPPED): BackendState.STOPPED,
}


class BackendStateError(RuntimeError):
    """A machine moved a backend along a step the state table does not have (its bug)."""


class Role(enum.Enum):
    CURRENT = "current"
    CALL = "call"
    RETIRING = "retiring"


@dataclass
class StdinBook:
    """The bytes sent to one backend's stdin and not yet reported written (see the module's
    docs: a backend that stopped reading). Bytes are reported written in the order they were
    sent: the driver writes several lines at once, or a line in parts."""

    # Each line sent and not yet written: its size and whether it is the machine's own.
    lines: collections.deque[tuple[int, bool]] = field(default_factory=collections.deque)
    pending: int = 0  # their bytes
    own: int = 0  # the bytes of the machine's own among them
    progress: float = 0.0  # when the bytes pending last moved (or went from none to some)

    def sent(self, size: int, now: float, *, own: bool = False) -> None:
        if not self.pending:
            self.progress = now
        self.lines.append((size, own))
        self.pending += size
        if own:
            self.own += size

    def written(self, nbytes: int, now: float) -> None:
        """``nbytes`` more of what was sent were written, in order (a line may be reported in
        parts: the driver writes part of one at once and leaves the rest to its writer)."""
        self.progress = now
        lines = self.lines
        while nbytes > 0 and lines:
            size, own = lines[0]
            taken = size if size <= nbytes else nbytes
            nbytes -= taken
            self.pending -= taken
            if own:
                self.own -= taken
            if taken == size:
                lines.popleft()
            else:
                lines[0] = (size - taken, own)

    def overflows_own(self, size: int, own_bound: int) -> bool:
        """Whether one more own message of ``size`` bytes would leave more than ``own_bound``
        of them unread (one message alone may exceed the bound, as a client's may)."""
        return self.own > 0 and self.own + size > own_bound

    def stall_deadline(self, stall_timeout: float) -> float | None:
        """When what is pending counts as stalled if it does not move (None: nothing pending)."""
        return self.progress + stall_timeout if self.pending else None

    def stalled(self, now: float, stall_timeout: float) -> bool:
        deadline = self.stall_deadline(stall_timeout)
        return deadline is not None and now >= deadline

    def state(self) -> tuple[object, ...]:
        # (with nothing pending, when it last moved makes no difference: see sent)
        return (tuple(self.lines), self.progress if self.pending else None)

    def clone(self) -> StdinBook:
        return StdinBook(collections.deque(self.lines), self.pending, self.own, self.progress)


@dataclass
class Backend:
    """What a machine knows about one of its backends."""

    key: BackendKey
    role: Role = Role.CURRENT
    state: BackendState = BackendState.STARTING
    stdin: StdinBook = field(default_factory=StdinBook)
    started_at: float | None = None  # when its container started (its age; None: not yet)
    last_active: float = 0.0  # when it last sent or was sent something (its idle deadline)
    calls: int = 0  # the calls (tools/call, resources/read, prompts/get) sent or queued to it
    used: bool = False  # it was sent a request other than the handshake and ping
    measuring: bool = False  # its memory was asked for and not reported yet
    measured_calls: int = 0  # its calls when its memory was last asked for
    over_memory: bool = False  # it was measured over its memory threshold
    retired: str = ""  # RETIRING: the bound it reached (its stop reason)
    handshake_id: object = None  # the id of the handshake sent to it (HANDSHAKING)
    handshake_deadline: float = math.inf  # when an unanswered handshake fails it
    # The notification that completes the handshake once it is answered (the relay's client's
    # ``initialized`` replayed), if any.
    after_handshake: bytes | None = None
    # It answered a call input_required (a 2026-07-28 server asking the client): the client's
    # retry is for this backend, which is kept for it until then (see .input_waits).
    retry_until: float | None = None
    # Its container works on a copy of the client's project (a per-call one of a service with
    # ``workspace: isolated``): its call's answer waits for the copy to be recorded.
    workspace: bool = False

    def advance(self, step: Step) -> BackendState:
        """Move along the state table (:class:`BackendStateError` for a move it lacks)."""
        after = TRANSITIONS.get((self.state, step))
        if after is None:
            raise BackendStateError(f"{self.key}: no step {step.value} from {self.state.value}")
        self.state = after
        return after

    @property
    def ready(self) -> bool:
        return self.state is BackendState.READY

    def retire(self, reason: str) -> None:
        """It takes no more calls; it goes, for ``reason``, once those it has end."""
        self.role = Role.RETIRING
        self.retired = reason

    def sent_request(self, method: str | None) -> None:
        """A request was sent to it: a call is counted, and any request but the handshake and
        ping uses it up for fresh_per_call; it is no longer kept for a retry."""
        self.retry_until = None  # (the retry it was kept for, or a call beside it)
        if method in CALL_METHODS:
            self.calls += 1
        if method not in FRESH_AFTER:
            self.used = True

    def send(self, data: bytes, now: float) -> ToBackend:
        """``data`` as a line for its stdin, counted until the driver reports it written."""
        line = data + b"\n"
        self.stdin.sent(len(line), now)
        return ToBackend(self.key, line)

    def send_own(self, data: bytes, now: float, own_bound: int) -> ToBackend | None:
        """A message of the machine's own as a line for its stdin, counted apart — or None
        when it would leave more than ``own_bound`` bytes of them unread: the backend stopped
        reading while asking, and is to be replaced (the caller's part), rather than grow the
        orchestrator's memory (one message alone may exceed the bound, as a client's may)."""
        line = data + b"\n"
        if self.stdin.overflows_own(len(line), own_bound):
            return None
        self.stdin.sent(len(line), now, own=True)
        return ToBackend(self.key, line)

    def awaits_retry(self, now: float) -> bool:
        return self.retry_until is not None and now < self.retry_until

    def clone(self) -> Self:
        """An independent copy (for model checking; a subclass copies what it adds)."""
        return dataclasses.replace(self, stdin=self.stdin.clone())

    def fingerprint(self) -> tuple[object, ...]:
        """Its whole state as this module models it, hashable (model checking explores each
        reachable state once)."""
        return tuple(
            self.stdin.state() if name == "stdin" else getattr(self, name) for name in _FIELDS
        )


_FIELDS = tuple(Backend.__dataclass_fields__)


# --- the lifecycle rules ---------------------------------------------------------------------


def spent(backend: Backend, lifecycle: Lifecycle, now: float) -> str | None:
    """Why ``backend`` may take no more calls under ``lifecycle``, as its stop reason (None
    while it may): ``fresh_per_call`` once it served a request other than the handshake;
    smart_refresh at its call or age bound, or measured over its memory threshold."""
    if lifecycle.strategy == "fresh_per_call":
        return CALL_DONE if backend.used else None
    bound = lifecycle.bound_reached(backend.calls, backend.started_at, now)
    if bound is not None:
        return bound
    if backend.over_memory and lifecycle.strategy == "smart_refresh":
        return REFRESH_MEMORY
    return None


def measure_due(backend: Backend, lifecycle: Lifecycle) -> bool:
    """Whether a ready backend between calls is to have its memory read now: smart_refresh
    with a ``memory_threshold``, once after each call that could have grown it (the calls for
    it meanwhile wait for the figure, so that a backend over the threshold serves none)."""
    return (
        lifecycle.strategy == "smart_refresh"
        and lifecycle.memory_threshold is not None
        and backend.ready
        and not backend.measuring
        and backend.calls > backend.measured_calls
    )


def start_measuring(backend: Backend) -> None:
    backend.measuring = True
    backend.measured_calls = backend.calls


def measured(backend: Backend, lifecycle: Lifecycle, memory_bytes: int | None) -> bool:
    """A backend's memory figure (None: it could not be read — nothing is decided on it):
    whether it is over its threshold (it is then so for good)."""
    backend.measuring = False
    threshold = lifecycle.memory_threshold
    if memory_bytes is not None and threshold is not None and memory_bytes > threshold:
        backend.over_memory = True
    return backend.over_memory


def age_deadline(backend: Backend, lifecycle: Lifecycle) -> float | None:
    """When a backend between calls reaches smart_refresh's ``max_age`` (it is retired then,
    not at the next call: a deadline)."""
    max_age, started_at = lifecycle.max_age, backend.started_at
    if lifecycle.strategy != "smart_refresh" or max_age is None or started_at is None:
        return None
    return started_at + max_age
