"""The fabric endpoint's requests in flight both ways for one session, without I/O: the ids
its router (:mod:`.fabric_router`) gives them, the backends' questions to the client, and the
calls that wait for a 2026-07-28 client's retry (:mod:`.input_waits`).

Ids. Every request the machine sends — to a backend for the client (:class:`Forwarded`), to the
client for a backend (:class:`Asked`), its own handshakes and list requests, the meta-tools'
questions — gets an id of its own (one counter, :meth:`Exchanges.new_id`), remembered with
where the answer goes; an answer comes back under the id its asker used. So the client's ids
and each backend's ids never meet. Cancellation (``notifications/cancelled``) is mapped the
same way; progress notifications pass as they are (the client's ``progressToken`` travels with
the request).

Requests from a backend (:meth:`Exchanges.backend_request`): ``roots/list`` is answered here
from the session's mounts (``file://`` URIs of their targets); ``ping`` here too; sampling and
elicitation go to the client when it declared the capability, else are refused (-32601). A
2026-07-28 client is never sent a request: the call the question belongs to is answered
``input_required`` and waits for the client's retry (see :mod:`.input_waits`). A backend request
under an id that backend still waits on is refused (-32600 ``duplicate_request_id``). At most
:data:`~.answers.MAX_SERVER_REQUESTS` backend requests wait for the client at once, as on the
relay; one more is answered to its backend -32006 ``too_many_requests_to_client``. A request
the client does not answer within :data:`ASK_SECONDS` is answered to its backend -32006
``client_did_not_answer`` (when :class:`~.fabric_backends.BackendTable` ticks).

What is answered to a backend is returned as an :class:`OwnReply` for the router to send (its
stdin accounting may find the backend broken); what goes to the client is made through the
session's replies ledger (:class:`~.fabric_replies.Replies`), given when this is made.
"""

from __future__ import annotations

import copy
from collections.abc import Container, Set
from dataclasses import dataclass
from typing import Any

from .._errors import FabricError, InvalidRequest, titled
from .._reasons import INPUT_WAIT_OVER
from .answers import MAX_SERVER_REQUESTS, too_many_requests_to_client
from .events import Action, BackendKey, CallRef, Log, ToClient
from .fabric_messages import CACHE_PRIVATE, complete, encoder, notification_bytes
from .fabric_replies import Replies
from .input_waits import CAPABILITY_OF, INPUT_WAIT_SECONDS, INTERACTIVE, InputWait, InputWaits
from .jsonrpc import duplicate_request, error_response
from .mcp import INVALID_PARAMS, METHOD_NOT_FOUND, TITLES
from .workspace_answers import HeldAnswers

Json = dict[str, Any]

# How long a backend's request to the client (sampling, elicitation) may wait for its answer.
ASK_SECONDS = 300.0


@dataclass(frozen=True)
class Forwarded:
    """A request sent to a backend: whose it is and how to answer it."""

    key: BackendKey  # the backend it went to
    client_id: object  # the client's id (None: our own handshake or list request)
    method: str
    # What a 2026-07-28 client said, with this request, that it may be asked (see input_waits).
    offers: tuple[str, ...] = ()
    target: object = None  # its tool or prompt name, or URI

    @property
    def service(self) -> str:
        return self.key.service


@dataclass(frozen=True)
class Asked:
    """A backend's request passed on to the client."""

    key: BackendKey  # the backend that asked
    backend_id: object
    deadline: float

    @property
    def service(self) -> str:
        return self.key.service


@dataclass(frozen=True)
class OwnReply:
    """Answer the backend with this message of the machine's own."""

    data: bytes


@dataclass(frozen=True)
class Resumed:
    """A call the client's retry resumed (see :meth:`Exchanges.resume`): the answers for its
    backend's questions to send it, then either the call's answer that came meanwhile (to be
    taken as the backend's answer now) or what the retry is answered."""

    key: BackendKey
    replies: tuple[bytes, ...]
    answer: Json | None
    then: tuple[Action, ...] = ()


def target(method: str, params: Json) -> object:
    """What a call names: its tool or prompt, or the URI it reads."""
    return params.get("uri" if method == "resources/read" else "name")


def call_ref(client_id: object, method: str, params: Json, *, task: bool = False) -> CallRef:
    """The call a per-call container serves, as its audit record names it (bounded); with
    ``task``, its task's text and base too (what the container's start needs)."""
    arguments = params.get("arguments") if task else None
    return CallRef.of(client_id, method, target(method, params), arguments)


