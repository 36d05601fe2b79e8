"""OpenAI bodies become GenerationRequests; what cannot be served is refused by name."""

from __future__ import annotations

import pytest

from producer.openai.errors import ApiError
from producer.openai.reasoning import ReasoningPlan
from producer.openai.requests import Origin, chat_request, completion_request
from producer.openai.schemas import ChatCompletionRequest, CompletionRequest
from shared.chat import ChatFeatures

CALLER = Origin(50)


def _chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_sampling_fields_map_onto_sampling_params() -> None:
    req = chat_request(
        _chat(
            max_completion_tokens=7,
            max_tokens=3,
            temperature=0,
            stop="##",
            seed=4,
            logprobs=True,
            top_logprobs=3,
            presence_penalty=0.5,
            frequency_penalty=-1,
            logit_bias={"17": -100},
        ),
        CALLER,
    ).requests[0]
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.stop, s.seed, s.logprobs) == (7, 0.0, ("##",), 4, 3)
    assert (s.presence_penalty, s.frequency_penalty, s.logit_bias) == (0.5, -1.0, {17: -100.0})
    assert (req.metadata, req.tenant) == ({}, None)  # the tenant is set when it is submitted


def test_a_request_opts_out_of_speculative_decoding_as_an_extra_field() -> None:
    assert chat_request(_chat(), CALLER).requests[0].sampling.speculative
    opted_out = chat_request(_chat(speculative=False), CALLER).requests[0]
    assert opted_out.sampling.speculative is False


def test_developer_role_and_text_parts_become_plain_messages() -> None:
    body = _chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    messages = chat_request(body, CALLER).requests[0].messages or ()
    assert [(m.role, m.content) for m in messages] == [("system", "be brief"), ("user", "ab")]


def test_a_one_item_prompt_list_is_a_prompt() -> None:
    body = CompletionRequest.model_validate({"model": "m", "prompt": ["go"], "logprobs": 2})
    (req,) = completion_request(body, CALLER)
    assert (req.prompt, req.sampling.logprobs) == ("go", 2)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [[1, 2], [-1]]}, "prompt_token_ids"),
        ({"prompt": ["a"] * 17, "n": 16}, "prompt"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "echo": True, "stream": True}, "stream"),
        ({"prompt": [1] * 8193, "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "a", "best_of": 2}, "best_of"),
        ({"prompt": " "}, "prompt"),
        ({"prompt": "a", "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
    ],
)
def test_what_cannot_be_served_is_named(fields: dict[str, object], param: str) -> None:
    body = CompletionRequest.model_validate({"model": "m", **fields})
    with pytest.raises(ApiError) as caught:
        completion_request(body, CALLER)
    assert caught.value.status == 400
    assert param in caught.value.detail.message


WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_n_fans_out_into_requests_with_seed_plus_i() -> None:
    requests = chat_request(_chat(n=3, seed=10, idempotency_key="k"), CALLER).requests
    assert [r.sampling.seed for r in requests] == [10, 11, 12]
    assert [r.idempotency_key for r in requests] == ["k#0", "k#1", "k#2"]


def test_response_formats_become_guided_json() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}}
    as_schema = _chat(response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    as_object = _chat(response_format={"type": "json_object"})
    # Closed where it is silent, as vLLM reads a schema: no properties beyond "a", and
    # no integer beyond 64 bits.
    a = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
    closed = {"type": "object", "properties": {"a": a}, "additionalProperties": False}
    assert chat_request(as_schema, CALLER).requests[0].sampling.guided_json == closed
    assert chat_request(as_object, CALLER).requests[0].sampling.guided_json == {"type": "object"}


def test_required_tools_constrain_and_prompt_the_model() -> None:
    plan = chat_request(_chat(tools=[WEATHER], tool_choice="required"), CALLER)
    request = plan.requests[0]
    guided = request.sampling.guided_json
    assert guided is not None and guided["required"] == ["tool_calls"]
    messages = request.messages or ()
    assert messages[0].role == "system" and '"name":"weather"' in messages[0].content
    assert "You must call at least one tool" in messages[0].content


def test_a_tool_conversation_becomes_text_turns() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    body = _chat(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
    )
    messages = chat_request(body, CALLER).requests[0].messages or ()
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2].content == '{"tool_calls":[{"name":"weather","arguments":{}}]}'
    assert messages[3].content == "Result of tool call c1: sunny"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"response_format": {"type": "json_object"}, "tool_choice": "required"}, "tool_choice"),
        ({"guided_regex": "a+", "response_format": {"type": "json_object"}}, "guided_regex"),
    ],
)
def test_conflicting_or_unknown_tool_choices_are_named(
    fields: dict[str, object], param: str
) -> None:
    with pytest.raises(ApiError) as caught:
        chat_request(_chat(tools=[WEATHER], **fields), CALLER)
    assert caught.value.detail.param == param


