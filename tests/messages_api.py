"""A scripted stand-in for the Anthropic Messages API, to drive a real client of it (Claude Code
run headless, ``claude -p``) without a model or a key.

Point the client at it (``ANTHROPIC_BASE_URL=api.url``, any ``ANTHROPIC_API_KEY``) and give it a
script: what the "model" answers at each ``/v1/messages`` request, in order. A step is a list of
content blocks (:class:`Text`, :class:`ToolUse`); a step with a ``ToolUse`` ends its turn with
``stop_reason: "tool_use"``, so the client runs the tool and sends its result in the next
request — which gets the next step. A step may also be a function of the request's body that
returns the blocks (to answer with what a tool returned, say), or a :class:`Hold`: a slow model,
whose answer waits until the test releases it while later requests are served.

What it serves:

- ``POST /v1/messages`` (any query: Claude Code adds ``?beta=true``): the next step, as one JSON
  message, or, when the body says ``"stream": true``, as the API's server-sent events
  (``message_start``, per block ``content_block_start`` / ``content_block_delta`` — ``text_delta``
  or ``input_json_delta`` — / ``content_block_stop``, then ``message_delta`` with the stop reason
  and ``message_stop``). The ``model`` echoed is the request's; usage counts are token-ish
  placeholders.
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, N a rough count (bytes / 4).
- anything else: 404 with an API-shaped error (``{"type": "error", "error": {...}}``), recorded
  like every request, so a test sees what else a client asked for.

It refuses, with a 400 ``invalid_request_error`` (which clients do not retry, unlike a 5xx): a
request once the script is done ("the script is exhausted"), and a ``ToolUse`` step naming a tool
the request does not offer in its ``tools`` (Claude Code defers MCP tools behind its tool search
unless ``ENABLE_TOOL_SEARCH=false``; the refusal names the tools offered, so that a test says why
rather than the client looping). The refusal is recorded in :attr:`MessagesAPI.refusals`.

Each answer's message id is ``msg_rf_<step>``, as the API gives each message its own; with
``message_id`` every answer has that one id, as some LLM gateways answer (a client that counts
its turns by message id sees one).

What it does not do: thinking blocks, images, server tools, batches, the models or files
endpoints, errors on demand, or any check of the API key or of what the request asks
(``max_tokens``, ``thinking``, betas) — it answers the script whatever was asked.

Bounded: request bodies up to :data:`MAX_BODY` bytes (413 beyond, and one without a
``Content-Length`` is refused: 411), at most :data:`MAX_RECORDED` requests kept, at most
:data:`MAX_CONNECTIONS` connections served at once (more are closed unanswered), every read
under a socket timeout.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# Claude Code sends its whole system prompt, tool schemas and history at each turn (about 50 KB
# for a first turn with a few MCP servers' tools); a long session grows well past that.
MAX_BODY = 16 * 1024 * 1024
MAX_RECORDED = 1000
MAX_CONNECTIONS = 16
READ_TIMEOUT = 30.0


@dataclass(frozen=True)
class Text:
    """A text block of the model's answer."""

    text: str


@dataclass(frozen=True)
class ToolUse:
    """A ``tool_use`` block: the model calls ``name`` (as the client names it: Claude Code's MCP
    tools are ``mcp__<server>__<tool>``) with ``input``. Its id is the server's
    (``toolu_rf_<n>``, counted over the server's life)."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)
    # A model asking for a tool it was not offered (a jailbreak, a confused model): sent as it
    # is instead of refused, to see what the client does with it.
    unoffered: bool = False


Block = Text | ToolUse


@dataclass(frozen=True)
class Hold:
    """A step whose answer is held (a slow model): taken when its request comes (the next
    request gets the next step, and is served meanwhile), answered ``then`` once ``until`` is
    set, or after ``bound`` seconds at most."""

    until: threading.Event
    then: Sequence[Block]
    bound: float = 120.0


Step = Sequence[Block] | Callable[[dict[str, Any]], Sequence[Block]] | Hold


@dataclass(frozen=True)
class Received:
    """One request as it arrived: ``body`` parsed when it was JSON (else ``None``)."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


