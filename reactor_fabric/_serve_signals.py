"""The orchestrator served until a signal (in trio, from ``_serve_cli.py``): the port's token
recorded for the stdio bridge, the start-up lines with the URLs to give a client, then the first
SIGINT/SIGTERM stops gracefully (bounded) and a second one at once."""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Iterable

import trio

from ._reasons import AUTH_SETUP
from ._version import __version__
from .config.token import Token, TokenError
from .config.token_record import TokenRecord, remove_record, write_record
from .trio.serve import Fabric, Orchestrator, serve_orchestrator

# Every log line of a start names this logger (its "logger" field), as before _cli.py was split.
log = logging.getLogger("reactor_fabric.cli")


def connection_help(
    http_url: str, services: Iterable[str], token: Token | None, issuer: str | None = None
) -> str:
    """What the start-up line adds: the URLs to paste into a client, with the token (the first
    of ``services`` names one service), or, when users sign in with ``issuer``, that they do.
    The fabric endpoint (every service in one MCP server) comes first: it is what most users
    want."""
    service = next(iter(services), "SERVICE")
    if issuer is not None:
        return "\n".join(
            [
                f"  users sign in with {issuer} (auth.mode: oidc); an MCP client given "
                f"{http_url}/mcp (or {http_url}/mcp/{service}) signs in by itself",
                f"  Claude Code: claude mcp add --transport http reactor-fabric {http_url}/mcp",
                f"  protected resource metadata: {http_url}/.well-known/oauth-protected-resource",
            ]
        )
    if token is None:
        return (
            f"  authentication is OFF: any local process may connect "
            f"(e.g. {http_url}/mcp, or {http_url}/mcp/{service} for one service)"
        )
    ws_url = "ws" + http_url.removeprefix("http")
    return "\n".join(
        [
            f"  token (from {token.origin}): {token.value}",
            f"  every service in one MCP server: {http_url}/mcp with the header "
            f"'Authorization: Bearer {token.value}', or {http_url}/mcp?token={token.value} "
            f"(WebSocket: {ws_url}/mcp?token={token.value})",
            f"  Claude Code: claude mcp add --transport http reactor-fabric {http_url}/mcp "
            f"--header 'Authorization: Bearer {token.value}'",
            f"  one service: {http_url}/mcp/{{service}}?token={token.value} "
            f"(WebSocket: {ws_url}/mcp/{{service}}?token={token.value}), or the header",
            f"  stdio bridge (reads the token itself): reactor-fabric connect {ws_url} "
            f"[--service {service}]",
        ]
    )


def _record_token(environ: dict[str, str], port: int, token: Token | None) -> TokenRecord | None:
    """The port's token record for the stdio bridge (config.token_record); None without
    authentication or when it cannot be written safely (then a bridge needs the variable or
    the default file, and the warning says why)."""
    if token is None:
        return None
    try:
        record = write_record(environ, port, token.value)
    except TokenError as exc:
        log.warning("token_record_unwritable", extra={"reason": AUTH_SETUP, "detail": str(exc)})
        return None
    log.info("token_recorded", extra={"path": str(record.path)})
    return record


async def serve_until_signalled(
    fabric: Fabric,
    token: Token | None,
    environ: dict[str, str],
    listener: socket.socket,
) -> None:
    """Serve; the first SIGINT/SIGTERM stops gracefully (bounded), a second one at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        # Recorded once the port is ours (and known, for --port 0), before the start-up line:
        # a bridge started after it finds the token. Removed at every exit (a killed
        # orchestrator's record is replaced by the next start on the port).
        record = _record_token(environ, listener.getsockname()[1], token)
        try:
            async with trio.open_nursery() as nursery:

                async def serve(*, task_status: trio.TaskStatus[Orchestrator]) -> None:
                    await serve_orchestrator(fabric, listener, task_status=task_status)
                    nursery.cancel_scope.cancel()  # the shutdown is over: stop watching signals

                running: Orchestrator = await nursery.start(serve)
                print(
                    f"Reactor-Fabric {__version__} serving {len(fabric.suite.mcp_services)} "
                    f"service(s) on {running.http_url} (all in one: {running.http_url}/mcp; "
                    f"health: {running.http_url}/healthz)",
                    flush=True,
                )
                sign_in = fabric.authenticator.gate.sign_in
                issuer = sign_in.rules.issuer if sign_in is not None else None
                help_text = connection_help(
                    running.http_url, fabric.suite.mcp_services, token, issuer
                )
                print(help_text, flush=True)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if fabric.registry.stopping.is_set():
                        log.warning("stopping_now", extra={"signal": name})
                        nursery.cancel_scope.cancel()
                        return
                    log.info("signal_received", extra={"signal": name})
                    running.stop()
        finally:
            if record is not None:
                remove_record(record)
