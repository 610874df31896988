"""The fake's storage: pods by name, one resourceVersion counter, a bounded event history, and
the watchers fed from it.

Every change of a pod (create, status change, deletion) takes the next resourceVersion — a
single counter for the whole store, as etcd's revision is — and becomes one watch event. A
watcher gets the events its label and field selectors let through, translated as the apiserver
translates them: an object that starts matching is ADDED for it, one that stops matching is
DELETED. Each watcher has a bounded queue; a watcher that lets it fill is closed (the client
lists again), so that no reader can hold up a writer.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from .api import ApiError, FieldRequirement, Requirement

FIRST_RESOURCE_VERSION: Final = 1000
HISTORY: Final = 1000
WATCH_QUEUE: Final = 256


@dataclass(eq=False)
class FakePod:
    """A stored pod, what the fake's kubelet did with it, and how its deletion goes."""

    object: dict[str, Any]
    # The Docker container running it, once created (set from the creating thread).
    container_id: str | None = None
    # The network holder of a pod an egress NetworkPolicy selects (its "pause" container).
    holder_id: str | None = None
    # Still in the store (False from the moment it was removed: a DELETED event was sent).
    stored: bool = True
    deleting: bool = False
    grace_seconds: int = 30
    delete_requested: trio.Event = field(default_factory=trio.Event)
    # The kubelet's work on the pod (scheduling, start, waiting for the exit); a deletion
    # cancels it, then the kubelet stops and removes the container.
    life: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def name(self) -> str:
        return str(self.object["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.object["metadata"]["uid"])

    @property
    def phase(self) -> str:
        return str(self.object.get("status", {}).get("phase", ""))

    @property
    def container_state(self) -> dict[str, Any]:
        """The container's ``state`` (``{"running": {...}}`` and so on); {} before any."""
        statuses = self.object.get("status", {}).get("containerStatuses") or [{}]
        state: dict[str, Any] = statuses[0].get("state") or {}
        return state


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED or DELETED
    resource_version: int
    object: dict[str, Any]
    previous: dict[str, Any] | None = None


@dataclass(frozen=True)
class Selection:
    """A list's or a watch's label and field selectors."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    def matches(self, pod: dict[str, Any]) -> bool:
        labels = pod.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in self.labels) and all(
            f.matches(pod) for f in self.fields
        )


def watch_line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def translate(selection: Selection, event: WatchEvent) -> tuple[str, dict[str, Any]] | None:
    """What ``event`` is to a watcher with ``selection``: an object that starts matching is
    ADDED for it, one that stops matching DELETED, one that never matched nothing."""
    matches_now = selection.matches(event.object)
    if event.type != "MODIFIED":
        return (event.type, event.object) if matches_now else None
    matched = event.previous is not None and selection.matches(event.previous)
    if matched and matches_now:
        return ("MODIFIED", event.object)
    if matches_now:
        return ("ADDED", event.object)
    if matched:
        return ("DELETED", event.object)
    return None


class Watcher:
    """One watch request's view of the store: lines to send, from a bounded queue."""

    def __init__(self, selection: Selection, initial: list[bytes], size: int) -> None:
        self.selection = selection
        self.initial = initial
        self._send, self._receive = trio.open_memory_channel[bytes](size)
        self.overflowed = False
        # The scope of the write in progress: cancelled when the queue overflows, so that a
        # write blocked on a client that does not read ends too.
        self.write_scope: trio.CancelScope | None = None

    def offer(self, event: WatchEvent) -> bool:
        """Queue what ``event`` means to this watcher; False when the queue overflowed."""
        translated = translate(self.selection, event)
        if translated is None:
            return True
        try:
            self._send.send_nowait(watch_line(*translated))
        except trio.WouldBlock:
            self.close(overflowed=True)
            return False
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    async def next_line(self) -> bytes | None:
        """The next line to send; None once the watch was closed (overflow, store closed)."""
        if self.initial:
            return self.initial.pop(0)
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            return None

    def close(self, *, overflowed: bool = False) -> None:
        self.overflowed = self.overflowed or overflowed
        self._send.close()
        if overflowed and self.write_scope is not None:
            self.write_scope.cancel()


class PodStore:
    """The pods of the fake's namespace, and their history for watches."""

    def __init__(
        self, namespace: str, *, history: int = HISTORY, watch_queue: int = WATCH_QUEUE
    ) -> None:
        self.namespace = namespace
        self.pods: dict[str, FakePod] = {}
        self.resource_version = FIRST_RESOURCE_VERSION
        self._history: deque[WatchEvent] = deque(maxlen=history)
        # Events with this resourceVersion or older are no longer in the history.
        self._compacted = FIRST_RESOURCE_VERSION
        self._watchers: set[Watcher] = set()
        self._watch_queue = watch_queue
        self._watch_opened = trio.Event()  # set (and replaced) whenever a watch opens

    def __iter__(self) -> Iterator[FakePod]:
        return iter(list(self.pods.values()))

    def get(self, name: str) -> FakePod | None:
        return self.pods.get(name)

    def next_resource_version(self, obj: dict[str, Any]) -> int:
        """Give ``obj`` (a pod, or another kind's object) the store's next resourceVersion."""
        self.resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        return self.resource_version

    def _publish(self, event: WatchEvent) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].resource_version
        self._history.append(event)
        for watcher in list(self._watchers):
            if not watcher.offer(event):
                self._watchers.discard(watcher)

    def add(self, pod: FakePod) -> None:
        self.pods[pod.name] = pod
        version = self.next_resource_version(pod.object)
        self._publish(WatchEvent("ADDED", version, copy.deepcopy(pod.object)))

    def update(self, pod: FakePod, change: Callable[[dict[str, Any]], None]) -> bool:
        """Apply ``change`` to the stored pod; a change that changes nothing is no event (as
        a no-op update keeps its resourceVersion). False when the pod is no longer stored."""
        if not pod.stored:
            return False
        before = copy.deepcopy(pod.object)
        change(pod.object)
        if pod.object == before:
            return True
        version = self.next_resource_version(pod.object)
        self._publish(WatchEvent("MODIFIED", version, copy.deepcopy(pod.object), before))
        return True

    def remove(self, pod: FakePod) -> None:
        if not pod.stored:
            return
        pod.stored = False
        del self.pods[pod.name]
        version = self.next_resource_version(pod.object)
        self._publish(WatchEvent("DELETED", version, copy.deepcopy(pod.object)))

    def listing(self, selection: Selection) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(pod.object)
            for _, pod in sorted(self.pods.items())
            if selection.matches(pod.object)
        ]

    def watch(self, selection: Selection, since: int | None) -> Watcher:
        """A watcher from now on, after its initial events: the matching pods as ADDED when
        ``since`` is None, else the stored events after ``since`` (410 Expired when they are no
        longer all kept, as a watch's first and only event)."""
        if since is None:
            initial = [watch_line("ADDED", obj) for obj in self.listing(selection)]
        elif since < self._compacted:
            gone = ApiError(
                410,
                "Expired",
                f"too old resource version: {since} ({self._compacted + 1})",
            )
            watcher = Watcher(selection, [watch_line("ERROR", gone.status())], 1)
            watcher.close()
            return watcher
        else:
            replayed = (
                translate(selection, event)
                for event in self._history
                if event.resource_version > since
            )
            initial = [watch_line(*found) for found in replayed if found is not None]
        watcher = Watcher(selection, initial, self._watch_queue)
        self._watchers.add(watcher)
        self._watch_opened.set()
        self._watch_opened = trio.Event()
        return watcher

    async def watching(self, count: int) -> None:
        """Return once ``count`` watches are open (a test's requests reached the store)."""
        while len(self._watchers) < count:
            await self._watch_opened.wait()

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)
        watcher.close()

    def close(self) -> None:
        for watcher in list(self._watchers):
            self.unwatch(watcher)
