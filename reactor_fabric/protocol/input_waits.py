"""Calls waiting for the client's input, for clients that cannot be asked (MCP 2026-07-28).

A handshake-era server asks its client during a call: ``elicitation/create`` or
``sampling/createMessage`` is a request of its own, and the call's answer comes once the client
answered it. A 2026-07-28 client is never sent a request: the server answers the *call* with an
``input_required`` result (``inputRequests``: the questions, keyed; ``requestState``: an opaque
token), and the client retries the call with ``inputResponses`` under the same keys and the
token (SEP-2322). The fabric endpoint stands between the two: a backend's question becomes an
``input_required`` result of the client's call, and the call *waits* — its container keeps
running, its backend still waiting on its question — until the client's retry brings the
answer, which goes to the backend under the backend's own id; the call then goes on, and its
answer (or the next question) is the retry's answer. So the retry reaches **the container the
call runs in**, whatever the service's lifecycle: a per-call container is not removed, a
retiring one not retired, while its call waits.

This module keeps the waits (:class:`InputWaits`) and makes the messages; the router's
requests in flight (:mod:`.fabric_exchanges`) decide when a call waits and move the answers.

Bounds and errors:

- A wait lasts at most :data:`INPUT_WAIT_SECONDS`; then the questions are answered to the
  backend -32006 ``client_did_not_answer``, the call is given up (a per-call container removed,
  ``input_wait_expired``; another cancelled), and a late retry is answered -32600
  ``input_wait_over`` saying so.
- A ``requestState`` is valid for one retry: each round gets a new one, and an unknown or spent
  one gets ``input_wait_over`` (why it ended is kept for the last :data:`MAX_ENDED` waits).
- The client's retry must repeat the call it resumes (method, tool, prompt or URI); one that
  names another is refused -32602 and the wait stays.
- The questions of all waits count with the session's other requests to the client
  (:data:`~.answers.MAX_SERVER_REQUESTS`).

Pure: no I/O, no clock (times are given).
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

from .events import BackendKey
from .tool_calls import result_type

Json = dict[str, Any]

# A backend's questions a 2026-07-28 client answers by retrying its call, by the capability
# the client must declare (in the call's _meta) to be asked.
CAPABILITY_OF: Final = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation"}
# The client's requests that may end in input_required (SEP-2322's multi-round-trip carriers).
INTERACTIVE: Final = frozenset({"tools/call", "resources/read", "prompts/get"})
# How long a call waits for the client's retry (the same bound as a question to a
# handshake-era client, ASK_SECONDS).
INPUT_WAIT_SECONDS: Final = 300.0
# Waits whose end is remembered, to tell a late retry why.
MAX_ENDED: Final = 32
CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"


@dataclass
class InputWait:
    """A client's call answered ``input_required``: it waits in its container for the retry."""

    key: BackendKey  # the container the call runs in
    call_id: int  # the call's id towards that backend
    method: str  # tools/call, resources/read, prompts/get
    target: object  # its tool or prompt name, or URI: a retry must repeat it
    deadline: float
    offers: tuple[str, ...] = ()  # what the client said, with the call, it may be asked
    state: str = ""  # the requestState the client must send back (a new one each round)
    # The backend's questions the client has yet to answer: key → (the backend's id, the
    # question as the client is shown it).
    asked: dict[str, tuple[object, Json]] = field(default_factory=dict)
    answer: Json | None = None  # the call's answer, come while no retry was there to take it
    rounds: int = 0
    _keys: int = 0

    def ask(self, backend_id: object, method: str, params: object) -> None:
        self._keys += 1
        question: Json = {"method": method}
        if isinstance(params, dict):
            question["params"] = params
        self.asked[f"q{self._keys}"] = (backend_id, question)

    def result(self) -> Json:
        """The ``input_required`` result of this round (its ``requestState`` is :attr:`state`)."""
        return {
            "resultType": "input_required",
            "inputRequests": {key: question for key, (_id, question) in self.asked.items()},
            "requestState": self.state,
        }


