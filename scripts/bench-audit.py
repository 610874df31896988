"""What the audit trail costs the relay: the same flood of tool calls with the trail on and off,
next to a control that tells the benchmark's own resolution.

Three orchestrators of the working tree serve the bundled suite on the real engine: one with
``orchestrator.audit`` on (the default) and two with it off — ``trail_off`` and
``trail_off_again``, identical. The second is the control: whatever separates the two "off"
systems is the machine and the method, not the trail. Every repeat starts three fresh
orchestrators and opens one WebSocket session each to the ``everything`` service, warmed up,
all in an order rotating with the repeat (a run of 3 repeats without it showed the first
system slower by 10-20 us at P50 with the trail off everywhere); then:

- **round trips**: ``tools/call echo`` one at a time, the three systems interleaved call by call
  in a rotating order (so all meet the same moments of the machine);
- **flood**: the same call with 16 in flight on the session, the systems one after the other
  in a rotating order; calls/s = calls answered / wall time.

Over the whole run each system answers ``--calls`` round trips and as many flood calls (10,000
each by default). Figures per repeat, then the median of the repeats with their range, and paired
by repeat: on minus off and, the control, off-again minus off (P50, P99), on/off and
off-again/off (calls/s). The trail's cost is measurable when the on-off range lies outside the
control's. Afterwards each trail is checked: one ``tool_call`` record per call, none dropped.

    .venv/bin/python scripts/bench-audit.py [--calls 10000] [--repeats 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import trio
import yaml
from bench.mcp import StreamRpc, check_result, encode_request, handshake, websocket_session
from bench.stats import Json, spread, summarize

from bench import engine
from reactor_fabric._operator_cli import audit_file_name

REPO = engine.REPO
TMP = REPO / "bench" / "tmp" / "audit"
SUITE = REPO / "claude-mcp-suite.yaml"
SERVICE = "everything"
CALL = {"name": "echo", "arguments": {"message": "audited"}}
IN_FLIGHT = 16
WARM_UP = 300
SYSTEMS = ("trail_on", "trail_off", "trail_off_again")


FIGURES = ("p50_ms", "p99_ms", "calls_per_s", "cpu_us_per_call", "flood_cpu_us_per_call")


def rotated(items: tuple[str, ...], by: int) -> tuple[str, ...]:
    by %= len(items)
    return items[by:] + items[:by]


def write_suite(path: Path, *, audit: bool) -> Path:
    suite = yaml.safe_load(SUITE.read_text())
    suite["orchestrator"] = {
        "allowed_mount_roots": [str(TMP)],
        "audit": {"enabled": audit},
    }
    # The specialist agents need a model account: not what this measures.
    suite["mcp_services"] = {
        name: service
        for name, service in suite["mcp_services"].items()
        if service.get("service_type") != "llm_agent"
    }
    for service in suite["mcp_services"].values():
        service["timeout"] = "30m"
        # No warm pool: its containers would start next to the measured ones, in one system.
        service["warm"] = 0
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


async def flood(rpc: StreamRpc, total: int) -> float:
    """``total`` calls with IN_FLIGHT of them in flight; calls answered per second."""
    sent = 0
    answered = 0
    done = trio.Event()
    started = time.perf_counter()

    async def send_one() -> None:
        nonlocal sent
        sent += 1
        await rpc.stream.send(encode_request(rpc.new_id(), "tools/call", CALL))

    async def receive_all() -> None:
        nonlocal answered
        while answered < total:
            message = json.loads(await rpc.stream.receive())
            if "id" in message and ("result" in message or "error" in message):
                check_result(message, "tools/call")
                answered += 1
                if sent < total:
                    await send_one()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive_all)
        # Counted, not a fixed number of sends: answers that arrive meanwhile have the receiver
        # send the next calls too, and both together must send exactly ``total``.
        while sent < min(IN_FLIGHT, total):
            await send_one()
        await done.wait()
    return total / (time.perf_counter() - started)


async def measure(calls: int, repeats: int) -> Json:
    shutil.rmtree(TMP, ignore_errors=True)  # fresh trails: the check counts their records
    TMP.mkdir(parents=True, exist_ok=True)
    per_repeat = math.ceil(calls / repeats)
    repeats_out: list[Json] = []
    trails: list[Json] = []
    for repeat in range(repeats):
        figures, trail = await one_repeat(repeat, per_repeat)
        repeats_out.append(figures)
        trails.append(trail)
        say(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{s} p50 {figures[s]['p50_ms']} p99 {figures[s]['p99_ms']} "
            f"{figures[s]['calls_per_s']}/s" for s in SYSTEMS
        ))  # fmt: skip
    return {
        "calls_per_system": 2 * per_repeat * repeats,
        "repeats": repeats_out,
        "summary": summary(repeats_out),
        "trail": {
            key: sum(trail[key] for trail in trails)
            for key in ("expected_calls", "tool_call_records", "dropped")
        },
        "machine": engine.machine_info(),
    }


async def one_repeat(repeat: int, per_repeat: int) -> tuple[Json, Json]:
    """Three fresh orchestrators, measured interleaved; their figures and the trail's check."""
    folder = TMP / f"repeat-{repeat + 1}"
    folder.mkdir()
    orchestrators: dict[str, engine.Orchestrator] = {}
    try:
        for system in rotated(SYSTEMS, repeat):
            suite = write_suite(folder / f"{system}.yaml", audit=system == "trail_on")
            orchestrators[system] = await engine.start_orchestrator(suite, folder / f"{system}.log")
        async with contextlib.AsyncExitStack() as stack:
            rpcs: dict[str, StreamRpc] = {}
            for system in rotated(SYSTEMS, repeat):
                url = orchestrators[system].ws_url(SERVICE)
                rpcs[system] = rpc = await stack.enter_async_context(websocket_session(url))
                await handshake(rpc)
                for _ in range(WARM_UP):
                    check_result((await rpc.call("tools/call", CALL))[1], "tools/call")
            samples: dict[str, list[int]] = {system: [] for system in SYSTEMS}
            cpu = {s: engine.cpu_seconds(orchestrators[s].process.pid) for s in SYSTEMS}
            for index in range(per_repeat):
                for system in rotated(SYSTEMS, index + repeat):
                    elapsed, answer = await rpcs[system].call("tools/call", CALL)
                    check_result(answer, "tools/call")
                    samples[system].append(elapsed)
            cpu = {s: engine.cpu_seconds(orchestrators[s].process.pid) - cpu[s] for s in SYSTEMS}
            rates: dict[str, float] = {}
            flood_cpu: dict[str, float] = {}
            for system in rotated(SYSTEMS, repeat):
                before = engine.cpu_seconds(orchestrators[system].process.pid)
                rates[system] = await flood(rpcs[system], per_repeat)
                flood_cpu[system] = engine.cpu_seconds(orchestrators[system].process.pid) - before
        trail = await trail_check(orchestrators["trail_on"], expected=WARM_UP + 2 * per_repeat)
    finally:
        for orchestrator in orchestrators.values():
            await orchestrator.stop()
    figures = {
        system: {
            **summarize(samples[system]),
            "calls_per_s": round(rates[system]),
            # The orchestrator process's CPU time (all its threads) per call.
            "cpu_us_per_call": round(cpu[system] / per_repeat * 1e6, 1),
            "flood_cpu_us_per_call": round(flood_cpu[system] / per_repeat * 1e6, 1),
        }
        for system in SYSTEMS
    }
    return figures, trail


