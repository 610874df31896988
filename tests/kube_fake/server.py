"""The fake API server's HTTP side: h11 over ``trio.serve_tcp``, routes, watches, attach.

Routes (JSON only, bearer token required everywhere):

- ``GET /version``; discovery: ``GET /api``, ``/api/v1``, ``/apis``
- ``GET /api/v1/namespaces/{ns}`` (the fake's one namespace)
- ``GET|POST /api/v1/namespaces/{ns}/pods`` (list or ``watch``, create), ``GET /api/v1/pods``
- ``GET|DELETE /api/v1/namespaces/{ns}/pods/{name}``
- ``GET /api/v1/namespaces/{ns}/pods/{name}/attach`` (WebSocket upgrade, see :mod:`.attach`)
- ``GET|POST /api/v1/namespaces/{ns}/secrets`` (list, create), ``GET /api/v1/secrets``
- ``GET|DELETE /api/v1/namespaces/{ns}/secrets/{name}`` (see :mod:`.secret_store`)

Bounds: request headers (``MAX_HEADER_BYTES``, else 431) and bodies (``MAX_BODY_BYTES``, else
413 RequestEntityTooLarge), the wait for a request on an idle connection, for a request's
body, and every write to a client (a client that stops reading is cut off).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import hmac
import json
import os
import secrets
import socket
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import docker
import h11
import trio
import yaml
from wsproto.utilities import generate_accept_token

from . import attach
from .api import (
    METHOD_NOT_ALLOWED,
    SECRET_FIELDS,
    UNAUTHORIZED,
    UNKNOWN_PATH,
    ApiError,
    FieldRequirement,
    already_exists,
    bad_request,
    not_found,
    parse_field_selector,
    parse_label_selector,
    timestamp,
)
from .engine import DockerPool
from .kubelet import FAKE_LABEL, Kubelet, node_of_engine, remove_all
from .network_policies import GROUP_VERSION, NetworkPolicyStore, admit_network_policy
from .pods import WATCH_QUEUE, FakePod, PodStore, Selection, Watcher
from .secret_store import SecretStore, admit_secret, deleted_status
from .secret_volumes import SecretVolumes
from .validation import admit_pod

GIT_VERSION: Final = "v1.30.0-fake"
MAX_HEADER_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 1024 * 1024
IDLE_SECONDS: Final = 120.0  # a keep-alive connection with no request for this long is closed
REQUEST_SECONDS: Final = 30.0  # a request's headers and body must arrive within this
WRITE_SECONDS: Final = 30.0  # a response (or one watch event) must be taken within this
DEFAULT_WATCH_SECONDS: Final = 1800  # the apiserver's minRequestTimeout
CLEANUP_SECONDS: Final = 60.0
RECEIVE_SIZE: Final = 65536
HEADER_RECEIVE_SIZE: Final = 16384
TOKEN_PROTOCOL: Final = "base64url.bearer.authorization.k8s.io."
_TERMINAL: Final = ("Succeeded", "Failed")
_TRUE: Final = ("1", "t", "T", "true", "TRUE", "True")
_CONNECTION_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


class _BodyTooLarge(Exception):
    pass


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def flag(self, name: str) -> bool:
        return self.param(name) in _TRUE


class _Connection:
    """One client connection: h11's state and the stream, every wait bounded."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)

    async def _event(self, bound: float) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            # Small reads, so that h11 sees a header block over its bound before it completes.
            with trio.fail_after(bound):
                data = await self.stream.receive_some(HEADER_RECEIVE_SIZE)
            self.h11.receive_data(data)

    async def read_request(self) -> Request | None:
        """The next request with its body; None when the client closed or idled out."""
        try:
            event = await self._event(IDLE_SECONDS)
        except trio.TooSlowError:
            return None
        if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None
        assert isinstance(event, h11.Request), event
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if int(headers.get("content-length", "0") or 0) > MAX_BODY_BYTES:
            raise _BodyTooLarge
        body = bytearray()
        while True:
            part = await self._event(REQUEST_SECONDS)
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > MAX_BODY_BYTES:
                    raise _BodyTooLarge
            elif isinstance(part, h11.EndOfMessage):
                break
            else:
                return None
        target = event.target.decode("latin-1")
        split = urlsplit(target)
        return Request(
            method=event.method.decode("latin-1"),
            target=target,
            path=split.path,
            query=parse_qs(split.query, keep_blank_values=True),
            headers=headers,
            body=bytes(body),
        )

    async def send(self, *events: Any) -> None:
        data = b"".join(self.h11.send(event) or b"" for event in events)
        with trio.fail_after(WRITE_SECONDS):
            await self.stream.send_all(data)

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        all_headers = [
            ("audit-id", str(uuid.uuid4())),
            ("cache-control", "no-cache, private"),
            ("content-type", content_type),
            ("content-length", str(len(body))),
            *(headers or []),
        ]
        reason = HTTPStatus(status).phrase.encode()
        await self.send(
            h11.Response(status_code=status, headers=all_headers, reason=reason),
            h11.Data(data=body),
            h11.EndOfMessage(),
        )

    async def respond_json(self, status: int, obj: Mapping[str, Any]) -> None:
        await self.respond(status, json.dumps(obj, separators=(",", ":")).encode())


