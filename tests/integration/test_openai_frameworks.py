"""Frameworks as they use the API, unmodified: LangChain's ``ChatOpenAI`` structured
output and tools, the ``openai`` package's strict schemas, cut-off tool calls and
token-id prompts, against a gateway process and a worker on the default model."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pydantic
import pytest
from langchain_openai import ChatOpenAI

from shared.settings import DEFAULT_MODEL
from tests.integration.openai_tools import ADD, TOOLS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class City(pydantic.BaseModel):
    """A city and where it is."""

    name: str
    country: str
    population: int


@pytest.fixture(scope="module")
def client(openai_client: openai.OpenAI) -> openai.OpenAI:
    return openai_client


def chat_model(client: openai.OpenAI, **fields: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=str(client.base_url), api_key="none", model=DEFAULT_MODEL, **fields)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_returns_the_parsed_object(
    client: openai.OpenAI, method: Literal["json_schema", "function_calling"]
) -> None:
    llm = chat_model(client, temperature=0, max_tokens=200)
    structured = llm.with_structured_output(City, method=method, include_raw=True)
    out: Any = structured.invoke("Tell me about Paris.")
    assert out["parsing_error"] is None
    assert isinstance(out["parsed"], City)
    assert out["raw"].usage_metadata["output_tokens"] <= 200


def test_strict_json_schema_never_has_a_property_outside_it(client: openai.OpenAI) -> None:
    # As a user writes it: strict, but without additionalProperties (OpenAI would say
    # every property is required and no other allowed; so does tokenq).
    schema = {
        "type": "object",
        "properties": {"country": {"type": "string", "maxLength": 20}, "name": {"type": "string"}},
    }
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "place", "schema": schema, "strict": True},
    }
    for seed in range(4):
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": "Name a famous place and its country."}],
            response_format=response_format,
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        content = reply.choices[0].message.content or ""
        if reply.choices[0].finish_reason == "length":
            continue  # a long string cut short: nothing to parse, and nothing extra either
        assert set(json.loads(content)) == {"country", "name"}, content


def test_bind_tools_required_returns_calls_that_fit_the_schema(client: openai.OpenAI) -> None:
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def get_weather(city: str, unit: str) -> str:
        """The weather now in a city, in celsius or fahrenheit."""
        return "sunny"

    llm = chat_model(client, temperature=0, max_tokens=200)
    message: Any = llm.bind_tools([add, get_weather], tool_choice="required").invoke(
        "What is 2 plus 3?"
    )
    assert message.tool_calls, message
    schemas: dict[str, dict[str, type]] = {
        "add": {"a": int, "b": int},
        "get_weather": {"city": str, "unit": str},
    }
    for call in message.tool_calls:
        fields = schemas[call["name"]]
        assert set(call["args"]) == set(fields)
        assert all(isinstance(call["args"][k], t) for k, t in fields.items())


def test_a_cut_off_call_list_returns_its_complete_calls(client: openai.OpenAI) -> None:
    tools: Any = TOOLS
    ask: Any = [{"role": "user", "content": "Add 1 and 2, then 3 and 4, then 5 and 6."}]
    common: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "messages": ask,
        "tools": tools,
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 45,
    }
    reply = client.chat.completions.create(**common)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in ("add", "get_weather")
        if call.function.name == "add":
            jsonschema.validate(json.loads(call.function.arguments), ADD)
    streamed: dict[int, str] = {}
    finish = None
    for chunk in client.chat.completions.create(**common, stream=True):
        delta = chunk.choices[0].delta
        assert not delta.content
        for call in delta.tool_calls or ():
            streamed[call.index] = call.function.arguments if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "length"
    assert list(streamed.values()) == [c.function.arguments for c in choice.message.tool_calls]


def test_token_id_prompts_complete_as_their_text_does(client: openai.OpenAI) -> None:
    from transformers import AutoTokenizer

    from worker.model_store import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(DEFAULT_MODEL)))
    texts = ["The capital of France is", "Two plus two is"]
    ids = [tokenizer.encode(text) for text in texts]
    greedy: dict[str, Any] = {"model": DEFAULT_MODEL, "max_tokens": 6, "temperature": 0}
    as_text = [client.completions.create(prompt=t, **greedy).choices[0].text for t in texts]
    one = client.completions.create(prompt=ids[0], **greedy)
    assert one.choices[0].text == as_text[0]
    both = client.completions.create(prompt=ids, **greedy)
    assert [c.text for c in sorted(both.choices, key=lambda c: c.index)] == as_text
    assert both.usage is not None
    assert both.usage.prompt_tokens == sum(len(i) for i in ids)
    with pytest.raises(openai.BadRequestError, match="prompt_token_ids"):
        client.completions.create(prompt=[[1, -2]], **greedy)


def test_a_token_id_outside_the_vocabulary_fails_naming_it(client: openai.OpenAI) -> None:
    # The client's mistake: a 400 naming the field, which the openai client does not retry.
    with pytest.raises(openai.BadRequestError, match=r"outside the model's vocabulary") as bad:
        client.completions.create(model=DEFAULT_MODEL, prompt=[1, 10**6], max_tokens=2)
    assert bad.value.param == "prompt"