def refusal(backend_id: object, why: str) -> OwnReply:
    """A backend's question the client cannot be asked (-32601)."""
    error = {"code": METHOD_NOT_FOUND, "message": titled(TITLES[METHOD_NOT_FOUND], why)}
    return OwnReply(encoder.encode({"jsonrpc": "2.0", "id": backend_id, "error": error}))


class Busy(Container[BackendKey]):
    """The backends something is in flight on, asked key by key (``key in busy``): the
    backend rules run after every event and most ask about no backend or one, so nothing is
    collected up front — collecting every key three times per event was the fabric endpoint's
    largest cost per call (measured: callgrind, ``scripts/bench-instructions.py``)."""

    __slots__ = ("_exchanges",)

    def __init__(self, exchanges: Exchanges) -> None:
        self._exchanges = exchanges

    def __contains__(self, key: object) -> bool:
        return isinstance(key, BackendKey) and self._exchanges.busy_on(key)


class Exchanges:
    """A session's requests in flight both ways, by the ids it gave them (see the module's
    docs)."""

    def __init__(self, replies: Replies) -> None:
        self.replies = replies
        self.next_id = 0
        self.forwarded: dict[int, Forwarded] = {}
        self.asked: dict[int, Asked] = {}
        self.waits = InputWaits()  # calls waiting for a 2026-07-28 client's retry
        # Answers of per-call containers working on a copy, until it is recorded.
        self.held: HeldAnswers[Forwarded] = HeldAnswers()

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def remember(
        self,
        request: Json,
        key: BackendKey,
        client_id: object,
        method: str,
        offers: tuple[str, ...] = (),
    ) -> None:
        """A call for the backend ``key``: ``request`` gets its id, its answer goes to the
        client's ``client_id``."""
        request["id"] = self.new_id()
        params = request.get("params")
        named = target(method, params) if isinstance(params, dict) else None
        self.bind(request["id"], Forwarded(key, client_id, method, offers, named))

    def bind(self, our_id: int, forwarded: Forwarded) -> None:
        """The backend's answer to ``our_id`` goes to the client's request ``forwarded`` names
        (a call sent now, or one resumed by the client's retry: see resume)."""
        self.forwarded[our_id] = forwarded
        if isinstance(forwarded.client_id, str | int):
            # (a tools/call's record names its container)
            self.replies.calls.serve(forwarded.client_id, forwarded.key.seq)

    def own(self, key: BackendKey, method: str) -> int:
        """A request of the machine's own for the backend ``key`` (its handshake, a list): its
        id, the answer remembered as the machine's."""
        our_id = self.new_id()
        self.forwarded[our_id] = Forwarded(key, None, method)
        return our_id

    def busy(self) -> Busy:
        """The backends something is in flight on: a call, a question to the client, a call
        waiting for a 2026-07-28 client's retry (see :class:`Busy`)."""
        return Busy(self)

    def busy_on(self, key: BackendKey) -> bool:
        """Whether something is in flight on the backend ``key``."""
        return (
            any(forwarded.key == key for forwarded in self.forwarded.values())
            or any(asked.key == key for asked in self.asked.values())
            or self.waits.holds(key)
        )

    def waits_on(self, client_id: object) -> bool:
        """Whether a call of the client's under this id is at a backend."""
        return any(f.client_id == client_id for f in self.forwarded.values())

    def agent_calls(self, agents: Set[str]) -> int:
        """The client's calls of ``agents``' services sent or waiting to be sent, not answered
        yet (a cancelled one, one whose container ended, one answered with the session's end
        are gone from these)."""
        return sum(
            1
            for forwarded in self.forwarded.values()
            if forwarded.client_id is not None and forwarded.service in agents
        )

    # --- answers ------------------------------------------------------------------------------

    def answered(self, key: BackendKey, message: Json) -> Forwarded | None:
        """The backend ``key`` answered: the request it answers, no longer in flight (None: an
        answer to nothing it was asked; or a call waiting for the client's retry, whose answer
        the retry takes)."""
        our_id = message.get("id")
        if not isinstance(our_id, int):
            return None
        forwarded = self.forwarded.get(our_id)
        if forwarded is None:
            wait = self.waits.of_call(key, our_id)
            if wait is not None:
                wait.answer = message  # the client's retry takes it
            return None
        if forwarded.key != key:
            return None
        del self.forwarded[our_id]
        return forwarded

    def relay(self, forwarded: Forwarded, message: Json) -> ToClient:
        """A backend's answer to the client's request, under the client's id."""
        reply = {k: v for k, v in message.items() if k != "id"}
        reply["id"] = forwarded.client_id
        result = reply.get("result")
        if self.replies.stateless and isinstance(result, dict):
            result = complete(result)
            reply["result"] = (
                {**CACHE_PRIVATE, **result} if forwarded.method == "resources/read" else result
            )
        data = encoder.encode(reply)
        self.replies.ended(forwarded.client_id, data)
        return ToClient(data)

    def client_answer(self, answered: object, message: Json) -> tuple[BackendKey, bytes] | None:
        """The client answered a backend's question: the backend and the answer under its id
        (None: an answer to nothing we asked)."""
        asked = self.asked.pop(answered, None) if isinstance(answered, int) else None
        if asked is None:
            return None
        reply = {k: v for k, v in message.items() if k != "id"}
        reply["id"] = asked.backend_id
        return asked.key, encoder.encode(reply)

    def owed(self, key: BackendKey, error: FabricError) -> list[Action]:
        """The backend ``key`` is gone: what it owed the client is answered with ``error``, its
        questions are withdrawn, the calls waiting in it end."""
        actions: list[Action] = []
        for our_id, forwarded in list(self.forwarded.items()):
            if forwarded.key != key:
                continue
            del self.forwarded[our_id]
            if forwarded.client_id is not None:
                actions.append(self.replies.error(forwarded.client_id, error))
        for our_id, asked in list(self.asked.items()):
            if asked.key == key:
                del self.asked[our_id]
        self.waits.drop(key, f"its container ended ({error.reason})")
        return actions

    def end(self, error: FabricError) -> list[Action]:
        """The session ends: every call in flight is answered ``error``; nothing is owed to the
        backends any more."""
        actions: list[Action] = [
            self.replies.error(forwarded.client_id, error)
            for forwarded in (*self.forwarded.values(), *self.held.end())
            if forwarded.client_id is not None
        ]
        self.forwarded.clear()
        self.asked.clear()
        self.waits.clear()  # (their retries find the session ending)
        return actions

    def cancelled(self, client_id: object) -> tuple[int, Forwarded] | None:
        """The client's request ``client_id`` at a backend, if it is at one."""
        for our_id, forwarded in self.forwarded.items():
            if forwarded.client_id == client_id and forwarded.client_id is not None:
                return our_id, forwarded
        return None

    # --- the backends' questions to the client ------------------------------------------------

    def backend_request(
        self, key: BackendKey, message: Json, roots: list[Json], now: float
    ) -> OwnReply | list[Action]:
        """A backend's request: answered here (``roots``, ping, refusals), or passed on to the
        client, or (a 2026-07-28 client) its call answered ``input_required``."""
        method = str(message.get("method"))
        answer: Json = {"jsonrpc": "2.0", "id": message.get("id")}
        if any(a.key == key and a.backend_id == answer["id"] for a in self.asked.values()):
            # The client's answer could not be told from the first's: refused, as the relay does.
            answer["error"] = duplicate_request(answer["id"]).to_jsonrpc_error()
            return OwnReply(encoder.encode(answer))
        if method == "roots/list":
            answer["result"] = {"roots": roots}
        elif method == "ping":
            answer["result"] = {}
        elif method in CAPABILITY_OF and self.replies.stateless:
            return self.ask_by_result(key, message, now)
        elif CAPABILITY_OF.get(method) in self.replies.client_capabilities:
            if len(self.asked) >= MAX_SERVER_REQUESTS:
                # As on the relay: the client is not asked more than this at once; the
                # backend is told at once (and never waits for the expiry of each).
                too_many = too_many_requests_to_client(MAX_SERVER_REQUESTS)
                return OwnReply(error_response(message.get("id"), too_many))
            our_id = self.new_id()
            self.asked[our_id] = Asked(key, message.get("id"), now + ASK_SECONDS)
            return [ToClient(encoder.encode({**message, "id": our_id}))]
        else:
            return refusal(answer["id"], f"the client does not offer {method}")
        return OwnReply(encoder.encode(answer))

    def ask_by_result(self, key: BackendKey, message: Json, now: float) -> OwnReply | list[Action]:
        """A backend's question while the client is a 2026-07-28 one: the call it belongs to is
        answered ``input_required`` and waits for the client's retry, in its container."""
        method = str(message.get("method"))
        backend_id = message.get("id")
        calls = [
            (our_id, call)
            for our_id, call in self.forwarded.items()
            if call.key == key and call.client_id is not None and call.method in INTERACTIVE
        ]
        waits = self.waits.on(key)
        if len(calls) + len(waits) != 1:
            # On stdio a question does not say which call it is for: a server that runs
            # several at once cannot be asked through results (one per container can).
            why = (
                f"a 2026-07-28 client is asked within a call, and {key.service} has "
                f"{len(calls) + len(waits)} calls in flight: the question cannot be tied to one"
            )
            return refusal(backend_id, why)
        offers = waits[0].offers if waits else calls[0][1].offers
        if CAPABILITY_OF[method] not in offers:
            return refusal(backend_id, f"the client does not offer {method}")
        if len(self.asked) + self.waits.questions() >= MAX_SERVER_REQUESTS:
            too_many = too_many_requests_to_client(MAX_SERVER_REQUESTS)
            return OwnReply(error_response(backend_id, too_many))
        if waits:
            # The client has its round's result already: asked with the next one, at its retry.
            waits[0].ask(backend_id, method, message.get("params"))
            return []
        our_id, call = calls[0]
        del self.forwarded[our_id]
        wait = InputWait(
            key, our_id, call.method, call.target, now + INPUT_WAIT_SECONDS, call.offers
        )
        wait.ask(backend_id, method, message.get("params"))
        return self.park(wait, call.client_id)

    def park(self, wait: InputWait, client_id: object) -> list[Action]:
        """The client's call ``client_id`` is answered ``input_required``: it waits."""
        self.waits.open(wait, self.new_id())
        note = {"backend": wait.key.service, "sequence": wait.key.seq, "round": wait.rounds}
        body = {"jsonrpc": "2.0", "id": client_id, "result": wait.result()}
        return [Log("info", "input_required", note), self.replies.answer(client_id, body)]

    def resume(
        self, service: str, client_id: object, method: str, params: Json, now: float
    ) -> Resumed | list[Action]:
        """The client retries a call that waits (its ``requestState``): its answers go to the
        backend's questions, under the backend's ids, and the call goes on in its container;
        its answer, or the next question, is this retry's answer (a retry that resumes nothing
        is answered at once)."""
        state = params["requestState"]
        wait = self.waits.take(state)
        if wait is None:
            over = InvalidRequest(
                f"this requestState resumes no call: {self.waits.why(state)}; call again "
                "without it",
                reason=INPUT_WAIT_OVER,
            )
            return [self.replies.error(client_id, over)]
        named = target(method, params)
        if (wait.key.service, wait.method, wait.target) != (service, method, named):
            self.waits.put_back(wait)
            other = f"this requestState resumes a {wait.method} of {wait.target!r}, not {named!r}"
            return [self.replies.fail(client_id, INVALID_PARAMS, other)]
        responses = params.get("inputResponses")
        responses = responses if isinstance(responses, dict) else {}
        replies: list[bytes] = []
        for question, (backend_id, _asked) in list(wait.asked.items()):
            response = responses.get(question)
            if isinstance(response, dict):
                del wait.asked[question]
                reply = {"jsonrpc": "2.0", "id": backend_id, "result": response}
                replies.append(encoder.encode(reply))
        self.bind(wait.call_id, Forwarded(wait.key, client_id, method, wait.offers, wait.target))
        if wait.answer is not None:
            return Resumed(wait.key, tuple(replies), {**wait.answer, "id": wait.call_id})
        if wait.asked:  # questions left unanswered, or asked since: another round
            del self.forwarded[wait.call_id]
            wait.deadline = now + INPUT_WAIT_SECONDS
            return Resumed(wait.key, tuple(replies), None, tuple(self.park(wait, client_id)))
        return Resumed(wait.key, tuple(replies), None)

    def withdrawn(self, key: BackendKey, params: Json) -> list[Action]:
        """The backend cancelled its request (``notifications/cancelled``): the client is told
        under the id it was asked with; a question waiting for a retry is withdrawn."""
        self.waits.withdrawn(key, params.get("requestId"))
        asked = [
            i
            for i, a in self.asked.items()
            if a.key == key and a.backend_id == params.get("requestId")
        ]
        for our_id in asked:
            del self.asked[our_id]
            note = {**params, "requestId": our_id}
            return [ToClient(notification_bytes("notifications/cancelled", note))]
        return []

    def deadlines(self) -> list[float]:
        """When the backends' questions to the client expire, and the calls waiting for a
        retry."""
        return [asked.deadline for asked in self.asked.values()] + self.waits.deadlines()

    # --- model checking -----------------------------------------------------------------------

    def clone(self, replies: Replies) -> Exchanges:
        """An independent copy answering through ``replies`` (the twin's ledger)."""
        twin = copy.copy(self)
        twin.replies = replies
        twin.forwarded = dict(self.forwarded)
        twin.asked = dict(self.asked)
        twin.waits = self.waits.clone()
        twin.held = self.held.clone()
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return (
            tuple(sorted(((i, repr(f)) for i, f in self.forwarded.items()))),
            tuple(sorted(((i, repr(a)) for i, a in self.asked.items()))),
            self.next_id,
            self.waits.fingerprint(),
            self.held.fingerprint(),
        )
