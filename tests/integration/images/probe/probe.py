"""Answer every JSON-RPC request with what this container sees at a path.

Request params (all optional): ``{"path": "/workspace"}``. The result:
``{"entries": [...] | null, "error": str | null, "uid": int, "gid": int}``. Notifications are
ignored; the method ``write`` creates the file at ``path`` instead of listing, ``connect``
connects a Unix socket there, and ``exit`` ends the server without an answer. One line in, one
line out.

The method ``secret`` (params ``{"name": NAME}``) reports what the server got of the secret
NAME: a SHA-256 of the environment variable's value and of /run/secrets/NAME's content (never a
value: the answer travels through the orchestrator), the file's owner and mode, and the file
system it is on; and writes a careless debug line with the value on stderr, which the
orchestrator must log redacted.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import sys


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


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if "id" not in message or "method" not in message:
        continue
    if message["method"] == "exit":
        sys.exit(0)  # unanswered: the client hears the orchestrator's -32002
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
