"""The warm pool over the in-memory runtime: hand-out, refill, idle deaths, back-off, image
changes, shutdown, mounts through a staging area that can fail at every step, cancellation.

Deterministic: no sleeps; time-based behaviour runs on trio's autojump clock.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from reactor_fabric import SecurityViolation
from reactor_fabric.config.secrets import ServiceSecrets
from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.config.structs import WarmPool as PoolSettings
from reactor_fabric.policy.container_parts.ownership import (
    LABEL_INSTANCE,
    LABEL_POOLED,
    LABEL_SESSION,
)
from reactor_fabric.policy.container_parts.resources import DEFAULT_CPU_SHARES, POOLED_CPU_SHARES
from reactor_fabric.policy.mount_spec import MountSpec
from reactor_fabric.policy.pinning import PinSet
from reactor_fabric.protocol.warm_pool import IMAGE_CHECK_SECONDS
from reactor_fabric.protocol.warm_pool_health import EARLY_STDOUT_BYTES
from reactor_fabric.runtime.base import ManagedContainer
from reactor_fabric.runtime.memory import MemoryRuntime, MemoryServer, Server, open_memory_runtime
from reactor_fabric.runtime.staging import NotStageable, PropagationMissing, StagedMount
from reactor_fabric.trio.live_container import LiveContainer
from reactor_fabric.trio.serve import Fabric, assemble
from reactor_fabric.trio.session import serve_session
from reactor_fabric.trio.sweeper import containers_to_remove
from reactor_fabric.trio.warm_pool import WarmPool
from tests.fakes import (
    INITIALIZE,
    INITIALIZED,
    MemoryClient,
    request,
    scripted_mcp_server,
    until,
)
from tests.leaks import cancel_at_every_step, cancelled_after
from tests.served import warm_pool_of

IMAGE = "fake/svc:1"


def suite(
    root: Path,
    *,
    warm: int = 2,
    parallel: int = 2,
    max_containers: int = 16,
    user: str | None = None,
    strategy: Any = None,
    refill_hold: str | None = None,  # (none: a take's refill starts at once)
) -> Suite:
    return Suite(
        version="1.0",
        orchestrator=Orchestrator(
            allowed_mount_roots=[str(root)],
            warm_pool=PoolSettings(
                max_containers=max_containers, parallel_starts=parallel, refill_hold=refill_hold
            ),
        ),
        mcp_services={
            "svc": Service(image=IMAGE, warm=warm, user=user, container_strategy=strategy),
            "cold": Service(image="fake/cold:1"),
        },
    )


class FakeStaging:
    """A staging area whose attach can be made to fail (the real one needs root and an engine:
    see the integration tests)."""

    def __init__(self) -> None:
        self.failure: BaseException | None = None
        self.prepared: list[int] = []
        self.attached: list[int] = []
        self.released: list[int] = []
        self.closed = False

    def prepare(self, token: int) -> tuple[MountSpec, ...]:
        self.prepared.append(token)
        return (MountSpec(f"/staging/{token}/0", "/workspace", True, propagation="rslave"),)

    def placement(self, mounts: Sequence[MountSpec]) -> list[tuple[MountSpec, StagedMount]] | None:
        if any(m.target != "/workspace" for m in mounts):
            return None
        return [(m, StagedMount(0, ())) for m in mounts]

    def attach(self, token: int, mounts: Sequence[MountSpec], pins: PinSet, pid: int) -> None:
        if self.failure is not None:
            raise self.failure
        assert not pins.closed
        self.attached.append(token)

    def release(self, token: int) -> None:
        self.released.append(token)

    def close(self) -> None:
        self.closed = True


class Pooled:
    def __init__(self, engine: MemoryRuntime, fabric: Fabric, pool: WarmPool) -> None:
        self.engine = engine
        self.fabric = fabric
        self.pool = pool

    def pooled(self) -> list[MemoryServer]:
        return [s for s in self.engine.alive if s.spec.labels.get(LABEL_POOLED) == "true"]

    async def filled(self, count: int = 2) -> None:
        await until(lambda: self.pool.machine.ready("svc") == count, what=f"{count} ready")

    async def start(self, session: str = "s1", **options: Any) -> Any:
        return await self.fabric.starter.start(
            "svc",
            self.fabric.suite.mcp_services["svc"],
            session_id=session,
            mounts=options.get("mounts", ()),
            sequence=0,
            fields={},
            respawn=False,
            greeted=options.get("greeted", False),
        )

    async def remove(self, container: Any) -> None:
        await self.fabric.starter.remove(LiveContainer(0, container), {}, forget=lambda: None)


async def project_mounts(
    h: Pooled, root: Path, target: str = "/workspace"
) -> tuple[MountSpec, ...]:
    """A project directory below ``root``, validated as the session's mount at ``target``,
    once the pool is full."""
    (root / "project").mkdir(exist_ok=True)
    await h.filled()
    return await h.fabric.starter.validate_mounts(
        [{"source": str(root / "project"), "target": target}]
    )


@asynccontextmanager
async def warm_pool(
    root: Path,
    *,
    server: Server = scripted_mcp_server,
    staging: FakeStaging | None = None,
    secrets: Mapping[str, ServiceSecrets] | None = None,
    **settings: Any,
) -> AsyncIterator[Pooled]:
    async with open_memory_runtime(server) as engine:
        fabric = assemble(suite(root, **settings), runtime=engine, network="none", secrets=secrets)
        pool = warm_pool_of(fabric, staging)
        fabric.starter.pool = pool
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            yield Pooled(engine, fabric, pool)
            nursery.cancel_scope.cancel()
        # The pool has stopped: nothing of it may be left.
        assert engine.alive == []
        assert pool.container_ids() == set()


async def test_a_session_gets_a_pooled_container_whose_server_sees_the_sessions_first_message_first(
    tmp_path: Path,
) -> None:
    async with warm_pool(tmp_path) as h:
        await h.filled()
        assert all(LABEL_SESSION not in server.spec.labels for server in h.pooled())
        oldest = min(h.pooled(), key=lambda server: int(server.name.rsplit("-", 1)[1]))
        client = MemoryClient()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_session, h.fabric, client, "svc", [])
            await client.say(INITIALIZE)
            answer = await client.hear()
            await client.say(INITIALIZED)
            assert answer["result"]["serverInfo"]["name"] == "scripted"
            # The oldest pooled container serves the session; the pool did no handshake with it.
            assert oldest.stdin_lines[0] == json.dumps(INITIALIZE).encode()
            [record] = h.fabric.registry.containers.values()
            assert record.name == oldest.name
            assert record.session in h.fabric.registry.sessions
            # It waited at the lowest CPU weight; now working for a session, it has the usual.
            assert oldest.spec.cpu_shares == POOLED_CPU_SHARES
            await until(lambda: oldest.id in h.engine.cpu_shares, what="the weight restored")
            assert h.engine.cpu_shares[oldest.id] == DEFAULT_CPU_SHARES
            # ...and the pool is refilled behind it.
            await h.filled()
            assert len(h.engine.spawned) == 3
            await client.leave()
        # The session's container went with the session; it never went back to the pool.
        assert oldest.removed
        assert h.fabric.registry.container_count == 0
        assert len(h.pooled()) == 2
        metrics = h.fabric.observer.metrics
        assert metrics.pool_takes.labels("svc", "hit")._value.get() == 1


async def test_a_session_that_registers_has_its_pooled_container_before_its_first_request(
    tmp_path: Path,
) -> None:
    async with warm_pool(tmp_path) as h:
        await h.filled()
        client = MemoryClient()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_session, h.fabric, client, "svc", [])
            await client.say(request(1, "fabric/registerClient", {"mounts": []}))
            registered = await client.hear()
            session = registered["result"]["sessionId"]
            # Speculative start: taken from the pool on registration, no MCP message yet.
            await until(
                lambda: h.fabric.registry.container_count == 1, what="the container started"
            )
            [record] = h.fabric.registry.containers.values()
            assert record.session == session
            assert h.engine.servers[record.name].spec.labels[LABEL_POOLED] == "true"
            assert h.engine.servers[record.name].stdin_lines == []
            await client.leave()


async def test_a_service_without_warm_and_an_empty_pool_start_fresh_containers(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with warm_pool(tmp_path, warm=1) as h:
        h.engine.fault("create", delay=5.0, only=lambda spec: LABEL_POOLED in spec.labels)
        container = await h.start()  # the pooled one is still starting
        assert LABEL_POOLED not in h.engine.servers[container.name].spec.labels
        assert h.engine.servers[container.name].spec.cpu_shares is None
        await h.remove(container)
        metrics = h.fabric.observer.metrics
        assert metrics.pool_takes.labels("svc", "empty")._value.get() == 1
        cold = await h.fabric.starter.start(
            "cold",
            h.fabric.suite.mcp_services["cold"],
            session_id="s2",
            mounts=(),
            sequence=0,
            fields={},
            respawn=False,
        )
        assert cold.name.startswith("rf-cold-s2")
        await h.remove(cold)


async def test_a_pooled_server_that_dies_idle_is_removed_never_handed_out_and_backs_off(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def dies_at_once(container: MemoryServer) -> None:
        await container.write_stderr(b"cannot start: missing configuration\n")
        await container.exit(1)

    async with warm_pool(tmp_path, server=dies_at_once, warm=1) as h:
        await trio.sleep(60)
        # 1 + 2 + 4 + 8 + 16 seconds of back-off between starts: six in a minute, not thousands.
        assert 5 <= len(h.engine.spawned) <= 7
        assert h.pool.machine.ready("svc") == 0
        container = await h.start()
        assert LABEL_POOLED not in h.engine.servers[container.name].spec.labels
        await h.remove(container)


async def test_output_a_pooled_server_wrote_before_any_input_reaches_its_session_first(
    tmp_path: Path,
) -> None:
    banner = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "up"}}

    async def talks_first(container: MemoryServer) -> None:
        await container.write_stdout(json.dumps(banner).encode() + b"\n")
        await scripted_mcp_server(container)

    async with warm_pool(tmp_path, server=talks_first, warm=1) as h:
        await h.filled(1)
        await trio.testing.wait_all_tasks_blocked()
        client = MemoryClient()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_session, h.fabric, client, "svc", [])
            await client.say(INITIALIZE)
            heard = [await client.hear(), await client.hear()]
            assert heard[0] == banner
            assert heard[1]["result"]["serverInfo"]["name"] == "scripted"
            await client.leave()


async def test_a_service_whose_suite_names_the_user_hands_its_first_pooled_container_out(
    tmp_path: Path,
) -> None:
    # Its containers are alike whatever the session's account: none is retired for another.
    async with warm_pool(tmp_path, user="1000:1000") as h:
        await h.filled()
        container = await h.start()
        spec = h.engine.servers[container.name].spec
        assert spec.labels.get(LABEL_POOLED) == "true"
        assert spec.user == "1000:1000"
        await h.remove(container)
        metrics = h.fabric.observer.metrics
        assert metrics.pool_takes.labels("svc", "hit")._value.get() == 1
        assert metrics.pool_takes.labels("svc", "shape")._value.get() == 0


async def test_a_pooled_server_that_writes_too_much_before_any_input_is_removed_not_handed_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def chatters(container: MemoryServer) -> None:
        note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * 900}}
        for _ in range(EARLY_STDOUT_BYTES // 900 + 2):
            await container.write_stdout(json.dumps(note).encode() + b"\n")
        await scripted_mcp_server(container)

    async with warm_pool(tmp_path, server=chatters, warm=1) as h:
        await until(
            lambda: any(
                r.message == "pooled_container_ended"
                and getattr(r, "why", None) == "output_before_input"
                for r in caplog.records
            ),
            what="the chatty one removed",
        )
        first = h.engine.servers[h.engine.spawned[0].name]
        await until(lambda: first.removed, what="removed")
        container = await h.start()
        assert container.name != first.name
        await h.remove(container)


async def test_a_rebuilt_image_retires_the_pooled_containers_of_the_old_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with warm_pool(tmp_path) as h:
        await h.filled()
        old = {server.id for server in h.pooled()}
        h.engine.image_ids[IMAGE] = "memory:rebuilt"
        await trio.sleep(IMAGE_CHECK_SECONDS + 1)
        await h.filled()
        assert {server.id for server in h.pooled()}.isdisjoint(old)


async def test_a_per_call_service_refused_for_its_secrets_keeps_no_pooled_container(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Each of its starts would fail: the pool neither starts one nor follows its takes.
    refused = {"svc": ServiceSecrets(problems=("GITHUB_TOKEN is not set",))}
    async with warm_pool(tmp_path, strategy=PER_CALL, secrets=refused) as h:
        await trio.sleep(IMAGE_CHECK_SECONDS + 1)
        assert h.pool.machine.services == frozenset()
        assert h.pooled() == []
        assert h.engine.spawned == []


async def test_on_shutdown_pooled_containers_go_and_sessions_start_fresh_ones(
    tmp_path: Path,
) -> None:
    async with warm_pool(tmp_path) as h:
        await h.filled()
        h.fabric.registry.stopping.set()
        await until(lambda: not h.pooled(), what="the pool emptied")
        spawned = len(h.engine.spawned)
        container = await h.start()
        assert LABEL_POOLED not in h.engine.servers[container.name].spec.labels
        await h.remove(container)
        await trio.testing.wait_all_tasks_blocked()
        assert len(h.engine.spawned) == spawned + 1  # no refill


async def test_a_session_mount_is_attached_to_a_pooled_container_and_released_with_it(
    tmp_path: Path,
) -> None:
    staging = FakeStaging()
    async with warm_pool(tmp_path, staging=staging) as h:
        mounts = await project_mounts(h, tmp_path)
        container = await h.start(mounts=mounts)
        [token] = staging.attached
        assert container.name.endswith(f"-{token}")
        assert staging.released == []
        await h.remove(container)
        assert staging.released == [token]
    assert staging.closed


async def test_mounts_the_staging_area_cannot_take_get_a_fresh_container(
    tmp_path: Path,
) -> None:
    staging = FakeStaging()
    async with warm_pool(tmp_path, staging=staging) as h:
        mounts = await project_mounts(h, tmp_path, "/projects/p")
        container = await h.start(mounts=mounts)
        assert LABEL_POOLED not in h.engine.servers[container.name].spec.labels
        await h.remove(container)
        assert h.pool.machine.ready("svc") == 2  # none was taken
        assert h.fabric.observer.metrics.pool_takes.labels("svc", "mounts")._value.get() == 1


@pytest.mark.parametrize(
    "failure",
    [NotStageable("a file where the container has a directory"), OSError(1, "EPERM")],
)
async def test_a_pooled_container_whose_mounts_cannot_be_attached_is_removed_and_a_fresh_one_starts(
    tmp_path: Path, failure: BaseException
) -> None:
    staging = FakeStaging()
    staging.failure = failure
    async with warm_pool(tmp_path, staging=staging) as h:
        mounts = await project_mounts(h, tmp_path)
        container = await h.start(mounts=mounts)
        spec = h.engine.servers[container.name].spec
        assert LABEL_POOLED not in spec.labels
        assert spec.mounts == mounts  # the fresh container got the session's mounts
        await until(lambda: len(h.pooled()) == 2, what="the failed one replaced")
        await h.remove(container)
        assert h.pool.staging is staging  # still used for the next session


async def test_when_mounts_do_not_propagate_the_pool_stops_attaching_them(
    tmp_path: Path,
) -> None:
    staging = FakeStaging()
    staging.failure = PropagationMissing("engine elsewhere", reason="propagation_missing")
    async with warm_pool(tmp_path, staging=staging) as h:
        mounts = await project_mounts(h, tmp_path)
        container = await h.start(mounts=mounts)
        assert LABEL_POOLED not in h.engine.servers[container.name].spec.labels
        await h.remove(container)
        assert h.pool.staging is None
        again = await h.start("s2", mounts=mounts)  # not even tried
        assert LABEL_POOLED not in h.engine.servers[again.name].spec.labels
        await h.remove(again)
        assert h.fabric.observer.metrics.pool_takes.labels("svc", "mounts")._value.get() == 1


async def test_a_pooled_container_that_did_not_get_the_pinned_directory_is_refused_like_a_fresh_one(
    tmp_path: Path,
) -> None:
    staging = FakeStaging()
    staging.failure = SecurityViolation("not the pinned one", reason="mount_changed")
    async with warm_pool(tmp_path, staging=staging) as h:
        mounts = await project_mounts(h, tmp_path)
        before = _open_descriptors()
        with pytest.raises(SecurityViolation) as refused:
            await h.start(mounts=mounts)
        assert refused.value.reason == "mount_changed"
        await until(lambda: len(h.pooled()) == 2, what="the refused one replaced")
        assert h.fabric.registry.container_count == 0
        assert _open_descriptors() <= before  # the pins were closed


async def test_cancelling_a_start_that_takes_from_the_pool_at_every_step_leaks_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "project").mkdir()

    async def run(steps: int) -> int:
        staging = FakeStaging()
        async with warm_pool(tmp_path, staging=staging) as h:
            await h.filled()
            mounts = await h.fabric.starter.validate_mounts(
                [{"source": str(tmp_path / "project"), "target": "/workspace"}]
            )
            started: list[Any] = []

            async def work() -> None:
                started.append(await h.start(mounts=mounts))

            left = await cancelled_after(steps, work)
            for container in started:
                await h.remove(container)
            await trio.testing.wait_all_tasks_blocked()
            assert h.fabric.registry.container_count == 0
            # Whatever was taken is removed, and its staging released.
            taken = set(staging.prepared) - {int(s.name.rsplit("-", 1)[1]) for s in h.pooled()}
            assert set(staging.released) >= taken & set(staging.attached)
            assert len(h.pooled()) == 2 or h.pool.machine.starting
        return left

    assert await cancel_at_every_step(run) > 5


async def test_a_hand_outs_refill_waits_for_the_hold_then_starts_at_its_end(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with warm_pool(tmp_path, warm=1, refill_hold="2s") as h:
        await h.filled(1)
        taken_at = trio.current_time()
        container = await h.start()
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        # Held: nothing starts beside the session's first calls (alive: its container only).
        assert len(h.pooled()) == 1
        assert not h.pool.machine.starting
        await trio.sleep_until(taken_at + 1.9)
        assert not h.pool.machine.starting
        assert len(h.pooled()) == 1
        await trio.sleep_until(taken_at + 2.0)  # (the pool's Tick at the hold's end)
        await h.filled(1)
        await h.remove(container)


async def test_a_bug_in_a_pool_task_is_logged_and_goes_no_further(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # With a staging area, so that a pooled start asks for the container's pid.
    async with warm_pool(tmp_path, warm=1, staging=FakeStaging()) as h:
        await h.filled(1)
        # Anything but the product's errors (a bug), raised where a pooled start goes on.
        h.engine.fault("pid", error=RuntimeError("a bug"))
        container = await h.start()  # takes the ready one; its refill meets the bug
        await until(
            lambda: any(r.message == "pool_task_failed" for r in caplog.records),
            what="the bug logged",
        )
        await h.remove(container)
        second = await h.start("s2")  # sessions go on (a fresh container)
        await h.remove(second)


def test_the_sweeper_leaves_pooled_containers_alone_but_not_strays_of_this_instance() -> None:

    containers = [
        ManagedContainer(
            "pooled", "rf-svc-pool-1", {LABEL_INSTANCE: "me", LABEL_POOLED: "true"}, 1.0
        ),
        ManagedContainer(
            "stray", "rf-svc-pool-2", {LABEL_INSTANCE: "me", LABEL_POOLED: "true"}, 1.0
        ),
    ]
    doomed = containers_to_remove(
        containers,
        instance_id="me",
        this_host="h",
        live_sessions=set(),
        live_containers={"pooled"},
        now=1000.0,
    )
    assert doomed == [("stray", "no_live_session")]


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


PER_CALL = "fresh_per_call"


async def ask(container: Any, request_id: int, method: str, params: dict[str, Any]) -> Any:
    """Send one request to a started container, read its first line of output back."""
    await container.stdin.send_all(json.dumps(request(request_id, method, params)).encode() + b"\n")
    data = b""
    while b"\n" not in data:
        data += await container.stdout.receive_some(65536)
    return json.loads(data.split(b"\n", 1)[0])


async def greeted_one_ready(h: Pooled) -> None:
    """Once a fabric session took a per-call service's container, its refill is greeted."""
    await h.filled()
    await until(
        lambda: any(len(server.stdin_lines) == 2 for server in h.pooled()),
        what="a greeted container ready",
    )


