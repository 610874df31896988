"""Learning the catalog from the services (in-memory runtime) and keeping it on disk."""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

import pytest
import trio
import trio.testing

from reactor_fabric._errors import ContainerStartFailure
from reactor_fabric._reasons import CONTAINER_EXITED, IMAGE_NOT_FOUND, TIMEOUT
from reactor_fabric.config.secrets import Secret, ServiceSecrets
from reactor_fabric.config.structs import Service
from reactor_fabric.policy.container_spec import ContainerIdentity
from reactor_fabric.runtime.memory import MemoryServer, open_memory_runtime
from reactor_fabric.trio.catalog import CatalogStore, cache_key, learn_catalog
from reactor_fabric.trio.fabric import Fabric
from tests.fakes import TOOLS, scripted_mcp_server
from tests.served import suite_for

IDENTITY = ContainerIdentity(
    instance_id="inst",
    owner_host="host",
    owner_pid=1,
    owner_start="0",
    default_network="bridge",
)


async def server_by_image(container: MemoryServer) -> None:
    """The scripted server, except for the images named after how they misbehave."""
    spec = container.spec
    if spec.image == "dies":
        await container.write_stderr(b"fatal\n")
        await container.exit(1)
    elif spec.image == "silent":
        while await container.read_line() is not None:
            pass  # reads, never answers
    else:
        await scripted_mcp_server(container)


async def test_a_service_is_learned_by_a_probe_then_kept_and_its_container_removed(
    tmp_path: Path,
) -> None:
    store = CatalogStore(tmp_path / "catalog")
    services = {"svc": Service(image="fake/svc:1", network="bridge")}
    async with open_memory_runtime(server_by_image) as runtime:
        catalog, learned = await learn_catalog(runtime, IDENTITY, services, store)
        assert learned["svc"].source == "probe"
        assert [t["name"] for t in catalog.tools_of()] == [f"svc__{tool}" for tool in TOOLS]
        [spec] = runtime.spawned
        # No mount, no network, not root, whatever the service's own settings.
        assert (spec.mounts, spec.network, spec.user) == ((), "none", "65534:65534")
        assert runtime.alive == []
        again, learned = await learn_catalog(runtime, IDENTITY, services, store)
        assert learned["svc"].source == "cache"
        assert len(runtime.spawned) == 1  # nothing started for the cached one
        assert again.tools_of() == catalog.tools_of()
        _, learned = await learn_catalog(runtime, IDENTITY, services, store, refresh=True)
        assert learned["svc"].source == "probe"
        assert len(runtime.spawned) == 2


async def test_a_changed_service_or_image_is_learned_again(tmp_path: Path) -> None:
    store = CatalogStore(tmp_path / "catalog")
    async with open_memory_runtime(server_by_image) as runtime:
        await learn_catalog(runtime, IDENTITY, {"svc": Service(image="fake/svc:1")}, store)
        await learn_catalog(
            runtime, IDENTITY, {"svc": Service(image="fake/svc:1", config={"a": 1})}, store
        )
        await learn_catalog(runtime, IDENTITY, {"svc": Service(image="fake/svc:2")}, store)
        assert len(runtime.spawned) == 3


