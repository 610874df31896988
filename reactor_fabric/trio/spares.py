"""Spare copies of a session's project (:mod:`reactor_fabric.workspace.spare`) on the trio
side: when each is begun, which task takes it, how long one outlives its session.

A session's next task from the working tree starts on a spare copy where it can: one per
session, account and project, begun a second after the session's start when its services
include an isolated one (:mod:`.session` asks) and again once each task from the working tree
has its container started, in a thread of its own; the task moves it to its own name and
brings it up to date instead of copying the whole project (a task that comes while its spare
is still being made stops it and copies the project whole). A spare is at most
``orchestrator.workspaces.spare_max_size`` (a larger project gets none, in any session, for
:data:`SPARE_RETRY_SECONDS`).

A session's made spare outlives it (:meth:`Spares.end_session`; one still being made, once it
is: :meth:`Spares.run`): the next session on the same project, for the same account, from the
same owner's repository takes it at its start, so that a client's first task in a new
session — a reconnection, another conversation on the project — does not copy the whole
project either. What it holds is no more than that session may read: the project's files as
they were, brought up to the working tree as it is at the task (what is gone, removed), and
no container saw it before. At most :data:`KEPT_SPARES` are kept, together within
``spare_max_size``, each for :data:`KEPT_SPARE_SECONDS`.

Resource handling: every spare is made in a :class:`~.background_thread.BackgroundThread` on
a descriptor of its own; whatever drops one — a task that came too soon (at its session's
end), the session's end when it cannot be kept, its expiry, :meth:`Spares.close` at the
serving's end — stops its thread (shielded, bounded by its deadline) and removes it
(shielded); one whose thread outlives that is left to the area's removal.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import outcome
import trio

from .._reasons import WORKSPACE_TOO_LARGE
from ..config.structs import Workspaces
from ..policy.pinning import Pin
from ..workspace import Bounds, begin
from ..workspace import remove as remove_copy
from ..workspace.spare import Spare, make_spare
from .background_thread import STOP_MARGIN_SECONDS, BackgroundThread

log = logging.getLogger(__name__)

# A session's first spare copy is begun this long after the session (a client's first task
# comes when its model asks for it, seconds after it connected; one asked for at once copies
# the project as it would without spares, and no spare's copy competes with it for the cores).
SESSION_SPARE_DELAY_SECONDS = 1.0
# How long a project found too large for a spare copy gets none (it may have been cleaned).
SPARE_RETRY_SECONDS = 600.0
# A session's spare outlives the session this long, for the next session on the same project
# (a client's sessions on one project come one after the other: its first task then starts on
# it too); at most this many are kept, together within orchestrator.workspaces.spare_max_size.
KEPT_SPARE_SECONDS = 600.0
KEPT_SPARES = 4


@dataclass(frozen=True)
class SpareRecipe:
    """Whose spare copy of which project (a session's: no other live session ever takes it)
    and how to make it."""

    session: str
    copy_owner: tuple[int, int]  # (uid, gid) the copy's files belong to
    project: tuple[int, int]  # (device, inode) of the pinned project
    repository_owner: tuple[int, int]
    # The session's signed-in user (None: the token's holder). Not part of what the session's
    # own tasks find their spare by (the session is); part of what a later session finds a
    # kept one by: a copy made in one user's session is never another user's.
    user: str | None = field(default=None, compare=False)

    @property
    def kept_as(self) -> SpareKey:
        """What a spare kept after its session is found by: the same user, the same project,
        copied for the same account (its files are theirs) from the same owner's repository."""
        return self.user, self.copy_owner, self.project, self.repository_owner


SpareKey = tuple[str | None, tuple[int, int], tuple[int, int], tuple[int, int]]


@dataclass
class SpareSlot:
    """A session's spare copy: being made (``making``), or made and waiting for a task —
    made for this session, or ``kept`` after an earlier one's end on the same project."""

    session: str
    directory: str
    making: BackgroundThread[Spare] | None = None
    kept: Spare | None = None

    def made(self) -> outcome.Outcome[Spare] | None:
        """What making it gave (None while it is being made)."""
        if self.kept is not None:
            return outcome.Value(self.kept)
        assert self.making is not None
        return self.making.outcome


@dataclass
class KeptSpare:
    """A spare whose session ended, until it is taken or expires (``until``, trio's clock)."""

    spare: Spare
    until: float


class Spares:
    """The spare copies of one orchestrator's sessions."""

    def __init__(self, directory_of: Callable[[str], str], bounds: Workspaces) -> None:
        """``directory_of(name)``: where the copy named ``name`` is made (the area's)."""
        self._directory_of = directory_of
        self.wanted = bounds.spare
        self.session_delay = SESSION_SPARE_DELAY_SECONDS
        # (a spare's deadline, for its git steps, is a task's copy's)
        self._bounds = Bounds(
            max_files=bounds.max_files,
            max_bytes=min(bounds.max_size_bytes, bounds.spare_max_size_bytes),
        )
        # At most one spare per session, copy owner and project (see reactor_fabric.workspace.
        # spare): made at the session's start and after a task's, taken by the next task,
        # kept after the session. A project found over spare_max_size gets none for a while,
        # in any session: by (device, inode), until when (trio's clock).
        self._spares: dict[SpareRecipe, SpareSlot] = {}
        self._stopping: list[SpareSlot] = []  # (told to stop by a task that came too soon)
        # Spares whose sessions ended, for the next session on the same project (see run).
        self._kept: dict[SpareKey, KeptSpare] = {}
        self._kept_changed = trio.Event()
        self._keeper: trio.Nursery | None = None
        self._too_large: dict[tuple[int, int], float] = {}
        self._names = itertools.count(1)

    def make_for_session(
        self,
        session: str,
        project: Pin,
        copy_owner: tuple[int, int],
        user: str | None = None,
    ) -> None:
        """The spare copy of the pinned ``project`` for ``session``'s first isolated task (its
        files ``copy_owner``'s: the account its container will run as): one kept after an
        earlier session of the same ``user`` on the same project, else one begun
        :attr:`session_delay` seconds from now — unless a task comes first: it stops the spare
        and copies as it would without one."""
        recipe = SpareRecipe(
            session, copy_owner, (project.device, project.inode), project.owner, user
        )
        if not self.wanted or recipe in self._spares:
            return
        kept = self._kept.pop(recipe.kept_as, None)
        if kept is not None:
            self._kept_changed.set()
            self._spares[recipe] = SpareSlot(session, kept.spare.directory, kept=kept.spare)
            log.info("workspace_spare_kept_taken", extra={"session": session})
            return
        self.begin(recipe, project.fd, after=self.session_delay)

    def begin(self, recipe: SpareRecipe, project_fd: int, *, after: float = 0.0) -> None:
        """Make the spare of ``recipe`` in a thread of its own, on a descriptor of its own (a
        dup of ``project_fd``, closed by the thread), ``after`` seconds."""
        too_large_until = self._too_large.get(recipe.project, -math.inf)
        if not self.wanted or recipe in self._spares or too_large_until > trio.current_time():
            return
        directory = self._directory_of(f"spare-{next(self._names)}")
        fd = os.dup(project_fd)
        bounds = self._bounds

        def work(stopped: Callable[[], bool]) -> Spare:
            try:
                waited_until = time.monotonic() + after
                while time.monotonic() < waited_until:
                    if stopped():
                        raise InterruptedError("stopped before it began")
                    time.sleep(0.01)
                begun = begin(
                    fd, recipe.repository_owner, directory, base=None, bounds=bounds,
                    copy_owner=recipe.copy_owner,
                )  # fmt: skip
                spare = make_spare(begun, stopped)
            finally:
                os.close(fd)
            log.info(
                "workspace_spare_made",
                extra={"session": recipe.session, "files": len(spare.entries)},
            )
            return spare

        making = BackgroundThread(work, name=f"reactor-fabric spare {directory}")
        self._spares[recipe] = SpareSlot(recipe.session, directory, making=making)

    def take(self, recipe: SpareRecipe) -> Spare | None:
        """The spare made for ``recipe``, if there is one (taken: it is the caller's); None when
        it failed (it removed what it made). One still being made is told to stop (its
        removal is the session's end's): the task copies the project whole rather than wait
        for it — waiting, the copy could not be made beside the container's start — or make
        its copy beside it on the two cores."""
        slot = self._spares.pop(recipe, None)
        if slot is None:
            return None
        made = slot.made()
        if made is None:
            assert slot.making is not None
            slot.making.request_stop()
            self._stopping.append(slot)
            return None
        if isinstance(made, outcome.Value):
            spare: Spare = made.value
            return spare
        error = made.error if isinstance(made, outcome.Error) else None
        if getattr(error, "reason", None) == WORKSPACE_TOO_LARGE:
            # Its tasks copy it whole; a spare is not begun again for a while.
            now = trio.current_time()
            self._too_large = {
                project: until for project, until in self._too_large.items() if until > now
            }
            self._too_large[recipe.project] = now + SPARE_RETRY_SECONDS
        log.info("workspace_spare_failed", extra={"session": recipe.session, "detail": str(error)})
        return None

    def slots(self) -> list[SpareSlot]:
        """The live sessions' spare copies, made or being made."""
        return list(self._spares.values())

    def kept(self) -> list[Spare]:
        """The spares kept after their sessions' end, oldest first."""
        return [kept.spare for kept in self._kept.values()]

    async def end_session(self, session: str) -> None:
        """``session``'s spares: kept for the next session on the same project when made (one
        still being made, once it is: :meth:`run`), else stopped and removed (shielded;
        bounded by their deadlines)."""
        ended = {r: self._spares.pop(r) for r in list(self._spares) if r.session == session}
        dropped = [slot for slot in self._stopping if slot.session == session]
        self._stopping = [slot for slot in self._stopping if slot.session != session]
        with trio.CancelScope(shield=True):
            for recipe, slot in ended.items():
                made = slot.made()
                if isinstance(made, outcome.Value):
                    await self._keep(recipe.kept_as, made.value)
                elif made is None and self._keeper is not None:
                    self._keeper.start_soon(self._keep_once_made, recipe.kept_as, slot)
                else:
                    dropped.append(slot)
            for slot in dropped:
                await self._drop_spare(slot)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the spares of ended sessions — one still being made once it is made — each
        until it is taken or :data:`KEPT_SPARE_SECONDS` have passed, when it is removed: until
        cancelled (the serving's end; :meth:`close` removes what is left). Without it running,
        a session's spare still being made at its end is dropped."""
        try:
            async with trio.open_nursery() as keeper:
                self._keeper = keeper
                task_status.started()
                while True:
                    expiry = min((kept.until for kept in self._kept.values()), default=math.inf)
                    with trio.move_on_at(expiry):
                        await self._kept_changed.wait()
                    self._kept_changed = trio.Event()
                    await self._drop_kept(expired_at=trio.current_time())
        finally:
            self._keeper = None

    async def _keep_once_made(self, key: SpareKey, slot: SpareSlot) -> None:
        """Keep ``slot``'s spare once it is made (within its own deadline), else drop it."""
        assert slot.making is not None
        kept = False
        try:
            with trio.move_on_after(self._bounds.step_seconds + STOP_MARGIN_SECONDS):
                await slot.making.wait()
            made = slot.making.outcome
            if isinstance(made, outcome.Value):
                kept = True
                await self._keep(key, made.value)
        finally:
            if not kept:
                await self._drop_spare(slot)

    async def _keep(self, key: SpareKey, spare: Spare) -> None:
        """Keep ``spare`` under ``key`` (the one kept there before removed), then remove the
        oldest kept spares beyond :data:`KEPT_SPARES` or the spares' size bound (shielded)."""
        with trio.CancelScope(shield=True):
            replaced = self._kept.pop(key, None)
            self._kept[key] = KeptSpare(spare, trio.current_time() + KEPT_SPARE_SECONDS)
            self._kept_changed.set()
            if replaced is not None:
                await self._remove_spare(replaced.spare.directory)
            await self._drop_kept(expired_at=None)

    async def _drop_kept(self, *, expired_at: float | None) -> None:
        """Remove the kept spares expired at ``expired_at`` (None: none expires), and the
        oldest while there are too many or they are too large together (shielded)."""
        with trio.CancelScope(shield=True):
            while self._kept:
                key, oldest = next(iter(self._kept.items()))  # (kept in the order kept)
                total = sum(kept.spare.size for kept in self._kept.values())
                if (
                    len(self._kept) <= KEPT_SPARES
                    and total <= self._bounds.max_bytes
                    and (expired_at is None or oldest.until > expired_at)
                ):
                    return
                del self._kept[key]
                log.info("workspace_spare_expired", extra={"directory": oldest.spare.directory})
                await self._remove_spare(oldest.spare.directory)

    async def close(self) -> None:
        """Drop every spare (at the serving's end, before the area goes)."""
        with trio.CancelScope(shield=True):
            while self._spares:
                await self._drop_spare(self._spares.pop(next(iter(self._spares))))
            while self._stopping:
                await self._drop_spare(self._stopping.pop())
            while self._kept:
                kept = self._kept.pop(next(iter(self._kept)))
                await self._remove_spare(kept.spare.directory)

    async def _drop_spare(self, slot: SpareSlot) -> None:
        if slot.making is not None and not await slot.making.stop(
            self._bounds.step_seconds + STOP_MARGIN_SECONDS
        ):
            log.error("workspace_spare_stuck", extra={"directory": slot.directory})
            return  # (left to the area's removal)
        if isinstance(slot.made(), outcome.Value):
            await self._remove_spare(slot.directory)

    async def _remove_spare(self, directory: str) -> None:
        """Remove a spare made (shielded: a cancelled removal would leave it in memory)."""
        try:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(remove_copy, directory)
        except OSError as exc:  # (left to the area's removal)
            log.error(
                "workspace_spare_not_removed", extra={"directory": directory, "detail": str(exc)}
            )
