"""Reactor-Fabric benchmarks on the real Docker engine, side by side with floors and peers.

Usage::

    .venv/bin/python scripts/bench.py [--smoke] [--only SECTIONS] [--pool-parts PARTS]
                                      [--lifecycle-rounds N] [--out FILE] [--doc FILE]

Measures (definitions in docs/BENCHMARKS.md): cold start against ``docker run -i --rm``; the
round trip of a small ``tools/call`` on a warm container directly (no relay), through
Reactor-Fabric (WebSocket, and Streamable HTTP once it exists), supergateway and mcp-proxy,
interleaved; throughput through one session; orchestrator and container memory; bursts of
concurrent clients; the warm pool (a pooled container's first response against a fresh one's
and the floor's, every bundled service with and without a mount; a burst with a pool; refills
next to a live session); container lifecycles (a call in a fresh container per call, with the
pool and without, against a reused container and a ``docker run -i --rm`` per call). Parts 1 to
5 run on an orchestrator without a pool. Writes
``bench/results.json`` and regenerates the generated part of ``docs/BENCHMARKS.md``.

``--smoke`` runs every part with tiny counts and no peers (about a minute), writes
``bench/tmp/results-smoke.json`` and leaves the docs alone: it exists so the harness cannot rot.
``--only pool --pool-parts refill`` runs one part of the warm pool's section (here the refills
next to a live session, about 70 seconds) for a trial of a change; ``--only lifecycles
--lifecycle-rounds 2`` the container lifecycles with 2 rounds per repeat (10 samples of each
system, a few minutes). The exit status is non-zero
only when the harness itself could not measure one of our own systems (never because a figure
is slow).

Every container started here is removed in ``finally`` blocks: the floors' and peers' carry
``reactor-fabric.bench=1``, the orchestrator's carry its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import gc
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

import trio
import yaml
from bench.mcp import (
    FAILURES,
    HttpRpc,
    ProtocolError,
    Rpc,
    StreamRpc,
    WebSocketStream,
    check_result,
    encode_request,
    free_port,
    handshake,
    initialize_params,
    rss_kib,
    unwrapped,
    wait_for_port,
    websocket_session,
)
from bench.stats import (
    Json,
    bootstrap,
    burst,
    difference,
    measured,
    paired_rates,
    ratio,
    spread,
    summarize,
)

from bench import engine, lifecycles, report, residency

REPO = engine.REPO
TMP = REPO / "bench" / "tmp"
SUITE = REPO / "claude-mcp-suite.yaml"
COLD_SERVICE = "time"
# The call every system answers in the round-trip figures: small, and the same everywhere.
TOOL = {"name": "get_current_time", "arguments": {"timezone": "UTC"}}
THROUGHPUT_SERVICE = "everything"
PIPELINE_DEPTH = 16
THROUGHPUT_WARM_UP_CALLS = 2 * PIPELINE_DEPTH
RELAY_SYSTEMS = (
    "direct_socket",
    "direct",
    "docker_run_pipe",
    "reactor_fabric_ws",
    "reactor_fabric_http",
    "reactor_fabric_fabric_ws",
    "reactor_fabric_fabric_http",
    "supergateway",
    "mcp_proxy",
)
# The floor each relay is judged against: the same path with the relay taken out. Ours talks to
# the container over the container's own socket (fabric-stdio: no engine process on the path);
# the peers wrap a `docker run -i` process and pay its hops (a CLI process, a pipe, the engine)
# themselves. The Docker attach is measured too (our path until socket stdio), as a reference.
FLOOR_OF = {
    "reactor_fabric_ws": "direct_socket",
    "reactor_fabric_http": "direct_socket",
    "reactor_fabric_fabric_ws": "direct_socket",
    "reactor_fabric_fabric_http": "direct_socket",
    "supergateway": "docker_run_pipe",
    "mcp_proxy": "docker_run_pipe",
}
PEERS = ("supergateway", "mcp_proxy")
# Systems whose failure to be measured is a failure of the harness (or the product).
# The fabric endpoint (`/mcp`, an MCP server of our own over the whole suite): the same call
# under its namespaced name, each message decoded and routed, next to the relay's.
FABRIC = ("reactor_fabric_fabric_ws", "reactor_fabric_fabric_http")
# Each fabric system against the relay on the same transport (target: at most 1.5 times).
RELAY_OF = {"reactor_fabric_fabric_ws": "reactor_fabric_ws",
            "reactor_fabric_fabric_http": "reactor_fabric_http"}  # fmt: skip
FABRIC_BAR = 1.5
OURS = ("direct_socket", "direct", "docker_run_pipe", "reactor_fabric_ws", "reactor_fabric_http",
        *FABRIC)  # fmt: skip
RELAYED = ("reactor_fabric_ws", "reactor_fabric_http", *FABRIC)
# `docker stats` answers without the expected fields, besides what a session can do.
STATS_FAILURES: tuple[type[BaseException], ...] = (*FAILURES, KeyError, IndexError)
CALL_BOUND = 30.0
SESSION_BOUND = 180.0
BURST_SECONDS_PER_CLIENT = 3.0  # a burst's clients wait at least this long per client
BURST_POOL_WARM = 16  # the concurrency part's warm pool of `time` (POOL_MAX_CONTAINERS)
# Options the orchestrator gives every container of the `time` service (see _docker.py and
# the suite): the second cold-start floor uses the same, to tell config cost from relay cost.
SAME_LIMITS = [
    "--network", "none", "--init", "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges:true",
    "--memory", "512m", "--memory-swap", "512m", "--cpus", "1", "--pids-limit", "256",
]  # fmt: skip


# The warm pool part: `time` keeps a pool big enough for the burst, every other service one.
POOL_SERVICE = "time"
POOL_MAX_CONTAINERS = 16
POOL_PARALLEL_STARTS = 2
POOL_TARGET_MS = 50.0  # the issue's target: pooled first response P95, connect included
POOL_SYSTEMS = ("pooled", "fresh", "docker_run_floor")
POOL_QUIET_BOUND = 120.0
POOL_QUIET_FAILURES = 3  # times the engine did not get quiet before the pool part gives up
# The pool calls a container ready once it has started; its server (Python's imports, Node's)
# may still be starting then, for 0.5 to 2 s here. A sample waits until no container of the
# pool's orchestrator used more than POOL_IDLE_CPU_NS of CPU over POOL_IDLE_SECONDS (cgroup
# accounting), or, where that cannot be read, until POOL_BOOT_SECONDS after the last ready.
POOL_IDLE_CPU_NS = 1_000_000
POOL_IDLE_SECONDS = 0.2
POOL_BOOT_SECONDS = 3.0
POOL_PROJECT = TMP / "pool-project"
POOL_MARKER = "bench-marker.txt"  # untracked in the project: git status and a listing show it
# The owner of the mounted project when the harness runs as root: an ordinary user, as a
# user's project would be (the orchestrator runs a server as the owner of its first mount).
POOL_PROJECT_OWNER = (1000, 1000)
# The parts of the pool section, in the order they run (--pool-parts picks some).
POOL_PARTS = ("cold_start", "burst", "refill")


STARTUP_SYSTEMS = ("no_pool", "warm_pool")
SECTIONS = (
    "cold_start",
    "relay_rtt",
    "throughput",
    "memory",
    "concurrency",
    "pool",
    "lifecycles",
    "startup",
)


@dataclass(frozen=True)
class Plan:
    smoke: bool
    cold_runs: int
    rtt_warmup: int
    rtt_calls: int  # per repeat
    throughput_messages: dict[str, int]  # per repeat
    memory_sessions: tuple[int, ...]
    bursts: tuple[int, ...]
    peers: bool
    repeats: int  # of the round trip and throughput figures, judged on their medians
    # The warm pool part. Cold start: (service, mounted) cases, () = every bundled service with
    # and without a mount; runs of each system per case. Burst: clients, `time`'s pool.
    # Refill: calls per phase, repeats of the two phases.
    pool_cases: tuple[tuple[str, bool], ...]
    pool_runs: int
    pool_burst: int
    pool_burst_warm: int
    pool_refill_calls: int
    pool_refill_repeats: int
    # The lifecycles part: repeats, rounds per repeat (each calls every system once).
    lifecycle_repeats: int
    lifecycle_rounds: int
    startup_runs: int  # of each system (with a warm pool and without)
    pool_parts: tuple[str, ...] = POOL_PARTS
    sections: tuple[str, ...] = SECTIONS


FULL = Plan(
    smoke=False,
    cold_runs=30,
    rtt_warmup=100,
    rtt_calls=600,
    throughput_messages={"small": 1500, "payload_4k": 1000, "payload_1m": 24},
    memory_sessions=(100, 200),
    bursts=(10, 50, 100, 200),
    peers=True,
    repeats=5,
    pool_cases=(),
    pool_runs=7,
    pool_burst=50,
    pool_burst_warm=10,
    pool_refill_calls=600,
    pool_refill_repeats=6,
    lifecycle_repeats=5,
    lifecycle_rounds=6,
    startup_runs=7,
)
SMOKE = Plan(
    smoke=True,
    cold_runs=2,
    rtt_warmup=3,
    rtt_calls=20,
    throughput_messages={"small": 64, "payload_4k": 32, "payload_1m": 4},
    memory_sessions=(2,),
    bursts=(2,),
    peers=False,
    repeats=2,
    pool_cases=(("filesystem", True),),
    pool_runs=1,
    pool_burst=2,
    pool_burst_warm=1,
    pool_refill_calls=10,
    pool_refill_repeats=1,
    lifecycle_repeats=1,
    lifecycle_rounds=1,
    startup_runs=1,
)
PAYLOADS = {"small": 16, "payload_4k": 4096, "payload_1m": 1024 * 1024}


def tool_of(system: str, tool: Json, service: str) -> Json:
    """The call ``system`` is asked: on the fabric endpoint, the tool under its shown name."""
    if system in FABRIC:
        return {**tool, "name": f"{service}__{tool['name']}"}
    return tool


def say(text: str) -> None:
    print(f"bench: {text}", flush=True)


R = TypeVar("R", bound=Rpc)


@contextlib.asynccontextmanager
async def initialized(session: contextlib.AbstractAsyncContextManager[R]) -> AsyncIterator[R]:
    """A session after the MCP handshake (bounded), for the duration of the block."""
    async with session as rpc:
        with trio.fail_after(SESSION_BOUND):
            await handshake(rpc)
        yield rpc


@contextlib.asynccontextmanager
async def http_session(
    port: int, path: str, headers: dict[str, str] | None = None
) -> AsyncIterator[HttpRpc]:
    rpc = HttpRpc("127.0.0.1", port, path, headers)
    try:
        yield rpc
    finally:
        with trio.CancelScope(shield=True):
            await rpc.aclose()


class Harness:
    """One run: the orchestrator under test, the plan, what went wrong, the side logs."""

    def __init__(self, plan: Plan, orchestrator: engine.Orchestrator, side_log: IO[bytes]):
        self.plan = plan
        self.orch = orchestrator
        self.side_log = side_log
        self.problems: list[str] = []
        self.diagnostics: Json = {}
        # Per throughput run: the extra connections of each HTTP system's session.
        self.http_pools: dict[str, list[HttpRpc]] = {}
        self.pool_not_quiet = 0  # times the pool part waited for a quiet engine in vain

    def problem(self, where: str, exc: BaseException) -> Json:
        """Record that the harness could not measure one of our own figures."""
        text = f"{type(exc).__name__}: {exc}"
        self.problems.append(f"{where}: {text}")
        say(f"ERROR in {where}: {text}")
        traceback.print_exception(exc, file=sys.stderr)
        return {"error": text}

    def ws(self, service: str) -> contextlib.AbstractAsyncContextManager[StreamRpc]:
        """A WebSocket session on ``service`` (git and filesystem get the scratch workspace)."""
        query = ""
        if service in ("git", "filesystem"):
            query = "mount=" + urllib.parse.quote(f"{TMP / 'workspace'}:/workspace", safe="")
        return websocket_session(self.orch.ws_url(service, query), subprotocols=["mcp"])

    def fabric_sessions(
        self, service: str
    ) -> list[tuple[str, contextlib.AbstractAsyncContextManager[Rpc]]]:
        """The fabric endpoint's two systems (every tool shown: ``?tools=all``; the service's
        container starts on the warm-up's first call)."""
        return [
            (
                "reactor_fabric_fabric_ws",
                initialized(
                    websocket_session(self.orch.fabric_ws_url("tools=all"), subprotocols=["mcp"])
                ),
            ),
            (
                "reactor_fabric_fabric_http",
                initialized(http_session(self.orch.port, "/mcp?tools=all", self.orch.auth_headers)),
            ),
        ]

    async def settle(self, bound: float = 60.0) -> None:
        """Wait until the orchestrator has removed every container of ours."""
        left = await self.orch.wait_for_containers(0, bound=bound)
        if left:
            say(f"warning: {left} container(s) still present after {bound:g} s")

    # --- 1. cold start --------------------------------------------------------------------

    async def cold_start(self) -> Json:
        image = service_image(COLD_SERVICE)
        floors = {
            "docker_run_floor": engine.docker_run_argv(image),
            "docker_run_same_limits": engine.docker_run_argv(image, *SAME_LIMITS),
        }
        names = ["reactor_fabric", *floors]
        samples: dict[str, list[int]] = {name: [] for name in names}
        tool_samples: dict[str, list[int]] = {name: [] for name in names}
        connect: list[int] = []
        out: Json = {}
        await self.settle()
        for run in range(self.plan.cold_runs):
            # One of each per run (A B C A B C …), each on an engine with nothing else of ours.
            if "reactor_fabric" not in out:
                try:
                    # From before the connect: a client pays for it (the floor pays for its
                    # process start the same way).
                    begin = time.perf_counter_ns()
                    async with self.ws(COLD_SERVICE) as rpc:
                        connect.append(time.perf_counter_ns() - begin)
                        with trio.fail_after(SESSION_BOUND):
                            await handshake(rpc)
                            samples["reactor_fabric"].append(time.perf_counter_ns() - begin)
                            tool_ns, answer = await rpc.call("tools/call", TOOL)
                        check_result(answer, "tools/call")
                    tool_samples["reactor_fabric"].append(tool_ns)
                except FAILURES as exc:
                    out["reactor_fabric"] = self.problem("cold_start.reactor_fabric", exc)
                await self.settle()
            for name, argv in floors.items():
                if name in out:
                    continue
                try:
                    floor = await self._floor_sample(argv, COLD_SERVICE)
                    samples[name].append(floor.first)
                    tool_samples[name].append(floor.request)
                except FAILURES as exc:
                    out[name] = self.problem(f"cold_start.{name}", exc)
            say(f"cold start {run + 1}/{self.plan.cold_runs}")
        for name, values in samples.items():
            out.setdefault(name, with_intervals(values))
        out["first_tool_call"] = {name: summarize(values) for name, values in tool_samples.items()}
        out["reactor_fabric_ws_connect"] = summarize(connect)
        out["comparison"] = compare(samples, "reactor_fabric", "docker_run_floor")
        out["comparison_same_limits"] = compare(samples, "reactor_fabric", "docker_run_same_limits")
        return out

    # --- 2. relay round trip --------------------------------------------------------------

    async def relay_rtt(self) -> Json:
        image = service_image(COLD_SERVICE)
        pipe_argv = engine.docker_run_argv(image, "--network", "none")
        candidates: list[tuple[str, contextlib.AbstractAsyncContextManager[Rpc]]] = [
            ("direct_socket", initialized(engine.socket_stdio(image))),
            ("direct", initialized(engine.attached(image))),
            ("docker_run_pipe", initialized(engine.piped(pipe_argv, self.side_log))),
            ("reactor_fabric_ws", initialized(self.ws(COLD_SERVICE))),
            (
                "reactor_fabric_http",
                initialized(http_session(self.orch.port, "/mcp/time", self.orch.auth_headers)),
            ),
            *self.fabric_sessions(COLD_SERVICE),
        ]
        out: Json = {}
        if self.plan.peers:
            candidates += [
                ("supergateway", self._supergateway(image)),
                ("mcp_proxy", self._mcp_proxy(image)),
            ]
        else:
            out["supergateway"] = {"error": "peers are skipped in smoke mode"}
            out["mcp_proxy"] = {"error": "peers are skipped in smoke mode"}
        repeats: list[dict[str, list[int]]] = []
        async with contextlib.AsyncExitStack() as stack:
            systems = await self._start_systems(stack, candidates, out, "relay_rtt")
            say(f"relay round trips: {', '.join(systems)}: warm-up {self.plan.rtt_warmup} rounds")
            await self._interleave(systems, out, self.plan.rtt_warmup)
            for repeat in range(self.plan.repeats):
                repeats.append(await self._interleave(systems, out, self.plan.rtt_calls))
                say(f"  repeat {repeat + 1}/{self.plan.repeats} done")
            ours = {
                name: rpc for name, rpc in systems.items() if name in RELAYED and name not in out
            }
            self.diagnostics["orchestrator_cpu_us_per_call"] = await self._cpu_per_call(ours)
            out["residency"] = await self._relay_residency(ours)
            say("relay round trips done; closing the systems")
        await trio.to_thread.run_sync(engine.remove_bench_containers)
        for name in RELAY_SYSTEMS:
            if name in out:
                continue
            pooled = [ns for samples in repeats for ns in samples.get(name, [])]
            figures = summarize(pooled)
            figures["repeats"] = {
                key: spread([summarize(r[name]).get(key) for r in repeats if r.get(name)])
                for key in ("p50_ms", "p99_ms")
            }
            out[name] = figures
        out["per_repeat"] = [
            {name: summarize(samples) for name, samples in r.items() if samples} for r in repeats
        ]
        return out

    async def _start_systems(
        self,
        stack: contextlib.AsyncExitStack,
        candidates: list[tuple[str, contextlib.AbstractAsyncContextManager[Rpc]]],
        out: Json,
        section: str,
    ) -> dict[str, Rpc]:
        systems: dict[str, Rpc] = {}
        for name, session in candidates:
            say(f"starting {name}")
            try:
                systems[name] = await stack.enter_async_context(session)
            except Exception as exc:  # noqa: BLE001 -- a peer can fail in any way
                if name in OURS:
                    out[name] = self.problem(f"{section}.{name}", exc)
                else:  # a peer may fail to install or start in any way: keep going
                    out[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                    say(f"{name} could not be measured: {out[name]['error']}")
        return systems

    async def _interleave(
        self, systems: dict[str, Rpc], out: Json, rounds: int
    ) -> dict[str, list[int]]:
        """``rounds`` rounds; each calls every system once, in an order rotating each round."""
        names = list(systems)
        samples: dict[str, list[int]] = {name: [] for name in names}
        gc.collect()
        gc.disable()
        try:
            for index in range(rounds):
                live = [name for name in names if name not in out]
                shift = index % len(live) if live else 0
                for name in live[shift:] + live[:shift]:
                    try:
                        elapsed = await timed_tool_call(
                            systems[name],
                            f"{name} tools/call",
                            tool_of(name, TOOL, COLD_SERVICE),
                        )
                    except FAILURES as exc:
                        if name in OURS:
                            out[name] = self.problem(f"relay_rtt.{name}", exc)
                        else:
                            out[name] = {"error": f"failed after {index} rounds: {exc}"}
                        continue
                    samples[name].append(elapsed)
        finally:
            gc.enable()
        return samples

    async def _relay_residency(self, systems: dict[str, Rpc]) -> Json:
        """How long a message stays in the orchestrator (see bench/residency.py): per repeat
        and system, ``rtt_calls`` calls on that system alone, one in flight, traced."""
        why = await trio.to_thread.run_sync(residency.unavailable)
        if why is not None:
            say(f"residency not measured: {why}")
            return {"error": why}
        per_repeat: list[dict[str, Json]] = []
        for repeat in range(self.plan.repeats):
            figures: dict[str, Json] = {}
            for name, rpc in systems.items():
                try:
                    async with residency.traced(self.orch.pid) as trace:
                        await self._timed_calls(
                            rpc, self.plan.rtt_calls, tool_of(name, TOOL, COLD_SERVICE)
                        )
                except FAILURES as exc:
                    figures[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    continue
                figures[name] = trace.figures
            per_repeat.append(figures)
            say(f"  residency {repeat + 1}/{self.plan.repeats}: {figures}")
        return residency.summary(per_repeat)

    async def _cpu_per_call(self, systems: dict[str, Rpc]) -> Json:
        """Orchestrator CPU time (user + system, all threads) per relayed call, one system
        at a time (the interleaved run cannot tell them apart)."""
        calls = max(20, self.plan.rtt_calls // 4)
        out: Json = {}
        for name, rpc in systems.items():
            before = engine.cpu_seconds(self.orch.pid)
            try:
                with trio.fail_after(CALL_BOUND + calls):
                    tool = tool_of(name, TOOL, COLD_SERVICE)
                    for _ in range(calls):
                        check_result((await rpc.call("tools/call", tool))[1], name)
            except FAILURES as exc:
                out[name] = {"error": str(exc)}
                continue
            used = engine.cpu_seconds(self.orch.pid) - before
            out[name] = round(used / calls * 1e6, 1)
        say(f"orchestrator CPU per call (µs): {out}")
        return out

    @contextlib.asynccontextmanager
    async def _supergateway(self, image: str) -> AsyncIterator[Rpc]:
        """supergateway --stdio "docker run -i --rm IMAGE" --outputTransport ws."""
        argv = await trio.to_thread.run_sync(engine.ensure_supergateway)
        port = free_port()
        command = " ".join(engine.docker_run_argv(image, "--network", "none"))
        peer = await engine.start_peer(
            "supergateway",
            [*argv, "--stdio", command, "--outputTransport", "ws", "--port", str(port),
             "--messagePath", "/message", "--logLevel", "none"],
            port,
            self.side_log,
        )  # fmt: skip
        try:
            await wait_for_port(port, bound=120, alive=peer.alive)
            async with initialized(websocket_session(f"ws://127.0.0.1:{port}/message")) as rpc:
                yield rpc
        finally:
            await peer.stop()

    @contextlib.asynccontextmanager
    async def _mcp_proxy(self, image: str) -> AsyncIterator[Rpc]:
        """mcp-proxy --port P -- docker run -i --rm IMAGE (Streamable HTTP at /mcp)."""
        argv = await trio.to_thread.run_sync(engine.ensure_mcp_proxy)
        port = free_port()
        peer = await engine.start_peer(
            "mcp_proxy",
            [*argv, "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
             "--", *engine.docker_run_argv(image, "--network", "none")],
            port,
            self.side_log,
        )  # fmt: skip
        try:
            await wait_for_port(port, bound=120, alive=peer.alive)
            async with initialized(http_session(port, "/mcp")) as rpc:
                yield rpc
        finally:
            await peer.stop()

    # --- 3. throughput --------------------------------------------------------------------

    async def throughput(self) -> Json:
        out: Json = {"pipeline_depth": PIPELINE_DEPTH, "service": THROUGHPUT_SERVICE}
        image = service_image(THROUGHPUT_SERVICE)
        pipe_argv = engine.docker_run_argv(image, "--network", "none")
        path = f"/mcp/{THROUGHPUT_SERVICE}"
        candidates: list[tuple[str, contextlib.AbstractAsyncContextManager[Rpc]]] = [
            ("direct_socket", initialized(engine.socket_stdio(image))),
            ("direct", initialized(engine.attached(image))),
            ("docker_run_pipe", initialized(engine.piped(pipe_argv, self.side_log))),
            ("reactor_fabric_ws", initialized(self.ws(THROUGHPUT_SERVICE))),
            (
                "reactor_fabric_http",
                initialized(http_session(self.orch.port, path, self.orch.auth_headers)),
            ),
            *self.fabric_sessions(THROUGHPUT_SERVICE),
        ]
        if self.plan.peers:
            candidates += [
                ("supergateway", self._supergateway(image)),
                ("mcp_proxy", self._mcp_proxy(image)),
            ]
        runs: dict[str, dict[str, list[Json]]] = {}
        self.http_pools = {}
        async with contextlib.AsyncExitStack() as stack:
            systems = await self._start_systems(stack, candidates, out, "throughput")
            # A warm-up run each, not counted: the fabric endpoint starts its container at the
            # first call (lazily), which would otherwise fall in its first repeat.
            for name in [name for name in systems if name not in out]:
                await self._throughput_run(
                    stack, name, systems[name], "small", THROUGHPUT_WARM_UP_CALLS
                )
            for size_name, total in self.plan.throughput_messages.items():
                for repeat in range(self.plan.repeats):
                    live = [name for name in systems if name not in out]
                    shift = repeat % len(live) if live else 0
                    for name in live[shift:] + live[:shift]:
                        run = await self._throughput_run(
                            stack, name, systems[name], size_name, total
                        )
                        if run is not None:
                            run["repeat"] = repeat
                            runs.setdefault(name, {}).setdefault(size_name, []).append(run)
                    say(f"throughput {size_name}: repeat {repeat + 1}/{self.plan.repeats}")
        await trio.to_thread.run_sync(engine.remove_bench_containers)
        for name, by_size in runs.items():
            out[name] = {size: summarize_runs(size_runs) for size, size_runs in by_size.items()}
            if name not in RELAYED:
                continue
            # Issue 53: ahead of supergateway's throughput in every repeat (paired by repeat).
            for size, size_runs in by_size.items():
                theirs = runs.get("supergateway", {}).get(size)
                if theirs:
                    out[name][size]["against_supergateway"] = paired_rates(size_runs, theirs)
            for size, summary in out[name].items():
                say(
                    f"throughput {name} {size}: {summary['msgs_per_s'].get('median')} calls/s "
                    f"(median of {summary['msgs_per_s'].get('n')})"
                )
        await self.settle()
        return out

    async def _throughput_run(
        self,
        stack: contextlib.AsyncExitStack,
        name: str,
        rpc: Rpc,
        size_name: str,
        total: int,
    ) -> Json | None:
        cpu_before = engine.cpu_seconds(self.orch.pid)
        echo = tool_of(name, {"name": "echo"}, THROUGHPUT_SERVICE)["name"]
        try:
            with trio.fail_after(600):
                if isinstance(rpc, HttpRpc):
                    pool = await self._http_pool(stack, name, rpc)
                    run = await pipelined_http(
                        pool, total=total, payload=PAYLOADS[size_name], tool=echo
                    )
                else:
                    assert isinstance(rpc, StreamRpc)
                    run = await pipelined(rpc, total=total, payload=PAYLOADS[size_name], tool=echo)
        except FAILURES as exc:
            if name in OURS:
                self.problem(f"throughput.{name}.{size_name}", exc)
            else:
                say(f"throughput {name} {size_name} failed: {exc}")
            return None
        if name in RELAYED:
            cpu = engine.cpu_seconds(self.orch.pid) - cpu_before
            run["orchestrator_cpu_us_per_call"] = round(cpu / total * 1e6, 1)
        return run

    async def _http_pool(
        self, stack: contextlib.AsyncExitStack, name: str, first: HttpRpc
    ) -> list[HttpRpc]:
        """PIPELINE_DEPTH keep-alive connections on ``first``'s session (made once)."""
        pools = self.http_pools
        if name not in pools:
            pool = [first]
            for _ in range(PIPELINE_DEPTH - 1):
                twin = HttpRpc(first.host, first.port, first.path, first.headers)
                twin.session_id, twin.protocol_version = first.session_id, first.protocol_version
                twin.ids = first.ids
                stack.push_async_callback(twin.close_connection)
                pool.append(twin)
            pools[name] = pool
        return pools[name]

    # --- 4. memory ------------------------------------------------------------------------

    async def memory(self) -> Json:
        """The orchestrator's resident memory idle and with N live sessions, on an orchestrator
        of its own started for this part (what the other parts did, e.g. 1 MiB messages, is
        not counted here; the main orchestrator's figures after every part are given apart);
        then each bundled service's container."""
        out: Json = {}
        for count in FULL.memory_sessions:
            if count not in self.plan.memory_sessions:
                out[f"orchestrator_{count}_sessions"] = {"error": "skipped in smoke mode"}
        async with self._own_orchestrator("memory") as orch:
            idle = await idle_rss_mb(orch)
            out["orchestrator_idle_fresh"] = idle
            say(f"memory: idle {idle} MB")
            for count in self.plan.memory_sessions:
                key = f"orchestrator_{count}_sessions"
                try:
                    megabytes, detail = await self._hold_sessions(count, orch)
                    detail["per_session_kb"] = round((megabytes - idle) * 1024 / count, 1)
                    out[key] = megabytes
                    out[f"{key}_detail"] = detail
                except FAILURES as exc:
                    out[key] = self.problem(f"memory.{key}", exc)
                left = await orch.wait_for_containers(0, bound=120)
                if left:
                    say(f"warning: {left} container(s) of the memory part still present")
            out["orchestrator_idle_after_sessions"] = await idle_rss_mb(orch)
            out["orchestrator_peak_fresh"] = round(rss_kib(orch.pid)["VmHWM"] / 1024, 1)
        containers: Json = {}
        for service in bundled_services():
            try:
                containers[service] = await self._container_memory(service)
            except STATS_FAILURES as exc:
                containers[service] = self.problem(f"memory.containers.{service}", exc)
            await self.settle()
        out["containers"] = containers
        rss = rss_kib(self.orch.pid)
        out["orchestrator_after_load"] = round(rss["VmRSS"] / 1024, 1)
        out["orchestrator_peak"] = round(rss["VmHWM"] / 1024, 1)
        return out

    @contextlib.asynccontextmanager
    async def _own_orchestrator(
        self, name: str, warm: dict[str, int] | None = None
    ) -> AsyncIterator[engine.Orchestrator]:
        """An orchestrator of the benchmark's suite for the block (``warm``: see
        :func:`write_suite`); then stopped and every container of it removed."""
        suite = write_suite(TMP / f"suite-{name}.yaml", warm=warm)
        orch = await engine.start_orchestrator(suite, TMP / f"orchestrator-{name}.log")
        try:
            yield orch
        finally:
            with trio.CancelScope(shield=True):
                code = await orch.stop()
                left = await trio.to_thread.run_sync(
                    engine.remove_orchestrator_containers, orch.pid
                )
            if code != 0:
                self.problems.append(f"the {name} orchestrator exited with {code} on SIGTERM")
            if left:
                say(f"warning: the {name} orchestrator left {left} container(s)")

    async def _hold_sessions(self, count: int, orch: engine.Orchestrator) -> tuple[float, Json]:
        """Open ``count`` sessions on ``orch`` (each with its container), measure, then close
        them all."""
        opening = trio.CapacityLimiter(8)
        everyone_ready = trio.Event()
        release = trio.Event()
        failures: list[str] = []
        settled = 0

        async def hold() -> None:
            nonlocal settled
            await opening.acquire()
            holding = False
            try:
                url = orch.ws_url(COLD_SERVICE)
                async with initialized(websocket_session(url, subprotocols=["mcp"])):
                    opening.release()
                    holding = True
                    settled += 1
                    if settled == count:
                        everyone_ready.set()
                    await release.wait()
            except FAILURES as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                settled += 1
                if settled == count:
                    everyone_ready.set()
            finally:
                if not holding:
                    opening.release()

        with unwrapped():
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(hold)
                try:
                    with trio.fail_after(SESSION_BOUND + count * 5):
                        await everyone_ready.wait()
                    if failures:
                        raise ProtocolError(f"{len(failures)} session(s) failed: {failures[0]}")
                    live = await orch.wait_for_containers(count, bound=30)
                    await trio.sleep(2)  # let the allocator and the relay tasks settle
                    rss = rss_kib(orch.pid)
                    say(f"memory with {count} sessions: {rss['VmRSS'] / 1024:.1f} MB")
                finally:
                    release.set()
        detail = {"containers_live": live, "vm_hwm_mb": round(rss["VmHWM"] / 1024, 1)}
        return round(rss["VmRSS"] / 1024, 1), detail

    async def _container_memory(self, service: str) -> Json:
        async with initialized(self.ws(service)):
            await trio.sleep(0.5 if self.plan.smoke else 2)  # idle after initialize
            found = await engine.docker_call(
                engine.containers_with(
                    [
                        f"{engine.OWNER_PID_LABEL}={self.orch.pid}",
                        f"{engine.SERVICE_LABEL}={service}",
                    ]
                )
            )
            if len(found) != 1:
                raise ProtocolError(f"expected one {service} container, found {len(found)}")
            stats: Json = await engine.docker_call(
                lambda c: c.stats(found[0]["Id"], stream=False, one_shot=True)
            )
        memory = stats.get("memory_stats", {})
        inner = memory.get("stats", {})
        usage = int(memory["usage"])
        # What `docker stats` shows: usage less the inactive page cache (cgroup v1 and v2).
        cache = int(inner.get("total_inactive_file", inner.get("inactive_file", 0)))
        return {
            "image": service_image(service),
            "usage_mb": round((usage - cache if cache < usage else usage) / 2**20, 1),
            "rss_mb": round(int(inner.get("total_rss", inner.get("anon", 0))) / 2**20, 1),
            "limit_mb": round(int(memory.get("limit", 0)) / 2**20),
        }

    # --- 5. concurrency -------------------------------------------------------------------

    async def concurrency(self) -> Json:
        out: Json = {}
        floor: Json = {}
        for count in FULL.bursts:
            if count not in self.plan.bursts:
                out[f"clients_{count}"] = {"error": "skipped in smoke mode"}
        argv = engine.docker_run_argv(service_image(COLD_SERVICE))
        for count in self.plan.bursts:
            key = f"clients_{count}"
            try:
                await self.settle()
                out[key] = await self._burst(
                    count, lambda: self.ws(COLD_SERVICE), self.orch.container_count
                )
                say(f"burst of {count}: {out[key]}")
            except FAILURES as exc:
                out[key] = self.problem(f"concurrency.{key}", exc)
            # The same burst of plain `docker run -i --rm` processes: what the engine and the
            # machine allow without any orchestrator.
            try:
                floor[key] = await self._burst(
                    count, lambda: engine.piped(argv, self.side_log), engine.bench_container_count
                )
                say(f"burst of {count} `docker run`: {floor[key]}")
            except FAILURES as exc:
                floor[key] = self.problem(f"concurrency.docker_run_floor.{key}", exc)
        out["docker_run_floor"] = floor
        out["warm_pool"] = await self._pooled_bursts()
        return out

    async def _pooled_bursts(self) -> Json:
        """The same bursts against an orchestrator whose `time` keeps BURST_POOL_WARM warm
        containers (its pool full before each burst): the first of the burst take pooled
        containers, the rest start fresh ones while the pool refills."""
        out: Json = {"warm": BURST_POOL_WARM}
        name = "burst_pool"
        async with self._pool_orchestrator(name, {COLD_SERVICE: BURST_POOL_WARM}, out) as system:
            for count in self.plan.bursts:
                key = f"clients_{count}"
                try:
                    await self._pool_quiet({name: system}, strict=False)
                    before = await system.takes(COLD_SERVICE)
                    figures = await self._burst(
                        count,
                        functools.partial(self.pool_ws, system, COLD_SERVICE),
                        system.session_containers,
                        left_bound=120,
                    )
                    takes = delta(await system.takes(COLD_SERVICE), before)
                    figures["pool_hits"] = int(takes.get("hit", 0))
                    out[key] = figures
                    say(f"burst of {count} with a warm pool of {BURST_POOL_WARM}: {figures}")
                except FAILURES as exc:
                    out[key] = self.problem(f"concurrency.warm_pool.{key}", exc)
        return out

    async def _burst(
        self,
        count: int,
        session: Callable[[], contextlib.AbstractAsyncContextManager[Rpc]],
        containers: Callable[[], Awaitable[int]],
        *,
        left_bound: float = 60.0,
        ports: list[tuple[int | None, int]] | None = None,
    ) -> Json:
        """``count`` clients released at once; each holds its session until all have answered.

        ``containers()``: the containers of the system's sessions (``left_bound`` s after the
        burst it must be 0). ``ports``: filled with each WebSocket client's (local port, first
        response ns), which the audit trail's ``session_start`` names as the session's peer."""
        # On two cores a burst's servers start together and share them (about one second of CPU
        # each, a Python server's imports): 50 clients took 55 s. The bound grows with the burst,
        # so that what is measured is the system, not the client's patience.
        bound = max(SESSION_BOUND, count * BURST_SECONDS_PER_CLIENT)
        gun = trio.Event()
        everyone_done = trio.Event()
        first: list[int] = []
        tool: list[int] = []
        failures: list[str] = []
        settled = 0

        def done() -> None:
            nonlocal settled
            settled += 1
            if settled == count:
                everyone_done.set()

        async def client() -> None:
            await gun.wait()
            begin = time.perf_counter_ns()
            try:
                with trio.fail_after(bound):
                    async with session() as rpc:
                        await handshake(rpc)
                        first.append(time.perf_counter_ns() - begin)
                        if ports is not None:
                            ports.append((local_port(rpc), first[-1]))
                        _, answer = await rpc.call("tools/call", TOOL)
                        check_result(answer, "tools/call")
                        tool.append(time.perf_counter_ns() - begin)
                        done()
                        # Hold the session until every client has its answer: the burst is
                        # `count` sessions (and containers) alive at the same time.
                        with trio.move_on_after(bound):
                            await everyone_done.wait()
            except FAILURES as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:300])
                done()

        with unwrapped():
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(client)
                await trio.sleep(0.2)  # every client is now waiting for the gun
                memory_before = machine_memory_used_mb()
                started = time.perf_counter_ns()
                gun.set()
                with trio.move_on_after(bound + 30):
                    await everyone_done.wait()
                wall = time.perf_counter_ns() - started
                peak = await containers()
                memory_at_peak = machine_memory_used_mb()
                everyone_done.set()
        left = await engine.wait_for_count(containers, 0, bound=left_bound)
        result = burst(
            ok=len(tool), failed=count - len(tool), first_response_ns=first, containers_left=left
        )
        tool_stats = summarize(tool)
        result.update(
            {
                "max_first_response_ms": summarize(first).get("max_ms"),
                "p50_tool_response_ms": tool_stats.get("p50_ms"),
                "p95_tool_response_ms": tool_stats.get("p95_ms"),
                "wall_ms": round(wall / 1e6, 1),
                # Sessions (each with its container started) answered per second of the burst:
                # the engine's start rate bounds it.
                "sessions_per_s": round(len(tool) / (wall / 1e9), 1) if wall else None,
                "machine_memory_mb": {"before": memory_before, "at_peak": memory_at_peak},
                "containers_at_peak": peak,
                "errors": sorted(set(failures))[:5],
            }
        )
        return result

    # --- 6. warm pool ---------------------------------------------------------------------

    async def pool(self) -> Json:
        """The warm pool against fresh containers. Cold start: orchestrators ``pooled``
        (``warm: 1`` for each service of the cases) and ``fresh`` (``warm: 0``: today's cold
        start) side by side; burst and refill: ``pooled_burst`` (``warm: N`` on POOL_SERVICE
        only) and the same ``fresh``."""
        cases = self.plan.pool_cases or tuple(
            (service, mounted) for service in bundled_services() for mounted in (False, True)
        )
        warm = dict.fromkeys([service for service, _ in cases], 1)
        burst_warm = {POOL_SERVICE: self.plan.pool_burst_warm}
        out: Json = {
            "config": {
                "warm_cold_start": warm,
                "warm_burst": burst_warm,
                "max_containers": POOL_MAX_CONTAINERS,
                "parallel_starts": POOL_PARALLEL_STARTS,
                "boot_seconds": POOL_BOOT_SECONDS,
                "project": str(POOL_PROJECT),
                "cases": [[service, mount_key(mounted)] for service, mounted in cases],
            }
        }
        try:
            uid, gid = await trio.to_thread.run_sync(make_pool_project)
            owner = out["config"]["project_owner"] = f"{uid}:{gid}"
            parts = self.plan.pool_parts
            for part in set(POOL_PARTS) - set(parts):
                out[part] = {"error": "not run (--pool-parts)"}
            async with contextlib.AsyncExitStack() as both:
                async with contextlib.AsyncExitStack() as cold_only:
                    # All three at once; the burst's pool fills during the cold-start part and
                    # stays idle (every sample waits for all of them to be quiet).
                    wanted = {"fresh": (both, {}), "pooled_burst": (both, burst_warm)}
                    if "cold_start" in parts:
                        wanted["pooled"] = (cold_only, warm)
                    systems = await self._pool_start(out, wanted)
                    say(f"waiting for the pools to fill: {warm}; for the burst: {burst_warm}")
                    await self._pool_quiet(systems)
                    if "cold_start" in parts:
                        cold = await self._pool_cold(systems, cases, owner)
                        out["cold_start"], out["cold_start_all"], out["pool_hits"] = cold
                systems = {"pooled": systems["pooled_burst"], "fresh": systems["fresh"]}
                await self._pool_quiet(systems)
                if "burst" in parts:
                    out["burst"] = await self._pool_bursts(systems)
                if "refill" in parts:
                    out["refill"] = await self._pool_refill(systems)
        except (*FAILURES, RuntimeError, subprocess.SubprocessError) as exc:
            out["error"] = self.problem("pool", exc)["error"]
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(engine.remove_bench_containers)
        out["not_quiet"] = self.pool_not_quiet
        return out

    async def _pool_start(
        self, out: Json, wanted: dict[str, tuple[contextlib.AsyncExitStack, dict[str, int]]]
    ) -> dict[str, PoolSystem]:
        """The orchestrators ``wanted`` (name → the stack that stops it, its pool), started
        side by side."""
        systems: dict[str, PoolSystem] = {}

        async def start(name: str, stack: contextlib.AsyncExitStack, warm: dict[str, int]) -> None:
            systems[name] = await stack.enter_async_context(
                self._pool_orchestrator(name, warm, out)
            )

        with unwrapped():
            async with trio.open_nursery() as nursery:
                for name, (stack, warm) in wanted.items():
                    nursery.start_soon(start, name, stack, warm)
        return systems

    @contextlib.asynccontextmanager
    async def _pool_orchestrator(
        self, name: str, warm: dict[str, int], out: Json, *, services: Json | None = None
    ) -> AsyncIterator[PoolSystem]:
        """An orchestrator on the suite with ``warm`` (and ``services``: see
        :func:`write_suite`), for the block; then stopped, its containers counted and removed,
        its log summed up into ``out``."""
        log_path = TMP / f"orchestrator-{name.replace('_', '-')}.log"
        suite = write_suite(
            TMP / f"suite-{name.replace('_', '-')}.yaml", warm=warm, services=services
        )
        orch = await engine.start_orchestrator(suite, log_path)
        say(f"{name} orchestrator: {orch.banner.splitlines()[0]}")
        system = PoolSystem(name, orch, warm)
        try:
            yield system
        finally:
            with trio.CancelScope(shield=True):
                system.tail.close()
                code = await orch.stop()
                left = await trio.to_thread.run_sync(
                    engine.remove_orchestrator_containers, orch.pid
                )
            out.setdefault("orchestrators", {})[name] = {
                "exit_code": code,
                "containers_left_after_stop": left,
            }
            out.setdefault("log", {})[name] = pool_log_summary(log_path)
            if code != 0:
                self.problems.append(f"the {name} orchestrator exited with {code} on SIGTERM")

    def pool_ws(
        self, system: PoolSystem, service: str, *, mounted: bool = False
    ) -> contextlib.AbstractAsyncContextManager[StreamRpc]:
        query = ""
        if mounted:
            query = "mount=" + urllib.parse.quote(f"{POOL_PROJECT}:/workspace", safe="")
        return websocket_session(system.orch.ws_url(service, query), subprotocols=["mcp"])

    async def _pool_quiet(
        self,
        systems: dict[str, PoolSystem],
        *,
        sessions: dict[str, int] | None = None,
        floors: int = 0,
        bound: float = POOL_QUIET_BOUND,
        strict: bool = True,
    ) -> bool:
        """Until every pool is full and nothing else runs: each orchestrator has its pooled
        containers (ready) plus ``sessions[name]`` of its sessions', ``floors`` floor
        containers run (the refill part's direct attach; none left by a sample), and no
        container's server is still starting (the pool calls a container ready once it has
        started, before its server has: see PoolSystem.booting). The POOL_QUIET_FAILURES-th
        time it is not, ``strict``: PoolStuck (each sample would wait in vain)."""
        sessions = sessions or {}
        with trio.move_on_after(bound):
            # Polling the engine and the metrics: there is no event to wait on.
            while True:
                quiet = await engine.bench_container_count() == floors
                for name, system in systems.items():
                    if not quiet:
                        break
                    expected = system.pooled_total + sessions.get(name, 0)
                    found = await engine.docker_call(system.orch.containers())
                    quiet = len(found) == expected
                    if quiet and system.warm:
                        ids = [container["Id"] for container in found]
                        quiet = await system.ready() == system.warm and not system.booting(ids)
                if quiet:
                    return True
                await trio.sleep(0.1)
        self.pool_not_quiet += 1
        say(f"warning: the pools did not fill, or containers stayed, within {bound:g} s")
        if strict and self.pool_not_quiet >= POOL_QUIET_FAILURES:
            raise PoolStuck(f"not quiet within {bound:g} s, {self.pool_not_quiet} times")
        return False

    async def _pool_cold(
        self, systems: dict[str, PoolSystem], cases: tuple[tuple[str, bool], ...], owner: str
    ) -> tuple[Json, Json, Json]:
        """The cases without a mount, then those with one (see :meth:`_pool_prime`); in each
        block, run by run, every case's pooled, fresh and floor sample in a rotating order,
        each on a quiet engine with the pool full. Pooled samples that were not pool hits
        (metrics) are set apart as misses."""
        cold = PoolCold(cases)
        for mounted in (False, True):
            block = [case for case in cases if case[1] == mounted]
            for service in dict.fromkeys(service for service, _ in block):
                await self._pool_prime(systems, cold, service, mounted)
            for run in range(self.plan.pool_runs):
                for index, case in enumerate(block):
                    shift = (run + index) % len(POOL_SYSTEMS)
                    for name in POOL_SYSTEMS[shift:] + POOL_SYSTEMS[:shift]:
                        if (case, name) in cold.failed:
                            continue
                        await self._pool_quiet(systems)
                        try:
                            await self._pool_sample(systems, cold, case, name, owner=owner, run=run)
                        except FAILURES as exc:
                            where = f"pool.cold_start.{case[0]}.{mount_key(case[1])}.{name}"
                            cold.failed[(case, name)] = self.problem(where, exc)
                if block:
                    say(f"pool cold start, {mount_key(mounted)}: {run + 1}/{self.plan.pool_runs}")
        await self._pool_quiet(systems)
        say(f"pool cold start: {cold.hits()} pooled samples were hits, {len(cold.misses)} misses")
        return cold.figures()

    async def _pool_prime(
        self, systems: dict[str, PoolSystem], cold: PoolCold, service: str, mounted: bool
    ) -> None:
        """One session (not a sample) when ``service``'s sessions switch between no mount and
        a mount: the pool keeps containers of the account its service was last asked for (a
        mounted session's server runs as the project's owner, an unmounted one's as nobody),
        and its first session of the other kind misses (outcome ``shape``) and retires one."""
        pooled = systems["pooled"]
        if pooled.mounted.get(service, False) == mounted:
            return
        await self._pool_quiet(systems)
        before = await pooled.takes(service)
        try:
            first, _, _ = await self._pool_session(pooled, service, mounted)
        except FAILURES as exc:
            cold.primes.append({"service": service, "mount": mount_key(mounted), "error": str(exc)})
            return
        pooled.mounted[service] = mounted
        cold.primes.append(
            {
                "service": service,
                "mount": mount_key(mounted),
                "takes": delta(await pooled.takes(service), before),
                "first_response_ms": round(first / 1e6, 3),
            }
        )
        say(f"pool shape switch: {cold.primes[-1]}")

    async def _pool_sample(
        self,
        systems: dict[str, PoolSystem],
        cold: PoolCold,
        case: tuple[str, bool],
        name: str,
        *,
        owner: str,
        run: int,
    ) -> None:
        """One sample of ``name`` on ``case`` into ``cold`` (a pooled one only if a hit)."""
        service, mounted = case
        if name == "docker_run_floor":
            floor = await self._pool_floor(service, mounted, owner)
            cold.add(case, name, floor.first, floor.request)
            return
        pooled = systems["pooled"]
        before = await pooled.takes(service) if name == "pooled" else {}
        first, connect, request = await self._pool_session(systems[name], service, mounted)
        if name == "pooled":
            outcomes = delta(await pooled.takes(service), before)
            if outcomes != {"hit": 1}:
                cold.miss(case, run, outcomes, first)
                say(f"pool miss: {cold.misses[-1]}")
                return
        cold.add(case, name, first, request, connect)

    async def _pool_session(
        self, system: PoolSystem, service: str, mounted: bool
    ) -> tuple[int, int, int]:
        """(connect → initialize response, connect, the first request's round trip) in ns."""
        with trio.fail_after(SESSION_BOUND):
            begin = time.perf_counter_ns()
            async with self.pool_ws(system, service, mounted=mounted) as rpc:
                connect = time.perf_counter_ns() - begin
                await handshake(rpc)
                first = time.perf_counter_ns() - begin
                request = await first_request(rpc, service, mounted)
        return first, connect, request

    async def _pool_floor(self, service: str, mounted: bool, owner: str) -> FloorSample:
        """``docker run -i --rm [-v PROJECT:/workspace --user OWNER] IMAGE``: see
        :meth:`_floor_sample`."""
        options = ["-v", f"{POOL_PROJECT}:/workspace", "--user", owner] if mounted else []
        argv = engine.docker_run_argv(service_image(service), *options)
        return await self._floor_sample(argv, service, mounted=mounted)

    async def _floor_sample(
        self, argv: list[str], service: str, *, mounted: bool = False
    ) -> FloorSample:
        """A ``docker run -i`` floor (``argv``) of ``service``, initialized, one request
        (:func:`first_request`), its stdin closed: see :class:`FloorSample`."""
        with trio.fail_after(SESSION_BOUND):
            begin = time.perf_counter_ns()
            piped = await engine.spawn_piped(argv, self.side_log)
            try:
                _, answer = await piped.rpc.call("initialize", initialize_params())
                first = time.perf_counter_ns() - begin
                check_result(answer, "initialize")
                await piped.rpc.notify("notifications/initialized")
                request = await first_request(piped.rpc, service, mounted)
                answered = time.perf_counter_ns() - begin
            finally:
                await piped.aclose()
        return FloorSample(first, request, answered, time.perf_counter_ns() - begin)

    async def _pool_bursts(self, systems: dict[str, PoolSystem]) -> Json:
        """The same burst of `time` clients against the pooled and the fresh orchestrator."""
        count = self.plan.pool_burst
        out: Json = {"clients": count, "warm": systems["pooled"].warm.get(POOL_SERVICE, 0)}
        for name in ("pooled", "fresh"):
            system = systems[name]
            await self._pool_quiet(systems)
            tail = engine.LogTail(system.orch.log_path)
            ports: list[tuple[int | None, int]] = []
            try:
                before = await system.takes(POOL_SERVICE)
                figures = await self._burst(
                    count,
                    functools.partial(self.pool_ws, system, POOL_SERVICE),
                    system.session_containers,
                    left_bound=120,
                    ports=ports,
                )
                takes = delta(await system.takes(POOL_SERVICE), before)
                events = tail.read()
            except FAILURES as exc:
                out[name] = self.problem(f"pool.burst.{name}", exc)
                continue
            finally:
                tail.close()
            figures.update(split_by_pooled(ports, engine.audit_records(system.orch.log_path)))
            started = [
                event
                for event in events
                if event.get("event") == "container_started"
                and event.get("service") == POOL_SERVICE
            ]
            figures["pool_takes"] = takes
            figures["pool_hits"] = int(takes.get("hit", 0))
            figures["log_started_pooled"] = sum(1 for event in started if event.get("pooled"))
            figures["log_started_fresh"] = sum(1 for event in started if not event.get("pooled"))
            out[name] = figures
            say(f"pool burst of {count}, {name}: {figures}")
        return out

    async def _pool_refill(self, systems: dict[str, PoolSystem]) -> Json:
        """Round trips on an established `time` session of the pooled orchestrator, one call
        at a time, in two phases per repeat (order rotating): ``quiet`` (the pool full, nothing
        starting) and ``refilling`` (POOL_PARALLEL_STARTS refills under way all the time, see
        :class:`RefillWatch`)."""
        pooled = systems["pooled"]
        phases = ("quiet", "refilling")
        repeats: list[dict[str, list[int]]] = []
        floors: list[dict[str, list[int]]] = []
        details: list[Json] = []
        out: Json = {"service": POOL_SERVICE, "parallel_starts": POOL_PARALLEL_STARTS}
        # The orchestrator's own share of each call, from its syscalls (bench/residency.py).
        untraced = await trio.to_thread.run_sync(residency.unavailable)
        try:
            await self._pool_quiet(systems)
            async with (
                initialized(self.pool_ws(pooled, POOL_SERVICE)) as rpc,
                initialized(engine.socket_stdio(service_image(POOL_SERVICE))) as direct,
            ):
                await self._timed_calls(rpc, self.plan.rtt_warmup)
                await self._timed_calls(direct, self.plan.rtt_warmup)
                for repeat in range(self.plan.pool_refill_repeats):
                    samples: dict[str, list[int]] = {}
                    floor: dict[str, list[int]] = {}
                    for phase in phases[repeat % 2 :] + phases[: repeat % 2]:
                        await self._pool_quiet(systems, sessions={"pooled": 1}, floors=1)
                        (samples[phase], floor[phase]), detail = await self._pool_phase(
                            pooled,
                            rpc,
                            direct,
                            refilling=phase == "refilling",
                            trace_calls=untraced is None,
                        )
                        details.append({"repeat": repeat, "phase": phase, **detail})
                    repeats.append(samples)
                    floors.append(floor)
                    say(
                        f"pool refill {repeat + 1}/{self.plan.pool_refill_repeats}: P50 / P99 "
                        + ", ".join(
                            f"{p} {summarize(samples[p]).get('p50_ms')} / "
                            f"{summarize(samples[p]).get('p99_ms')} ms (direct "
                            f"{summarize(floor[p]).get('p50_ms')} / "
                            f"{summarize(floor[p]).get('p99_ms')})"
                            for p in phases
                        )
                    )
        except FAILURES as exc:
            out["error"] = self.problem("pool.refill", exc)["error"]
            return out
        finally:
            with trio.CancelScope(shield=True):
                await self._pool_quiet(systems, bound=60, strict=False)
        everything = {phase: [ns for r in repeats for ns in r[phase]] for phase in phases}
        for phase in phases:
            figures = summarize(everything[phase])
            figures["repeats"] = {
                key: spread([summarize(r[phase]).get(key) for r in repeats])
                for key in ("p50_ms", "p99_ms")
            }
            out[phase] = figures
        per_repeat = [{phase: summarize(r[phase]) for phase in phases} for r in repeats]
        floor_per_repeat = [{phase: summarize(r[phase]) for phase in phases} for r in floors]
        out.update(refill_against_floor(per_repeat, floor_per_repeat, floors))
        out["ratio_p50"] = spread(
            [ratio(r["refilling"].get("p50_ms"), r["quiet"].get("p50_ms")) for r in per_repeat]
        )
        for key in ("p50", "p99"):
            out[f"difference_{key}_ms"] = spread(
                [difference(r["refilling"], r["quiet"], f"{key}_ms") for r in per_repeat]
            )
        if everything["quiet"] and everything["refilling"]:
            for key, fraction in (("p50", 0.50), ("p95", 0.95)):
                out[f"difference_{key}_all_ms"] = difference(
                    out["refilling"], out["quiet"], f"{key}_ms"
                )
                out[f"difference_{key}_ci_ms"] = list(
                    bootstrap(everything["refilling"], fraction, against=everything["quiet"])
                )
        for key in (
            "takes",
            "refills_ready",
            "refills_booted",
            "orchestrator_cpu_percent",
            "seconds",
        ):
            out[f"{key}_by_phase"] = {
                phase: spread([d[key] for d in details if d["phase"] == phase]) for phase in phases
            }
        out["pool_takes"] = {
            phase: sum_takes([d["pool_takes"] for d in details if d["phase"] == phase])
            for phase in phases
        }
        out["take_errors"] = sorted({e for d in details for e in d["take_errors"]})[:5]
        if untraced is not None:
            out["residency"] = {"error": untraced}
        else:
            traced = [
                {d["phase"]: d.get("residency", {}) for d in details if d["repeat"] == repeat}
                for repeat in range(len(repeats))
            ]
            out["residency"] = residency.summary(traced)
            out["residency_difference"] = residency.differences(
                traced, minus="quiet", of="refilling"
            )
        out["per_repeat"] = per_repeat
        out["direct_per_repeat"] = floor_per_repeat
        return out

    async def _timed_calls(self, rpc: Rpc, calls: int, tool: Json = TOOL) -> list[int]:
        return [await timed_tool_call(rpc, tool=tool) for _ in range(calls)]

    async def _paired_calls(self, rpc: Rpc, direct: Rpc, calls: int) -> tuple[list[int], list[int]]:
        """``calls`` round trips on each, interleaved call by call (the first of each pair
        alternating), so that both meet the same moments of the machine."""
        ours: list[int] = []
        floor: list[int] = []
        for index in range(calls):
            pair = ((rpc, ours), (direct, floor))
            for target, samples in pair if index % 2 == 0 else pair[::-1]:
                samples.append(await timed_tool_call(target))
        return ours, floor

    async def _pool_phase(
        self, pooled: PoolSystem, rpc: Rpc, direct: Rpc, *, refilling: bool, trace_calls: bool
    ) -> tuple[tuple[list[int], list[int]], Json]:
        """One phase: the calls (through the orchestrator and, interleaved, directly attached to
        a container of the same image: the floor), with a :class:`RefillWatch` beside them (in
        both phases, so the harness does the same work; it takes pooled containers only when
        ``refilling``)."""
        watch = RefillWatch(self, pooled, refilling=refilling)
        before = await pooled.takes(POOL_SERVICE)
        try:
            with unwrapped():
                async with trio.open_nursery() as holders:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(watch.run, holders)
                        gc.collect()
                        gc.disable()
                        watch.measuring = True
                        cpu = engine.cpu_seconds(pooled.orch.pid)
                        begin = time.perf_counter_ns()
                        try:
                            async with self._traced_if(trace_calls, pooled.orch.pid) as trace:
                                samples = await self._paired_calls(
                                    rpc, direct, self.plan.pool_refill_calls
                                )
                        finally:
                            gc.enable()
                        seconds = (time.perf_counter_ns() - begin) / 1e9
                        cpu = engine.cpu_seconds(pooled.orch.pid) - cpu
                        refills = watch.ready, watch.booted
                        nursery.cancel_scope.cancel()
                    watch.release.set()
        finally:
            watch.tail.close()
        detail: Json = {
            "takes": watch.taken,
            "refills_ready": refills[0],
            "refills_booted": refills[1],
            "seconds": round(seconds, 3),
            "orchestrator_cpu_percent": round(100 * cpu / seconds, 1),
            "pool_takes": delta(await pooled.takes(POOL_SERVICE), before),
            "take_errors": watch.errors,
        }
        if trace is not None:
            detail["residency"] = trace.figures
        return samples, detail

    @contextlib.asynccontextmanager
    async def _traced_if(self, wanted: bool, pid: int) -> AsyncIterator[residency.Trace | None]:
        if not wanted:
            yield None
            return
        async with residency.traced(pid) as trace:
            yield trace

    # --- 8. start-up ----------------------------------------------------------------------

    async def startup(self) -> Json:
        """From spawning ``python -m reactor_fabric`` to serving: its banner (printed once it
        listens, the engine reached and the images checked) and a first ``/healthz`` answered;
        with a warm pool (``warm: 1`` for every bundled service) also until the pool is full
        (it fills after serving). The two systems alternate, each run on a quiet engine; each
        orchestrator keeps its state directory between runs, as a user's restart does (the
        first run of each learns the catalog, the others read it from the cache)."""
        warm = dict.fromkeys(bundled_services(), 1)
        samples: dict[str, dict[str, list[int]]] = {
            name: {"banner": [], "healthz": [], "pool_full": []} for name in STARTUP_SYSTEMS
        }
        out: Json = {}
        await self.settle()
        for run in range(self.plan.startup_runs):
            order = STARTUP_SYSTEMS[run % 2 :] + STARTUP_SYSTEMS[: run % 2]
            for name in order:
                if name in out:
                    continue
                try:
                    await self._startup_sample(
                        name, warm if name == "warm_pool" else None, samples[name], len(warm)
                    )
                except (*FAILURES, RuntimeError) as exc:
                    out[name] = self.problem(f"startup.{name}", exc)
            say(f"start-up {run + 1}/{self.plan.startup_runs}")
        for name, figures in samples.items():
            out.setdefault(
                name, {what: summarize(values) for what, values in figures.items() if values}
            )
        return out

    async def _startup_sample(
        self, name: str, warm: dict[str, int] | None, into: dict[str, list[int]], pooled: int
    ) -> None:
        begin = time.perf_counter_ns()
        async with self._own_orchestrator(f"startup-{name}", warm) as orch:
            into["banner"].append(time.perf_counter_ns() - begin)
            await orch.get("/healthz")
            into["healthz"].append(time.perf_counter_ns() - begin)
            if warm is not None:
                with trio.fail_after(POOL_QUIET_BOUND):
                    # The orchestrator's log is a file: polled, there is nothing to wait on.
                    while orch.log_path.read_text().count('"pooled_container_ready"') < pooled:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                into["pool_full"].append(time.perf_counter_ns() - begin)
        await self.settle()

    # --- 7. container lifecycles ----------------------------------------------------------

    async def lifecycles(self) -> Json:
        """One ``tools/call get_current_time`` per system of lifecycles.SYSTEMS, on one
        orchestrator whose suite adds the copies of `time` of lifecycles.SERVICES (with their
        strategy and pool) and next to a ``docker run -i --rm`` per call with the options the
        orchestrator gives `time` (SAME_LIMITS): see DEFINITIONS."""
        base = bundled()["mcp_services"][COLD_SERVICE]
        services = {
            name: {**base, "container_strategy": strategy}
            for name, (strategy, _) in lifecycles.SERVICES.items()
        }
        argv = engine.docker_run_argv(service_image(COLD_SERVICE), *SAME_LIMITS)
        out: Json = {
            "config": {
                "services": {
                    name: {"container_strategy": strategy, "warm": warm}
                    for name, (strategy, warm) in lifecycles.SERVICES.items()
                },
                "systems": {name: list(where) for name, where in lifecycles.SYSTEMS.items()},
                "docker_run": " ".join(argv),
                "repeats": self.plan.lifecycle_repeats,
                "rounds_per_repeat": self.plan.lifecycle_rounds,
            }
        }
        run = LifecycleRun(argv)
        try:
            async with (
                self._pool_orchestrator(
                    "lifecycles", lifecycles.warm(), out, services=services
                ) as system,
                contextlib.AsyncExitStack() as stack,
            ):
                run.settle = functools.partial(self._lifecycle_quiet, system, floors=1)
                orch = system.orch
                fabric = http_session(orch.port, "/mcp?tools=all", orch.auth_headers)
                run.fabric = await stack.enter_async_context(initialized(fabric))
                for endpoint, service in lifecycles.SYSTEMS.values():
                    if endpoint == "relay":
                        relay = http_session(orch.port, f"/mcp/{service}", orch.auth_headers)
                        run.relays[service] = await stack.enter_async_context(initialized(relay))
                await self._lifecycle_rounds(system, run)
        except (*FAILURES, RuntimeError, subprocess.SubprocessError) as exc:
            out["error"] = self.problem("lifecycles", exc)["error"]
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(engine.remove_bench_containers)
        out.update(lifecycles.figures(run.repeats))
        for name, error in run.failed.items():
            out["systems"][name] = error
        done = [r for rounds in run.repeats for r in rounds]
        every = {name: lifecycles.samples(done, name) for name in lifecycles.SYSTEMS}
        for pair, (fresh, reused) in lifecycles.PAIRS.items():
            # Unpaired, as the other parts compare: P50 and P95 of each, with intervals.
            out["added"][pair]["unpaired"] = compare(every, fresh, reused)
        out["docker_run_exit"] = summarize(run.exits)
        out["fresh_pooled_handed_out"] = summarize(run.handed_out)
        out["misses"] = {"count": len(run.misses), "first": run.misses[:10]}
        out["not_quiet"] = self.pool_not_quiet
        return out

    async def _lifecycle_rounds(self, system: PoolSystem, run: LifecycleRun) -> None:
        """A warm-up call on each system of lifecycles.WARM_UP (the reused ones start their
        containers; /mcp's first take of `time-fresh` gets a container not greeted, after which
        the pool greets its refills), then the rounds: every system once per round, in an order
        rotating each round, each sample on a quiet engine (the pools full and their servers
        started, no per-call or `docker run` container left)."""
        names = list(lifecycles.SYSTEMS)
        for name in lifecycles.WARM_UP:
            try:
                await self._lifecycle_call(run, name)
            except FAILURES as exc:
                run.failed[name] = self.problem(f"lifecycles.warm_up.{name}", exc)
        for repeat in range(self.plan.lifecycle_repeats):
            rounds: list[lifecycles.Round] = []
            for index in range(self.plan.lifecycle_rounds):
                live = [name for name in names if name not in run.failed]
                shift = (repeat * self.plan.lifecycle_rounds + index) % max(1, len(live))
                samples: lifecycles.Round = {}
                for name in live[shift:] + live[:shift]:
                    await self._lifecycle_quiet(system)
                    try:
                        sample = await self._lifecycle_sample(system, run, name)
                    except FAILURES as exc:
                        run.failed[name] = self.problem(f"lifecycles.{name}", exc)
                        continue
                    if sample is not None:
                        samples[name] = sample
                    else:
                        run.misses[-1].update(repeat=repeat, round=index)
                rounds.append(samples)
            run.repeats.append(rounds)
            done = [r for repeated in run.repeats for r in repeated]
            say(
                f"lifecycles {repeat + 1}/{self.plan.lifecycle_repeats}: P50 so far "
                + ", ".join(
                    f"{name} {summarize(lifecycles.samples(done, name)).get('p50_ms')}"
                    for name in names
                )
                + " ms"
            )
        await self._lifecycle_quiet(system, bound=60, strict=False)

    async def _lifecycle_quiet(
        self,
        system: PoolSystem,
        *,
        floors: int = 0,
        bound: float = POOL_QUIET_BOUND,
        strict: bool = True,
    ) -> bool:
        """:meth:`_pool_quiet` with the reused `time` containers of /mcp and the relay."""
        return await self._pool_quiet(
            {"lifecycles": system},
            sessions={"lifecycles": 2},
            floors=floors,
            bound=bound,
            strict=strict,
        )

    async def _lifecycle_sample(
        self, system: PoolSystem, run: LifecycleRun, name: str
    ) -> int | None:
        """One call on ``name`` (ns); None, recorded in ``run.misses``, when a pooled system's
        call was not served by a pooled container (on /mcp: one the pool had greeted)."""
        endpoint, service = lifecycles.SYSTEMS[name]
        pooled = lifecycles.SERVICES.get(service, ("", 0))[1] > 0
        if not pooled:
            return await self._lifecycle_call(run, name)
        before = await system.takes(service)
        tail = engine.LogTail(system.orch.log_path)
        try:
            sample = await self._lifecycle_call(run, name)
            events = tail.read()
        finally:
            tail.close()
        takes = delta(await system.takes(service), before)
        moments = {
            str(event.get("event")): str(event.get("ts"))
            for event in events
            if event.get("backend") == service
        }
        greeted = "backend_greeted_by_pool" in moments
        if takes == {"hit": 1} and (greeted or endpoint != "fabric"):
            if greeted and "per_call_container" in moments:
                run.handed_out.append(
                    between(moments["per_call_container"], moments["backend_greeted_by_pool"])
                )
            return sample
        miss = {"system": name, "takes": takes, "greeted": greeted, "ms": round(sample / 1e6, 3)}
        run.misses.append(miss)
        say(f"lifecycles: not a pooled sample: {miss}")
        return None

    async def _lifecycle_call(self, run: LifecycleRun, name: str) -> int:
        """One ``tools/call get_current_time`` on ``name``: its round trip (ns); for the
        `docker run` per call, from the spawn to the call's response (its exit in ``run``)."""
        endpoint, service = lifecycles.SYSTEMS[name]
        if endpoint == "docker_run":
            floor = await self._floor_sample(run.docker_run, service)
            run.exits.append(floor.exited)
            return floor.answered
        if endpoint == "relay":
            return await timed_tool_call(run.relays[service], name)
        if endpoint == "direct":
            async with initialized(engine.socket_stdio(service_image(service))) as direct:
                if run.settle is not None:
                    await run.settle()  # its server idle, as a pooled one's when taken
                return await timed_tool_call(direct, name)
        assert run.fabric is not None
        tool = {**TOOL, "name": f"{service}__{TOOL['name']}"}
        return await timed_tool_call(run.fabric, name, tool)


@dataclass(frozen=True)
class FloorSample:
    """A ``docker run -i --rm`` sample, in ns from the spawn: to the ``initialize`` response
    (``first``), to the first request's response (``answered``), to the process's exit (the
    container removed, ``--rm``: ``exited``); and that request's own round trip."""

    first: int
    request: int
    answered: int
    exited: int


@dataclass
class LifecycleRun:
    """The lifecycles part's clients and what it measured: per repeat, its rounds."""

    docker_run: list[str]
    fabric: HttpRpc | None = None
    settle: Callable[[], Awaitable[bool]] | None = None  # quiet, but for one floor container
    relays: dict[str, HttpRpc] = dataclasses.field(default_factory=dict)
    repeats: list[list[lifecycles.Round]] = dataclasses.field(default_factory=list)
    exits: list[int] = dataclasses.field(default_factory=list)  # `docker run`: spawn → exit
    # /mcp's pooled samples: the call's arrival → its container handed out (the log's moments).
    handed_out: list[int] = dataclasses.field(default_factory=list)
    misses: list[Json] = dataclasses.field(default_factory=list)
    failed: dict[str, Json] = dataclasses.field(default_factory=dict)


class PoolStuck(RuntimeError):
    """The engine did not get quiet for the pool part, again and again."""


class PoolCold:
    """The samples of the pool's cold-start part, and their figures."""

    def __init__(self, cases: tuple[tuple[str, bool], ...]) -> None:
        self.cases = cases
        self.samples = {case: {name: list[int]() for name in POOL_SYSTEMS} for case in cases}
        self.requests = {case: {name: list[int]() for name in POOL_SYSTEMS} for case in cases}
        self.connects: dict[str, list[int]] = {"pooled": [], "fresh": []}
        self.missed: dict[tuple[str, bool], list[int]] = {case: [] for case in cases}
        self.misses: list[Json] = []
        self.failed: dict[tuple[tuple[str, bool], str], Json] = {}
        self.primes: list[Json] = []  # the sessions of _pool_prime

    def add(
        self, case: tuple[str, bool], name: str, first: int, request: int, connect: int = 0
    ) -> None:
        self.samples[case][name].append(first)
        self.requests[case][name].append(request)
        if name in self.connects:
            self.connects[name].append(connect)

    def miss(self, case: tuple[str, bool], run: int, outcomes: dict[str, int], first: int) -> None:
        self.missed[case].append(first)
        self.misses.append(
            {
                "service": case[0],
                "mount": mount_key(case[1]),
                "run": run,
                "takes": outcomes,
                "first_response_ms": round(first / 1e6, 3),
            }
        )

    def hits(self) -> int:
        return sum(len(self.samples[case]["pooled"]) for case in self.cases)

    def figures(self) -> tuple[Json, Json, Json]:
        """Per case (by service, then mount), all services together (by mount), and hits."""
        per_case: Json = {}
        for case in self.cases:
            samples = self.samples[case]
            figures: Json = {
                name: self.failed.get((case, name)) or with_intervals(samples[name])
                for name in POOL_SYSTEMS
            }
            figures["first_request"] = {
                name: summarize(values) for name, values in self.requests[case].items()
            }
            missed = self.missed[case]
            figures["pooled_misses"] = summarize(missed) if missed else {"n": 0}
            figures["pooled_vs_fresh"] = compare(samples, "pooled", "fresh")
            figures["pooled_vs_floor"] = compare(samples, "pooled", "docker_run_floor")
            per_case.setdefault(case[0], {})[mount_key(case[1])] = figures
        together: Json = {}
        for mounted in sorted({mounted for _, mounted in self.cases}):
            merged = {
                name: [
                    ns
                    for case in self.cases
                    if case[1] == mounted
                    for ns in self.samples[case][name]
                ]
                for name in POOL_SYSTEMS
            }
            together[mount_key(mounted)] = {
                **{name: with_intervals(values) for name, values in merged.items()},
                "pooled_vs_fresh": compare(merged, "pooled", "fresh"),
            }
        together["ws_connect"] = {name: summarize(values) for name, values in self.connects.items()}
        hits = {
            "hits": self.hits(),
            "misses": len(self.misses),
            "missed": self.misses[:20],
            "shape_switches": self.primes,
        }
        return per_case, together, hits


class RefillWatch:
    """Beside the calls of a refill phase, in both phases (so that the harness does the same
    work): reads the pooled orchestrator's log for POOL_SERVICE containers made ready and
    follows each until its server has started (its CPU use stops, as in PoolSystem.booting).

    When ``refilling``, it keeps POOL_PARALLEL_STARTS refills under way all the time: a refill
    is under way from the take that causes it until the new container's server is idle, and
    whenever fewer are, it takes a pooled container: a session, initialized, held until
    ``release``, then closed (the removals fall outside the measurement)."""

    def __init__(self, harness: Harness, pooled: PoolSystem, *, refilling: bool) -> None:
        self.harness = harness
        self.pooled = pooled
        self.refilling = refilling
        self.tail = engine.LogTail(pooled.orch.log_path)
        self.release = trio.Event()
        self.takes = 0  # sessions started to take a pooled container
        self.taken = 0  # of which initialized
        self.ready = 0  # containers made ready while the calls ran
        self.booted = 0  # containers whose server finished starting while the calls ran
        self.measuring = False
        self._ready_seen = 0
        # Container (id prefix, as logged) → (made ready, last look, CPU ns at the last look).
        self._booting: dict[str, tuple[float, float, int | None]] = {}
        self.errors: list[str] = []

    async def run(
        self,
        holders: trio.Nursery,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        started = False
        while True:
            now = trio.current_time()
            for event in self.tail.read():
                if (
                    event.get("event") == "pooled_container_ready"
                    and event.get("service") == POOL_SERVICE
                ):
                    self._ready_seen += 1
                    self.ready += 1 if self.measuring else 0
                    container = str(event.get("container"))
                    self._booting[container] = (now, now, engine.container_cpu_ns(container))
            self._follow_boots(now)
            under_way = self.takes - self._ready_seen + len(self._booting)
            while self.refilling and under_way < POOL_PARALLEL_STARTS:
                self.takes += 1
                under_way += 1
                holders.start_soon(self._hold)
            if not started:
                started = True
                task_status.started()
            await trio.sleep(0.05)

    def _follow_boots(self, now: float) -> None:
        for container, (ready, looked, cpu) in list(self._booting.items()):
            if now - looked < POOL_IDLE_SECONDS:
                continue
            current = engine.container_cpu_ns(container)
            if current is None or cpu is None:  # no cgroup accounting: the time rule
                done = now - ready >= POOL_BOOT_SECONDS
            else:
                done = current - cpu < POOL_IDLE_CPU_NS
            if done:
                del self._booting[container]
                self.booted += 1 if self.measuring else 0
            else:
                self._booting[container] = (ready, now, current)

    async def _hold(self) -> None:
        """A session on POOL_SERVICE (it takes a pooled container), held until ``release``."""
        try:
            async with initialized(self.harness.pool_ws(self.pooled, POOL_SERVICE)):
                self.taken += 1
                await self.release.wait()
        except FAILURES as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])


