"""A socket stream for the relay's hot paths: trio's semantics, fewer trips through the scheduler.

Used by both sides of the relay: the HTTP server's client connections (``trio/``) and the
containers' stdio and attach sockets (``runtime/docker_sockets.py``, ``runtime/docker.py``);
here, outside both, so that ``runtime/`` needs nothing of ``trio/`` (a test enforces it).

Every relayed message is one write by a writer task that then waits on its queue (one writer per
stream, see :mod:`.trio.session` and :mod:`.trio.websocket`). trio's :class:`trio.SocketStream`
yields to the scheduler after a write that completed at once — a fairness checkpoint — and on a
2-core machine each trip through trio's scheduler costs more than the relay's own work on a
message.
Since those writers yield at their queue right after, that checkpoint buys nothing there:
:meth:`LeanSocketStream.send_all` only yields when the kernel cannot take the bytes yet. It
still notices a cancellation before it starts.

Receiving keeps trio's fairness (a yield after a read that succeeded at once), because a reader
that always finds data — a client flooding its connection — must not starve the others. It
differs in one way: after a read that returned less than it asked for (the kernel had nothing
more), the next read waits for the socket to become readable instead of first trying a read that
would fail. In a request/response relay that failed read — a syscall and a raised and caught
:class:`BlockingIOError` — happened on every message.

Resource handling: :meth:`aclose` tells trio the socket is closing (tasks waiting on it get
:class:`trio.ClosedResourceError`) before closing it. Error handling: socket errors become
:class:`trio.BrokenResourceError`, as with trio's own streams.
"""

from __future__ import annotations

import errno
import socket

import trio

DEFAULT_RECEIVE_SIZE = 65536


class LeanSocketStream(trio.abc.HalfCloseableStream):
    """A connected, non-blocking stdlib socket as a trio stream."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._closed = False
        self._sending = False
        self._receiving = False
        # Whether the last read returned less than it asked for: the kernel had nothing more.
        self._drained = False

    @property
    def socket(self) -> socket.socket:
        return self._sock

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this stream was closed")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._check_open()
        if self._sending:
            raise trio.BusyResourceError("another task is writing this stream")
        # (taken before the checkpoint: a task writing at once must see this stream taken)
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            view = memoryview(data)
            while view:
                try:
                    sent = self._sock.send(view)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self._sock)
                    continue
                except OSError as exc:
                    self._check_open()
                    raise trio.BrokenResourceError(f"socket write failed: {exc}") from exc
                view = view[sent:]
        finally:
            self._sending = False

    def send_nowait(self, data: bytes | bytearray | memoryview) -> int:
        """Write what the kernel takes now, without waiting or yielding; the number of bytes.

        For a writer that arms a deadline only when a write has to wait.
        """
        self._check_open()
        if self._sending:
            raise trio.BusyResourceError("another task is writing this stream")
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket write failed: {exc}") from exc

    def send_if_idle(self, data: bytes) -> int | None:
        """See :func:`send_now_if_idle`."""
        if self._sending or self._closed:
            return None
        try:
            return self.send_nowait(data)
        except trio.BrokenResourceError:
            return None  # (the writer task meets the failure and reports it)

    async def wait_send_all_might_not_block(self) -> None:
        self._check_open()
        await trio.lowlevel.wait_writable(self._sock)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        self._check_open()
        if self._receiving:
            raise trio.BusyResourceError("another task is reading this stream")
        size = max_bytes or DEFAULT_RECEIVE_SIZE
        self._receiving = True
        try:
            if not self._drained:
                await trio.lowlevel.checkpoint_if_cancelled()
                try:
                    data = self._sock.recv(size)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise self._broken(exc) from exc
                else:
                    self._drained = len(data) < size
                    await trio.lowlevel.cancel_shielded_checkpoint()  # trio's fairness yield
                    return data
            # The last read left nothing behind (or this one found nothing): the next bytes are
            # most likely not there yet, so wait for them instead of trying a read that fails.
            while True:
                await trio.lowlevel.wait_readable(self._sock)
                try:
                    data = self._sock.recv(size)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise self._broken(exc) from exc
                self._drained = len(data) < size
                return data
        finally:
            self._receiving = False

    def _broken(self, exc: OSError) -> Exception:
        if self._closed:
            return trio.ClosedResourceError("this stream was closed")
        if exc.errno in (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN):
            return trio.BrokenResourceError(f"the connection was reset: {exc}")
        return trio.BrokenResourceError(f"socket read failed: {exc}")

    async def send_eof(self) -> None:
        self._check_open()
        await trio.lowlevel.checkpoint()
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise trio.BrokenResourceError(f"shutdown failed: {exc}") from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self._sock)
            self._sock.close()
        await trio.lowlevel.checkpoint()


def send_now_if_idle(stream: object, data: bytes) -> int | None:
    """Write what the kernel takes of ``data`` now, from the calling task, when no task is
    writing ``stream``: the number of bytes taken; None when it cannot be done that way (a
    stream that cannot write without waiting, one another task is writing, or a failed write:
    the caller queues the bytes for the stream's writer task, which meets the failure itself).

    This is how a hot path saves the hand-off to a writer task (a trip through trio's scheduler
    per message) without two tasks ever writing one stream: the caller writes only while that
    writer is idle, without yielding, so the writer cannot start in between; what the kernel
    does not take at once is queued for the writer, behind nothing.
    """
    send_if_idle = getattr(stream, "send_if_idle", None)
    return send_if_idle(data) if send_if_idle is not None else None


def send_what_fits(stream: trio.abc.SendStream, data: bytes | bytearray | memoryview) -> int:
    """Write what the kernel takes now of ``data``, without waiting or yielding: the number of
    bytes (:meth:`LeanSocketStream.send_nowait`); 0 for a stream that cannot write that way.

    For writers that arm a deadline only when a write has to wait: the caller sends the rest
    with ``send_all`` under its deadline.
    """
    send_nowait = getattr(stream, "send_nowait", None)
    return int(send_nowait(data)) if send_nowait is not None else 0
