"""The event builder on recorded stream entries: the same entries always give the same
events with the same sequence numbers (so a resume after any number gets the rest once),
items open and close in order, each ending gives its terminal event, and the object a
GET answers is the terminal event's."""

from __future__ import annotations

from typing import Any

import pytest

from producer.openai.reasoning import ReasoningPlan
from producer.openai.tools import plan_tools
from producer.responses.events import Event, EventBuilder, build
from producer.responses.record import StoredResponse
from producer.streams.entries import Entry, parse_entry
from shared.models import FinalEvent, FinishReason, TokenEvent, Usage, dumps

REQUEST_ID = "0123abcd-0123456789abcdef01234567"
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
THINK = ReasoningPlan("<think>", "</think>")
CALL = '{"tool_calls": [{"name": "weather", "arguments": {"city": "Oslo"}}]}'


def record(tools: bool = False, think: bool = False, background: bool = False) -> StoredResponse:
    plan = plan_tools(TOOLS if tools else None, None)
    return StoredResponse(
        request_id=REQUEST_ID,
        created_at=1_700_000_000.0,
        model="m",
        input=[],
        background=background,
        tool_plan=plan.to_dict(),
        reasoning_plan=THINK.to_dict() if think else None,
    )


def entries(*pieces: str | tuple[str, ...], end: FinishReason = FinishReason.STOP) -> list[Entry]:
    """One stream entry per piece (a tuple: a coalesced entry of several steps, one
    token each), then the final entry."""
    out: list[Entry] = []
    index = 0
    for piece in pieces:
        steps = piece if isinstance(piece, tuple) else (piece,)
        events = [
            TokenEvent(index=index + i, token_ids=(index + i,), text=t) for i, t in enumerate(steps)
        ]
        out.append(parse_entry(f"1-{len(out)}", {b"e": TokenEvent.coalesce(events).wire()}))
        index += len(steps)
    final = FinalEvent(finish_reason=end, usage=Usage(prompt_tokens=7, completion_tokens=index),
                       error="boom" if end is FinishReason.ERROR else None)  # fmt: skip
    out.append(parse_entry(f"1-{len(out)}", {b"e": dumps(final)}))
    return out


def kinds(events: list[Event]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in events]


def test_the_same_entries_give_the_same_events_and_numbers() -> None:
    stream = entries("Hel", ("lo", " wor"), "ld")
    first, _ = build(record(), stream)
    again, _ = build(record(), stream)
    assert first == again
    assert [e["sequence_number"] for e in first] == list(range(len(first)))
    # A client resuming after event n gets exactly the events it had not seen.
    builder = EventBuilder(record())
    replay = builder.opening() + [e for entry in stream for e in builder.feed(entry)]
    for n in (0, 3, len(first) - 2):
        assert [e for e in replay if e["sequence_number"] > n] == first[n + 1 :]


def test_a_text_answer_streams_one_message_item() -> None:
    events, builder = build(record(), entries("Hel", ("lo", " wor"), "ld"))
    assert kinds(events) == [
        "created",
        "in_progress",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.delta",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "completed",
    ]
    assert [e["delta"] for e in events if e["type"].endswith("text.delta")] == [
        "Hel",
        "lo wor",
        "ld",
    ]
    (message,) = events[-1]["response"]["output"]
    assert message["id"] == f"msg_{REQUEST_ID}_0"
    assert message["content"][0]["text"] == "Hello world"
    assert message["status"] == "completed"
    assert events[-2]["item"] == message
    assert builder.snapshot() == events[-1]["response"]
    usage = events[-1]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (7, 4, 11)


