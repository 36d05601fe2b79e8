"""A Responses body read into the request the chat route would run: input items as chat
messages, tools, formats and reasoning effort through the chat translation, and errors
that name the Responses fields."""

from __future__ import annotations

from typing import Any

import pytest

from producer.openai.errors import ApiError
from producer.openai.requests import Origin
from producer.responses.plan import response_plan
from producer.responses.schemas import ResponsesBody
from shared.chat import ChatFeatures

ORIGIN = Origin(50)
WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object"}}


def plan(features: ChatFeatures | None = None, **body: Any) -> Any:
    return response_plan(ResponsesBody.model_validate({"model": "m", **body}), ORIGIN, features)


def roles(request: Any) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in request.messages]


def test_a_text_input_is_one_user_message_after_the_instructions() -> None:
    made = plan(input="hi", instructions="Be brief.", metadata={"k": "v"})
    assert roles(made.request) == [("system", "Be brief."), ("user", "hi")]
    assert (made.request.metadata, made.request.tenant) == ({"k": "v"}, None)  # set at submit
    assert made.request.priority == 50
    assert made.record.input[0]["content"] == [{"type": "input_text", "text": "hi"}]


def test_items_become_the_conversation_the_chat_route_would_run() -> None:
    items = [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    made = plan(ChatFeatures(tool_format="hermes"), input=items, tools=[WEATHER])
    messages = made.request.messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2].content == "Checking."  # the call joins the turn it follows
    (call,) = messages[2].tool_calls
    assert (call.id, call.name, call.arguments) == ("c1", "weather", {"a": 1})
    assert (messages[3].tool_call_id, messages[3].content) == ("c1", "sunny")
    assert [i["type"] for i in made.record.input][2] == "reasoning"  # kept, not sent


def test_the_records_items_get_ids_with_the_request() -> None:
    made = plan(
        input=[{"role": "user", "content": "a"}, {"role": "user", "content": "b", "id": "mine"}]
    )
    stored = made.record.stored("0123abcd-0123456789abcdef01234567", 1.0)
    assert [i["id"] for i in stored.input] == ["msg_0123abcd-0123456789abcdef01234567_in0", "mine"]
    assert stored.id == "resp_0123abcd-0123456789abcdef01234567"


def test_function_tools_are_strict_unless_they_say_not() -> None:
    loose = {
        **WEATHER,
        "name": "loose",
        "strict": False,
        "parameters": {"type": "object", "properties": {"a": {}}},
    }
    strict = {**WEATHER, "parameters": {"type": "object", "properties": {"a": {}}}}
    made = plan(input="?", tools=[strict, loose], tool_choice="required")
    calls = made.request.sampling.guided_json["properties"]["tool_calls"]["items"]["anyOf"]
    strict_args, loose_args = (c["properties"]["arguments"] for c in calls)
    assert strict_args["required"] == ["a"]
    assert "required" not in loose_args
    assert [t["strict"] for t in made.record.tools] == [True, False]


def test_reasoning_effort_reaches_the_template() -> None:
    made = plan(input="?", reasoning={"effort": "low"})
    assert made.request.chat_template_kwargs == {"reasoning_effort": "low"}
    assert made.record.reasoning == {"effort": "low"}


def test_a_reasoning_model_gets_its_plan() -> None:
    made = plan(ChatFeatures(think=("<think>", "</think>")), input="?")
    assert made.record.think_plan() is not None
    off = plan(ChatFeatures(think=("<think>", "</think>")), input="?",
               chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    assert off.record.think_plan() is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"role": "user", "content": "x"}] * 1001}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "input.0.content.0.type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input.0.output"),
        ({"input": "?", "text": {"format": {"type": "json_schema", "name": "x"}}},
         "text.format.schema"),
        ({"input": "?", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "?", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]},
         "tool_choice"),
        ({"input": "?", "top_logprobs": 3}, "top_logprobs"),
        ({"input": "?", "conversation": "conv_1"}, "conversation"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_names_its_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as raised:
        plan(**body)
    assert raised.value.status == 400
    assert raised.value.detail.param == param
    assert param in raised.value.detail.message