class PoolSystem:
    """An orchestrator of the warm pool part and the pool it keeps (``warm``: per service)."""

    def __init__(self, name: str, orch: engine.Orchestrator, warm: dict[str, int]) -> None:
        self.name = name
        self.orch = orch
        self.warm = warm
        self.tail = engine.LogTail(orch.log_path, from_start=True)
        self.last_ready = -1e9  # when the harness saw the newest pooled_container_ready
        self.cpu: tuple[float, dict[str, int]] | None = None  # (when, CPU ns per container)
        self.mounted: dict[str, bool] = {}  # per service: whether its last session had a mount

    @property
    def pooled_total(self) -> int:
        return sum(self.warm.values())

    def booting(self, containers: list[str]) -> bool:
        """Whether a server of ``containers`` (this orchestrator's) may still be starting: one
        used CPU since the last look at least POOL_IDLE_SECONDS ago (or is new since), or,
        where the cgroups cannot be read, a pooled container was made ready less than
        POOL_BOOT_SECONDS ago."""
        now = trio.current_time()
        if any(event.get("event") == "pooled_container_ready" for event in self.tail.read()):
            self.last_ready = now
        usage = {container: engine.container_cpu_ns(container) for container in containers}
        known = {container: ns for container, ns in usage.items() if ns is not None}
        if len(known) != len(usage):
            return now - self.last_ready < POOL_BOOT_SECONDS
        if self.cpu is not None and now - self.cpu[0] < POOL_IDLE_SECONDS:
            return True  # too soon to tell: compared with that older look next time
        previous, self.cpu = self.cpu, (now, known)
        return previous is None or any(
            ns - previous[1].get(container, -POOL_IDLE_CPU_NS) >= POOL_IDLE_CPU_NS
            for container, ns in known.items()
        )

    async def ready(self) -> dict[str, int]:
        """Ready pooled containers per service of ``warm`` (metrics)."""
        samples = (await self.orch.metrics()).get("reactor_fabric_pooled_containers", [])
        found = {labels.get("service", ""): int(value) for labels, value in samples}
        return {service: found.get(service, 0) for service in self.warm}

    async def takes(self, service: str) -> dict[str, float]:
        """``reactor_fabric_pool_takes_total`` of ``service`` by outcome."""
        samples = (await self.orch.metrics()).get("reactor_fabric_pool_takes_total", [])
        return {
            labels.get("outcome", "?"): value
            for labels, value in samples
            if labels.get("service") == service
        }

    async def session_containers(self) -> int:
        """This orchestrator's containers less its ready pooled ones (so a pooled container
        being started counts until it is ready)."""
        count = await self.orch.container_count()
        if not self.warm:
            return count
        return count - sum((await self.ready()).values())


