"""What structured outputs can promise: the JSON Schema keywords the grammar engine
(xgrammar) enforces. It ignores some keywords silently, so a schema using one of them
is refused up front rather than answered with output that may not fit it."""

from __future__ import annotations

from typing import Any

import orjson

# Keywords xgrammar 0.2 accepts but does not enforce.
UNENFORCED_KEYWORDS = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "contains",
        "minContains",
        "maxContains",
        "uniqueItems",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
        "$recursiveRef",
    }
)
# Keywords whose values are names or data, never schemas, so they are not walked.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "required", "description"})
# Keywords whose values map names (which may be anything, "not" included) to schemas.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
MAX_SCHEMA_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class UnsupportedSchema(ValueError):
    """A JSON schema that constrained decoding cannot enforce."""


def check_json_schema(schema: object) -> None:
    """Raise UnsupportedSchema naming the first keyword (and where) that cannot be enforced."""
    if not isinstance(schema, dict | bool):
        raise UnsupportedSchema("a JSON schema must be an object (or true/false)")
    _walk(schema, "#", 0)


def _walk(node: Any, where: str, depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise UnsupportedSchema(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, f"{where}/{i}", depth + 1)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in UNENFORCED_KEYWORDS:
            raise UnsupportedSchema(
                f"the JSON Schema keyword {key!r} (at {where}) is not supported by "
                "structured outputs; remove it or express it with anyOf/enum"
            )
        if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
            raise UnsupportedSchema(f"$ref {value!r} (at {where}): only local refs (#/...) work")
        if key in _NAMED_SCHEMAS and isinstance(value, dict):
            for name, sub in value.items():
                _walk(sub, f"{where}/{key}/{name}", depth + 1)
        elif key not in _DATA_KEYWORDS:
            _walk(value, f"{where}/{key}", depth + 1)


# Keywords whose value is one subschema, or a list of them, that an object may sit in.
_SUBSCHEMA = ("items", "additionalItems", "contains", "propertyNames")
_SUBSCHEMAS = ("prefixItems", "anyOf", "oneOf")


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as OpenAI's strict mode reads it: every object takes exactly its declared
    properties, all of them required (``additionalProperties: false``), at every depth
    (properties, items, anyOf, $defs...); integers without bounds are 64-bit. A copy;
    ``schema`` is left as it is."""
    closed: dict[str, Any] = _closed(schema, require_all=True)
    return closed


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with no properties beyond those it declares where it does not say
    (``additionalProperties`` left out), as vLLM's default reads a schema; what it
    requires, and an object that declares no properties, stay as written; integers
    without bounds are 64-bit. A copy."""
    closed: dict[str, Any] = _closed(schema, require_all=False)
    return closed


def _closed(node: Any, require_all: bool) -> Any:
    if isinstance(node, list):
        return [_closed(item, require_all) for item in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _NAMED_SCHEMAS:
        if isinstance(node.get(key), dict):
            out[key] = {k: _closed(v, require_all) for k, v in node[key].items()}
    for key in (*_SUBSCHEMA, *_SUBSCHEMAS):
        if key in node:
            out[key] = _closed(node[key], require_all)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _closed(node["additionalProperties"], require_all)
    if isinstance(node.get("properties"), dict):
        _close_object(out, require_all)
    kind = node.get("type")
    if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
        _bound_integer(out)
    return out


def _bound_integer(out: dict[str, Any]) -> None:
    """An integer held to 64 bits where the schema sets no bound, as JSON readers hold
    integers: a model looping on a digit then has to stop instead of running to its
    max_tokens."""
    if "minimum" not in out and "exclusiveMinimum" not in out:
        out["minimum"] = INT64_MIN
    if "maximum" not in out and "exclusiveMaximum" not in out:
        out["maximum"] = INT64_MAX


def _close_object(out: dict[str, Any], require_all: bool) -> None:
    """An object schema that names its properties: strict takes those, all required;
    else closed only where it is silent (patternProperties say more names may come)."""
    if require_all:
        out["additionalProperties"] = False
        out["required"] = list(out["properties"])
        out.pop("patternProperties", None)
    elif "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False


def schema_key(schema: Any) -> str:
    """The JSON that two spellings of one schema (or structural tag) share, to cache its
    grammar by: keys sorted, but an object's properties in the order it declares them,
    since xgrammar writes them in that order."""
    return orjson.dumps(_canonical(schema, keep_order=False)).decode()


def _canonical(node: Any, keep_order: bool) -> Any:
    if isinstance(node, list):
        return [_canonical(item, False) for item in node]
    if not isinstance(node, dict):
        return node
    items = node.items() if keep_order else sorted(node.items())
    # Under "properties" the keys are names in their order; their values are schemas.
    return {k: _canonical(v, k == "properties" and not keep_order) for k, v in items}
