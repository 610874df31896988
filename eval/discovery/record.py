"""Record what one real MCP server answers to ``tools/list`` (and prompts, resources), for the
discovery evaluation set.

Runs the server's stdio command on this machine, speaks MCP to it as a plain client would
(``initialize``, ``notifications/initialized``, then every list it declared, following
``nextCursor``), and writes ``eval/discovery/servers/NAME.json``:

    {"name": ..., "package": ..., "registry": "npm"|"pypi", "version": ..., "description": ...,
     "homepage": ..., "run": "npx -y PKG@V", "stub_env": [...names only...], "server_info": {...},
     "recorded_at": ..., "tools": [...], "prompts": [...], "resources": [...]}

``description`` is the package's own public summary (from the registry), which is what a user
would paste into a suite; nothing is derived from the evaluation's tasks. Credentials are stubs
(``--env NAME=stub``): the server is only asked to list, never to call anything, and this
machine's network reaches no service anyway.

Usage:
    python eval/discovery/record.py --name github --package @modelcontextprotocol/server-github \
        --registry npm --version 2025.4.8 --description "MCP server for using the GitHub API" \
        --env GITHUB_PERSONAL_ACCESS_TOKEN=stub -- npx -y @modelcontextprotocol/server-github
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
PROTOCOL = "2025-06-18"
TIMEOUT = 90.0


class Server:
    def __init__(self, command: list[str], env: dict[str, str], cwd: str | None) -> None:
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
            cwd=cwd,
        )
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.next_id = 0

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line.decode(errors="replace").rstrip())
            del self.stderr[:-40]

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        deadline = time.monotonic() + TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to {method} in {TIMEOUT} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise EOFError(f"the server exited while answering {method}")
            try:
                message = json.loads(line)
            except ValueError:
                continue  # a server's stray output on stdout
            if not isinstance(message, dict):
                continue
            if "method" in message and "id" in message:
                # A request of the server's (roots/list, ping): answer emptily.
                result: dict[str, Any] = {"roots": []} if message["method"] == "roots/list" else {}
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})
                continue
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result") or {}

    def listing(self, method: str, key: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {}
        for _ in range(100):
            result = self.request(method, params)
            items += result.get(key) or []
            cursor = result.get("nextCursor")
            if not cursor:
                return items
            params = {"cursor": cursor}
        return items

    def close(self) -> None:
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the service name in the catalog")
    parser.add_argument("--package", required=True)
    parser.add_argument("--registry", required=True, choices=["npm", "pypi"])
    parser.add_argument("--version", required=True, help="the installed version, exactly")
    parser.add_argument("--description", required=True, help="the package's registry summary")
    parser.add_argument("--homepage", default="")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE (stubs)")
    parser.add_argument("--cwd", default=None)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    server = Server(args.command, env, args.cwd)
    try:
        init = server.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {"roots": {"listChanged": False}},
                "clientInfo": {"name": "reactor-fabric-eval-recorder", "version": "1"},
            },
        )
        server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        capabilities = init.get("capabilities") or {}
        tools = server.listing("tools/list", "tools") if "tools" in capabilities else []
        prompts = server.listing("prompts/list", "prompts") if "prompts" in capabilities else []
        resources: list[dict[str, Any]] = []
        if "resources" in capabilities:
            try:
                resources = server.listing("resources/list", "resources")
            except (RuntimeError, TimeoutError):
                resources = []  # a server that must reach its service to list them
    except Exception as error:  # noqa: BLE001 — any failure: say why, record nothing
        print(f"record {args.name}: {error}", file=sys.stderr)
        print("\n".join(server.stderr[-20:]), file=sys.stderr)
        server.close()
        return 1
    server.close()
    if not tools:
        print(f"record {args.name}: the server listed no tools", file=sys.stderr)
        return 1
    record = {
        "name": args.name,
        "package": args.package,
        "registry": args.registry,
        "version": args.version,
        "description": args.description,
        "homepage": args.homepage,
        # How a user runs it (the path it was run from here is this machine's own).
        "run": (
            f"npx -y {args.package}@{args.version}"
            if args.registry == "npm"
            else f"uvx {args.package}=={args.version}"
        ),
        "stub_env": sorted(env),
        "server_info": init.get("serverInfo") or {},
        "recorded_at": datetime.date.today().isoformat(),
        "tools": tools,
        "prompts": prompts,
        "resources": resources,
    }
    path = HERE / "servers" / f"{args.name}.json"
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"{args.name}: {len(tools)} tools, {len(prompts)} prompts -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
