"""The forward proxy of containers with an egress allowlist: bytes only, decisions elsewhere.

A container of a service with ``egress:`` has no network (``network: none``). Its
``fabric-stdio`` listens on the container's own loopback (``127.0.0.1:3128``, named in its
``HTTPS_PROXY``/``HTTP_PROXY``) and forwards each connection to a Unix socket of the
orchestrator's stdio area, bound into that one container: a connection on that socket comes
from that container and no other, so who asks is known without trusting anything it sends.
Here, for each connection: read the request head, judge it, resolve, check the addresses,
connect from the orchestrator's host, and pass bytes both ways — every decision made by
:mod:`reactor_fabric.protocol.egress` (pure, exhaustively tested); this module only moves
bytes and keeps time.

Why our own proxy rather than Squid or tinyproxy in a container: the destinations are to be
reached *as the orchestrator's host sees them* (``127.0.0.1:8080`` is that host's loopback), a
connection must be tied to the container it came from (a socket per container does that with no
credential to steal), and the check of the resolved address must be the one the tests explore.
The HTTP is h11's (a maintained sans-I/O parser); what is hand-written is the byte pump.

Bounds: a request head of 16 KiB sent within 10 s; resolution 5 s; connect 10 s; a connection
with no byte either way for 5 minutes is closed; 64 connections at once per container (the next
gets 503 ``egress_busy``, and a record); 64 KiB in flight per direction (a slow side stalls only
its own connection). This bound is the proxy's to keep, not ``fabric-stdio``'s: the socket is in
the container, where anything may connect to it, and only the proxy can answer and record.
What a container's connections hold here is bounded too: 64 served and 16 being answered a
refusal at once (a refusal ends within seconds); its next connection waits, unaccepted, in its
socket's backlog until one of those ends (``fabric-stdio`` carries no more at once either).

Kubernetes pods have no Unix socket of ours: they reach the same proxy over TCP (``listen``,
the address pods are allowed to reach by their NetworkPolicy), and each connection says whose
it is by ``Proxy-Authorization: Basic base64("rf:" + token)``, the token the runtime made for
that pod (:meth:`EgressProxy.register`) and wrote into its proxy URL. A connection without a
token of a pod served now is answered 407 ``egress_unauthorized`` (the decision is
:func:`reactor_fabric.protocol.egress.identify`'s); the token is never logged. The same bounds
hold there: 64 connections of a pod at once; and connections not (yet) a pod's — reading their
head, at most 64 at once, or being answered a refusal — are held 80 at once, the next waiting
in the listener's backlog.

Resource handling: :meth:`EgressProxy.run` owns a nursery; each container's listener and its
connections live in a cancel scope of their own, ended by :meth:`EgressProxy.stop` (at the
container's removal) or when the proxy's nursery ends. Every socket is closed in ``finally``.

Error handling: nothing a container sends can end the proxy or another container's
connections: each connection's failures end in its own task (``except*`` for the pump's
group), as a record with its outcome.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from .._reasons import (
    EGRESS_BAD_REQUEST,
    EGRESS_BUSY,
    EGRESS_CONNECT_FAILED,
    EGRESS_UNRESOLVED,
)
from ..observe.ratelimit import TokenBucket
from ..protocol.egress import (
    MAX_REQUEST_HEAD,
    TUNNEL_ESTABLISHED,
    Allowlist,
    EgressRecord,
    EgressRefused,
    IPAddress,
    ProxyRequest,
    choose_address,
    identify,
    judge_target,
    read_request,
    refusal_response,
)
from .unix_listeners import close_listener, serve_listener

log = logging.getLogger(__name__)

HEAD_SECONDS = 10.0
RESOLVE_SECONDS = 5.0
CONNECT_SECONDS = 10.0
IDLE_SECONDS = 300.0
MAX_CONNECTIONS = 64
# Connections of one container being answered a refusal at once, besides those: beyond both, the
# container's next connection waits unaccepted in its socket's backlog (see _accept).
MAX_REFUSING = 16
CHUNK = 65536
# Before closing a refused connection: what the client still sends is read and dropped.
DRAIN_SECONDS, DRAIN_BYTES = 1.0, 65536
# Refusals logged per container: a container that loops on a refused destination fills the
# audit trail (each attempt is a record), not the log.
_LOG_RATE, _LOG_BURST = 1.0, 20


Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
Connector = Callable[[IPAddress, int], Awaitable[trio.abc.HalfCloseableStream]]


async def resolve(host: str, port: int) -> list[IPAddress]:
    """The host's addresses, in the resolver's order (the orchestrator's host's resolver)."""
    found = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


async def connect(address: IPAddress, port: int) -> trio.abc.HalfCloseableStream:
    return await trio.open_tcp_stream(str(address), port)


@dataclass
class _Served:
    """One container's listener and what its connections need."""

    container: str
    service: str
    allowlist: Allowlist
    log_bucket: TokenBucket
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    # Connections served now (refusals in progress not counted: they are not served).
    connections: int = 0
    # A pod's (the TCP way in): its token, and the scopes of its connections (each its own:
    # they are accepted by the one TCP listener, not this container's).
    token: str | None = None
    tcp: set[trio.CancelScope] = field(default_factory=set)

    def cancel(self) -> None:
        self.scope.cancel()
        for scope in self.tcp:
            scope.cancel()


