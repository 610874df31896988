"""The operators' commands: ``audit`` (read, follow, verify the trail) and ``sessions`` (list
and end the live sessions of a running orchestrator).

``audit`` reads the files directly (no orchestrator needed); ``sessions`` asks the running
orchestrator's ``/api/sessions`` with the token it finds as the bridge does (``--token``,
``REACTOR_FABRIC_TOKEN``, else the token file).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from ._cli_shared import EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE
from .config.structs import Suite
from .config.token import TokenError, find_token
from .config.units import parse_duration
from .config.xdg import xdg_dir
from .observe.audit import AuditWriter, audit_files, file_start, read_records, verify
from .observe.status import record_user

# The port an orchestrator listens on when told nothing (serve's --port).
DEFAULT_PORT = 8765
# The default port's trail keeps the name it had before each instance had a trail of its own,
# so an existing trail goes on (its chain, the scripts that read it); other ports' are
# audit-PORT.jsonl beside it (docs/OPERATIONS.md, the audit trail).
AUDIT_FILE = "audit.jsonl"
MAX_PORT = 65535
_PORT_TRAIL = re.compile(r"audit-([1-9][0-9]{0,4})\.jsonl")
FOLLOW_POLL_SECONDS = 0.5
REQUEST_TIMEOUT_SECONDS = 10.0


def state_dir(environ: Mapping[str, str]) -> Path:
    """``${XDG_STATE_HOME:-~/.local/state}/reactor-fabric``: where default trails live."""
    return xdg_dir(environ, "XDG_STATE_HOME", ".local/state")


def audit_file_name(port: int) -> str:
    """The default trail's name of the orchestrator listening on ``port``: each instance of a
    user writes its own (only one may write a trail), keyed by the port users know it by."""
    return AUDIT_FILE if port == DEFAULT_PORT else f"audit-{port}.jsonl"


def audit_path(suite: Suite | None, environ: Mapping[str, str], port: int = DEFAULT_PORT) -> Path:
    """Where the trail of the orchestrator on ``port`` is: the suite's
    ``orchestrator.audit.path``, else :func:`audit_file_name` in :func:`state_dir`."""
    configured = suite.orchestrator.audit.path if suite is not None else None
    if configured:
        home = environ.get("HOME") or str(Path.home())
        return Path(configured.replace("~", home, 1) if configured.startswith("~") else configured)
    return state_dir(environ) / audit_file_name(port)


def found_trails(directory: Path) -> list[tuple[int, Path]]:
    """Every instance's default trail in ``directory``: (port, its current file), by port. A
    trail whose current file is gone but rotated ones remain is found by those."""
    ports: set[int] = set()
    try:
        names = [entry.name for entry in directory.iterdir()]
    except OSError:
        return []
    for name in names:
        stem = name.split(".jsonl", 1)[0] + ".jsonl" if ".jsonl" in name else name
        if stem == AUDIT_FILE:
            ports.add(DEFAULT_PORT)
        elif (match := _PORT_TRAIL.fullmatch(stem)) and int(match.group(1)) <= MAX_PORT:
            ports.add(int(match.group(1)))
    trails = [(port, directory / audit_file_name(port)) for port in sorted(ports)]
    return [(port, path) for port, path in trails if audit_files(path)]


def open_audit(
    suite: Suite, environ: Mapping[str, str], port: int = DEFAULT_PORT
) -> AuditWriter | None:
    """The trail's writer for the orchestrator listening on ``port``, opened (None when the
    suite turns the trail off); OSError if it cannot be written (AuditInUse: another
    orchestrator writes it, e.g. one given the same orchestrator.audit.path)."""
    settings = suite.orchestrator.audit
    if not settings.enabled:
        return None
    writer = AuditWriter(
        audit_path(suite, environ, port), max_bytes=settings.max_bytes, keep=settings.keep
    )
    writer.open()
    return writer


def add_operator_commands(commands: Any, environ: dict[str, str]) -> None:
    audit = commands.add_parser(
        "audit",
        help="read the audit trail (filters, --follow, --json), 'audit verify' its chain, or "
        "'audit list' every instance's trail",
    )
    audit.add_argument(
        "action",
        nargs="?",
        choices=["verify", "list"],
        help="verify: check every line's hash chain; list: the trails of every instance (port)",
    )
    audit.add_argument(
        "--path", help="the trail's file (default: the suite's orchestrator.audit.path, else "
        "the default trail of the orchestrator on --port, in "
        "${XDG_STATE_HOME:-~/.local/state}/reactor-fabric/)",
    )  # fmt: skip
    audit.add_argument(
        "--port",
        dest="audit_port",
        metavar="PORT",
        type=int,
        default=None,
        help="the trail of the orchestrator listening on this port (default: the serve "
        "command's --port, env REACTOR_FABRIC_PORT, else 8765)",
    )
    audit.add_argument(
        "--all",
        dest="all_trails",
        action="store_true",
        help="verify: every instance's trail in the state directory",
    )
    audit.add_argument("--session", help="only this session's records")
    audit.add_argument("--service", help="only this service's records")
    audit.add_argument("--tool", help="only calls of this tool")
    audit.add_argument("--user", help="only records of this signed-in user (auth.mode: oidc)")
    audit.add_argument("--since", help="only records of the last DURATION, e.g. 10m, 2h")
    audit.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    audit.add_argument("--json", action="store_true", help="print records as JSON lines")
    sessions = commands.add_parser(
        "sessions", help="list the live sessions of a running orchestrator, or --end one"
    )
    sessions.add_argument(
        "--url",
        default=environ.get("REACTOR_FABRIC_URL", "http://127.0.0.1:8765"),
        help="the orchestrator (env REACTOR_FABRIC_URL; default http://127.0.0.1:8765)",
    )
    sessions.add_argument("--end", metavar="ID", help="end this session")
    sessions.add_argument("--user", help="only this signed-in user's sessions")
    sessions.add_argument("--json", action="store_true", help="print the JSON answer as it is")
    sessions.add_argument("--token", default=None, help="the token (default: as the bridge)")


# --- audit ---------------------------------------------------------------------------------------


def audit_command(
    args: argparse.Namespace,
    suite: Suite | None,
    environ: Mapping[str, str],
    serve_port: int = DEFAULT_PORT,
) -> int:
    """``audit``: the trail of ``--path``, else of the orchestrator on ``--port`` (default
    ``serve_port``: the serve command's own --port); ``list`` and ``verify --all``: every
    instance's default trail."""
    if args.action == "list" or args.all_trails:
        return _every_trail(args, state_dir(environ))
    path = _trail(args, suite, environ, serve_port)
    if path is None:
        return EXIT_INVALID
    if args.action == "verify":
        return _verify(path)
    return _show(args, path)


def _show(args: argparse.Namespace, path: Path) -> int:
    """``audit`` (no action): the records of the trail at ``path`` that pass the filters."""
    try:
        since = _since(args.since)
    except ValueError as exc:
        print(f"error: --since: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if not audit_files(path) and not args.follow:
        print(f"error: no audit trail at {path}", file=sys.stderr)
        return EXIT_UNREADABLE

    def wanted(record: dict[str, Any]) -> bool:
        return (
            (args.session is None or str(record.get("session", "")).startswith(args.session))
            and (args.service is None or record.get("service") == args.service)
            and (args.tool is None or record.get("tool") == args.tool)
            and (args.user is None or record_user(record) == args.user)
            and (since is None or _when(record) >= since)
        )

    try:
        records = _follow(path) if args.follow else read_records(path)
        for record in records:
            if wanted(record):
                line = json.dumps(record) if args.json else _human(record)
                print(line, flush=args.follow)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        # The reader (e.g. head) went away; nothing more to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def _trail(
    args: argparse.Namespace, suite: Suite | None, environ: Mapping[str, str], serve_port: int
) -> Path | None:
    """The one trail ``audit`` reads: ``--path``, else the trail of the orchestrator on
    ``--port`` (default ``serve_port``); None, said, for a port no orchestrator listens on."""
    if args.path:
        return Path(args.path)
    port = args.audit_port if args.audit_port is not None else serve_port
    if not 0 < port <= MAX_PORT:
        print(
            f"error: no trail for port {port}: give the port the orchestrator listens on "
            "(its start-up line says it), or see 'audit list'",
            file=sys.stderr,
        )
        return None
    return audit_path(suite, environ, port)


def _every_trail(args: argparse.Namespace, directory: Path) -> int:
    """``audit list`` or ``audit verify --all``: each default trail in ``directory`` by port;
    verify exits with the worst of its trails' codes."""
    action = args.action
    if args.all_trails and action != "verify":
        print("error: --all is for 'audit verify'; 'audit list' names every trail", file=sys.stderr)
        return EXIT_INVALID
    if args.path or args.audit_port is not None:
        print("error: 'audit list' and --all take no --path or --port", file=sys.stderr)
        return EXIT_INVALID
    trails = found_trails(directory)
    if not trails:
        print(f"error: no audit trail in {directory}", file=sys.stderr)
        return EXIT_UNREADABLE
    if action == "list":
        for port, path in trails:
            files = audit_files(path)
            size = sum(file.stat().st_size for file in files if file.exists())
            print(f"port {port}  {path}  {len(files)} file(s), {size} bytes")
        return EXIT_OK
    worst = EXIT_OK
    for port, path in trails:
        print(f"port {port}:")
        worst = max(worst, _verify(path))
    return worst


def _verify(path: Path) -> int:
    result = verify(path)
    if not result.files:
        print(f"error: no audit trail at {path}", file=sys.stderr)
        return EXIT_UNREADABLE
    for problem in result.problems:
        print(problem)
    where = ", ".join(str(file) for file in result.files)
    if result.starts_after is not None:
        away = f"{result.rotated_away} file(s)" if result.rotated_away else "files"
        print(
            f"note: the oldest line follows {away} rotated away (the last line they had hashes "
            f"to {result.starts_after[:12]}…)"
        )
    if result.head_unproven is not None:
        print(
            f"note: {result.head_unproven} was written before files began with a file_start "
            "record: lines cut from its head would look the same as files rotated away"
        )
    if result.intact:
        print(f"ok: {result.records} records, chain intact ({where})")
        return EXIT_OK
    print(f"FAILED: {len(result.problems)} problem(s) in {result.records} records ({where})")
    return EXIT_INVALID


def _since(text: str | None) -> datetime.datetime | None:
    if text is None:
        return None
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=parse_duration(text))


