"""An agent's child session (issue 38 item 4), on the in-memory runtime: the agent's
container reaches the suite through its fabric socket, with the caller's mounts, only the
services it ``uses``, the parent call's provenance, and nothing once its call is over."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import trio

from reactor_fabric.config.structs import Agents, Limits, Service
from reactor_fabric.policy.container_parts.child_session import CHILD_SOCKET_ENV, CHILD_TOKEN_ENV
from reactor_fabric.policy.container_parts.ownership import LABEL_SERVICE
from reactor_fabric.runtime.child_sockets import ChildSockets
from reactor_fabric.runtime.memory import MemoryServer
from reactor_fabric.trio.child_sessions import serve_child
from tests.fakes import scripted_mcp_server, until
from tests.served import Served, served

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(request_id: int, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments or {}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


class Lines:
    """One JSON-RPC message per line on a stream (the agent's relay's side)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, *messages: dict[str, Any]) -> None:
        await self.stream.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    async def answer_to(self, request_id: int) -> dict[str, Any] | None:
        """The response to ``request_id`` (notifications skipped); None at EOF."""
        while True:
            while b"\n" not in self.buffer:
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.buffer += data
            line, self.buffer = self.buffer.split(b"\n", 1)
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return message  # type: ignore[no-any-return]


async def use_the_suite(container: MemoryServer, token: str) -> dict[str, Any]:
    """What a scripted agent does with its child session: list, call a used service and one
    it does not use."""
    try:
        stream = await container.connect_fabric()
    except OSError:
        return {"no_socket": True}
    lines = Lines(stream)
    try:
        await stream.send_all(
            json.dumps(
                {"jsonrpc": "2.0", "method": "fabric/child", "params": {"token": token}}
            ).encode()
            + b"\n"
        )
        await lines.send(INITIALIZE)
        initialized = await lines.answer_to(1)
        if initialized is None:
            return {"refused": True}
        await lines.send(INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        listed = await lines.answer_to(2)
        assert listed is not None
        await lines.send(call(3, "beta__echo", {"said": "through the child"}))
        used = await lines.answer_to(3)
        await lines.send(call(4, "gamma__echo", {}))
        unused = await lines.answer_to(4)
        return {
            "tools": [tool["name"] for tool in listed["result"]["tools"]],
            "used": used,
            "unused": unused,
        }
    finally:
        await stream.aclose()


async def hold_in_the_suite(container: MemoryServer) -> NoReturn:
    """An agent that calls a tool of its child session that never answers, and waits."""
    stream = await container.connect_fabric()
    lines = Lines(stream)
    token = container.spec.environment[CHILD_TOKEN_ENV]
    line = {"jsonrpc": "2.0", "method": "fabric/child", "params": {"token": token}}
    await stream.send_all(json.dumps(line).encode() + b"\n")
    await lines.send(INITIALIZE)
    await lines.answer_to(1)
    await lines.send(INITIALIZED, call(2, "beta__hold"))
    await lines.answer_to(2)  # never, unless the session ends (None)
    await trio.sleep_forever()


async def say_nothing_after_the_token(container: MemoryServer) -> dict[str, Any]:
    """A relay that opens its child session and then sends nothing: closed by the fabric."""
    stream = await container.connect_fabric()
    token = container.spec.environment[CHILD_TOKEN_ENV]
    line = {"jsonrpc": "2.0", "method": "fabric/child", "params": {"token": token}}
    await stream.send_all(json.dumps(line).encode() + b"\n")
    received = await stream.receive_some(65536)
    await stream.aclose()
    return {"closed": received == b""}


async def agent_or_tool_server(
    container: MemoryServer, *, token: str | None = None, hold: bool = False, mute: bool = False
) -> None:
    """The scripted server for tool services; for the agent's image, an agent whose one tool
    uses its child session (with ``token`` instead of its own when given: a forged one)."""
    if container.spec.image != "fake/agent:1":
        await scripted_mcp_server(container)
        return
    while (line := await container.read_line()) is not None:
        message = json.loads(line)
        if "id" not in message:
            continue
        if message["method"] == "initialize":
            result: Any = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "agent", "version": "1"},
            }
        elif message["method"] == "tools/list":
            result = {"tools": [{"name": "run_task", "inputSchema": {"type": "object"}}]}
        else:
            own = container.spec.environment.get(CHILD_TOKEN_ENV, "")
            if hold:
                await hold_in_the_suite(container)
            if mute:
                seen = await say_nothing_after_the_token(container)
                answer = {"jsonrpc": "2.0", "id": message["id"], "result": _text(seen)}
                await container.write_stdout(json.dumps(answer).encode() + b"\n")
                continue
            seen = await use_the_suite(container, token if token is not None else own)
            result = {"content": [{"type": "text", "text": json.dumps(seen)}]}
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        await container.write_stdout(json.dumps(answer).encode() + b"\n")


