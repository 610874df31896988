"""The Docker backend: the only module that talks to the Docker Engine API.

docker-py is synchronous, so every API call runs in a worker thread (never on the trio thread),
bounded in time (30 s by default, the product's contract) and in parallelism (a capacity
limiter). Errors are translated here, at the boundary, into the product's exception tree:
connection problems and time-outs become :class:`~reactor_fabric.DockerUnavailable` (-32001),
everything about a particular container or image becomes
:class:`~reactor_fabric.ContainerStartFailure` (-32002).

A spawned container's stdio is a hijacked HTTP connection to the engine: it is attached *before*
the container starts (so no early output is lost) and handed to trio as a
:class:`trio.SocketStream`, so that relay I/O never hops to a thread.

Resource handling: :meth:`DockerEngine.spawn` either returns a running container whose stream the
caller must close and whose container the caller must :meth:`~DockerEngine.remove`, or raises
after removing whatever it had created.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import docker
import docker.errors
import docker.types
import requests.exceptions
import trio

from .._errors import ContainerStartFailure, DockerUnavailable, FabricError
from ..policy.container_spec import LABEL_MANAGED, ContainerSpec
from .base import ContainerExit, SpawnedContainer

log = logging.getLogger(__name__)

T = TypeVar("T")

DOCKER_CALL_TIMEOUT = 30.0
# Pulling an image legitimately takes longer than an API call.
DOCKER_PULL_TIMEOUT = 600.0
# How long a container gets to exit after SIGTERM before SIGKILL.
STOP_GRACE_SECONDS = 2


class DockerEngine:
    """A Docker engine reached through docker-py in worker threads.

    ``base_url`` defaults to the environment (``DOCKER_HOST``, else the local socket). The client
    is created lazily, so an orchestrator can start (and report an unhealthy engine) while the
    engine is down, and reconnects once it is back.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        call_timeout: float = DOCKER_CALL_TIMEOUT,
        max_parallel_calls: int = 16,
    ) -> None:
        self._base_url = base_url
        self._call_timeout = call_timeout
        self._limiter = trio.CapacityLimiter(max_parallel_calls)
        self._client: docker.APIClient | None = None

    # --- plumbing -------------------------------------------------------------------------

    def _connect(self) -> docker.APIClient:
        # Runs in a worker thread: "auto" asks the engine for its API version, so one client
        # works with old engines (20.10 speaks 1.41) and new ones (which refuse old versions).
        if self._client is None:
            kwargs: dict[str, Any] = docker.utils.kwargs_from_env()  # type: ignore[attr-defined]
            if self._base_url is not None:
                kwargs["base_url"] = self._base_url
            self._client = docker.APIClient(
                version="auto", timeout=max(1, int(self._call_timeout)), **kwargs
            )
        return self._client

    async def _call(
        self,
        action: str,
        fn: Callable[[docker.APIClient], T],
        *,
        time_bound: float | None = None,
    ) -> T:
        """Run ``fn(client)`` in a thread; translate errors; give up after the time bound."""
        bound = self._call_timeout if time_bound is None else time_bound

        def in_thread() -> T:
            return fn(self._connect())

        with trio.move_on_after(bound) as scope:
            try:
                return await trio.to_thread.run_sync(
                    in_thread, abandon_on_cancel=True, limiter=self._limiter
                )
            except FabricError:
                raise
            except Exception as exc:
                raise translate_docker_error(exc, action) from exc
        assert scope.cancelled_caught
        raise DockerUnavailable(
            f"the Docker engine did not answer {action} within {bound:g} s",
            reason="docker_timeout",
            action=action,
        )

    # --- API ------------------------------------------------------------------------------

    async def ping(self, *, time_bound: float | None = None) -> str:
        """The engine's version; raises DockerUnavailable if it does not answer."""

        def version(client: docker.APIClient) -> str:
            info: dict[str, Any] = client.version()
            return str(info.get("Version", "unknown"))

        return await self._call("ping", version, time_bound=time_bound)

    async def spawn(self, spec: ContainerSpec) -> SpawnedContainer:
        """Create the container, attach its stdio, start it.

        Raises ContainerStartFailure / DockerUnavailable; on failure nothing is left behind
        (the removal is shielded and bounded).
        """
        if spec.pull == "always":
            await self._pull(spec.image)
        try:
            container_id = await self._create(spec)
        except ContainerStartFailure as exc:
            if exc.reason != "image_not_found" or spec.pull != "missing":
                raise
            await self._pull(spec.image)
            container_id = await self._create(spec)
        try:
            stream = await self._attach(container_id)
            try:
                await self._call("start", lambda c: c.start(container_id))
            except BaseException:
                with trio.CancelScope(shield=True):
                    await stream.aclose()
                raise
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.remove(container_id)
            raise
        return SpawnedContainer(id=container_id, name=spec.name, stream=stream)

    async def _create(self, spec: ContainerSpec) -> str:
        def create(client: docker.APIClient) -> str:
            host_config = client.create_host_config(**host_config_kwargs(spec))
            result: dict[str, Any] = client.create_container(
                image=spec.image,
                command=spec.command,
                name=spec.name,
                environment=spec.environment,
                labels=spec.labels,
                user=spec.user,
                # docker-py adds StdinOnce: closing our side of stdin closes the server's
                # stdin, which is how MCP asks a stdio server to shut down.
                stdin_open=True,
                tty=False,
                network_disabled=spec.network == "none",
                host_config=host_config,
            )
            return str(result["Id"])

        return await self._call("create", create)

    async def _attach(self, container_id: str) -> trio.SocketStream:
        def attach(client: docker.APIClient) -> socket.socket:
            raw = client.attach_socket(
                container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            return detach_socket(raw)

        sock = await self._call("attach", attach)
        return trio.SocketStream(trio.socket.from_stdlib_socket(sock))

    async def _pull(self, image: str) -> None:
        repository, _, tag = (
            image.rpartition(":")
            if ":" in image.rsplit("/", maxsplit=1)[-1]
            else (
                image,
                "",
                "latest",
            )
        )
        await self._call(
            "pull",
            lambda c: c.pull(repository, tag=tag or "latest"),
            time_bound=DOCKER_PULL_TIMEOUT,
        )

    async def exit_status(self, container_id: str) -> ContainerExit:
        """Exit code and OOM flag of a container that has stopped (or None if still running)."""

        def inspect(client: docker.APIClient) -> ContainerExit:
            state: dict[str, Any] = client.inspect_container(container_id)["State"]
            running = bool(state.get("Running"))
            return ContainerExit(
                exit_code=None if running else int(state.get("ExitCode", -1)),
                oom_killed=bool(state.get("OOMKilled")),
                error=str(state.get("Error") or ""),
            )

        return await self._call("inspect", inspect)

    async def remove(self, container_id: str) -> None:
        """Stop (SIGTERM, then SIGKILL after a grace period) and remove; absent is fine.

        Error handling: never raises for a container that is already gone; logs and swallows
        engine errors, since removal runs in ``finally`` blocks whose own error must win.
        """

        def stop_and_remove(client: docker.APIClient) -> None:
            try:
                client.stop(container_id, timeout=STOP_GRACE_SECONDS)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError:
                pass  # not running, or being removed already: removal below decides
            try:
                client.remove_container(container_id, force=True)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                if exc.response is not None and exc.response.status_code == 409:
                    return  # "removal already in progress"
                raise

        try:
            await self._call("remove", stop_and_remove)
        except FabricError as exc:
            log.error(
                "container_remove_failed",
                extra={"container": container_id, "reason": exc.reason, "detail": str(exc)},
            )

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Containers (running or not) labelled as managed by Reactor-Fabric."""
        filters = [f"{LABEL_MANAGED}=true"]
        filters += [f"{key}={value}" for key, value in (extra_labels or {}).items()]

        def listing(client: docker.APIClient) -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = client.containers(all=True, filters={"label": filters})
            return found

        return await self._call("list", listing)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await trio.to_thread.run_sync(client.close)


def host_config_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """The ``HostConfig`` of a spec: mounts as structured objects, limits and safe defaults."""
    security_opt = ["no-new-privileges:true"] if spec.no_new_privileges else []
    return {
        "mounts": [
            docker.types.Mount(
                target=mount.target, source=mount.source, type="bind", read_only=mount.read_only
            )
            for mount in spec.mounts
        ],
        "network_mode": spec.network,
        "mem_limit": spec.memory_bytes,
        # Equal to the memory limit: no swap on top of it, so the limit means what it says.
        "memswap_limit": spec.memory_bytes,
        "nano_cpus": spec.nano_cpus,
        "pids_limit": spec.pids_limit,
        "cap_drop": ["ALL"],
        "cap_add": list(spec.cap_add) or None,
        "security_opt": security_opt,
        "read_only": spec.read_only_rootfs,
        "tmpfs": spec.tmpfs or None,
        "init": True,  # a real PID 1 that forwards signals and reaps zombies
        "auto_remove": False,  # we remove explicitly, after reading the exit code
    }


def detach_socket(raw: Any) -> socket.socket:
    """A standalone socket for the hijacked attach connection docker-py returns.

    docker-py hands back the socket wrapped in HTTP response objects that close it when garbage
    collected; a duplicate of the file descriptor outlives them.
    """
    inner = getattr(raw, "_sock", raw)
    if not isinstance(inner, socket.socket):
        raise ContainerStartFailure(
            "the Docker connection is not a socket that can be relayed",
            reason="attach_unsupported",
            kind=type(raw).__name__,
        )
    duplicate = socket.socket(fileno=os.dup(inner.fileno()))
    response = getattr(raw, "_response", None)
    if response is not None:
        response.close()
    else:
        raw.close()
    duplicate.setblocking(False)
    return duplicate


_CONNECTION_ERRORS = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    ConnectionError,
    socket.timeout,
    FileNotFoundError,
)


def translate_docker_error(exc: BaseException, action: str) -> FabricError:
    """Map a docker-py / transport exception into the product's error tree."""
    if isinstance(exc, docker.errors.ImageNotFound) or (
        isinstance(exc, docker.errors.NotFound) and action in ("create", "pull")
    ):
        return ContainerStartFailure(
            f"image not found: {_explain(exc)}", reason="image_not_found", action=action
        )
    if isinstance(exc, docker.errors.APIError):
        return ContainerStartFailure(
            f"Docker refused to {action}: {_explain(exc)}",
            reason=f"{action}_failed",
            action=action,
            status=exc.status_code,
        )
    if isinstance(exc, _CONNECTION_ERRORS) or (
        isinstance(exc, docker.errors.DockerException) and _looks_like_connection(exc)
    ):
        return DockerUnavailable(
            f"cannot reach the Docker engine ({action}): {exc}",
            reason="docker_unavailable",
            action=action,
        )
    return ContainerStartFailure(
        f"Docker {action} failed: {exc}", reason=f"{action}_failed", action=action
    )


def _looks_like_connection(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("connection", "socket", "refused", "no such file"))


def _explain(exc: docker.errors.APIError) -> str:
    explanation: object = exc.explanation
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return str(explanation or exc)


@functools.cache
def hostname() -> str:
    return socket.gethostname()