async def trail_check(orchestrator: engine.Orchestrator, *, expected: int) -> Json:
    """The trail of the orchestrator that kept one: its tool_call records and drops."""
    path = orchestrator.log_path.with_name(orchestrator.log_path.stem + "-state")
    port = urllib.parse.urlsplit(orchestrator.http_url).port
    assert port is not None
    path = path / "reactor-fabric" / audit_file_name(port)  # its port's default trail
    records = 0
    dropped = 0
    for _ in range(100):  # the writer thread may still be writing the last batch
        records = dropped = 0
        with path.open("rb") as lines:
            for line in lines:
                if not line.endswith(b"\n"):
                    break  # the writer is appending this one right now: read it next time
                record = json.loads(line)
                if record["event"] == "tool_call":
                    records += 1
                elif record["event"] == "audit_dropped":
                    dropped += record["count"]
        if records + dropped >= expected:
            break
        await trio.sleep(0.1)
    return {"expected_calls": expected, "tool_call_records": records, "dropped": dropped}


def summary(repeats: list[Json]) -> Json:
    def each(system: str, key: str) -> list[float | None]:
        return [r[system][key] for r in repeats]

    def paired(system: str) -> Json:
        figures = {
            key: spread([r[system][key] - r["trail_off"][key] for r in repeats])
            for key in ("p50_ms", "p99_ms", "cpu_us_per_call", "flood_cpu_us_per_call")
        }
        figures["calls_per_s_ratio"] = spread(
            [r[system]["calls_per_s"] / r["trail_off"]["calls_per_s"] for r in repeats]
        )
        return figures

    return {
        "per_system": {
            system: {key: spread(each(system, key)) for key in FIGURES} for system in SYSTEMS
        },
        "on_minus_off": paired("trail_on"),
        "control_off_again_minus_off": paired("trail_off_again"),
    }


def say(text: str) -> None:
    print(f"bench-audit: {text}", file=sys.stderr, flush=True)


def table(results: Json) -> str:
    """The Markdown table docs/BENCHMARKS.md shows."""
    per = results["summary"]["per_system"]

    def cell(figure: Json) -> str:
        return f"{figure['median']} [{figure['min']}, {figure['max']}]"

    def signed(figure: Json) -> str:
        return f"{figure['median']:+} [{figure['min']:+}, {figure['max']:+}]"

    def pair(key: str, name: str) -> str:
        paired = results["summary"][key]
        return (
            f"| {name}, paired by repeat | {signed(paired['p50_ms'])} | "
            f"{signed(paired['p99_ms'])} | ratio {cell(paired['calls_per_s_ratio'])} | "
            f"{signed(paired['cpu_us_per_call'])} | {signed(paired['flood_cpu_us_per_call'])} |"
        )

    lines = [
        "| | P50 (ms) | P99 (ms) | flood, calls/s | CPU µs per call | CPU µs per flood call |",
        "|---|---|---|---|---|---|",
        *(
            f"| {system.replace('_', ' ')} | "
            + " | ".join(cell(per[system][key]) for key in FIGURES)
            + " |"
            for system in SYSTEMS
        ),
        pair("on_minus_off", "on - off"),
        pair("control_off_again_minus_off", "control: off again - off"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--calls", type=int, default=10_000, help="round trips, and flood calls, per system"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=6,
        help="a multiple of 3 gives every system every place in every order equally often",
    )
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "audit-results.json")
    args = parser.parse_args(argv)
    results: Any = trio.run(measure, args.calls, args.repeats)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(json.dumps(results["trail"]))
    trail = results["trail"]
    complete = trail["tool_call_records"] + trail["dropped"] == trail["expected_calls"]
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