class FakeKubernetes:
    """A kube-apiserver for pods in one namespace, each pod a container on the Docker engine.

    Use :func:`fake_kubernetes`. For tests: :attr:`url`, :attr:`token`, :meth:`write_kubeconfig`,
    :attr:`pods` (the store: name → :class:`~.pods.FakePod`, whose ``object`` is the pod as the
    API shows it and ``container_id`` its Docker container), :attr:`requests` (method, target,
    status of each request answered), :meth:`docker_containers`, :attr:`before_request` (called
    with each request before its token is checked: e.g. to rotate the token at a given call).
    """

    def __init__(
        self,
        *,
        pool: DockerPool,
        kubelet: Kubelet,
        store: PodStore,
        secret_store: SecretStore,
        network_policies: NetworkPolicyStore | None = None,
        token: str,
        instance: str,
        stream_idle_seconds: float,
    ) -> None:
        self.url = ""
        self.token = token
        self.namespace = store.namespace
        self.instance = instance
        # The Docker label every container of this fake carries (key=value, for filters).
        self.label = f"{FAKE_LABEL}={instance}"
        self.store = store
        self.secret_store = secret_store
        self.network_policies = network_policies or NetworkPolicyStore(store)
        self.kubelet = kubelet
        self.requests: deque[tuple[str, str, int]] = deque(maxlen=10_000)
        self.before_request: Callable[[Request], None] | None = None
        self._pool = pool
        self._stream_idle_seconds = stream_idle_seconds
        self._nursery: trio.Nursery | None = None

    @property
    def pods(self) -> Mapping[str, FakePod]:
        return self.store.pods

    @property
    def secrets(self) -> Mapping[str, dict[str, Any]]:
        """The stored Secrets by name, as the API shows them (``data`` in base64)."""
        return self.secret_store.secrets

    @property
    def errors(self) -> list[BaseException]:
        """What failed inside the fake (raised again at its exit): a bug, or Docker failing."""
        return self.kubelet.errors

    def write_kubeconfig(self, path: Path | str) -> Path:
        """A kubeconfig whose current context is this server, its token and namespace."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kube-fake", "cluster": {"server": self.url}}],
            "users": [{"name": "kube-fake", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "kube-fake",
                    "context": {
                        "cluster": "kube-fake",
                        "user": "kube-fake",
                        "namespace": self.namespace,
                    },
                }
            ],
            "current-context": "kube-fake",
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(config))
        return target

    async def docker_containers(self) -> list[str]:
        """The ids of the Docker containers (running or not) this fake made and still has."""

        def listing(client: docker.APIClient) -> list[str]:
            found = client.containers(all=True, filters={"label": self.label}, quiet=True)
            return [str(c["Id"]) for c in found]

        return await self._pool.run(listing)

    # --- connections ---------------------------------------------------------------------

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        conn = _Connection(stream)
        try:
            await self._serve(conn)
        except Exception as exc:
            if not _disconnected(exc):
                self.errors.append(exc)
        finally:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()

    async def _serve(self, conn: _Connection) -> None:
        while True:
            try:
                request = await conn.read_request()
            except _BodyTooLarge:
                error = ApiError(
                    413,
                    "RequestEntityTooLarge",
                    f"Request entity too large: limit is {MAX_BODY_BYTES}",
                )
                await conn.respond_json(413, error.status())
                return
            except h11.RemoteProtocolError as exc:
                if conn.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status = exc.error_status_hint
                    await conn.respond(status, HTTPStatus(status).phrase.encode(), "text/plain")
                return
            if request is None:
                return
            keep = await self._dispatch(conn, request)
            if not keep or conn.h11.our_state is h11.MUST_CLOSE:
                return
            try:
                conn.h11.start_next_cycle()
            except h11.LocalProtocolError:
                return

    def _authorized(self, request: Request) -> bool:
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            credential = ""
            for protocol in _protocols(request):
                if protocol.startswith(TOKEN_PROTOCOL):
                    encoded = protocol.removeprefix(TOKEN_PROTOCOL)
                    try:
                        credential = base64.urlsafe_b64decode(
                            encoded + "=" * (-len(encoded) % 4)
                        ).decode()
                    except (binascii.Error, UnicodeDecodeError):
                        credential = ""
        return hmac.compare_digest(credential.strip().encode(), self.token.encode())

    async def _dispatch(self, conn: _Connection, request: Request) -> bool:
        """Answer one request; False when the connection cannot serve another."""
        status = 200
        try:
            status, keep = await self._route(conn, request)
        except ApiError as error:
            status, keep = error.code, True
            await conn.respond_json(error.code, error.status())
        except Exception as exc:
            if _disconnected(exc):
                raise
            # A bug of the fake (or Docker failing it): a 500 here, an error at the fake's exit.
            self.errors.append(exc)
            status, keep = 500, False
            if conn.h11.our_state is h11.SEND_RESPONSE:
                failure = ApiError(500, "InternalError", f"Internal error occurred: {exc!r}")
                await conn.respond_json(500, failure.status())
        self.requests.append((request.method, request.target, status))
        return keep

    async def _route(self, conn: _Connection, request: Request) -> tuple[int, bool]:
        if self.before_request is not None:
            self.before_request(request)
        if not self._authorized(request):
            raise UNAUTHORIZED
        parts = [part for part in request.path.split("/") if part]
        method = request.method
        document = _version() if parts == ["version"] else _discovery(parts, self.url)
        if document is not None:
            _allow(method, "GET")
            await conn.respond_json(200, document)
            return 200, True
        if parts == ["api", "v1", "pods"]:
            _allow(method, "GET")
            return await self._list(conn, request, None)
        if parts == ["api", "v1", "secrets"]:
            _allow(method, "GET")
            return await self._list_secrets(conn, request, None)
        if parts[:4] == ["apis", "networking.k8s.io", "v1", "namespaces"] and len(parts) in (6, 7):
            if parts[5] != "networkpolicies":
                raise UNKNOWN_PATH
            return await self._route_network_policies(conn, request, parts[4], parts[6:])
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 4:
            raise UNKNOWN_PATH
        if parts[4:5] == ["secrets"] and len(parts) <= 6:
            return await self._route_secrets(conn, request, parts[3], parts[5:])
        return await self._route_namespaced(conn, request, parts[3], parts[4:])

    async def _route_namespaced(
        self, conn: _Connection, request: Request, namespace: str, rest: list[str]
    ) -> tuple[int, bool]:
        method = request.method
        if not rest:
            _allow(method, "GET")
            if namespace != self.namespace:
                raise not_found("namespaces", namespace)
            await conn.respond_json(200, self._namespace_object())
            return 200, True
        if rest == ["pods"]:
            _allow(method, "GET", "POST")
            if method == "POST":
                return await self._create(conn, request, namespace)
            return await self._list(conn, request, namespace)
        if len(rest) == 2 and rest[0] == "pods":
            _allow(method, "GET", "DELETE")
            pod = self._pod(namespace, rest[1])
            if method == "DELETE":
                return await self._delete(conn, request, pod)
            await conn.respond_json(200, copy.deepcopy(pod.object))
            return 200, True
        if len(rest) == 3 and rest[0] == "pods" and rest[2] == "attach":
            _allow(method, "GET", "POST")
            return await self._attach(conn, request, self._pod(namespace, rest[1]))
        raise UNKNOWN_PATH

    async def _route_secrets(
        self, conn: _Connection, request: Request, namespace: str, rest: list[str]
    ) -> tuple[int, bool]:
        method = request.method
        if not rest:
            _allow(method, "GET", "POST")
            if method == "POST":
                return await self._create_secret(conn, request, namespace)
            return await self._list_secrets(conn, request, namespace)
        _allow(method, "GET", "DELETE")
        secret = self.secret_store.get(rest[0]) if namespace == self.namespace else None
        if secret is None:
            raise not_found("secrets", rest[0])
        answer = secret
        if method == "DELETE":
            _check_preconditions(secret, _delete_options(request), "secrets")
            answer = deleted_status(self.secret_store.remove(rest[0]))
        await conn.respond_json(200, answer)
        return 200, True

    async def _route_network_policies(
        self, conn: _Connection, request: Request, namespace: str, rest: list[str]
    ) -> tuple[int, bool]:
        method = request.method
        if not rest:
            _allow(method, "GET", "POST")
            if method == "POST":
                try:
                    body = json.loads(request.body)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise bad_request(
                        "the object provided is unrecognized (must be of type NetworkPolicy): "
                        f"json parse error: {exc}"
                    ) from exc
                if namespace != self.namespace:
                    raise not_found("namespaces", namespace)
                policy = admit_network_policy(body, namespace=namespace)
                await conn.respond_json(201, self.network_policies.add(policy))
                return 201, True
            selection = Selection(
                labels=tuple(parse_label_selector(request.param("labelSelector") or ""))
            )
            items = self.network_policies.listing(selection) if namespace == self.namespace else []
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
            await conn.respond_json(
                200,
                {
                    "kind": "NetworkPolicyList",
                    "apiVersion": GROUP_VERSION,
                    "metadata": {"resourceVersion": str(self.store.resource_version)},
                    "items": items,
                },
            )
            return 200, True
        _allow(method, "GET", "DELETE")
        found = self.network_policies.get(rest[0]) if namespace == self.namespace else None
        if found is None:
            raise not_found("networkpolicies.networking.k8s.io", rest[0])
        answer: dict[str, Any] = found
        if method == "DELETE":
            _check_preconditions(found, _delete_options(request), "networkpolicies")
            removed = self.network_policies.remove(rest[0])
            answer = deleted_status(removed) | {
                "details": {
                    "name": rest[0],
                    "group": "networking.k8s.io",
                    "kind": "networkpolicies",
                    "uid": removed["metadata"]["uid"],
                }
            }
        await conn.respond_json(200, answer)
        return 200, True

    def _pod(self, namespace: str, name: str) -> FakePod:
        pod = self.store.get(name) if namespace == self.namespace else None
        if pod is None:
            raise not_found("pods", name)
        return pod

    def _namespace_object(self) -> dict[str, Any]:
        return {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": self.namespace,
                "labels": {"kubernetes.io/metadata.name": self.namespace},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    # --- secrets -------------------------------------------------------------------------

    async def _create_secret(
        self, conn: _Connection, request: Request, namespace: str
    ) -> tuple[int, bool]:
        try:
            body = json.loads(request.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(
                "the object provided is unrecognized (must be of type Secret): couldn't get "
                f"version/kind; json parse error: {exc}"
            ) from exc
        if namespace != self.namespace:
            raise not_found("namespaces", namespace)
        secret = admit_secret(body, namespace=namespace)
        if request.param("dryRun") is not None:
            name = secret["metadata"]["name"]
            if self.secret_store.get(name) is not None:
                raise already_exists(name, "secrets")
            await conn.respond_json(201, secret)
            return 201, True
        await conn.respond_json(201, self.secret_store.add(secret))
        return 201, True

    async def _list_secrets(
        self, conn: _Connection, request: Request, namespace: str | None
    ) -> tuple[int, bool]:
        if request.flag("watch"):
            raise bad_request("watching secrets is not supported by the fake API server")
        fields = parse_field_selector(request.param("fieldSelector") or "", SECRET_FIELDS)
        selection = Selection(
            labels=tuple(parse_label_selector(request.param("labelSelector") or "")),
            fields=tuple(fields),
        )
        items = []
        if namespace in (None, self.namespace):
            items = self.secret_store.listing(selection)
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        await conn.respond_json(
            200,
            {
                "kind": "SecretList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.store.resource_version)},
                "items": items,
            },
        )
        return 200, True

    # --- pods ----------------------------------------------------------------------------

    async def _create(
        self, conn: _Connection, request: Request, namespace: str
    ) -> tuple[int, bool]:
        try:
            body = json.loads(request.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(
                "the object provided is unrecognized (must be of type Pod): couldn't get "
                f"version/kind; json parse error: {exc}"
            ) from exc
        if namespace != self.namespace:
            raise not_found("namespaces", namespace)
        obj = admit_pod(body, namespace=namespace)
        name = obj["metadata"]["name"]
        if self.store.get(name) is not None:
            raise ApiError(
                409,
                "AlreadyExists",
                f'pods "{name}" already exists',
                {"name": name, "kind": "pods"},
            )
        if request.param("dryRun") is not None:
            await conn.respond_json(201, obj)
            return 201, True
        pod = FakePod(obj, grace_seconds=int(obj["spec"]["terminationGracePeriodSeconds"]))
        self.store.add(pod)
        assert self._nursery is not None
        self._nursery.start_soon(self.kubelet.run, pod)
        await conn.respond_json(201, copy.deepcopy(pod.object))
        return 201, True

    def _selection(self, request: Request) -> Selection:
        return Selection(
            labels=tuple(parse_label_selector(request.param("labelSelector") or "")),
            fields=tuple(parse_field_selector(request.param("fieldSelector") or "")),
        )

    async def _list(
        self, conn: _Connection, request: Request, namespace: str | None
    ) -> tuple[int, bool]:
        selection = self._selection(request)
        if namespace is not None:
            in_namespace = FieldRequirement("metadata.namespace", namespace, equal=True)
            selection = Selection(selection.labels, (*selection.fields, in_namespace))
        if request.flag("watch"):
            return await self._watch(conn, request, selection)
        items = self.store.listing(selection)
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        await conn.respond_json(
            200,
            {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.store.resource_version)},
                "items": items,
            },
        )
        return 200, True

    async def _watch(
        self, conn: _Connection, request: Request, selection: Selection
    ) -> tuple[int, bool]:
        since_text = request.param("resourceVersion") or ""
        since: int | None = None
        if since_text not in ("", "0"):
            try:
                since = int(since_text)
            except ValueError as exc:
                raise bad_request(f'invalid resource version "{since_text}"') from exc
        timeout_text = request.param("timeoutSeconds")
        try:
            timeout = int(timeout_text) if timeout_text else DEFAULT_WATCH_SECONDS
        except ValueError as exc:
            raise bad_request(f'invalid timeoutSeconds "{timeout_text}"') from exc
        watcher = self.store.watch(selection, since)
        try:
            await conn.send(
                h11.Response(
                    status_code=200,
                    headers=[
                        ("audit-id", str(uuid.uuid4())),
                        ("cache-control", "no-cache, private"),
                        ("content-type", "application/json"),
                        ("transfer-encoding", "chunked"),
                    ],
                )
            )
            clean = await self._stream_watch(conn, watcher, trio.current_time() + timeout)
        finally:
            self.store.unwatch(watcher)
        if clean:
            await conn.send(h11.EndOfMessage())
        return 200, clean

    async def _stream_watch(self, conn: _Connection, watcher: Watcher, deadline: float) -> bool:
        """Send the watcher's lines until the deadline (True), or until the client hangs up,
        stops reading while its queue overflows, or takes too long over a write (False)."""
        hung_up = False
        outcome = False
        async with trio.open_nursery() as nursery:

            async def notice_hang_up() -> None:
                nonlocal hung_up
                with contextlib.suppress(*_CONNECTION_ERRORS):
                    await conn.stream.receive_some(1)
                hung_up = True
                nursery.cancel_scope.cancel()

            async def send_lines() -> None:
                nonlocal outcome
                with contextlib.suppress(*_CONNECTION_ERRORS):
                    outcome = await _send_watch_lines(conn, watcher, deadline)
                nursery.cancel_scope.cancel()

            nursery.start_soon(notice_hang_up)
            nursery.start_soon(send_lines)
        return outcome and not hung_up

    async def _delete(self, conn: _Connection, request: Request, pod: FakePod) -> tuple[int, bool]:
        options = _delete_options(request)
        _check_preconditions(pod.object, options, "pods")
        grace_text = request.param("gracePeriodSeconds")
        grace = options.get("gracePeriodSeconds")
        if grace_text is not None:
            try:
                grace = int(grace_text)
            except ValueError as exc:
                raise bad_request(f'invalid gracePeriodSeconds "{grace_text}"') from exc
        if grace is None:
            grace = int(pod.object["spec"]["terminationGracePeriodSeconds"])
        if not isinstance(grace, int) or grace < 0:
            raise bad_request(f"gracePeriodSeconds must be a non-negative integer, not {grace!r}")
        if pod.deleting:
            await conn.respond_json(200, copy.deepcopy(pod.object))
            return 200, True
        # As the pod strategy decides: not scheduled, or already ended, is deleted at once.
        if not pod.object["spec"].get("nodeName") or pod.phase in _TERMINAL:
            grace = 0
        pod.deleting = True
        pod.grace_seconds = grace

        def mark(obj: dict[str, Any]) -> None:
            obj["metadata"]["deletionTimestamp"] = _later(grace)
            obj["metadata"]["deletionGracePeriodSeconds"] = grace

        if grace == 0:
            mark(pod.object)
            self.store.remove(pod)
        else:
            self.store.update(pod, mark)
        answer = copy.deepcopy(pod.object)
        pod.delete_requested.set()
        pod.life.cancel()
        await conn.respond_json(200, answer)
        return 200, True

    # --- attach --------------------------------------------------------------------------

    async def _attach(self, conn: _Connection, request: Request, pod: FakePod) -> tuple[int, bool]:
        stdin, stdout, stderr = (request.flag(name) for name in ("stdin", "stdout", "stderr"))
        if not (stdin or stdout or stderr):
            raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
        container = pod.object["spec"]["containers"][0]
        name = request.param("container") or container["name"]
        if name != container["name"]:
            raise bad_request(f"container {name} is not valid for pod {pod.name}")
        if not pod.object["spec"].get("nodeName"):
            raise bad_request(f"pod {pod.name} does not have a host assigned")
        key = request.headers.get("sec-websocket-key", "")
        upgrade = request.headers.get("upgrade", "").lower() == "websocket"
        if not upgrade or not key:
            raise bad_request("Upgrade request required")
        if request.headers.get("sec-websocket-version") != "13":
            await conn.respond(400, b"", "text/plain", [("sec-websocket-version", "13")])
            return 400, False
        offered = [p for p in _protocols(request) if not p.startswith(TOKEN_PROTOCOL)]
        protocol = (
            attach.V5 if attach.V5 in offered else attach.V4 if attach.V4 in offered else None
        )
        if protocol is None:
            # What the apiserver's (x/net/websocket) handshake answers: 403, nothing else.
            await conn.respond(403, b"", "text/plain")
            return 403, False
        running = "running" in pod.container_state and pod.container_id is not None
        docker_socket = (
            await self._docker_attach(pod, container, stdin, stdout, stderr) if running else None
        )
        missing = f'container not found ("{name}")'
        if docker_socket is None:
            if protocol == attach.V4:
                # The kubelet's refusal, passed through by the API server's proxy.
                await conn.respond(500, missing.encode(), "text/plain; charset=utf-8")
                return 500, False
            ws = await self._upgrade(conn, key, protocol)
            await attach.refuse_after_upgrade(
                ws,
                f"unable to upgrade connection: {missing}",
                opening=attach.opening_channel(stdout=stdout, stderr=stderr),
            )
            return 101, False
        docker_stream = trio.SocketStream(trio.socket.from_stdlib_socket(docker_socket))
        try:
            ws = await self._upgrade(conn, key, protocol)
            await attach.bridge(ws, docker_stream, stdin=stdin, stdout=stdout, stderr=stderr)
        finally:
            with trio.CancelScope(shield=True):
                await docker_stream.aclose()
        return 101, False

    async def _upgrade(self, conn: _Connection, key: str, protocol: str) -> attach.ChannelWebSocket:
        """Accept the WebSocket (101) with ``protocol``; the channel socket over the stream."""
        await conn.send(
            h11.InformationalResponse(
                status_code=101,
                headers=[
                    ("upgrade", "websocket"),
                    ("connection", "Upgrade"),
                    ("sec-websocket-accept", generate_accept_token(key.encode()).decode()),
                    ("sec-websocket-protocol", protocol),
                ],
            )
        )
        received, _ = conn.h11.trailing_data
        return attach.ChannelWebSocket(
            conn.stream, protocol, received, write_timeout=self._stream_idle_seconds
        )

    async def _docker_attach(
        self, pod: FakePod, container: Mapping[str, Any], stdin: bool, stdout: bool, stderr: bool
    ) -> socket.socket | None:
        """Docker's attach socket for the pod's container; None when it is not running."""
        container_id = pod.container_id
        assert container_id is not None
        params = {
            "stdin": int(stdin and bool(container.get("stdin"))),
            "stdout": int(stdout),
            "stderr": int(stderr),
            "stream": 1,
        }

        def attach_socket(client: docker.APIClient) -> socket.socket | None:
            try:
                raw = client.attach_socket(container_id, params=params)
            except docker.errors.APIError:
                return None  # stopped or gone meanwhile
            return detach_socket(raw)

        return await self._pool.run(attach_socket)


def detach_socket(raw: Any) -> socket.socket:
    """A standalone non-blocking socket for the hijacked attach connection docker-py returns
    (wrapped in HTTP response objects that close it when garbage collected: a duplicate of
    the descriptor outlives them)."""
    inner = getattr(raw, "_sock", raw)
    duplicate = socket.socket(fileno=os.dup(inner.fileno()))
    response = getattr(raw, "_response", None)
    if response is not None:
        response.close()
    else:
        raw.close()
    duplicate.setblocking(False)
    return duplicate


def _disconnected(exc: BaseException) -> bool:
    """Whether ``exc`` only says that the client went away or stopped reading."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_disconnected(inner) for inner in exc.exceptions)
    return isinstance(exc, _CONNECTION_ERRORS)