# The agents work on the caller's project itself (workspace: shared): these tests are about
# their child sessions (an isolated task's child session on its copy: test_agent_workspaces_e2e).
SERVICES = {
    "agent": Service(
        image="fake/agent:1", service_type="llm_agent", workspace="shared", uses=["beta"]
    ),
    "beta": Service(image="fake/beta:1"),
    "gamma": Service(image="fake/gamma:1"),
}


@asynccontextmanager
async def serving(
    tmp_path: Path,
    *,
    token: str | None = None,
    hold: bool = False,
    mute: bool = False,
    limits: Limits | None = None,
) -> AsyncIterator[Served]:
    server = functools.partial(agent_or_tool_server, token=token, hold=hold, mute=mute)
    async with served(
        tmp_path, server=server, learn_catalog=True, services=SERVICES, limits=limits
    ) as http:
        children = ChildSockets()
        http.runtime.children = children
        await http.nursery.start(children.run, functools.partial(serve_child, http.fabric))
        yield http


async def open_session(http: Served, project: Path) -> Any:
    ws, _ = await http.websocket(f"/mcp?tools=all&mount={project}:/workspace")
    await ws.send_json(INITIALIZE)
    await ws.hear()
    await ws.send_json(INITIALIZED)
    return ws


async def test_an_agent_uses_only_its_services_on_the_callers_project_with_the_calls_provenance(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    async with serving(tmp_path) as http:
        ws = await open_session(http, project)
        await ws.send_json(call(7, "agent__run_task", {"task": "review"}))
        answer = await ws.hear()
        seen = json.loads(answer["result"]["content"][0]["text"])
        # Only the services the agent uses, every tool listed (no discovery needed).
        assert {name.split("__")[0] for name in seen["tools"] if "__" in name} == {"beta"}
        assert "beta__echo" in seen["tools"]
        assert json.loads(seen["used"]["result"]["content"][0]["text"]) == {
            "said": "through the child"
        }
        assert "error" in seen["unused"]  # gamma is the suite's, not the agent's
        specs = {spec.labels[LABEL_SERVICE]: spec for spec in http.runtime.spawned}
        agent, beta = specs["agent"], specs["beta"]
        assert agent.child_fabric
        assert agent.environment[CHILD_SOCKET_ENV] == "/.reactor-fabric/fabric.sock"
        assert "gamma" not in specs
        # The child's container got the caller's project, where the caller's got it.
        assert [(m.source, m.target) for m in beta.mounts] == [(str(project), "/workspace")]
        # Provenance: the child's call names the parent session and the parent's call.
        [record] = [event.record for event in http.fabric.observer.calls if event.service == "beta"]
        assert record["session"] == beta.labels["reactor-fabric.session"]  # the child's
        assert record["parent"]["call"] == {"id": 7, "method": "tools/call", "name": "run_task"}
        assert record["parent"]["agent"] == "agent"
        assert record["parent"]["depth"] == 1
        [parent_call] = [e.record for e in http.fabric.observer.calls if e.service == "agent"]
        assert record["parent"]["session"] == parent_call["session"] != record["session"]
        assert record["trace_id"] == parent_call["trace_id"]
        # The call is over: its grant revoked, its container and the child's gone.
        await until(lambda: http.fabric.starter.child_grants == {}, what="the grant revoked")
        await until(lambda: len(http.fabric.registry.sessions) == 1, what="the child session ended")
        assert http.runtime.alive == []
        await ws.aclose()


async def test_a_relay_with_a_wrong_token_opens_no_session(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    async with serving(tmp_path, token="not-the-token-of-this-call") as http:
        ws = await open_session(http, project)
        await ws.send_json(call(7, "agent__run_task", {"task": "review"}))
        answer = await ws.hear()
        assert json.loads(answer["result"]["content"][0]["text"]) == {"refused": True}
        assert {spec.labels[LABEL_SERVICE] for spec in http.runtime.spawned} == {"agent"}
        await ws.aclose()


async def test_a_socket_of_a_call_that_ended_opens_no_session(tmp_path: Path) -> None:
    """The token is valid only while the call lasts: its container removed, a connection
    with the very same token is refused (nothing serves that container any more)."""
    project = tmp_path / "project"
    project.mkdir()
    async with serving(tmp_path) as http:
        ws = await open_session(http, project)
        await ws.send_json(call(7, "agent__run_task", {"task": "review"}))
        await ws.hear()
        [agent] = [s for s in http.runtime.servers.values() if s.spec.child_fabric]
        await until(lambda: agent.removed, what="the agent's container removed")
        token = agent.spec.environment[CHILD_TOKEN_ENV]
        stream = await agent.connect_fabric()
        line = {"jsonrpc": "2.0", "method": "fabric/child", "params": {"token": token}}
        hello = json.dumps(line).encode() + b"\n" + json.dumps(INITIALIZE).encode() + b"\n"
        try:
            await stream.send_all(hello)
            assert await stream.receive_some(65536) == b""  # closed, unanswered
        except trio.BrokenResourceError:
            pass  # closed before it could even write
        await stream.aclose()
        assert len(http.fabric.registry.sessions) == 1
        await ws.aclose()


async def test_an_agent_that_uses_nothing_or_a_runtime_without_sockets_gets_no_child(
    tmp_path: Path,
) -> None:
    """No ``uses``: no token, no socket; nor where the runtime cannot give one (the agent
    then runs without the suite)."""
    project = tmp_path / "project"
    project.mkdir()
    services = {
        **SERVICES,
        "loner": Service(image="fake/agent:1", service_type="llm_agent", workspace="shared"),
    }
    async with served(
        tmp_path, server=agent_or_tool_server, learn_catalog=True, services=services
    ) as http:
        assert http.runtime.children is None
        ws = await open_session(http, project)
        for request_id, agent in enumerate(("agent", "loner"), start=7):
            await ws.send_json(call(request_id, f"{agent}__run_task", {"task": "review"}))
            answer = await ws.hear()
            assert json.loads(answer["result"]["content"][0]["text"]) == {"no_socket": True}
        for spec in http.runtime.spawned:
            assert not spec.child_fabric
            assert CHILD_TOKEN_ENV not in spec.environment
        assert http.fabric.starter.child_grants == {}
        await ws.aclose()


async def test_an_agent_may_use_another_agent_only_below_the_depth_limit(tmp_path: Path) -> None:
    services = {
        "lead": Service(
            image="fake/agent:1",
            service_type="llm_agent",
            workspace="shared",
            uses=["beta", "helper"],
        ),
        "helper": Service(
            image="fake/agent:1", service_type="llm_agent", workspace="shared", uses=["beta"]
        ),
        "beta": Service(image="fake/beta:1"),
    }
    async with served(tmp_path, services=services) as http:
        fabric = http.fabric
        assert fabric.settings.max_agent_depth == 1
        # The lead's child session (depth 1) gets beta, not the helper agent.
        assert fabric.starter.child_services(services["lead"], 1) == ("beta",)
    deeper = Agents(max_depth=2)
    async with served(tmp_path, services=services, agents=deeper) as http:
        fabric = http.fabric
        # The lead's child may use the helper agent; the helper's own child (depth 2) gets
        # tool services only.
        assert fabric.starter.child_services(services["lead"], 1) == ("beta", "helper")
        assert fabric.starter.child_services(services["helper"], 2) == ("beta",)


async def test_a_cancelled_agent_call_ends_its_child_session_and_the_childs_containers(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    async with serving(tmp_path, hold=True) as http:
        ws = await open_session(http, project)
        await ws.send_json(call(7, "agent__run_task", {"task": "review"}))

        def beta_running() -> bool:
            return any(
                s.spec.labels[LABEL_SERVICE] == "beta" and not s.removed
                for s in http.runtime.servers.values()
            )

        await until(beta_running, what="the child's beta container running")
        assert len(http.fabric.registry.sessions) == 2
        cancel = {"requestId": 7, "reason": "the user changed their mind"}
        await ws.send_json(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}
        )
        # The held agent ignores its stdin closing, so its removal waits out the stdin grace
        # (STDIN_CLOSE_GRACE_SECONDS, real time): wait in time, not in checkpoints, which a
        # fast machine spends before the grace is over.
        with trio.fail_after(30):
            while http.runtime.alive:  # (the fake runtime has no event for it)  # noqa: ASYNC110
                await trio.sleep(0.01)
        await until(lambda: len(http.fabric.registry.sessions) == 1, what="the child session's end")
        assert http.fabric.starter.child_grants == {}
        await ws.aclose()


def _text(value: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": json.dumps(value)}]}


async def test_a_relay_that_sends_nothing_after_its_token_is_closed_at_the_first_message_deadline(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    limits = Limits(first_message_timeout="200ms")
    async with serving(tmp_path, mute=True, limits=limits) as http:
        ws = await open_session(http, project)
        await ws.send_json(call(7, "agent__run_task", {"task": "review"}))
        # (a guard against a hang, far above the deadline: without one the relay waits forever)
        with trio.fail_after(30):
            answer = await ws.hear()
        assert json.loads(answer["result"]["content"][0]["text"]) == {"closed": True}
        assert len(http.fabric.registry.sessions) == 1  # no child session was ever admitted
        await ws.aclose()
