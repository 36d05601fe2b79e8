"""Structured outputs, tools, n, penalties and logit_bias with the unmodified ``openai``
package against a gateway process and a worker on the default model."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionMessageParam

from shared.settings import DEFAULT_MODEL
from tests.integration.openai_tools import PARAMETERS, TOOLS

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "likes": {"type": "array", "items": {"enum": ["tea", "cats", "maps"]}, "maxItems": 3},
    },
    "required": ["name", "age", "likes"],
    "additionalProperties": False,
}
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Weather in Paris?"}]


class City(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)
    population: int = pydantic.Field(ge=0, le=99_999_999)


@pytest.fixture(scope="module")
def client(openai_client: openai.OpenAI) -> openai.OpenAI:
    return openai_client


def chat(c: openai.OpenAI, **fields: Any) -> Any:
    return c.chat.completions.create(model=DEFAULT_MODEL, **{"messages": ASK, **fields})


def test_json_schema_output_validates_at_temperature_one(client: openai.OpenAI) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "p", "schema": PERSON, "strict": True},
    }
    for i, prompt in enumerate(
        ["Describe someone.", "Invent a character.", "Who lives next door?"]
    ):
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
        reply = chat(
            client,
            messages=messages,
            temperature=1.0,
            seed=i,
            max_tokens=150,
            response_format=response_format,
        )
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)


def test_json_object_output_is_an_object(client: openai.OpenAI) -> None:
    reply = chat(client, max_tokens=150, response_format={"type": "json_object"}, temperature=0)
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:
        assert reply.choices[0].finish_reason == "length"


def test_the_parse_helper_returns_a_pydantic_object(client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a big city."}]
    reply = client.chat.completions.parse(
        model=DEFAULT_MODEL, messages=messages, response_format=City, max_tokens=150, temperature=0
    )
    assert isinstance(reply.choices[0].message.parsed, City)


def _check_calls(calls: list[tuple[str, str]], names: set[str]) -> None:
    assert calls
    for name, arguments in calls:
        assert name in names
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])


def _calls(message: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


@pytest.mark.parametrize(
    ("choice", "names", "finish"),
    [
        ("required", {"get_weather", "add"}, "tool_calls"),
        ({"type": "function", "function": {"name": "add"}}, {"add"}, "stop"),
    ],
)
def test_forced_tool_calls_validate_whole_and_streamed(
    client: openai.OpenAI, choice: Any, names: set[str], finish: str
) -> None:
    reply = chat(
        client,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        max_tokens=200,
        temperature=1.0,
        seed=3,
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == finish and message.content is None
    _check_calls(_calls(message), names)
    assert all(c.id and c.type == "function" for c in message.tool_calls)
    stream = chat(
        client,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        max_tokens=200,
        stream=True,
        seed=4,
    )
    streamed: dict[int, list[str]] = {}
    finishes = []
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or ():
            assert call.function is not None and call.function.name is not None
            streamed[call.index] = [call.function.name, call.function.arguments or ""]
        finishes.append(chunk.choices[0].finish_reason)
    _check_calls([(n, a) for n, a in streamed.values()], names)
    assert finishes[-1] == finish


def test_auto_tools_answer_text_or_valid_calls(client: openai.OpenAI) -> None:
    for stream in (False, True):
        if stream:
            chunks = list(chat(client, tools=TOOLS, max_tokens=60, temperature=0, stream=True))
            finish = chunks[-1].choices[0].finish_reason
            assert finish in ("stop", "length", "tool_calls")
            continue
        reply = chat(client, tools=TOOLS, tool_choice="auto", max_tokens=60, temperature=0)
        if reply.choices[0].finish_reason == "tool_calls":
            _check_calls(_calls(reply.choices[0].message), {"get_weather", "add"})
        else:
            assert reply.choices[0].message.content


def test_a_multi_turn_tool_conversation_runs(client: openai.OpenAI) -> None:
    first = chat(
        client,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        temperature=0,
    )
    message = first.choices[0].message
    messages: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [c.model_dump() for c in message.tool_calls],
        },
        *(
            {"role": "tool", "tool_call_id": c.id, "content": "18 degrees, sunny"}
            for c in message.tool_calls
        ),
    ]
    reply = chat(client, messages=messages, tools=TOOLS, max_tokens=40, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_n_choices_come_with_indexes_and_summed_usage(client: openai.OpenAI) -> None:
    reply = chat(client, n=3, max_tokens=8, temperature=1.0, seed=1)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage is not None
    stream = chat(  # sampled: an end-of-sequence token must not leave a choice empty
        client,
        n=2,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    texts: dict[int, str] = {0: "", 1: ""}
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens <= 12 and all(texts.values())


def test_logit_bias_bans_and_forces_greedy_tokens(client: openai.OpenAI) -> None:
    from transformers import AutoTokenizer

    from worker.model_store import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    plain = chat(client, temperature=0, max_tokens=8).choices[0].message.content
    first = tokenizer.encode(plain)[0]
    banned = chat(client, temperature=0, max_tokens=8, logit_bias={str(first): -100})
    assert first not in tokenizer.encode(banned.choices[0].message.content)
    forced_id = tokenizer.encode(" maple")[0]
    forced = chat(client, temperature=0, max_tokens=4, logit_bias={str(forced_id): 100})
    assert forced.choices[0].message.content == tokenizer.decode([forced_id] * 4)


def test_penalties_change_greedy_output(client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Repeat 'go' many times."}
    ]
    plain = chat(client, messages=messages, temperature=0, max_tokens=24)
    penalized = chat(
        client,
        messages=messages,
        temperature=0,
        max_tokens=24,
        frequency_penalty=2.0,
        presence_penalty=2.0,
    )
    assert plain.choices[0].message.content != penalized.choices[0].message.content


def test_out_of_range_values_are_refused_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        chat(client, frequency_penalty=3)
    assert bad.value.param == "frequency_penalty"
    with pytest.raises(openai.BadRequestError, match="'not'") as unsupported:
        chat(
            client,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}},
            },
        )
    assert unsupported.value.param == "response_format.json_schema.schema"