async def test_a_service_that_cannot_be_learned_reports_why_and_the_others_are_learned(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = CatalogStore(tmp_path / "catalog")
    services = {
        "dies": Service(image="dies"),
        "silent": Service(image="silent"),
        "missing": Service(image="missing", pull="never"),
        "svc": Service(image="fake/svc:1"),
    }
    async with open_memory_runtime(server_by_image) as runtime:
        runtime.missing_images.add("missing")
        catalog, learned = await learn_catalog(runtime, IDENTITY, services, store)
        assert {name: item.source for name, item in learned.items()} == {
            "dies": "error",
            "silent": "error",
            "missing": "probe",  # the memory runtime starts it anyway: its image id comes late
            "svc": "probe",
        }
        errors = catalog.errors()
        assert "ended" in errors["dies"]
        assert errors["silent"] == "no answer in time"
        assert [t["name"] for t in catalog.tools_of()] == [
            f"{service}__{tool}" for service in ("missing", "svc") for tool in TOOLS
        ]
        assert runtime.alive == []
        # Failures are not kept: they are tried again next time.
        _, learned = await learn_catalog(runtime, IDENTITY, services, store)
        assert learned["dies"].source == "error"


def names_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def with_token(value: str) -> ContainerIdentity:
    token = Secret("TOKEN", "env", value)
    return dataclasses.replace(IDENTITY, secrets={"svc": ServiceSecrets((token,))})


async def test_a_service_whose_secret_changed_is_learned_again_and_its_old_offer_kept(
    tmp_path: Path,
) -> None:
    # (A token with other scopes may make a server list other tools.)
    store = CatalogStore(tmp_path / "catalog")
    services = {"svc": Service(image="fake/svc:1")}
    async with open_memory_runtime(server_by_image) as runtime:
        sources = []
        for identity in (with_token("first-token"), with_token("first-token")):
            _, learned = await learn_catalog(runtime, identity, services, store)
            sources.append(learned["svc"].source)
        for identity in (with_token("other-token"), with_token("first-token"), IDENTITY):
            _, learned = await learn_catalog(runtime, identity, services, store)
            sources.append(learned["svc"].source)
        # The probe's container had the secret each time.
        assert [spec.environment.get("TOKEN") for spec in runtime.spawned] == [
            "first-token",
            "other-token",
            None,
        ]
    assert sources == ["probe", "cache", "probe", "cache", "probe"]


def test_a_secret_enters_the_cache_key_only_keyed_by_the_directorys_own_private_key(
    tmp_path: Path,
) -> None:
    service = Service(image="fake/svc:1")
    secrets = with_token("a-token").secrets["svc"]
    one, other = CatalogStore(tmp_path / "one"), CatalogStore(tmp_path / "two")
    key = one.key_for("sha256:img", service, secrets)
    assert key == one.key_for("sha256:img", service, secrets)  # stable: the key file is kept
    # Another directory, another key: nobody can tell the secret from a file name offline.
    assert key != other.key_for("sha256:img", service, secrets)
    assert "a-token" not in key
    salt = tmp_path / "one" / ".key"
    assert stat.S_IMODE(salt.stat().st_mode) == 0o600
    # Without secrets the key is what it always was (caches of such services stay valid).
    assert one.key_for("sha256:img", service, None) == cache_key("sha256:img", service)


@pytest.mark.parametrize("tampered", ["readable_by_others", "wrong_size", "symlink"])
def test_a_key_file_others_could_read_or_swap_is_not_used(tmp_path: Path, tampered: str) -> None:
    store = CatalogStore(tmp_path)
    secrets = with_token("a-token").secrets["svc"]
    store.key_for("sha256:img", Service(image="i"), secrets)
    salt = tmp_path / ".key"
    if tampered == "readable_by_others":
        salt.chmod(0o644)
    elif tampered == "wrong_size":
        salt.write_bytes(b"short")
    else:
        elsewhere = tmp_path / "elsewhere"
        salt.rename(elsewhere)
        salt.symlink_to(elsewhere)
    with pytest.raises(OSError, match=r"\.key"):
        store.key_for("sha256:img", Service(image="i"), secrets)


async def test_a_service_with_secrets_is_learned_uncached_when_no_key_can_be_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CatalogStore(tmp_path)
    (tmp_path / ".key").write_bytes(b"x" * 32)
    (tmp_path / ".key").chmod(0o644)
    services = {"svc": Service(image="fake/svc:1")}
    async with open_memory_runtime(server_by_image) as runtime:
        for _ in range(2):
            catalog, learned = await learn_catalog(runtime, with_token("tok-1"), services, store)
            assert learned["svc"].source == "probe"
            assert len(catalog.tools_of()) == len(TOOLS)
    assert [r.msg for r in caplog.records].count("catalog_cache_unwritable") == 2
    assert names_in(tmp_path) == [".key"]  # nothing kept


def test_a_corrupt_cache_file_is_learned_again_not_trusted(tmp_path: Path) -> None:
    store = CatalogStore(tmp_path)
    (tmp_path / "k.json").write_text("{not json")
    assert store.load("k") is None
    (tmp_path / "k.json").write_text('{"tools": 3}')
    assert store.load("k") is None


async def test_a_running_orchestrator_learns_a_rebuilt_image_again_and_nothing_else(
    tmp_path: Path,
) -> None:
    # The real clock: the cache is read and written in threads, and an autojump clock would
    # jump while they run.
    async with open_memory_runtime(scripted_mcp_server) as runtime:
        fabric = Fabric(
            suite_for(tmp_path),
            runtime=runtime,
            network="none",
            catalog_store=CatalogStore(tmp_path / "cache"),
            catalog_recheck_seconds=0.05,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(fabric.learn_catalog)

            async def passes(count: int) -> None:
                with trio.fail_after(30):
                    while fabric.catalog_passes < count:
                        await fabric.changed.wait()

            await passes(1)
            assert len(runtime.spawned) == 1  # the first probe
            await passes(2)
            assert len(runtime.spawned) == 1  # same image: from the cache
            runtime.image_ids["fake/svc:1"] = "memory:rebuilt"
            await passes(3)
            assert len(runtime.spawned) == 2  # learned again
            assert fabric.catalog.tool("svc__echo") is not None
            nursery.cancel_scope.cancel()
        assert runtime.alive == []


async def test_a_running_orchestrator_keeps_a_services_tools_when_its_image_goes_missing(
    tmp_path: Path,
) -> None:
    # The real clock, as above (the cache is read and written in threads).
    async with open_memory_runtime(scripted_mcp_server) as runtime:
        fabric = Fabric(
            suite_for(tmp_path),
            runtime=runtime,
            network="none",
            catalog_store=CatalogStore(tmp_path / "cache"),
            catalog_recheck_seconds=0.05,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(fabric.learn_catalog)

            async def passes(count: int) -> None:
                with trio.fail_after(30):
                    while fabric.catalog_passes < count:
                        await fabric.changed.wait()

            await passes(1)
            assert fabric.catalog.tool("svc__echo") is not None
            # The image is removed: the next re-check cannot learn the service.
            runtime.missing_images.add("fake/svc:1")
            gone = ContainerStartFailure("image fake/svc:1 not found", reason=IMAGE_NOT_FOUND)
            runtime.fault("create", error=gone)
            await passes(2)
            # Its tools stay known (a call starts it and says why it cannot run), and it is
            # marked unavailable with the engine's reason.
            assert fabric.catalog.tool("svc__echo") is not None
            assert fabric.catalog.unavailable() == {
                "svc": {"reason": IMAGE_NOT_FOUND, "detail": "image fake/svc:1 not found"}
            }
            # The image is back: learned again, nothing of the failure left.
            runtime.missing_images.clear()
            runtime.clear_faults()
            await passes(3)
            assert fabric.catalog.tool("svc__echo") is not None
            assert fabric.catalog.unavailable() == {}
            nursery.cancel_scope.cancel()
        assert runtime.alive == []


async def test_a_service_that_cannot_be_learned_carries_the_reason_a_start_would_give(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    services = {
        "dies": Service(image="dies"),
        "silent": Service(image="silent"),
        "missing": Service(image="missing"),
    }
    async with open_memory_runtime(server_by_image) as runtime:
        missing = ContainerStartFailure("image missing not found", reason=IMAGE_NOT_FOUND)
        runtime.fault("create", error=missing, only=lambda spec: spec.image == "missing")
        catalog, _ = await learn_catalog(runtime, IDENTITY, services, None)
    assert {name: why["reason"] for name, why in catalog.unavailable().items()} == {
        "dies": CONTAINER_EXITED,
        "silent": TIMEOUT,
        "missing": IMAGE_NOT_FOUND,
    }
