"""The ways models write tool calls: where a reply's calls begin, the complete calls it
holds (a reply cut short keeps those), and the grammar that makes a model call.

``json`` is tokenq's fallback prompt's shape, for templates that take no tools; the
others are the models' own (``shared.chat.ToolFormat``). Each call comes out as
``{"name": ..., "arguments": {...}}``; checking names and numbering them is the
caller's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Format = Literal["json", "hermes", "llama3_json", "mistral"]
RawCall = dict[str, Any]
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s+")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_MARKER = "[TOOL_CALLS]"


@dataclass(frozen=True)
class Located:
    """Where calls begin in a reply so far: ``start`` (None: not seen), and how much of
    the text is content for sure (``safe``); ``never``: no call can begin any more."""

    start: int | None
    safe: int
    never: bool = False


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (held back while
    streaming: the tag may be arriving)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def locate(fmt: Format, text: str) -> Located:
    if fmt == "hermes":
        at = text.find(HERMES_OPEN)
        if at >= 0:
            return Located(at, at)
        return Located(None, len(text) - partial_suffix(text, HERMES_OPEN))
    return _locate_leading(text, OPENERS[fmt])


# Formats whose calls are the whole reply: how it begins (whitespace removed) when it is.
OPENERS: dict[Format, tuple[str, ...]] = {
    "json": ('{"tool_calls":[',),
    "llama3_json": ('{"name":', '{"type":"function"'),
    # The marker is a special token that text deltas usually leave out.
    "mistral": (MISTRAL_MARKER, '[{"name":'),
}


def _locate_leading(text: str, openers: Sequence[str]) -> Located:
    stripped = text.lstrip()
    head = _SPACE.sub("", stripped[:64])
    if any(head.startswith(opener) for opener in openers):
        return Located(len(text) - len(stripped), 0)
    if any(opener.startswith(head) for opener in openers):
        return Located(None, 0)  # it may still be calls: hold it all
    return Located(None, len(text), never=True)


def parse_calls(fmt: Format, region: str, final: bool) -> list[RawCall]:
    """The complete calls in ``region`` (from where ``locate`` found them); with
    ``final``, also a last call whose JSON is whole though its closing tag is missing."""
    objects = _PARSERS[fmt](region, final)
    return [call for call in (_as_call(o) for o in objects) if call is not None]


def _hermes(region: str, final: bool) -> list[Any]:
    objects, at = [], 0
    while (begin := region.find(HERMES_OPEN, at)) >= 0:
        body_at = begin + len(HERMES_OPEN)
        end = region.find(HERMES_CLOSE, body_at)
        if end < 0:
            whole = _whole_json(region[body_at:]) if final else None
            objects.extend([] if whole is None else [whole])
            break
        objects.append(_whole_json(region[body_at:end]))
        at = end + len(HERMES_CLOSE)
    return objects


def _whole_json(text: str) -> Any:
    """The JSON value ``text`` holds and nothing else (whitespace aside), or None."""
    try:
        value, end = _DECODER.raw_decode(text.strip())
    except json.JSONDecodeError:
        return None
    return value if end == len(text.strip()) else None


def _sequence(region: str, at: int, separators: str) -> list[Any]:
    """JSON values one after the other from ``at``, apart by ``separators`` and
    whitespace, up to the first that is not complete (or a closing bracket)."""
    objects: list[Any] = []
    while True:
        while at < len(region) and (region[at] in separators or region[at].isspace()):
            at += 1
        if at >= len(region) or region[at] == "]":
            return objects
        try:
            value, at = _DECODER.raw_decode(region, at)
        except json.JSONDecodeError:
            return objects
        objects.append(value)


def _fallback(region: str, final: bool) -> list[Any]:
    opened = re.match(r'\s*\{\s*"tool_calls"\s*:\s*\[', region)
    return [] if opened is None else _sequence(region, opened.end(), ",")


def _llama3(region: str, final: bool) -> list[Any]:
    return _sequence(region, 0, ";")


def _mistral(region: str, final: bool) -> list[Any]:
    opened = re.match(r"\s*(\[TOOL_CALLS\])?\s*\[", region)
    return [] if opened is None else _sequence(region, opened.end(), ",")


_PARSERS: dict[Format, Callable[[str, bool], list[Any]]] = {
    "json": _fallback,
    "hermes": _hermes,
    "llama3_json": _llama3,
    "mistral": _mistral,
}


def _as_call(value: Any) -> RawCall | None:
    """``{"name", "arguments"}`` from a model's call object; Llama's ``parameters``
    and the ``{"type": "function", "function": {...}}`` wrapping are read too."""
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        arguments = _whole_json(arguments)  # some models write them as a JSON string
    if not isinstance(arguments, dict):
        return None
    return {"name": value["name"], "arguments": arguments}
