"""Git on a client's repository, run by the orchestrator so that nothing the repository
configures is ever executed.

Why this needs care: a repository's ``.git/config`` can name programs — hooks
(``core.hooksPath``, ``.git/hooks/*``), a file-system monitor (``core.fsmonitor``), clean and
smudge filters, external diff and textconv drivers, a GPG program, credential helpers — and
git runs them, as whoever runs git. The orchestrator runs git on a client's repository only
to read what the task starts from and to record what it changed; a repository someone cloned
from anywhere (or one an agent once wrote to) must not be able to run code on the host
through that.

Three layers, each enough on its own for the commands used here:

1. **Only plumbing that never runs a configured program**: ``rev-parse``, ``ls-files`` (a
   listing: no content read), ``ls-tree``, ``cat-file --batch`` (raw objects: no filters),
   ``check-ignore``, ``fast-import`` and ``diff-tree`` between two commits with
   ``--no-ext-diff --no-textconv``. Never ``status``, ``diff-files``, ``add``, ``checkout``,
   ``archive`` or ``commit`` (they read the work tree through filters, or run hooks).
2. **Overrides for every program-valued key they could still consult** (``-c`` on the command
   line outranks every configuration file): hooks point at ``/dev/null`` (no hook can exist
   below it: the reference-transaction hook ``fast-import`` would otherwise run), the monitor
   off, signing off, automatic gc and maintenance off, no pager, editor, askpass, ssh or
   credential helper, no protocol allowed.
3. **An environment of its own**: no system or global configuration (``GIT_CONFIG_NOSYSTEM``,
   ``GIT_CONFIG_GLOBAL=/dev/null``), no discovery (``GIT_DIR`` and ``GIT_WORK_TREE`` given),
   no optional locks (nothing writes the client's index), no prompts, no replace refs, and
   none of the orchestrator's own variables (its token, the agents' keys).

Who runs it: the repository's owner (``RepositoryOwner``): objects and refs written are theirs,
and git's ``safe.directory`` check passes without configuration. The working directory is the
pinned project (``/proc/self/fd/N`` of the pin, inherited by the child), never a path resolved
again.

Resource handling: every process has a deadline (it is killed at it) and a bound on the
bytes of output kept; a process is always waited for. Blocking: callers run this in a worker
thread.

Error handling: a failure is :class:`GitFailed` (the command, its exit status and the start of
its stderr, which names paths of the client's own repository only).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

GIT = "git"
# What git finds on PATH for its own helpers (git itself is found the same way).
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

# Every program-valued key the commands above could consult, and the others that could make
# them do more than asked; given with -c, they outrank every file the repository can write.
SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),  # no hook can exist below a device file
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("core.askPass", ""),
    ("core.sshCommand", ""),
    ("core.alternateRefsCommand", ""),
    ("credential.helper", ""),
    ("diff.external", ""),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gpg.program", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("fetch.writeCommitGraph", "false"),
    ("protocol.allow", "never"),
    ("uploadpack.packObjectsHook", ""),
)


class GitFailed(Exception):
    """A git command failed, timed out or said more than its bound."""

    def __init__(self, command: str, detail: str) -> None:
        super().__init__(f"git {command}: {detail}")
        self.command = command
        self.detail = detail


@dataclass(frozen=True)
class RepositoryOwner:
    """Whom git runs as: the project's owner. ``None`` ids: as the orchestrator itself (it is
    not root, and it owns the project)."""

    uid: int | None
    gid: int | None

    @classmethod
    def of(cls, uid: int, gid: int) -> RepositoryOwner:
        """The owner ``(uid, gid)`` of a pinned project, as git must run for it: switched to
        when the orchestrator is root, else the orchestrator itself (which must be them)."""
        if os.geteuid() == 0:
            return cls(uid, gid)
        if uid != os.geteuid():
            raise PermissionError(
                f"the project belongs to uid {uid}; an orchestrator not running as root runs "
                "git only on its own user's repositories"
            )
        return cls(None, None)


@dataclass(frozen=True)
class Git:
    """How to run git on one repository: its work tree (a directory descriptor, e.g. a pin's
    ``O_PATH`` one), its Git directory relative to the work tree or absolute (``.git``: a
    directory, or the file of a linked worktree, which git follows), and whom as."""

    work_tree_fd: int
    owner: RepositoryOwner
    git_dir: str = ".git"
    # The work tree git reads (ls-files' untracked files, check-ignore), relative to the
    # working directory: the project itself, or a task's copy (an absolute path).
    work_tree: str = "."
    # More descriptors the child inherits (a git_dir named as /proc/self/fd/N/.git).
    extra_fds: tuple[int, ...] = ()

    def environment(self) -> dict[str, str]:
        """The child's whole environment: nothing of the orchestrator's."""
        env = {
            "PATH": SAFE_PATH,
            "HOME": "/nonexistent",
            "LC_ALL": "C",
            "TZ": "UTC",
            "GIT_DIR": self.git_dir,
            "GIT_WORK_TREE": self.work_tree,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_PAGER": "cat",
            "GIT_EDITOR": "true",
            "GIT_ASKPASS": "",
            "GIT_SSH_COMMAND": "",
            "GIT_EXTERNAL_DIFF": "",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_CONFIG_COUNT": str(len(SAFE_CONFIG)),
        }
        for index, (key, value) in enumerate(SAFE_CONFIG):
            env[f"GIT_CONFIG_KEY_{index}"] = key
            env[f"GIT_CONFIG_VALUE_{index}"] = value
        return env

    def argv(self, args: Sequence[str]) -> list[str]:
        # -c as well as GIT_CONFIG_COUNT: either alone outranks the repository's files; both,
        # so that a git too old for one still has the other.
        overrides = [part for key, value in SAFE_CONFIG for part in ("-c", f"{key}={value}")]
        return [GIT, *overrides, *args]

    @contextlib.contextmanager
    def process(
        self, args: Sequence[str], *, deadline: float, stdin: bool = False
    ) -> Iterator[subprocess.Popen[bytes]]:
        """A running git (stdout a pipe; stdin a pipe if asked; stderr kept to a file's worth
        of a pipe), killed at ``deadline`` (``time.monotonic()``: a stream that stops moving
        would otherwise block its reader or writer for ever), and killed and waited for on the
        way out whatever happened."""
        child = subprocess.Popen(
            self.argv(args),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=f"/proc/self/fd/{self.work_tree_fd}",
            pass_fds=(self.work_tree_fd, *self.extra_fds),
            env=self.environment(),
            user=self.owner.uid,
            group=self.owner.gid,
            extra_groups=[] if self.owner.uid is not None else None,
            umask=0o022,
            close_fds=True,
        )
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), child.kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            yield child
        finally:
            watchdog.cancel()
            if child.poll() is None:
                child.kill()
            for pipe in (child.stdin, child.stdout, child.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            child.wait()

    def run(
        self,
        args: Sequence[str],
        *,
        deadline: float,
        input: bytes | None = None,
        limit: int = 64 << 20,
        ok: Mapping[int, bool] | None = None,
    ) -> bytes:
        """Run git with ``args`` to completion before ``deadline`` (``time.monotonic()``),
        feeding ``input``; its stdout (at most ``limit`` bytes, else :class:`GitFailed`).
        An exit status other than 0 raises, unless ``ok`` maps it to True (then its stdout)."""
        name = args[0] if args else "git"
        with self.process(args, deadline=deadline, stdin=input is not None) as child:
            stdout, stderr = _exchange(child, input, deadline=deadline, limit=limit, name=name)
            try:
                status = child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise GitFailed(name, "did not exit in time") from None
        if status != 0 and not (ok or {}).get(status, False):
            raise GitFailed(name, f"exit status {status}: {_first_line(stderr)}")
        return stdout


STDERR_KEPT = 4096


def _exchange(
    child: subprocess.Popen[bytes], data: bytes | None, *, deadline: float, limit: int, name: str
) -> tuple[bytes, bytes]:
    """Feed ``data`` to the child and read its stdout (``limit`` bytes at most: more raises)
    and the start of its stderr until both end, before ``deadline``. One thread, one loop:
    neither side can block the other (a full stdout pipe while stdin is still being written)."""
    out = bytearray()
    err = bytearray()
    view = memoryview(data or b"")
    with selectors.DefaultSelector() as selector:
        if child.stdin is not None:
            if view:
                os.set_blocking(child.stdin.fileno(), False)
                selector.register(child.stdin, selectors.EVENT_WRITE)
            else:
                child.stdin.close()
        assert child.stdout is not None
        assert child.stderr is not None
        selector.register(child.stdout, selectors.EVENT_READ)
        selector.register(child.stderr, selectors.EVENT_READ)
        while selector.get_map():
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise GitFailed(name, "did not finish in time")
            for key, _events in selector.select(timeout):
                stream = key.fileobj
                if stream is child.stdin:
                    view = _send(child.stdin, view, selector)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(stream)
                elif stream is child.stdout:
                    out += chunk
                    if len(out) > limit:
                        raise GitFailed(name, f"said more than {limit} bytes")
                elif len(err) < STDERR_KEPT:
                    err += chunk[: STDERR_KEPT - len(err)]
    return bytes(out), bytes(err)


def _send(stdin: IO[bytes], view: memoryview, selector: selectors.BaseSelector) -> memoryview:
    """Write what the child's stdin takes of ``view``; the rest. Closed once all is sent."""
    try:
        sent = os.write(stdin.fileno(), view[:65536])
    except BrokenPipeError:
        sent = len(view)  # it stopped reading: its exit status says why
    view = view[sent:]
    if not view:
        selector.unregister(stdin)
        stdin.close()
    return view


def _first_line(stderr: bytes) -> str:
    text = stderr.decode("utf-8", "replace").strip()
    return (text.splitlines() or [""])[0][:300]
