"""Answer every JSON-RPC request with what this container sees at a path.

Request params (all optional): ``{"path": "/workspace"}``. The result:
``{"entries": [...] | null, "error": str | null, "uid": int, "gid": int}``. Notifications are
ignored; the method ``write`` creates the file at ``path`` instead of listing, ``connect``
connects a Unix socket there, and ``exit`` ends the server without an answer. One line in, one
line out.

The methods ``fetch`` (``{"url"}``: urllib, the proxy from the environment), ``tunnel``
(``{"host", "port", "send"}``: a CONNECT through HTTPS_PROXY, with its credentials as
``Proxy-Authorization: Basic`` when the URL has some, as clients send them) and ``direct``
(``{"host", "port"}``: TCP past any proxy) report what the container's network lets through.

The method ``secret`` (params ``{"name": NAME}``) reports what the server got of the secret
NAME: a SHA-256 of the environment variable's value and of /run/secrets/NAME's content (never a
value: the answer travels through the orchestrator), the file's owner and mode, and the file
system it is on; and writes a careless debug line with the value on stderr, which the
orchestrator must log redacted.

With ``PROBE_AT_START`` (a directory) in its environment, its first instruction counts the files
below that directory; the method ``at_start`` answers ``{"files": N}`` (what a server that reads
its project as it starts would have seen). With ``PROBE_MARK`` (a path), it then creates that
file: a trace that it ran at all.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import stat
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable


def file_system_of(path: str) -> str | None:
    best, kind = "", None  # type: str, str | None
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            point, fs = line.split()[1:3]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(
                best
            ):
                best, kind = point, fs
    return kind


def digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def secret(name: str) -> dict[str, object]:
    env = os.environ.get(name)
    path = f"/run/secrets/{name}"
    found: dict[str, object] = {"env_sha256": digest(env), "file": None, "file_error": None}
    try:
        info = os.stat(path)
        with open(path) as file:
            content = file.read()
        found["file"] = {
            "sha256": digest(content),
            "uid": info.st_uid,
            "gid": info.st_gid,
            "mode": stat.S_IMODE(info.st_mode),
            "fs": file_system_of(path),
        }
    except OSError as exc:
        content = ""
        found["file_error"] = f"{type(exc).__name__}: {exc.strerror}"
    sys.stderr.write(f"probe debug: {name}={env or content}\n")
    sys.stderr.flush()
    return found


def fetch(url: str) -> dict[str, object]:
    """GET ``url`` the way most clients do: urllib, its proxy taken from the environment
    (HTTP_PROXY for http://: an absolute-form request to the proxy)."""
    try:
        with urllib.request.urlopen(url, timeout=20) as answer:
            return {"status": answer.status, "body": answer.read(2000).decode(), "error": None}
    except urllib.error.HTTPError as exc:
        return {
            "status": exc.code,
            "body": exc.read(2000).decode("utf-8", "replace"),
            "reason": exc.headers.get("X-Reactor-Fabric-Reason"),
            "error": None,
        }
    except OSError as exc:
        return {"status": None, "body": None, "error": f"{type(exc).__name__}: {exc}"}


def tunnel(host: str, port: int, send: str) -> dict[str, object]:
    """CONNECT host:port through HTTPS_PROXY, send ``send`` and read to the end."""
    proxy = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY", "http://127.0.0.1:1"))
    try:
        with socket.create_connection((proxy.hostname, proxy.port), timeout=20) as connection:
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            credentials = ""
            if proxy.username is not None:
                user = urllib.parse.unquote(proxy.username)
                password = urllib.parse.unquote(proxy.password or "")
                encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
                credentials = f"Proxy-Authorization: Basic {encoded}\r\n"
            connection.sendall(
                f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{credentials}\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                head += chunk
            status_line, _, rest = head.partition(b"\r\n")
            status = int(status_line.split()[1]) if status_line.startswith(b"HTTP/") else None
            if status != 200:
                return {"status": status, "answer": head.decode("utf-8", "replace"), "error": None}
            connection.sendall(send.encode())
            connection.shutdown(socket.SHUT_WR)
            answer = rest.partition(b"\r\n\r\n")[2]
            while chunk := connection.recv(65536):
                answer += chunk
            return {"status": 200, "answer": answer.decode("utf-8", "replace"), "error": None}
    except OSError as exc:
        return {"status": None, "answer": None, "error": f"{type(exc).__name__}: {exc}"}


def direct(host: str, port: int) -> dict[str, object]:
    """Connect straight to host:port, past any proxy."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return {"connected": True, "error": None}
    except OSError as exc:
        return {"connected": False, "error": f"{type(exc).__name__}: {exc}"}


NETWORK: dict[str, Callable[..., dict[str, object]]] = {
    "fetch": fetch,
    "tunnel": tunnel,
    "direct": direct,
}


AT_START = os.environ.get("PROBE_AT_START")
at_start = sum(len(files) for _, _, files in os.walk(AT_START)) if AT_START else None
if os.environ.get("PROBE_MARK"):
    with open(os.environ["PROBE_MARK"], "w") as mark:
        mark.write("the probe ran\n")

for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if "id" not in message or "method" not in message:
        continue
    if message["method"] == "exit":
        sys.exit(0)  # unanswered: the client hears the orchestrator's -32002
    if message["method"] == "at_start":
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"files": at_start}}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
        continue
    if message["method"] in NETWORK:
        params = message.get("params") or {}
        found = NETWORK[message["method"]](**params)
        proxies = {k: v for k, v in os.environ.items() if k.lower().endswith("_proxy")}
        result = {**found, "proxy_env": proxies}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
        sys.stdout.write("\n")
        sys.stdout.flush()
        continue
    path = (message.get("params") or {}).get("path", "/workspace")
    entries = None
    try:
        if message["method"] == "secret":
            result = {**secret(message["params"]["name"]), "uid": os.getuid(), "gid": os.getgid()}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
            sys.stdout.write("\n")
            sys.stdout.flush()
            continue
        if message["method"] == "write":
            with open(path, "w") as file:
                file.write("written by the probe\n")
            error = None
        elif message["method"] == "connect":
            with socket.socket(socket.AF_UNIX) as connection:
                connection.connect(path)
            error = None
        else:
            entries, error = sorted(os.listdir(path)), None
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc.strerror}"
    result = {"entries": entries, "error": error, "uid": os.getuid(), "gid": os.getgid()}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
    sys.stdout.flush()
