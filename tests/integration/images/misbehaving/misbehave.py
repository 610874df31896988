"""Misbehave as REACTOR_FABRIC_SERVICE_CONFIG says, then become mcp-server-time.

Config keys: ``stderr_line`` (write one stderr line of that many bytes), ``stderr_flood`` (write
that many short stderr lines, as fast as possible, from a thread that keeps going while the
server serves).
"""

import json
import os
import sys
import threading

config = json.loads(os.environ.get("REACTOR_FABRIC_SERVICE_CONFIG") or "{}")
if config.get("stderr_line"):
    sys.stderr.write("L" * int(config["stderr_line"]) + "\n")
    sys.stderr.flush()
if config.get("stderr_flood"):

    def flood(count: int) -> None:
        for index in range(count):
            os.write(2, f"noise line {index}\n".encode())

    threading.Thread(target=flood, args=(int(config["stderr_flood"]),), daemon=True).start()

from mcp_server_time import main  # type: ignore[import-not-found]  # noqa: E402 - after the misbehaviour

sys.argv = ["mcp-server-time"]
main()
