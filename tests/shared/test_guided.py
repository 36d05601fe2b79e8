"""Strict and closed schemas: what structured outputs decode to, as OpenAI and vLLM read
a schema."""

from __future__ import annotations

from typing import Any

import jsonschema

from shared.guided import closed_schema, schema_key, strict_schema

ADDRESS: dict[str, Any] = {
    "type": "object",
    "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
    "required": ["street"],
}
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "home": {"$ref": "#/$defs/address"},
        "past": {"type": "array", "items": {"$ref": "#/$defs/address"}},
        "pet": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"kind": {}}}]},
    },
    "required": ["name"],
    "$defs": {"address": ADDRESS},
}


def test_strict_requires_every_property_and_no_other_at_every_depth() -> None:
    strict = strict_schema(PERSON)
    assert strict["required"] == ["name", "home", "past", "pet"]
    assert strict["additionalProperties"] is False
    address = strict["$defs"]["address"]
    assert (address["required"], address["additionalProperties"]) == (["street", "zip"], False)
    pet = strict["properties"]["pet"]["anyOf"][1]
    assert (pet["required"], pet["additionalProperties"]) == (["kind"], False)
    whole: dict[str, Any] = {
        "name": "a",
        "home": {"street": "s", "zip": "z"},
        "past": [],
        "pet": None,
    }
    jsonschema.validate(whole, strict)
    extra = {**whole, "age": 3}
    assert not jsonschema.Draft202012Validator(strict).is_valid(extra)
    missing = {k: v for k, v in whole.items() if k != "past"}
    assert not jsonschema.Draft202012Validator(strict).is_valid(missing)
    assert "additionalProperties" not in PERSON  # a copy: the caller's schema is as it was


def test_closed_keeps_what_is_required_and_what_the_schema_allows() -> None:
    closed = closed_schema(PERSON)
    assert closed["required"] == ["name"]
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["address"]["additionalProperties"] is False
    assert closed["properties"]["past"]["items"] == {"$ref": "#/$defs/address"}
    jsonschema.validate({"name": "a"}, closed)  # optional properties stay optional
    assert not jsonschema.Draft202012Validator(closed).is_valid({"name": "a", "age": 1})
    open_map = {"type": "object", "properties": {"a": {}}, "additionalProperties": True}
    assert closed_schema(open_map) == open_map  # said out loud: kept
    assert closed_schema({"type": "object"}) == {"type": "object"}  # names none: any object


def test_integers_without_bounds_are_held_to_64_bits() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": ["integer", "null"]},
            "m": {"type": "integer", "exclusiveMinimum": 0},
        },
    }
    closed = closed_schema(schema)["properties"]
    assert (closed["n"]["minimum"], closed["n"]["maximum"]) == (-(2**63), 2**63 - 1)
    assert "minimum" not in closed["m"] and closed["m"]["maximum"] == 2**63 - 1


def test_two_spellings_of_a_schema_share_a_key_but_property_order_counts() -> None:
    one = {"type": "object", "properties": {"b": {"type": "string"}, "a": {}}, "required": ["b"]}
    same = {"required": ["b"], "properties": {"b": {"type": "string"}, "a": {}}, "type": "object"}
    swapped = {"type": "object", "properties": {"a": {}, "b": {"type": "string"}}}
    assert schema_key(one) == schema_key(same)
    assert schema_key({**swapped, "required": ["b"]}) != schema_key(one)
    named = {"properties": {"properties": {"type": "object", "properties": {"z": {}, "y": {}}}}}
    assert '"z":{},"y":{}' in schema_key(named)  # a property named "properties" is a schema
