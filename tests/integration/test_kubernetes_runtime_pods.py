"""The Kubernetes runtime in process, against the fake API server (pods as containers on the
real engine): a bundled server answers MCP through a pod's attach, its exit code is read from
the pod, and nothing is left behind by a start that fails or is cancelled at any point.

In process, so that what the end-to-end tests cannot see fails here: a warning (an unclosed
stream left to the garbage collector is a ResourceWarning, an error under this suite's
settings), a pod or a container left behind, an error that is not the product's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
import trio

from reactor_fabric import ContainerStartFailure, DockerUnavailable
from reactor_fabric.policy.container_parts.ownership import LABEL_SESSION
from reactor_fabric.policy.container_spec import ContainerSpec, container_spec_for
from reactor_fabric.runtime.kubernetes import KubernetesRuntime
from reactor_fabric.runtime.kubernetes_container import KubernetesContainer
from tests.fakes import EVERY_CAPABILITY
from tests.integration.test_docker_api_stdio import SUITE, TEST_IDENTITY, StdioPeer
from tests.kube_fake import FakeKubernetes, fake_kubernetes
from tests.kube_fake.server import Request
from tests.messages import INITIALIZE

pytestmark = pytest.mark.integration


def time_spec(session: str = "") -> ContainerSpec:
    return container_spec_for(
        "time",
        SUITE.mcp_services["time"],
        session_id=session or secrets.token_hex(16),
        identity=TEST_IDENTITY,
        capabilities=EVERY_CAPABILITY,
    )


async def no_pods_left(api: FakeKubernetes) -> None:
    """The store empty and the fake's containers gone (a deletion finishes in the background)."""
    with trio.fail_after(30):
        while api.pods or await api.docker_containers():  # noqa: ASYNC110 (another process: polled)
            await trio.sleep(0.1)


