"""HTTP/1.1, the server's side of one connection, sans I/O: bytes in, events out, answers as bytes.

Requests are parsed by llhttp — Node's HTTP parser, through ``httptools`` (the binding uvicorn
uses) — and everything a server must decide on top of a parser is here: the bound on a request
head, bytes read ahead of the handler, keep-alive, ``Expect: 100-continue``, an Upgrade, and the
framing of answers (``Content-Length``, chunked, or close-delimited for HTTP/1.0).

Why not h11 (which this replaced): h11 is pure Python, and parsing a Streamable HTTP request and
writing its answer took about 45 µs in a loop and about 95 µs per call in the orchestrator — some
40 % of the orchestrator's CPU for a small call (docs/BENCHMARKS.md, issue 39). llhttp parses in
C and is as strict where it matters for a server behind a proxy: a ``Content-Length`` beside
``Transfer-Encoding`` or a repeated ``Content-Length`` (request smuggling), whitespace before a
header's colon, bare LF line ends — all refused.

Bounds: a request head larger than ``max_head_bytes`` is refused (431) before more of it is
read; what the client sends ahead of the handler (pipelined requests, a body the handler has not
asked for yet) is counted in :attr:`ServerConnection.buffered_bytes`, which the driver checks
before it reads more.

Errors: :class:`HttpError` with the status to answer; after it the connection is not usable.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

import httptools


class HttpError(Exception):
    """The client broke HTTP/1.1; answer ``status`` and close the connection."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class LocalHttpError(Exception):
    """The server tried to write something HTTP/1.1 does not allow (a bug of ours)."""


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: bytes
    headers: list[tuple[bytes, bytes]]  # names lower-cased, in the order sent
    http_version: str  # "1.1" or "1.0"
    keep_alive: bool  # the client allows another request on the connection
    expects_continue: bool  # ``Expect: 100-continue``: it waits for a 100 before its body
    # The parser stopped after this head for another protocol (Upgrade, CONNECT): what follows
    # it is :attr:`ServerConnection.trailing`, not HTTP.
    upgrade: bool = False
    size: int = 0  # bytes of the head as counted against the bound


@dataclass(frozen=True, slots=True)
class BodyData:
    data: bytes


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA: Final = _Marker("NEED_DATA")  # nothing to return until more bytes come
MESSAGE_END: Final = _Marker("MESSAGE_END")  # the request's body is whole
CLOSED: Final = _Marker("CLOSED")  # the client closed its side between requests

Event = RequestHead | BodyData | _Marker

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
# What may not appear in a header we write: a line break or NUL would start another header.
_UNSAFE = re.compile(rb"[\r\n\0]")
# Statuses whose answer has no body and no framing headers (RFC 9110 §6.4.1).
_NO_BODY = frozenset({204, 304})
# Per header, the bytes the head spends besides its name and value (": " and CRLF).
_HEADER_OVERHEAD = 4


