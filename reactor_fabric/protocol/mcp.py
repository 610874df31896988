"""MCP's protocol constants, in one place: the versions spoken, the JSON-RPC codes answered
with, the list-changed notifications and the lists they name.

Used by the fabric endpoint's server (as a server to clients, as a client to backends), the
catalog probe (a client) and the Streamable HTTP transport (which checks the version header).
Pure data.
"""

from __future__ import annotations

from typing import Final

# Versions a client may ask for in its initialize (the newest is answered otherwise).
HANDSHAKE_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
# The stateless revision: no initialize, every request carries its envelope in _meta.
STATELESS_VERSION: Final = "2026-07-28"
# Every version the orchestrator knows (an MCP-Protocol-Version header outside it is refused).
KNOWN_VERSIONS: Final = frozenset({*HANDSHAKE_VERSIONS, STATELESS_VERSION})
# What the orchestrator asks for when it is a server's client (the probe, /mcp's backends).
CLIENT_VERSION: Final = "2025-06-18"

# JSON-RPC 2.0's codes the orchestrator answers with itself, and the title its message starts
# with (as the product's own errors do: see reactor_fabric._errors).
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
TITLES: Final = {METHOD_NOT_FOUND: "Method Not Found", INVALID_PARAMS: "Invalid Params"}

# A server's list_changed notification → the kind of entries it concerns.
LIST_CHANGED: Final = {
    "notifications/tools/list_changed": "tools",
    "notifications/prompts/list_changed": "prompts",
    "notifications/resources/list_changed": "resources",
}
# A kind of entries → the method that lists them (resources also have their templates).
LIST_METHOD: Final = {
    "tools": "tools/list",
    "prompts": "prompts/list",
    "resources": "resources/list",
}
RESOURCE_TEMPLATES_METHOD: Final = "resources/templates/list"
