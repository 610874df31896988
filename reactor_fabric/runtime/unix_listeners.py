"""One container's listening socket served until its end: the accept loop the egress proxy and
the agents' fabric sockets share (a leaf: both runtime servers use it, nothing else).

Resource handling: the listener is the loop's from the call on: closed, and its path unlinked,
when the loop ends for any reason (cancelled by the container's removal, a failed accept, an
error). Each connection runs in a nursery of the loop's own, so cancelling the loop's scope
ends them with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger(__name__)


async def serve_listener(
    listener: socket.socket,
    path: str | None,
    handle: Callable[[trio.SocketStream], Awaitable[None]],
    *,
    failed: str,
    fields: dict[str, Any],
    slots: trio.Semaphore | None = None,
) -> None:
    """Accept on ``listener`` until cancelled, each connection given to ``handle`` in a task of
    its own. A failed accept (the socket closed or broken under us) is logged as ``failed``
    with ``fields`` and ends the loop: the container's later connections get nothing.

    ``slots`` (this listener's alone) bounds the connections held at once: one is taken before
    each accept and is the connection's from then on; its handler gives it back
    (``slots.release()``) once the connection no longer counts, at the latest as it ends. With
    none free, the next connection waits unaccepted in the listener's backlog (the kernel's,
    bounded by its length), holding nothing of this process."""
    try:
        listening = trio.SocketListener(trio.socket.from_stdlib_socket(listener))
    except BaseException:
        close_listener(listener, path)
        raise
    try:
        async with trio.open_nursery() as connections:
            while True:
                if slots is not None:
                    # (On the way out, a slot taken for an accept that never came is left
                    # taken: the loop, and its slots with it, are over.)
                    await slots.acquire()
                try:
                    stream = await listening.accept()
                except (OSError, trio.ClosedResourceError) as exc:
                    log.warning(failed, extra={**fields, "detail": str(exc)})
                    return
                connections.start_soon(handle, stream)
    finally:
        # Usually cancelled (the container's removal): closed at once, before any checkpoint
        # could raise the cancellation again and leave the socket and its path behind.
        close_listener(listener, path)
        with trio.CancelScope(shield=True), contextlib.suppress(OSError):
            await listening.aclose()


def close_listener(listener: socket.socket, path: str | None) -> None:
    """Close a listener not (or no longer) served, and unlink its path."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)
    listener.close()