async def idle_rss_mb(orch: engine.Orchestrator, *, bound: float = 30.0) -> float:
    """``orch``'s VmRSS (MB) once it is idle: its CPU time grew by under 10 ms in half a
    second (the start-up's catalog and index are done), or after ``bound`` seconds."""
    with trio.move_on_after(bound):
        before = engine.cpu_seconds(orch.pid)
        while True:
            await trio.sleep(0.5)
            now = engine.cpu_seconds(orch.pid)
            if now - before < 0.01:
                break
            before = now
    await trio.sleep(0.5)
    return round(rss_kib(orch.pid)["VmRSS"] / 1024, 1)


def machine_memory_used_mb() -> float:
    """The machine's memory in use (MemTotal less MemAvailable), MB."""
    fields: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            key, _, value = line.partition(":")
            fields[key] = int(value.split()[0])
    return round((fields["MemTotal"] - fields["MemAvailable"]) / 1024, 1)


def local_port(rpc: Rpc) -> int | None:
    """The local TCP port of a WebSocket client (None for other clients)."""
    if isinstance(rpc, StreamRpc) and isinstance(rpc.stream, WebSocketStream):
        port = getattr(rpc.stream.ws.local, "port", None)
        return port if isinstance(port, int) else None
    return None


def split_by_pooled(ports: list[tuple[int | None, int]], audit: list[Json]) -> Json:
    """First responses of a burst's clients, split by whether their session got a pooled
    container: the audit trail's ``session_start`` names each session's peer (the client's
    port), its ``container_start`` says ``pooled``."""
    session_of: dict[int, str] = {}
    pooled_of: dict[str, bool] = {}
    for record in audit:
        if record.get("event") == "session_start":
            peer = str(record.get("client", {}).get("peer", ""))
            port = peer.rpartition(":")[2]
            if port.isdigit():
                session_of[int(port)] = str(record.get("session"))
        elif record.get("event") == "container_start":
            pooled_of[str(record.get("session"))] = bool(record.get("pooled"))
    split: dict[str, list[int]] = {"pooled": [], "fresh": [], "unknown": []}
    for port, first_ns in ports:
        pooled = pooled_of.get(session_of.get(port, "")) if port is not None else None
        split["unknown" if pooled is None else "pooled" if pooled else "fresh"].append(first_ns)
    return {
        "first_response_pooled": summarize(split["pooled"]),
        "first_response_fresh": summarize(split["fresh"]),
        "first_response_unmatched": len(split["unknown"]),
    }