def _when(record: dict[str, Any]) -> datetime.datetime:
    try:
        return datetime.datetime.fromisoformat(str(record.get("ts")))
    except ValueError:
        return datetime.datetime.min.replace(tzinfo=datetime.UTC)


def _human(record: dict[str, Any]) -> str:
    """One record as a line for a terminal, every field escaped (see :func:`_printable`)."""
    event = _printable(record.get("event"))
    parts = [_printable(record.get("ts")), f"{event:<16}"]
    if "session" in record:
        parts.append(f"session={_printable(str(record['session'])[:12])}")
    for key in ("endpoint", "service", "tool", "outcome", "reason", "container", "image"):
        value = record.get(key)
        if value not in (None, ""):
            parts.append(f"{key}={_printable(value)}")
    if record.get("error_code") is not None:
        parts.append(f"error={_printable(record['error_code'])}")
    elif record.get("error_reason"):
        parts.append(f"error={_printable(record['error_reason'])}")
    parts.extend(
        f"{record[key]:.1f} ms" if isinstance(record[key], int | float) else _printable(record[key])
        for key in ("duration_ms", "start_ms")
        if key in record
    )
    client = record.get("client")
    if isinstance(client, dict) and event in ("session_start", "session_refused"):
        peer, transport = client.get("peer", ""), client.get("transport", "")
        parts.append(f"client={_printable(peer)}/{_printable(transport)}")
    if record_user(record) is not None:
        parts.append(f"user={_printable(record_user(record))}")
    if event == "session_start":
        mounts = record.get("mounts")
        shown = ",".join(
            f"{_printable(m.get('source'))}:{_printable(m.get('target'))}"
            for m in (mounts if isinstance(mounts, list) else [])
            if isinstance(m, dict)
        )
        parts.append(f"mounts={shown or 'none'}")
    if event == "audit_dropped":
        parts.append(f"count={_printable(record.get('count'))}")
    if event == "tools_changed":
        parts.extend(_tool_changes(record))
    return " ".join(parts)


