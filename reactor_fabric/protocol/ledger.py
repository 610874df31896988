"""What is in flight between a client and its container, and what to replay after a restart.

The session tells the ledger about every frame it relays (as peeked by
:func:`~reactor_fabric.protocol.jsonrpc.peek`). The ledger knows:

- which client requests await a response (answered with an error if the container dies);
- which server→client requests (sampling, roots, elicitation) await the client, and until when:
  a container is not torn down for idleness while a human may be answering one, but one the
  client never answers expires, so it cannot hold the container forever;
- that an id stands for one request in flight per direction: recording a second one under an
  id still in flight raises :class:`~reactor_fabric.protocol.jsonrpc.IdInFlight` (the session
  machine refuses it first, ``duplicate_request_id``), so no request is silently forgotten;
- the client's ``initialize`` request and ``notifications/initialized``, so that a fresh
  container (after idle teardown or a crash) can be brought to the same state transparently.
  The replayed ``initialize`` gets an id of the orchestrator's own, and its response is
  swallowed.

Pure and synchronous; time is given by the caller.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .._errors import FabricError
from .answers import too_many_requests_to_client
from .jsonrpc import (
    NOTIFICATION,
    REQUEST,
    RESPONSE,
    IdInFlight,
    Peek,
    RequestId,
    decode_params,
    duplicate_request,
    id_readings,
    with_id,
)

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
    # Server→client request id → the time it expires.
    server_requests: dict[RequestId, float] = field(default_factory=dict)
    _initialize: bytes | None = None
    _initialized: bytes | None = None
    _replays: int = 0

    @property
    def busy(self) -> bool:
        """Whether any request, in either direction, awaits its response."""
        return bool(self.client_requests or self.server_requests)

    @property
    def knows_handshake(self) -> bool:
        return self._initialize is not None

    def from_client(self, message: Peek, frame: bytes) -> None:
        kind = message.kind
        if kind == REQUEST:
            assert message.id is not None
            assert message.method is not None
            if message.id in self.client_requests:
                raise IdInFlight(f"client request id {message.id!r} is already in flight")
            self.client_requests[message.id] = message.method
            if message.method == INITIALIZE:
                # A client that initializes again starts over: the newest handshake is replayed.
                self._initialize, self._initialized = frame, None
        elif kind == RESPONSE:
            if message.id is not None:
                self.server_requests.pop(message.id, None)
        elif message.method == INITIALIZED:
            self._initialized = frame
        elif message.method == CANCELLED:
            cancelled = cancelled_request_id(message)
            if cancelled is not None:
                # The server need not answer a cancelled request; stop waiting for it.
                self.client_requests.pop(cancelled, None)

    def from_server(self, message: Peek, *, expires_at: float) -> None:
        """Record a server frame; a server→client request expires at ``expires_at``."""
        if message.kind == RESPONSE:
            if message.id is not None:
                self.client_requests.pop(message.id, None)
        elif message.kind == REQUEST:
            assert message.id is not None
            if message.id in self.server_requests:
                raise IdInFlight(f"server request id {message.id!r} is already in flight")
            self.server_requests[message.id] = expires_at
        else:
            assert message.kind == NOTIFICATION

    def answering(self, response_id: RequestId | None) -> RequestId | None:
        """The id of the client request in flight that a server's response under
        ``response_id`` answers, as a client may take it (None: none). Its own id first; else
        one it spells otherwise for some client (``"41"`` for ``41``: see
        :func:`~reactor_fabric.protocol.jsonrpc.id_readings`), the first in the order sent."""
        if response_id is None:
            return None
        if response_id in self.client_requests:
            return response_id
        readings = id_readings(response_id)
        if not readings:
            return None
        for request_id in self.client_requests:
            if readings & id_readings(request_id):
                return request_id
        return None

    def refusal(self, request: Peek, limit: int) -> FabricError | None:
        """Why a server's request is answered at once instead of going to the client, if it
        is: its id still awaits the client (its answer could not be told from the first's:
        refused like a client's duplicate), or ``limit`` of them already do."""
        assert request.id is not None
        if request.id in self.server_requests:
            return duplicate_request(request.id)
        if len(self.server_requests) >= limit:
            return too_many_requests_to_client(limit)
        return None

    def next_expiry(self) -> float | None:
        if not self.server_requests:  # the usual case, on every event: answer at once
            return None
        return min(self.server_requests.values())

    def expire(self, now: float) -> list[RequestId]:
        """Forget the server→client requests due by ``now``; their ids."""
        due = [rid for rid, deadline in self.server_requests.items() if deadline <= now]
        for request_id in due:
            del self.server_requests[request_id]
        return due

    def clone(self) -> Ledger:
        return dataclasses.replace(
            self,
            client_requests=dict(self.client_requests),
            server_requests=dict(self.server_requests),
        )

    def replay_state(self) -> tuple[bytes | None, bytes | None, int]:
        """What the ledger knows for replays (for fingerprints)."""
        return self._initialize, self._initialized, self._replays

    def replay(self) -> Replay | None:
        """What a fresh container needs to continue the client's MCP session, if anything."""
        if self._initialize is None:
            return None  # stateless (2026-07-28) clients, or none has initialized yet
        self._replays += 1
        replay_id = f"{REPLAY_ID_PREFIX}{self._replays}"
        return Replay(with_id(self._initialize, replay_id), replay_id, self._initialized)

    def container_gone(self) -> list[tuple[RequestId, str]]:
        """The client requests that will never be answered now; every request is forgotten."""
        lost = list(self.client_requests.items())
        self.client_requests.clear()
        # Server→client requests of a dead container: the client's answers go nowhere useful.
        self.server_requests.clear()
        return lost


def cancelled_request_id(message: Peek) -> RequestId | None:
    params = decode_params(message.params)
    if isinstance(params, dict):
        request_id = params.get("requestId")
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            return request_id
    return None
