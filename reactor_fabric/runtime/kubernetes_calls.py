"""The Kubernetes API server's calls: kr8s's client, each call bounded, each failure translated.

REST calls go through kr8s, which reads the kubeconfig (or the in-cluster service account),
including client certificates and exec plugins, and runs on trio (anyio); a pod's attach is
a WebSocket of our own (:mod:`.kubernetes_attach`) opened with the same credentials. The
client is made at the first call, so an orchestrator starts (and reports an unreachable API
server) before the cluster answers, and made again after its credentials failed to load.

Bounds: every call is bounded in time (``call_timeout``, 30 s by default; a watch and a
delete say their own), credentials' loading and an attach's handshake too; a watch's event
is bounded in size (``MAX_WATCH_EVENT_BYTES``) before it is decoded.

Credentials rotate (in-cluster tokens expire; a kubeconfig's exec plugin hands out expiring
ones): a call or an attach answered 401 makes the credentials load again and is made once
more.

Error handling: failures become the product's errors here (:mod:`.kubernetes_errors` says
what each means): an API server not reached, or not answering in time, and credentials that
do not load are DockerUnavailable (``kubernetes_unavailable`` / ``kubernetes_timeout``); a
refused attach is ContainerStartFailure (``attach_failed``). An answer, whatever its status,
is the caller's to judge (what a 404 means depends on the call).

Resource handling: :meth:`KubernetesCalls.close` closes kr8s's HTTP client (shielded,
bounded); a response is closed when its block ends, and a watch's stream when its reader
leaves it (see :func:`watch_events`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

import httpx
import msgspec
import trio

from ..protocol.framing import LineSplitter, LineTooLong
from . import kubernetes_errors as errors
from .kubernetes_attach import AttachRefused, AttachSocket, open_attach
from .kubernetes_manifests import attach_path

API_CALL_TIMEOUT: Final = 30.0
# A watch event is one pod: large ones (many env vars, long messages) stay far below this.
MAX_WATCH_EVENT_BYTES: Final = 4 * 1024 * 1024
# How long closing the HTTP client may take at shutdown.
CLOSE_BOUND: Final = 10.0
UNAUTHORIZED: Final = 401
SERVICE_ACCOUNT_NAMESPACE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubernetesCalls:
    """The API server named by a kubeconfig (or the cluster's own), in one namespace.

    ``namespace`` None: the kubeconfig context's, or in the cluster the orchestrator's own;
    ``url`` overrides the kubeconfig's server (tests).
    """

    def __init__(
        self,
        *,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        url: str | None = None,
        call_timeout: float = API_CALL_TIMEOUT,
    ) -> None:
        self._namespace = namespace
        self._kubeconfig = kubeconfig
        self._url = url
        self._call_timeout = call_timeout
        self._api: Any = None
        self._api_lock = trio.Lock()

    async def client(self) -> Any:
        """kr8s's API object, made once credentials load (again after a failure)."""
        async with self._api_lock:
            if self._api is None:
                import kr8s.asyncio  # noqa: PLC0415  (an optional dependency, imported when chosen)

                try:
                    with trio.fail_after(self._call_timeout):
                        # Not kr8s.asyncio.api(): its per-thread cache would share one HTTP
                        # client between runtimes (and between trio runs); and not awaiting the
                        # Api itself, whose version check warns on versions it has not seen.
                        api = kr8s.asyncio.Api(
                            bypass_factory=True,
                            url=self._url,
                            kubeconfig=self._kubeconfig,
                            namespace=self._namespace,
                        )
                        await api.auth
                except trio.TooSlowError:
                    raise errors.credentials_too_slow() from None
                except (OSError, ValueError, KeyError, httpx.HTTPError) as exc:
                    raise errors.credentials_failed(exc) from exc
                api.timeout = self._call_timeout
                if self._namespace is None:
                    self._namespace = await _default_namespace(api)
                self._api = api
            return self._api

    @property
    def call_timeout(self) -> float:
        """One call's bound, in seconds."""
        return self._call_timeout

    @property
    def namespace(self) -> str:
        """The session pods' namespace (known once the client is made)."""
        if self._namespace is not None:
            return self._namespace
        if self._api is not None:
            return str(self._api.auth.namespace)
        return "default"

    @contextlib.asynccontextmanager
    async def request(
        self,
        action: str,
        method: str,
        url: str,
        *,
        time_bound: float | None = None,
        stream: bool = False,
        version: str = "v1",
        base: str = "",
        namespaced: bool = True,
        **kwargs: Any,
    ) -> AsyncIterator[httpx.Response]:
        """One API call (in the session namespace unless ``namespaced`` is false); errors
        become the product's.

        Yields the response whatever its status (the caller decides what a 404 means), except
        a first 401: the credentials are loaded again and the call made once more, since
        in-cluster tokens are rotated and a kubeconfig's exec plugin hands out expiring ones.
        """
        import kr8s  # noqa: PLC0415

        api = await self.client()
        bound = self._call_timeout if time_bound is None else time_bound
        with trio.move_on_after(bound) as scope:
            try:
                for attempt in range(2):
                    async with api.call_api(
                        method,
                        version=version,
                        base=base,
                        namespace=self.namespace if namespaced else None,
                        url=url,
                        raise_for_status=False,
                        stream=stream,
                        **kwargs,
                    ) as response:
                        if response.status_code != UNAUTHORIZED or attempt:
                            yield response
                            break
                    await self.reauthenticate(api)
            except (httpx.TransportError, kr8s.APITimeoutError, OSError) as exc:
                raise errors.unreachable(action, exc) from exc
        if scope.cancelled_caught:
            raise errors.no_answer(action, bound)

    async def reauthenticate(self, api: Any) -> None:
        """Load the credentials again and make kr8s's HTTP client carry them (as kr8s does
        itself on a 401 when it raises for status, which we do not let it do)."""
        try:
            await api.auth.reauthenticate()
            # kr8s's own way to renew the headers its HTTP client sends.
            await api._create_session()
        except (OSError, ValueError, KeyError) as exc:
            raise errors.credentials_failed(exc, again=True) from exc

    async def json(
        self, action: str, method: str, url: str, **kwargs: Any
    ) -> tuple[int, dict[str, Any]]:
        """One call (see :meth:`request`): its status and its body as a JSON object (the
        start of a body that is not JSON as its ``message``; {} for any other JSON)."""
        async with self.request(action, method, url, **kwargs) as response:
            status = response.status_code
            try:
                body = msgspec.json.decode(response.content)
            except msgspec.DecodeError:
                body = {"message": response.text[:500]}
        return status, body if isinstance(body, dict) else {}

    async def version(self, *, time_bound: float | None = None) -> str:
        """The API server's version (``gitVersion``), "unknown" if it does not say."""
        async with self.request(
            "ping", "GET", "", time_bound=time_bound, version="", base="/version", namespaced=False
        ) as response:
            if response.status_code != 200:
                raise errors.version_refused(response.status_code)
            try:
                version = msgspec.json.decode(response.content)
            except msgspec.DecodeError:
                version = {}
        return str(version.get("gitVersion", "unknown") if isinstance(version, dict) else "unknown")

    async def attach(self, name: str, *, max_message: int) -> AttachSocket:
        """The pod ``name``'s attach, accepted (its handshake within the call bound; a 401
        makes the credentials load again, once); messages over ``max_message`` bytes end it."""
        api = await self.client()
        target = attach_path(self.namespace, name)
        try:
            with trio.fail_after(self._call_timeout):
                try:
                    socket = await self._open_attach(api, target, max_message)
                except AttachRefused as exc:
                    if exc.status != UNAUTHORIZED:
                        raise
                    # A rotated token (in-cluster tokens expire): load it again, once.
                    await self.reauthenticate(api)
                    socket = await self._open_attach(api, target, max_message)
        except trio.TooSlowError:
            raise errors.attach_too_slow(name) from None
        except AttachRefused as exc:
            raise errors.attach_refused(name, exc, exc.status) from None
        except (OSError, trio.BrokenResourceError) as exc:
            raise errors.unreachable("attach", exc) from exc
        return socket

    async def _open_attach(self, api: Any, target: str, max_message: int) -> AttachSocket:
        return await open_attach(
            str(api.auth.server),
            target,
            token=api.auth.token or None,
            ssl_context=await api.auth.ssl_context(),
            tls_server_name=api.auth.tls_server_name or None,
            max_message=max_message,
        )

    async def close(self) -> None:
        """Close the HTTP client (a later call makes a new one)."""
        api, self._api = self._api, None
        session = getattr(api, "_session", None) if api is not None else None
        if session is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_BOUND):
                await session.aclose()


async def watch_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """A watch's events, one JSON object per line, each bounded before it is decoded."""
    splitter = LineSplitter(max_line=MAX_WATCH_EVENT_BYTES)
    async for chunk in response.aiter_bytes():
        try:
            lines = splitter.feed(chunk)
        except LineTooLong as exc:
            raise errors.watch_event_too_large(exc) from None
        for line in lines:
            try:
                event = msgspec.json.decode(line)
            except (msgspec.DecodeError, RecursionError):
                continue
            if isinstance(event, dict):
                yield event


async def _default_namespace(api: Any) -> str:
    """The kubeconfig context's namespace; in the cluster (no kubeconfig), the orchestrator's
    own, from its service account (kr8s answers "default" there without reading it)."""
    if api.auth.active_context:
        return str(api.auth.namespace)
    path = trio.Path(SERVICE_ACCOUNT_NAMESPACE)
    try:
        return (await path.read_text()).strip() or "default"
    except OSError:
        return "default"
