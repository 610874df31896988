"""What is in flight between a client and its container, and what to replay after a restart.

The relay peeks at each frame (:func:`~reactor_fabric.protocol.jsonrpc.peek`) and tells
the ledger. The ledger knows:

- which client requests await a response (answered with -32002 if the container dies);
- which server→client requests (sampling, roots, elicitation) await the client, since a
  container must not be torn down for idleness while a human is answering it;
- the client's ``initialize`` request and ``notifications/initialized``, so that a fresh
  container (after idle teardown or a crash) can be brought to the same state transparently.
  The replayed ``initialize`` gets an id of the orchestrator's own, and its response is
  swallowed.

Pure and synchronous.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .jsonrpc import Peek, RequestId, decode_params, with_id

INITIALIZE = "initialize"
INITIALIZED = "notifications/initialized"
CANCELLED = "notifications/cancelled"
REPLAY_ID_PREFIX = "reactor-fabric-replay-"


@dataclass(frozen=True)
class Replay:
    """The frames to send a fresh container before the client's next message."""

    initialize: bytes
    initialize_id: str
    initialized: bytes | None


@dataclass
class Ledger:
    client_requests: dict[RequestId, str] = field(default_factory=dict)
    server_requests: set[RequestId] = field(default_factory=set)
    _initialize: bytes | None = None
    _initialized: bytes | None = None
    _replays: int = 0
    _pending_replay_ids: set[str] = field(default_factory=set)

    @property
    def busy(self) -> bool:
        """Whether any request, in either direction, awaits its response."""
        return bool(self.client_requests or self.server_requests)

    def from_client(self, message: Peek, frame: bytes) -> None:
        if message.kind == "request":
            assert message.id is not None
            assert message.method is not None
            self.client_requests[message.id] = message.method
            if message.method == INITIALIZE:
                # A client that initializes again starts over: the newest handshake is replayed.
                self._initialize, self._initialized = frame, None
        elif message.kind == "response":
            self.server_requests.discard(message.id)
        elif message.method == INITIALIZED:
            self._initialized = frame
        elif message.method == CANCELLED:
            cancelled = _cancelled_request_id(message)
            if cancelled is not None:
                # The server need not answer a cancelled request; stop waiting for it.
                self.client_requests.pop(cancelled, None)

    def from_server(self, message: Peek) -> bool:
        """Record a server frame; False when it must not reach the client (a replay answer)."""
        if message.kind == "response":
            if isinstance(message.id, str) and message.id in self._pending_replay_ids:
                self._pending_replay_ids.discard(message.id)
                return False
            if message.id is not None:
                self.client_requests.pop(message.id, None)
        elif message.kind == "request":
            assert message.id is not None
            self.server_requests.add(message.id)
        return True

    def replay(self) -> Replay | None:
        """What a fresh container needs to continue the client's MCP session, if anything."""
        if self._initialize is None:
            return None  # stateless (2026-07-28) clients, or none has initialized yet
        self._replays += 1
        replay_id = f"{REPLAY_ID_PREFIX}{self._replays}"
        self._pending_replay_ids.add(replay_id)
        return Replay(with_id(self._initialize, replay_id), replay_id, self._initialized)

    def container_gone(self) -> list[tuple[RequestId, str]]:
        """The client requests that will never be answered now, and forget every request."""
        lost = list(self.client_requests.items())
        self.client_requests.clear()
        # Server→client requests of a dead container: the client's answers go nowhere useful.
        self.server_requests.clear()
        self._pending_replay_ids.clear()
        return lost


def _cancelled_request_id(message: Peek) -> RequestId | None:
    params = decode_params(message.params)
    if isinstance(params, dict):
        request_id = params.get("requestId")
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            return request_id
    return None
