"""The orchestrator's app served over memory streams, with the in-memory runtime behind it.

Memory streams by default, so every test of the transports can run on the autojump clock
(``sockets=True``: a socket pair, for the paths only a socket takes: writes without waiting);
the few behaviours that need the kernel (connection caps, file descriptors, signals) are
tested over loopback elsewhere. Leaving :func:`served` asserts that nothing is left: no
container, no session.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.testing

from reactor_fabric._sockets import LeanSocketStream
from reactor_fabric.config.structs import Limits, Orchestrator, Profile, Service, Suite
from reactor_fabric.observe.observer import Observer
from reactor_fabric.policy.auth import SignIn
from reactor_fabric.protocol.suite_lock import Mode, SuiteLock
from reactor_fabric.runtime.memory import MemoryRuntime, Server, open_memory_runtime
from reactor_fabric.runtime.staging import Staging
from reactor_fabric.trio.app import FabricApp
from reactor_fabric.trio.http_server import HttpLimits, serve_connection
from reactor_fabric.trio.issuer_keys import JsonFetcher
from reactor_fabric.trio.serve import Fabric, assemble
from reactor_fabric.trio.streamable_http import HttpSessions
from reactor_fabric.trio.warm_pool import WarmPool
from tests.fakes import scripted_mcp_server
from tests.http_client import BOTH, HttpClient, Reply, WebSocketClient


@dataclass
class Served:
    fabric: Fabric
    runtime: MemoryRuntime
    app: FabricApp
    sessions: HttpSessions
    nursery: trio.Nursery
    limits: HttpLimits
    # Connections over a socket pair, the server's side the orchestrator's own socket stream
    # (which writes without waiting when the kernel takes the bytes: the paths a real
    # connection takes), instead of memory streams.
    sockets: bool = False

    def connect(self, *, lockstep: bool = False) -> trio.abc.Stream:
        """A new client connection to the server (lockstep: no buffering in between)."""
        client: trio.abc.Stream
        server: trio.abc.Stream
        if lockstep:
            client, server = trio.testing.lockstep_stream_pair()
        elif self.sockets:
            client, server = socket_pair()
        else:
            client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(serve_connection, server, self.app, self.limits)
        return client

    async def http(
        self,
        method: str,
        target: str,
        body: bytes | dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        accept: str = BOTH,
    ) -> Reply:
        """One request on a fresh connection."""
        client = HttpClient(self.connect())
        try:
            return await client.request(method, target, body, headers=headers, accept=accept)
        finally:
            await client.aclose()

    async def post(
        self,
        body: bytes | dict[str, Any],
        *,
        session: str | None = None,
        path: str = "/mcp/svc",
        headers: dict[str, str] | None = None,
        accept: str = BOTH,
    ) -> Reply:
        all_headers = dict(headers or {})
        if session is not None:
            all_headers["mcp-session-id"] = session
        return await self.http("POST", path, body, headers=all_headers, accept=accept)

    async def websocket(
        self,
        target: str = "/mcp/svc",
        *,
        headers: list[tuple[bytes, bytes]] | None = None,
        subprotocols: list[str] | None = None,
        lockstep: bool = False,
    ) -> tuple[WebSocketClient, Any]:
        return await WebSocketClient.connect(
            self.connect(lockstep=lockstep),
            target,
            headers=headers,
            subprotocols=subprotocols,
        )


def socket_pair() -> tuple[trio.SocketStream, LeanSocketStream]:
    """A connected pair of sockets: the client's a trio stream, the server's the orchestrator's
    own (as it accepts them)."""
    client, server = socket.socketpair()
    return trio.SocketStream(trio.socket.from_stdlib_socket(client)), LeanSocketStream(server)


def warm_pool_of(fabric: Fabric, staging: Staging | None) -> WarmPool:
    """A warm pool of ``fabric``'s suite with ``staging`` (a fake's, or None), made from its
    parts as the serving makes it (tests set it as the starter's pool and run it)."""
    return WarmPool(
        fabric.runtime,
        fabric.suite.mcp_services,
        fabric.settings.pooling,
        identity=fabric.starter.identity,
        staging=staging,
        stopping=fabric.registry.stopping,
        teardown_deadline=fabric.registry.teardown_deadline,
        metrics=fabric.observer.metrics,
        refused=[name for name, found in fabric.secrets.items() if not found.available],
    )


def suite_for(
    root: Path,
    *,
    idle_timeout: str = "1m",
    limits: Limits | None = None,
    **orchestrator: Any,
) -> Suite:
    return Suite(
        version="1.0",
        orchestrator=Orchestrator(
            allowed_mount_roots=[str(root)], limits=limits or Limits(), **orchestrator
        ),
        mcp_services={"svc": Service(image="fake/svc:1", timeout=idle_timeout)},
    )


@asynccontextmanager
async def served(
    root: Path,
    *,
    server: Server = scripted_mcp_server,
    idle_timeout: str = "1m",
    limits: Limits | None = None,
    http_limits: HttpLimits | None = None,
    stdin_capacity: int = 65536,
    token: str | None = None,
    learn_catalog: bool = False,
    services: dict[str, Service] | None = None,
    profiles: dict[str, Profile] | None = None,
    suite_lock: SuiteLock | None = None,
    lock_mode: Mode = "off",
    observer: Observer | None = None,
    sign_in: SignIn | None = None,
    issuer_fetcher: JsonFetcher | None = None,
    sockets: bool = False,
    **orchestrator: Any,
) -> AsyncIterator[Served]:
    suite = suite_for(root, idle_timeout=idle_timeout, limits=limits, **orchestrator)
    if services is not None:
        suite = msgspec.structs.replace(suite, mcp_services=services)
    if profiles is not None:
        suite = msgspec.structs.replace(suite, profiles=profiles)
    async with open_memory_runtime(server, stdin_capacity=stdin_capacity) as runtime:
        fabric = assemble(
            suite,
            runtime=runtime,
            network="none",
            token=token,
            lock=suite_lock,
            lock_mode=lock_mode,
            observer=observer if observer is not None else Observer(),
            sign_in=sign_in,
            issuer_fetcher=issuer_fetcher,
        )
        sessions = HttpSessions(fabric)
        app = FabricApp(fabric, sessions)
        async with trio.open_nursery() as nursery:
            await nursery.start(sessions.run)
            if learn_catalog:
                # As the orchestrator does at start-up; the probes are not the test's business.
                await nursery.start(fabric.catalog.learn)
                await fabric.catalog.ready.wait()
                runtime.spawned.clear()
                runtime.removals.clear()
            yield Served(
                fabric, runtime, app, sessions, nursery, http_limits or HttpLimits(), sockets
            )
            nursery.cancel_scope.cancel()
        assert runtime.alive == [], "a container was left behind"
        assert fabric.registry.sessions == {}
        assert fabric.registry.containers == {}
