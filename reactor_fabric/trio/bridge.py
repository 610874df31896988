"""The stdio bridge: ``reactor-fabric connect`` — a local stdio MCP server that is the orchestrator.

Clients that can only launch a local command (Claude Desktop, Claude Code, many IDEs) start the
bridge as their MCP server. It connects to the orchestrator over WebSocket, registers the
client's project directory with ``fabric/registerClient`` (the current directory, mounted at
``/workspace``, unless told otherwise), and then relays: one stdin line → one text frame, one
frame → one stdout line. Everything else — the container, the mounts' validation, idle teardown —
happens in the orchestrator, exactly as for any other session.

Ownership: one nursery with two relay tasks; when either direction ends (stdin EOF, the server
closing, a signal) the other is cancelled and the WebSocket is closed.

Error handling, as the client sees it: a refused registration (bad mount, unknown service, full
orchestrator) is the JSON-RPC error answering the client's own requests (its ``initialize``, and
a dual client's ``server/discover`` probe before it), so the client shows the orchestrator's
code and reason; the bridge prints one plain line on stderr and exits 1 once the client hangs
up. When the orchestrator cannot be reached, the bridge prints
the documented warning and runs the service's ``local_command`` in its place (``exec``: the
client then talks to that command directly) — taken only from the user's own configuration
(``connect --config FILE``, or ``~/.config/reactor-fabric/`` with ``~`` from the password
database), never from a suite in the working directory, which is the client's possibly untrusted
project, nor from a place the environment names (its client configuration can set that). With
no such command the client's requests are answered with -32002 ``orchestrator_unreachable``.
No traceback ever reaches stderr: unexpected failures are one line too.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import signal
import socket
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)
from wsproto.utilities import LocalProtocolError

from .._errors import ContainerStartFailure, InvalidMessage, SecurityViolation
from .._reasons import (
    CONNECTION_CLOSED,
    LISTENER_NOT_YOURS,
    ORCHESTRATOR_UNREACHABLE,
    TOKEN_MISSING,
    http_status,
)
from ..config.hosts import is_loopback_name as is_loopback
from ..config.suite import FABRIC_ENDPOINT, SuiteUnreadable, load_suite
from ..policy.listener_owner import Endpoint, read_connection_owner, trusted_owner
from ..policy.mounts import parse_query_mount
from ..protocol.framing import LineSplitter
from ..protocol.jsonrpc import REQUEST, peek

DEFAULT_TARGET = "/workspace"
MAX_MESSAGE = 16 * 1024 * 1024
CONNECT_BOUND_SECONDS = 10.0
# How long a refused bridge goes on answering its client's requests with the error.
REFUSED_ANSWER_BOUND_SECONDS = 30.0
FALLBACK_WARNING = (
    "Warning: Could not connect to Reactor-Fabric at {endpoint}. Falling back to standalone mode."
)


class BridgeError(Exception):
    """Something the user must fix; printed on stderr, exit code 1."""


@dataclass(frozen=True)
class BridgeSettings:
    endpoint: str
    service: str
    mounts: list[dict[str, object]]
    config: str | None
    token: str | None = None  # sent as Authorization: Bearer (see find_bridge_token)
    token_origin: str | None = None  # where the token was found, for a refusal's detail
    token_places: str = ""  # where the bridge looks for one, in words (same)
    # Accounts besides the user's own and root whose loopback listener is the orchestrator
    # (connect --orchestrator-user: an orchestrator run as a service account).
    trusted_uids: tuple[int, ...] = ()
    # auth.mode: oidc — how the user signs in when the orchestrator asks (trio/sign_in_client:
    # "browser", falling back to the device flow without one; "device"; "none": only a
    # sign-in kept from before, e.g. by `reactor-fabric login`).
    login: str = "browser"


def service_url(endpoint: str, service: str | None) -> tuple[str, str]:
    """The WebSocket URL of ``service`` and the service name, from an endpoint in any form.

    Accepted: ``ws://host:port`` (with ``service``), ``ws://host:port/mcp/NAME``, and the same
    with ``http``/``https`` (turned into ``ws``/``wss``). Without a service: the fabric
    endpoint ``/mcp`` (every service of the suite in one MCP server). Pure.
    """
    parts = urlsplit(endpoint)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise BridgeError(f"{endpoint!r} is not a ws:// or http:// URL of the orchestrator")
    path = parts.path.rstrip("/")
    if path.startswith("/mcp/"):
        named = path.removeprefix("/mcp/")
        if service is not None and service != named:
            raise BridgeError(f"the URL names service {named!r} but --service says {service!r}")
        service = named
    elif path not in ("", "/mcp"):
        raise BridgeError(f"{endpoint!r}: expected ws://HOST:PORT or ws://HOST:PORT/mcp/SERVICE")
    if not service or service == FABRIC_ENDPOINT:
        return urlunsplit((scheme, parts.netloc, "/mcp", "", "")), FABRIC_ENDPOINT
    return urlunsplit((scheme, parts.netloc, f"/mcp/{quote(service)}", "", "")), service


def dialled_port(url: str) -> int | None:
    """The port whose token record (config.token_record) the bridge may use for ``url``: only
    for an orchestrator on this machine's loopback, since a record is a local orchestrator's
    token and must never be sent to another machine that happens to use the same port. Pure."""
    parts = urlsplit(url)
    if parts.hostname is None or not is_loopback(parts.hostname):
        return None
    try:
        return _port(url)
    except ValueError:
        return None


def mounts_from(arguments: Sequence[str], *, no_mount: bool, cwd: Path) -> list[dict[str, object]]:
    """The mounts to register: ``--mount`` values, else the current directory at /workspace."""
    if no_mount:
        return []
    if not arguments:
        return [{"source": str(cwd), "target": DEFAULT_TARGET, "readOnly": False}]
    mounts: list[dict[str, object]] = []
    for text in arguments:
        mount = parse_query_mount(text)
        source = Path(str(mount["source"])).expanduser()
        mount["source"] = str(source if source.is_absolute() else (cwd / source).resolve())
        mounts.append(mount)
    return mounts


class Refused(Exception):
    """The orchestrator answered the registration with a JSON-RPC error."""

    def __init__(self, error: dict[str, Any]) -> None:
        raw = error.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        # The message already says what happened in words (see reactor_fabric._errors).
        super().__init__(
            f"the orchestrator refused the session: {error.get('message')} ({data.get('reason')})"
        )
        self.error = error


async def run_bridge(settings: BridgeSettings, url: str) -> int:
    """Relay stdin/stdout through the orchestrator; the process exit code (-1: unreachable).

    An orchestrator whose users sign in (its 401 names its resource metadata) gets the user's
    access token (:mod:`.sign_in_client`): a kept one first, and when that is refused a fresh
    sign-in, once."""
    signed_in = 0
    while True:
        rejected: list[ConnectionRejected] = []
        try:
            return await _run_bridge(settings, url)
        except* ConnectionRejected as group:
            # trio-websocket raises a refused handshake from its reader task, in our nursery.
            rejected.extend(e for e in _leaves(group) if isinstance(e, ConnectionRejected))
        metadata = _challenge_metadata(rejected[0])
        if metadata is None or signed_in >= 2:
            break
        try:
            token = await _signed_in(settings, url, metadata, fresh=signed_in > 0)
        except SignInFailed as exc:
            refusal = Refused(SecurityViolation(str(exc), reason=TOKEN_MISSING).to_jsonrpc_error())
            print(f"reactor-fabric connect: {exc}", file=sys.stderr, flush=True)
            await _answer_from_stdio(refusal.error)
            return 1
        signed_in += 1
        settings = replace(settings, token=token, token_origin="your sign-in")  # noqa: S106
    if rejected[0].status_code not in (401, 403):
        return -1  # not an orchestrator that answers us: the caller falls back
    # The orchestrator is there and said no (token, origin): never run anything in its place.
    refusal = Refused(_rejection_error(rejected[0], settings))
    print(f"reactor-fabric connect: {refusal}", file=sys.stderr, flush=True)
    await _answer_from_stdio(refusal.error)
    return 1


class SignInFailed(Exception):
    """The user could not be signed in (the message says why and what to do)."""


def _challenge_metadata(rejected: ConnectionRejected) -> str | None:
    """The resource metadata a 401 names (an orchestrator whose users sign in), if any."""
    if rejected.status_code != 401:
        return None
    from .sign_in_client import resource_metadata_url  # noqa: PLC0415 (httpx: oidc only)

    for name, value in rejected.headers or ():
        if name.lower() == b"www-authenticate":
            found = resource_metadata_url(value.decode("latin-1"))
            if found is not None:
                return found
    return None


async def _signed_in(settings: BridgeSettings, url: str, metadata: str, *, fresh: bool) -> str:
    """The user's access token for the orchestrator at ``url`` (see :mod:`.sign_in_client`)."""
    from .sign_in_client import SignInClient, SignInError  # noqa: PLC0415 (httpx: oidc only)

    def notify(line: str) -> None:
        print(f"reactor-fabric connect: {line}", file=sys.stderr, flush=True)

    login = settings.login if settings.login in ("browser", "device", "none") else "browser"
    client = SignInClient(dict(os.environ), url, login=login, notify=notify)  # type: ignore[arg-type]
    try:
        return await client.access_token(metadata, fresh=fresh)
    except SignInError as exc:
        raise SignInFailed(f"signing in failed: {exc}") from exc


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


