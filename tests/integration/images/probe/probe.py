"""Answer every JSON-RPC request with what this container sees at a path.

Request params (all optional): ``{"path": "/workspace"}``. The result:
``{"entries": [...] | null, "error": str | null, "uid": int, "gid": int}``. Notifications are
ignored; the method ``write`` creates the file at ``path`` instead of listing, ``connect``
connects a Unix socket there, and ``exit`` ends the server without an answer. One line in, one
line out.
"""

import json
import os
import socket
import sys

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
