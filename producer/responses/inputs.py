"""Input items: checked and kept in one shape (what ``GET .../input_items`` lists), and
turned into the chat messages the request runs on.

Messages take text parts only; an image, a file or audio is refused naming the part,
since tokenq serves text models. ``function_call`` items (an earlier answer's calls) and
``function_call_output`` items (their results) become the assistant's ``tool_calls``
and ``tool`` messages, as on the chat route; ``reasoning`` items are kept but, as chat
templates leave earlier reasoning out, not sent to the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from producer.openai.errors import invalid

Item = dict[str, Any]
ROLES = ("user", "assistant", "system", "developer")
MAX_INPUT_ITEMS = 1000
TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
MEDIA_PARTS = ("input_image", "input_file", "input_audio", "image_url", "image", "file")
ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def input_items(value: str | Sequence[Mapping[str, Any]]) -> list[Item]:
    """The body's ``input`` as items (a text is one user message); ApiError (400)
    naming the first item or part that cannot be served."""
    if isinstance(value, str):
        return [_message("user", [value], "input")]
    if not value:
        raise invalid("input: give a text or at least one item", "input")
    if len(value) > MAX_INPUT_ITEMS:
        message = f"input: {len(value)} items are more than {MAX_INPUT_ITEMS}; send fewer"
        raise invalid(message, "input")
    return [_item(item, f"input.{i}") for i, item in enumerate(value)]


def _item(raw: Mapping[str, Any], where: str) -> Item:
    kind = raw.get("type", "message" if "role" in raw else None)
    if kind == "message":
        return _message_item(raw, where)
    if kind == "function_call":
        return _call(raw, where)
    if kind == "function_call_output":
        return _call_output(raw, where)
    if kind == "reasoning":
        return {k: v for k, v in raw.items() if k in ("type", "id", "summary", "content")}
    if kind == "item_reference":
        message = f"{where}.type: item_reference is not supported; send the item itself"
        raise invalid(message, f"{where}.type", "unsupported")
    raise invalid(
        f"{where}.type: {kind!r} items are not supported; send message, function_call, "
        "function_call_output or reasoning items",
        f"{where}.type",
        "unsupported",
    )


def _message_item(raw: Mapping[str, Any], where: str) -> Item:
    role = raw.get("role")
    if role not in ROLES:
        raise invalid(f"{where}.role: must be one of {', '.join(ROLES)}", f"{where}.role")
    content = raw.get("content")
    if isinstance(content, str):
        return _message(role, [content], where, raw.get("id"))
    if not isinstance(content, list):
        raise invalid(f"{where}.content: give a text or a list of text parts", f"{where}.content")
    texts = [_part_text(part, f"{where}.content.{j}") for j, part in enumerate(content)]
    return _message(role, texts, where, raw.get("id"))


def _part_text(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind in MEDIA_PARTS:
        raise invalid(
            f"{where}.type: {kind} parts are not supported (tokenq serves text models); "
            "send the content as input_text parts",
            f"{where}.type",
            "unsupported",
        )
    field = TEXT_PARTS.get(kind or "")
    value = part.get(field) if field and isinstance(part, Mapping) else None
    if not isinstance(value, str):
        raise invalid(f"{where}: give a text part ({{'type': 'input_text', 'text': ...}})", where)
    return value


def _message(role: str, texts: list[str], where: str, item_id: Any = None) -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    parts: list[dict[str, Any]] = [{"type": kind, "text": t} for t in texts]
    if role == "assistant":
        parts = [{**p, "annotations": []} for p in parts]
    item = {"type": "message", "role": role, "content": parts, "status": "completed"}
    return _with_id(item, item_id)


def _call(raw: Mapping[str, Any], where: str) -> Item:
    fields = {k: _text(raw, k, where) for k in ("call_id", "name", "arguments")}
    item = {"type": "function_call", **fields, "status": "completed"}
    return _with_id(item, raw.get("id"))


def _call_output(raw: Mapping[str, Any], where: str) -> Item:
    output = raw.get("output")
    if isinstance(output, list):
        output = "".join(_part_text(p, f"{where}.output.{j}") for j, p in enumerate(output))
    if not isinstance(output, str):
        raise invalid(f"{where}.output: give the call's result as a text", f"{where}.output")
    call_id = _text(raw, "call_id", where)
    item = {"type": "function_call_output", "call_id": call_id, "output": output}
    return _with_id({**item, "status": "completed"}, raw.get("id"))


def _text(raw: Mapping[str, Any], name: str, where: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or (not value and name != "arguments"):
        raise invalid(f"{where}.{name}: give it as a string", f"{where}.{name}")
    return value


def _with_id(item: Item, item_id: Any) -> Item:
    return {**item, "id": item_id} if isinstance(item_id, str) and item_id else item


def numbered(items: Sequence[Item], request_id: str, tag: str) -> list[Item]:
    """``items`` with an id each: its own, or ``<prefix>_<request id>_<tag><n>``."""
    return [
        item
        if item.get("id")
        else {**item, "id": f"{ID_PREFIXES[item['type']]}_{request_id}_{tag}{n}"}
        for n, item in enumerate(items)
    ]


def _item_id(item: Item, key: str) -> str:
    return f"{ID_PREFIXES[item['type']]}_{key}"


def chat_messages(items: Sequence[Item]) -> list[dict[str, Any]]:
    """The conversation as chat messages: calls joined to the assistant turn they follow,
    results as ``tool`` messages; reasoning left out."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            text = "".join(p.get("text", p.get("refusal", "")) for p in item["content"])
            messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            _add_call(messages, item)
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    return messages


def _add_call(messages: list[dict[str, Any]], item: Item) -> None:
    function = {"name": item["name"], "arguments": item["arguments"] or "{}"}
    call = {"id": item["call_id"], "type": "function", "function": function}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