async def _run_bridge(settings: BridgeSettings, url: str) -> int:
    relayed: list[int] = []  # the relay's outcome, once it has one
    try:
        return await _bridge_session(settings, url, relayed)
    except* LocalProtocolError:
        # A keepalive ping that crossed our Close: trio-websocket answers it with a pong that
        # wsproto refuses to send while closing (python-trio/trio-websocket#184), from its
        # reader task. The session was over by then; anything earlier is a real error.
        if not relayed:
            raise
    return relayed[0]


async def _bridge_session(settings: BridgeSettings, url: str, relayed: list[int]) -> int:
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    async with stdin, stdout, trio.open_nursery() as nursery:
        headers: list[tuple[bytes, bytes]] = []
        if settings.token is not None:
            headers.append((b"authorization", f"Bearer {settings.token}".encode()))
        try:
            with trio.fail_after(CONNECT_BOUND_SECONDS):
                stream = await open_orchestrator_stream(url, settings.trusted_uids)
                try:
                    ws = await wrap_client_stream(
                        nursery,
                        stream,
                        _host_header(url),
                        _resource(url),
                        subprotocols=["mcp"],
                        extra_headers=headers,
                        max_message_size=MAX_MESSAGE,
                    )
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except ConnectionRejected:
            raise  # see run_bridge
        except NotYourOrchestrator as refusal:
            print(f"reactor-fabric connect: {refusal}", file=sys.stderr, flush=True)
            await answer_requests(stdin, stdout, refusal.error)
            return 1
        except (
            OSError,
            HandshakeError,
            trio.TooSlowError,
            ConnectionClosed,
            trio.BrokenResourceError,
        ):
            return -1  # unreachable: the caller falls back
        try:
            await _register(ws, settings)
        except Refused as refusal:
            print(f"reactor-fabric connect: {refusal}", file=sys.stderr, flush=True)
            await answer_requests(stdin, stdout, refusal.error)
            return 1
        try:
            relayed.append(await _relay(ws, stdin, stdout))
            return relayed[0]
        finally:
            # The closing handshake, bounded, and not shielded: the one thing that cancels this
            # nursery is trio-websocket's reader failing (see _run_bridge), after which no
            # handshake can complete; its socket is closed all the same (aclose's finally).
            with trio.move_on_after(5):
                await ws.aclose()
            nursery.cancel_scope.cancel()


