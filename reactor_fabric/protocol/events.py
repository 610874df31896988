"""The one vocabulary of a client session: the events a session machine is fed and the actions
it returns, for the per-service relay and the fabric endpoint alike.

A session machine (:class:`SessionMachineContract`) makes every decision of one client session;
the one trio driver (:mod:`reactor_fabric.trio.driver`) feeds it events and carries out its
actions, in order. A session has *backends* — containers of the suite's services — each named
by a :class:`BackendKey` the machine chooses when it asks for it. The relay is the case of one
service with at most one current backend; the fabric endpoint has one per service (and, with a
fresh container per call, one per call). Events about a backend the machine no longer counts on
(one it stopped) are ignored by the machine, so the driver never has to know which is current.

Time is given with every event (``now``, any monotonic clock); :attr:`deadline` says when the
machine next needs a :class:`Tick`; :attr:`accepting` says whether the driver may read the
client's next message (bytes waiting for backends are under the session's bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .._errors import FabricError
from .fabric_refresh import ToolChanges
from .jsonrpc import Peek
from .tool_calls import ToolCallDone

__all__ = [
    "Action",
    "BackendBroken",
    "BackendExited",
    "BackendKey",
    "BackendLine",
    "BackendMeasured",
    "BackendStartFailed",
    "BackendStarted",
    "CallRef",
    "ClientActivity",
    "ClientFrame",
    "ClientGone",
    "ClientRegistered",
    "CloseClient",
    "Compute",
    "Computed",
    "EndSession",
    "Event",
    "Job",
    "Log",
    "MeasureBackend",
    "SessionMachineContract",
    "Shutdown",
    "StartBackend",
    "StdinWritten",
    "StopBackend",
    "Tick",
    "ToBackend",
    "ToClient",
    "ToolCallDone",
    "ToolsChanged",
    "WorkspaceRecorded",
]


@dataclass(frozen=True, slots=True, order=True)
class BackendKey:
    """One backend of a session: a container of ``service``, the session's ``seq``-th start
    (its sequence in the container's name; a later one of the same service is a respawn)."""

    service: str
    seq: int


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientFrame:
    """One message from the client (size already checked by the transport); ``message``: its
    envelope, when the transport peeked at it already (Streamable HTTP routes each POST by
    it), so that the machine does not decode it again."""

    frame: bytes
    message: Peek | None = None


@dataclass(frozen=True, slots=True)
class ClientRegistered:
    """The client registered with ``registerClient`` (the stdio bridge) and was answered: a
    machine may start its backend before the first message needs it."""


@dataclass(frozen=True, slots=True)
class ClientActivity:
    """A client that may leave without saying so (Streamable HTTP) did something the machine
    does not see, now: a stream opened or closed, or a request or stream of its is still open
    when its lease comes due."""


@dataclass(frozen=True, slots=True)
class ClientGone:
    """The client left (connection closed, session deleted or expired)."""


@dataclass(frozen=True, slots=True)
class BackendStarted:
    """A backend's container runs. ``greeting``: it came from the warm pool already greeted
    (asked for with :attr:`StartBackend.greeted`): its InitializeResult, the MCP handshake done
    and its output of it consumed; None: no handshake was done with it. ``container``: its name
    (what get_status and /api/sessions show). ``workspace``: it works on a copy of the
    client's project of its own (``workspace: isolated``): its answer waits for what it changed
    to be recorded (:class:`StopBackend`'s ``report_workspace``)."""

    key: BackendKey
    greeting: bytes | None = None
    container: str = ""
    workspace: bool = False


@dataclass(frozen=True, slots=True)
class BackendStartFailed:
    key: BackendKey
    error: FabricError


@dataclass(frozen=True, slots=True)
class BackendLine:
    """One line of a backend's stdout (at most the message size limit)."""

    key: BackendKey
    line: bytes


@dataclass(frozen=True, slots=True)
class BackendBroken:
    """A backend cannot be relayed to any more: its output broke the framing (a message over
    the size limit: ``container_output_invalid``)."""

    key: BackendKey
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class BackendExited:
    """A backend's output ended on its own; how it exited, when the runtime could tell."""

    key: BackendKey
    exit_code: int | None = None
    oom_killed: bool = False
    stderr: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BackendMeasured:
    """What a :class:`MeasureBackend` found: the backend's memory in use, in bytes (the
    engine's figure, page cache left out where it is given), or None when it could not be read
    in time (no decision is made on it then)."""

    key: BackendKey
    memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class StdinWritten:
    """The driver wrote ``nbytes`` of what the machine asked (whole :class:`ToBackend` lines,
    oldest first) to the backend's stdin."""

    key: BackendKey
    nbytes: int


@dataclass(frozen=True, slots=True)
class WorkspaceRecorded:
    """A backend stopped with ``report_workspace`` is removed and what its task changed in
    its copy is recorded: ``workspace`` is the answer's ``structuredContent.workspace``
    (``{mode, branch, base, commit, files_changed, insertions, deletions}``), or None with
    ``failure`` saying why nothing could be recorded."""

    key: BackendKey
    workspace: dict[str, Any] | None
    failure: str | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (a deadline the machine announced is due)."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The session must end now — the orchestrator is stopping (``orchestrator_stopping``), or
    an operator ended it (``session_ended_by_operator``)."""

    reason: str


class Job(Protocol):
    """Pure computation a machine hands out to be run off the event loop (it shares nothing
    with the machine while it runs, and has nothing to undo if abandoned)."""

    def run(self) -> object: ...


@dataclass(frozen=True, slots=True, eq=False)
class Computed:
    """A :class:`Compute`'s job finished: its result, or None when it failed or took too long."""

    job: Job
    result: object


Event = (
    ClientFrame
    | ClientRegistered
    | ClientActivity
    | ClientGone
    | BackendStarted
    | BackendStartFailed
    | BackendLine
    | BackendBroken
    | BackendExited
    | BackendMeasured
    | StdinWritten
    | Tick
    | Shutdown
    | Computed
    | WorkspaceRecorded
)


# --- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToClient:
    """Send ``frame`` to the client. ``message``: the frame decoded as far as the machine did
    (a transport may use it to route the frame); ``error``: the code and reason of an error the
    orchestrator answers with itself (for the metrics)."""

    frame: bytes
    message: Peek | None = None
    error: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class ToBackend:
    """Write ``data`` (whole lines, each ending in a newline) to the backend's stdin, in order,
    and report :class:`StdinWritten`. Dropped when the backend is going away."""

    key: BackendKey
    data: bytes


@dataclass(frozen=True, slots=True)
class StartBackend:
    """Start a container of ``key.service`` (create, attach, start) and report
    :class:`BackendStarted` or :class:`BackendStartFailed`. ``respawn``: the session had a
    container of this service before (logged and audited as such). ``greeted``: a pooled
    container the pool greeted may be handed out (the fabric endpoint's per-call backends: the
    machine then does no handshake). ``call``: the one call it is started for (fresh_per_call),
    named in the audit's ``container_start``."""

    key: BackendKey
    respawn: bool = False
    greeted: bool = False
    call: CallRef | None = None


# Characters of a call's tool, prompt or URI a CallRef keeps (audit records, /api/sessions).
MAX_CALL_NAME = 256
# Characters of a task's text (its commit message) and base (a ref name) a CallRef keeps; a
# longer base is refused as no ref's name when the workspace is made.
MAX_TASK_CHARS = 4000
MAX_BASE_CHARS = 256


@dataclass(frozen=True, slots=True)
class CallRef:
    """The call a per-call container serves: the client's request id, its method, and the
    tool or prompt it names (a resource's URI for resources/read)."""

    id: str | int | None
    method: str
    name: str | None = None
    # A task's arguments an isolated workspace needs (an agent's ``run_task``): its text (the
    # commit's message) and the ``base`` it starts from (None: the client's working tree; a
    # value that is not a string is kept as its repr, which no ref name matches: refused).
    task: str | None = None
    base: str | None = None

    def record(self) -> dict[str, object]:
        return {"id": self.id, "method": self.method, "name": self.name}

    @classmethod
    def of(
        cls, request_id: object, method: str, named: object, arguments: object = None
    ) -> CallRef:
        """The reference both endpoints keep: the id if it is one, the name cut to
        :data:`MAX_CALL_NAME` characters if it is a string; a call's ``task`` and ``base``
        arguments, bounded."""
        task = base = None
        if isinstance(arguments, dict):
            text, given = arguments.get("task"), arguments.get("base")
            task = text[:MAX_TASK_CHARS] if isinstance(text, str) else None
            if given is not None:
                base = given[:MAX_BASE_CHARS] if isinstance(given, str) else repr(given)[:40]
        return cls(
            request_id if isinstance(request_id, str | int) else None,
            method,
            named[:MAX_CALL_NAME] if isinstance(named, str) else None,
            task,
            base,
        )


@dataclass(frozen=True, slots=True)
class StopBackend:
    """Stop and remove the backend: with ``graceful``, close its stdin and give it a moment to
    exit first. What still waits for its stdin is dropped. A backend with a workspace has what
    its task changed recorded once it is removed (always); ``report_workspace``: the machine
    holds the call's answer until :class:`WorkspaceRecorded` says what was recorded."""

    key: BackendKey
    reason: str
    graceful: bool
    report_workspace: bool = False


@dataclass(frozen=True, slots=True)
class MeasureBackend:
    """Read the backend's memory in use from the engine (off the event loop, bounded in time)
    and report :class:`BackendMeasured` — always, with None when it cannot be read."""

    key: BackendKey


@dataclass(frozen=True, slots=True)
class CloseClient:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class EndSession:
    """Nothing is left to do: the driver ends the session (removing what is still running)."""


@dataclass(frozen=True, slots=True)
class Log:
    level: str  # "debug", "info", "warning" or "error"
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, eq=False)
class Compute:
    """Run ``job`` off the event loop (bounded in time) and report :class:`Computed`;
    ``failure_event`` is the log line when it fails or takes too long."""

    job: Job
    failure_event: str = "compute_failed"


@dataclass(frozen=True, slots=True)
class ToolsChanged:
    """A service's tools changed on a refresh: logged and audited (what changed: names and
    hashes, never the text)."""

    changes: ToolChanges


Action = (
    ToClient
    | ToBackend
    | StartBackend
    | StopBackend
    | MeasureBackend
    | CloseClient
    | EndSession
    | Log
    | Compute
    | ToolsChanged
    | ToolCallDone
)


class SessionMachineContract(Protocol):
    """What the driver asks of a session machine."""

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event; the actions to carry out, in order."""

    @property
    def deadline(self) -> float | None:
        """When the machine next needs a :class:`Tick` (None: not before another event)."""

    @property
    def accepting(self) -> bool:
        """Whether the driver may read the client's next message."""

    def answer_all(self, error: FabricError) -> list[Action]:
        """Answer everything the client is owed with ``error`` (the session cannot go on)."""

    def abandon(self, now: float) -> list[Action]:
        """The session is over without the machine ending it (cancelled): the audit records
        of the calls that will never be answered."""
