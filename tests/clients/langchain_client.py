"""What langchain-mcp-adapters gives an agent: the names of the tools ``get_tools()`` returns
for URL (the token from REACTOR_FABRIC_TOKEN, as a header), as one JSON line on stdout; then
each NAME=JSON argument calls that tool once and prints its result, as the agent would.

Usage::

    python langchain_client.py URL [NAME=JSON ...]

Runs in its own environment (tests/clients/envs.py: langchain-mcp-adapters on the ``mcp`` 1.x
SDK), the way docs/USAGE.md's LangChain snippet uses it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from langchain_mcp_adapters.client import MultiServerMCPClient


async def main(url: str, calls: list[str]) -> None:
    client = MultiServerMCPClient(
        {
            "fabric": {
                "transport": "streamable_http",
                "url": url,
                "headers": {"Authorization": f"Bearer {os.environ['REACTOR_FABRIC_TOKEN']}"},
            }
        }
    )
    tools = {tool.name: tool for tool in await client.get_tools()}
    print(json.dumps({"tools": sorted(tools)}), flush=True)
    for call in calls:
        name, _, arguments = call.partition("=")
        result = await tools[name].ainvoke(json.loads(arguments))
        print(json.dumps({"tool": name, "result": result}, default=str), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