def _protocols(request: Request) -> list[str]:
    header = request.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise METHOD_NOT_ALLOWED


def _version() -> dict[str, str]:
    major, minor = GIT_VERSION.removeprefix("v").split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": GIT_VERSION,
        "gitCommit": "0" * 40,
        "gitTreeState": "clean",
        "buildDate": "2024-04-17T00:00:00Z",
        "goVersion": "go1.22.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def _discovery(parts: list[str], url: str) -> dict[str, Any] | None:
    """The discovery documents of the core group (what clients such as kr8s's ``get`` read):
    ``/api``, ``/api/v1`` (namespaces, pods, pods/attach, secrets) and ``/apis`` (no other
    groups)."""
    if parts == ["api"]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": url.removeprefix("http://")}
            ],
        }
    if parts == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
    if parts != ["api", "v1"]:
        return None
    pods = ["create", "delete", "get", "list", "watch"]
    return {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": "namespaces", "singularName": "namespace", "namespaced": False,
             "kind": "Namespace", "verbs": ["get"], "shortNames": ["ns"]},
            {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
             "verbs": pods, "shortNames": ["po"], "categories": ["all"]},
            {"name": "pods/attach", "singularName": "", "namespaced": True,
             "kind": "PodAttachOptions", "verbs": ["create", "get"]},
            {"name": "secrets", "singularName": "secret", "namespaced": True,
             "kind": "Secret", "verbs": ["create", "delete", "get", "list"]},
        ],
    }  # fmt: skip


