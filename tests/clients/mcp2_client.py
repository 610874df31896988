"""Drive the official MCP Python SDK 2.x ``Client`` from a test, one command per line.

Runs with the project's own environment (the ``test`` extra installs ``mcp`` 2.x), as a separate
process because the SDK is asyncio-based and the tests are trio-based.

Usage::

    python mcp2_client.py http URL [--mode auto|legacy] [--trace] [--elicit NAME]
    python mcp2_client.py stdio [--cwd DIR] -- COMMAND [ARG...]

Commands (stdin, JSON lines), each answered by one JSON line on stdout:

    {"op": "initialize"}   -> {"ok": true, "server": name, "protocol": version}
    {"op": "list_tools"}   -> {"ok": true, "tools": [names]}
    {"op": "call", "name": N, "arguments": A} -> {"ok": bool, "content": [...], "structured": ...}
        (with "report_progress": true, progress is printed as it comes: {"op": "progress", ...})
    {"op": "listen"}       -> {"ok": true, "honored": filter} (2026-07-28: opens, then closes)
    {"op": "call_many", "calls": [{"name": N, "arguments": A}, ...]}
                           -> {"ok": true, "results": [as "call", in order]} (all at once)
    {"op": "start", "name": N, "arguments": A} -> {"ok": true} (the call goes on meanwhile)
    {"op": "cancel"}       -> {"ok": true, "cancelled": true} (the started call cancelled as a
                              caller cancels: the SDK sends notifications/cancelled), or, when
                              it had ended, {"ok": true, "cancelled": false, "result": as "call"}
    {"op": "finish"}       -> the started call's outcome, as "call"
    {"op": "exit"}

``--elicit NAME`` declares elicitation and answers every question by accepting
``{"name": NAME}``; the questions it was asked are kept: ``{"op": "heard"}`` ->
``{"ok": true, "elicitations": [message, ...]}``.

``--trace`` gives the SDK an OpenTelemetry tracer provider exporting over OTLP/HTTP (to
``OTEL_EXPORTER_OTLP_ENDPOINT``): the SDK then makes a client span per request and puts its
``traceparent`` in the request's ``params._meta``, as an instrumented agent would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import urlencode

from mcp import Client, StdioServerParameters, types
from mcp.client.stdio import get_default_environment
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


def emit(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, default=str), flush=True)


def target(args: argparse.Namespace, command: list[str]) -> Any:
    """What the client connects to: the URL (with the token), or the stdio server's command."""
    token = os.environ.get("REACTOR_FABRIC_TOKEN")
    if args.transport == "http":
        server: str = args.target[0]
        if token:  # the URL form of the orchestrator's token (the 1.x client sends the header)
            server += ("&" if "?" in server else "?") + urlencode({"token": token})
        return server
    # The SDK hands a server only a few variables (HOME, PATH...): the token goes in the
    # server's `env`, as in a client's configuration (Claude Desktop's "env" block), and so do
    # the variables REACTOR_FABRIC_SERVER_ENV names (comma-separated: e.g. BROWSER).
    extra = {"REACTOR_FABRIC_TOKEN": token} if token else {}
    for name in filter(None, os.environ.get("REACTOR_FABRIC_SERVER_ENV", "").split(",")):
        if name in os.environ:
            extra[name] = os.environ[name]
    return StdioServerParameters(
        command=command[0],
        args=command[1:],
        cwd=args.cwd,
        env={**get_default_environment(), **extra} if extra else None,
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["http", "stdio"])
    parser.add_argument("target", nargs="*")
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--cwd")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--elicit")
    argv = sys.argv[1:]
    # Everything after "--" is the stdio server's command line, untouched by argparse.
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    server = target(args, command)

    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        if args.trace:
            stack.callback(traced())
        client: Client | None = None
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            command = json.loads(line)
            op = command["op"]
            if op == "exit":
                return
            try:
                if op == "heard":
                    emit({"ok": True, "elicitations": HEARD})
                elif op == "initialize":
                    options: dict[str, Any] = {}
                    if args.elicit is not None:
                        options["elicitation_callback"] = answering(args.elicit)
                    client = await stack.enter_async_context(
                        Client(server, mode=args.mode, **options)
                    )
                    info = client.server_info
                    emit(
                        {
                            "ok": True,
                            "server": info.name if info else None,
                            "protocol": client.protocol_version,
                        }
                    )
                elif op in ("start", "cancel", "finish"):
                    assert client is not None
                    emit(await in_background(client, command))
                elif op in ("list_tools", "call", "listen", "call_many"):
                    assert client is not None
                    emit(await use(client, command))
                else:
                    emit({"ok": False, "error": {"message": f"unknown op {op!r}"}})
            except BaseException as exc:
                emit(described(exc))
                if op == "initialize":
                    return


HEARD: list[str] = []
# Calls started and not finished or cancelled yet (the last is the one "cancel" and "finish"
# take).
STARTED: list[asyncio.Future[dict[str, Any]]] = []


def answering(name: str) -> Any:
    """An elicitation callback that accepts every question with ``{"name": name}``."""

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        HEARD.append(getattr(params, "message", ""))
        return types.ElicitResult(action="accept", content={"name": name})

    return elicit


def traced() -> Any:
    """Install a tracer provider that exports every span when it ends; its shutdown."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider.shutdown


async def in_background(client: Client, command: dict[str, Any]) -> dict[str, Any]:
    """A call started to go on while other commands run; cancelled or finished later."""
    op = command["op"]
    if op == "start":
        STARTED.append(asyncio.ensure_future(use(client, {**command, "op": "call"})))
        return {"ok": True}
    started = STARTED.pop()
    if op == "finish":
        return await started
    started.cancel()
    try:
        return {"ok": True, "cancelled": False, "result": await started}
    except asyncio.CancelledError:
        return {"ok": True, "cancelled": True}


async def use(client: Client, command: dict[str, Any]) -> dict[str, Any]:
    """One command on an initialized client."""
    op = command["op"]
    if op == "list_tools":
        tools = await client.list_tools()
        return {"ok": True, "tools": [tool.name for tool in tools.tools]}
    if op == "call_many":
        # Concurrent requests on the one session.
        calls = [use(client, {"op": "call", **one}) for one in command["calls"]]
        return {"ok": True, "results": list(await asyncio.gather(*calls))}
    if op == "listen":
        async with client.listen(tools_list_changed=True) as subscription:
            return {"ok": True, "honored": subscription.honored.model_dump(by_alias=True)}
    result = await client.call_tool(
        command["name"],
        command.get("arguments", {}),
        progress_callback=report_progress if command.get("report_progress") else None,
    )
    return {
        "ok": not result.is_error if hasattr(result, "is_error") else not result.isError,  # type: ignore[attr-defined]
        "content": [item.model_dump() for item in result.content],
        "structured": getattr(result, "structured_content", None),
    }


async def report_progress(progress: float, total: float | None, message: str | None) -> None:
    emit({"op": "progress", "progress": progress, "message": message})


def described(exc: BaseException) -> dict[str, Any]:
    """What the SDK raised, unwrapping the exception groups its task groups make."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        data = getattr(exc.error, "data", None)
        return {"ok": False, "error": {"code": exc.code, "message": str(exc), "data": data}}
    return {"ok": False, "exception": type(exc).__name__, "message": str(exc)}


if __name__ == "__main__":
    asyncio.run(main())
