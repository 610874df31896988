"""What the audit trail costs the relay: the same flood of tool calls with the trail on and off.

Two orchestrators of the working tree serve the bundled suite on the real engine, one with
``orchestrator.audit`` on (the default), one with it off. One WebSocket session each to the
``everything`` service, warmed up; then, repeated:

- **round trips**: ``tools/call echo`` one at a time, the two systems interleaved call by call
  in a rotating order (so both meet the same moments of the machine);
- **flood**: the same call with 16 in flight on the session, the systems one after the other
  in a rotating order; calls/s = calls answered / wall time.

Over the whole run each system answers ``--calls`` round trips and as many flood calls (10,000
each by default). Figures per repeat, then the median of the repeats with their range, and paired
by repeat: trail on minus trail off (P50, P99) and on/off (calls/s). Afterwards the trail is
checked: one ``tool_call`` record per call, none dropped.

    .venv/bin/python scripts/bench-audit.py [--calls 10000] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import trio
import yaml
from bench.mcp import StreamRpc, check_result, encode_request, handshake, websocket_session
from bench.stats import Json, spread, summarize

from bench import engine

REPO = engine.REPO
TMP = REPO / "bench" / "tmp" / "audit"
SUITE = REPO / "claude-mcp-suite.yaml"
SERVICE = "everything"
CALL = {"name": "echo", "arguments": {"message": "audited"}}
IN_FLIGHT = 16
WARM_UP = 300
SYSTEMS = ("trail_on", "trail_off")


def write_suite(path: Path, *, audit: bool) -> Path:
    suite = yaml.safe_load(SUITE.read_text())
    suite["orchestrator"] = {
        "allowed_mount_roots": [str(TMP)],
        "audit": {"enabled": audit},
    }
    for service in suite["mcp_services"].values():
        service["timeout"] = "30m"
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
        for _ in range(min(IN_FLIGHT, total)):
            await send_one()
        await done.wait()
    return total / (time.perf_counter() - started)


async def measure(calls: int, repeats: int) -> Json:
    shutil.rmtree(TMP, ignore_errors=True)  # a fresh trail: the check counts its records
    TMP.mkdir(parents=True, exist_ok=True)
    orchestrators: dict[str, engine.Orchestrator] = {}
    try:
        for system in SYSTEMS:
            suite = write_suite(TMP / f"{system}.yaml", audit=system == "trail_on")
            orchestrators[system] = await engine.start_orchestrator(suite, TMP / f"{system}.log")
        async with (
            websocket_session(orchestrators["trail_on"].ws_url(SERVICE)) as on,
            websocket_session(orchestrators["trail_off"].ws_url(SERVICE)) as off,
        ):
            rpcs = {"trail_on": on, "trail_off": off}
            for rpc in rpcs.values():
                await handshake(rpc)
                for _ in range(WARM_UP):
                    check_result((await rpc.call("tools/call", CALL))[1], "tools/call")
            per_repeat = calls // repeats
            repeats_out: list[Json] = []
            for repeat in range(repeats):
                samples: dict[str, list[int]] = {system: [] for system in SYSTEMS}
                for index in range(per_repeat):
                    order = SYSTEMS if (index + repeat) % 2 == 0 else SYSTEMS[::-1]
                    for system in order:
                        elapsed, answer = await rpcs[system].call("tools/call", CALL)
                        check_result(answer, "tools/call")
                        samples[system].append(elapsed)
                rates: dict[str, float] = {}
                for system in SYSTEMS if repeat % 2 == 0 else SYSTEMS[::-1]:
                    rates[system] = await flood(rpcs[system], per_repeat)
                repeats_out.append(
                    {
                        system: {**summarize(samples[system]), "calls_per_s": round(rates[system])}
                        for system in SYSTEMS
                    }
                )
                say(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
                    f"{s} p50 {repeats_out[-1][s]['p50_ms']} p99 {repeats_out[-1][s]['p99_ms']} "
                    f"{repeats_out[-1][s]['calls_per_s']}/s" for s in SYSTEMS
                ))  # fmt: skip
        trail = await trail_check(
            orchestrators["trail_on"], expected=WARM_UP + 2 * per_repeat * repeats
        )
    finally:
        for orchestrator in orchestrators.values():
            await orchestrator.stop()
    return {
        "calls_per_system": 2 * per_repeat * repeats,
        "repeats": repeats_out,
        "summary": summary(repeats_out),
        "trail": trail,
        "machine": engine.machine_info(),
    }


async def trail_check(orchestrator: engine.Orchestrator, *, expected: int) -> Json:
    """The trail of the orchestrator that kept one: its tool_call records and drops."""
    path = orchestrator.log_path.with_name(orchestrator.log_path.stem + "-state")
    path = path / "reactor-fabric" / "audit.jsonl"
    records = 0
    dropped = 0
    for _ in range(100):  # the writer thread may still be writing the last batch
        records = dropped = 0
        with path.open("rb") as lines:
            for line in lines:
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

    paired = {
        key: spread([r["trail_on"][key] - r["trail_off"][key] for r in repeats])
        for key in ("p50_ms", "p99_ms")
    }
    paired["calls_per_s_ratio"] = spread(
        [r["trail_on"]["calls_per_s"] / r["trail_off"]["calls_per_s"] for r in repeats]
    )
    return {
        "per_system": {
            system: {key: spread(each(system, key)) for key in ("p50_ms", "p99_ms", "calls_per_s")}
            for system in SYSTEMS
        },
        "on_minus_off": paired,
    }


def say(text: str) -> None:
    print(f"bench-audit: {text}", file=sys.stderr, flush=True)


def table(results: Json) -> str:
    """The Markdown table docs/BENCHMARKS.md shows."""
    per = results["summary"]["per_system"]
    paired = results["summary"]["on_minus_off"]

    def cell(figure: Json) -> str:
        return f"{figure['median']} [{figure['min']}, {figure['max']}]"

    lines = [
        "| | P50 (ms) | P99 (ms) | flood, calls/s |",
        "|---|---|---|---|",
        *(
            f"| {system.replace('_', ' ')} | {cell(per[system]['p50_ms'])} | "
            f"{cell(per[system]['p99_ms'])} | {cell(per[system]['calls_per_s'])} |"
            for system in SYSTEMS
        ),
        f"| on - off, paired by repeat | {cell(paired['p50_ms'])} | {cell(paired['p99_ms'])} | "
        f"on/off {cell(paired['calls_per_s_ratio'])} |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--calls", type=int, default=10_000, help="round trips, and flood calls, per system"
    )
    parser.add_argument("--repeats", type=int, default=5)
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