async def test_a_per_call_services_pooled_containers_are_greeted_while_they_wait(
    tmp_path: Path,
) -> None:
    async with warm_pool(tmp_path, strategy=PER_CALL) as h:
        await h.filled()
        # At first they are not (no fabric session asked yet): the session greets it itself.
        first = await h.start(greeted=True)
        assert first.greeting is None
        assert h.engine.servers[first.name].stdin_lines == []
        await h.remove(first)
        await greeted_one_ready(h)
        [greeted] = [s for s in h.pooled() if s.stdin_lines]
        initialize, initialized = (json.loads(line) for line in greeted.stdin_lines)
        assert initialize["method"] == "initialize"
        assert set(initialize["params"]["capabilities"]) == {"roots", "sampling", "elicitation"}
        assert initialized["method"] == "notifications/initialized"
        # A fabric per-call backend takes it first: its InitializeResult comes with it, and
        # its stdout starts after the answer the pool read (the call's answer comes first).
        container = await h.start(greeted=True)
        assert container.name == greeted.name
        assert json.loads(container.greeting)["serverInfo"]["name"] == "scripted"
        answer = await ask(container, 5, "tools/call", {"name": "echo", "arguments": {"a": 1}})
        assert answer["id"] == 5
        assert [json.loads(line)["method"] for line in greeted.stdin_lines] == [
            "initialize",
            "notifications/initialized",
            "tools/call",
        ]
        await h.remove(container)
        # A session that replays its own initialize (the relay's) gets one not greeted.
        relay = await h.start()
        assert h.engine.servers[relay.name].spec.labels.get(LABEL_POOLED) == "true"
        assert h.engine.servers[relay.name].stdin_lines == []
        assert getattr(relay, "greeting", None) is None
        await h.remove(relay)
        metrics = h.fabric.observer.metrics
        assert metrics.pool_takes.labels("svc", "hit")._value.get() == 3


