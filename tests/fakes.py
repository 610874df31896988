"""Fakes shared by the unit tests (fakes over mocks: they behave, they don't record)."""

from __future__ import annotations

from typing import Any

from reactor_fabric._backend import ContainerExit, SpawnedContainer
from reactor_fabric._container_spec import ContainerSpec
from reactor_fabric._errors import DockerUnavailable


class UnreachableEngine:
    """An engine whose socket does not answer."""

    async def ping(self, *, time_bound: float | None = None) -> str:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def spawn(self, spec: ContainerSpec) -> SpawnedContainer:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def exit_status(self, container_id: str) -> ContainerExit:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def remove(self, container_id: str) -> None:
        return None

    async def list_managed(
        self, extra_labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        raise DockerUnavailable("cannot reach the Docker engine", reason="docker_unavailable")

    async def close(self) -> None:
        return None


class AnsweringEngine(UnreachableEngine):
    async def ping(self, *, time_bound: float | None = None) -> str:
        return "99.0-fake"
