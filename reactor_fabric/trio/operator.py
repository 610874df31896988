"""The operators' routes: metrics, live sessions (and ending one), recent calls, the status page.

====================================  ==========================================================
``GET /metrics``                      Prometheus text format (:mod:`..observe.metrics`)
``GET /api/sessions``                 live sessions with their containers and mounts
``DELETE /api/sessions/{id}``         end a session: its requests in flight are answered, its
                                      client told why, its containers removed
``GET /api/calls``                    recent tool calls, newest first (``?session=``,
                                      ``?service=``, ``?tool=``, ``?outcome=``, ``?limit=``)
``GET /api/stats``                    the last hour, per minute (the status page's charts)
``GET /``                             the status page (:mod:`..observe.page`)
====================================  ==========================================================

Every route is behind the same gate as the MCP routes (Origin/Host, then the token): the
caller has already admitted the request, and says who made it (its principal). With users
signing in (``auth.mode: oidc``) a user sees and ends their own sessions and calls only, and
the last hour's figures of their own calls; the metrics, which count everyone's, are for
operators (``auth.operators``) — a user gets 403 there. The orchestrator's token's holder is
an operator.

What the JSON routes answer with is encoded by the audit trail's own redaction
(:meth:`~..observe.redaction.Redactor.redacted_json`): a secret's value a client or a server
put into a tool's name, a request id, an error's reason, a user agent, a mount's path or a
drift record's names is shown as ``[REDACTED]``, as the trail writes it. (The tool calls are
kept redacted already, as their records were written: see :mod:`..observe.observer`.)
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

import trio

from ..observe.audit import now_iso
from ..observe.metrics import CONTENT_TYPE
from ..observe.observer import Observer
from ..observe.page import PAGE_HEADERS, STATUS_PAGE
from ..observe.redaction import SECRET_VALUES
from ..observe.status import SessionView, recent_calls, record_user, sessions_json, stats
from ..policy.principal import TOKEN_HOLDER, Principal
from ..protocol.settings import Settings
from .catalog_service import CatalogService
from .http_server import HttpExchange
from .registry import SessionRecord, SessionRegistry

SESSIONS_PREFIX = "/api/sessions/"


def is_operator_route(path: str) -> bool:
    return path in ("/", "/metrics", "/api/sessions", "/api/calls", "/api/stats") or (
        path.startswith(SESSIONS_PREFIX)
    )


async def serve_operator(
    exchange: HttpExchange,
    *,
    registry: SessionRegistry,
    catalog: CatalogService,
    settings: Settings,
    observer: Observer,
    principal: Principal = TOKEN_HOLDER,
) -> None:
    """Answer one operator request from ``principal`` (see the module docstring): the
    sessions from ``registry``, the suite lock's drift from ``catalog`` (with ``settings``'
    lock), the metrics and recent calls from ``observer``."""
    request = exchange.request
    path, method = request.path, request.method
    if path.startswith(SESSIONS_PREFIX):
        if method != "DELETE":
            await exchange.respond_json(405, {"error": "method not allowed"}, allow="DELETE")
            return
        session_id = path[len(SESSIONS_PREFIX) :]
        record = registry.sessions.get(session_id)
        if record is None or not _sees(principal, record):
            await exchange.respond_json(404, {"error": "no such session", "session": session_id})
            return
        if not registry.end_session(session_id):
            await exchange.respond_json(404, {"error": "no such session", "session": session_id})
            return
        await exchange.respond_json(200, {"ended": session_id})
        return
    if method not in ("GET", "HEAD"):
        await exchange.respond_json(405, {"error": "method not allowed"}, allow="GET, HEAD")
        return
    observer.flush()  # the calls held for the next batch (see .audit_batches) count too
    if path == "/metrics" and not principal.operator:
        await exchange.respond_json(
            403, {"error": "for operators only (auth.operators)", "user": principal.user}
        )
        return
    if path == "/metrics":
        body = await trio.to_thread.run_sync(observer.metrics.exposition)
        await exchange.respond(200, body, content_type=CONTENT_TYPE.encode())
    elif path == "/api/sessions":
        answer = sessions_json(session_views(registry, principal))
        if settings.lock is not None:  # what differs from the suite lock (the page shows it)
            answer["lock_drift"] = {"mode": settings.lock_mode, "drift": catalog.drift_records()}
        await _shown(exchange, answer)
    elif path == "/api/calls":
        query = parse_qs(request.query)

        def one(name: str) -> str | None:
            values = query.get(name)
            return values[-1] if values else None

        limit = one("limit")
        calls = recent_calls(
            observer.calls,
            session=one("session"),
            service=one("service"),
            tool=one("tool"),
            outcome=one("outcome"),
            limit=int(limit) if limit is not None and limit.isdigit() else 100,
            user=None if principal.operator else principal.user,
        )
        await _shown(exchange, {"calls": calls})
    elif path == "/api/stats":
        await _shown(exchange, _figures(observer, principal))
    else:
        await exchange.respond(
            200, STATUS_PAGE, content_type=b"text/html; charset=utf-8", headers=PAGE_HEADERS
        )


def _figures(observer: Observer, principal: Principal) -> dict[str, Any]:
    """The last hour's figures ``principal`` sees: everyone's for an operator, else their own
    calls' (container starts are no one user's: none)."""
    if principal.operator:
        return stats(observer.calls, observer.starts, now=time.time())
    own = [call for call in observer.calls if record_user(call.record) == principal.user]
    return stats(own, (), now=time.time())


async def _shown(exchange: HttpExchange, answer: dict[str, Any]) -> None:
    """A 200 JSON answer, encoded as the audit trail encodes a record (secrets redacted)."""
    await exchange.respond(200, SECRET_VALUES.redacted_json(answer))


def _sees(principal: Principal, record: SessionRecord) -> bool:
    """Whether ``principal`` sees the session: an operator every one, a user their own."""
    if principal.operator:
        return True
    return record.client is not None and record.client.user == principal.user


def session_views(
    registry: SessionRegistry, principal: Principal = TOKEN_HOLDER
) -> dict[str, SessionView]:
    """The sessions ``principal`` sees, as the API shows them."""
    now = trio.current_time()
    containers: dict[str, list[dict[str, Any]]] = {}
    for container_id, record in registry.containers.items():
        containers.setdefault(record.session, []).append(
            {
                "id": container_id[:12],
                "name": record.name,
                "service": record.service,
                "image": record.image,
                "started_at": now_iso(record.started_at),
            }
        )
    wall = time.time()

    def served(record: SessionRecord) -> list[dict[str, Any]]:
        """Which container served which call (fabric endpoint sessions), wall-clock times."""
        if record.served is None:
            return []
        shown = record.served.wall_records(record.served_since, wall - (now - record.served_since))
        for entry in shown:
            for name in ("started_at", "ended_at"):
                at = entry.pop(name)
                entry[name] = None if at is None else now_iso(at)
        return shown

    return {
        session_id: SessionView(
            id=session_id,
            endpoint=record.endpoint,
            service=record.service,
            transport=record.transport,
            client=record.client,
            mounts=record.mount_records(),
            started_at=record.started_at,
            idle_seconds=now - record.last_active,
            containers=containers.get(session_id, []),
            recent_containers=served(record),
            parent=record.parent.record() if record.parent is not None else None,
        )
        for session_id, record in registry.sessions.items()
        if _sees(principal, record)
    }