def _later(seconds: int) -> str:
    return timestamp(datetime.now(UTC) + timedelta(seconds=seconds))


def _delete_options(request: Request) -> dict[str, Any]:
    """The request's DeleteOptions (its body); {} without one."""
    if not request.body.strip():
        return {}
    try:
        options = json.loads(request.body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"couldn't decode DeleteOptions: {exc}") from exc
    if not isinstance(options, dict):
        raise bad_request("couldn't decode DeleteOptions: not an object")
    return options


def _check_preconditions(obj: Mapping[str, Any], options: Mapping[str, Any], kind: str) -> None:
    """409 Conflict when the DeleteOptions' preconditions do not hold for ``obj``."""
    meta = obj["metadata"]
    name = meta["name"]
    preconditions = options.get("preconditions") or {}
    for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(key)
        if wanted is not None and wanted != meta[key]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind} "{name}": Precondition failed: '
                f"{label} in precondition: {wanted}, {label} in object meta: {meta[key]}",
                {"name": name, "kind": kind},
            )


async def _send_watch_lines(conn: _Connection, watcher: Watcher, deadline: float) -> bool:
    while True:
        line = None
        with trio.move_on_at(deadline) as timer:
            line = await watcher.next_line()
        if timer.cancelled_caught or line is None or watcher.overflowed:
            return True
        with trio.CancelScope() as write:
            watcher.write_scope = write
            await conn.send(h11.Data(data=line))
        watcher.write_scope = None
        if write.cancelled_caught:
            return False