async def test_a_greeted_pooled_container_gets_its_full_cpu_weight_before_anyone_takes_it(
    tmp_path: Path,
) -> None:
    async with warm_pool(tmp_path, strategy=PER_CALL) as h:
        await h.filled()
        await h.remove(await h.start(greeted=True))  # a fabric take: refills are greeted
        await greeted_one_ready(h)
        [greeted] = [s for s in h.pooled() if s.stdin_lines]
        # Started at the lowest weight; greeted, its server waits idle: the weight is back
        # while it waits, so that the call which takes it runs at full weight at once.
        assert greeted.spec.cpu_shares == POOLED_CPU_SHARES
        await until(lambda: greeted.id in h.engine.cpu_shares, what="the weight restored")
        assert h.engine.cpu_shares[greeted.id] == DEFAULT_CPU_SHARES
        # (a container not greeted keeps the lowest weight until it is handed out)
        assert all(s.id not in h.engine.cpu_shares for s in h.pooled() if not s.stdin_lines)
        container = await h.start(greeted=True)
        assert container.name == greeted.name
        await h.remove(container)


def refuses(container: MemoryServer) -> Any:
    return container.write_stdout(
        json.dumps({"jsonrpc": "2.0", "id": 0, "error": {"code": -1, "message": "no"}}).encode()
        + b"\n"
    )


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (lambda container: container.write_stdout(b"Server starting...\n"), "greeting_invalid"),
        (refuses, "greeting_refused"),
        (None, "greeting_timeout"),
    ],
)
async def test_a_pooled_container_failing_its_greeting_is_removed_and_replaced_at_the_refill_rate(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    answer: Any,
    why: str,
) -> None:
    async def fails_its_greeting(container: MemoryServer) -> None:
        await container.read_line()
        if answer is not None:
            await answer(container)
        await trio.sleep_forever()

    async with warm_pool(tmp_path, server=fails_its_greeting, warm=1, strategy=PER_CALL) as h:
        await h.filled(1)
        await h.remove(await h.start(greeted=True))  # a fabric session's: refills are greeted
        await trio.sleep(60)
        # Each removed, logged, and replaced after a back-off: a trickle of starts, no storm.
        assert 5 <= len(h.engine.spawned) <= 8
        assert h.pool.machine.ready("svc") == 0
        failures = [r for r in caplog.records if r.message == "pooled_greeting_failed"]
        assert failures
        assert {r.why for r in failures} == {why}  # type: ignore[attr-defined]
        assert len(h.engine.alive) <= 1
        container = await h.start(greeted=True)
        assert LABEL_POOLED not in h.engine.servers[container.name].spec.labels
        await h.remove(container)


async def test_a_session_mount_is_attached_to_a_greeted_pooled_container(tmp_path: Path) -> None:
    staging = FakeStaging()
    async with warm_pool(tmp_path, staging=staging, strategy=PER_CALL) as h:
        mounts = await project_mounts(h, tmp_path)
        await h.remove(await h.start(mounts=mounts, greeted=True))  # refills are greeted now
        await greeted_one_ready(h)
        container = await h.start(mounts=mounts, greeted=True)
        token = staging.attached[-1]
        assert container.name.endswith(f"-{token}")
        assert container.greeting is not None
        await h.remove(container)
        assert token in staging.released
