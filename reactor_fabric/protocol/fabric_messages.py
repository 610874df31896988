"""What the fabric endpoint's messages look like, without I/O: the encoder every message goes
out through, its initialize and discover results, the handshake it greets a backend with,
notifications, the audit's view of a call, and the 2026-07-28 envelope a result gains and a
backend's request loses. The answers themselves are made by the session's replies ledger
(:mod:`.fabric_replies`)."""

from __future__ import annotations

from typing import Any

from .deep_json import DeepEncoder
from .events import ToClient
from .mcp import CLIENT_VERSION, HANDSHAKE_VERSIONS, STATELESS_VERSION

Json = dict[str, Any]

ENVELOPE = "io.modelcontextprotocol/"
CACHE_PRIVATE = {"ttlMs": 0, "cacheScope": "private"}
SERVER_NAME = "reactor-fabric"
CAPABILITIES: Json = {
    "tools": {"listChanged": True},
    "prompts": {"listChanged": False},
    "resources": {"listChanged": False, "subscribe": False},
}
# The service the audit names for the endpoint's own meta-tools.
FABRIC_SERVICE = "fabric"
# The protocol version the endpoint speaks to its backends, as their client.
BACKEND_PROTOCOL = CLIENT_VERSION

# What the client sent was decoded near the top of the stack; it may be encoded further down
# it (a call queued until its backend is ready goes out from the backend's reader), where
# msgspec alone would fail on what it decoded (see .deep_json).
encoder = DeepEncoder()


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


def negotiated(requested: object) -> str:
    """The protocol version of a handshake-era client's ``initialize``."""
    return (
        requested
        if isinstance(requested, str) and requested in HANDSHAKE_VERSIONS
        else (HANDSHAKE_VERSIONS[-1])
    )


def initialize_result(protocol_version: str, version: str) -> Json:
    return {
        "protocolVersion": protocol_version,
        "capabilities": CAPABILITIES,
        "serverInfo": {"name": SERVER_NAME, "version": version},
        "instructions": "Tools are named server__tool. Use find_tools to find one for a "
        "task among every server of the suite, and call_tool to call it.",
    }


def discover_result(version: str) -> Json:
    return {
        **CACHE_PRIVATE,
        "supportedVersions": [STATELESS_VERSION],
        "capabilities": CAPABILITIES,
        "resultType": "complete",
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": SERVER_NAME, "version": version}},
    }


def handshake_request(request_id: int, capabilities: Json, version: str) -> bytes:
    """The ``initialize`` a backend is greeted with, as a client of ``capabilities``."""
    handshake = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": BACKEND_PROTOCOL,
            "capabilities": capabilities,
            "clientInfo": {"name": SERVER_NAME, "version": version},
        },
    }
    return encoder.encode(handshake)