def test_reasoning_then_a_call_come_as_two_items_in_order() -> None:
    think = ("<think>", "plan", "</think>", "\n\n")
    events, _ = build(record(tools=True, think=True), entries(think, CALL))
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": "plan"}]
    call = output[1]
    assert (call["name"], call["arguments"], call["status"]) == (
        "weather",
        '{"city":"Oslo"}',
        "completed",
    )
    assert call["call_id"] == f"call_{REQUEST_ID}_0_0"
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["output_index"], e["arguments"]) for e in done] == [(1, '{"city":"Oslo"}')]
    # Three tokens before the end of the reasoning (the end tag included).
    assert events[-1]["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == 3


@pytest.mark.parametrize(
    ("end", "status", "terminal", "detail"),
    [
        (FinishReason.LENGTH, "incomplete", "incomplete", {"reason": "max_output_tokens"}),
        (FinishReason.TIMEOUT, "incomplete", "incomplete", {"reason": "timeout"}),
        (FinishReason.CANCELLED, "cancelled", "cancelled", None),
        (FinishReason.ERROR, "failed", "failed", None),
    ],
)
def test_each_ending_has_its_terminal_event(
    end: FinishReason, status: str, terminal: str, detail: dict[str, str] | None
) -> None:
    events, _ = build(record(), entries("Hel", "lo", end=end))
    response = events[-1]["response"]
    assert kinds(events)[-1] == terminal
    assert (response["status"], response["incomplete_details"]) == (status, detail)
    assert response["output"][0]["status"] == "incomplete"
    if end is FinishReason.ERROR:
        assert response["error"] == {"code": "server_error", "message": "generation failed: boom"}


def test_a_call_cut_short_is_dropped_never_sent_as_text() -> None:
    events, _ = build(
        record(tools=True), entries('{"tool_calls": [{"name": "wea', end=FinishReason.LENGTH)
    )
    assert kinds(events) == ["created", "in_progress", "incomplete"]
    assert events[-1]["response"]["output"] == []


def test_a_background_response_is_in_progress_from_its_first_tokens() -> None:
    builder = EventBuilder(record(background=True))
    assert kinds(builder.opening()) == ["created", "queued"]
    assert builder.snapshot(queued=True)["status"] == "queued"
    stream = entries("Hi")
    assert kinds(builder.feed(stream[0]))[:2] == ["in_progress", "output_item.added"]
    partial = builder.snapshot(queued=True)
    assert partial["status"] == "in_progress"
    assert partial["output"][0]["content"][0]["text"] == "Hi"
    assert partial["output"][0]["status"] == "in_progress"
    cancelled_while_queued, _ = build(record(background=True), entries(end=FinishReason.CANCELLED))
    assert kinds(cancelled_while_queued) == ["created", "queued", "cancelled"]


def test_nothing_follows_the_final_entry() -> None:
    stream = entries("Hi")
    builder = EventBuilder(record())
    builder.opening()
    for entry in stream:
        builder.feed(entry)
    assert builder.feed(stream[-1]) == []


def test_completed_at_counts_from_created_at() -> None:
    final = FinalEvent(finish_reason=FinishReason.STOP, timings={"total_s": 2.5})
    stream: list[Any] = [parse_entry("1-0", {b"e": dumps(final)})]
    _, builder = build(record(), stream)
    assert builder.snapshot()["completed_at"] == 1_700_000_002.5


def openai_event_types() -> dict[str, Any]:
    """Each event type of the ``openai`` package's ResponseStreamEvent, by its name."""
    from typing import get_args

    from openai.types.responses import ResponseStreamEvent

    union = get_args(ResponseStreamEvent)[0]
    return {get_args(c.model_fields["type"].annotation)[0]: c for c in get_args(union)}


def test_every_event_and_object_has_the_openai_packages_shape() -> None:
    from openai.types.responses import Response

    from producer.responses.models import ResponseObject

    types = openai_event_types()
    think = ("<think>", "plan", "</think>", "\n\n", "Hi")
    streams = [
        (record(tools=True, think=True), entries(think, CALL)),
        (record(background=True), entries("Hel", "lo", end=FinishReason.LENGTH)),
        (record(), entries("Hi", end=FinishReason.ERROR)),
    ]
    for made, stream in streams:
        events, builder = build(made, stream)
        for event in events:
            types[event["type"]].model_validate(event)
        Response.model_validate(builder.snapshot())
        ResponseObject.model_validate(builder.snapshot())
