"""Batch lines for ``/v1/responses``: read by the live route's translation, refused where
only a live call means something, and answered with the response object the route
would have answered."""

from __future__ import annotations

import json
from typing import Any

import pytest

from producer.batch.bodies import parse_jsonl
from producer.batch.lines import BatchLine
from producer.batch.output import result_line
from producer.streams.entries import parse_entry
from shared.chat import ChatFeatures
from shared.models import FinishReason, Result, Timings, TokenEvent, Usage, dumps
from shared.settings import Settings

SETTINGS = Settings()
WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object"}}
REQUEST_ID = "0123abcd-0123456789abcdef01234567"


def line(custom_id: str = "a", /, **body: Any) -> str:
    fields = {"model": "m", "input": "Weather in Oslo?", **body}
    return json.dumps({"custom_id": custom_id, "url": "/v1/responses", "body": fields})


def result(text: str, num_tokens: int, reason: str = "stop") -> Result:
    return Result(
        id=REQUEST_ID,
        model="m",
        text=text,
        token_ids=tuple(range(num_tokens)),
        finish_reason=FinishReason(reason),
        usage=Usage(prompt_tokens=4, completion_tokens=num_tokens),
        timings=Timings(total_s=1.0),
    )


def test_a_responses_line_runs_as_the_route_would_run_it() -> None:
    (parsed,) = parse_jsonl(line(instructions="Be brief.", max_output_tokens=7), SETTINGS)
    assert parsed.kind == "response" and parsed.error is None and parsed.request is not None
    messages = parsed.request.messages or ()
    assert [(m.role, m.content) for m in messages] == [
        ("system", "Be brief."),
        ("user", "Weather in Oslo?"),
    ]
    assert parsed.request.sampling.max_tokens == 7
    assert BatchLine.from_json(parsed.to_json()) == parsed  # as the store keeps it
    ok, out = result_line(parsed, [result("Sunny.", 2)])
    body = json.loads(out)["response"]["body"]
    assert ok and body["object"] == "response" and body["id"] == f"resp_{REQUEST_ID}"
    assert (body["status"], body["store"], body["instructions"]) == (
        "completed",
        False,
        "Be brief.",
    )
    (message,) = body["output"]
    assert message["content"][0]["text"] == "Sunny."
    assert body["usage"]["input_tokens"] == 4 and body["usage"]["output_tokens"] == 2


def test_a_call_comes_back_as_a_function_call_item() -> None:
    (parsed,) = parse_jsonl(line(tools=[WEATHER], tool_choice="required"), SETTINGS)
    assert parsed.request is not None and parsed.request.sampling.guided_json is not None
    reply = '{"tool_calls": [{"name": "weather", "arguments": {"city": "Oslo"}}]}'
    ok, out = result_line(parsed, [result(reply, 9)])
    (call,) = json.loads(out)["response"]["body"]["output"]
    assert ok and (call["type"], call["name"]) == ("function_call", "weather")
    assert json.loads(call["arguments"]) == {"city": "Oslo"}


def test_a_reasoning_lines_tokens_are_counted_from_its_stream() -> None:
    qwen3 = ChatFeatures(tool_format="hermes", think=("<think>", "</think>"))
    (parsed,) = parse_jsonl(line(), SETTINGS, features=lambda model: qwen3)
    assert parsed.reasoning is not None
    reply = ["<think>", "cold", "</think>", "\n\n", "Snow."]
    events = [TokenEvent(index=i, token_ids=(i,), text=t) for i, t in enumerate(reply)]
    stream = [parse_entry(f"{i}-0", {b"e": dumps(e)}) for i, e in enumerate(events)]
    ok, out = result_line(parsed, [result("".join(reply), len(reply))], [stream])
    body = json.loads(out)["response"]["body"]
    assert ok and [item["type"] for item in body["output"]] == ["reasoning", "message"]
    assert body["output"][1]["content"][0]["text"] == "Snow."
    assert body["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_x"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"store": True}, "store"),
        ({"stream": True}, "stream"),
        ({"priority": "high"}, "priority"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input.0.content.0.type",
        ),
    ],
)
def test_fields_a_batch_line_cannot_honour_are_refused_by_name(
    fields: dict[str, Any], param: str
) -> None:
    (parsed,) = parse_jsonl(line(**fields), SETTINGS)
    assert parsed.request is None and parsed.error is not None
    assert parsed.error.param == param and parsed.error.status == 400