class NotYourOrchestrator(Refused):
    """The loopback listener the bridge reached belongs to another user: nothing was sent."""

    def __init__(self, found: list[tuple[Endpoint, int | None]]) -> None:
        listeners = ", ".join(
            f"{where} (uid {owner})" if owner is not None else f"{where} (owner unknown)"
            for where, owner in found
        )
        detail = (
            f"the listener at {listeners} is not your orchestrator: it belongs to another user "
            "than you or root, so the bridge sent it nothing (no token, no mount, no message). "
            "Another local user may be holding the port while your orchestrator is not running: "
            "start it, or use another port; for an orchestrator run as another account, name "
            "that account with --orchestrator-user"
        )
        super().__init__(SecurityViolation(detail, reason=LISTENER_NOT_YOURS).to_jsonrpc_error())
        self.detail = detail

    def __str__(self) -> str:
        return self.detail


async def open_orchestrator_stream(
    url: str, trusted_uids: Sequence[int] = ()
) -> trio.SocketStream | trio.SSLStream[trio.SocketStream]:
    """A connection to the orchestrator at ``url`` on which nothing has been sent yet.

    On loopback a port is not a credential: while the orchestrator is not running anyone may
    bind it, and ``[::1]:PORT`` is a socket of its own beside ``127.0.0.1:PORT`` (and is what
    ``localhost`` resolves to first on Debian and Ubuntu). So for a loopback host each of its
    loopback addresses is tried in turn, and a connection is kept only when the kernel says
    the socket that accepted it belongs to the user, root or a ``trusted_uids`` account
    (:mod:`reactor_fabric.policy.listener_owner`); another's is closed unused. Raises
    :class:`NotYourOrchestrator` when only others' listeners answered, OSError when nothing
    did. Other hosts are dialled as given (their token comes only from the environment).
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = _port(url)
    context = ssl.create_default_context() if parts.scheme == "wss" else None
    if not is_loopback(host):
        if context is not None:
            return await trio.open_ssl_over_tcp_stream(
                host, port, ssl_context=context, https_compatible=True
            )
        return await trio.open_tcp_stream(host, port)
    stream = await _owned_loopback_connection(host, port, trusted_uids)
    if context is None:
        return stream
    tls = trio.SSLStream(stream, context, server_hostname=host, https_compatible=True)
    try:
        await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(tls)
        raise
    return tls


async def _owned_loopback_connection(
    host: str, port: int, trusted_uids: Sequence[int]
) -> trio.SocketStream:
    found: list[tuple[Endpoint, int | None]] = []
    failure: OSError | None = None
    tried: set[tuple[Any, ...]] = set()
    for family, kind, proto, _, address in await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    ):
        if address in tried or not ipaddress.ip_address(str(address[0])).is_loopback:
            continue  # (a loopback name that resolves elsewhere is not dialled there)
        tried.add(address)
        sock = trio.socket.socket(family, kind, proto)
        try:
            await sock.connect(address)
            server, client = Endpoint.of(sock.getpeername()), Endpoint.of(sock.getsockname())
            owner = await trio.to_thread.run_sync(read_connection_owner, server, client)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        if trusted_owner(owner, own_uid=os.geteuid(), also=trusted_uids):
            return trio.SocketStream(sock)
        sock.close()  # another user's listener: it gets nothing but the TCP handshake
        found.append((server, owner))
    if found:
        raise NotYourOrchestrator(found)
    raise failure or OSError(f"no loopback address for {host!r}")


def _port(url: str) -> int:
    """The port ``url`` dials: its own, else its scheme's (ValueError: not a port)."""
    parts = urlsplit(url)
    if parts.port is not None:
        return parts.port
    return 443 if parts.scheme in ("wss", "https") else 80