def between(start: str, end: str) -> int:
    """ns from one log timestamp (ISO 8601, ms) to another."""
    parse = datetime.datetime.fromisoformat
    return int((parse(end) - parse(start)).total_seconds() * 1e9)


def mount_key(mounted: bool) -> str:
    return "mount" if mounted else "no_mount"


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    """Counter increments by label (those that moved)."""
    moved = {key: int(value - before.get(key, 0)) for key, value in after.items()}
    return {key: value for key, value in moved.items() if value}


def refill_against_floor(
    ours: list[Json], floor: list[Json], floor_samples: list[dict[str, list[int]]]
) -> Json:
    """The refill part's floor figures: the direct attach's own figures per phase, what the
    refills did to it, and the orchestrator's overhead (ours minus direct, repeat by repeat, at
    P50 and P99) per phase and refilling minus quiet. ``ours`` and ``floor`` are the per-repeat
    summaries by phase; ``floor_samples`` the direct calls by repeat and phase."""
    phases = ("quiet", "refilling")
    out: Json = {"direct": {}, "overhead": {}}
    for phase in phases:
        figures = summarize([ns for r in floor_samples for ns in r[phase]])
        figures["repeats"] = {
            key: spread([r[phase].get(key) for r in floor]) for key in ("p50_ms", "p99_ms")
        }
        out["direct"][phase] = figures
    for key in ("p50", "p99"):
        out[f"direct_difference_{key}_ms"] = spread(
            [difference(r["refilling"], r["quiet"], f"{key}_ms") for r in floor]
        )
        overheads = [
            {phase: difference(o[phase], f[phase], f"{key}_ms") for phase in phases}
            for o, f in zip(ours, floor, strict=True)
        ]
        for phase in phases:
            out["overhead"].setdefault(phase, {})[f"{key}_ms"] = spread(
                [o[phase] for o in overheads]
            )
        out[f"overhead_difference_{key}_ms"] = spread(
            [
                None
                if o["refilling"] is None or o["quiet"] is None
                else round(o["refilling"] - o["quiet"], 3)
                for o in overheads
            ]
        )
    return out


