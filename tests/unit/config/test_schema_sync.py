"""The JSON Schema is the single source of the suite's shape; the msgspec structs must match it.

These tests fail when a field is added, removed, renamed, retyped or given another default on
one side only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import msgspec.inspect as mi
import pytest

from reactor_fabric import Suite
from reactor_fabric.config.suite import suite_schema
from reactor_fabric.config.units import parse_size

REPO = Path(__file__).resolve().parents[3]
SCHEMA = suite_schema()


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        merged = {**SCHEMA["$defs"][name], **{k: v for k, v in node.items() if k != "$ref"}}
        node = merged
    return node


def schema_types(node: dict[str, Any]) -> set[str]:
    node = resolve(node)
    if "oneOf" in node:  # a word or a mapping (orchestrator.auth)
        return set().union(*(schema_types(branch) for branch in node["oneOf"]))
    kind = node["type"]
    return {str(k) for k in kind} if isinstance(kind, list) else {str(kind)}


def object_branch(node: dict[str, Any]) -> dict[str, Any]:
    """The mapping's branch of a ``oneOf`` (a field that is a word or a mapping)."""
    return next(b for b in resolve(node)["oneOf"] if resolve(b).get("type") == "object")


def struct_types(info: mi.Type) -> set[str]:
    if isinstance(info, mi.UnionType):
        return set().union(*(struct_types(t) for t in info.types))
    if isinstance(info, mi.LiteralType):
        return {"string"}
    mapping = {
        mi.StrType: "string",
        mi.IntType: "integer",
        mi.FloatType: "number",
        mi.BoolType: "boolean",
        mi.NoneType: "null",
        mi.ListType: "array",
        mi.DictType: "object",
        mi.StructType: "object",
    }
    names = [name for kind, name in mapping.items() if isinstance(info, kind)]
    assert names, f"unexpected type {info!r}"
    return set(names)


def pairs(node: dict[str, Any], info: mi.StructType, where: str) -> list[tuple[str, Any, Any]]:
    """Every (path, schema node, struct type) pair below an object/struct pair."""
    found = [(where, node, info)]
    node = resolve(node)
    for field in info.fields:
        child = node["properties"][field.encode_name]
        child_info = field.type
        if isinstance(child_info, mi.DictType) and isinstance(child_info.value_type, mi.StructType):
            found += pairs(
                resolve(child)["additionalProperties"],
                child_info.value_type,
                f"{where}.{field.name}.*",
            )
        elif isinstance(child_info, mi.StructType):
            found += pairs(child, child_info, f"{where}.{field.name}")
        elif isinstance(child_info, mi.UnionType):
            structs = [t for t in child_info.types if isinstance(t, mi.StructType)]
            branch = object_branch(child) if "oneOf" in resolve(child) else child
            for struct in structs:
                found += pairs(branch, struct, f"{where}.{field.name}")
    return found


ROOT = mi.type_info(Suite)
assert isinstance(ROOT, mi.StructType)
OBJECTS = pairs(SCHEMA, ROOT, "suite")


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_packaged_schema_is_the_file_in_schemas() -> None:
    packaged = REPO / "reactor_fabric" / "config" / "claude-mcp-suite.schema.json"
    assert packaged.resolve() == (REPO / "schemas" / "claude-mcp-suite.schema.json").resolve()


@pytest.mark.parametrize(("where", "node", "info"), OBJECTS, ids=[o[0] for o in OBJECTS])
def test_each_struct_has_exactly_the_schema_properties_and_required_keys(
    where: str, node: dict[str, Any], info: mi.StructType
) -> None:
    node = resolve(node)
    assert node["additionalProperties"] is False, f"{where} must reject unknown keys"
    assert info.forbid_unknown_fields, f"{where} struct must reject unknown keys"
    assert set(node["properties"]) == {f.encode_name for f in info.fields}
    assert set(node.get("required", [])) == {f.encode_name for f in info.fields if f.required}


@pytest.mark.parametrize(("where", "node", "info"), OBJECTS, ids=[o[0] for o in OBJECTS])
def test_each_field_has_the_same_type_and_default_in_schema_and_struct(
    where: str, node: dict[str, Any], info: mi.StructType
) -> None:
    properties = resolve(node)["properties"]
    for field in info.fields:
        prop = resolve(properties[field.encode_name])
        assert schema_types(prop) == struct_types(field.type), f"{where}.{field.name}"
        if not field.required and "default" in prop:
            default = (
                field.default
                if field.default is not msgspec.NODEFAULT
                else (field.default_factory())
            )
            if isinstance(default, msgspec.Struct):
                continue
            assert default == prop["default"], f"{where}.{field.name} default"
        elif not field.required and not isinstance(field.type, mi.StructType):
            pytest.fail(f"{where}.{field.name} has a default in the struct but not the schema")


def test_enums_in_the_schema_match_the_literal_types() -> None:
    service = next(info for where, _, info in OBJECTS if where == "suite.mcp_services.*")
    pull = next(f for f in service.fields if f.name == "pull")
    assert isinstance(pull.type, mi.LiteralType)
    assert set(pull.type.values) == set(SCHEMA["$defs"]["service"]["properties"]["pull"]["enum"])
    orchestrator = next(info for where, _, info in OBJECTS if where == "suite.orchestrator")
    auth = next(f for f in orchestrator.fields if f.name == "auth")
    assert isinstance(auth.type, mi.UnionType)
    word = next(t for t in auth.type.types if isinstance(t, mi.LiteralType))
    branches = SCHEMA["$defs"]["orchestrator"]["properties"]["auth"]["oneOf"]
    assert set(word.values) == set(next(b for b in branches if "enum" in b)["enum"])
    mapping = next(t for t in auth.type.types if isinstance(t, mi.StructType))
    mode = next(f for f in mapping.fields if f.name == "mode")
    assert isinstance(mode.type, mi.LiteralType)
    assert set(mode.type.values) == set(SCHEMA["$defs"]["auth"]["properties"]["mode"]["enum"])


@pytest.mark.parametrize(
    "text",
    [
        "512m",
        "512M",
        "200MB",
        "256MiB",
        "1g",
        "1GB",
        "4096",
        "64k",
        "7b",
        " 300m ",
        "1 g",
        "lots",
        "1.5g",
        "512mm",
        "-1m",
        "m",
        "",
        "1x",
        "1gib",
    ],
)
def test_the_schema_size_pattern_accepts_exactly_the_strings_parse_size_reads(text: str) -> None:
    # An editor checking against the schema and validate-config must agree on every size.
    service = SCHEMA["$defs"]["service"]["properties"]
    patterns = {
        service["memory_threshold"]["pattern"],
        SCHEMA["$defs"]["resources"]["properties"]["memory"]["pattern"],
    }
    [pattern] = patterns
    try:
        parse_size(text)
        parses = True
    except ValueError:
        parses = False
    assert (re.search(pattern, text) is not None) == parses
