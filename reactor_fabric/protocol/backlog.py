"""Client messages waiting for a backend that is not ready yet: in order, counted in bytes, the
ids of the requests among them indexed (a duplicate is refused without a scan). Pure."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

from .jsonrpc import REQUEST, Peek, RequestId


class Backlog:
    """The messages waiting, oldest first, with their frames."""

    def __init__(self) -> None:
        # Read directly on every client message (``len()`` and truth of this class would be
        # a Python call each; of the deque, none).
        self.items: collections.deque[tuple[Peek, bytes]] = collections.deque()
        self.bytes = 0
        self._requests: set[RequestId] = set()

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[tuple[Peek, bytes]]:
        return iter(self.items)

    def has_request(self, request_id: RequestId) -> bool:
        return request_id in self._requests

    def append(self, message: Peek, frame: bytes) -> None:
        self.items.append((message, frame))
        self.bytes += len(frame)
        if message.kind == REQUEST:
            assert message.id is not None
            self._requests.add(message.id)

    def drain(self) -> list[tuple[Peek, bytes]]:
        """Every message waiting, oldest first; the backlog is empty after."""
        items = list(self.items)
        self.items.clear()
        self.bytes = 0
        self._requests.clear()
        return items

    def drain_to_second(self, counts: Callable[[Peek], bool]) -> list[tuple[Peek, bytes]]:
        """The messages waiting, oldest first, up to the second for which ``counts`` is true
        (that one and the rest keep waiting; all go if there is no second)."""
        taken: list[tuple[Peek, bytes]] = []
        seen = False
        while self.items:
            message, frame = self.items[0]
            if counts(message):
                if seen:
                    break
                seen = True
            self.items.popleft()
            taken.append((message, frame))
            self.bytes -= len(frame)
            if message.kind == REQUEST:
                self._requests.discard(message.id)
        return taken

    def clone(self) -> Backlog:
        twin = Backlog()
        twin.items = collections.deque(self.items)
        twin.bytes = self.bytes
        twin._requests = set(self._requests)
        return twin

    def frames(self) -> tuple[bytes, ...]:
        return tuple(frame for _message, frame in self.items)
