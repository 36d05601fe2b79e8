"""A model whose template takes tools and thinks, as the gateway serves it: the features
its workers register decide how tools reach it and how its reply is read, whole and
streamed (over HTTP against a real uvicorn, a scripted worker playing Qwen3)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from producer.openai.responses import ChatCompletionChunk
from shared.chat import ChatFeatures
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL
from tests.producer.gateway.sse_client import messages

QWEN3 = ChatFeatures(tool_format="hermes", think=("<think>", "</think>"))
REPLY = (
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
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
ASK: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Weather in Oslo?"}],
    "tools": [WEATHER],
}


def _as_qwen3(gateway: RunningGateway) -> None:
    gateway.worker.chat, gateway.worker.script = QWEN3, REPLY
    gateway.worker.register()
    time.sleep(1.1)  # the gateway reads the registry at most once a second


def test_tools_go_through_the_template_and_the_reply_is_read_in_its_format(
    gateway: RunningGateway,
) -> None:
    _as_qwen3(gateway)
    with gateway.client() as http:
        body = http.post("/v1/chat/completions", json=ASK).json()
    (request,) = gateway.worker.claimed
    assert request.tools is not None and [t.name for t in request.tools] == ["weather"]
    assert [m.role for m in request.messages or ()] == ["user"]  # no fallback prompt
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    assert message["reasoning_content"] == message["reasoning"] == "\nplan it\n"
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "weather"
    assert orjson.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    usage = body["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 4}


def test_a_streamed_reply_sends_reasoning_then_the_call(gateway: RunningGateway) -> None:
    _as_qwen3(gateway)
    request = {**ASK, "stream": True, "stream_options": {"include_usage": True}}
    with gateway.client() as http, http.stream("POST", "/v1/chat/completions", json=request) as r:
        data = [m.data for m in messages(r)]
    chunks = [ChatCompletionChunk.model_validate_json(d) for d in data[:-1]]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.reasoning_content or "") for d in deltas)
    assert reasoning == "".join((d.reasoning or "") for d in deltas) == "\nplan it\n"
    assert not any(d.content for d in deltas)
    calls = [call for d in deltas for call in d.tool_calls or ()]
    assert [(c.index, c.function.name) for c in calls] == [(0, "weather")]
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 4


def test_thinking_turned_off_reads_the_reply_as_answer(gateway: RunningGateway) -> None:
    _as_qwen3(gateway)
    gateway.worker.script = ("It is ", "sunny.")
    off = {**ASK, "tools": None, "chat_template_kwargs": {"enable_thinking": False}}
    with gateway.client() as http:
        message = http.post("/v1/chat/completions", json=off).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "It is sunny."}
    (request,) = gateway.worker.claimed
    assert request.chat_template_kwargs == {"enable_thinking": False}
