"""JSON-RPC messages the tests send, as an MCP client would (pure data, no I/O)."""

from __future__ import annotations

from typing import Any


def request(request_id: int | str, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


INITIALIZE = request(
    1,
    "initialize",
    {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
)
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
