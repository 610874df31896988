"""Learning the suite's catalog from the services themselves, and keeping it on disk.

Each service is asked once per image what it offers (:mod:`reactor_fabric.protocol.probe`): a
container of it, started with no mount, no network, as the unprivileged user, is spoken to as
an MCP client and removed. What it answered is kept in
``${XDG_CACHE_HOME:-~/.cache}/reactor-fabric/catalog/`` under a key of the image id and
everything of the suite that can change what a server offers (command, env, config, user, and
its secrets: a token with other scopes may list other tools), so a new image, a changed service
or a changed secret is learned again, and nothing else is. A secret enters the key only as an
HMAC under a random key of the cache directory's own (``.key``, readable by its owner only), so
the cache's file names cannot be used to guess a secret offline.

A secret's value a server wrote into its offer (a token in a tool's description) is replaced
before the offer is kept or served (:func:`~reactor_fabric.protocol.catalog.redacted_offer`), and
an offer cached before that is redacted when it is read and written again. The directory is
0700 and each file 0600 (made so, an older directory or file looser than that included); a file
that is not a regular file of ours, or that others could write, is not trusted: the service is
learned again and the file replaced.

Resource handling: every probe container is removed in a shielded, bounded ``finally``, also
when the probe fails or is cancelled; its stderr is drained so that it never blocks its stdout.

Error handling: a service that cannot be learned (its image missing, its server failing the
handshake, a probe over :data:`PROBE_SECONDS`) gets a :class:`ServiceCatalog` with ``error``
(the words) and ``reason`` (the reason a client is given) set, and is not cached; the other
services are learned all the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from .._errors import FabricError
from .._reasons import CONTAINER_EXITED, CONTAINER_OUTPUT_INVALID, TIMEOUT
from ..config.secrets import ServiceSecrets
from ..config.structs import Service
from ..config.xdg import xdg_dir
from ..observe.redaction import SECRET_VALUES
from ..policy.container_parts.ownership import ContainerIdentity
from ..policy.container_spec import probe_spec_for
from ..protocol.catalog import Catalog, ServiceCatalog, redacted_offer, service_catalog
from ..protocol.framing import FramingError, LineSplitter
from ..protocol.probe import OfferProbe, ProbeFailed
from ..runtime.base import Container, Runtime

log = logging.getLogger(__name__)

PROBE_SECONDS = 60.0
REMOVE_SECONDS = 15.0
# The session label of probe containers starts with this (no client session does).
PROBE_SESSION_PREFIX = "catalog"
CACHE_FORMAT = 2  # 2: probes declare roots, sampling and elicitation
READ_CHUNK = 65536


def catalog_cache_dir(environ: Mapping[str, str]) -> Path:
    return xdg_dir(environ, "XDG_CACHE_HOME", ".cache") / "catalog"


SALT_FILE = ".key"
SALT_BYTES = 32


def cache_key(image_id: str, service: Service, secrets_digest: str | None = None) -> str:
    """What can change a service's offer: its image, command, environment, config and user,
    and its secrets (``secrets_digest``, see :meth:`CatalogStore.secrets_digest`; None: it has
    none, which keeps the keys of services without secrets as they were)."""
    inputs: dict[str, object] = {
        "format": CACHE_FORMAT,
        "image": image_id,
        "command": service.command,
        "env": service.env,
        "config": service.config,
        "user": service.user,
    }
    if secrets_digest is not None:
        inputs["secrets"] = secrets_digest
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CatalogStore:
    """Learned offers on disk, one JSON file per cache key (written whole, then renamed), in a
    directory of the owner's only."""

    directory: Path

    def load(self, key: str) -> ServiceCatalog | None:
        """The offer kept under ``key``; None when there is none, or none to trust: not a
        regular file of ours in a directory of ours, writable by others, or not an offer (then
        it is learned again, and replaced). One others could read is made private first, and
        so is the directory (older files in it, cached before it was, with it)."""
        try:
            self._private_directory()
            fd = os.open(self.directory / f"{key}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None  # missing (or a symlink, or not our directory): learned again
        try:
            facts = os.fstat(fd)
            if (
                not stat.S_ISREG(facts.st_mode)
                or facts.st_uid != os.geteuid()
                or facts.st_mode & 0o022
            ):
                return None  # someone else's, or others could have written it
            if facts.st_mode & 0o077:
                os.fchmod(fd, 0o600)  # written before the cache was private
            with os.fdopen(os.dup(fd), "rb") as file:
                data = json.loads(file.read())
            return service_catalog(
                tools=data["tools"],
                prompts=data["prompts"],
                resources=data["resources"],
                resource_templates=data["resource_templates"],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable: learned again
        finally:
            os.close(fd)

    def _private_directory(self) -> None:
        """Make the directory (0700), or make an existing one of ours 0700; OSError when it is
        not a directory of ours (nothing is cached then)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        facts = os.stat(self.directory)
        if not stat.S_ISDIR(facts.st_mode) or facts.st_uid != os.geteuid():
            raise OSError(f"{self.directory}: not a directory of ours")
        if facts.st_mode & 0o077:
            os.chmod(self.directory, 0o700)

    def key_for(self, image_id: str, service: Service, secrets: ServiceSecrets | None) -> str:
        """The cache key of ``service`` with ``secrets`` (blocking: may read or make the
        directory's HMAC key). OSError: no key can be kept, so nothing is cached."""
        if secrets is None or not secrets.secrets:
            return cache_key(image_id, service)
        return cache_key(image_id, service, self.secrets_digest(secrets))

    def secrets_digest(self, secrets: ServiceSecrets) -> str:
        """An HMAC of the secrets' names, deliveries and values under this directory's key."""
        held = [[s.name, s.delivery, s.value] for s in secrets.secrets]
        message = json.dumps(held, sort_keys=True).encode()
        return hmac.new(self._salt(), message, hashlib.sha256).hexdigest()

    def _salt(self) -> bytes:
        """The directory's HMAC key: made once (owner-only, written whole, never replaced),
        read after. A key file that is not a regular file of ours, readable by others or of
        the wrong size is not used (OSError)."""
        self._private_directory()
        path = self.directory / SALT_FILE
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            scratch = self.directory / f".key.{secrets.token_hex(4)}"
            made = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                try:
                    os.write(made, secrets.token_bytes(SALT_BYTES))
                finally:
                    os.close(made)
                with contextlib.suppress(FileExistsError):
                    os.link(scratch, path)  # (another process may have made it first: theirs)
            finally:
                scratch.unlink()
            fd = os.open(path, flags)
        try:
            facts = os.fstat(fd)
            if (
                not stat.S_ISREG(facts.st_mode)
                or facts.st_uid != os.geteuid()
                or facts.st_mode & 0o077
                or facts.st_size != SALT_BYTES
            ):
                raise OSError(f"{path}: not a {SALT_BYTES}-byte file of ours, private")
            return os.read(fd, SALT_BYTES)
        finally:
            os.close(fd)

    def save(self, key: str, offer: ServiceCatalog) -> None:
        """Keep ``offer`` (redacted already) under ``key``: 0600, written whole, then renamed
        over what was there."""
        self._private_directory()
        data = {
            "tools": list(offer.tools),
            "prompts": list(offer.prompts),
            "resources": list(offer.resources),
            "resource_templates": list(offer.resource_templates),
        }
        scratch = self.directory / f".{key}.{secrets.token_hex(4)}"
        made = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(made, "w") as file:
                file.write(json.dumps(data))
            scratch.replace(self.directory / f"{key}.json")
        except BaseException:
            scratch.unlink(missing_ok=True)
            raise


@dataclass(frozen=True)
class Learned:
    """One service's offer and where it came from ("cache", "probe" or "error")."""

    offer: ServiceCatalog
    source: str
    image_id: str | None = None  # the image's id as the engine had it (the suite lock's)


async def learn_catalog(
    runtime: Runtime,
    identity: ContainerIdentity,
    services: Mapping[str, Service],
    store: CatalogStore | None,
    *,
    refresh: bool = False,
    max_line: int = 16 * 1024 * 1024,
    on_learned: Callable[[str, Learned], None] | None = None,
    image_refused: Callable[[str, Service, str | None], FabricError | None] | None = None,
) -> tuple[Catalog, dict[str, Learned]]:
    """Every service's offer: from the cache, else learned by a probe (one at a time, so that
    a start-up does not compete with the first sessions for the engine). Without a ``store``
    nothing is cached. ``on_learned`` hears of each service as soon as it is known;
    ``image_refused`` may refuse a service, by its image's id (the suite lock's enforce) or
    for what it lacks (its secrets): then
    nothing of it is started, nor read from the cache, and the service is unavailable."""
    learned: dict[str, Learned] = {}
    for name, service in services.items():
        learned[name] = await _learn_one(
            runtime,
            identity,
            name,
            service,
            store,
            refresh=refresh,
            max_line=max_line,
            image_refused=image_refused,
        )
        if on_learned is not None:
            on_learned(name, learned[name])
    return Catalog({name: item.offer for name, item in learned.items()}), learned


async def _learn_one(
    runtime: Runtime,
    identity: ContainerIdentity,
    name: str,
    service: Service,
    store: CatalogStore | None,
    *,
    refresh: bool,
    max_line: int,
    image_refused: Callable[[str, Service, str | None], FabricError | None] | None = None,
) -> Learned:
    try:
        image_id = await runtime.image_id(service.image)
    except FabricError as exc:
        image_id = None
        log.debug("catalog_image_unknown", extra={"service": name, "detail": str(exc)})
    refusal = image_refused(name, service, image_id) if image_refused is not None else None
    if refusal is not None:
        offer = ServiceCatalog(error=str(refusal), reason=refusal.reason)
        return Learned(offer, "error", image_id)
    service_secrets = identity.secrets.get(name)
    key = await _key(store, image_id, name, service, service_secrets)
    if key is not None and store is not None and not refresh:
        cached = await trio.to_thread.run_sync(_load_redacted, store, key)
        if cached is not None:
            return Learned(cached, "cache", image_id)
    try:
        offer = await probe_service(runtime, identity, name, service, max_line=max_line)
    except (FabricError, ProbeFailed, FramingError, trio.TooSlowError) as exc:
        detail = "no answer in time" if isinstance(exc, trio.TooSlowError) else str(exc)
        detail = SECRET_VALUES.redact(detail)  # (a server's words may be in it)
        log.warning("catalog_probe_failed", extra={"service": name, "detail": detail})
        return Learned(ServiceCatalog(error=detail, reason=_failure_reason(exc)), "error")
    # Neither kept nor served with a secret's value in it (nor hashed: the suite lock).
    offer = await trio.to_thread.run_sync(redacted_offer, offer, SECRET_VALUES.redacted)
    if store is None:
        return Learned(offer, "probe", image_id)
    if key is None and image_id is None:  # the image appeared with the probe (pulled)
        with contextlib.suppress(FabricError):
            image_id = await runtime.image_id(service.image)
            key = await _key(store, image_id, name, service, service_secrets)
    if key is not None:
        try:
            await trio.to_thread.run_sync(store.save, key, offer)
        except OSError as exc:  # a cache we cannot write: learned all the same, next time again
            log.warning("catalog_cache_unwritable", extra={"service": name, "detail": str(exc)})
    return Learned(offer, "probe", image_id)


def _load_redacted(store: CatalogStore, key: str) -> ServiceCatalog | None:
    """The cached offer under ``key``, redacted; one cached with a secret's value (before
    offers were redacted) is written again without it (blocking)."""
    cached = store.load(key)
    if cached is None:
        return None
    offer = redacted_offer(cached, SECRET_VALUES.redacted)
    if offer is not cached:
        try:
            store.save(key, offer)
        except OSError as exc:  # served redacted all the same; the old file stays until then
            log.warning("catalog_cache_unwritable", extra={"key": key, "detail": str(exc)})
    return offer


async def _key(
    store: CatalogStore | None,
    image_id: str | None,
    name: str,
    service: Service,
    service_secrets: ServiceSecrets | None,
) -> str | None:
    """The cache key, or None: no store, no image id, or no key for its secrets (logged)."""
    if store is None or image_id is None:
        return None
    try:
        return await trio.to_thread.run_sync(store.key_for, image_id, service, service_secrets)
    except OSError as exc:
        log.warning("catalog_cache_unwritable", extra={"service": name, "detail": str(exc)})
        return None


def _failure_reason(exc: Exception) -> str:
    """The reason a probe failed, as a session's start of the service would give it: the
    engine's (``image_not_found``, ``docker_unavailable``…), else what the server did."""
    if isinstance(exc, FabricError | ProbeFailed):
        return exc.reason
    if isinstance(exc, FramingError):
        return CONTAINER_OUTPUT_INVALID
    return TIMEOUT  # trio.TooSlowError: over PROBE_SECONDS


async def probe_service(
    runtime: Runtime,
    identity: ContainerIdentity,
    name: str,
    service: Service,
    *,
    max_line: int,
) -> ServiceCatalog:
    """Start a container of ``service`` (no mount, no network, unprivileged), learn its offer,
    remove it. Bounded by :data:`PROBE_SECONDS`."""
    with trio.fail_after(PROBE_SECONDS):
        spec = probe_spec_for(
            name,
            service,
            session_id=f"{PROBE_SESSION_PREFIX}{secrets.token_hex(8)}",
            token=secrets.token_hex(4),
            identity=identity,
            capabilities=runtime.capabilities,
        )
        container = await runtime.spawn(spec)
        try:
            offer = await _converse(container, max_line)
        finally:
            with trio.move_on_after(REMOVE_SECONDS) as cleanup:
                cleanup.shield = True
                await container.aclose()
                await runtime.remove(container.id)
    log.info(
        "catalog_learned",
        extra={"service": name, "tools": len(offer.tools), "image": service.image},
    )
    return offer


async def _converse(container: Container, max_line: int) -> ServiceCatalog:
    probe = OfferProbe()
    splitter = LineSplitter(max_line=max_line)

    async def send(lines: list[bytes]) -> None:
        for line in lines:
            await container.stdin.send_all(line + b"\n")

    async def conversation() -> None:
        await send(probe.start())
        while not probe.done:
            data = await container.stdout.receive_some(READ_CHUNK)
            if not data:
                raise ProbeFailed(
                    "the server ended before it had answered", reason=CONTAINER_EXITED
                )
            for line in splitter.feed(bytes(data)):
                await send(probe.receive(line))

    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain, container.stderr)
        try:
            await conversation()
        except (ProbeFailed, FramingError) as exc:
            failure = exc  # raised below, outside the nursery: not wrapped in a group
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            failure = ProbeFailed(
                f"the server's stdio closed ({exc.__class__.__name__})", reason=CONTAINER_EXITED
            )
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    for problem in probe.problems:
        log.info("catalog_probe_problem", extra={"detail": problem})
    return probe.catalog()


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while await stream.receive_some(READ_CHUNK):
            pass


def default_store(environ: Mapping[str, str] | None = None) -> CatalogStore:
    return CatalogStore(catalog_cache_dir(os.environ if environ is None else environ))
