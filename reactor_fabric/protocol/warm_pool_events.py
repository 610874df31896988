"""The warm pool machine's vocabulary: the events it is fed and the actions it answers with.

The machine is :class:`reactor_fabric.protocol.warm_pool.WarmPoolMachine` (its module docstring
says what each decision is); the trio layer (:mod:`reactor_fabric.trio.warm_pool`) feeds these
events and carries out these actions. Pure: no trio, no engine.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

# Why a session did not get a pooled container (metrics and logs; "hit" when it did).
# ("greeted": only greeted ones were ready, and the session replays its client's initialize.)
TakeOutcome = Literal["hit", "empty", "shape", "mounts", "stopping", "not_pooled", "greeted"]
# How a pooled container's output ended while it waited (the driver reads it).
OutputEnd = Literal["exited", "output_invalid"]
# Why a pooled container ended on its own while it waited: its output ended, was not JSON-RPC
# lines, or was more than a server writes before anyone spoke to it.
EndedReason = Literal["exited", "output_invalid", "output_before_input"]
# Why a pooled container is removed without serving anyone.
RetireReason = Literal[
    "shape_changed",
    "image_changed",
    "stopping",
    "start_failed",
    "not_handed_out",
    "exited",
    "output_invalid",
    "output_before_input",
    "greeting_failed",
    "surplus",
]
ENDED_REASONS: frozenset[RetireReason] = frozenset(
    ("exited", "output_invalid", "output_before_input", "greeting_failed")
)


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passed (the driver feeds one at :attr:`WarmPoolMachine.deadline`)."""


@dataclass(frozen=True)
class StartSucceeded:
    """Pooled container ``token`` started (its server waits on stdin)."""

    token: int


@dataclass(frozen=True)
class StartFailed:
    """The start of ``token`` failed; ``created``: a container exists and must be removed."""

    token: int
    created: bool = False


@dataclass(frozen=True)
class PooledGreeted:
    """Pooled container ``token`` answered its greeting (see :mod:`.pool_greeting`)."""

    token: int


@dataclass(frozen=True)
class PooledGreetingFailed:
    """Pooled container ``token`` failed its greeting (``reason``: a
    :data:`~.pool_greeting.GreetingFailure`)."""

    token: int
    reason: str


@dataclass(frozen=True)
class EarlyOutput:
    """Pooled container ``token`` wrote ``nbytes`` to stdout while it waited (kept)."""

    token: int
    nbytes: int


@dataclass(frozen=True)
class OutputEnded:
    """Pooled container ``token``'s stdout ended (``exited``) or is not JSON-RPC lines."""

    token: int
    why: OutputEnd


@dataclass(frozen=True)
class Take:
    """A session wants a container of ``service`` for ``account``; ``mounts``: it has some,
    ``placeable``: the staging area can place them; ``greeted``: it may take a container the
    pool greeted (the fabric endpoint's per-call backends; a relay session replays its client's
    own initialize, so never)."""

    service: str
    account: Hashable
    mounts: bool = False
    placeable: bool = False
    greeted: bool = False


@dataclass(frozen=True)
class Watched:
    """Nobody watches claimed container ``token`` any more: its output is all reported."""

    token: int


@dataclass(frozen=True)
class ImagesChecked:
    """The answer to :class:`CheckImages`: each service's image id (None: not known now)."""

    images: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class StagingLost:
    """Mounts attached through the staging area do not reach containers: stop using it."""


@dataclass(frozen=True)
class Shutdown:
    """The orchestrator stops: no more starts or hand-outs, pooled containers removed."""


Event = (
    Tick
    | StartSucceeded
    | StartFailed
    | PooledGreeted
    | PooledGreetingFailed
    | EarlyOutput
    | OutputEnded
    | Take
    | Watched
    | ImagesChecked
    | StagingLost
    | Shutdown
)


# --- actions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartPooled:
    """Start pooled container ``token`` of ``service`` in ``shape`` (``staged``: with the
    staging area's binds, so that a session's mounts can be attached later)."""

    token: int
    service: str
    shape: Hashable
    staged: bool = False


@dataclass(frozen=True)
class GreetPooled:
    """Greet started container ``token`` (see :mod:`.pool_greeting`); report
    :class:`PooledGreeted` or :class:`PooledGreetingFailed`."""

    token: int
    service: str


@dataclass(frozen=True)
class RemovePooled:
    """Remove pooled container ``token`` (started, never handed out)."""

    token: int
    service: str
    reason: RetireReason

    @property
    def ended(self) -> bool:
        """It ended on its own while it waited (worth a warning with its last stderr)."""
        return self.reason in ENDED_REASONS


@dataclass(frozen=True)
class Claim:
    """The answer to a :class:`Take`: ``token`` is that session's. Stop watching it, then
    report :class:`Watched` (the machine then hands it out or removes it)."""

    token: int
    service: str


@dataclass(frozen=True)
class HandOut:
    """Give claimed container ``token`` to the session that took it."""

    token: int
    service: str


@dataclass(frozen=True)
class Missed:
    """The answer to a :class:`Take`: no pooled container (the session starts a fresh one)."""

    service: str
    outcome: TakeOutcome


@dataclass(frozen=True)
class CheckImages:
    """Ask the engine for these services' image ids; report :class:`ImagesChecked`."""

    services: tuple[str, ...]


@dataclass(frozen=True)
class ImageChanged:
    """``service``'s image was rebuilt: its pooled containers are replaced (a log line)."""

    service: str


Action = (
    StartPooled | GreetPooled | RemovePooled | Claim | HandOut | Missed | CheckImages | ImageChanged
)
