"""What the fabric endpoint's messages look like, without I/O: the actions its machine returns
(:mod:`.fabric_server`), the encoder every message goes out through, notifications, and the
2026-07-28 envelope a result gains and a backend's request loses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .deep_json import DeepEncoder
from .fabric_refresh import Refresh, ToolChanges
from .tool_calls import ToolCallDone

Json = dict[str, Any]

ENVELOPE = "io.modelcontextprotocol/"
CACHE_PRIVATE = {"ttlMs": 0, "cacheScope": "private"}

# What the client sent was decoded near the top of the stack; it may be encoded further down
# it (a call queued until its backend is ready goes out from the backend's reader), where
# msgspec alone would fail on what it decoded (see .deep_json).
encoder = DeepEncoder()


@dataclass(frozen=True)
class ToClient:
    data: bytes
    # An error the endpoint answers with itself: its code and reason (for the metrics).
    error: tuple[int, str] | None = None


@dataclass(frozen=True)
class ToBackend:
    service: str
    data: bytes
    # The endpoint's own message (not the client's): the driver reports it written with
    # FabricServer.backend_read, which the machine's bound on them counts on.
    own: bool = False


@dataclass(frozen=True)
class StartBackend:
    service: str


@dataclass(frozen=True)
class StopBackend:
    service: str
    reason: str


@dataclass(frozen=True)
class ToolsChanged:
    """A service's tools changed on a refresh (what changed: names and hashes, no text)."""

    changes: ToolChanges


Action = ToClient | ToBackend | StartBackend | StopBackend | ToolCallDone | Refresh | ToolsChanged


def complete(result: Json) -> Json:
    """A result as 2026-07-28 requires it: ``resultType`` says it is the whole answer."""
    return result if "resultType" in result else {"resultType": "complete", **result}


def for_backend(params: Json) -> Json:
    """A client's request parameters as a handshake-era server may see them: without the
    2026-07-28 envelope in ``_meta`` (protocol version, client info and capabilities, which
    such servers refuse), with everything else — the ``progressToken`` above all."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or not any(key.startswith(ENVELOPE) for key in meta):
        return params
    kept = {key: value for key, value in meta.items() if not key.startswith(ENVELOPE)}
    trimmed = {key: value for key, value in params.items() if key != "_meta"}
    if kept:
        trimmed["_meta"] = kept
    return trimmed


def notification(method: str) -> ToClient:
    return ToClient(notification_bytes(method, None))


def notification_bytes(method: str, params: Json | None) -> bytes:
    message: Json = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return encoder.encode(message)


def audited(params: Json) -> tuple[object, object, object]:
    """What the audit keeps of a tools/call's params: the tool it names (call_tool: the one it
    calls), its arguments and the client's traceparent."""
    name = params.get("name")
    arguments = params.get("arguments")
    if name == "call_tool" and isinstance(arguments, dict):
        name = arguments.get("name")
        arguments = arguments.get("arguments", arguments.get("parameters"))
    meta = params.get("_meta")
    return name, arguments, meta.get("traceparent") if isinstance(meta, dict) else None
