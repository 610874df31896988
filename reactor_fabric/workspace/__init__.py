"""Isolated workspaces: an agent task works on a copy of the client's project, and what it
changed comes back as a branch of the client's repository (``workspace: isolated``; see
docs/USAGE.md, "Workspaces").

- :mod:`.naming` — the branch's name, the commit messages, which ``base`` a client may name
  (pure);
- :mod:`.git` — git on the client's repository, with nothing of its configuration executed;
- :mod:`.files` — the copy made and read back by descriptor, never following a link;
- :mod:`.copying` — the copy a task starts on: :func:`~.copying.begin` (its directory, empty,
  and what goes in it) and :func:`~.copying.fill`, or :func:`~.copying.prepare`, both;
- :mod:`.helper` — a process that copies half of a large copy on the machine's other core;
- :mod:`.spare` — a copy made ahead, brought up to date by the task that takes it;
- :mod:`.task` — a task's workspace: :func:`~.task.settle` (what its start did not wait for),
  :func:`~.task.record` (its branch), :func:`~.task.remove`.

Blocking I/O throughout (files, git processes): the trio side (:mod:`reactor_fabric.trio.
workspaces`) runs it in worker threads, at an isolated call's container's start and removal.
This package knows nothing of trio, the runtimes or the session machines.
"""

from __future__ import annotations

from .copying import Begun, begin, fill, prepare
from .naming import TaskFacts, branch_name, valid_base
from .task import Bounds, Recorded, Workspace, record, remove, settle

__all__ = [
    "Begun",
    "Bounds",
    "Recorded",
    "TaskFacts",
    "Workspace",
    "begin",
    "branch_name",
    "fill",
    "prepare",
    "record",
    "remove",
    "settle",
    "valid_base",
]
