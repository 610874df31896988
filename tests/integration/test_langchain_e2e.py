"""LangChain (langchain-mcp-adapters) on the fabric endpoint, as docs/USAGE.md's snippet uses it:
``get_tools()`` is what an agent can call, so the docs' advice (``?tools=all``) is checked
against the real client and orchestrator. No model is needed: listing and one call are enough."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.clients import envs
from tests.integration import harness
from tests.integration.harness import (
    CLIENTS,
    Orchestrator,
    orchestrator_fixture,
)

pytestmark = pytest.mark.integration

META_TOOLS = {
    "find_tools",
    "call_tool",
    "activate_servers",
    "get_status",
    "analyze_task",
    "list_available_capabilities",
    "switch_context",
}


fabric = orchestrator_fixture(scope="module")


def langchain(url: str, *calls: str) -> list[dict[str, Any]]:
    """The JSON lines langchain_client.py printed: the tools, then each call's result."""
    done = subprocess.run(
        [str(envs.langchain_python()), str(CLIENTS / "langchain_client.py"), url, *calls],
        env={**os.environ, **harness.client_token_env()},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def text_of(called: dict[str, Any]) -> str:
    """The text of a call's result as LangChain gives it (a list of content blocks)."""
    return "".join(block["text"] for block in called["result"] if block.get("type") == "text")


def test_langchain_sees_every_service_tool_with_tools_all_and_calls_one(
    fabric: Orchestrator,
) -> None:
    listed, called = langchain(
        f"{fabric.http_url}/mcp?tools=all",
        'time__get_current_time={"timezone": "UTC"}',
    )
    assert {"time__get_current_time", "git__git_log"} | META_TOOLS <= set(listed["tools"])
    assert json.loads(text_of(called))["timezone"] == "UTC"


def test_langchain_sees_only_the_meta_tools_under_the_default_exposure_and_uses_call_tool(
    fabric: Orchestrator,
) -> None:
    listed, called = langchain(
        f"{fabric.http_url}/mcp",
        'call_tool={"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}',
    )
    assert set(listed["tools"]) == META_TOOLS
    assert json.loads(text_of(called))["timezone"] == "UTC"