class InputWaits:
    """The session's calls waiting for its client's retry, by their ``requestState``."""

    def __init__(self) -> None:
        self.waiting: dict[str, InputWait] = {}
        # Why recent waits ended, for a late retry's error (the oldest forgotten first).
        self.ended: collections.OrderedDict[str, str] = collections.OrderedDict()

    def open(self, wait: InputWait, token: int) -> InputWait:
        """``wait`` starts a round (the client is about to get its result): a new state."""
        wait.rounds += 1
        wait.state = f"rf-{wait.call_id}-{wait.rounds}-{token}"
        self.waiting[wait.state] = wait
        return wait

    def take(self, state: str) -> InputWait | None:
        """The wait the client's retry resumes (it waits no more: its state is spent)."""
        wait = self.waiting.pop(state, None)
        if wait is not None:
            self._end(state, "it was resumed already: each requestState is good for one retry")
        return wait

    def put_back(self, wait: InputWait) -> None:
        """A retry that could not resume ``wait`` (it named another call): it still waits."""
        self.ended.pop(wait.state, None)
        self.waiting[wait.state] = wait

    def of_call(self, key: BackendKey, call_id: int) -> InputWait | None:
        for wait in self.waiting.values():
            if wait.key == key and wait.call_id == call_id:
                return wait
        return None

    def on(self, key: BackendKey) -> list[InputWait]:
        return [wait for wait in self.waiting.values() if wait.key == key]

    def holds(self, key: BackendKey) -> bool:
        return any(wait.key == key for wait in self.waiting.values())

    def questions(self) -> int:
        return sum(len(wait.asked) for wait in self.waiting.values())

    def withdrawn(self, key: BackendKey, backend_id: object) -> None:
        """The backend cancelled its question: the client's answer to it is not wanted."""
        for wait in self.on(key):
            for question_key, (asked_id, _question) in list(wait.asked.items()):
                if asked_id == backend_id:
                    del wait.asked[question_key]

    def drop(self, key: BackendKey, why: str) -> list[InputWait]:
        """The backend ``key`` is gone: its waits end (a late retry is told ``why``)."""
        dropped = self.on(key)
        for wait in dropped:
            self._forget(wait, why)
        return dropped

    def expired(self, now: float) -> list[InputWait]:
        """The waits past their deadline, ended."""
        due = [wait for wait in self.waiting.values() if wait.deadline <= now]
        for wait in due:
            self._forget(wait, f"the client did not retry within {INPUT_WAIT_SECONDS:g} s")
        return due

    def clear(self) -> None:
        self.waiting.clear()

    def why(self, state: object) -> str:
        if isinstance(state, str) and state in self.ended:
            return self.ended[state]
        return "no call of this session waits under it (it expired, or was never issued here)"

    def deadlines(self) -> list[float]:
        return [wait.deadline for wait in self.waiting.values()]

    def _forget(self, wait: InputWait, why: str) -> None:
        self.waiting.pop(wait.state, None)
        self._end(wait.state, why)

    def _end(self, state: str, why: str) -> None:
        self.ended[state] = why
        self.ended.move_to_end(state)
        while len(self.ended) > MAX_ENDED:
            self.ended.popitem(last=False)

    # --- model checking -----------------------------------------------------------------------

    def clone(self) -> InputWaits:
        twin = InputWaits()
        copies = {
            id(wait): dataclasses.replace(wait, asked=dict(wait.asked))
            for wait in self.waiting.values()
        }
        twin.waiting = {state: copies[id(wait)] for state, wait in self.waiting.items()}
        twin.ended = collections.OrderedDict(self.ended)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return (
            tuple(sorted((state, repr(wait)) for state, wait in self.waiting.items())),
            tuple(self.ended.items()),
        )


def asks_for_input(line: bytes) -> bool:
    """Whether a server's answer is a 2026-07-28 ``input_required`` result (the relay's
    servers that speak 2026-07-28 make their own). Cheap on every other answer: only a line
    that holds the word is decoded, and only its result's ``resultType``."""
    return b'"input_required"' in line and result_type(line) == "input_required"


def offered(params: Json) -> tuple[str, ...]:
    """What a 2026-07-28 client's request says it may be asked (its ``clientCapabilities``)."""
    meta = params.get("_meta")
    capabilities = meta.get(CLIENT_CAPABILITIES) if isinstance(meta, dict) else None
    if not isinstance(capabilities, dict):
        return ()
    return tuple(sorted(c for c in set(CAPABILITY_OF.values()) if c in capabilities))
