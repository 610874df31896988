from __future__ import annotations

import pytest

from reactor_fabric.config.positions import Position, YamlSyntaxError, load_yaml_with_positions


def test_positions_of_keys_and_values_are_one_based_lines_and_columns() -> None:
    loaded = load_yaml_with_positions("a:\n  b: [x, y]\n")
    assert loaded.data == {"a": {"b": ["x", "y"]}}
    assert loaded.key_positions[("a", "b")] == Position(2, 3)
    assert loaded.value_positions[("a", "b", 1)] == Position(2, 10)


def test_every_duplicate_key_is_reported_with_both_lines() -> None:
    loaded = load_yaml_with_positions("a: 1\nb: 2\na: 3\nc:\n  d: 1\n  d: 2\n")
    messages = [(p.position.line, p.message) for p in loaded.problems]
    keeps_last = "YAML would silently keep only the last one"
    assert messages == [
        (3, f"duplicate key 'a' (first defined on line 1); {keeps_last}"),
        (6, f"duplicate key 'd' (first defined on line 5); {keeps_last}"),
    ]


def test_keys_that_yaml_reads_as_booleans_or_numbers_are_problems() -> None:
    loaded = load_yaml_with_positions("yes: 1\n2: b\n'3': c\n")
    assert [p.message for p in loaded.problems] == [
        "key 'yes' must be a string; quote it",
        "key '2' must be a string; quote it",
    ]


def test_a_recursive_alias_does_not_loop_forever() -> None:
    loaded = load_yaml_with_positions("a: &x [1, *x]\n")
    assert loaded.problems == []
    assert loaded.data["a"][0] == 1


def test_a_syntax_error_carries_its_position() -> None:
    with pytest.raises(YamlSyntaxError) as caught:
        load_yaml_with_positions("a: 1\nb: [\n")
    assert caught.value.position.line == 3


def test_two_documents_are_a_syntax_error() -> None:
    with pytest.raises(YamlSyntaxError):
        load_yaml_with_positions("a: 1\n---\nb: 2\n")


def test_position_of_an_unknown_path_falls_back_to_its_nearest_parent() -> None:
    loaded = load_yaml_with_positions("a:\n  b: 1\n")
    assert loaded.position_of(("a", "missing")) == Position(2, 3)
    assert loaded.position_of(("a", "b"), key=True) == Position(2, 3)
