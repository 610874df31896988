"""Learning what a service offers: the MCP conversation of a catalog probe, without I/O.

The orchestrator starts a service's container with no mount and no network, as the
unprivileged user, and talks to it as a client (:class:`OfferProbe`): ``initialize`` (a
handshake-era client: every bundled server speaks it) → ``notifications/initialized`` → the
lists its capabilities announce (``tools/list``, ``prompts/list``, ``resources/list``,
``resources/templates/list``), each followed through its ``nextCursor`` pages. Then it is done,
and the container goes. Feed it the server's stdout lines; send what it returns.

The probe declares the client capabilities a session's client may have (roots, sampling,
elicitation): servers offer some tools only to clients that have them (``everything`` registers
its sampling and elicitation tools when initialized), and the catalog lists everything a service
may offer. A list-changed notification before the probe is done asks for that list again (at
most :data:`MAX_RELISTS` times). Requests the server makes meanwhile are answered, so that none
waits on us: ``roots/list`` with no roots (no mount), ``ping`` with ``{}``, anything else
(sampling, elicitation) with "method not found". Other notifications are ignored.

Error handling: a refused or malformed ``initialize`` answer fails the probe
(:class:`ProbeFailed`, which becomes the service's catalog error); an error answering one list
leaves that list empty and is noted in :attr:`OfferProbe.problems`; pages beyond
:data:`MAX_PAGES` per list are not asked for (a server that always answers with a cursor). A
list whose pages together are larger than :data:`~.fabric_refresh.MAX_LIST_BYTES` fails the
probe: a server's catalog is made and indexed from it, which would cost CPU and memory in
proportion (the same bound as a session's refresh of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from .._errors import titled
from .._reasons import BACKEND_LIST_TOO_LARGE, HANDSHAKE_FAILED
from .catalog import ServiceCatalog, service_catalog
from .fabric_refresh import MAX_LIST_BYTES
from .mcp import (
    CLIENT_VERSION,
    LIST_CHANGED,
    LIST_METHOD,
    METHOD_NOT_FOUND,
    RESOURCE_TEMPLATES_METHOD,
    TITLES,
)

PROTOCOL_VERSION = CLIENT_VERSION
MAX_PAGES = 50
MAX_RELISTS = 3
# What a session's client may declare; the session forwards its client's own (see FabricServer).
PROBE_CAPABILITIES = {"roots": {"listChanged": False}, "sampling": {}, "elicitation": {}}
# list_changed notification → the lists it concerns
CHANGED: dict[str, tuple[str, ...]] = {
    notification: (LIST_METHOD[kind], *([RESOURCE_TEMPLATES_METHOD] if kind == "resources" else []))
    for notification, kind in LIST_CHANGED.items()
}
CLIENT_INFO = {"name": "reactor-fabric-catalog", "version": "1"}

# list method → (capability that announces it, key of the items in its result)
LISTS: dict[str, tuple[str, str]] = {
    "tools/list": ("tools", "tools"),
    "prompts/list": ("prompts", "prompts"),
    "resources/list": ("resources", "resources"),
    "resources/templates/list": ("resources", "resourceTemplates"),
}

_encoder = msgspec.json.Encoder()


class ProbeFailed(Exception):
    """The service cannot be learned (its ``initialize`` failed, it ended before answering, a
    list over the bound); the message says why, and ``reason`` says it as a session's start of
    the service would (the catalog marks the service unavailable with it)."""

    def __init__(self, message: str, *, reason: str = HANDSHAKE_FAILED) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class OfferProbe:
    """One probe conversation. :meth:`start` and :meth:`receive` return lines to send."""

    items: dict[str, list[Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    server_info: dict[str, Any] = field(default_factory=dict)
    _started: bool = False
    _pending: dict[int, tuple[str, int]] = field(default_factory=dict)  # id → (method, page)
    _next_id: int = 1
    _relists: int = 0
    _list_bytes: dict[str, int] = field(default_factory=dict)  # list method → its pages' bytes
    _line_bytes: int = 0  # the size of the line being taken

    @property
    def done(self) -> bool:
        """Every answer is in: the container can go."""
        return self._started and not self._pending

    def start(self) -> list[bytes]:
        self._started = True
        return [
            self._request(
                "initialize",
                {
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": PROBE_CAPABILITIES,
                    "clientInfo": CLIENT_INFO,
                },
                page=0,
            )
        ]

    def receive(self, line: bytes) -> list[bytes]:
        """Take one line of the server's stdout; the lines to send back."""
        self._line_bytes = len(line)
        try:
            message = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError):
            self.problems.append("the server wrote a line that is not JSON")
            return []
        if not isinstance(message, dict):
            return []
        if "method" in message:
            return self._answer_server_request(message)
        request_id = message.get("id")
        if not isinstance(request_id, int) or request_id not in self._pending:
            return []
        method, page = self._pending.pop(request_id)
        if method == "initialize":
            return self._initialized(message)
        return self._listed(method, page, message)

    def catalog(self) -> ServiceCatalog:
        return service_catalog(
            tools=self.items.get("tools/list", []),
            prompts=self.items.get("prompts/list", []),
            resources=self.items.get("resources/list", []),
            resource_templates=self.items.get("resources/templates/list", []),
        )

    # --- steps ------------------------------------------------------------------------------

    def _initialized(self, message: dict[str, Any]) -> list[bytes]:
        result = message.get("result")
        if not isinstance(result, dict):
            error = message.get("error")
            detail = error.get("message") if isinstance(error, dict) else "no result"
            raise ProbeFailed(f"initialize failed: {detail}")
        capabilities = result.get("capabilities")
        if not isinstance(capabilities, dict):
            capabilities = {}
        info = result.get("serverInfo")
        self.server_info = info if isinstance(info, dict) else {}
        out = [_encoder.encode({"jsonrpc": "2.0", "method": "notifications/initialized"})]
        for method, (capability, _key) in LISTS.items():
            if capability in capabilities:
                self.items[method] = []
                out.append(self._request(method, {}, page=1))
        return out

    def _listed(self, method: str, page: int, message: dict[str, Any]) -> list[bytes]:
        result = message.get("result")
        _capability, key = LISTS[method]
        if not isinstance(result, dict) or not isinstance(result.get(key), list):
            error = message.get("error")
            detail = error.get("message") if isinstance(error, dict) else "a malformed answer"
            self.problems.append(f"{method}: {detail}")
            return []
        size = self._list_bytes[method] = self._list_bytes.get(method, 0) + self._line_bytes
        if size > MAX_LIST_BYTES:
            raise ProbeFailed(
                f"{method}: more than {MAX_LIST_BYTES} bytes (the largest list the fabric "
                "endpoint takes)",
                reason=BACKEND_LIST_TOO_LARGE,
            )
        self.items[method].extend(result[key])
        cursor = result.get("nextCursor")
        if isinstance(cursor, str) and cursor:
            if page < MAX_PAGES:
                return [self._request(method, {"cursor": cursor}, page=page + 1)]
            self.problems.append(f"{method}: more than {MAX_PAGES} pages; the rest left out")
        return []

    def _answer_server_request(self, message: dict[str, Any]) -> list[bytes]:
        if "id" not in message:
            return self._changed(str(message.get("method")))

        method = message.get("method")
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if method == "roots/list":
            answer["result"] = {"roots": []}
        elif method == "ping":
            answer["result"] = {}
        else:
            answer["error"] = {
                "code": METHOD_NOT_FOUND,
                "message": titled(
                    TITLES[METHOD_NOT_FOUND],
                    f"{method} is not available while the catalog is learned",
                ),
            }
        return [_encoder.encode(answer)]

    def _changed(self, notification: str) -> list[bytes]:
        """A list changed while we learn it: ask for it again from its first page."""
        relist = [m for m in CHANGED.get(notification, ()) if m in self.items]
        if not relist or self.done or self._relists >= MAX_RELISTS:
            return []
        self._relists += 1
        out = []
        for method in relist:
            self._pending = {i: p for i, p in self._pending.items() if p[0] != method}
            self.items[method] = []
            self._list_bytes[method] = 0
            out.append(self._request(method, {}, page=1))
        return out

    def _request(self, method: str, params: dict[str, Any], *, page: int) -> bytes:
        request_id = self._next_id
        self._next_id += 1
        self._pending[request_id] = (method, page)
        return _encoder.encode(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        )
