"""What the orchestrator's start asks the engine about gVisor (reactor_fabric/trio/serve.py,
``_learn_isolation``): the engine's runtimes, then one container naming gVisor's runtime, of
the first image that asks for it that the engine has — so that an engine dropping the runtime
is found even when one of those images is missing."""

from __future__ import annotations

from reactor_fabric._errors import ContainerStartFailure
from reactor_fabric.config.structs import Orchestrator, Service, Suite
from reactor_fabric.trio.serve import _learn_isolation
from tests.fakes import AnsweringRuntime


class Asked(AnsweringRuntime):
    def __init__(self, missing: set[str]) -> None:
        self.missing = missing
        self.asked: list[str] = []

    async def verify_isolation(self, image: str, labels: dict[str, str]) -> None:
        self.asked.append(image)
        if image in self.missing:
            raise ContainerStartFailure(f"no such image {image}", reason="image_not_found")


def suite(**services: Service) -> Suite:
    return Suite(
        version="1.0",
        orchestrator=Orchestrator(allowed_mount_roots=["/tmp"]),
        mcp_services=services,
    )


async def test_the_check_takes_the_next_image_asking_for_gvisor_when_one_is_missing() -> None:
    runtime = Asked(missing={"a:1"})
    services = suite(
        a=Service(image="a:1", isolation="gvisor"),
        b=Service(image="b:1", isolation="prefer-gvisor"),
        c=Service(image="c:1", isolation="prefer-gvisor"),
        plain=Service(image="plain:1"),  # runc: never asked about
    )
    await _learn_isolation(runtime, services, {})
    assert runtime.asked == ["a:1", "b:1"]


async def test_nothing_is_created_when_no_service_asks_for_gvisor() -> None:
    runtime = Asked(missing=set())
    await _learn_isolation(runtime, suite(plain=Service(image="plain:1")), {})
    assert runtime.asked == []
