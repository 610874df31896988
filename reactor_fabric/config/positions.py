"""YAML loading that remembers where every key came from and refuses duplicate keys.

PyYAML silently keeps the last of two equal keys in a mapping, which hides typos such as a
service defined twice. :func:`load_yaml_with_positions` composes the node tree first, walks it to
record the position of every key and value (so later errors can name a line) and to collect every
duplicate key, and only then constructs plain Python data with the safe constructor.

Pure: text in, data out; no file I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    """1-based line and column, as editors show them."""

    line: int
    column: int

    @classmethod
    def of(cls, mark: yaml.Mark) -> Position:
        return cls(mark.line + 1, mark.column + 1)


@dataclass(frozen=True)
class YamlProblem:
    """Something wrong with the YAML itself, before its meaning is looked at."""

    path: KeyPath
    position: Position
    message: str


@dataclass
class LoadedYaml:
    data: Any
    # Where each key sits (for "unknown key", "duplicate key") and where each value starts.
    key_positions: dict[KeyPath, Position]
    value_positions: dict[KeyPath, Position]
    problems: list[YamlProblem]

    def position_of(self, path: KeyPath, *, key: bool = False) -> Position:
        """The best known position for ``path``: its key or value, else its nearest parent."""
        primary, secondary = (
            (self.key_positions, self.value_positions)
            if key
            else (self.value_positions, self.key_positions)
        )
        for end in range(len(path), -1, -1):
            prefix = path[:end]
            if prefix in primary:
                return primary[prefix]
            if prefix in secondary:
                return secondary[prefix]
        return Position(1, 1)


class YamlSyntaxError(ValueError):
    """The text is not YAML at all; carries the position PyYAML reported."""

    def __init__(self, message: str, position: Position) -> None:
        super().__init__(message)
        self.position = position


def load_yaml_with_positions(text: str) -> LoadedYaml:
    """Parse one YAML document, recording positions and duplicate/non-string keys.

    Raises :class:`YamlSyntaxError` when the text cannot be parsed. Duplicate keys and keys
    that are not strings do not raise: they are listed in ``problems`` so that every problem of a
    file can be reported at once.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        loaded = LoadedYaml(data=None, key_positions={}, value_positions={}, problems=[])
        if node is None:  # an empty document
            return loaded
        _walk(node, (), loaded, frozenset())
        loaded.data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position.of(mark) if mark is not None else Position(1, 1)
        raise YamlSyntaxError(_describe(exc), position) from exc
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(str(exc), Position(1, 1)) from exc
    finally:
        loader.dispose()
    return loaded


def _describe(exc: yaml.MarkedYAMLError) -> str:
    parts = [part for part in (exc.context, exc.problem) if part]
    return "YAML syntax error: " + ("; ".join(parts) if parts else "cannot parse")


def _walk(node: yaml.Node, path: KeyPath, loaded: LoadedYaml, parents: frozenset[int]) -> None:
    if id(node) in parents:  # a recursive alias (&a [*a]): positions inside are already known
        return
    parents |= {id(node)}
    loaded.value_positions[path] = Position.of(node.start_mark)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, Position] = {}
        for key_node, value_node in node.value:
            key_position = Position.of(key_node.start_mark)
            if key_node.tag.endswith(":merge"):
                loaded.problems.append(
                    YamlProblem(path, key_position, "YAML merge keys ('<<') are not supported")
                )
                continue
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag.endswith(":str")):
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                loaded.problems.append(
                    YamlProblem(path, key_position, f"key {shown!r} must be a string; quote it")
                )
                continue
            key = key_node.value
            if key in seen:
                first = seen[key]
                loaded.problems.append(
                    YamlProblem(
                        (*path, key),
                        key_position,
                        f"duplicate key {key!r} (first defined on line {first.line}); "
                        "YAML would silently keep only the last one",
                    )
                )
                continue
            seen[key] = key_position
            loaded.key_positions[(*path, key)] = key_position
            _walk(value_node, (*path, key), loaded, parents)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), loaded, parents)