def _host_header(url: str) -> str:
    """The Host header for ``url``: the host as written (an IPv6 address in brackets), with
    the port unless it is the scheme's default."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    default = 443 if parts.scheme == "wss" else 80
    return host if parts.port in (None, default) else f"{host}:{parts.port}"


def _resource(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


async def _register(ws: WebSocketConnection, settings: BridgeSettings) -> None:
    request = {
        "jsonrpc": "2.0",
        "id": "reactor-fabric-connect",
        "method": "fabric/registerClient",
        "params": {"mounts": settings.mounts},
    }
    await ws.send_message(json.dumps(request))
    try:
        answer = json.loads(await ws.get_message())
    except ConnectionClosed as exc:
        raise Refused(
            _bridge_error(
                f"the orchestrator closed the connection ({exc.reason})", CONNECTION_CLOSED
            )
        ) from exc
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        raise Refused(answer["error"])


def _rejection_error(rejected: ConnectionRejected, settings: BridgeSettings) -> dict[str, Any]:
    """The JSON-RPC error standing for a refused WebSocket handshake: the one in its body (a
    missing or wrong token), else one made from the status (403: Origin or Host)."""
    try:
        body = json.loads(rejected.body or b"{}")
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("data"), dict):
        detail = f"the orchestrator refused the connection (HTTP {rejected.status_code})"
        if rejected.status_code == 403:
            detail += ": its Origin or Host is not allowed (see orchestrator.allowed_origins)"
        error = SecurityViolation(
            detail, reason=http_status(rejected.status_code)
        ).to_jsonrpc_error()
    if rejected.status_code == 401:
        # The orchestrator's own words are about headers and URLs; through the bridge, the
        # user needs to know where the bridge looked. That goes in the message, the one line
        # many clients show.
        what = (
            f"the orchestrator refused the token from {settings.token_origin}"
            if settings.token_origin is not None
            else "the orchestrator needs a token and the bridge found none"
        )
        reason = str(error["data"].get("reason") or http_status(rejected.status_code))
        error = SecurityViolation(
            f"{what}; the bridge looks in {settings.token_places}", reason=reason
        ).to_jsonrpc_error()
    return error


def _bridge_error(detail: str, reason: str) -> dict[str, Any]:
    return ContainerStartFailure(detail, reason=reason).to_jsonrpc_error()


async def answer_requests(
    stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream, error: dict[str, Any]
) -> None:
    """Answer each request of the client with ``error`` until it hangs up (bounded in time).

    A client shows the error of a request it made; an error it never asked for, or a closed
    pipe, would read as "connection closed". Every request gets it, not only the first: dual
    clients (the Python SDK's ``mode="auto"``) probe with ``server/discover`` and fall back to
    ``initialize`` when that fails.
    """
    splitter = LineSplitter(max_line=MAX_MESSAGE)
    with trio.move_on_after(REFUSED_ANSWER_BOUND_SECONDS):
        while data := await stdin.receive_some(65536):
            for line in splitter.feed(bytes(data)):
                try:
                    message = peek(line)
                except InvalidMessage:
                    continue
                if message.kind == REQUEST:
                    answer = {"jsonrpc": "2.0", "id": message.id, "error": error}
                    await stdout.send_all(json.dumps(answer).encode() + b"\n")


async def _relay(
    ws: WebSocketConnection,
    stdin: trio.lowlevel.FdStream,
    stdout: trio.lowlevel.FdStream,
) -> int:
    outcome = 0

    async def client_to_server(scope: trio.CancelScope) -> None:
        splitter = LineSplitter(max_line=MAX_MESSAGE)
        while data := await stdin.receive_some(65536):
            for line in splitter.feed(data):
                await ws.send_message(line.decode("utf-8", "replace"))
        last = splitter.flush()
        if last is not None:
            await ws.send_message(last.decode("utf-8", "replace"))
        scope.cancel()  # EOF: the client is done

    async def server_to_client(scope: trio.CancelScope) -> None:
        nonlocal outcome
        try:
            while True:
                message = await ws.get_message()
                text = message if isinstance(message, str) else message.decode("utf-8", "replace")
                await stdout.send_all(text.encode() + b"\n")
        except ConnectionClosed as exc:
            code = exc.reason.code if exc.reason is not None else None
            if code not in (1000, 1001):
                why = exc.reason.reason if exc.reason is not None else ""
                print(
                    f"reactor-fabric connect: the orchestrator closed the connection "
                    f"({code} {why or ''})",
                    file=sys.stderr,
                )
                outcome = 1
        scope.cancel()

    async def on_signal(scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for _ in signals:
                scope.cancel()
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_to_server, nursery.cancel_scope)
        nursery.start_soon(server_to_client, nursery.cancel_scope)
        nursery.start_soon(on_signal, nursery.cancel_scope)
    return outcome


def own_config_dir() -> Path:
    """``~/.config/reactor-fabric`` of the user running the bridge, with ``~`` from the password
    database: not ``HOME`` nor ``XDG_CONFIG_HOME``, which a project's client configuration can
    set (a relative value even lands inside the project, whose cloned files are the user's)."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".config" / "reactor-fabric"


def fallback_suite(settings: BridgeSettings, home: Path | None = None) -> Path:
    """Where a ``local_command`` may come from: ``connect --config FILE``, else the suite in the
    user's own configuration directory (:func:`own_config_dir`, or ``home`` in tests). Never a
    suite found in the working directory — that is the client's project, possibly a freshly
    cloned, untrusted one — nor one the environment leads to (``REACTOR_FABRIC_CONFIG``,
    ``HOME``, ``XDG_CONFIG_HOME``), which a project's client configuration can set."""
    if settings.config is not None:
        return Path(settings.config)
    return (home or own_config_dir()) / "claude-mcp-suite.yaml"


def fallback_command(
    settings: BridgeSettings, home: Path | None = None
) -> tuple[list[str] | None, str]:
    """The service's trusted ``local_command`` and where it came from, or None and why not."""
    path = fallback_suite(settings, home)
    try:
        info = path.stat()
    except OSError:
        return None, f"no local fallback: {path} does not exist"
    if info.st_uid not in (os.getuid(), 0) or info.st_mode & 0o022:
        # Anyone else who may write the file could choose what runs on the host.
        return None, (
            f"no local fallback: {path} is writable by others than you "
            "(it must belong to you and not be group- or world-writable)"
        )
    try:
        suite = load_suite(path)
    except (SuiteUnreadable, Exception) as exc:  # noqa: BLE001 - no usable suite: no fallback
        return None, f"no local fallback: {path} is not a usable suite ({exc})"
    service = suite.mcp_services.get(settings.service)
    if service is None or not service.local_command:
        return None, f"no local fallback: {path} gives {settings.service!r} no `local_command`"
    return list(service.local_command), str(path)


def connect(settings: BridgeSettings) -> int:
    """Run the bridge; falls back to the local command when the orchestrator is unreachable."""
    url, _service = service_url(settings.endpoint, settings.service)
    failed: BaseException | None = None
    code = 1
    try:
        code = trio.run(run_bridge, settings, url)
    except* Exception as failure:  # noqa: BLE001 - reported, as one line
        failed = failure.exceptions[0]
    if failed is not None:
        # One plain line, never a traceback: stderr is what the user's client shows.
        print(f"reactor-fabric connect: {failed}", file=sys.stderr, flush=True)
        return 1
    if code >= 0:
        return code
    print(FALLBACK_WARNING.format(endpoint=settings.endpoint), file=sys.stderr, flush=True)
    command, origin = fallback_command(settings)
    if command is not None:
        print(
            f"reactor-fabric connect: running {settings.service!r} on this host, without a "
            f"container, as {origin} says: {' '.join(command)}",
            file=sys.stderr,
            flush=True,
        )
        os.execvp(command[0], command)  # noqa: S606 - the user's own configured command
    detail = (
        f"the orchestrator at {settings.endpoint} is not reachable and service "
        f"{settings.service!r} has {origin}; start the orchestrator: "
        f"`{start_command(settings.endpoint)}` (with --config FILE for your suite; "
        "`make run` in a checkout)"
    )
    trio.run(_answer_from_stdio, _bridge_error(detail, ORCHESTRATOR_UNREACHABLE))
    raise BridgeError(detail)


def start_command(endpoint: str, argv0: str | None = None) -> str:
    """How to start the orchestrator the bridge dials, as this installation runs it: the
    ``reactor-fabric`` program the bridge itself was started as (a client's configuration
    names it by its full path), else the module with this Python; with the endpoint's port
    (and host, unless it is the default's)."""
    program = argv0 if argv0 is not None else sys.argv[0]
    if Path(program).name == "reactor-fabric":
        command = program
    else:
        command = f"{sys.executable} -m reactor_fabric"
    parts = urlsplit(endpoint)
    if parts.hostname not in (None, "127.0.0.1", "localhost"):
        command += f" --host {parts.hostname}"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        command += f" --port {port}"
    return command


async def _answer_from_stdio(error: dict[str, Any]) -> None:
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    async with stdin, stdout:
        await answer_requests(stdin, stdout, error)