def _tool_changes(record: dict[str, Any]) -> list[str]:
    """A tools_changed record's names, per kind of change (each escaped): what to look at."""
    shown = []
    for kind in ("added", "removed", "changed"):
        names = record.get(kind)
        if not isinstance(names, list) or not names:
            continue
        labels = [
            _printable(name.get("tool") if isinstance(name, dict) else name) for name in names
        ]
        shown.append(f"{kind}={','.join(labels)}")
    return shown


# What a terminal would act on or show as a line break, rather than print: C0 and C1 controls
# (newlines, ESC sequences), format characters (bidirectional overrides, zero-width), line
# and paragraph separators, and lone surrogates (JSON may carry them; a terminal cannot take
# them). Backslashes are escaped too, so that an escape seen is one made.
_UNPRINTABLE: Final = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def _printable(value: object) -> str:
    """``value`` as text a terminal shows as it is: a client chooses tool names, request ids,
    peers' user agents…, and must not forge a line or send the terminal a command."""
    text = str(value)
    if text.isprintable() and "\\" not in text:
        return text  # the usual case, at C speed
    escaped = []
    for character in text:
        if character == "\\":
            escaped.append("\\\\")
        elif unicodedata.category(character) in _UNPRINTABLE:
            escaped.append(character.encode("unicode_escape").decode("ascii"))
        else:
            escaped.append(character)
    return "".join(escaped)