class ServerConnection:
    """One client connection, one request at a time (a pipelined request waits, parsed, in
    the queue of events until the current answer is written).

    Use: :meth:`receive` what the socket gave (``b""`` when it closed) and take
    :meth:`next_event` until :data:`NEED_DATA`; answer with :meth:`respond` or
    :meth:`start` / :meth:`send` / :meth:`end`, write the bytes they return, and
    :meth:`start_next_cycle` when :attr:`reusable`.
    """

    def __init__(self, *, max_head_bytes: int = 16 * 1024) -> None:
        self.max_head_bytes = max_head_bytes
        self._parser = httptools.HttpRequestParser(self)
        self._events: deque[Event] = deque()
        # What the client sent ahead, parsed and not yet taken by next_event (heads and body).
        self.buffered_bytes = 0
        self._failed: HttpError | None = None
        self._closed = False
        self.upgraded = False
        self.trailing = b""  # after an upgrade: the bytes that followed the head
        self._in_message = False  # a request has begun and is not whole yet
        # The head being parsed: bytes fed since it began (checked before each feed), and
        # bytes of its target and headers as the parser hands them over.
        self._in_head = False
        self._head_fed = 0
        self._head_bytes = 0
        self._target = bytearray()
        self._headers: list[tuple[bytes, bytes]] = []
        # Noted as its headers come (one look at each header, not a walk over all per check).
        self._hosts = 0
        self._expects_continue = False
        # The request being answered (its head taken by next_event).
        self.request: RequestHead | None = None
        self._request_done = False  # its MESSAGE_END taken
        self.body_started = False  # some of its body has been received
        self._continue_sent = False
        # The answer.
        self._answer_started = False
        self._answer_done = False
        self._chunked = False
        self._close_after = False

    # --- the request side -------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Parse what the client sent (``b""``: it closed its side). Raises :class:`HttpError`
        (again on every later call, once broken)."""
        if self._failed is not None:
            raise self._failed
        if self._closed or self.upgraded:
            self.trailing += data
            return
        if not data:
            self._closed = True
            if self._in_message:
                self._fail(HttpError("the client closed the connection mid-request"))
            self._events.append(CLOSED)
            return
        if self._in_head:
            # Everything fed since the head began is head (it is not complete yet): check the
            # bound before parsing more of it (the parser keeps an unfinished header whole).
            if self._head_fed > self.max_head_bytes:
                self._fail(HttpError("the request head is too large", 431))
            self._head_fed += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.upgraded = True
            self.trailing = data[upgrade.args[0] :]
            self._mark_upgrade()
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._fail(cause if isinstance(cause, HttpError) else HttpError(str(exc)))
        except httptools.HttpParserError as exc:
            self._fail(HttpError(f"malformed request: {exc}"))

    def _fail(self, error: HttpError) -> None:
        self._failed = error
        raise error

    def next_event(self) -> Event:
        """The next thing the client sent: a :class:`RequestHead`, its :class:`BodyData`,
        :data:`MESSAGE_END`; :data:`CLOSED`; or :data:`NEED_DATA`.

        A request head is returned only once the previous request is whole and answered.
        """
        if self._failed is not None:
            raise self._failed
        events = self._events
        if not events:
            return NEED_DATA
        event = events[0]
        if isinstance(event, RequestHead):
            if self.request is not None:
                return NEED_DATA  # the current request is not done with yet
            events.popleft()
            self.buffered_bytes -= event.size
            self.request = event
            self._request_done = False
            self.body_started = bool(events) and isinstance(events[0], BodyData)
            return event
        if self.request is None and event is not CLOSED:
            return NEED_DATA  # (unreachable: a request's head comes before the rest of it)
        events.popleft()
        if isinstance(event, BodyData):
            self.buffered_bytes -= len(event.data)
        elif event is MESSAGE_END:
            self._request_done = True
        return event

    @property
    def waiting_for_continue(self) -> bool:
        """The client asked for ``100 Continue`` before its body, and has not been sent it."""
        request = self.request
        return (
            request is not None
            and request.expects_continue
            and not self.body_started
            and not self._continue_sent
            and not self._answer_started
        )

    def continue_(self) -> bytes:
        """The ``100 Continue`` to write before reading a body the client holds back."""
        self._continue_sent = True
        return b"HTTP/1.1 100 Continue\r\n\r\n"

    # httptools' callbacks (it calls them during feed_data).

    def on_message_begin(self) -> None:
        self._in_message = True
        self._in_head = True
        self._head_fed = 0
        self._head_bytes = 0
        self._target.clear()
        self._headers = []
        self._hosts = 0
        self._expects_continue = False

    def on_url(self, url: bytes) -> None:
        self._target += url
        self._spend(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self._headers.append((name, value))
        # (_spend inline: this runs once per header of every request)
        self._head_bytes += len(name) + len(value) + _HEADER_OVERHEAD
        if self._head_bytes > self.max_head_bytes:
            raise HttpError("the request head is too large", 431)
        if name == b"host":
            self._hosts += 1
        elif name == b"expect" and value.lower() == b"100-continue":
            self._expects_continue = True

    def _spend(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_head_bytes:
            raise HttpError("the request head is too large", 431)

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise HttpError(f"HTTP/{version} is not supported", 505)
        headers = self._headers
        if version == "1.1" and not self._hosts:
            raise HttpError("an HTTP/1.1 request must have a Host header")
        if self._hosts > 1:
            raise HttpError("more than one Host header")
        expects = self._expects_continue
        self.buffered_bytes += self._head_bytes
        self._events.append(
            RequestHead(
                method=parser.get_method().decode("ascii"),
                target=bytes(self._target),
                headers=headers,
                http_version=version,
                # HTTP/1.0's keep-alive extension is not offered (as h11 did not): its clients
                # get one request per connection.
                keep_alive=version == "1.1" and parser.should_keep_alive(),
                expects_continue=expects,
                size=self._head_bytes,
            )
        )

    def on_body(self, body: bytes) -> None:
        self.buffered_bytes += len(body)
        if self.request is not None and not any(
            isinstance(event, RequestHead) for event in self._events
        ):
            self.body_started = True  # of the request being answered (no other head queued)
        self._events.append(BodyData(body))

    def on_message_complete(self) -> None:
        self._in_message = False
        self._events.append(MESSAGE_END)

    def _mark_upgrade(self) -> None:
        """The head just parsed switches protocols: note it on the queued head."""
        for index in range(len(self._events) - 1, -1, -1):
            event = self._events[index]
            if isinstance(event, RequestHead):
                self._events[index] = RequestHead(
                    event.method,
                    event.target,
                    event.headers,
                    event.http_version,
                    keep_alive=False,
                    expects_continue=event.expects_continue,
                    upgrade=True,
                    size=event.size,
                )
                break
        if not self._events or self._events[-1] is not MESSAGE_END:
            self._events.append(MESSAGE_END)
        self._in_message = False

    # --- the answer side --------------------------------------------------------------------

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> bytes:
        """A whole answer: head and body (``Content-Length`` added; no body to a HEAD)."""
        request = self.request
        framing: list[tuple[bytes, bytes]] = []
        if status not in _NO_BODY:
            framing.append((b"content-length", b"%d" % len(body)))
        head = self._head(status, [*framing, *headers])
        self._answer_started = self._answer_done = True
        if status in _NO_BODY or (request is not None and request.method == "HEAD"):
            return head
        return head + body

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The head of an answer whose body follows in pieces (:meth:`send`, :meth:`end`):
        chunked to an HTTP/1.1 client; to HTTP/1.0, delimited by closing the connection."""
        request = self.request
        if request is not None and request.http_version == "1.0":
            self._close_after = True
            framing: list[tuple[bytes, bytes]] = []
        else:
            self._chunked = True
            framing = [(b"transfer-encoding", b"chunked")]
        head = self._head(status, [*headers, *framing])
        self._answer_started = True
        return head

    def send(self, data: bytes) -> bytes:
        """A piece of a started answer's body."""
        if not self._answer_started or self._answer_done:
            raise LocalHttpError("no started answer to send a piece of")
        if not data:
            return b""
        if self._chunked:
            return b"%x\r\n%b\r\n" % (len(data), data)
        return data

    def end(self) -> bytes:
        """The end of a started answer."""
        if self._answer_done:
            return b""
        self._answer_done = True
        return b"0\r\n\r\n" if self._chunked else b""

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        if self._answer_started:
            raise LocalHttpError("the request has been answered already")
        request = self.request
        if request is None or not request.keep_alive:
            self._close_after = True
        lines = [b"HTTP/1.1 %d %b" % (status, _REASONS.get(status, b""))]
        connection_named = close_asked = False
        for name, value in headers:
            if name.lower() == b"connection":
                connection_named = True
                close_asked = close_asked or b"close" in value.lower()
            lines.append(name + b": " + value)
        # One search over every header line, before any is joined by a CRLF (", " adds none).
        if _UNSAFE.search(b"".join(lines[1:])):
            unsafe = next(name for name, value in headers if _UNSAFE.search(name + value))
            raise LocalHttpError(f"unsafe header {unsafe!r}")
        if close_asked:
            self._close_after = True
        if self._close_after and not connection_named:
            lines.append(b"connection: close")
        lines.append(b"\r\n")
        return b"\r\n".join(lines)

    def whole_request(self) -> RequestHead | None:
        """The next request's head, not taken, when no request is current and that one is
        parsed whole (head, body and end); else None. (Never an Upgrade's.)"""
        events = self._events
        if self.request is not None or self._failed is not None or not events:
            return None
        head = events[0]
        if not isinstance(head, RequestHead) or head.upgrade:
            return None
        for event in events:
            if event is MESSAGE_END:
                return head
        return None

    @property
    def has_events(self) -> bool:
        """Whether something the client sent is parsed and not yet taken (a pipelined
        request, the end of the connection)."""
        return bool(self._events)

    @property
    def answer_started(self) -> bool:
        """Whether the head of an answer to the current request has been written."""
        return self._answer_started

    @property
    def reusable(self) -> bool:
        """Whether the connection may carry another request: this one's body was read whole,
        its answer written whole, and neither side asked to close."""
        return (
            self._answer_done
            and (self._request_done or self._body_left_is_only_its_end)
            and not self._close_after
            and not self.upgraded
            and self._failed is None
        )

    @property
    def _body_left_is_only_its_end(self) -> bool:
        # A request without a body, which the handler did not read (a GET): its end is parsed.
        # (A body read in part, even whole in the parser, leaves the connection to be closed.)
        return (
            self.request is not None
            and not self.body_started
            and bool(self._events)
            and self._events[0] is MESSAGE_END
        )

    def start_next_cycle(self) -> None:
        """Ready for the next request (only when :attr:`reusable`)."""
        if not self.reusable:
            raise LocalHttpError("the connection cannot carry another request")
        if not self._request_done:
            self._events.popleft()  # the end of a request whose empty body was not read
        self.request = None
        self._request_done = False
        self.body_started = False
        self._continue_sent = False
        self._answer_started = self._answer_done = self._chunked = False