def sum_takes(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for key, value in count.items():
            total[key] = total.get(key, 0) + value
    return total


def make_pool_project() -> tuple[int, int]:
    """A small git repository to mount (under the suite's mount root): one commit and one
    untracked file, POOL_MARKER, that `git status` and a directory listing both show.
    Returns its owner: POOL_PROJECT_OWNER when the harness runs as root, else the harness."""
    shutil.rmtree(POOL_PROJECT, ignore_errors=True)
    POOL_PROJECT.mkdir(parents=True)
    (POOL_PROJECT / "README.md").write_text("A project mounted by the warm pool benchmark.\n")
    git = ["git", "-C", str(POOL_PROJECT), "-c", "user.name=bench", "-c", "user.email=b@localhost"]
    for args in (["init", "-q", "-b", "main"], ["add", "README.md"], ["commit", "-q", "-m", "A"]):
        subprocess.run([*git, *args], check=True, capture_output=True, timeout=60)
    (POOL_PROJECT / POOL_MARKER).write_text("untracked\n")
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    uid, gid = POOL_PROJECT_OWNER
    for root, dirs, files in os.walk(POOL_PROJECT):
        for name in [root, *(os.path.join(root, entry) for entry in dirs + files)]:
            os.lchown(name, uid, gid)
    return uid, gid


async def timed_tool_call(rpc: Rpc, what: str = "tools/call", tool: Json = TOOL) -> int:
    """One ``tools/call`` of ``tool``, bounded and checked: its round trip in ns."""
    with trio.fail_after(CALL_BOUND):
        elapsed, answer = await rpc.call("tools/call", tool)
    check_result(answer, what)
    return elapsed


async def first_request(rpc: Rpc, service: str, mounted: bool) -> int:
    """The first request after the handshake (ns), one that shows the server works; with a
    mount, one that must see the project (POOL_MARKER in `git status` or a listing)."""
    method, params = "tools/call", TOOL
    if service == "everything":
        params = {"name": "echo", "arguments": {"message": "pool"}}
    elif service == "git" and mounted:
        params = {"name": "git_status", "arguments": {"repo_path": "/workspace"}}
    elif service == "filesystem":
        name = "list_directory" if mounted else "list_allowed_directories"
        params = {"name": name, "arguments": {"path": "/workspace"} if mounted else {}}
    elif service != "time":
        method, params = "tools/list", {}
    with trio.fail_after(CALL_BOUND):
        elapsed, answer = await rpc.call(method, params)
    result = check_result(answer, f"{service} {method}")
    if mounted and service in ("git", "filesystem") and POOL_MARKER not in json.dumps(result):
        raise ProtocolError(f"{service} did not see the mounted project: {str(result)[:300]}")
    return elapsed


def pool_log_summary(path: Path) -> Json:
    """What a pool orchestrator's log says: container starts by service (pooled or not), pooled
    containers made ready and removed (why), and every warning or error, by event."""
    events = engine.log_events(path)
    started: dict[str, dict[str, int]] = {}
    removed: dict[str, int] = {}
    problems: dict[str, int] = {}
    examples: list[str] = []
    for event in events:
        kind = event.get("event", "?")
        if kind == "container_started":
            by = started.setdefault(str(event.get("service")), {"pooled": 0, "fresh": 0})
            by["pooled" if event.get("pooled") else "fresh"] += 1
        elif kind == "pooled_container_removed":
            why = str(event.get("why"))
            removed[why] = removed.get(why, 0) + 1
        if event.get("level") in ("warning", "error", "critical"):
            key = f"{event.get('level')}: {kind}"
            problems[key] = problems.get(key, 0) + 1
            if len(examples) < 5:
                examples.append(json.dumps(event)[:400])
    return {
        "container_started": started,
        "pooled_container_ready": sum(
            1 for event in events if event.get("event") == "pooled_container_ready"
        ),
        "pooled_container_removed": removed,
        "warnings_and_errors": problems,
        "examples": examples,
    }


async def pipelined(rpc: StreamRpc, *, total: int, payload: int, tool: str = "echo") -> Json:
    """``total`` echo calls with at most PIPELINE_DEPTH in flight: rate and latency."""
    params = {"name": tool, "arguments": {"message": "x" * payload}}
    # The request is encoded once; each send only splices its id in.
    template = encode_request(0, "tools/call", params)
    head, _, tail = template.partition(b'"id":0')
    window = trio.Semaphore(PIPELINE_DEPTH)
    sent_at: dict[int, int] = {}
    latencies: list[int] = []
    errors: list[str] = []

    async def sender() -> None:
        for _ in range(total):
            await window.acquire()
            request_id = rpc.new_id()
            frame = head + b'"id":%d' % request_id + tail
            sent_at[request_id] = time.perf_counter_ns()
            await rpc.stream.send(frame)

    async def receiver() -> None:
        for _ in range(total):
            answer = await rpc.receive_response()
            latencies.append(time.perf_counter_ns() - sent_at.pop(answer["id"]))
            try:
                result = check_result(answer, "echo")
                text = result["content"][0]["text"]
                if len(text) < payload:
                    errors.append(f"echo answered {len(text)} characters for {payload}")
            except (ProtocolError, KeyError, IndexError, TypeError) as exc:
                errors.append(str(exc)[:200])
            window.release()

    gc.collect()
    begin = time.perf_counter_ns()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        nursery.start_soon(receiver)
    seconds = (time.perf_counter_ns() - begin) / 1e9
    return throughput_figures(errors, latencies, total=total, payload=payload, seconds=seconds)


def throughput_figures(
    errors: list[str], latencies: list[int], *, total: int, payload: int, seconds: float
) -> Json:
    """The figures of one pipelined echo run; a run with a failed call is no figure."""
    if errors:
        raise ProtocolError(f"{len(errors)} echo call(s) failed, e.g. {errors[0]}")
    return {
        "messages": total,
        "payload_bytes": payload,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(total / seconds, 1),
        "mib_per_s": round(total * payload / seconds / 2**20, 2),
        "latency": summarize(latencies),
    }


async def pipelined_http(
    rpcs: list[HttpRpc], *, total: int, payload: int, tool: str = "echo"
) -> Json:
    """``total`` echo calls over HTTP: one POST at a time on each of the connections, so as
    many are in flight as there are connections (HTTP/1.1 has no pipelining clients use)."""
    params = {"name": tool, "arguments": {"message": "x" * payload}}
    remaining = total
    latencies: list[int] = []
    errors: list[str] = []

    async def worker(rpc: HttpRpc) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            elapsed, answer = await rpc.call("tools/call", params)
            latencies.append(elapsed)
            try:
                text = check_result(answer, "echo")["content"][0]["text"]
                if len(text) < payload:
                    errors.append(f"echo answered {len(text)} characters for {payload}")
            except (ProtocolError, KeyError, IndexError, TypeError) as exc:
                errors.append(str(exc)[:200])

    gc.collect()
    begin = time.perf_counter_ns()
    async with trio.open_nursery() as nursery:
        for rpc in rpcs:
            nursery.start_soon(worker, rpc)
    seconds = (time.perf_counter_ns() - begin) / 1e9
    return throughput_figures(errors, latencies, total=total, payload=payload, seconds=seconds)


def summarize_runs(runs: list[Json]) -> Json:
    """Repeats of one throughput figure: rates as ``{median, min, max}``, latency pooled."""
    summary: Json = {
        "messages": runs[0]["messages"],
        "payload_bytes": runs[0]["payload_bytes"],
        "msgs_per_s": spread([run["msgs_per_s"] for run in runs]),
        "mib_per_s": spread([run["mib_per_s"] for run in runs]),
        "latency_p50_ms": spread([run["latency"].get("p50_ms") for run in runs]),
        "latency_p99_ms": spread([run["latency"].get("p99_ms") for run in runs]),
    }
    if "orchestrator_cpu_us_per_call" in runs[0]:
        summary["orchestrator_cpu_us_per_call"] = spread(
            [run["orchestrator_cpu_us_per_call"] for run in runs]
        )
    return summary


def with_intervals(samples_ns: list[int]) -> Json:
    """STATS, plus 95 % bootstrap intervals of P50 and P95."""
    stats = summarize(samples_ns)
    if samples_ns:
        stats["p50_ci_ms"] = list(bootstrap(samples_ns, 0.50))
        stats["p95_ci_ms"] = list(bootstrap(samples_ns, 0.95))
    return stats


def compare(samples: dict[str, list[int]], system: str, floor: str) -> Json:
    """``system`` minus ``floor`` at P50 and P95, with 95 % bootstrap intervals, and ratios."""
    mine, theirs = samples.get(system, []), samples.get(floor, [])
    if not mine or not theirs:
        return {"system": system, "floor": floor, "error": "not measured"}
    a, b = summarize(mine), summarize(theirs)
    return {
        "system": system,
        "floor": floor,
        "difference_p50_ms": difference(a, b, "p50_ms"),
        "difference_p50_ci_ms": list(bootstrap(mine, 0.50, against=theirs)),
        "difference_p95_ms": difference(a, b, "p95_ms"),
        "difference_p95_ci_ms": list(bootstrap(mine, 0.95, against=theirs)),
        "ratio_p50": ratio(a.get("p50_ms"), b.get("p50_ms")),
        "ratio_p95": ratio(a.get("p95_ms"), b.get("p95_ms")),
    }


def overheads(rtt: Json) -> Json:
    """Per relay: its percentile minus its floor's (FLOOR_OF), repeat by repeat, as
    ``{median, min, max}``; Reactor-Fabric also against the `docker run -i` pipe, and each
    peer's median as a multiple of ours."""
    repeats: list[Json] = rtt.get("per_repeat", [])
    out: Json = {}

    def per_repeat(system: str, floor: str, key: str) -> Json:
        return spread([difference(r.get(system, {}), r.get(floor, {}), key) for r in repeats])

    for name, floor in FLOOR_OF.items():
        if not measured(rtt.get(name)) or not measured(rtt.get(floor)):
            error = rtt.get(name, {}).get("error") or f"its floor {floor}: not measured"
            out[name] = {"floor": floor, "error": error}
            continue
        out[name] = {
            "floor": floor,
            "overhead_p50_ms": per_repeat(name, floor, "p50_ms"),
            "overhead_p99_ms": per_repeat(name, floor, "p99_ms"),
        }
        if name in RELAYED:
            for reference in ("docker_run_pipe", "direct"):
                if measured(rtt.get(reference)):
                    out[name][f"against_{reference}"] = {
                        key: per_repeat(name, reference, key) for key in ("p50_ms", "p99_ms")
                    }
    for name, relay in RELAY_OF.items():
        figures, theirs = out.get(name, {}), out.get(relay, {})
        if "overhead_p50_ms" not in figures or "overhead_p50_ms" not in theirs:
            continue
        for key in ("p50", "p99"):
            mine, relayed = figures[f"overhead_{key}_ms"], theirs[f"overhead_{key}_ms"]
            figures[f"ratio_to_relay_{key}"] = ratio(mine.get("median"), relayed.get("median"))
        figures["relay"] = relay
        figures["within_bar"] = all(
            isinstance(figures[f"ratio_to_relay_{key}"], int | float)
            and figures[f"ratio_to_relay_{key}"] <= FABRIC_BAR
            for key in ("p50", "p99")
        )
    ours = out.get("reactor_fabric_ws", {})
    for name in PEERS:
        figures = out.get(name, {})
        if "overhead_p50_ms" not in figures or "overhead_p50_ms" not in ours:
            continue
        for key in ("p50", "p99"):
            theirs, mine = figures[f"overhead_{key}_ms"], ours[f"overhead_{key}_ms"]
            figures[f"ratio_to_reactor_fabric_{key}"] = ratio(
                theirs.get("median"), mine.get("median")
            )
            # Unpaired: our worst repeat beats their best one, each against its own floor.
            figures[f"reactor_fabric_clearly_below_unpaired_{key}"] = bool(
                "max" in mine and "min" in theirs and mine["max"] < theirs["min"]
            )
            # Paired: in every repeat, our percentile is below theirs. The calls of a repeat
            # are interleaved, so the two relays met the same moments of the machine; the
            # difference of their raw percentiles is the difference of their overheads against
            # any one common floor, without a floor's own noise (a P99 of its own) added twice.
            paired = spread(
                [
                    difference(r.get("reactor_fabric_ws", {}), r.get(name, {}), f"{key}_ms")
                    for r in repeats
                ]
            )
            figures[f"paired_difference_{key}_ms"] = paired
            figures[f"reactor_fabric_clearly_below_{key}"] = bool(
                "max" in paired and paired["max"] < 0
            )
    return out


def bundled() -> Json:
    """The bundled suite's MCP tool services. Its specialist agents (``llm_agent``) are left
    out: an agent's call is a model conversation, which needs a model account and is measured
    by nothing here (each would only be refused without one)."""
    loaded: Json = yaml.safe_load(SUITE.read_text())
    loaded["mcp_services"] = {
        name: service
        for name, service in loaded["mcp_services"].items()
        if service.get("service_type") != "llm_agent"
    }
    return loaded


def bundled_services() -> list[str]:
    return list(bundled()["mcp_services"])


def service_image(service: str) -> str:
    return str(bundled()["mcp_services"][service]["image"])


def write_suite(
    path: Path, *, warm: dict[str, int] | None = None, services: Json | None = None
) -> Path:
    """The bundled services with room for the bursts and no idle teardown during a run, and no
    warm pool (``warm: 0`` whatever the bundled suite says): parts 1 to 5 measure fresh
    containers. With ``warm`` (the pool part), each service keeps that many pooled containers
    (0 if not named) and the pool's global settings are written out. ``services``: more
    services (name → fields), e.g. the lifecycles part's copies of `time`."""
    suite = bundled()
    suite["mcp_services"].update(services or {})
    suite["orchestrator"] = {
        "allowed_mount_roots": [f"{TMP}/"],
        "max_sessions": 256,  # the largest burst and memory part hold 200
    }
    if warm is not None:
        suite["orchestrator"]["warm_pool"] = {
            "max_containers": POOL_MAX_CONTAINERS,
            "parallel_starts": POOL_PARALLEL_STARTS,
        }
    for name, service in suite["mcp_services"].items():
        service["timeout"] = "30m"
        service["warm"] = (warm or {}).get(name, 0)
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


DEFINITIONS = {
    "cold_start": "from the moment the client starts connecting to the response to its "
    "`initialize` (the first MCP request; the container starts on it). Reactor-Fabric: "
    "WebSocket connect + `initialize`. Floor: from spawning `docker run -i --rm IMAGE` and "
    "writing `initialize` on its stdin → the response on its stdout. 95 % intervals by the "
    "bootstrap (2,000 resamples, fixed seed).",
    "first_tool_call": "after the handshake, `tools/call get_current_time` → its response, on "
    "the same fresh container.",
    "relay_rtt": "warm container, `tools/call get_current_time {timezone: UTC}`: bytes handed to "
    "the transport → matching response decoded. Systems interleaved, one call each per round in "
    "a rotating order, after a warm-up; the whole measurement is repeated and each figure given "
    "as the median of the repeats with their range.",
    "relay_overhead": "per repeat, a relay's percentile minus the same percentile of its floor: "
    "`direct_socket` (the container's stdin and stdout as its own Unix socket, through the "
    "`fabric-stdio` program the orchestrator starts every container with: no engine process "
    "and no relay on the path) for Reactor-Fabric, which talks to its containers that way; "
    "`direct` (the Docker attach, no relay) is shown as a reference; `docker_run_pipe` (a "
    "`docker run -i` process spoken to over its pipes, no relay) for supergateway and "
    "mcp-proxy, which wrap `docker run -i` and pay that hop themselves. Judged on the median "
    "of the repeats. 'Clearly below' a peer: paired by repeat, our percentile is below theirs "
    "in every repeat (the calls of a repeat are interleaved, so both met the same moments of "
    "the machine, and the difference of raw percentiles is the difference of overheads "
    "against one common floor); also shown unpaired: our worst repeat's overhead below their "
    "best one's, each against its own floor.",
    "fabric": "the fabric endpoint `/mcp?tools=all` (an MCP server of our own over the whole "
    "suite: every message decoded and routed) over WebSocket and Streamable HTTP, calling "
    "`time__get_current_time` (throughput: `everything__echo`), interleaved with the relays "
    "and floors in the same rounds; its overhead against the same floor (`direct_socket`) as a "
    "multiple of the relay's on the same transport, per figure the median of the repeats",
    "startup": "spawn of `python -m reactor_fabric --port 0` → its banner (printed once it "
    "listens, after the engine is reached and the images checked) and → a first `/healthz` "
    "answered; with `warm: 1` for every bundled service also → every pool full (the log's "
    "`pooled_container_ready`). The two suites alternate; each run waits for a quiet engine; "
    "each suite's orchestrator keeps its state directory from run to run (a user's restart: "
    "the catalog comes from the cache after the first run)",
    "percentiles": "nearest rank (an observed sample), over all measured calls",
    "throughput": "one session, `echo` on the everything image, 16 requests in flight "
    "(WebSocket and stdio: pipelined on one connection; Streamable HTTP: one POST at a time on "
    "each of 16 keep-alive connections of the session); calls/s = calls answered / wall time; "
    "MiB/s counts the payload one way; each figure repeated, median and range",
    "memory": "orchestrator: VmRSS of its process, on an orchestrator started for the part "
    "(idle once its CPU time stops growing, i.e. the catalog learned and indexed; then N "
    "WebSocket sessions on `time`, each initialized with its container, opened 8 at a time and "
    "held; per added session = (RSS with N minus idle) / N); the main orchestrator's idle and "
    "after-load figures apart; containers: cgroup memory usage less inactive page cache, after "
    "`initialize` (what `docker stats` shows)",
    "concurrency": "N clients released at once; first response = connect → initialize "
    "response; each holds its session until all have answered; containers_left = containers of "
    "this orchestrator 60 s after every client closed; sessions/s = sessions answered / wall "
    "time of the burst; machine memory = MemTotal less MemAvailable just before the burst and "
    "when every client has answered. docker_run_floor: the same burst of "
    "`docker run -i --rm` processes (spawn → initialize response). warm_pool: the same burst "
    "against an orchestrator whose `time` keeps BURST_POOL_WARM warm containers (full before "
    "each burst; 120 s for its containers to go)",
    "pool": "orchestrators of the same suite side by side: `fresh` (`warm: 0`, today's cold "
    "start), `pooled` (`warm: 1` for each service of the cold-start part) and `pooled_burst` "
    "(`warm: N` on `time` only); max_containers 16, parallel_starts 2. Cold start: connect → "
    "`initialize` response over WebSocket, each bundled service without and then with a mount "
    "(`?mount=` of a small git repository at /workspace, owned by an ordinary user); pooled, "
    "fresh and `docker run -i --rm [-v PROJECT:/workspace --user OWNER]` in an order rotating "
    "per case and run. Every sample waits until every pool is full, no other container of ours "
    "is left, and no container's server is still starting (the pool calls a container ready "
    "once it has started: the harness waits until the containers' cgroup CPU time stops "
    "growing). A pooled sample counts only if `reactor_fabric_pool_takes_total` moved by exactly "
    "one hit; a miss is reported apart. The pool keeps containers of the account its service "
    "was last asked for (with a mount, the project's owner; without, nobody): where a service "
    "switches, one session that is no sample goes first. The first request after the handshake "
    "must see the project when mounted. Burst: N `time` clients at once against `pooled_burst` "
    "and `fresh`; containers left = the orchestrator's containers less its ready pooled ones, "
    "up to 120 s after. Refill: one established `time` session, `tools/call get_current_time` "
    "one at a time, in phases `quiet` (nothing starting) and `refilling` (2 refills under way "
    "all the time: a pooled container is taken whenever fewer are; a refill lasts from the take "
    "until the new container's server has started; taken sessions are held and closed after "
    "the phase), order rotating per repeat; the harness watches the log in both phases; each "
    "call is paired with the same call on a container of the same image spoken to directly over "
    "its own socket (the floor, `direct_socket`), the first of each pair alternating",
    "lifecycles": "one orchestrator whose suite adds copies of `time`: `time-fresh` "
    "(`fresh_per_call`, `warm: 1`: on /mcp its pooled containers are greeted while they wait), "
    "`time-fresh-cold` (`fresh_per_call`, `warm: 0`) and `time-relay-fresh` (`fresh_per_call`, "
    "`warm: 1`, for the relay, whose sessions take only containers not greeted); `time` itself "
    "is `reuse_per_session`. One Streamable HTTP session on `/mcp?tools=all` calls "
    "`{service}__get_current_time` (reused: `time`, its container started by a warm-up call; "
    "fresh_pooled; fresh_unpooled), one on `/mcp/time` (relay_reused) and one on "
    "`/mcp/time-relay-fresh` (relay_fresh_pooled): the call's round trip. "
    "docker_run_per_call: `docker run -i --rm` with the options the orchestrator gives `time`, "
    "spawn → `initialize` → the call's response (the exit, container removed, reported apart). "
    "direct_first_call: a `time` container the benchmark starts itself with `fabric-stdio` (no "
    "orchestrator), initialized and left until the engine is quiet, then its first call: what "
    "a fresh server's first call costs by itself. "
    "Every system once per round, in an order rotating each round; each sample on a quiet "
    "engine (the pools full and their servers started, no per-call container left). A pooled "
    "sample counts only if the pool's takes moved by exactly one hit and, on /mcp, the call's "
    "container was one the pool greeted (`backend_greeted_by_pool`); others are misses, "
    "reported apart; of those on /mcp, the log's moments from the call's arrival "
    "(`per_call_container`) to its container handed out (`backend_greeted_by_pool`), ms "
    "resolution. Added latency: fresh minus reused, paired by round (its P50 and P95), "
    "and unpaired (difference of percentiles, bootstrap intervals). Ratios: of P50s (and "
    "P95s) over every sample, and repeat by repeat",
}


def not_run(section: str, reason: str) -> Json:
    """The shape of a section that was not run, every figure keeping its key."""
    error = {"error": reason}
    shapes: dict[str, Json] = {
        "cold_start": {"reactor_fabric": error, "docker_run_floor": error},
        "relay_rtt": dict.fromkeys(RELAY_SYSTEMS, error),
        "throughput": {
            "direct_socket": error,
            "direct": error,
            "reactor_fabric_ws": error,
            "reactor_fabric_http": error,
            **dict.fromkeys(FABRIC, error),
        },
        "memory": {
            "orchestrator_100_sessions": error,
            "orchestrator_200_sessions": error,
            "containers": error,
        },
        "concurrency": {f"clients_{count}": error for count in FULL.bursts},
        "pool": {"cold_start": error, "burst": error, "refill": error},
        "lifecycles": {"systems": dict.fromkeys(lifecycles.SYSTEMS, error)},
        "startup": dict.fromkeys(STARTUP_SYSTEMS, error),
    }
    return shapes[section]


def new_results(plan: Plan) -> Json:
    return {
        "machine": engine.machine_info(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": (
            "smoke"
            if plan.smoke
            else ("full" if set(plan.sections) == set(SECTIONS) else "partial")
        ),
        "plan": {
            "sections": list(plan.sections),
            "cold_runs": plan.cold_runs,
            "rtt_warmup": plan.rtt_warmup,
            "rtt_calls": plan.rtt_calls,
            "repeats": plan.repeats,
            "throughput_messages": plan.throughput_messages,
            "memory_sessions": list(plan.memory_sessions),
            "bursts": list(plan.bursts),
            "pool_cases": [[service, mount_key(mounted)] for service, mounted in plan.pool_cases],
            "pool_runs": plan.pool_runs,
            "pool_burst": plan.pool_burst,
            "pool_burst_warm": plan.pool_burst_warm,
            "pool_refill_calls": plan.pool_refill_calls,
            "pool_refill_repeats": plan.pool_refill_repeats,
            "lifecycle_repeats": plan.lifecycle_repeats,
            "lifecycle_rounds": plan.lifecycle_rounds,
            "startup_runs": plan.startup_runs,
        },
        "definitions": DEFINITIONS,
        "environment": {"start": engine.load_snapshot()},
    }


async def run_sections(harness: Harness, results: Json) -> None:
    plan = harness.plan
    await trio.sleep(1)
    idle = round(rss_kib(harness.orch.pid)["VmRSS"] / 1024, 1)
    say(f"orchestrator idle: {idle} MB")
    results["memory_mb"] = {"orchestrator_idle": idle}
    for section in SECTIONS:
        if section in plan.sections:
            say(f"== {section}")
            # Anything else on the machine (e.g. someone's tests) shows up here.
            results["environment"].setdefault("sections", {})[
                section
            ] = await trio.to_thread.run_sync(engine.load_snapshot, harness.orch.pid)
            figures = await getattr(harness, section)()
        else:
            figures = not_run(section, "not run (--only)")
        if section == "relay_rtt":
            results["relay_rtt"] = figures
            results["relay_overhead"] = overheads(figures)
        elif section == "memory":
            results["memory_mb"].update(figures)
        else:
            results[section] = figures
    if plan.peers and "relay_rtt" in plan.sections:
        results["peer_versions"] = {
            "supergateway": engine.installed_version("supergateway"),
            "mcp_proxy": engine.installed_version("mcp-proxy"),
        }
    results["diagnostics"] = harness.diagnostics


async def main_async(plan: Plan, results: Json) -> None:
    """Start the orchestrator, run the sections into ``results``, always clean up."""
    suite = write_suite(TMP / "suite.yaml")
    began = time.monotonic()
    with (TMP / "side.log").open("wb") as side_log:
        orch = await engine.start_orchestrator(suite, TMP / "orchestrator.log")
        say(orch.banner)
        harness = Harness(plan, orch, side_log)
        try:
            await run_sections(harness, results)
        finally:
            with trio.CancelScope(shield=True):
                code = await orch.stop()
                results["orchestrator_exit_code"] = code
                results["containers_left_after_stop"] = await trio.to_thread.run_sync(
                    engine.remove_orchestrator_containers, orch.pid
                )
                await trio.to_thread.run_sync(engine.remove_bench_containers)
                results["environment"]["end"] = await trio.to_thread.run_sync(engine.load_snapshot)
    if code != 0:
        harness.problems.append(f"the orchestrator exited with {code} on SIGTERM")
    results["duration_s"] = round(time.monotonic() - began, 1)
    results["harness_problems"] = harness.problems


def write_outputs(results: Json, out_path: Path, doc_path: Path | None) -> int:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2) + "\n")
    say(f"wrote {out_path} ({results['duration_s']} s)")
    if doc_path is not None:
        report.update_document(doc_path, results)
        say(f"updated {doc_path}")
    for line in results["harness_problems"]:
        say(f"harness problem: {line}")
    return 1 if results["harness_problems"] else 0


