"""A 2026-07-28 MCP server on stdio whose tool ``ask_name`` needs the client's input.

The first call answers ``input_required`` (an ``elicitation/create`` for a name) with a
``requestState`` that names an entry of this process's memory, as a server that keeps a call's
state in memory would; the retry that carries the state and the client's answer gets
``Hello NAME (asked and answered in process PID)``. A state this process did not issue (a
retry that reached another container) gets -32602. It also answers ``initialize`` and the
lists, so a handshake-era prober learns its tool. No SDK: one line in, one line out.
"""

import json
import os
import sys
import uuid
from typing import Any

TOOL = {
    "name": "ask_name",
    "description": "Asks the client for a name, then greets it",
    "inputSchema": {"type": "object", "properties": {}},
}
QUESTION = {
    "method": "elicitation/create",
    "params": {
        "message": "What is your name?",
        "requestedSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
}
asked: dict[str, int] = {}  # the states this process issued


CACHE = {"ttlMs": 0, "cacheScope": "private"}  # (2026-07-28 lists and discovery say so)
DISCOVERED = {
    **CACHE,
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}},
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "asking", "version": "1"}},
}
INITIALIZED = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"tools": {}},
    "serverInfo": {"name": "asking", "version": "1"},
}
# What is always answered the same way.
FIXED: dict[str, dict[str, Any]] = {
    "server/discover": DISCOVERED,
    "initialize": INITIALIZED,
    "tools/list": {**CACHE, "resultType": "complete", "tools": [TOOL]},
    "prompts/list": {"prompts": []},
    "resources/list": {"resources": []},
    "resources/templates/list": {"resourceTemplates": []},
    "ping": {},
}


def call(params: dict[str, Any]) -> dict[str, Any]:
    """``ask_name``: the question first, the greeting at the retry (a result, or an error)."""
    state = params.get("requestState")
    if state is None:
        state = uuid.uuid4().hex
        asked[state] = os.getpid()
        return {
            "result": {
                "resultType": "input_required",
                "inputRequests": {"name": QUESTION},
                "requestState": state,
            }
        }
    if state not in asked:
        return {"error": {"code": -32602, "message": f"requestState {state} was not issued here"}}
    del asked[state]
    name = ((params.get("inputResponses") or {}).get("name") or {}).get("content", {})
    text = f"Hello {name.get('name')} (asked and answered in process {os.getpid()})"
    return {"result": {"resultType": "complete", "content": [{"type": "text", "text": text}]}}


def answer(message: dict[str, Any]) -> dict[str, Any]:
    method, params = message["method"], message.get("params") or {}
    if method in FIXED:
        outcome: dict[str, Any] = {"result": FIXED[method]}
    elif method == "tools/call" and params.get("name") == "ask_name":
        outcome = call(params)
    else:
        outcome = {"error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": message["id"], **outcome}


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if "id" not in message or "method" not in message:
        continue  # notifications, answers
    sys.stdout.write(json.dumps(answer(message)) + "\n")
    sys.stdout.flush()
