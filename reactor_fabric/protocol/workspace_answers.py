"""The answers of calls whose container works on a copy of the client's project, held until what
the task changed is recorded (``workspace: isolated``; see docs/USAGE.md, "Workspaces").

A per-call container of an isolated service answers its call; the machine does not pass the
answer on yet. It stops the container (:class:`~.events.StopBackend` with
``report_workspace``: nothing can write the copy any more, its child sessions end with it), the
driver records the copy's changes as a branch of the client's repository and reports
:class:`~.events.WorkspaceRecorded`; only then does the client get the answer, naming the work:
``structuredContent.workspace`` (``{mode, branch, base, commit, files_changed, insertions,
deletions}``; ``commit`` null when nothing changed) and a line of text for clients that show
only text. An error answer carries it in ``error.data.workspace``. If nothing could be recorded
the answer says why (``workspace.error``) and the call's own outcome is unchanged.

Pure: no I/O. Both endpoints' machines keep one :class:`HeldAnswers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from .._errors import WorkspaceRefused
from .._reasons import WORKSPACE_FAILED
from .events import BackendKey, WorkspaceRecorded

Json = dict[str, Any]
Request = TypeVar("Request")

# A relayed call that names a ``base``: on /mcp/{service} the container and its copy start
# before the call (with the session's handshake), from the client's working tree.
BASE_ON_RELAY = WorkspaceRefused(
    "a task's base is honoured on /mcp, where each call gets a container and a copy of its "
    "own; on this relay the container's copy was made from the working tree before the call: "
    "call the tool through /mcp, or leave base out",
    reason=WORKSPACE_FAILED,
)

# An agent's call that names a ``base`` when the agent works in the client's project itself
# (``workspace: shared``): there is no copy to start from it, and ignoring it would be a surprise.
BASE_NEEDS_ISOLATED = WorkspaceRefused(
    "a task's base is honoured by agents with workspace: isolated (each task on a copy of its "
    "own, started from the base); this agent works in your project as it is: leave base out, "
    "or give the service workspace: isolated",
    reason=WORKSPACE_FAILED,
)

# What the answer says when nothing was recorded (the failure is the driver's words).
NOT_RECORDED_KEYS = ("branch", "base", "commit")


@dataclass(frozen=True)
class Held(Generic[Request]):
    """An answer waiting for its workspace: the request it answers and the backend's message."""

    request: Request
    message: Json


class HeldAnswers(Generic[Request]):
    """The answers held, by the backend that gave them (the fabric endpoint's per-call
    container answers one call; the relay's may answer several before it is replaced).

    ``Request`` is what the machine needs to pass an answer on: the fabric endpoint's
    :class:`~.fabric_exchanges.Forwarded`, the relay's request id."""

    def __init__(self) -> None:
        self._held: dict[BackendKey, list[Held[Request]]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def hold(self, key: BackendKey, request: Request, message: Json) -> None:
        """Keep ``message`` (the backend's answer to ``request``) until the workspace of
        ``key`` is recorded."""
        self._held.setdefault(key, []).append(Held(request, message))

    def release(self, event: WorkspaceRecorded) -> list[Held[Request]]:
        """The answers held for ``event``'s backend, in the order they came, naming the work
        (none: none was held, or the session ended meanwhile and they were answered then)."""
        return [
            Held(held.request, with_workspace(held.message, event.workspace, event.failure))
            for held in self._held.pop(event.key, [])
        ]

    def withdraw(self, cancelled: Callable[[Request], bool]) -> bool:
        """The client cancelled a call whose answer is held: that answer is dropped (a
        cancelled request is not answered; its workspace is still recorded, and audited).
        Whether one was held."""
        found = False
        for answers in self._held.values():
            kept = [held for held in answers if not cancelled(held.request)]
            found = found or len(kept) != len(answers)
            answers[:] = kept
        return found

    def end(self) -> list[Request]:
        """The session ends: the requests whose answers were held (the machine answers them
        with the session's error; a recording that completes later is ignored)."""
        requests = [held.request for answers in self._held.values() for held in answers]
        self._held.clear()
        return requests

    def clone(self) -> HeldAnswers[Request]:
        twin: HeldAnswers[Request] = HeldAnswers()
        twin._held = {key: list(answers) for key, answers in self._held.items()}
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return tuple(
            sorted(
                (key, tuple(repr(held.request) for held in answers))
                for key, answers in self._held.items()
            )
        )


def with_workspace(message: Json, workspace: Json | None, failure: str | None) -> Json:
    """The backend's answer ``message`` naming the task's work (see the module's docs)."""
    named = workspace_value(workspace, failure)
    result = message.get("result")
    if isinstance(result, dict):
        changed = dict(result)
        structured = changed.get("structuredContent")
        if structured is None or isinstance(structured, dict):
            changed["structuredContent"] = {**(structured or {}), "workspace": named}
        content = changed.get("content")
        line = {"type": "text", "text": workspace_text(named)}
        changed["content"] = [*content, line] if isinstance(content, list) else [line]
        return {**message, "result": changed}
    error = message.get("error")
    if isinstance(error, dict):
        data = error.get("data")
        if data is None or isinstance(data, dict):
            return {**message, "error": {**error, "data": {**(data or {}), "workspace": named}}}
    return message


def workspace_value(workspace: Json | None, failure: str | None) -> Json:
    """``structuredContent.workspace``: what was recorded, or why nothing was."""
    if workspace is not None:
        return workspace
    return {
        "mode": "isolated",
        **dict.fromkeys(NOT_RECORDED_KEYS),
        "files_changed": 0,
        "insertions": 0,
        "deletions": 0,
        "error": failure or "the task's changes could not be recorded",
    }


def workspace_text(workspace: Json) -> str:
    """The line of text that says the same, for clients that show only text."""
    error = workspace.get("error")
    if error is not None:
        return f"Workspace: the task's changes were not recorded: {error}"
    base = _short(workspace.get("base"))
    commit = workspace.get("commit")
    if commit is None:
        return f"Workspace: the task changed nothing (no branch; it started from {base})."
    return (
        f"Workspace: the task's changes are on branch {workspace.get('branch')} (commit "
        f"{_short(commit)}, from {base}: {workspace.get('files_changed')} files changed, "
        f"+{workspace.get('insertions')} -{workspace.get('deletions')})."
    )


def _short(commit: object) -> str:
    return commit[:12] if isinstance(commit, str) else "an empty repository"


def names_base(params: msgspec.Raw | bytes | Json | None) -> bool:
    """Whether a ``tools/call``'s params (raw, or decoded) give ``arguments.base`` (other than
    null); params that cannot be read give none (the server refuses them itself). Only an
    agent's ``run_task`` has a base of the orchestrator's: another server's ``base`` argument
    is its own, passed on untouched."""
    decoded: object = params
    if isinstance(params, msgspec.Raw | bytes):
        try:
            decoded = msgspec.json.decode(params)
        except (msgspec.DecodeError, RecursionError):
            return False
    arguments = decoded.get("arguments") if isinstance(decoded, dict) else None
    return isinstance(arguments, dict) and arguments.get("base") is not None
