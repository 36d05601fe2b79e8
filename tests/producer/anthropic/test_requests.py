"""Anthropic Messages bodies mapped to tokenq requests (through the chat route's mapping)."""

from __future__ import annotations

from typing import Any

import pytest

from producer.anthropic.requests import messages_plan
from producer.anthropic.schemas import CountTokensRequest, MessagesRequest
from producer.openai.errors import ApiError
from producer.openai.requests import Origin
from shared.chat import ChatFeatures

ORIGIN = Origin(75)
WEATHER = {
    "name": "get_weather",
    "description": "The weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
RESULT = {
    "type": "tool_result",
    "tool_use_id": "toolu_1",
    "content": [{"type": "text", "text": "Rain"}],
}


def _body(**fields: Any) -> MessagesRequest:
    data = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return MessagesRequest.model_validate({**data, **fields})


def test_system_sampling_and_metadata_map_to_the_request() -> None:
    body = _body(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop_sequences=["\n\n", "END"],
        metadata={"user_id": "u-7"},
        max_tokens=99,
    )
    (gen,) = messages_plan(body, ORIGIN).requests
    assert [(m.role, m.content) for m in gen.messages or ()] == [
        ("system", "Be brief."),
        ("user", "hi"),
    ]
    s = gen.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k) == (99, 0.5, 0.9, 40)
    assert s.stop == ("\n\n", "END")
    assert (gen.metadata, gen.tenant) == ({"user": "u-7"}, None)  # set when it is submitted
    assert gen.priority == 75


def test_a_tool_round_trip_becomes_calls_and_results_in_order() -> None:
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should look.", "signature": "s"},
            {"type": "text", "text": "Let me look."},
            TOOL_USE,
        ]},
        {"role": "user", "content": [RESULT, {"type": "text", "text": "And tomorrow?"}]},
    ]  # fmt: skip
    (gen,) = messages_plan(_body(messages=messages, tools=[WEATHER]), ORIGIN).requests
    # Without native tool support (SmolLM2's template): the fallback prompt's system
    # turn, the call as text after the answer (the thinking block is left out).
    views = [m.template_view() for m in gen.messages or ()]
    assert [v["role"] for v in views] == ["system", "user", "assistant", "tool", "user"]
    assert views[2]["content"].startswith("Let me look.\n")
    assert '"arguments":{"city":"Oslo"}' in views[2]["content"] and "Rain" in views[3]["content"]
    native = messages_plan(
        _body(messages=messages, tools=[WEATHER]), ORIGIN, ChatFeatures(tool_format="hermes")
    ).requests[0]
    assistant, tool = (native.messages or ())[1:3]
    assert assistant.tool_calls is not None
    assert (assistant.tool_calls[0].name, assistant.tool_calls[0].arguments) == (
        "get_weather",
        {"city": "Oslo"},
    )
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "toolu_1", "Rain")
    assert native.tools is not None and native.tools[0].name == "get_weather"


@pytest.mark.parametrize(
    ("choice", "guided"),
    [
        ({"type": "auto"}, False),
        ({"type": "any"}, True),
        ({"type": "tool", "name": "get_weather"}, True),
    ],
)
def test_tool_choice_maps_to_the_chat_routes(choice: dict[str, Any], guided: bool) -> None:
    plan = messages_plan(_body(tools=[WEATHER], tool_choice=choice), ORIGIN)
    assert plan.requests[0].sampling.guided is guided
    assert plan.tools.active


def test_tool_choice_none_calls_nothing() -> None:
    plan = messages_plan(_body(tools=[WEATHER], tool_choice={"type": "none"}), ORIGIN)
    assert not plan.tools.active and not plan.requests[0].sampling.guided


def test_count_tokens_bodies_map_like_messages_bodies() -> None:
    fields = {"model": "m", "system": "Be brief.", "tools": [WEATHER],
              "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    counted = messages_plan(CountTokensRequest.model_validate(fields), ORIGIN).requests[0]
    sent = messages_plan(_body(**fields), ORIGIN).requests[0]
    assert counted.messages == sent.messages and counted.tools == sent.tools


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "messages.0.content.0"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 5000}, "temperature"),
    ],
)  # fmt: skip
def test_bad_bodies_are_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        messages_plan(_body(**fields), ORIGIN)
    assert refused.value.status == 400
    assert refused.value.detail.param is not None
    assert refused.value.detail.param.startswith(param)


def test_max_tokens_is_required() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        MessagesRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