@contextlib.asynccontextmanager
async def runtime_on_fake(
    tmp_path: Path,
) -> AsyncIterator[tuple[FakeKubernetes, KubernetesRuntime]]:
    """A fake API server and a runtime reaching it through a kubeconfig, for the block."""
    async with fake_kubernetes() as api:
        runtime = KubernetesRuntime(kubeconfig=str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            yield api, runtime
        finally:
            await runtime.close()


async def test_a_bundled_server_answers_through_its_pods_attach_and_its_exit_is_read(
    tmp_path: Path,
) -> None:
    async with runtime_on_fake(tmp_path) as (api, runtime):
        assert (await runtime.ping()).startswith("v1.")
        spec = time_spec()
        container = await runtime.spawn(spec)
        try:
            peer = StdioPeer(container)
            await peer.send(INITIALIZE)
            answer = await peer.response(1)
            assert answer["result"]["serverInfo"]["name"]
            [listed] = await runtime.list_managed({LABEL_SESSION: spec.labels[LABEL_SESSION]})
            assert listed.name == container.name
            await container.stdin.send_eof()  # how MCP asks a stdio server to stop
            with trio.fail_after(30):
                while await container.stdout.receive_some(65536):
                    pass
            ended = await runtime.exit_status(container.id)
            assert ended.exit_code == 0
        finally:
            await container.aclose()
            await runtime.remove(container.id)
        await no_pods_left(api)


async def test_a_missing_image_fails_the_start_as_image_not_found_and_leaves_no_pod(
    tmp_path: Path,
) -> None:
    async with runtime_on_fake(tmp_path) as (api, runtime):
        plain = time_spec()
        program = dataclasses.replace(plain.program, image="reactor-fabric/no-such-image:0")
        spec = dataclasses.replace(plain, program=program)
        with pytest.raises(ContainerStartFailure) as failed:
            await runtime.spawn(spec)
        assert failed.value.reason == "image_not_found"
        assert "ErrImageNeverPull" in str(failed.value)
        await no_pods_left(api)


@pytest.mark.parametrize("after", [0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8])
async def test_a_start_cancelled_at_any_point_leaves_no_pod_behind(
    tmp_path: Path, after: float
) -> None:
    async with runtime_on_fake(tmp_path) as (api, runtime):
        with trio.move_on_after(after):
            container = await runtime.spawn(time_spec())
            # Started before the cancellation: the caller's to release, as any other
            # (shielded: the same deadline must not cut the release short).
            with trio.CancelScope(shield=True):
                await container.aclose()
                await runtime.remove(container.id)
        await no_pods_left(api)


async def test_an_unreachable_api_server_is_kubernetes_unavailable(tmp_path: Path) -> None:
    async with fake_kubernetes() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    # The fake has stopped: its address answers nothing any more.
    runtime = KubernetesRuntime(kubeconfig=str(kubeconfig), call_timeout=5)
    try:
        with pytest.raises(DockerUnavailable) as failed:
            await runtime.spawn(time_spec())
        assert failed.value.reason == "kubernetes_unavailable", failed.value
        assert failed.value.code == -32001
    finally:
        await runtime.close()


async def test_a_rotated_token_is_loaded_again_and_each_call_made_once_more(
    tmp_path: Path,
) -> None:
    async with runtime_on_fake(tmp_path) as (api, runtime):
        kubeconfig = tmp_path / "kubeconfig"  # the runtime reads it again on a 401
        assert (await runtime.ping()).startswith("v1.")
        # The token rotates (an in-cluster token expires; an exec plugin hands a new one):
        # each kind of call meets a 401 first, then succeeds with the token read again.

        async def refusals_on_the_way(call: Awaitable[object]) -> object:
            api.token = secrets.token_urlsafe(32)
            api.write_kubeconfig(kubeconfig)
            before = sum(status == 401 for _, _, status in api.requests)
            result = await call
            assert sum(status == 401 for _, _, status in api.requests) - before == 1
            return result

        assert str(await refusals_on_the_way(runtime.ping())).startswith("v1.")
        assert await refusals_on_the_way(runtime.list_managed()) == []
        container = await refusals_on_the_way(runtime.spawn(time_spec()))
        assert isinstance(container, KubernetesContainer)
        await container.aclose()
        await runtime.remove(container.id)
        await no_pods_left(api)


def attaches(api: FakeKubernetes) -> list[int]:
    """The status of each attach request the fake answered."""
    return [status for _, target, status in api.requests if "/attach?" in target]


async def test_a_token_rotated_just_before_the_attach_is_loaded_again_and_the_attach_made_once_more(
    tmp_path: Path,
) -> None:
    async with runtime_on_fake(tmp_path) as (api, runtime):
        kubeconfig = tmp_path / "kubeconfig"

        def rotate_at_the_first_attach(request: Request) -> None:
            if "/attach" in request.path and not attaches(api):
                api.token = secrets.token_urlsafe(32)
                api.write_kubeconfig(kubeconfig)

        api.before_request = rotate_at_the_first_attach
        container = await runtime.spawn(time_spec())
        try:
            peer = StdioPeer(container)
            await peer.send(INITIALIZE)
            assert (await peer.response(1))["result"]["serverInfo"]["name"]
        finally:
            await container.aclose()
            await runtime.remove(container.id)
        await no_pods_left(api)
        # (an attach is logged when its stream ends)
        assert attaches(api) == [401, 101]


async def test_a_token_revoked_just_before_the_attach_fails_the_start_after_one_more_try(
    tmp_path: Path,
) -> None:
    async with runtime_on_fake(tmp_path) as (api, runtime):

        def revoke_at_the_first_attach(request: Request) -> None:
            if "/attach" in request.path and not attaches(api):
                api.token = secrets.token_urlsafe(32)  # the kubeconfig keeps the old one

        api.before_request = revoke_at_the_first_attach
        with pytest.raises(ContainerStartFailure) as failed:
            await runtime.spawn(time_spec())
        assert failed.value.reason == "attach_failed", failed.value
        assert failed.value.detail["status"] == 401
        assert attaches(api) == [401, 401]
        # A revoked token cannot delete the pod either (the runtime logs it): credentials that
        # work can, an operator's or those of the orphan sweeper of an orchestrator holding them.
        assert len(api.pods) == 1
        runtime_again = KubernetesRuntime(kubeconfig=str(api.write_kubeconfig(tmp_path / "k2")))
        try:
            [left] = await runtime_again.list_managed()
            await runtime_again.remove(left.id)
        finally:
            await runtime_again.close()
        await no_pods_left(api)


async def test_a_revoked_token_is_refused_after_one_more_try_and_leaves_no_pod(
    tmp_path: Path,
) -> None:
    async with runtime_on_fake(tmp_path) as (api, runtime):
        assert (await runtime.ping()).startswith("v1.")
        api.token = secrets.token_urlsafe(32)  # revoked: the kubeconfig keeps the old one
        with pytest.raises(ContainerStartFailure) as failed:
            await runtime.spawn(time_spec())
        assert failed.value.reason == "create_failed", failed.value
        assert "HTTP 401" in str(failed.value)
        assert "role.yaml" in str(failed.value)  # says where to look
        creates = [status for method, _, status in api.requests if method == "POST"]
        assert creates == [401, 401]
        assert not api.pods
