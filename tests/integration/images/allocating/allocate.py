"""A minimal MCP server over stdio (no SDK: any client version will do) with one tool.

``allocate`` ``{"mb": N}`` allocates N MiB more, touches every page (so the kernel counts them
against the container's cgroup) and keeps them until the process ends; its answer says how many
MiB the process now holds. ``mb`` 0 (or absent) allocates nothing: a plain call. One line in,
one line out; notifications are read and ignored.
"""

import json
import sys
from typing import Any

HELD: list[bytearray] = []
TOOL = {
    "name": "allocate",
    "description": "Allocate some MiB of memory and keep them",
    "inputSchema": {
        "type": "object",
        "properties": {"mb": {"type": "integer", "minimum": 0, "maximum": 1024}},
    },
}


def result(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "allocating", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        mb = int((params.get("arguments") or {}).get("mb") or 0)
        if mb:
            # Filled, not zeroed: every page is written, so it is resident (calloc's zero pages
            # would not count).
            HELD.append(bytearray(b"\x01") * (mb << 20))
        held = sum(len(block) for block in HELD) >> 20
        return {"content": [{"type": "text", "text": f"holding {held} MiB"}]}
    return {}  # ping, and anything else: an empty result


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if not isinstance(message, dict) or "id" not in message or "method" not in message:
        continue
    answer: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
    answer["result"] = result(message["method"], message.get("params") or {})
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
