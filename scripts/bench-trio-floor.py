"""How near its floor a trio relay that only moves bytes gets, 16 calls in flight.

``make bench``'s throughput part judges the orchestrator's WebSocket relay against the socket
floor (issue 53's target: small calls at 80 % of it). This asks what a relay on trio can reach
at all on this machine: the same pipelined echo calls (``bench.py``'s ``pipelined``, 16 B
payloads, the ``everything`` server) straight to ``docker run -i`` over its pipes (the floor of a
relay that wraps that process), and through ``scripts/bench/trio_floor_relay.py`` — WebSocket in,
the same ``docker run -i`` out, nothing else — on bare calls and on trio's streams; interleaved,
rotated each repeat, medians with their range, and each relay's CPU per call (``/proc`` ticks).

    .venv/bin/python scripts/bench-trio-floor.py [--calls 3000] [--repeats 5]

Needs the bundled images (``make images``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.mcp import StreamRpc, free_port, wait_for_port, websocket_session

from bench import engine  # the benchmark's helpers

SCRIPTS = Path(__file__).resolve().parent

# bench.py itself (a module beside the bench/ package of the same name).
_spec = importlib.util.spec_from_file_location("bench_main", SCRIPTS / "bench.py")
assert _spec is not None
assert _spec.loader is not None
bench_main: Any = importlib.util.module_from_spec(_spec)
sys.modules["bench_main"] = bench_main
_spec.loader.exec_module(bench_main)

WARM_UP_CALLS = 300
PAYLOAD = 16


@contextlib.asynccontextmanager
async def floor_relay(image: str, mode: str) -> AsyncIterator[tuple[StreamRpc, int]]:
    """A session through the floor relay (``bare`` or ``streams``), and the relay's pid."""
    port = free_port()
    argv = [sys.executable, str(SCRIPTS / "bench" / "trio_floor_relay.py")]
    argv += ["--image", image, "--port", str(port)]
    if mode == "streams":
        argv.append("--streams")
    process = subprocess.Popen(argv, stderr=subprocess.DEVNULL)  # noqa: ASYNC220 (it starts at once)
    try:
        await wait_for_port(port, bound=60, alive=lambda: process.poll() is None)
        session = websocket_session(f"ws://127.0.0.1:{port}/", subprotocols=["mcp"])
        async with bench_main.initialized(session) as rpc:
            yield rpc, process.pid
    finally:
        process.terminate()
        process.wait()


async def measure(calls: int, repeats: int) -> None:
    image = bench_main.service_image(bench_main.THROUGHPUT_SERVICE)
    pipe_argv = engine.docker_run_argv(image, "--network", "none")
    runs: dict[str, list[tuple[float, float | None]]] = {}
    with (SCRIPTS.parent / "bench" / "tmp").joinpath("trio-floor.log").open("wb") as side_log:
        async with contextlib.AsyncExitStack() as stack:
            pipe = await stack.enter_async_context(
                bench_main.initialized(engine.piped(pipe_argv, side_log))
            )
            systems: dict[str, tuple[StreamRpc, int | None]] = {"docker_run_pipe": (pipe, None)}
            for mode in ("bare", "streams"):
                systems[f"trio_floor_{mode}"] = await stack.enter_async_context(
                    floor_relay(image, mode)
                )
            for rpc, _ in systems.values():
                await bench_main.pipelined(rpc, total=WARM_UP_CALLS, payload=PAYLOAD)
            names = list(systems)
            for repeat in range(repeats):
                shift = repeat % len(names)
                for name in names[shift:] + names[:shift]:
                    rpc, pid = systems[name]
                    cpu_before = engine.cpu_seconds(pid) if pid else 0.0
                    run = await bench_main.pipelined(rpc, total=calls, payload=PAYLOAD)
                    cpu = (engine.cpu_seconds(pid) - cpu_before) / calls * 1e6 if pid else None
                    runs.setdefault(name, []).append((run["msgs_per_s"], cpu))
    floor = statistics.median(rate for rate, _ in runs["docker_run_pipe"])
    for name, results in runs.items():
        rates = [rate for rate, _ in results]
        cpus = [cpu for _, cpu in results if cpu is not None]
        line = f"{name}: {statistics.median(rates):,.0f} calls/s [{min(rates):,.0f}, "
        line += f"{max(rates):,.0f}], {statistics.median(rates) / floor:.0%} of the pipe"
        if cpus:
            line += f", CPU {statistics.median(cpus):.0f} µs per call (10 ms ticks)"
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per run")
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    (SCRIPTS.parent / "bench" / "tmp").mkdir(parents=True, exist_ok=True)
    trio.run(measure, arguments.calls, arguments.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