def _chosen(
    parser: argparse.ArgumentParser, what: str, given: str | None, known: tuple[str, ...]
) -> tuple[str, ...]:
    """The names in the comma-separated ``given`` (all of ``known`` if not given)."""
    if not given:
        return known
    chosen = tuple(name.strip() for name in given.split(",") if name.strip())
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        parser.error(f"unknown {what}(s): {', '.join(unknown)}")
    return chosen


def _plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Plan, bool]:
    """The plan the arguments ask for, and whether it is partial (not the whole run)."""
    base = SMOKE if args.smoke else FULL
    plan = base
    if args.bursts:
        try:
            bursts = tuple(int(part) for part in args.bursts.split(",") if part.strip())
        except ValueError:
            parser.error("--bursts takes comma-separated numbers")
        if not bursts or min(bursts) < 1:
            parser.error("--bursts takes numbers of at least 1")
        plan = dataclasses.replace(plan, bursts=bursts)
    if args.lifecycle_rounds is not None:
        if args.lifecycle_rounds < 1:
            parser.error("--lifecycle-rounds must be at least 1")
        plan = dataclasses.replace(plan, lifecycle_rounds=args.lifecycle_rounds)
    sections = _chosen(parser, "section", args.only, SECTIONS)
    parts = _chosen(parser, "pool part", args.pool_parts, POOL_PARTS)
    plan = dataclasses.replace(plan, sections=sections, pool_parts=parts)
    partial = (
        set(sections) != set(SECTIONS)
        or set(parts) != set(POOL_PARTS)
        or plan.lifecycle_rounds != base.lifecycle_rounds
        or plan.bursts != base.bursts
    )
    return plan, partial


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Reactor-Fabric benchmarks (see docs/BENCHMARKS.md)."
    )
    parser.add_argument("--smoke", action="store_true", help="tiny counts, no peers, < 1 min")
    parser.add_argument(
        "--out",
        type=Path,
        help="results file (default: bench/results.json; smoke and --only: "
        "bench/tmp/results-smoke.json, bench/tmp/results-partial.json)",
    )
    parser.add_argument(
        "--doc",
        type=Path,
        help="Markdown to regenerate (default: docs/BENCHMARKS.md for a "
        "complete full run, none otherwise)",
    )
    parser.add_argument(
        "--only", help=f"comma-separated sections to run, of: {', '.join(SECTIONS)}"
    )
    parser.add_argument(
        "--pool-parts",
        help=f"comma-separated parts of the pool section to run, of: {', '.join(POOL_PARTS)}",
    )
    parser.add_argument(
        "--lifecycle-rounds",
        type=int,
        help="rounds per repeat of the lifecycles section (default: 6; smoke: 1), for a "
        "shorter trial",
    )
    parser.add_argument(
        "--bursts",
        help="comma-separated client counts of the concurrency part (default: 10,50,100,200; "
        "smoke: 2), for a shorter trial",
    )
    args = parser.parse_args(argv)
    plan, partial = _plan(parser, args)
    if args.out:
        out = args.out
    elif args.smoke:
        out = TMP / "results-smoke.json"
    elif partial:
        out = TMP / "results-partial.json"
    else:
        out = REPO / "bench" / "results.json"
    doc = args.doc or (None if args.smoke or partial else REPO / "docs" / "BENCHMARKS.md")
    for service in bundled_services():
        if not engine.image_exists(service_image(service)):
            say(f"image {service_image(service)} is missing: run `make images`")
            return 2
    TMP.mkdir(parents=True, exist_ok=True)
    (TMP / "workspace").mkdir(exist_ok=True)
    engine.remove_bench_containers()  # left over by a run that was killed
    try:
        results = new_results(plan)
        trio.run(main_async, plan, results)
        return write_outputs(results, out, doc)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt) or (
            isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is not None
        )
        if not interrupted:
            raise
        say("interrupted; everything started was removed")
        return 130
    finally:
        with contextlib.suppress(Exception):
            engine.remove_bench_containers()


if __name__ == "__main__":
    sys.exit(main())
