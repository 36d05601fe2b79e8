"""Anthropic messages and stream events rendered from tokenq stream events, checked
against the ``anthropic`` SDK's own types."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from producer.anthropic.errors import anthropic_error, error_type
from producer.anthropic.output import MessageRenderer
from producer.openai.errors import ErrorDetail
from producer.openai.reasoning import ReasoningPlan
from producer.openai.tools import plan_tools
from producer.streams.entries import Entry, parse_entry
from shared.models import FinalEvent, FinishReason, TokenEvent, Usage, dumps

EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
USAGE = Usage(prompt_tokens=7, completion_tokens=5)
STOP = FinalEvent(finish_reason=FinishReason.STOP, usage=USAGE)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def _entries(pieces: list[str], final: FinalEvent = STOP) -> list[Entry]:
    out = [
        parse_entry(f"{i}-0", {"e": dumps(TokenEvent(index=i, token_ids=(i,), text=p))})
        for i, p in enumerate(pieces)
    ]
    return [*out, parse_entry("99-0", {"e": dumps(final)})]


def _events(frames: bytes) -> list[dict[str, Any]]:
    """Each SSE event's data, checked to carry its type as its event name."""
    out = []
    for block in frames.decode().split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n")
        payload = orjson.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        out.append(payload)
    return out


def _validate(events: list[dict[str, Any]]) -> None:
    """Each event as the SDK reads it (its union leaves out pings, which it skips)."""
    for payload in events:
        if payload["type"] != "ping":
            EVENTS.validate_python(payload)


def _streamed(renderer: MessageRenderer, entries: list[Entry]) -> list[dict[str, Any]]:
    frames = renderer.start()
    for entry in entries:
        frames += renderer.render([entry])[0]
    return _events(frames)


def _whole(renderer: MessageRenderer, entries: list[Entry]) -> Message:
    for entry in entries[:-1]:
        renderer.feed(entry)
    final = entries[-1].final()
    renderer.end(final)
    return Message.model_validate(renderer.message(final))


def test_text_streams_in_anthropics_event_order_and_joins_to_the_message() -> None:
    pieces = ["The ", "capital ", "is Paris."]
    events = _streamed(MessageRenderer("r1", "m"), _entries(pieces))
    _validate(events)
    assert [e["type"] for e in events] == [
        "message_start", "ping", "content_block_start", *["content_block_delta"] * 3,
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    whole = _whole(MessageRenderer("r1", "m"), _entries(pieces))
    assert text == "The capital is Paris." == whole.content[0].text  # type: ignore[union-attr]
    assert events[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2]["usage"] == {"input_tokens": 7, "output_tokens": 5}
    assert whole.id == "msg_r1" and whole.stop_reason == "end_turn"
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (7, 5)


@pytest.mark.parametrize(
    ("final", "reason", "sequence"),
    [
        (FinalEvent(finish_reason=FinishReason.LENGTH, usage=USAGE), "max_tokens", None),
        (FinalEvent(finish_reason=FinishReason.STOP, stop_sequence="END"), "stop_sequence", "END"),
        (STOP, "end_turn", None),
    ],
)
def test_stop_reasons(final: FinalEvent, reason: str, sequence: str | None) -> None:
    whole = _whole(MessageRenderer("r", "m"), _entries(["a"], final))
    assert (whole.stop_reason, whole.stop_sequence) == (reason, sequence)


def test_a_tool_call_is_a_tool_use_block_with_its_input_as_json_deltas() -> None:
    tools = plan_tools(TOOLS, "auto", None, "hermes")
    pieces = ["Checking.\n", CALL[:20], CALL[20:]]
    events = _streamed(MessageRenderer("r2", "m", tools), _entries(pieces))
    _validate(events)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"]
    assert starts[1]["input"] == {} and starts[1]["name"] == "get_weather"
    json_deltas = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    assert orjson.loads("".join(json_deltas)) == {"city": "Oslo"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    whole = _whole(MessageRenderer("r2", "m", tools), _entries(pieces))
    assert [b.type for b in whole.content] == ["text", "tool_use"]
    use = whole.content[1]
    assert use.type == "tool_use" and use.input == {"city": "Oslo"} and use.id == starts[1]["id"]
    assert whole.stop_reason == "tool_use"


def test_reasoning_is_a_thinking_block_before_the_text() -> None:
    plan = ReasoningPlan("<think>", "</think>")
    pieces = ["<think>", "Paris is in ", "France.</think>\n\n", "Paris."]
    events = _streamed(MessageRenderer("r3", "m", reasoning=plan), _entries(pieces))
    _validate(events)
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    thinking = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    text = "".join(d["text"] for d in deltas if d["type"] == "text_delta")
    assert (thinking, text) == ("Paris is in France.", "Paris.")
    whole = _whole(MessageRenderer("r3", "m", reasoning=plan), _entries(pieces))
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking == "Paris is in France."  # type: ignore[union-attr]


def test_an_empty_reply_still_has_a_text_block() -> None:
    events = _streamed(MessageRenderer("r4", "m"), _entries([]))
    assert [e["type"] for e in events][2:4] == ["content_block_start", "content_block_stop"]
    assert _whole(MessageRenderer("r4", "m"), _entries([])).content[0].text == ""  # type: ignore[union-attr]


def test_a_failed_request_ends_the_stream_with_an_error_event() -> None:
    failed = FinalEvent(finish_reason=FinishReason.ERROR, error="internal error: boom")
    events = _streamed(MessageRenderer("r5", "m"), _entries(["a"], failed))
    assert events[-1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "generation failed: internal error: boom"},
    }


def test_errors_are_in_anthropics_shape_by_status() -> None:
    detail = ErrorDetail(
        message="must be at least 1", type="invalid_request_error", param="max_tokens"
    )
    assert anthropic_error(400, detail) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: must be at least 1"},
    }
    statuses = {s: error_type(s) for s in (401, 403, 404, 429, 500, 503, 504)}
    assert statuses == {
        401: "authentication_error", 403: "permission_error", 404: "not_found_error",
        429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 504: "api_error",
    }  # fmt: skip