@asynccontextmanager
async def fake_kubernetes(
    *,
    claims: Mapping[str, Path] | None = None,
    namespace: str = "default",
    token: str | None = None,
    stream_idle_seconds: float = 300.0,
    watch_queue: int = WATCH_QUEUE,
) -> AsyncIterator[FakeKubernetes]:
    """A fake API server on 127.0.0.1 (a free port), for as long as the context lasts.

    ``claims``: PersistentVolumeClaim name → host directory (what a pod's claim mounts).
    ``namespace``: the one namespace that exists. ``token``: the bearer token it requires
    (default: a random one). ``stream_idle_seconds``: how long an attach may wait for a client
    to take output (kubelet: 4 h). ``watch_queue``: events a watcher may have pending.

    On exit every pod's work stops and every container the fake made is removed (shielded,
    within ``CLEANUP_SECONDS``), and the secret volumes' files with them.
    """
    pool = await trio.to_thread.run_sync(DockerPool.connect)
    created: set[str] = set()
    instance = uuid.uuid4().hex[:12]
    label = f"{FAKE_LABEL}={instance}"
    volumes = SecretVolumes()
    error: BaseException | None = None
    try:
        node = await trio.to_thread.run_sync(node_of_engine, pool)
        store = PodStore(namespace, watch_queue=watch_queue)
        secret_store = SecretStore(store)
        network_policies = NetworkPolicyStore(store)
        kubelet = Kubelet(
            store,
            pool,
            secrets=secret_store,
            network_policies=network_policies,
            volumes=volumes,
            node=node,
            claims={name: Path(path) for name, path in (claims or {}).items()},
            labels={FAKE_LABEL: instance},
            created=created,
        )
        fake = FakeKubernetes(
            pool=pool,
            kubelet=kubelet,
            store=store,
            secret_store=secret_store,
            network_policies=network_policies,
            token=token or secrets.token_urlsafe(32),
            instance=instance,
            stream_idle_seconds=stream_idle_seconds,
        )
        async with trio.open_nursery() as nursery:
            fake._nursery = nursery
            listeners = await nursery.start(
                partial(trio.serve_tcp, fake.serve_connection, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            fake.url = f"http://127.0.0.1:{port}"
            try:
                yield fake
            except BaseException as exc:  # re-raised below, outside the nursery's group
                error = exc
            finally:
                store.close()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
            await trio.to_thread.run_sync(
                partial(remove_all, pool, created, label), abandon_on_cancel=True
            )
            # The secret volumes' files, once no container binds them.
            await trio.to_thread.run_sync(volumes.close)
        pool.close()
    if error is not None:
        raise error
    if fake.errors:
        raise RuntimeError(f"the fake API server failed: {fake.errors!r}") from fake.errors[0]
