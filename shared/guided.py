"""What structured outputs can promise: the JSON Schema keywords the grammar engine
(xgrammar) enforces. It ignores some keywords silently, so a schema using one of them
is refused up front rather than answered with output that may not fit it."""

from __future__ import annotations

from typing import Any

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
