"""What the Python worker's tools decide, apart from running anything: the paths a client may
name, the bounds of every input and output, the packages pip may be asked for, and the reading
of pytest's and ruff's reports. No MCP and no event loop here (``worker_server.py`` has those),
so that the unit tests run it on the host.

Paths. A client names a file of the workspace by a relative path: never an absolute one, never
one with a ``..`` component; it is resolved (links followed) and must stay inside the
workspace; then it is opened component by component below the workspace's descriptor with
``O_NOFOLLOW``, so that a link swapped in after the check (by code the worker ran, still
running) fails the open instead of leading out. Each refusal is a :class:`Refused` whose text
the client sees.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Inputs.
MAX_PATH_BYTES = 4096
MAX_CODE_BYTES = 1024 * 1024
MAX_WRITE_BYTES = 8 * 1024 * 1024
MAX_PACKAGES = 50
MAX_PACKAGE_CHARS = 200
MAX_ARGS = 64
MAX_ARG_CHARS = 1000
# Outputs.
OUTPUT_BYTES = 64 * 1024  # of each of stdout and stderr
READ_BYTES = 1024 * 1024
LIST_ENTRIES = 2000
MAX_LIST_ENTRIES = 10_000
LINT_FINDINGS = 1000
FAILURES = 100
FAILURE_MESSAGE_LINES = 10
FAILURE_MESSAGE_CHARS = 2000
# Times, in seconds: (default, most).
PYTHON_TIMEOUT = (30.0, 600.0)
PIP_TIMEOUT = (300.0, 900.0)
TESTS_TIMEOUT = (300.0, 1800.0)
LINT_TIMEOUT = (60.0, 600.0)


class Refused(Exception):
    """A call the worker will not run: its text is the tool error the client sees."""


def timeout_of(asked: float | None, bounds: tuple[float, float], tool: str) -> float:
    default, most = bounds
    if asked is None:
        return default
    if not asked > 0:  # (NaN too)
        raise Refused(f"{tool}: timeout must be a positive number of seconds")
    if asked > most:
        raise Refused(f"{tool}: timeout may be at most {most:g} seconds")
    return float(asked)


# --- paths -------------------------------------------------------------------------------------


def components(path: str) -> list[str]:
    """The components of a client's relative ``path`` ("" or "." is the workspace itself), or
    :class:`Refused` for an absolute path, a ``..`` component, a NUL or an over-long one."""
    if "\0" in path:
        raise Refused(f"path {path[:200]!r}: a NUL character is not allowed")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise Refused(f"path: longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise Refused(f"path {path!r}: absolute paths are not allowed (relative to the workspace)")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise Refused(f"path {path!r}: '..' is not allowed (relative to the workspace, inside it)")
    return parts


@dataclass(frozen=True)
class Workspace:
    """The directory the tools work in (the project the suite mounted)."""

    root: str

    def resolve(self, path: str) -> list[str]:
        """The components of ``path`` below the workspace with every link resolved, or
        :class:`Refused` when a link leads out of it."""
        parts = components(path)
        root = os.path.realpath(self.root)
        resolved = os.path.realpath(os.path.join(root, *parts))
        if resolved != root and not resolved.startswith(root.rstrip("/") + "/"):
            raise Refused(f"path {path!r} leads out of the workspace (through a link)")
        return [part for part in resolved[len(root) :].split("/") if part]

    @contextlib.contextmanager
    def opened_parent(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """The descriptor of the directory holding ``parts[-1]`` (the workspace's for a single
        component), opened a component at a time without following links; missing directories
        made when ``create``."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                try:
                    child = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    child = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            yield fd
        except OSError as exc:
            raise Refused(_os_reason("/".join(parts), exc)) from exc
        finally:
            os.close(fd)

    def read(self, path: str, *, offset: int = 0, limit: int = READ_BYTES) -> dict[str, Any]:
        """``read_file``: up to ``limit`` bytes of the file from ``offset``, as text when it is
        UTF-8, else base64."""
        if offset < 0 or limit < 1:
            raise Refused("read_file: offset must be >= 0 and limit >= 1")
        limit = min(limit, READ_BYTES)
        parts = self.resolve(path)
        if not parts:
            raise Refused(f"path {path!r} is the workspace itself, a directory")
        with self.opened_parent(parts) as parent:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError as exc:
                raise Refused(_os_reason(path, exc)) from exc
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise Refused(f"path {path!r} is not a regular file")
        with os.fdopen(fd, "rb") as file:
            file.seek(offset)
            data = file.read(limit)
        truncated = offset + len(data) < info.st_size
        try:
            content, encoding = data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            content, encoding = base64.b64encode(data).decode("ascii"), "base64"
        return {
            "path": "/".join(parts),
            "content": content,
            "encoding": encoding,
            "size": info.st_size,
            "offset": offset,
            "bytes": len(data),
            "truncated": truncated,
        }

    def write(self, path: str, content: str, *, append: bool = False) -> dict[str, Any]:
        """``write_file``: the file made or replaced (or appended to) with ``content`` (UTF-8),
        its missing directories made."""
        data = content.encode("utf-8", "surrogatepass")
        if len(data) > MAX_WRITE_BYTES:
            raise Refused(f"write_file: content over {MAX_WRITE_BYTES} bytes")
        parts = self._resolve_new(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        flags |= os.O_APPEND if append else os.O_TRUNC
        with self.opened_parent(parts, create=True) as parent:
            try:
                fd = os.open(parts[-1], flags, 0o644, dir_fd=parent)
            except OSError as exc:
                raise Refused(_os_reason(path, exc)) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Refused(f"path {path!r} is not a regular file")
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            size = os.fstat(file.fileno()).st_size
        return {"path": "/".join(parts), "bytes_written": len(data), "size": size}

    def _resolve_new(self, path: str) -> list[str]:
        parts = self.resolve(path)
        if not parts:
            raise Refused(f"path {path!r} is the workspace itself, a directory")
        return parts

    def list(
        self, path: str = "", *, recursive: bool = False, limit: int = LIST_ENTRIES
    ) -> dict[str, Any]:
        """``list_files``: the entries below ``path`` (a directory of the workspace), sorted,
        at most ``limit``; recursion does not enter links or a ``.git``."""
        if limit < 1:
            raise Refused("list_files: limit must be >= 1")
        limit = min(limit, MAX_LIST_ENTRIES)
        parts = self.resolve(path)
        entries: list[dict[str, Any]] = []
        truncated = False
        with self.opened_parent([*parts, "."]) as start:
            if not stat.S_ISDIR(os.fstat(start).st_mode):
                raise Refused(f"path {path!r} is not a directory")
            pending = [("", os.dup(start))]
        try:
            while pending:
                prefix, fd = pending.pop()
                try:
                    with os.scandir(fd) as listing:
                        found = sorted(listing, key=lambda entry: entry.name)
                    for entry in found:
                        if len(entries) >= limit:
                            truncated = True
                            break
                        entries.append(_entry(prefix + entry.name, entry))
                        enter = entry.name != ".git" and entry.is_dir(follow_symlinks=False)
                        if recursive and enter:
                            with contextlib.suppress(OSError):
                                child = os.open(entry.name, _DIRECTORY_FLAGS, dir_fd=fd)
                                pending.append((prefix + entry.name + "/", child))
                finally:
                    os.close(fd)
                if truncated:
                    break
        finally:
            for _prefix, fd in pending:
                os.close(fd)
        entries.sort(key=lambda entry: entry["path"])
        return {
            "path": "/".join(parts) or ".",
            "entries": entries,
            "truncated": truncated,
        }


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _entry(path: str, entry: os.DirEntry[str]) -> dict[str, Any]:
    info = entry.stat(follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        kind = "link"
    elif stat.S_ISDIR(info.st_mode):
        kind = "directory"
    elif stat.S_ISREG(info.st_mode):
        kind = "file"
    else:
        kind = "other"
    return {"path": path, "type": kind, "size": info.st_size if kind == "file" else None}


def _os_reason(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"path {path!r}: a link is in the way (links are not followed here)"
    if exc.errno == errno.ENOENT:
        return f"path {path!r}: no such file or directory"
    if exc.errno == errno.ENOTDIR:
        return f"path {path!r}: a component is not a directory (or is a link, not followed here)"
    if exc.errno == errno.EISDIR:
        return f"path {path!r} is a directory"
    if exc.errno == errno.EACCES:
        return f"path {path!r}: permission denied"
    return f"path {path!r}: {exc.strerror or exc}"


# --- the tools' other inputs ----------------------------------------------------------------

# A requirement pip is given: a project name (PEP 508), optional extras and version
# specifiers; no URL, no path, no marker, no option (nothing that starts with '-').
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION = r"[A-Za-z0-9][A-Za-z0-9.*+!_-]*"
_SPECIFIER = rf"(?:===|==|!=|~=|<=|>=|<|>){_VERSION}"
_EXTRAS = rf"\[{_NAME}(?:,{_NAME})*\]"
REQUIREMENT = re.compile(rf"{_NAME}(?:{_EXTRAS})?(?:{_SPECIFIER}(?:,{_SPECIFIER})*)?")


def requirements(packages: list[str]) -> list[str]:
    """The packages of a ``pip_install`` call, each a plain requirement (``name``,
    ``name==1.2``, ``name[extra]>=1,<2``), or :class:`Refused`."""
    if not packages:
        raise Refused("pip_install: name at least one package")
    if len(packages) > MAX_PACKAGES:
        raise Refused(f"pip_install: at most {MAX_PACKAGES} packages at once")
    for package in packages:
        if len(package) > MAX_PACKAGE_CHARS or not REQUIREMENT.fullmatch(package):
            raise Refused(
                f"pip_install: {package[:200]!r} is not a package requirement (a name, "
                "optional [extras] and version specifiers such as ==1.2 or >=1,<2; no URL, "
                "path or option)"
            )
    return list(packages)


def test_arguments(args: list[str] | None) -> list[str]:
    args = list(args or [])
    if len(args) > MAX_ARGS:
        raise Refused(f"run_tests: at most {MAX_ARGS} arguments")
    for arg in args:
        if len(arg) > MAX_ARG_CHARS or "\0" in arg:
            raise Refused(f"run_tests: an argument over {MAX_ARG_CHARS} characters or with a NUL")
    return args


def code_of(code: str) -> bytes:
    data = code.encode("utf-8", "surrogatepass")
    if len(data) > MAX_CODE_BYTES:
        raise Refused(f"run_python: code over {MAX_CODE_BYTES} bytes")
    return data


# --- bounded output ---------------------------------------------------------------------------


@dataclass
class Bounded:
    """At most ``limit`` bytes of a stream — its first ones, or its last ones when ``tail``
    (a test run's summary is at its end) — and how many there were in all."""

    limit: int = OUTPUT_BYTES
    tail: bool = False
    kept: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, data: bytes | bytearray) -> None:
        self.total += len(data)
        if self.tail:
            self.kept += data
            del self.kept[: max(0, len(self.kept) - self.limit)]
            return
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.kept)

    def text(self) -> str:
        text = self.kept.decode("utf-8", "replace")
        if not self.truncated:
            return text
        which = "last" if self.tail else "first"
        said = f"[… truncated: {self.total} bytes in all, the {which} {len(self.kept)} kept]"
        return f"{said}\n{text}" if self.tail else f"{text}\n{said}"


# --- reports ----------------------------------------------------------------------------------


def lint_findings(report: str, root: str) -> dict[str, Any]:
    """ruff's ``--output-format json`` as ``{findings, total, truncated}``, each finding
    ``{file, line, column, code, message, fixable}`` with the file relative to ``root``."""
    try:
        raw = json.loads(report or "[]")
    except ValueError as exc:
        raise Refused(f"lint: ruff's report is not JSON: {exc}") from exc
    findings = []
    for item in raw if isinstance(raw, list) else []:
        location = item.get("location") or {}
        filename = str(item.get("filename") or "")
        if filename.startswith(root.rstrip("/") + "/"):
            filename = filename[len(root.rstrip("/")) + 1 :]
        findings.append(
            {
                "file": filename,
                "line": int(location.get("row") or 0),
                "column": int(location.get("column") or 0),
                "code": item.get("code") or "",
                "message": str(item.get("message") or ""),
                "fixable": item.get("fix") is not None,
            }
        )
    findings.sort(key=lambda f: (f["file"], f["line"], f["column"], f["code"]))
    return {
        "findings": findings[:LINT_FINDINGS],
        "total": len(findings),
        "truncated": len(findings) > LINT_FINDINGS,
    }


def first_lines(text: str) -> str:
    lines = text.strip("\n").splitlines()[:FAILURE_MESSAGE_LINES]
    return "\n".join(lines)[:FAILURE_MESSAGE_CHARS]


def installed_of(report: str) -> list[dict[str, str]]:
    """pip's ``--report`` (JSON): what it installed, as ``{name, version}``."""
    try:
        raw = json.loads(report)
    except ValueError:
        return []
    installed = []
    for item in raw.get("install", []) if isinstance(raw, dict) else []:
        metadata = item.get("metadata") or {}
        name, version = str(metadata.get("name")), str(metadata.get("version"))
        installed.append({"name": name, "version": version})
    return sorted(installed, key=lambda item: item["name"].lower())
