"""The sockets of ours a Docker container gets: its stdio, its egress proxy's, its fabric socket.

With socket stdio (:mod:`.stdio_sockets`) each container's stdin and stdout are a Unix socket of
its own to the orchestrator, listened on before the container is created and accepted once its
``fabric-stdio`` connects, so the engine is not on the relay's path. Beside it, in the same
area, a container whose service has an egress allowlist gets its proxy's socket
(:mod:`.egress_proxy`), and an agent's container its fabric socket, where its child session is
served (:mod:`.child_sockets`). The area is opened on the first start, and only where the
engine reaches our files (a local engine); where it cannot be, stdio goes through the engine's
attach and the log says why once (``socket_stdio_unavailable``).

Bounds: a container's stdio must connect within the engine call bound; while it has not, the
container is asked every :data:`STDIO_CONNECT_POLL` s whether it ended.

Resource handling: what :meth:`DockerSockets.listen` returns (:class:`ContainerSockets`) is
the starter's until each server takes its socket (:meth:`DockerSockets.serve`); the starter
closes the rest whatever happened, which unlinks their paths. :meth:`DockerSockets.close`
removes the area.

Error handling: whether a container can have the egress it needs is what the runtime's
capabilities say (:meth:`DockerSockets.egress_missing`): the composer refuses it before anything
is created (ContainerStartFailure ``egress_unavailable``), and so does the start if the area
fails that one container; stdio that never connects is
ContainerStartFailure (``stdio_not_connected``); a damaged area makes that one container's
stdio go through the engine (logged: ``socket_stdio_failed``), and an agent without its fabric
socket runs without the suite's services (logged: ``child_fabric_unavailable``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from .._errors import ContainerStartFailure
from .._reasons import EGRESS_UNAVAILABLE, STDIO_NOT_CONNECTED
from .._sockets import LeanSocketStream
from ..policy.container_parts.ownership import LABEL_INSTANCE, LABEL_SERVICE
from ..policy.container_spec import ContainerSpec
from ..policy.owner import hostname
from ..protocol.egress import Allowlist
from .base import ContainerExit
from .child_sockets import CHILD_BACKLOG, ChildSockets
from .docker_payload import SocketSources
from .egress_proxy import EgressProxy
from .stdio_sockets import EGRESS_BACKLOG, PendingStdio, StdioArea, StdioUnavailable

# Logged under the Docker runtime's name, as before its modules were split (operators filter
# the log by it).
log = logging.getLogger("reactor_fabric.runtime.docker")

# While a container's fabric-stdio has not connected, how often to ask whether it ended.
STDIO_CONNECT_POLL = 0.5
# Why a container with an egress allowlist cannot have its proxy without socket stdio.
NO_SOCKET_STDIO_FOR_EGRESS = (
    "its proxy is reached through socket stdio, which this engine does not have (a remote "
    "engine, or the fabric-stdio helper missing: see the log's socket_stdio_unavailable)"
)


@dataclass
class ContainerSockets:
    """One container's sockets, until their servers own them: its stdio's (None: stdio goes
    through the engine), its egress proxy's, its fabric socket (an agent's child sessions)."""

    stdio: PendingStdio | None = None
    egress: PendingStdio | None = None
    child: PendingStdio | None = None

    def close(self) -> None:
        """Close (and unlink) those still held: connected or not, nothing may connect any
        more; those never served."""
        for pending in (self.stdio, self.egress, self.child):
            if pending is not None:
                pending.close()
        self.stdio = self.egress = self.child = None


class DockerSockets:
    """The socket stdio area of one runtime and the sockets its containers get from it.

    ``wanted``: socket stdio asked for and possible (a local engine); ``parent`` and ``helper``:
    where the area goes and the ``fabric-stdio`` to copy (see :class:`~.stdio_sockets.StdioArea`);
    ``connect_bound``: how long a container's stdio may take to connect; ``exit_status``: the
    engine's answer to whether a container ended.
    """

    def __init__(
        self,
        *,
        wanted: bool,
        parent: str | None,
        helper: str | None,
        connect_bound: float,
        egress: EgressProxy,
        children: ChildSockets,
        exit_status: Callable[[str], Awaitable[ContainerExit]],
    ) -> None:
        self._wanted = wanted
        self._parent = parent
        self._helper = helper
        self._connect_bound = connect_bound
        self._egress = egress
        self._children = children
        self._exit_status = exit_status
        self._area: StdioArea | None = None
        self._opened = False
        self._lock = trio.Lock()

    @property
    def stdio(self) -> str:
        """``socket`` once the socket stdio area is open, ``attach`` when it is not wanted or
        could not be opened, ``""`` before the first start (see :class:`~.base.Runtime`)."""
        if not self._wanted:
            return "attach"
        if not self._opened:
            return ""
        return "attach" if self._area is None else "socket"

    async def listen(self, spec: ContainerSpec) -> ContainerSockets:
        """The sockets ``spec``'s container gets, listening (their connections wait in their
        backlogs): its stdio's, then its egress proxy's, then its fabric socket."""
        held = ContainerSockets()
        try:
            held.stdio = await self._listen_for_stdio(spec)
            held.egress = await self._listen_for_egress(spec, held.stdio)
            held.child = await self._listen_for_child(spec, held.stdio)
        except BaseException:
            held.close()
            raise
        return held

    def sources(self, held: ContainerSockets) -> SocketSources | None:
        """Where the container finds its sockets (see :func:`.docker_payload.all_mounts`);
        None when its stdio goes through the engine."""
        area = self._area
        if held.stdio is None or area is None:
            return None
        return SocketSources(
            helper=area.helper,
            stdio=held.stdio.path,
            egress=held.egress.path if held.egress is not None else None,
            child=held.child.path if held.child is not None else None,
        )

    async def _listen_for_stdio(self, spec: ContainerSpec) -> PendingStdio | None:
        """A socket for this container's stdio, or None to relay stdio through the engine.

        The area is opened on the first spawn (it is named after the instance the spec's labels
        carry); if it cannot be, the log says why once and every container uses the engine.
        """
        if not self._wanted:
            return None
        async with self._lock:
            if not self._opened:
                self._area = await trio.to_thread.run_sync(self._open_stdio_area, spec.labels)
                # Only now: `stdio` must not say "attach" while the area is being made.
                self._opened = True
        area = self._area
        if area is None:
            return None
        try:
            return await trio.to_thread.run_sync(area.listen)
        except OSError as exc:
            # Our directory is damaged (removed by a cleaner of /tmp, a full disk): this
            # container's stdio goes through the engine; the next one tries again.
            log.warning("socket_stdio_failed", extra={"directory": area.root, "detail": str(exc)})
            return None

    def egress_missing(self) -> str:
        """Why a container cannot have its egress proxy here ("" when it can; see
        RuntimeCapabilities): it reaches the proxy through ``fabric-stdio``, so only with
        socket stdio, and only while the proxy runs."""
        if not self._wanted or (self._opened and self._area is None):
            return NO_SOCKET_STDIO_FOR_EGRESS
        if not self._egress.running:
            return "the egress proxy does not run in this process"
        return ""

    async def _listen_for_egress(
        self, spec: ContainerSpec, stdio: PendingStdio | None
    ) -> PendingStdio | None:
        """The socket of this container's egress proxy when its spec has an allowlist.

        The composer refused the spec already where this runtime cannot have one
        (:meth:`egress_missing`); what is left is the area failing this one container (its
        stdio socket could not be made, or the area could not be opened at the first start):
        ContainerStartFailure (``egress_unavailable``), in the same words, rather than a
        container started without the one destination it needs."""
        if spec.egress is None:
            return None
        area = self._area
        if stdio is None or area is None:
            service = spec.labels.get(LABEL_SERVICE, "")
            raise ContainerStartFailure(
                f"service {service!r} has an egress allowlist, and {NO_SOCKET_STDIO_FOR_EGRESS}",
                reason=EGRESS_UNAVAILABLE,
                service=service,
            )
        return await trio.to_thread.run_sync(
            functools.partial(area.listen, backlog=EGRESS_BACKLOG, suffix=".egress.sock")
        )

    async def _listen_for_child(
        self, spec: ContainerSpec, stdio: PendingStdio | None
    ) -> PendingStdio | None:
        """The socket of an agent container's child session, when its spec asks for one and
        the stdio area and the fabric sockets are there; None otherwise: the agent then runs
        without the suite's services (its relay finds no socket), which the log says."""
        if not spec.child_fabric:
            return None
        area = self._area
        if stdio is None or area is None or not self._children.running:
            log.warning(
                "child_fabric_unavailable",
                extra={
                    "service": spec.labels.get(LABEL_SERVICE, ""),
                    "detail": "no socket stdio here"
                    if stdio is None or area is None
                    else "the fabric sockets are not served in this process",
                },
            )
            return None
        return await trio.to_thread.run_sync(
            functools.partial(area.listen, backlog=CHILD_BACKLOG, suffix=".fabric.sock")
        )

    def _open_stdio_area(self, labels: dict[str, str]) -> StdioArea | None:
        owner = {k: v for k, v in labels.items() if k.startswith("reactor-fabric.owner")}
        instance = labels.get(LABEL_INSTANCE) or f"pid-{os.getpid()}"
        try:
            area = StdioArea.open(
                instance,
                owner=owner,
                this_host=hostname(),
                helper=self._helper,
                parent=self._parent,
            )
        except StdioUnavailable as exc:
            log.warning(
                "socket_stdio_unavailable",
                extra={"reason": exc.reason, "detail": str(exc), "stdio": "engine"},
            )
            return None
        log.info("socket_stdio", extra={"directory": area.root})
        return area

    def serve(self, held: ContainerSockets, container_id: str, spec: ContainerSpec) -> None:
        """Serve the container's egress proxy and fabric socket from now on (connections wait
        in their backlogs until it starts); each server owns its socket from here, and stops
        at the container's removal."""
        if held.egress is not None and spec.egress is not None:
            self._egress.serve(
                container_id,
                spec.labels.get(LABEL_SERVICE, ""),
                Allowlist.of(spec.egress.allowlist),
                held.egress.listener,
                held.egress.path,
            )
            held.egress = None
        if held.child is not None:
            self._children.serve(container_id, spec.name, held.child.listener, held.child.path)
            held.child = None

    async def accept_stdio(self, pending: PendingStdio, container_id: str) -> LeanSocketStream:
        """The container's stdio connection, once its ``fabric-stdio`` connected.

        It connects as soon as the container runs; while it has not, the container is asked
        now and then whether it ended (a program that cannot start) — bounded by the API
        call time-out in all.
        """
        with trio.move_on_after(self._connect_bound):
            while True:
                with trio.move_on_after(STDIO_CONNECT_POLL):
                    await trio.lowlevel.wait_readable(pending.listener)
                try:
                    connection, _address = pending.listener.accept()
                except (BlockingIOError, ConnectionAbortedError):
                    # Nothing to take yet (or a connection that gave up): did it end?
                    ended = await self._exit_status(container_id)
                    if ended.exit_code is not None:
                        raise ContainerStartFailure(
                            "the container ended before its stdio connected "
                            f"(exit code {ended.exit_code}): see its stderr",
                            reason=STDIO_NOT_CONNECTED,
                            exit_code=ended.exit_code,
                        ) from None
                    continue
                except OSError as exc:
                    raise ContainerStartFailure(
                        f"the container's stdio socket failed: {exc}",
                        reason=STDIO_NOT_CONNECTED,
                    ) from exc
                try:
                    connection.setblocking(False)
                    return LeanSocketStream(connection)
                except BaseException:
                    connection.close()
                    raise
        raise ContainerStartFailure(
            f"the container's stdio did not connect within {self._connect_bound:g} s",
            reason=STDIO_NOT_CONNECTED,
        )

    async def close(self) -> None:
        """Remove the area (the sockets in it are their servers' or closed already)."""
        area, self._area = self._area, None
        if area is not None:
            await trio.to_thread.run_sync(area.close)
