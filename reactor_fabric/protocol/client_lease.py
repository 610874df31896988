"""How long a client that may leave without saying so keeps its session: its lease. Pure.

Over Streamable HTTP nothing is connected between requests: a client that stops sending simply
never comes back. Its session holds its containers until the lease runs out — ``seconds`` with
no message either way and nothing else from the client (:class:`~.events.ClientActivity`: a
stream opened or closed, or a request or stream still open when the lease comes due, which the
driver asks the transport then, so that no call pays for telling it). A WebSocket's connection
is its own lease (``seconds`` None): its session ends when the connection does.

Both session machines keep one and take its deadline into theirs; when it runs out they close
the client (which ends the session as a client gone does).
"""

from __future__ import annotations

from dataclasses import dataclass

from .answers import CLOSE_NORMAL
from .events import Action, CloseClient, Log

# The log line of a lease run out (the name operators know from the HTTP transport).
EXPIRED_EVENT = "http_session_expired"


@dataclass
class ClientLease:
    seconds: float | None
    active_at: float
    expired: bool = False

    def touch(self, now: float) -> None:
        """A message went either way, or the client showed it is there."""
        self.active_at = now

    @property
    def deadline(self) -> float | None:
        if self.seconds is None or self.expired:
            return None
        return self.active_at + self.seconds

    def expire_if_due(self, now: float) -> list[Action]:
        """The client's close when the lease ran out (once), else nothing."""
        deadline = self.deadline
        if deadline is None or now < deadline:
            return []
        self.expired = True
        return [
            Log("info", EXPIRED_EVENT, {"idle_seconds": self.seconds}),
            CloseClient(CLOSE_NORMAL, "expired"),
        ]

    def state(self) -> tuple[object, ...]:
        """For a machine's fingerprint."""
        return (self.seconds, self.active_at, self.expired)
