"""What the exhaustive ordering checkers share: an invariant's failure (:class:`Violation`, with
the steps that led to it), and the trail of those steps, kept as a linked list (one node per
step, shared by every state below it) and spelled out only when a check fails, so that
millions of states cost no list copies."""

from __future__ import annotations

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
