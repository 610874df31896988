"""``docs/BENCHMARKS.md`` from ``bench/results.json``: the part between the markers is generated.

Text outside ``<!-- bench:begin -->`` / ``<!-- bench:end -->`` is hand-written and survives
regeneration; a missing document is created from :data:`TEMPLATE`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .residency import figure_name
from .stats import Json, measured

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"

TEMPLATE = f"""# Benchmarks

`make bench` measures Reactor-Fabric on the real Docker engine, next to the floor (the same
server with no relay) and the relays a user would pick instead. It writes `bench/results.json`
and regenerates the tables below. See the part above the generated tables for definitions.

## What was changed and what it bought

_To be filled in by the lead: each change made after the first figures, and what it bought._

{BEGIN}
{END}
"""


def update_document(path: Path, results: Json) -> None:
    text = path.read_text() if path.exists() else TEMPLATE
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n{render(results)}{END}{tail}")


def _ms(value: Any) -> str:
    if value is None:
        return "—"
    number = float(value)
    if abs(number) >= 100:
        return f"{number:,.0f}"
    if abs(number) >= 10:
        return f"{number:.1f}"
    return f"{number:.2f}"


def _signed(value: Any) -> str:
    if value is None:
        return "—"
    return ("+" if float(value) >= 0 else "") + _ms(value)


def _times(value: Any) -> str:
    return "—" if value is None else f"{float(value):.2f}x"


def _range(figure: Any, *, signed: bool = False) -> str:
    """``median [min, max]`` of a spread."""
    if not isinstance(figure, dict) or "median" not in figure:
        return "—"
    show = _signed if signed else _ms
    if figure.get("n", 1) == 1:
        return show(figure["median"])
    return f"{show(figure['median'])} [{show(figure['min'])}, {show(figure['max'])}]"


def _interval(interval: Any) -> str:
    if not isinstance(interval, list) or len(interval) != 2:
        return ""
    return f"{_ms(interval[0])} to {_ms(interval[1])}"


def _ci(interval: Any) -> str:
    text = _interval(interval)
    return f" (95 % CI {text})" if text else ""


def _mb(value: Any) -> str:
    if isinstance(value, dict):
        return f"not measured: {value.get('error', '?')}"
    return "—" if value is None else f"{float(value):.1f} MB"


def _stats_row(label: str, stats: Any, extra: list[str] | None = None) -> str:
    extra = extra or []
    if not measured(stats):
        reason = stats.get("error", "?") if isinstance(stats, dict) else "?"
        cells = [f"not measured: {reason}"] + [""] * (5 + len(extra))
        return f"| {label} | " + " | ".join(cells) + " |"
    cells = [str(stats["n"])] + [
        _ms(stats[key]) for key in ("min_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms")
    ]
    return f"| {label} | " + " | ".join(cells + extra) + " |"


STATS_HEAD = "| n | min | P50 | P95 | P99 | max |"
STATS_RULE = "|---:|---:|---:|---:|---:|---:|"


def _met(condition: bool | None) -> str:
    if condition is None:
        return "not measured"
    return "met" if condition else "**missed**"


def render(results: Json) -> str:
    parts = [
        _machine(results),
        _bars(results),
        _cold(results),
        _rtt(results),
        _throughput(results),
        _memory(results),
        _concurrency(results),
        _pool(results),
        _lifecycles(results),
        _startup(results),
        _problems(results),
    ]
    return "\n".join(part for part in parts if part)


STARTUP_NAMES = {"no_pool": "no warm pool", "warm_pool": "`warm: 1` for every service"}
STARTUP_TARGET_MS = 1000.0


def _startup(results: Json) -> str:
    startup = results.get("startup", {})
    if not startup:
        return ""
    lines = [
        "### 8. Start-up: from spawning `python -m reactor_fabric` to serving (ms)",
        "",
        "| Suite | Banner (listening) P50 [min, max] | First `/healthz` answered P50 [min, max] "
        "| Pool full P50 [min, max] | Runs |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in STARTUP_NAMES.items():
        figures = startup.get(key, {})
        if "error" in figures:
            lines.append(f"| {label} | not measured: {figures['error']} | | | |")
            continue

        def cell(what: str, figures: Json = figures) -> str:
            stats = figures.get(what) or {}
            if "p50_ms" not in stats:
                return "—"
            return (
                f"{_ms(stats['p50_ms'])} [{_ms(stats.get('min_ms'))}, {_ms(stats.get('max_ms'))}]"
            )

        runs = (figures.get("healthz") or {}).get("n", "—")
        lines.append(
            f"| {label} | {cell('banner')} | {cell('healthz')} | {cell('pool_full')} | {runs} |"
        )
    lines.append("")
    return "\n".join(lines)


def _machine(results: Json) -> str:
    machine = results.get("machine", {})
    env = results.get("environment", {})
    start, end = env.get("start", {}), env.get("end", {})
    peers = results.get("peer_versions", {})
    lines = [
        f"## Results — {results.get('date', '?')} ({results.get('mode', '?')} run, "
        f"{results.get('duration_s', '?')} s)",
        "",
        "_Generated by `scripts/bench.py` from `bench/results.json`; do not edit by hand._",
        "",
        "| Machine | |",
        "|---|---|",
        f"| CPU | {machine.get('cores', '?')} cores, {machine.get('cpu', '?')} |",
        f"| Memory | {machine.get('memory_mb', '?')} MB |",
        f"| Kernel | {machine.get('kernel', '?')} |",
        f"| Docker engine | {machine.get('docker_server_version', '?')} (API "
        f"{machine.get('docker_api_version', '?')}, {machine.get('docker_storage_driver', '?')},"
        f" cgroup {machine.get('docker_cgroup', '?')}) |",
        f"| Python / Node | {machine.get('python', '?')} / {machine.get('node', '?')} |",
        f"| Peers | supergateway {peers.get('supergateway') or '—'}, mcp-proxy "
        f"{peers.get('mcp_proxy') or '—'} |",
        f"| Other load | load average {start.get('loadavg', '?')} at start, "
        f"{end.get('loadavg', '?')} at end; other running containers (not ours): "
        f"{_others(env)} |",
        "",
    ]
    return "\n".join(lines)


def _others(env: Json) -> str:
    snapshots = [env.get("start", {}), *env.get("sections", {}).values(), env.get("end", {})]
    counts = [snap["other_running_containers"] for snap in snapshots if snap]
    if not counts:
        return "?"
    return f"at most {max(counts)} over {len(counts)} checks (start, each part, end)"


def _bars(results: Json) -> str:
    cold = results.get("cold_start", {})
    comparison = cold.get("comparison", {})
    rf_cold = cold.get("reactor_fabric", {})
    overhead = results.get("relay_overhead", {})
    ours = overhead.get("reactor_fabric_ws", {})
    ours_p99 = ours.get("overhead_p99_ms", {}).get("median")
    ours_p50 = ours.get("overhead_p50_ms", {}).get("median")
    peers = {
        name: overhead[name]
        for name in ("supergateway", "mcp_proxy")
        if isinstance(overhead.get(name), dict) and "overhead_p99_ms" in overhead[name]
    }
    memory = results.get("memory_mb", {})

    def figure(key: str) -> float | None:
        value = memory.get(key)
        return value if isinstance(value, int | float) else None

    idle, mem100, mem200 = (
        figure("orchestrator_idle_fresh"),
        figure("orchestrator_100_sessions"),
        figure("orchestrator_200_sessions"),
    )
    per_session = (memory.get("orchestrator_200_sessions_detail") or {}).get("per_session_kb")
    concurrency = results.get("concurrency", {})
    c10, c200 = concurrency.get("clients_10", {}), concurrency.get("clients_200", {})

    def burst_ok(burst: Any, count: int) -> bool | None:
        if not isinstance(burst, dict) or "ok" not in burst:
            return None
        return bool(burst["ok"] == count and burst["failed"] == 0)

    cold_p95 = rf_cold.get("p95_ms") if measured(rf_cold) else None
    diff95 = comparison.get("difference_p95_ms")
    bar_rtt: bool | None = None
    if ours_p99 is not None:
        bar_rtt = ours_p99 <= 1.0 and all(
            figures.get("reactor_fabric_clearly_below_p50")
            and figures.get("reactor_fabric_clearly_below_p99")
            for figures in peers.values()
        )
    peers_text = (
        "; ".join(
            f"{name} P50 {_range(figures['overhead_p50_ms'], signed=True)}, "
            f"P99 {_range(figures['overhead_p99_ms'], signed=True)}; ours minus {name}, "
            f"paired by repeat: P50 {_range(figures.get('paired_difference_p50_ms'), signed=True)}"
            f", P99 {_range(figures.get('paired_difference_p99_ms'), signed=True)}"
            for name, figures in peers.items()
        )
        or "no peer measured"
    )
    rows = [
        (
            "Cold start P95 (connect included)",
            "< 3.5 s",
            "≤ `docker run -i` + 50 ms",
            f"{_ms(cold_p95)} ms ({_signed(diff95)} ms vs floor"
            f"{_ci(comparison.get('difference_p95_ci_ms'))})",
            _met(None if cold_p95 is None else cold_p95 < 3500),
            _met(None if diff95 is None else diff95 <= 50),
        ),
        (
            "Relay overhead P99 (median of repeats)",
            "< 50 ms",
            "≤ 1 ms, and clearly below every other relay at P50 and P99",
            f"{_ms(ours_p99)} ms (P50 {_ms(ours_p50)}); peers, against their own floor: "
            f"{peers_text}",
            _met(None if ours_p99 is None else ours_p99 < 50),
            _met(bar_rtt),
        ),
        (
            "Orchestrator RSS: idle; 100 and 200 sessions",
            "< 200 MB",
            "idle ≤ 50 MB; ≤ 100 MB with 100; ≤ 130 MB with 200",
            f"idle {_mb(idle)}; 100: {_mb(mem100)}; 200: {_mb(mem200)} "
            f"({'—' if per_session is None else f'{per_session:.0f} KB'} per session)",
            _met(None if mem200 is None else mem200 < 200),
            _met(
                None
                if None in (idle, mem100, mem200)
                else bool(idle <= 50 and mem100 <= 100 and mem200 <= 130)  # type: ignore[operator]
            ),
        ),
        (
            "Concurrent sessions",
            "10+ containers",
            "200 sessions at once, 0 failures, 0 left",
            f"10: {c10.get('ok', '—')} ok / {c10.get('failed', '—')} failed; "
            f"200: {c200.get('ok', '—')} ok / {c200.get('failed', '—')} failed, "
            f"{c200.get('containers_left', '—')} left",
            _met(burst_ok(c10, 10)),
            _met(
                None
                if burst_ok(c200, 200) is None
                else bool(burst_ok(c200, 200) and c200.get("containers_left") == 0)
            ),
        ),
    ]
    rows.append(_pool_bar(results.get("pool", {})))
    rows.append(_lifecycle_bar(results.get("lifecycles", {})))
    lines = [
        "### Against the bars (spec §9)",
        "",
        "| Figure | Seed target | Our bar | Measured | Seed target | Our bar |",
        "|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    return "\n".join(lines)


def _cold(results: Json) -> str:
    cold = results.get("cold_start", {})
    tools = cold.get("first_tool_call", {})
    names = {
        "reactor_fabric": "Reactor-Fabric (WebSocket connect + `initialize`)",
        "docker_run_floor": "`docker run -i --rm` (floor)",
        "docker_run_same_limits": "`docker run -i --rm` + the orchestrator's limits",
    }
    lines = [
        "### 1. Cold start: connect → response to `initialize` from a fresh `time` container (ms)",
        "",
        f"| System | {STATS_HEAD[2:]} P50 95 % CI | P95 95 % CI |",
        f"|---{STATS_RULE}---:|---:|",
    ]
    for key, label in names.items():
        figures = cold.get(key, {})
        extra = [_interval(figures.get("p50_ci_ms")), _interval(figures.get("p95_ci_ms"))]
        lines.append(_stats_row(label, figures, extra))
    lines.append("")
    for key, title in (("comparison", "floor"), ("comparison_same_limits", "same-limits floor")):
        comparison = cold.get(key, {})
        lines.append(
            f"- Reactor-Fabric vs {title}: P50 {_signed(comparison.get('difference_p50_ms'))} ms"
            f"{_ci(comparison.get('difference_p50_ci_ms'))} "
            f"({_times(comparison.get('ratio_p50'))}), P95 "
            f"{_signed(comparison.get('difference_p95_ms'))} ms"
            f"{_ci(comparison.get('difference_p95_ci_ms'))} "
            f"({_times(comparison.get('ratio_p95'))})."
        )
    connect = cold.get("reactor_fabric_ws_connect", {})
    if measured(connect):
        lines.append(
            f"- Of which the WebSocket connect: P50 {_ms(connect['p50_ms'])} ms, "
            f"P95 {_ms(connect['p95_ms'])} ms."
        )
    lines += [
        "",
        "First `tools/call` after the handshake, on the same fresh container (ms):",
        "",
        f"| System | {STATS_HEAD[2:]}",
        f"|---{STATS_RULE}",
        *(
            _stats_row(
                "Reactor-Fabric (WebSocket)" if key == "reactor_fabric" else label, tools.get(key)
            )
            for key, label in names.items()
        ),
        "",
    ]
    return "\n".join(lines)


RTT_NAMES = {
    "direct_socket": "direct stdio over the container's socket (no engine, no relay): our floor",
    "direct": "direct stdio (Docker attach, no relay)",
    "docker_run_pipe": "`docker run -i` pipe (no relay): the peers' floor",
    "reactor_fabric_ws": "Reactor-Fabric, WebSocket",
    "reactor_fabric_http": "Reactor-Fabric, Streamable HTTP",
    "reactor_fabric_fabric_ws": "Reactor-Fabric `/mcp` (fabric endpoint), WebSocket",
    "reactor_fabric_fabric_http": "Reactor-Fabric `/mcp` (fabric endpoint), Streamable HTTP",
    "supergateway": "supergateway (stdio→ws, wraps `docker run -i`)",
    "mcp_proxy": "mcp-proxy (Streamable HTTP, wraps `docker run -i`)",
}


def _rtt(results: Json) -> str:
    rtt = results.get("relay_rtt", {})
    overhead = results.get("relay_overhead", {})
    repeats = results.get("plan", {}).get("repeats", "?")
    lines = [
        "### 2. Relay round trip: `tools/call get_current_time` on a warm container (ms)",
        "",
        f"All calls of {repeats} interleaved repeats pooled:",
        "",
        f"| System | {STATS_HEAD[2:]}",
        f"|---{STATS_RULE}",
        *(_stats_row(label, rtt.get(key)) for key, label in RTT_NAMES.items()),
        "",
        "Repeat by repeat — median [min, max] of the repeats; overhead = the system's "
        "percentile minus its floor's, in the same repeat:",
        "",
        "| System | P50 | P99 | Floor | Overhead P50 | Overhead P99 | x ours P50 | x ours P99 |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for key, label in RTT_NAMES.items():
        figures = rtt.get(key, {})
        if not measured(figures):
            reason = figures.get("error", "?") if isinstance(figures, dict) else "?"
            lines.append(f"| {label} | not measured: {reason} | | | | | | |")
            continue
        spreads = figures.get("repeats", {})
        over = overhead.get(key, {})
        lines.append(
            f"| {label} | {_range(spreads.get('p50_ms'))} | {_range(spreads.get('p99_ms'))} | "
            f"{over.get('floor', '(a floor)')} | "
            f"{_range(over.get('overhead_p50_ms'), signed=True)} | "
            f"{_range(over.get('overhead_p99_ms'), signed=True)} | "
            f"{_times(over.get('ratio_to_reactor_fabric_p50'))} | "
            f"{_times(over.get('ratio_to_reactor_fabric_p99'))} |"
        )
    lines.append("")
    references = {
        "docker_run_pipe": "the peers' floor (`docker run -i` pipe)",
        "direct": "the Docker attach",
    }
    for key in ("reactor_fabric_ws", "reactor_fabric_http"):
        for reference, label in references.items():
            against = overhead.get(key, {}).get(f"against_{reference}", {})
            if against:
                lines.append(
                    f"- {RTT_NAMES[key]} against {label}: P50 "
                    f"{_range(against.get('p50_ms'), signed=True)}, P99 "
                    f"{_range(against.get('p99_ms'), signed=True)} ms."
                )
    for name in ("reactor_fabric_fabric_ws", "reactor_fabric_fabric_http"):
        figures = overhead.get(name, {})
        if "relay" not in figures:
            continue
        lines.append(
            f"- {RTT_NAMES[name]}: overhead {_times(figures.get('ratio_to_relay_p50'))} the "
            f"relay's at P50 and {_times(figures.get('ratio_to_relay_p99'))} at P99 "
            f"({RTT_NAMES[figures['relay']]}, same repeats; bar at most 1.5x: "
            f"{_met(figures.get('within_bar'))})."
        )
    for name in ("supergateway", "mcp_proxy"):
        figures = overhead.get(name, {})
        if "paired_difference_p99_ms" not in figures:
            continue
        verdict = {
            key: "below in every repeat"
            if figures.get(f"reactor_fabric_clearly_below_{key}")
            else "not below in every repeat"
            for key in ("p50", "p99")
        }
        lines.append(
            f"- Reactor-Fabric (WebSocket) minus {name}, paired by repeat (same interleaved "
            f"calls): P50 {_range(figures['paired_difference_p50_ms'], signed=True)} "
            f"({verdict['p50']}), P99 {_range(figures['paired_difference_p99_ms'], signed=True)}"
            f" ({verdict['p99']}) ms; unpaired, our worst repeat below their best: P50 "
            f"{_met(figures.get('reactor_fabric_clearly_below_unpaired_p50'))}, P99 "
            f"{_met(figures.get('reactor_fabric_clearly_below_unpaired_p99'))}."
        )
    cpu = results.get("diagnostics", {}).get("orchestrator_cpu_us_per_call", {})
    if cpu:
        text = ", ".join(
            f"{name}: {value} µs" if isinstance(value, int | float) else f"{name}: {value}"
            for name, value in cpu.items()
        )
        lines.append(f"- Orchestrator CPU per call, one call in flight: {text}.")
    lines += _residency_lines(rtt.get("residency"))
    lines.append("")
    return "\n".join(lines)


def _residency_lines(figures: Any) -> list[str]:
    """The relay's own time per message, from its syscalls (bench/residency.py)."""
    if not isinstance(figures, dict):
        return []
    head = (
        "- Time a message stays in the orchestrator (µs; from the syscall that read it to the "
        "one that writes it on, perf tracepoints; median [min, max] of the repeats)"
    )
    if "error" in figures:
        return [f"{head}: not measured: {figures['error']}."]
    parts = [
        f"{RTT_NAMES.get(key, key)}: request P50 {_range(values.get('request_p50_us'))}, "
        f"P99 {_range(values.get('request_p99_us'))}; answer P50 "
        f"{_range(values.get('answer_p50_us'))}, P99 {_range(values.get('answer_p99_us'))}; "
        f"messages that waited on a lock (the GIL) per repeat, request "
        f"{_range(values.get('request_lock_waits'))}, "
        f"answer {_range(values.get('answer_lock_waits'))}"
        for key, values in figures.items()
        if key != "per_repeat" and isinstance(values, dict)
    ]
    return [f"{head}: " + "; ".join(parts) + "."]


