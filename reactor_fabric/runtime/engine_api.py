"""A blocking client of Docker's Engine API (and Podman's compatible one), on h11.

Why our own: the calls the orchestrator makes are a score of plain JSON requests over a Unix
socket (or TCP), and docker-py brought requests, urllib3 and charset_normalizer with it — 9 MB
of an idle orchestrator's 53 and 80 ms of its start — plus a ``requests.Session`` per call
path. HTTP itself is h11's (the well-kept sans-I/O library wsproto already loads); what is
written here is only what a client of one server needs: a small pool of keep-alive
connections, each request's bounds, the engine's errors, and the attach's upgrade.

Every method blocks: :class:`~.docker_calls.DockerCalls` runs each in a worker thread, bounded,
never on trio's thread. A client is safe to share between threads (each request has a
connection of its own; idle ones are kept in a pool under a lock).

Error handling (one tree, mapped where the socket is used, as httpcore's ``map_exceptions``):

- the engine's refusals are :class:`EngineError` with its HTTP status and its own words
  (``explanation``: the answer's ``message``), :class:`NotFound` for 404 and
  :class:`ImageNotFound` for a 404 about an image;
- not reaching it (no socket, refused, reset, the time bound of a read or write, an answer
  that is not HTTP or is larger than :data:`MAX_ANSWER_BYTES`) is :class:`EngineUnreachable`
  (a ``ConnectionError``).

Resource handling: a connection whose request failed in any way is closed, never pooled again;
a connection is pooled only after its answer was read to the end and the server kept it
open; :meth:`EngineClient.close` closes the idle ones. The attach's connection is handed over
as a plain socket, which the caller owns.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import h11

from .engines import EngineAddressError

# An answer larger than this is refused (a container list of every container an engine ever
# had would be a few MB; a pull's progress a few hundred KB).
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024
# How many idle keep-alive connections are kept (DockerCalls runs at most 16 calls at once).
MAX_IDLE_CONNECTIONS: Final = 16
DEFAULT_UNIX_SOCKET: Final = "/var/run/docker.sock"
_READ_CHUNK: Final = 65536
_USER_AGENT: Final = "reactor-fabric"


class EngineError(Exception):
    """The engine answered with an error status; ``explanation`` is its own words."""

    def __init__(self, status_code: int, explanation: str) -> None:
        super().__init__(f"{status_code}: {explanation}")
        self.status_code = status_code
        self.explanation = explanation


class NotFound(EngineError):
    """404: no such container, volume or image."""


class ImageNotFound(NotFound):
    """404 about an image the engine does not have."""


class AttachNotHandedOver(EngineError):
    """The engine answered an attach without handing its connection over (neither the upgrade
    nor docker's hijack)."""


class EngineUnreachable(ConnectionError):
    """The engine was not reached, did not answer in time, or did not answer in HTTP."""


@dataclass(frozen=True)
class Answer:
    """One answer: its status and its body (JSON decoded when it is JSON)."""

    status: int
    body: bytes
    content_type: str

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class EngineAddress:
    """Where the engine listens: a Unix socket's path, or a TCP host and port (with TLS when
    ``tls`` is given)."""

    unix_path: str | None = None
    host: str = "localhost"
    port: int = 2375
    tls: ssl.SSLContext | None = None

    @classmethod
    def parse(cls, url: str | None, environ: Mapping[str, str] | None = None) -> EngineAddress:
        """The address of ``url`` (``unix:///path``, ``tcp://host:port``, a bare path); None:
        the environment's ``DOCKER_HOST``, else the local socket. ``DOCKER_TLS_VERIFY`` and
        ``DOCKER_CERT_PATH`` give TCP its TLS, as Docker's own CLI reads them."""
        env = os.environ if environ is None else environ
        address = url if url is not None else env.get("DOCKER_HOST", "") or "unix://"
        if address.startswith("/"):
            return cls(unix_path=address)
        parsed = urllib.parse.urlsplit(address)
        if parsed.scheme in ("unix", "http+unix"):
            return cls(unix_path=parsed.path or DEFAULT_UNIX_SOCKET)
        if parsed.scheme in ("tcp", "http", "https"):
            if not parsed.hostname:
                raise EngineAddressError(f"{address!r}: no host")
            try:
                tls = _tls_from(env) if parsed.scheme != "http" else None
            except (OSError, ssl.SSLError) as exc:
                raise EngineAddressError(f"{address!r}: its TLS files: {exc}") from None
            if parsed.scheme == "https" and tls is None:
                tls = ssl.create_default_context()
            default_port = 2376 if tls is not None else 2375
            return cls(host=parsed.hostname, port=parsed.port or default_port, tls=tls)
        raise EngineAddressError(
            f"{address!r}: only unix:// and tcp:// addresses can be used (an ssh:// one can be "
            "tunnelled to a local socket)"
        )

    def connect(self, timeout: float) -> socket.socket:
        """A new connection to the engine, each of its reads and writes bounded by
        ``timeout``."""
        if self.unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(self.unix_path)
            except BaseException:
                sock.close()
                raise
            return sock
        raw = socket.create_connection((self.host, self.port), timeout=timeout)
        if self.tls is None:
            return raw
        try:
            return self.tls.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


def _tls_from(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """TLS as Docker's CLI configures it from the environment: ``DOCKER_TLS_VERIFY`` set (and
    not empty) verifies the engine with ``ca.pem`` and presents ``cert.pem``/``key.pem`` from
    ``DOCKER_CERT_PATH`` (default ``~/.docker``)."""
    if not env.get("DOCKER_TLS_VERIFY"):
        return None
    directory = env.get("DOCKER_CERT_PATH") or os.path.expanduser("~/.docker")
    context = ssl.create_default_context(cafile=os.path.join(directory, "ca.pem"))
    context.load_cert_chain(os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem"))
    return context


class _Connection:
    """One HTTP/1.1 connection: its socket and h11's state of it."""

    __slots__ = ("sock", "state")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.state = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class EngineClient:
    """Docker's Engine API at ``address``, at the API version the engine says it speaks (asked
    with the first call that needs it, as docker-py's ``version="auto"`` did).

    ``timeout`` bounds each read and write of a request (a stop's bound adds its grace), not
    the request as a whole: DockerCalls bounds each call.
    """

    def __init__(self, address: EngineAddress, *, timeout: float = 30.0) -> None:
        self.address = address
        self.timeout = timeout
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._api_version: str | None = None
        self._closed = False

    # -- the calls the runtime makes -------------------------------------------------------

    def version(self) -> dict[str, Any]:
        """``GET /version`` (unversioned): what the engine is, and its API version."""
        found: dict[str, Any] = self.request("GET", "/version", versioned=False).json()
        return found

    def info(self) -> dict[str, Any]:
        found: dict[str, Any] = self.request("GET", "/info").json()
        return found

    def inspect_image(self, image: str) -> dict[str, Any]:
        found: dict[str, Any] = self.request("GET", f"/images/{_quoted(image)}/json").json()
        return found

    def inspect_container(self, container: str) -> dict[str, Any]:
        found: dict[str, Any] = self.request("GET", f"/containers/{_quoted(container)}/json").json()
        return found

    def create_container(self, body: Mapping[str, Any], *, name: str | None = None) -> str:
        """Create a container from its whole configuration (``HostConfig`` included); its id."""
        params = {"name": name} if name is not None else None
        created = self.request("POST", "/containers/create", params=params, body=body).json()
        return str(created["Id"])

    def start(self, container: str) -> None:
        self.request("POST", f"/containers/{_quoted(container)}/start")

    def stop(self, container: str, *, grace: int) -> None:
        # The engine answers once the container stopped: up to ``grace`` seconds of waiting.
        self.request(
            "POST",
            f"/containers/{_quoted(container)}/stop",
            params={"t": str(grace)},
            timeout=self.timeout + grace,
        )

    def remove_container(self, container: str) -> None:
        """Remove it, running or not, with its anonymous volumes."""
        self.request("DELETE", f"/containers/{_quoted(container)}", params={"force": "1", "v": "1"})

    def update_container(self, container: str, body: Mapping[str, Any]) -> None:
        self.request("POST", f"/containers/{_quoted(container)}/update", body=body)

    def stats_once(self, container: str) -> dict[str, Any]:
        """One stats sample, without waiting for the next (``one-shot``, API 1.41)."""
        found: dict[str, Any] = self.request(
            "GET",
            f"/containers/{_quoted(container)}/stats",
            params={"stream": "0", "one-shot": "1"},
        ).json()
        return found

    def containers(self, *, labels: list[str]) -> list[dict[str, Any]]:
        """Every container, running or not, that carries all of ``labels`` (``key=value``)."""
        filters = json.dumps({"label": labels})
        found: list[dict[str, Any]] = self.request(
            "GET", "/containers/json", params={"all": "1", "filters": filters}
        ).json()
        return found

    def create_volume(self, body: Mapping[str, Any]) -> None:
        self.request("POST", "/volumes/create", body=body)

    def remove_volume(self, name: str) -> None:
        self.request("DELETE", f"/volumes/{_quoted(name)}", params={"force": "1"})

    def path_exists(self, container: str, path: str) -> bool:
        """Whether ``path`` exists in a (created) container's file system: the archive API's
        ``HEAD``, 200 or 404."""
        answer = self.request(
            "HEAD",
            f"/containers/{_quoted(container)}/archive",
            params={"path": path},
            accept=(200, 404),
        )
        return answer.status == 200

    def pull(self, repository: str, tag: str, *, timeout: float) -> None:
        """Pull an image; the engine's progress is read to its end, and an error it reports
        there (after its 200) is raised."""
        answer = self.request(
            "POST",
            "/images/create",
            params={"fromImage": repository, "tag": tag},
            timeout=timeout,
        )
        for line in answer.body.splitlines():
            with contextlib.suppress(ValueError):
                report = json.loads(line)
                if isinstance(report, dict) and report.get("error"):
                    raise EngineError(500, str(report.get("error")))

    def attach_socket(self, container: str, params: Mapping[str, str]) -> socket.socket:
        """The container's attach as a plain socket after the engine's upgrade (the caller
        owns it; it is in blocking mode with this client's timeout)."""
        connection = self._connect()
        try:
            path = self._path(f"/containers/{_quoted(container)}/attach", params, versioned=True)
            headers = [("Connection", "Upgrade"), ("Upgrade", "tcp")]
            try:
                response, body = self._exchange(
                    connection, "POST", path, None, headers, hijack=True
                )
            except _StaleConnection:
                # A new connection (never an idle one): nothing to try again on.
                raise EngineUnreachable("the engine closed the connection") from None
            # Docker and Podman answer the upgrade with 101; an engine that does not may still
            # hand the connection over after a 200 (docker-py's "hijack").
            if response.status_code >= 400:
                raise _error_of(
                    Answer(response.status_code, body, _header(response, b"content-type")), path
                )
            if response.status_code not in (101, 200):
                raise AttachNotHandedOver(
                    response.status_code, "the engine did not hand over the attach connection"
                )
            leftover, _closed = connection.state.trailing_data
            if leftover:
                # Nothing runs yet (the attach comes before the start), so nothing can have
                # been written: bytes here are not ours to relay or drop.
                raise EngineUnreachable("the engine sent data before the attach was handed over")
            sock, connection.sock = connection.sock, socket.socket()
            connection.sock.close()
            return sock
        finally:
            connection.close()

    # -- requests ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        versioned: bool = True,
        timeout: float | None = None,
        accept: tuple[int, ...] = (),
    ) -> Answer:
        """One request and its whole answer; EngineError for a status of 400 or more not in
        ``accept``. ``path`` is below the API version unless ``versioned`` is False (then it is
        the whole path: Podman's own ``/v4.0.0/libpod/...``)."""
        full_path = self._path(path, params, versioned=versioned)
        payload = json.dumps(body).encode() if body is not None else None
        headers = [("Content-Type", "application/json")] if payload is not None else []
        for attempt in (0, 1):
            connection, reused = self._take()
            try:
                if timeout is not None:
                    connection.sock.settimeout(timeout)
                response, answer_body = self._exchange(
                    connection, method, full_path, payload, headers
                )
            except _StaleConnection:
                connection.close()
                if reused and attempt == 0:
                    continue  # the engine had closed an idle connection: once more, on a new one
                raise EngineUnreachable("the engine closed the connection") from None
            except BaseException:
                connection.close()
                raise
            self._give_back(connection, timeout)
            answer = Answer(
                response.status_code,
                answer_body,
                _header(response, b"content-type"),
            )
            if answer.status >= 400 and answer.status not in accept:
                raise _error_of(answer, path)
            return answer
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _path(self, path: str, params: Mapping[str, str] | None, *, versioned: bool) -> str:
        if versioned:
            path = f"/v{self.api_version()}{path}"
        if params:
            path = f"{path}?{urllib.parse.urlencode(params)}"
        return path

    def api_version(self) -> str:
        """The engine's API version (asked once)."""
        if self._api_version is None:
            version = self.version().get("ApiVersion")
            if not isinstance(version, str) or not version.replace(".", "").isdigit():
                raise EngineUnreachable(f"the engine gave no API version: {version!r}")
            self._api_version = version
        return self._api_version

    def _exchange(
        self,
        connection: _Connection,
        method: str,
        path: str,
        payload: bytes | None,
        headers: list[tuple[str, str]],
        *,
        hijack: bool = False,
    ) -> tuple[h11.Response | h11.InformationalResponse, bytes]:
        """Send one request on ``connection`` and read its answer: the response head and the
        whole body (for a 101, or with ``hijack`` any success, the head alone: the rest of the
        connection is not HTTP)."""
        host = self.address.host if self.address.unix_path is None else "docker"
        all_headers = [("Host", host), ("User-Agent", _USER_AGENT), *headers]
        if payload is not None:
            all_headers.append(("Content-Length", str(len(payload))))
        elif method in ("POST", "PUT"):
            all_headers.append(("Content-Length", "0"))
        state = connection.state
        with _mapped():
            data = state.send(h11.Request(method=method, target=path, headers=all_headers)) or b""
            if payload is not None:
                data += state.send(h11.Data(data=payload)) or b""
            data += state.send(h11.EndOfMessage()) or b""
            try:
                connection.sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _StaleConnection from exc
            return _read_answer(connection, method, hijack=hijack)

    # -- the pool ----------------------------------------------------------------------------

    def _take(self) -> tuple[_Connection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _connect(self) -> _Connection:
        with _mapped():
            return _Connection(self.address.connect(self.timeout))

    def _give_back(self, connection: _Connection, timeout: float | None) -> None:
        """Pool the connection if it can carry another request; else close it."""
        state = connection.state
        if state.our_state is h11.DONE and state.their_state is h11.DONE:
            state.start_next_cycle()
            if timeout is not None:
                connection.sock.settimeout(self.timeout)
            with self._lock:
                if not self._closed and len(self._idle) < MAX_IDLE_CONNECTIONS:
                    self._idle.append(connection)
                    return
        connection.close()

    def close(self) -> None:
        """Close the idle connections; requests under way close theirs when they end."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _read_answer(
    connection: _Connection, method: str, *, hijack: bool
) -> tuple[h11.Response | h11.InformationalResponse, bytes]:
    """Read the answer to the request just sent (see :meth:`EngineClient._exchange`), its body
    bounded by :data:`MAX_ANSWER_BYTES`; _StaleConnection if the engine closed the connection
    before any of it came."""
    state = connection.state
    response: h11.Response | None = None
    chunks: list[bytes] = []
    size = 0
    received_any = False
    while True:
        event = state.next_event()
        if event is h11.NEED_DATA:
            state.receive_data(_received(connection.sock, first=not received_any))
            received_any = True
        elif isinstance(event, h11.InformationalResponse):
            if event.status_code == 101:
                return event, b""
            # (100 Continue and the like: the answer follows)
        elif isinstance(event, h11.Response):
            response = event
            if hijack and event.status_code < 300:
                return event, b""
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_ANSWER_BYTES:
                raise EngineUnreachable(
                    f"the engine's answer to {method} is over {MAX_ANSWER_BYTES} bytes"
                )
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage) and response is not None:
            return response, b"".join(chunks)
        else:  # closed mid-answer, or paused (not HTTP/1.1 as we speak it)
            raise EngineUnreachable(f"the engine's answer to {method} could not be read")


def _received(sock: socket.socket, *, first: bool) -> bytes:
    """The next bytes of an answer; _StaleConnection if the connection was closed before the
    ``first`` came."""
    try:
        more = sock.recv(_READ_CHUNK)
    except ConnectionResetError as exc:
        if first:
            raise _StaleConnection from exc
        raise
    if not more and first:
        raise _StaleConnection
    return more


class _StaleConnection(Exception):
    """The engine closed the connection before any of the answer came (an idle keep-alive
    connection it had given up on): the request never reached it."""


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """Every failure to talk to the engine as EngineUnreachable (its cause kept)."""
    try:
        yield
    except (EngineError, EngineUnreachable, _StaleConnection):
        raise
    except (OSError, h11.ProtocolError) as exc:
        raise EngineUnreachable(f"{type(exc).__name__}: {exc}") from exc


def _header(response: h11.Response | h11.InformationalResponse, name: bytes) -> str:
    for key, value in response.headers:
        if key == name:
            return value.decode("latin-1")
    return ""


def _error_of(answer: Answer, path: str) -> EngineError:
    """The engine's error answer as the exception it means (its ``message`` when JSON)."""
    explanation = answer.body.decode("utf-8", "replace").strip()
    if "json" in answer.content_type:
        with contextlib.suppress(ValueError):
            decoded = json.loads(answer.body)
            if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
                explanation = decoded["message"]
    if answer.status == 404:
        lowered = explanation.lower()
        if (
            path.startswith("/images/")
            or "no such image" in lowered
            or ("repository does not exist" in lowered or "pull access denied" in lowered)
        ):
            return ImageNotFound(404, explanation)
        return NotFound(404, explanation)
    return EngineError(answer.status, explanation)


def _quoted(part: str) -> str:
    """A name or id as one segment of a path (an image's ``/`` and ``:`` kept, as the engine
    routes them)."""
    return urllib.parse.quote(part, safe="/:@")
