"""A pooled container as the session it is handed to sees it.

A warm pool container (:mod:`.warm_pool`) ran before its session existed: its server may have
written output nobody read yet, and it may carry the session's mounts through the pool's
staging area. :class:`HandedOut` is the runtime's container plus those two: the output read
while it was pooled comes first on its stdout, and its staging is released when it is closed.
It is a :class:`~reactor_fabric.runtime.base.Container`, so the session treats it as one it
started itself.
"""

from __future__ import annotations

import trio

from ..runtime.base import Container, StdinStream
from ..runtime.staging import Staging


class Replayed(trio.abc.ReceiveStream):
    """A stream that first returns bytes read from it before (a pooled server's early output)."""

    def __init__(self, early: bytes, stream: trio.abc.ReceiveStream) -> None:
        self._early = early
        self._stream = stream

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._early:
            await trio.lowlevel.checkpoint()
            size = len(self._early) if max_bytes is None else max_bytes
            data, self._early = self._early[:size], self._early[size:]
            return data
        return await self._stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self._stream.aclose()


class HandedOut:
    """Pooled container ``token`` handed to a session: ``container`` with ``early`` (its
    output read while it was pooled) first on stdout, and ``staging`` (when its mounts were
    attached through it) released for ``token`` when it is closed. ``greeting``: the pool did
    the MCP handshake with it (a fresh_per_call service's), this is its InitializeResult; its
    answer and anything before it were the pool's, and are not on its stdout."""

    def __init__(
        self,
        token: int,
        container: Container,
        early: bytes,
        staging: Staging | None,
        greeting: bytes | None = None,
    ) -> None:
        self.greeting = greeting
        self._token = token
        self._container = container
        self._staging = staging
        self._stdout = Replayed(early, container.stdout) if early else container.stdout

    @property
    def id(self) -> str:
        return self._container.id

    @property
    def name(self) -> str:
        return self._container.name

    @property
    def stdin(self) -> StdinStream:
        return self._container.stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> trio.abc.ReceiveStream:
        return self._container.stderr

    async def aclose(self) -> None:
        try:
            await self._container.aclose()
        finally:
            staging, self._staging = self._staging, None
            if staging is not None:
                await trio.to_thread.run_sync(staging.release, self._token)
