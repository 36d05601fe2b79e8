"""``/v1/responses`` with what the chat route's translation brings: function tools and
``function_call`` items, a conversation continued by ``previous_response_id`` with
``function_call_output``, a reasoning model's ``reasoning`` items, strict schemas (a
scripted worker plays the model; the unmodified ``openai`` package calls)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from shared.chat import ChatFeatures
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL

WEATHER: Any = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
FALLBACK_CALL = ('{"tool_calls": [{"name": "weather", ', '"arguments": {"city": "Oslo"}}]}')
QWEN3 = ChatFeatures(tool_format="hermes", think=("<think>", "</think>"))
QWEN3_REPLY = (
    "<think>",
    "\nplan",
    " it\n",
    "</think>",
    "\n\n",
    "<tool_call>",
    '\n{"name": "weather", ',
    '"arguments": {"city": "Oslo"}}',
    "\n</tool_call>",
)


@pytest.fixture
def client(gateway: RunningGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0) as c:
        yield c


def test_a_call_comes_back_as_a_function_call_item_and_its_result_continues(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    gateway.worker.script = FALLBACK_CALL
    first = client.responses.create(
        model=MODEL, input="Weather in Oslo?", tools=[WEATHER], instructions="Be brief."
    )
    (call,) = first.output
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Oslo"})
    assert first.status == "completed"
    gateway.worker.script = ("It is ", "sunny.")
    result: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = client.responses.create(
        model=MODEL, input=result, tools=[WEATHER], previous_response_id=first.id
    )
    assert second.output_text == "It is sunny."
    assert second.previous_response_id == first.id
    messages = gateway.worker.claimed[1].messages or ()
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert "Be brief." not in messages[0].content  # instructions are not carried over
    assert json.loads(messages[2].content)["tool_calls"][0]["name"] == "weather"
    assert messages[3].content == f"Result of tool call {call.call_id}: sunny"


def test_a_forced_call_is_decoded_to_the_functions_schema(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    gateway.worker.script = FALLBACK_CALL
    client.responses.create(
        model=MODEL,
        input="Weather?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "weather"},
    )
    guide = gateway.worker.claimed[0].sampling.guided_json
    assert guide is not None
    arguments = guide["properties"]["tool_calls"]["items"]["anyOf"][0]["properties"]["arguments"]
    # Strict unless said otherwise, as OpenAI's function tools are.
    assert arguments["required"] == ["city"] and arguments["additionalProperties"] is False


def test_a_streamed_call_sends_its_arguments_and_item_events(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    gateway.worker.script = FALLBACK_CALL
    events = list(client.responses.create(model=MODEL, input="?", tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert kinds[2:6] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert "response.output_text.delta" not in kinds  # raw call JSON is never text
    done = events[-1]
    assert done.type == "response.completed"
    assert [item.type for item in done.response.output] == ["function_call"]


def test_a_reasoning_model_answers_reasoning_items_and_counts_its_tokens(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    gateway.worker.chat, gateway.worker.script = QWEN3, QWEN3_REPLY
    gateway.worker.register()
    time.sleep(1.1)  # the gateway reads the registry at most once a second
    response = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER])
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "\nplan it\n"
    assert call.type == "function_call" and call.name == "weather"
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 4
    request = gateway.worker.claimed[0]
    assert request.tools is not None and [t.name for t in request.tools] == ["weather"]
    events = list(client.responses.create(model=MODEL, input="Weather?", stream=True))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == "\nplan it\n"


def test_a_strict_json_schema_is_decoded_as_the_chat_route_does(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    text: Any = {
        "format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}
    }
    response = client.responses.create(model=MODEL, input="A place?", text=text)
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"
    guide = gateway.worker.claimed[0].sampling.guided_json
    assert guide == {**schema, "required": ["name"], "additionalProperties": False}


def test_a_schema_keyword_that_cannot_be_enforced_is_refused_by_its_responses_name(
    client: openai.OpenAI,
) -> None:
    schema = {"type": "object", "not": {"required": ["x"]}}
    text: Any = {"format": {"type": "json_schema", "name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError, match=r"text\.format\.schema") as raised:
        client.responses.create(model=MODEL, input="?", text=text)
    assert (
        isinstance(raised.value.body, dict) and raised.value.body["param"] == "text.format.schema"
    )
