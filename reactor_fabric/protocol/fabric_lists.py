"""What a fabric-endpoint session lists, without I/O: the services it shows, its lists, and who
is told when they change.

A field of :class:`~.fabric_server.FabricServer`. The session shows every service of its
catalog (exposure ``all``) or its active ones (``discover``: the endpoint's own tools, then
those of the services the client activated by the meta-tools); its ``tools/list``,
``prompts/list``, ``resources/list`` and ``resources/templates/list`` are those services'
entries under their shown names (:mod:`.catalog`). A 2026-07-28 client's lists are its own and
never change within a connection: they say so (private, not to be cached), and activation shows
only after it reconnects. A handshake-era client is told when its tool list changes
(``notifications/tools/list_changed``), by an activation or by a refresh of a service it lists;
a 2026-07-28 client that opened a subscription (``subscriptions/listen``, at most
:data:`MAX_LISTENERS` per session) is told on it of the kinds it asked for, each message naming
the subscription, which is answered when the session ends.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from .catalog import Catalog
from .events import Action, ToClient
from .fabric_messages import CACHE_PRIVATE, notification, notification_bytes
from .fabric_meta_tools import Exposure, listed_tools, shown

Json = dict[str, Any]

MAX_LISTENERS = 8
SUBSCRIPTION_META = "io.modelcontextprotocol/subscriptionId"
# Each kind of list, and what a subscription asks to hear of its changes.
LISTEN_KEYS = {
    "tools": "toolsListChanged",
    "prompts": "promptsListChanged",
    "resources": "resourcesListChanged",
}


class Lists:
    """The services a session shows and its subscriptions to their lists' changes."""

    def __init__(self, catalog: Catalog, exposure: Exposure, active: set[str]) -> None:
        self.exposure: Exposure = exposure
        self.active: list[str] = [s for s in catalog.services if s in active]
        # Open 2026-07-28 subscriptions/listen requests: their id → what they asked for.
        self.listeners: dict[object, Json] = {}

    def shown(self, catalog: Catalog) -> list[str]:
        return shown(catalog, self.exposure, self.active)

    def tools(self, catalog: Catalog) -> list[Json]:
        return listed_tools(catalog, self.exposure, self.active)

    def listing(self, kind: str, catalog: Catalog, *, stateless: bool) -> Json:
        """The result of the session's list of ``kind`` (tools, prompts, resources or
        resourceTemplates)."""
        if kind == "tools":
            entries = self.tools(catalog)
        elif kind == "prompts":
            entries = catalog.prompts_of(self.shown(catalog))
        elif kind == "resources":
            entries = catalog.resources_of(self.shown(catalog))
        else:
            services = catalog.services
            entries = [t for s in self.shown(catalog) for t in services[s].resource_templates]
        # 2026-07-28 list results say how long they may be cached; this session's lists are
        # its own (its mounts, its activation): private, and re-asked each time.
        return {**CACHE_PRIVATE, kind: entries} if stateless else {kind: entries}

    def activate(self, active: Sequence[str], catalog: Catalog, *, stateless: bool) -> list[Action]:
        """Set the active services; tell a handshake-era client if its tool list changed."""
        before = self.tools(catalog) if not stateless else None
        self.active = list(active)
        if before is None or before == self.tools(catalog):
            return []
        return [notification("notifications/tools/list_changed")]

    def listen(self, request_id: object, params: Json) -> ToClient | None:
        """A 2026-07-28 client opens its stream of list changes (answered when it ends): its
        acknowledgement (None: it has as many as it may)."""
        if len(self.listeners) >= MAX_LISTENERS:
            return None
        asked = params.get("notifications")
        asked = asked if isinstance(asked, dict) else {}
        honoured = {key: True for key in LISTEN_KEYS.values() if asked.get(key) is True}
        self.listeners[request_id] = honoured
        # Everything on a subscription's stream names it in _meta (how clients demultiplex).
        ack = {"notifications": honoured, "_meta": {SUBSCRIPTION_META: request_id}}
        return ToClient(notification_bytes("notifications/subscriptions/acknowledged", ack))

    def announce(
        self, refreshed: Iterable[tuple[str, str, object]], catalog: Catalog, *, stateless: bool
    ) -> list[Action]:
        """Lists were refreshed (service, kind, entries): for each kind, the subscriptions that
        asked are told, and a handshake-era client if it shows a service refreshed."""
        actions: list[Action] = []
        for kind, key in LISTEN_KEYS.items():
            services = [service for service, k, _entries in refreshed if k == kind]
            if not services:
                continue
            method = f"notifications/{kind}/list_changed"
            actions += [
                ToClient(notification_bytes(method, {"_meta": {SUBSCRIPTION_META: listen_id}}))
                for listen_id, wants in self.listeners.items()
                if wants.get(key)
            ]
            shown_now = self.shown(catalog)
            if not stateless and any(service in shown_now for service in services):
                actions.append(notification(method))
        return actions

    def end(self) -> list[tuple[object, Json]]:
        """The session ends: each subscription, and its last answer."""
        ended = [
            (request_id, {"resultType": "complete", "_meta": {SUBSCRIPTION_META: request_id}})
            for request_id in self.listeners
        ]
        self.listeners.clear()
        return ended

    def clone(self) -> Lists:
        twin = copy.copy(self)
        twin.active = list(self.active)
        twin.listeners = dict(self.listeners)
        return twin

    def fingerprint(self) -> tuple[object, ...]:
        return (
            tuple(self.active),
            self.exposure,
            tuple(sorted((repr(i), msgspec.json.encode(w)) for i, w in self.listeners.items())),
        )