def _throughput(results: Json) -> str:
    throughput = results.get("throughput", {})
    depth = throughput.get("pipeline_depth", "?")
    lines = [
        f"### 3. Throughput: one session, `echo` on `everything`, {depth} requests in flight",
        "",
        "Median [min, max] of the repeats.",
        "",
        "| System | Payload | Calls | Calls/s | MiB/s | Latency P50 (ms) | Latency P99 (ms) "
        "| Orchestrator CPU per call (µs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, label in RTT_NAMES.items():
        runs = throughput.get(key)
        if not isinstance(runs, dict):
            continue
        if "error" in runs:
            lines.append(f"| {label} | not measured: {runs['error']} | | | | | | |")
            continue
        for name, run in runs.items():
            cpu = run.get("orchestrator_cpu_us_per_call")
            lines.append(
                f"| {label} | {_bytes(run['payload_bytes'])} ({name}) | {run['messages']} | "
                f"{_range(run['msgs_per_s'])} | {_range(run['mib_per_s'])} | "
                f"{_range(run['latency_p50_ms'])} | {_range(run['latency_p99_ms'])} | "
                f"{_range(cpu) if cpu else '—'} |"
            )
    paired = []
    for key, label in RTT_NAMES.items():
        by_size = throughput.get(key)
        if not isinstance(by_size, dict) or "error" in by_size:
            continue
        for run in by_size.values():
            against = run.get("against_supergateway", {})
            if "ratio" in against:
                verdict = "ahead" if against["ahead_in_every_repeat"] else "not ahead"
                paired.append(
                    f"{label}, {_bytes(run['payload_bytes'])}: {_range(against['ratio'])} "
                    f"({verdict} in every repeat)"
                )
    if paired:
        lines += ["", "Calls/s against supergateway's, paired by repeat (ours ÷ theirs):", ""]
        lines += [f"- {line}" for line in paired]
    lines.append("")
    return "\n".join(lines)


def _bytes(size: int) -> str:
    if size >= 2**20:
        return f"{size // 2**20} MiB"
    if size >= 1024:
        return f"{size // 1024} KiB"
    return f"{size} B"


def _memory(results: Json) -> str:
    memory = results.get("memory_mb", {})
    lines = [
        "### 4. Memory",
        "",
        "On an orchestrator of its own, started for this part (WebSocket sessions on `time`, "
        "each initialized, with its container):",
        "",
        "| Orchestrator (VmRSS) | | Per added session |",
        "|---|---:|---:|",
        f"| idle, just started (catalog learned and indexed) | "
        f"{_mb(memory.get('orchestrator_idle_fresh'))} | |",
    ]
    for key, value in memory.items():
        count = key.removeprefix("orchestrator_").removesuffix("_sessions")
        if not (key.startswith("orchestrator_") and key.endswith("_sessions") and count.isdigit()):
            continue
        detail = memory.get(f"{key}_detail", {})
        per = detail.get("per_session_kb")
        lines.append(
            f"| {count} live sessions ({count} containers) | {_mb(value)} | "
            f"{'—' if per is None else f'{per:.0f} KB'} |"
        )
    lines += [
        f"| idle again, every session closed | "
        f"{_mb(memory.get('orchestrator_idle_after_sessions'))} | |",
        f"| peak (VmHWM) | {_mb(memory.get('orchestrator_peak_fresh'))} | |",
        "",
        "The main orchestrator of the run (the one every other part used):",
        "",
        "| Orchestrator (VmRSS) | |",
        "|---|---:|",
        f"| idle, just started | {_mb(memory.get('orchestrator_idle'))} |",
        f"| idle again, after the relay, throughput and memory parts | "
        f"{_mb(memory.get('orchestrator_after_load'))} |",
        f"| peak (VmHWM) | {_mb(memory.get('orchestrator_peak'))} |",
        "",
        "| Container (idle after `initialize`) | Image | Memory (as `docker stats`) | RSS | "
        "Limit |",
        "|---|---|---:|---:|---:|",
    ]
    containers = memory.get("containers", {})
    if "error" in containers:  # the part was not run
        containers = {"—": containers}
    for service, figures in containers.items():
        if "error" in figures:
            lines.append(f"| {service} | not measured: {figures['error']} | | | |")
            continue
        lines.append(
            f"| {service} | `{figures['image']}` | {figures['usage_mb']:.1f} MB | "
            f"{figures['rss_mb']:.1f} MB | {figures['limit_mb']} MB |"
        )
    lines.append("")
    return "\n".join(lines)


def _concurrency(results: Json) -> str:
    concurrency = results.get("concurrency", {})
    lines = [
        "### 5. Concurrency: N clients at once on `time`, each with its own container",
        "",
        "| Clients, system | OK | Failed | First response P50 / P95 (ms) "
        "| Tool answer P50 / P95 (ms) | Wall (ms) | Sessions/s | Machine memory before → at "
        "peak (MB) | Containers at peak | Left after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errors: list[str] = []
    rows = [(key, "Reactor-Fabric", figures) for key, figures in concurrency.items()]
    rows = [row for row in rows if row[0].startswith("clients_")]
    pooled = concurrency.get("warm_pool", {})
    warm = f"Reactor-Fabric, warm pool of {pooled.get('warm', '?')}"
    rows += [(key, warm, figures) for key, figures in pooled.items() if key.startswith("clients_")]
    floor = concurrency.get("docker_run_floor", {})
    rows += [(key, "`docker run -i --rm` (floor)", figures) for key, figures in floor.items()]
    for key, system, figures in rows:
        count = f"{key.removeprefix('clients_')}, {system}"
        if "error" in figures:
            lines.append(f"| {count} | not measured: {figures['error']} | | | | | | | | |")
            continue
        machine = figures.get("machine_memory_mb") or {}
        ok = f"{figures['ok']}"
        if "pool_hits" in figures:
            ok += f" ({figures['pool_hits']} from the pool)"
        lines.append(
            f"| {count} | {ok} | {figures['failed']} | "
            f"{_ms(figures['p50_first_response_ms'])} / {_ms(figures['p95_first_response_ms'])} | "
            f"{_ms(figures.get('p50_tool_response_ms'))} / "
            f"{_ms(figures.get('p95_tool_response_ms'))} | {_ms(figures.get('wall_ms'))} | "
            f"{figures.get('sessions_per_s', '—')} | "
            f"{machine.get('before', '—')} → {machine.get('at_peak', '—')} | "
            f"{figures.get('containers_at_peak', '—')} | {figures['containers_left']} |"
        )
        errors += [f"{count} clients: {error}" for error in figures.get("errors", [])]
    lines.append("")
    if errors:
        lines += ["Errors seen by clients:", "", *(f"- `{error}`" for error in errors), ""]
    return "\n".join(lines)


POOL_TARGET_MS = 50.0
POOL_NAMES = {
    "pooled": "pooled (warm pool)",
    "fresh": "fresh container (`warm: 0`)",
    "docker_run_floor": "`docker run -i --rm` (floor)",
}
MOUNTS = {"no_mount": "no", "mount": "yes"}


def _pool_cases(pool: Json) -> list[tuple[str, str, Json]]:
    cold = pool.get("cold_start")
    if not isinstance(cold, dict) or "error" in cold:
        return []
    return [
        (service, mount, figures)
        for service, by_mount in cold.items()
        for mount, figures in by_mount.items()
    ]


def _pool_bar(pool: Json) -> tuple[str, str, str, str, str, str]:
    """The issue's target: pooled first response P95 ≤ 50 ms, every case."""
    cases = _pool_cases(pool)
    worst: dict[str, tuple[float, str]] = {}
    verdict: bool | None = None
    for service, mount, figures in cases:
        stats = figures.get("pooled")
        if not isinstance(stats, dict) or not measured(stats):
            verdict = False
            continue
        p95 = float(stats["p95_ms"])
        verdict = (verdict is not False) and p95 <= POOL_TARGET_MS
        if mount not in worst or p95 > worst[mount][0]:
            worst[mount] = (p95, service)
    if not worst:
        verdict = None
    together = pool.get("cold_start_all", {})
    hits = pool.get("pool_hits", {})
    parts = [
        f"{'with' if mount == 'mount' else 'without'} a mount: worst P95 {_ms(p95)} ms "
        f"({service}), all services {_ms(together.get(mount, {}).get('pooled', {}).get('p95_ms'))}"
        for mount, (p95, service) in sorted(worst.items(), reverse=True)
    ]
    reason = pool.get("error") or pool.get("cold_start", {}).get("error", "?")
    measured_text = "; ".join(parts) or f"not measured: {reason}"
    if hits:
        measured_text += f"; {hits.get('hits', 0)} pool hits, {hits.get('misses', 0)} misses"
    return (
        "Pooled first response P95 (connect + `initialize`), each bundled service",
        "—",
        "≤ 50 ms, with and without a mount (issue)",
        measured_text,
        "—",
        _met(verdict),
    )


def _pool(results: Json) -> str:
    pool = results.get("pool", {})
    config = pool.get("config", {})
    warm = config.get("warm_burst", {})
    lines = [
        "### 6. Warm pool: a pooled container against a fresh one",
        "",
        f"Pools: `warm: 1` for each service in the cold-start part; `warm: "
        f"{warm.get('time', '?')}` on `time` for the burst and the refills; max_containers "
        f"{config.get('max_containers', '?')}, parallel_starts "
        f"{config.get('parallel_starts', '?')}. Mounted: a small git repository "
        f"(`?mount=…:/workspace`, owner {config.get('project_owner', '?')}).",
        "",
    ]
    if "config" not in pool:  # not run
        reason = pool.get("cold_start", {}).get("error", "?")
        return "\n".join([*lines[:2], f"Not measured: {reason}", ""])
    if "error" in pool:
        lines += [f"Stopped by an error: {pool['error']}", ""]
    lines += _pool_cold(pool)
    lines += _pool_burst(pool.get("burst", {}))
    lines += _pool_refill(pool.get("refill", {}))
    lines += _pool_logs(pool)
    return "\n".join(lines)


def _problems(results: Json) -> str:
    problems = results.get("harness_problems", [])
    if not problems:
        return ""
    return "\n".join(["Harness problems in this run:", "", *(f"- {line}" for line in problems), ""])


def _pool_cold(pool: Json) -> list[str]:
    cases = _pool_cases(pool)
    lines = [
        "Cold start: connect → response to `initialize` over WebSocket (ms); each sample on a "
        "quiet engine, the pools full and their servers started. The first request after the "
        "handshake must see the mounted project.",
        "",
        "| Service | Mount | System | n | min | P50 | P95 | P99 | max | P95 95 % CI "
        "| First request P50 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for service, mount, figures in cases:
        for key, label in POOL_NAMES.items():
            stats = figures.get(key, {})
            first = figures.get("first_request", {}).get(key, {})
            extra = [_interval(stats.get("p95_ci_ms")), _ms(first.get("p50_ms"))]
            lines.append(
                _stats_row(f"{service} | {MOUNTS.get(mount, mount)} | {label}", stats, extra)
            )
    lines += [
        "",
        "| Service | Mount | Pooled minus fresh, P50 (ms) | Pooled minus fresh, P95 (ms) "
        "| Pooled minus floor, P95 (ms) | Pooled / fresh, P50 | Misses |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for service, mount, figures in cases:
        fresh, floor = figures.get("pooled_vs_fresh", {}), figures.get("pooled_vs_floor", {})
        lines.append(
            f"| {service} | {MOUNTS.get(mount, mount)} | "
            f"{_signed(fresh.get('difference_p50_ms'))}{_ci(fresh.get('difference_p50_ci_ms'))} | "
            f"{_signed(fresh.get('difference_p95_ms'))}{_ci(fresh.get('difference_p95_ci_ms'))} | "
            f"{_signed(floor.get('difference_p95_ms'))} | {_times(fresh.get('ratio_p50'))} | "
            f"{figures.get('pooled_misses', {}).get('n', '—')} |"
        )
    together = pool.get("cold_start_all", {})
    lines += [
        "",
        "All services together (ms):",
        "",
        "| Mount | System | n | min | P50 | P95 | P99 | max | P95 95 % CI |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mount in ("no_mount", "mount"):
        for key, label in POOL_NAMES.items():
            stats = together.get(mount, {}).get(key)
            if stats is None:
                continue
            extra = [_interval(stats.get("p95_ci_ms"))]
            lines.append(_stats_row(f"{MOUNTS[mount]} | {label}", stats, extra))
    lines.append("")
    connect = together.get("ws_connect", {})
    if measured(connect.get("pooled")):
        lines.append(
            f"- Of which the WebSocket connect, P50: pooled {_ms(connect['pooled']['p50_ms'])} ms,"
            f" fresh {_ms(connect.get('fresh', {}).get('p50_ms'))} ms."
        )
    hits = pool.get("pool_hits", {})
    if hits:
        lines.append(
            f"- Pooled samples: {hits.get('hits', 0)} pool hits, {hits.get('misses', 0)} misses "
            "(`reactor_fabric_pool_takes_total` moved by one `hit` for the sample, or not); a "
            "miss is not in the pooled figures."
        )
        for miss in hits.get("missed", [])[:5]:
            lines.append(
                f"  - miss: {miss.get('service')}, {miss.get('mount')}, run {miss.get('run')}: "
                f"takes {miss.get('takes')}, first response {_ms(miss.get('first_response_ms'))} ms"
            )
        for switch in hits.get("shape_switches", []):
            lines.append(
                f"- Switch to {switch.get('mount')} on {switch.get('service')} (one session, not "
                f"a sample): takes {switch.get('takes', switch.get('error'))}, first response "
                f"{_ms(switch.get('first_response_ms'))} ms."
            )
    lines.append("")
    return lines


def _pool_burst(burst: Json) -> list[str]:
    lines = [
        f"Burst: {burst.get('clients', '?')} clients at once on `time` (ms):",
        "",
        "| System | OK | Failed | Pool hits | Fresh starts | First response P50 / P95 / max "
        "| Of which pooled: P50 / max | Of which fresh: P50 / max "
        "| Tool answer P50 / P95 | Wall | Containers at peak | Left after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errors: list[str] = []
    for key, label in (
        ("pooled", f"pool of {burst.get('warm', '?')}"),
        ("fresh", "no pool (`warm: 0`)"),
    ):
        figures = burst.get(key)
        if not isinstance(figures, dict) or "ok" not in figures:
            reason = figures.get("error", "?") if isinstance(figures, dict) else "not run"
            lines.append(f"| {label} | not measured: {reason} | | | | | | | | | | |")
            continue
        hits, fresh = (
            figures.get("first_response_pooled", {}),
            figures.get("first_response_fresh", {}),
        )
        lines.append(
            f"| {label} | {figures['ok']} | {figures['failed']} | {figures.get('pool_hits', '—')}"
            f" | {figures.get('log_started_fresh', '—')} | "
            f"{_ms(figures['p50_first_response_ms'])} / {_ms(figures['p95_first_response_ms'])}"
            f" / {_ms(figures.get('max_first_response_ms'))} | "
            f"{_ms(hits.get('p50_ms'))} / {_ms(hits.get('max_ms'))} | "
            f"{_ms(fresh.get('p50_ms'))} / {_ms(fresh.get('max_ms'))} | "
            f"{_ms(figures.get('p50_tool_response_ms'))} / "
            f"{_ms(figures.get('p95_tool_response_ms'))} | {_ms(figures.get('wall_ms'))} | "
            f"{figures.get('containers_at_peak', '—')} | {figures['containers_left']} |"
        )
        errors += [f"{label}: {error}" for error in figures.get("errors", [])]
    lines += [
        "",
        "Pool hits: `reactor_fabric_pool_takes_total` over the burst; fresh starts: "
        "`container_started` with `pooled: false` in the log; which client got which: its "
        "port, the peer of its session in the audit trail. Containers at peak and left after: "
        "the orchestrator's containers less its ready pooled ones (a refill still starting "
        "counts).",
        "",
    ]
    if errors:
        lines += ["Errors seen by clients:", "", *(f"- `{error}`" for error in errors), ""]
    return lines


def _pool_refill(refill: Json) -> list[str]:
    lines = [
        "Refills and a live session: `tools/call get_current_time` one at a time on an "
        f"established `{refill.get('service', 'time')}` session, while "
        f"{refill.get('parallel_starts', '?')} refills are under way all the time "
        "(`refilling`) and with none (`quiet`); interleaved call by call with the same call "
        "on a container of the same image spoken to directly over its own socket, as the "
        "orchestrator speaks to its containers, no orchestrator on its path (the floor), so "
        "that what the refills do to the machine and what they do to the "
        "orchestrator can be told apart (ms):",
        "",
    ]
    if "error" in refill:
        return [*lines, f"Not measured: {refill['error']}", ""]
    lines += [
        "| Phase | n | min | P50 | P95 | P99 | max | P50 by repeat | P99 by repeat "
        "| Refills ready / finished | Orchestrator CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in ("quiet", "refilling"):
        stats = refill.get(phase, {})
        spreads = stats.get("repeats", {}) if isinstance(stats, dict) else {}
        ready = refill.get("refills_ready_by_phase", {}).get(phase, {})
        booted = refill.get("refills_booted_by_phase", {}).get(phase, {})
        cpu = refill.get("orchestrator_cpu_percent_by_phase", {}).get(phase, {})
        extra = [
            _range(spreads.get("p50_ms")),
            _range(spreads.get("p99_ms")),
            f"{_count(ready)} / {_count(booted)}",
            f"{_range(cpu)} %",
        ]
        lines.append(_stats_row(phase, stats, extra))
    for phase in ("quiet", "refilling"):
        stats = refill.get("direct", {}).get(phase)
        if stats is None:
            continue
        spreads = stats.get("repeats", {}) if isinstance(stats, dict) else {}
        extra = [_range(spreads.get("p50_ms")), _range(spreads.get("p99_ms")), "", ""]
        lines.append(_stats_row(f"{phase}, direct socket (floor)", stats, extra))
    lines += [""]
    overhead = refill.get("overhead")
    if overhead:
        lines += [
            "- The orchestrator's overhead (ours minus the direct socket, "
            "interleaved call by call, repeat by repeat) quiet: P50 "
            f"{_range(overhead.get('quiet', {}).get('p50_ms'), signed=True)}, P99 "
            f"{_range(overhead.get('quiet', {}).get('p99_ms'), signed=True)} ms; refilling: P50 "
            f"{_range(overhead.get('refilling', {}).get('p50_ms'), signed=True)}, P99 "
            f"{_range(overhead.get('refilling', {}).get('p99_ms'), signed=True)} ms. Refilling "
            "minus quiet: P50 "
            f"{_range(refill.get('overhead_difference_p50_ms'), signed=True)}, P99 "
            f"{_range(refill.get('overhead_difference_p99_ms'), signed=True)} ms.",
            "- What the refills did to the floor itself (no orchestrator on its path), refilling "
            "minus quiet: P50 "
            f"{_range(refill.get('direct_difference_p50_ms'), signed=True)}, P99 "
            f"{_range(refill.get('direct_difference_p99_ms'), signed=True)} ms.",
        ]
    lines += [
        f"- Refilling / quiet, P50, repeat by repeat: {_range(refill.get('ratio_p50'))} "
        "(median [min, max]).",
        f"- Refilling minus quiet, repeat by repeat: P50 "
        f"{_range(refill.get('difference_p50_ms'), signed=True)} ms, P99 "
        f"{_range(refill.get('difference_p99_ms'), signed=True)} ms; all calls together: P50 "
        f"{_signed(refill.get('difference_p50_all_ms'))} ms"
        f"{_ci(refill.get('difference_p50_ci_ms'))}, P95 "
        f"{_signed(refill.get('difference_p95_all_ms'))} ms"
        f"{_ci(refill.get('difference_p95_ci_ms'))}.",
        f"- Pooled containers taken per `refilling` phase (sessions held to the phase's end): "
        f"{_count(refill.get('takes_by_phase', {}).get('refilling', {}))}; pool takes by "
        f"outcome: {refill.get('pool_takes', {})}.",
    ]
    if refill.get("take_errors"):
        lines.append(f"- Errors of the taking sessions: {refill['take_errors']}.")
    traced = refill.get("residency")
    if isinstance(traced, dict) and "error" in traced:
        lines.append(
            f"- The orchestrator's residency per message: not measured: {traced['error']}."
        )
    elif isinstance(traced, dict):
        change = refill.get("residency_difference", {})
        lines.append(
            "- The orchestrator's residency per message on the live session (µs, from its "
            "syscalls: client frame read → line written to the container, the container's "
            "line read → frame written to the client; median [min, max] of the repeats): "
            + "; ".join(
                f"{phase}: {_by_path(traced.get(phase, {}), between=', ')}, messages that "
                f"waited on a lock (the GIL) per repeat: request "
                f"{_range(traced.get(phase, {}).get('request_lock_waits'))}, answer "
                f"{_range(traced.get(phase, {}).get('answer_lock_waits'))}"
                for phase in ("quiet", "refilling")
            )
            + f". Refilling minus quiet, repeat by repeat: {_by_path(change, signed=True)}."
        )
        if "answer_own_p99_us" in change:
            lines.append(
                "- Of that residency, the orchestrator's own time (less the time its thread "
                "was ready to run while another process had the CPU; from its context "
                "switches, same recording): "
                + "; ".join(
                    f"{phase}: {_by_path(traced.get(phase, {}), 'own', between=', ')}, "
                    "messages that waited for a CPU per repeat: request "
                    f"{_range(traced.get(phase, {}).get('request_cpu_waits'))}, answer "
                    f"{_range(traced.get(phase, {}).get('answer_cpu_waits'))} (who had it: "
                    f"{_who(traced.get(phase, {}))})"
                    for phase in ("quiet", "refilling")
                )
                + ". Refilling minus quiet, repeat by repeat: "
                f"{_by_path(change, 'own', signed=True)}." + _on_cpu_phrase(traced, change)
            )
        if "answer_wake_p99_us" in change:
            lines.append(
                "- Before each message, outside its residency: the event loop's wait for a CPU "
                "from its wake-up (asleep until the message came) to its return to a CPU "
                "(µs, machine-wide wake-ups in the same run): "
                + "; ".join(
                    f"{phase}: {_by_path(traced.get(phase, {}), 'wake', between=', ')}"
                    for phase in ("quiet", "refilling")
                )
                + ". Refilling minus quiet, repeat by repeat: "
                f"{_by_path(change, 'wake', signed=True)}."
            )
    lines.append("")
    return lines


def _by_path(figures: Any, part: str = "", *, signed: bool = False, between: str = "; ") -> str:
    """``request P50 …, P99 …; answer P50 …, P99 …`` of a residency summary or difference
    (``part``: "", "own", "on_cpu", "wake"; see bench/residency.py)."""
    found = figures if isinstance(figures, dict) else {}
    return between.join(
        f"{path} P50 {_range(found.get(figure_name(path, part, 'p50')), signed=signed)}, "
        f"P99 {_range(found.get(figure_name(path, part, 'p99')), signed=signed)}"
        for path in ("request", "answer")
    )


def _on_cpu_phrase(traced: Json, change: Json) -> str:
    """Of the own time, the part on a CPU, and how many messages were off it for a reason of
    the orchestrator's own (a lock, a thread of its own)."""
    if "answer_on_cpu_p99_us" not in change:
        return ""
    return (
        " Of the own time, on a CPU, refilling minus quiet: "
        f"{_by_path(change, 'on_cpu', signed=True)}; messages off their CPU "
        "for a reason of the orchestrator's own (a lock, a thread of its own) per repeat: "
        + "; ".join(
            f"{phase} request {_range(traced.get(phase, {}).get('request_own_waits'))}, "
            f"answer {_range(traced.get(phase, {}).get('answer_own_waits'))}"
            for phase in ("quiet", "refilling")
        )
        + "."
    )


def _who(figures: Any) -> str:
    """The processes that had the CPU a message waited for, over both paths, most first."""
    if not isinstance(figures, dict):
        return "—"
    who: dict[str, int] = {}
    for path in ("request", "answer"):
        for comm, times in (figures.get(f"{path}_preemptors") or {}).items():
            who[comm] = who.get(comm, 0) + times
    if not who:
        return "none"
    ranked = sorted(who.items(), key=lambda item: -item[1])[:4]
    return ", ".join(f"`{comm}` {times}" for comm, times in ranked)


def _count(figure: Any) -> str:
    """A spread of counts: ``median [min, max]``."""
    if not isinstance(figure, dict) or "median" not in figure:
        return "—"
    if figure.get("n", 1) == 1:
        return f"{figure['median']:g}"
    return f"{figure['median']:g} [{figure['min']:g}, {figure['max']:g}]"


def _pool_logs(pool: Json) -> list[str]:
    logs = pool.get("log", {})
    if not logs:
        return []
    lines = ["The orchestrators' logs:", ""]
    for name, summary in logs.items():
        started = summary.get("container_started", {})
        starts = ", ".join(
            f"{service} {counts.get('pooled', 0)} pooled / {counts.get('fresh', 0)} fresh"
            for service, counts in started.items()
        )
        problems = summary.get("warnings_and_errors") or {}
        lines.append(
            f"- `{name}`: container starts {starts or 'none'}; pooled containers made ready "
            f"{summary.get('pooled_container_ready', 0)}, removed unused "
            f"{summary.get('pooled_container_removed') or {}}; warnings and errors "
            f"{problems or 'none'}."
        )
    lines.append("")
    return lines


LIFECYCLE_NAMES = {
    "reused": ("`reuse_per_session`, its container warm", "`/mcp`"),
    "fresh_pooled": ("`fresh_per_call`, `warm: 1` (greeted)", "`/mcp`"),
    "fresh_unpooled": ("`fresh_per_call`, `warm: 0`", "`/mcp`"),
    "relay_reused": ("`reuse_per_session`, its container warm", "`/mcp/time`"),
    "relay_fresh_pooled": ("`fresh_per_call`, `warm: 1`", "`/mcp/time-relay-fresh`"),
    "docker_run_per_call": ("`docker run -i --rm` per call: spawn → call answered", "—"),
    "direct_first_call": ("a fresh server's first call, no orchestrator (greeted before)", "—"),
}
LIFECYCLE_PAIRS = {
    "fabric_pooled": "`/mcp`, with the pool",
    "fabric_unpooled": "`/mcp`, without a pool",
    "relay_pooled": "relay, with the pool",
    "fabric_pooled_over_first_call": "`/mcp` with the pool minus a fresh server's first call",
}
LIFECYCLE_RATIOS = {
    "docker_run_over_fresh_pooled": "`docker run` per call / fresh with the pool (`/mcp`)",
    "docker_run_over_relay_fresh_pooled": "`docker run` per call / fresh with the pool (relay)",
    "fresh_unpooled_over_fresh_pooled": "fresh without a pool / with the pool (`/mcp`)",
}


def _lifecycle_bar(lifecycles: Json) -> tuple[str, str, str, str, str, str]:
    """The issue's targets: with the pool, P95 of (fresh - reused) ≤ 30 ms, and a `docker run`
    per call ≥ 20x a pooled fresh call (of P50s), in the same run."""
    targets = lifecycles.get("targets", {})
    added, times = targets.get("added_p95_ms"), targets.get("ratio")
    verdict: bool | None = None
    if added is not None and times is not None:
        verdict = bool(targets.get("added_met") and targets.get("ratio_met"))
    reason = lifecycles.get("error") or lifecycles.get("systems", {}).get("reused", {}).get("error")
    measured_text = (
        f"+{_ms(added)} ms; {_times(times)}"
        if verdict is not None
        else f"not measured: {reason or '?'}"
    )
    return (
        "`fresh_per_call` with the pool: P95 of (fresh - reused call), paired; `docker run` "
        "per call ÷ fresh call (P50)",
        "—",
        "≤ 30 ms; ≥ 20x (issue)",
        measured_text,
        "—",
        _met(verdict),
    )


def _lifecycles(results: Json) -> str:
    lifecycles = results.get("lifecycles", {})
    config = lifecycles.get("config", {})
    lines = [
        "### 7. Container lifecycles: one call in a fresh container, with the pool and without",
        "",
    ]
    if "config" not in lifecycles:  # not run
        reason = lifecycles.get("systems", {}).get("reused", {}).get("error", "?")
        return "\n".join([*lines, f"Not measured: {reason}", ""])
    lines += [
        f"`tools/call get_current_time` (ms), {config.get('repeats', '?')} repeats of "
        f"{config.get('rounds_per_repeat', '?')} rounds, each system once per round in a "
        "rotating order, each sample on a quiet engine. Services: copies of `time` "
        + ", ".join(
            f"`{name}` (`{figures.get('container_strategy')}`, `warm: {figures.get('warm')}`)"
            for name, figures in config.get("services", {}).items()
        )
        + "; `time` itself reused.",
        "",
    ]
    if "error" in lifecycles:
        lines += [f"Stopped by an error: {lifecycles['error']}", ""]
    systems = lifecycles.get("systems", {})
    lines += [
        f"| System | Endpoint | {STATS_HEAD[2:]} P50 of repeats |",
        f"|---|---{STATS_RULE}---:|",
    ]
    for key, (label, endpoint) in LIFECYCLE_NAMES.items():
        figures = systems.get(key, {})
        extra = [_range(figures.get("repeats", {}).get("p50_ms"))] if measured(figures) else []
        lines.append(_stats_row(f"{label} | {endpoint}", figures, extra))
    lines += [
        "",
        "Added latency of a fresh container: fresh minus reused call, paired by round (ms):",
        "",
        "| Endpoint | n | P50 | P95 | max | P95 of repeats | unpaired: P95 - P95 (95 % CI) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, label in LIFECYCLE_PAIRS.items():
        added = lifecycles.get("added", {}).get(key, {})
        if not measured(added):
            lines.append(f"| {label} | not measured | | | | | |")
            continue
        unpaired = added.get("unpaired", {})
        lines.append(
            f"| {label} | {added['n']} | {_signed(added['p50_ms'])} | "
            f"{_signed(added['p95_ms'])} | {_signed(added['max_ms'])} | "
            f"{_range(added.get('repeats', {}).get('p95_ms'), signed=True)} | "
            f"{_signed(unpaired.get('difference_p95_ms'))}"
            f"{_ci(unpaired.get('difference_p95_ci_ms'))} |"
        )
    lines += [
        "",
        "| Ratio | of P50s | of P95s | of P50s, repeat by repeat |",
        "|---|---:|---:|---:|",
    ]
    for key, label in LIFECYCLE_RATIOS.items():
        figures = lifecycles.get("ratios", {}).get(key, {})
        lines.append(
            f"| {label} | {_times(figures.get('ratio_p50'))} | "
            f"{_times(figures.get('ratio_p95'))} | "
            f"{_range(figures.get('ratio_p50_repeats'))} |"
        )
    targets = lifecycles.get("targets", {})
    exit_ = lifecycles.get("docker_run_exit", {})
    misses = lifecycles.get("misses", {})
    lines += [
        "",
        f"- Targets (issue): P95 of the added latency with the pool on `/mcp` "
        f"{_signed(targets.get('added_p95_ms'))} ms against ≤ 30 ms: "
        f"{_met(targets.get('added_met'))}; `docker run` per call ÷ fresh with the pool "
        f"{_times(targets.get('ratio'))} against ≥ 20x: {_met(targets.get('ratio_met'))}.",
        f"- `docker run` per call until the process exited (container removed): P50 "
        f"{_ms(exit_.get('p50_ms'))} ms, P95 {_ms(exit_.get('p95_ms'))} ms.",
        f"- Of a pooled fresh call on `/mcp`, from the call's arrival to its container handed "
        f"out (the log's moments, ms resolution): P50 "
        f"{_ms(lifecycles.get('fresh_pooled_handed_out', {}).get('p50_ms'))} ms, P95 "
        f"{_ms(lifecycles.get('fresh_pooled_handed_out', {}).get('p95_ms'))} ms.",
        f"- Pooled calls not served by a (greeted) pooled container, left out: "
        f"{misses.get('count', 0)}.",
        "",
    ]
    return "\n".join(lines)
