"""docker-py under trio: every call in a worker thread, on a client of its own.

A ``docker.APIClient`` is a requests session, which is not meant to be shared by threads that
use it at the same time; the pool lends one client per call and makes another when all are
busy. Calls are bounded by the client's timeout (``CALL_TIMEOUT``); the long waits (a
container's exit) run in short rounds so that a cancelled wait frees its thread soon.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

import docker
import docker.utils
import trio

T = TypeVar("T")
CALL_TIMEOUT: Final = 30


class DockerPool:
    """Lends docker-py clients to worker threads; :meth:`close` closes them all."""

    def __init__(self, client: docker.APIClient, connect: dict[str, Any]) -> None:
        self._connect = connect
        self._version: str = client.api_version
        self._free: list[docker.APIClient] = [client]
        self._lock = threading.Lock()
        self._closed = False
        # Waits for exits hold a thread each for as long as a container runs: they get their
        # own limiter, so that they never starve the short calls of trio's default one.
        self.wait_limiter = trio.CapacityLimiter(1000)

    @classmethod
    def connect(cls) -> DockerPool:
        """Blocking: the engine of the environment (``DOCKER_HOST``, else the local socket)."""
        connect: dict[str, Any] = dict(docker.utils.kwargs_from_env())
        client = docker.APIClient(version="auto", timeout=CALL_TIMEOUT, **connect)
        try:
            client.ping()
        except BaseException:
            client.close()
            raise
        return cls(client, connect)

    def _borrow(self) -> docker.APIClient:
        with self._lock:
            if self._free:
                return self._free.pop()
        return docker.APIClient(version=self._version, timeout=CALL_TIMEOUT, **self._connect)

    def _give_back(self, client: docker.APIClient) -> None:
        with self._lock:
            if not self._closed:
                self._free.append(client)
                return
        client.close()

    def call(self, work: Callable[[docker.APIClient], T]) -> T:
        """Blocking: ``work`` with a lent client."""
        client = self._borrow()
        try:
            return work(client)
        finally:
            self._give_back(client)

    async def run(
        self, work: Callable[[docker.APIClient], T], *, abandon: bool = False, wait: bool = False
    ) -> T:
        """``work`` in a worker thread. ``abandon``: a cancellation does not wait for the
        thread (which still gives its client back); ``wait``: counted as a long wait."""
        limiter = self.wait_limiter if wait else None
        return await trio.to_thread.run_sync(
            self.call, work, abandon_on_cancel=abandon, limiter=limiter
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for client in free:
            client.close()
