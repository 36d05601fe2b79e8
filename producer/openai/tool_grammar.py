"""Grammars for replies that a plain JSON schema cannot say, as xgrammar structural tags
for the worker's constrained decoding (``SamplingParams.guided_structural_tag``): a
model's tool calls in its own format (``tool_choice`` ``required`` or a named function),
and a reasoning model's structured output after its reasoning.

A reasoning model may think first, inside its think tags, as it was trained to; then
the reply is calls only, each call's arguments fitting its function's parameters, or
JSON fitting the response format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from producer.openai.tool_formats import HERMES_CLOSE, HERMES_OPEN, MISTRAL_MARKER
from shared.chat import ToolFormat

Node = dict[str, Any]


@dataclass(frozen=True)
class Think:
    """A reasoning model's think tags, and whether its prompt opened the block already."""

    start: str
    end: str
    opened: bool


def calls_grammar(
    fmt: ToolFormat,
    functions: Sequence[tuple[str, dict[str, Any]]],
    parallel: bool,
    think: Think | None,
) -> Node:
    """The structural tag for a reply of one or more calls (one when not ``parallel``)
    of ``functions`` (name, parameters), written the ``fmt`` way."""
    calls = _CALLS[fmt](functions, parallel)
    if think is None:
        return {"type": "structural_tag", "format": calls}
    return {"type": "structural_tag", "format": _sequence(_thinking(think), calls)}


def json_after_thinking(schema: dict[str, Any], think: Think) -> Node:
    """A reply that may think first, then answers JSON fitting ``schema``."""
    answer = {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}
    return {"type": "structural_tag", "format": _sequence(_thinking(think), answer)}


def _hermes(functions: Sequence[tuple[str, dict[str, Any]]], parallel: bool) -> Node:
    tags = [
        _tag(
            f'{HERMES_OPEN}\n{{"name": {_quoted(name)}, "arguments": ',
            params,
            f"}}\n{HERMES_CLOSE}",
        )
        for name, params in functions
    ]
    return _repeated(tags, "\n", parallel)


def _llama3(functions: Sequence[tuple[str, dict[str, Any]]], parallel: bool) -> Node:
    tags = [_tag(f'{{"name": {_quoted(name)}, "parameters": ', p, "}") for name, p in functions]
    return _repeated(tags, "; ", parallel)


def _mistral(functions: Sequence[tuple[str, dict[str, Any]]], parallel: bool) -> Node:
    # [TOOL_CALLS] is one special token: the grammar names it as a token, not as text.
    tags = [_tag(f'{{"name": {_quoted(name)}, "arguments": ', p, "}") for name, p in functions]
    array = {"type": "tag", "begin": "[", "content": _repeated(tags, ", ", parallel), "end": "]"}
    marker = {"type": "token", "token": MISTRAL_MARKER}
    return {"type": "tag", "begin": marker, "content": array, "end": ""}


_CALLS = {"hermes": _hermes, "llama3_json": _llama3, "mistral": _mistral}


def _tag(begin: str, parameters: dict[str, Any], end: str) -> Node:
    # One whitespace character at most between JSON tokens: free whitespace lets a
    # model pad its arguments until max_tokens (tokenq's guided_json allows none).
    content = {"type": "json_schema", "json_schema": parameters, "max_whitespace_cnt": 1}
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _repeated(tags: list[Node], separator: str, parallel: bool) -> Node:
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": separator,
        "at_least_one": True,
        "stop_after_first": not parallel,
    }


def _thinking(think: Think) -> Node:
    """A think block first: the rest of the one the prompt opened, or an optional one."""
    block = {
        "type": "tag",
        "begin": "" if think.opened else think.start,
        "content": {"type": "any_text"},
        "end": think.end,
    }
    then = _sequence(block, {"type": "const_string", "value": "\n\n"})
    return then if think.opened else {"type": "optional", "content": then}


def _sequence(*elements: Node) -> Node:
    return {"type": "sequence", "elements": list(elements)}


def _quoted(name: str) -> str:
    return orjson.dumps(name).decode()