class EgressProxy:
    """Every egress container's proxy (see the module docstring)."""

    def __init__(
        self,
        *,
        resolver: Resolver | None = None,
        connector: Connector | None = None,
        max_connections: int = MAX_CONNECTIONS,
        listen: tuple[str, int] | None = None,
    ) -> None:
        self._resolve = resolver or resolve
        self._connect = connector or connect
        self._max_connections = max_connections
        # Where run() binds the TCP way in for pods (None: none; serve_tcp can still add one).
        self._listen = listen
        # Connections on the TCP way in not yet identified (bounded as a container's are).
        self._unidentified = 0
        self._tcp_log_bucket: TokenBucket | None = None
        self._nursery: trio.Nursery | None = None
        self._served: dict[str, _Served] = {}
        self._record: Callable[[EgressRecord], None] = lambda record: None

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def run(
        self,
        record: Callable[[EgressRecord], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve containers until cancelled; ``record`` gets every connection's record."""
        self._record = record
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._listen is not None:
                    self.serve_tcp(_bind(*self._listen))
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for served in self._served.values():
                served.cancel()
            self._served.clear()

    def serve_tcp(self, listener: socket.socket) -> None:
        """Accept pods' connections on ``listener`` (a listening TCP socket, ours from now
        on) until the proxy ends; each must carry a registered pod's token. RuntimeError if
        the proxy does not run."""
        if self._nursery is None:
            listener.close()
            raise RuntimeError("the egress proxy is not running")
        log.info("egress_proxy_listening", extra={"address": _address_text(listener)})
        self._tcp_log_bucket = TokenBucket(
            rate=_LOG_RATE, burst=_LOG_BURST, now=trio.current_time()
        )
        self._nursery.start_soon(self._accept_tcp, listener)

    def register(self, token: str, container: str, service: str, allowlist: Allowlist) -> None:
        """Serve the pod ``container`` (its id) to connections carrying ``token`` on the TCP
        way in, until :meth:`stop` (or :meth:`unregister`). RuntimeError if the proxy does not
        run."""
        if self._nursery is None:
            raise RuntimeError("the egress proxy is not running")
        self._served[container] = _Served(
            container,
            service,
            allowlist,
            log_bucket=TokenBucket(rate=_LOG_RATE, burst=_LOG_BURST, now=trio.current_time()),
            token=token,
        )

    def unregister(self, container: str) -> None:
        """The pod ``container`` is served no more; its connections end."""
        self.stop(container)

    def serve(
        self,
        container: str,
        service: str,
        allowlist: Allowlist,
        listener: socket.socket,
        path: str | None = None,
    ) -> None:
        """Serve ``container`` (its id) on ``listener`` (listening, ours from now on: closed,
        and its ``path`` unlinked, when served no more) until :meth:`stop`. RuntimeError if the
        proxy does not run."""
        if self._nursery is None:
            close_listener(listener, path)
            raise RuntimeError("the egress proxy is not running")
        served = _Served(
            container,
            service,
            allowlist,
            log_bucket=TokenBucket(rate=_LOG_RATE, burst=_LOG_BURST, now=trio.current_time()),
        )
        self._served[container] = served
        self._nursery.start_soon(self._accept, served, listener, path)

    def stop(self, container: str) -> None:
        """End ``container``'s listener and connections (by id; unknown: nothing to do)."""
        served = self._served.pop(container, None)
        if served is not None:
            served.cancel()

    async def _accept(self, served: _Served, listener: socket.socket, path: str | None) -> None:
        # Its socket's slots: every connection accepted, served or being refused, holds one
        # until it is closed.
        slots = trio.Semaphore(self._max_connections + MAX_REFUSING)
        with served.scope:
            await serve_listener(
                listener,
                path,
                functools.partial(self._connection, served, slots),
                failed="egress_listener_failed",
                fields={"container": served.container[:12]},
                slots=slots,
            )

    async def _connection(
        self, served: _Served, slots: trio.Semaphore, client: trio.SocketStream
    ) -> None:
        began = trio.current_time()
        outcome = _Outcome()
        try:
            async with client:
                if served.connections >= self._max_connections:
                    busy = _busy(f"{self._max_connections} connections at once")
                    await self._refuse(client, busy, outcome)
                    return
                served.connections += 1
                try:
                    await self._handle(served, client, outcome)
                finally:
                    served.connections -= 1
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the container or the destination went away: the record says how far it got
        finally:
            slots.release()  # closed (async with): free for the container's next connection
            self._finish(served.container, served.service, served.log_bucket, began, outcome)

    def _finish(
        self,
        container: str,
        service: str,
        log_bucket: TokenBucket | None,
        began: float,
        outcome: _Outcome,
    ) -> None:
        record = EgressRecord(
            container=container,
            service=service,
            destination=outcome.destination,
            address=outcome.address,
            outcome=outcome.outcome,
            reason=outcome.reason,
            sent=outcome.sent,
            received=outcome.received,
            seconds=trio.current_time() - began,
        )
        if (
            record.outcome != "connected"
            and log_bucket is not None
            and log_bucket.allow(trio.current_time())
        ):
            log.warning(
                "egress_refused",
                extra={
                    "container": container[:12],
                    "service": service,
                    "destination": record.destination,
                    "address": record.address,
                    "reason": record.reason,
                },
            )
        self._record(record)

    async def _accept_tcp(self, listener: socket.socket) -> None:
        # This listener's slots: held by connections not (yet) a pod's, as a container's
        # socket's are by all of its connections. A pod's are bounded by its own count.
        slots = trio.Semaphore(self._max_connections + MAX_REFUSING)
        await serve_listener(
            listener,
            None,
            functools.partial(self._tcp_connection, slots),
            failed="egress_listener_failed",
            fields={},
            slots=slots,
        )

    async def _tcp_connection(self, slots: trio.Semaphore, client: trio.SocketStream) -> None:
        """A connection on the TCP way in: its head says whose it is (the token), then it is
        that pod's connection as if it came on the pod's own socket. It holds one of the
        listener's ``slots`` until then (or until it is closed, refused)."""
        began = trio.current_time()
        outcome = _Outcome()
        served: _Served | None = None
        holding = True

        def let_go() -> None:
            nonlocal holding
            if holding:
                holding = False
                slots.release()

        try:
            async with client:
                try:
                    if self._unidentified >= self._max_connections:
                        raise _busy(
                            f"{self._max_connections} connections at once not yet identified"
                        )
                    served, request = await self._identify(client, outcome)
                except EgressRefused as refused:
                    await self._refuse(client, refused, outcome)
                    return
                scope = trio.CancelScope()
                served.tcp.add(scope)
                counted = False
                try:
                    with scope:
                        if served.container not in self._served:
                            return  # unregistered while its head was read
                        if served.connections >= self._max_connections:
                            busy = _busy(f"{self._max_connections} connections at once")
                            await self._refuse(client, busy, outcome)
                            return
                        served.connections += 1
                        counted = True
                        let_go()  # the pod's now, bounded by its count
                        await self._handle(served, client, outcome, request)
                finally:
                    if counted:
                        served.connections -= 1
                    served.tcp.discard(scope)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            let_go()
            if served is None:
                self._finish("", "", self._tcp_log_bucket, began, outcome)
            else:
                self._finish(served.container, served.service, served.log_bucket, began, outcome)

    async def _identify(
        self, client: trio.SocketStream, outcome: _Outcome
    ) -> tuple[_Served, ProxyRequest]:
        """The request on the TCP way in, and the pod whose token it carries (EgressRefused
        otherwise); counted among the connections not yet identified while its head is read."""
        self._unidentified += 1
        try:
            request = await _read_head(client)
            outcome.destination = str(request.destination)
            served = identify(
                request.authorization,
                [(s.token, s) for s in self._served.values() if s.token is not None],
            )
        finally:
            self._unidentified -= 1
        return served, request

    async def _handle(
        self,
        served: _Served,
        client: trio.SocketStream,
        outcome: _Outcome,
        request: ProxyRequest | None = None,
    ) -> None:
        try:
            if request is None:
                request = await _read_head(client)
            outcome.destination = str(request.destination)
            judge_target(request.destination, served.allowlist)
            address = await self._address_of(request, served.allowlist)
            outcome.address = str(address)
            upstream = await self._open(address, request.destination.port)
        except EgressRefused as refused:
            await self._refuse(client, refused, outcome)
            return
        async with upstream:
            outcome.outcome, outcome.reason = "connected", ""
            if request.kind == "tunnel":
                await client.send_all(TUNNEL_ESTABLISHED)
            else:
                await upstream.send_all(request.head)
                outcome.sent += len(request.head)
            if request.rest:
                await upstream.send_all(request.rest)
                outcome.sent += len(request.rest)
            await _pump_both(client, upstream, outcome)

    async def _address_of(self, request: ProxyRequest, allowlist: Allowlist) -> IPAddress:
        destination = request.destination
        literal = destination.address
        if literal is not None:
            return literal  # listed as this address: judge_target checked it
        with trio.move_on_after(RESOLVE_SECONDS):
            try:
                addresses = await self._resolve(destination.host, destination.port)
            except OSError as exc:
                raise EgressRefused(
                    f"{destination.host} does not resolve: {exc}",
                    reason=EGRESS_UNRESOLVED,
                    status=502,
                ) from exc
            return choose_address(destination, addresses, allowlist)
        raise EgressRefused(
            f"{destination.host} did not resolve within {RESOLVE_SECONDS:g} s",
            reason=EGRESS_UNRESOLVED,
            status=502,
        )

    async def _open(self, address: IPAddress, port: int) -> trio.abc.HalfCloseableStream:
        with trio.move_on_after(CONNECT_SECONDS):
            try:
                return await self._connect(address, port)
            except OSError as exc:
                raise _connect_failed(f"{address} port {port}: {exc}") from exc
        raise _connect_failed(f"{address} port {port} did not answer in {CONNECT_SECONDS:g} s")

    async def _refuse(
        self, client: trio.SocketStream, refused: EgressRefused, outcome: _Outcome
    ) -> None:
        outcome.outcome = "refused" if refused.status in (400, 403, 407, 503) else "failed"
        outcome.reason = refused.reason
        with trio.move_on_after(HEAD_SECONDS):
            await client.send_all(refusal_response(refused.status, refused.reason, str(refused)))
            await client.send_eof()
        # What the client sent and we did not read would make the close a reset, which can
        # destroy the answer before the client reads it: drop it first, bounded.
        with trio.move_on_after(DRAIN_SECONDS):
            dropped = 0
            while dropped < DRAIN_BYTES and (data := await client.receive_some(CHUNK)):
                dropped += len(data)


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (the pods' way in)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(socket.SOMAXCONN)
    except BaseException:
        listener.close()
        raise
    return listener


def _address_text(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _busy(message: str) -> EgressRefused:
    return EgressRefused(message, reason=EGRESS_BUSY, status=503)


def _connect_failed(message: str) -> EgressRefused:
    return EgressRefused(message, reason=EGRESS_CONNECT_FAILED, status=502)


@dataclass
class _Outcome:
    destination: str = ""
    address: str = ""
    outcome: str = "refused"
    reason: str = EGRESS_BAD_REQUEST
    sent: int = 0
    received: int = 0


async def _read_head(client: trio.SocketStream) -> ProxyRequest:
    """The request, read within HEAD_SECONDS and MAX_REQUEST_HEAD bytes (and the bytes after
    it); EgressRefused (400) otherwise."""
    data = bytearray()
    with trio.move_on_after(HEAD_SECONDS):
        # (read_request refuses a head over the bound as soon as it sees one: belt and braces.)
        while len(data) <= MAX_REQUEST_HEAD:
            chunk = await client.receive_some(CHUNK)
            if not chunk:
                raise EgressRefused(
                    "the connection ended before a request", reason=EGRESS_BAD_REQUEST, status=400
                )
            data += chunk
            # (Never b"": to h11 that is the end of the connection.)
            request = read_request(bytes(data))
            if request is not None:
                return request
    raise EgressRefused(
        f"no complete request head within {HEAD_SECONDS:g} s and {MAX_REQUEST_HEAD} bytes",
        reason=EGRESS_BAD_REQUEST,
        status=400,
    )


async def _pump_both(
    client: trio.abc.HalfCloseableStream,
    upstream: trio.abc.HalfCloseableStream,
    outcome: _Outcome,
) -> None:
    """Bytes both ways, until the destination is done or nothing moved for IDLE_SECONDS.

    The container may end its side first (a request sent, the answer awaited): the destination
    is told (EOF) and its answer still comes back. Once the destination ended, the connection
    is over: a client kept alive would otherwise hold it until the idle bound."""
    with trio.CancelScope(deadline=trio.current_time() + IDLE_SECONDS) as idle:

        async def to_destination() -> None:
            while data := await client.receive_some(CHUNK):
                await upstream.send_all(data)
                idle.deadline = trio.current_time() + IDLE_SECONDS
                outcome.sent += len(data)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await upstream.send_eof()

        async with trio.open_nursery() as both:
            both.start_soon(to_destination)
            while data := await upstream.receive_some(CHUNK):
                await client.send_all(data)
                idle.deadline = trio.current_time() + IDLE_SECONDS
                outcome.received += len(data)
            both.cancel_scope.cancel()
