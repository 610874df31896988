"""What the exhaustive ordering checkers share: the exploration itself (:func:`explore`), an
invariant's failure (:class:`Violation`, with the steps that led to it), and the trail of those
steps, kept as a linked list (one node per step, shared by every state below it) and spelled
out only when a check fails, so that millions of states cost no list copies.

Each checker (tests/unit/protocol/: test_session_orderings.py, test_fabric_orderings.py,
test_warm_pool_orderings.py, test_websocket_connection.py) brings a model world around its pure
machine — what can happen next in a state, how one step is taken and checked, what must hold
once nothing more can happen — and :func:`explore` visits every state reachable from the
first, each once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, Self, TypeVar

Trail = tuple[str, "Trail"] | None


class Violation(AssertionError):
    """An invariant that did not hold."""


def check(condition: bool, message: str, trail: list[str]) -> None:
    if not condition:
        raise Violation(f"{message}\n  after: {' → '.join(trail)}")


def unwind(node: Trail) -> list[str]:
    names: list[str] = []
    while node is not None:
        names.append(node[0])
        node = node[1]
    return names[::-1]


class LazyTrail(list[str]):
    """The steps that led here, spelled out only when a check fails."""

    def __init__(self, node: Trail) -> None:
        super().__init__()
        self._node = node

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(unwind(self._node))


class World(Protocol):
    """A state of a model world: copied before each step, and told apart from others by a key
    (two states with one key behave alike, so only the first is explored)."""

    def clone(self) -> Self: ...

    def key(self) -> Hashable: ...


W = TypeVar("W", bound=World)
S = TypeVar("S")


def explore(
    start: W,
    steps: Callable[[W], Sequence[tuple[str, S]]],
    take: Callable[[W, S, list[str]], None],
    *,
    at_end: Callable[[W, list[str]], None] | None = None,
    trail: Trail = None,
    max_states: int | None = None,
) -> int:
    """Visit every state reachable from ``start`` once, depth first; the number visited.

    From each state every step ``steps(state)`` names is taken, each on its own clone of the
    state: ``take(clone, step, trail)`` feeds the machine its event, plays the world's part and
    checks what must hold after every step (raising :class:`Violation`). A state from which no
    step is possible is an end: ``at_end(state, trail)`` checks it. ``trail`` is how ``start``
    was reached; ``max_states`` bounds the space (a model that grew past what its test meant).
    """
    stack: list[tuple[W, Trail]] = [(start, trail)]
    seen: set[Hashable] = {start.key()}
    while stack:
        world, node = stack.pop()
        possible = steps(world)
        if not possible:
            if at_end is not None:
                at_end(world, LazyTrail(node))
            continue
        for name, step in possible:
            successor = world.clone()
            successor_node: Trail = (name, node)
            take(successor, step, LazyTrail(successor_node))
            key = successor.key()
            if key not in seen:
                seen.add(key)
                assert max_states is None or len(seen) < max_states, (
                    "the state space is larger than expected"
                )
                stack.append((successor, successor_node))
    return len(seen)