def _follow(path: Path) -> Iterator[dict[str, Any]]:
    """Every record, then new ones as they are written (across rotations) until interrupted."""
    yield from read_records(path)
    position, identity = _end_of(path)
    while True:
        time.sleep(FOLLOW_POLL_SECONDS)
        current = _identity(path)
        if current != identity:
            # Rotated: the rest of the old file is now audit.jsonl.1; then the new file.
            if identity is not None:
                yield from _records_from(path.with_name(path.name + ".1"), position)
            position, identity = 0, current
        if identity is None:
            continue
        for record, end in _records_with_end(path, position):
            position = end
            yield record


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


def _end_of(path: Path) -> tuple[int, tuple[int, int] | None]:
    try:
        return path.stat().st_size, _identity(path)
    except FileNotFoundError:
        return 0, None


def _records_from(path: Path, position: int) -> Iterator[dict[str, Any]]:
    for record, _end in _records_with_end(path, position):
        yield record


def _records_with_end(path: Path, position: int) -> Iterator[tuple[dict[str, Any], int]]:
    try:
        with path.open("rb") as file:
            file.seek(position)
            while True:
                line = file.readline()
                if not line.endswith(b"\n"):
                    return  # nothing more, or a line still being written
                position += len(line)
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    continue  # not a record, or nested too deep to read (verify reports it)
                if isinstance(record, dict) and file_start(record) is None:
                    yield record, position  # (a file's file_start is no event: as read_records)
    except FileNotFoundError:
        return


# --- sessions ------------------------------------------------------------------------------------


def sessions_command(args: argparse.Namespace, environ: dict[str, str]) -> int:
    try:
        found = find_token(environ, args.token)
    except TokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    headers = {"Authorization": f"Bearer {found.value}"} if found is not None else {}
    base = args.url.rstrip("/")
    if args.end:
        url = f"{base}/api/sessions/{urllib.parse.quote(args.end, safe='')}"
        status, body = _request(url, "DELETE", headers)
        if status == 200:
            print(f"ended {args.end}: its client was told, its containers are being removed")
            return EXIT_OK
        print(f"error: {body.get('error', status)} ({args.end})", file=sys.stderr)
        return EXIT_INVALID
    status, body = _request(f"{base}/api/sessions", "GET", headers)
    if status != 200:
        print(f"error: {body.get('error', status)}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps(body, indent=2))
        return EXIT_OK
    sessions = [
        session
        for session in body.get("sessions", [])
        if args.user is None or (session.get("client") or {}).get("user") == args.user
    ]
    if not sessions:
        print("no live sessions")
    for session in sessions:
        client = session.get("client") or {}
        containers = ", ".join(f"{c['service']} {c['id']}" for c in session["containers"])
        mounts = ", ".join(
            f"{m['source']}:{m['target']}{':ro' if m['read_only'] else ''}"
            for m in session["mounts"]
        )
        user = f"user={_printable(client['user'])}  " if client.get("user") else ""
        print(
            f"{session['id']}  {session['endpoint']}/{session['service']}  {user}"
            f"{client.get('peer', '?')} {session['transport']}  "
            f"idle {session['idle_seconds']:.0f} s  containers: {containers or 'none'}  "
            f"mounts: {mounts or 'none'}"
        )
    return EXIT_OK


def _request(url: str, method: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            body = {}
        return exc.code, body if isinstance(body, dict) else {}
    except (urllib.error.URLError, OSError) as exc:
        return 0, {"error": f"cannot reach the orchestrator at {url}: {exc}"}