class MessagesAPI:
    """The server's state: the script, what was received, what was refused."""

    def __init__(self, script: Sequence[Step], message_id: str | None = None) -> None:
        self.url = ""
        self._script = list(script)
        self._message_id = message_id
        self._next_step = 0
        self._tool_ids = 0
        self.received: list[Received] = []
        self.refusals: list[str] = []
        # Reentrant: a step (a function) may read what was received, under the same lock.
        self._lock = threading.RLock()

    # What a test reads.

    def messages_requests(self) -> list[dict[str, Any]]:
        """The bodies of the ``/v1/messages`` requests received, in order."""
        with self._lock:
            return [
                r.body
                for r in self.received
                if r.body is not None and urlsplit(r.path).path == "/v1/messages"
            ]

    def tool_results(self) -> dict[str, Any]:
        """Tool use id → the ``content`` of the ``tool_result`` the client sent for it (each
        request repeats the history: a result is taken from the first request holding it)."""
        results: dict[str, Any] = {}
        for body in self.messages_requests():
            for message in body.get("messages", []):
                if message.get("role") != "user" or not isinstance(message.get("content"), list):
                    continue
                for block in message["content"]:
                    if block.get("type") == "tool_result":
                        results.setdefault(block["tool_use_id"], block.get("content"))
        return results

    @property
    def steps_served(self) -> int:
        with self._lock:
            return self._next_step

    # What the handler asks.

    def record(self, received: Received) -> None:
        with self._lock:
            if len(self.received) < MAX_RECORDED:
                self.received.append(received)

    def next_answer(self, request: dict[str, Any]) -> dict[str, Any] | str:
        """The message answering ``request`` (the next step), or why it is refused."""
        with self._lock:
            if self._next_step >= len(self._script):
                return self._refuse(
                    f"the script is exhausted: all {len(self._script)} steps were served"
                )
            step = self._script[self._next_step]
            if not isinstance(step, Hold):
                blocks = list(step(request) if callable(step) else step)
                return self._answer(request, blocks, self._next_step)
            taken = self._next_step
            self._next_step += 1
        # Held outside the lock: other requests are answered meanwhile.
        step.until.wait(step.bound)
        with self._lock:
            return self._answer(request, list(step.then), taken, held=True)

    def _answer(
        self, request: dict[str, Any], blocks: list[Block], index: int, *, held: bool = False
    ) -> dict[str, Any] | str:
        """Step ``index``'s ``blocks`` as the message answering ``request`` (taken then, unless
        ``held``: taken when its request came), or why it is refused."""
        offered = {tool.get("name") for tool in request.get("tools") or []}
        for block in blocks:
            if isinstance(block, ToolUse) and block.name not in offered and not block.unoffered:
                return self._refuse(
                    f"step {index} uses the tool {block.name!r}, which the request "
                    f"does not offer (it offers {sorted(str(n) for n in offered)})"
                )
        if not held:
            self._next_step += 1
        content: list[dict[str, Any]] = []
        for block in blocks:
            if isinstance(block, Text):
                content.append({"type": "text", "text": block.text})
            else:
                self._tool_ids += 1
                content.append(
                    {
                        "type": "tool_use",
                        "id": f"toolu_rf_{self._tool_ids}",
                        "name": block.name,
                        "input": block.input,
                    }
                )
        uses_tool = any(isinstance(block, ToolUse) for block in blocks)
        return {
            "id": self._message_id or f"msg_rf_{index + 1}",
            "type": "message",
            "role": "assistant",
            "model": request.get("model", "scripted"),
            "content": content,
            "stop_reason": "tool_use" if uses_tool else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": max(1, len(content))},
        }

    def _refuse(self, reason: str) -> str:
        self.refusals.append(reason)
        return reason


def stream_events(message: dict[str, Any]) -> bytes:
    """``message`` as the API streams it: server-sent events, one per step of its building."""
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    **message,
                    "content": [],
                    "stop_reason": None,
                    "usage": {**message["usage"], "output_tokens": 0},
                },
            },
        )
    ]
    for index, block in enumerate(message["content"]):
        start: dict[str, Any]
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


class _Handler(http.server.BaseHTTPRequestHandler):
    api: MessagesAPI
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's HTTP agent expects
    timeout = READ_TIMEOUT

    def _serve(self) -> None:
        length_header = self.headers.get("Content-Length")
        if length_header is None and self.command in ("POST", "PUT"):
            self._error(411, "invalid_request_error", "a body needs a Content-Length")
            return
        length = int(length_header or "0")
        if length > MAX_BODY:
            self._error(413, "request_too_large", f"the body exceeds {MAX_BODY} bytes")
            self.close_connection = True  # its body is left unread
            return
        raw = self.rfile.read(length) if length else b""
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else None
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.api.record(Received(self.command, self.path, headers, body))
        path = urlsplit(self.path).path
        if self.command == "POST" and path == "/v1/messages/count_tokens":
            self._json(200, {"input_tokens": max(1, len(raw) // 4)})
        elif self.command == "POST" and path == "/v1/messages" and body is not None:
            answer = self.api.next_answer(body)
            if isinstance(answer, str):
                self._error(400, "invalid_request_error", answer)
            elif body.get("stream"):
                self._send(200, "text/event-stream", stream_events(answer))
            else:
                self._json(200, answer)
        else:
            self._error(404, "not_found_error", f"{self.command} {path} is not scripted")

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _json(self, status: int, value: dict[str, Any]) -> None:
        self._send(status, "application/json", json.dumps(value).encode())

    def _error(self, status: int, kind: str, message: str) -> None:
        self._json(status, {"type": "error", "error": {"type": kind, "message": message}})

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a test reads :attr:`MessagesAPI.received`."""


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: closed unanswered
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


@contextmanager
def scripted_messages_api(
    script: Sequence[Step], host: str = "127.0.0.1", message_id: str | None = None
) -> Iterator[MessagesAPI]:
    """The stand-in serving ``script`` on a free port of ``host`` (``api.url``: what
    ``ANTHROPIC_BASE_URL`` takes; a client in a container needs a ``host`` it can reach),
    every message under ``message_id`` when given, stopped on leaving."""
    api = MessagesAPI(script, message_id)
    handler = type("Handler", (_Handler,), {"api": api})
    server = _Server((host, 0), handler)
    shown = f"[{host}]" if ":" in host else host
    api.url = f"http://{shown}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="messages-api", daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