QWEN3 = ChatFeatures(tool_format="hermes", think=("<think>", "</think>"))


def test_a_model_whose_template_takes_tools_gets_them_and_its_calls_forced() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    body = _chat(
        tools=[WEATHER],
        tool_choice="required",
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
    )
    plan = chat_request(body, CALLER, QWEN3)
    request = plan.requests[0]
    assert request.tools is not None and [t.name for t in request.tools] == ["weather"]
    messages = request.messages or ()
    assert [m.role for m in messages] == ["user", "assistant", "tool"]  # no fallback prompt
    assert messages[1].tool_calls is not None and messages[1].tool_calls[0].arguments == {}
    assert messages[2].tool_call_id == "c1"
    tag = request.sampling.guided_structural_tag
    assert tag is not None and request.sampling.guided_json is None
    # The model may think first (an optional think block), then calls in its format.
    thinking, calls = tag["format"]["elements"]
    assert thinking["type"] == "optional"
    assert calls["tags"][0]["begin"] == '<tool_call>\n{"name": "weather", "arguments": '
    assert plan.reasoning == ReasoningPlan("<think>", "</think>")


def test_thinking_turned_off_reads_no_reasoning_and_forces_calls_at_once() -> None:
    kwargs = {"enable_thinking": False}
    body = _chat(tools=[WEATHER], tool_choice="required", chat_template_kwargs=kwargs)
    plan = chat_request(body, CALLER, QWEN3)
    assert plan.reasoning is None
    assert plan.requests[0].chat_template_kwargs == kwargs
    tag = plan.requests[0].sampling.guided_structural_tag
    assert tag is not None and tag["format"]["type"] == "tags_with_separator"
    effort = chat_request(_chat(reasoning_effort="low"), CALLER, QWEN3).requests[0]
    assert effort.chat_template_kwargs == {"reasoning_effort": "low"}


def test_a_strict_schema_takes_every_property_and_no_other() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {}}}
    strict = {"type": "json_schema", "json_schema": {"schema": schema, "strict": True}}
    guided = chat_request(_chat(response_format=strict), CALLER).requests[0].sampling.guided_json
    assert guided == {**schema, "required": ["a", "b"], "additionalProperties": False}


def test_completions_take_token_ids_and_lists_of_prompts() -> None:
    def prompts(prompt: object) -> list[object]:
        body = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
        return [r.prompt or r.prompt_token_ids for r in completion_request(body, CALLER)]

    assert prompts([1, 2]) == [(1, 2)]
    assert prompts([[1, 2], [3]]) == [(1, 2), (3,)]
    assert prompts(["a", "b"]) == ["a", "b"]


def test_a_reasoning_models_response_format_waits_for_its_reasoning() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    response_format = {"type": "json_schema", "json_schema": {"schema": schema}}
    sampling = chat_request(_chat(response_format=response_format), CALLER, QWEN3).requests[0]
    tag = sampling.sampling.guided_structural_tag
    assert tag is not None and sampling.sampling.guided_json is None
    thinking, answer = tag["format"]["elements"]
    assert thinking["type"] == "optional" and answer["type"] == "json_schema"
    assert answer["json_schema"]["additionalProperties"] is False
