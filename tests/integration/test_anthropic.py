"""The unmodified ``anthropic`` package (and vLLM-shaped /tokenize, /detokenize calls)
against a gateway process and a worker process on the default model."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from producer.embedded import EmbeddedRedis
from shared.settings import DEFAULT_MODEL
from tests.integration.openai_stack import WORKER_ARGS, wait_for_limits
from tests.producer.gateway.process import gateway_process

pytestmark = pytest.mark.integration
KEYS = "sk-alpha=alpha:critical,sk-beta=beta:normal"
SYSTEM = "You are a terse assistant."
QUESTION = "What is the capital of France?"
# This SDK sends sampling fields only as extra body fields (its create() dropped them).
GREEDY = {"temperature": 0}
WEATHER: anthropic.types.ToolParam = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def gateway_url(
    redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A gateway with two tenants' keys and a worker on the default model."""
    redis.Redis.from_url(redis_server.url).flushall()
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--model", DEFAULT_MODEL, *WORKER_ARGS]
    with log_path.open("wb") as log, gateway_process(redis_server.url, KEYS) as url:
        worker = subprocess.Popen([*cmd, "--redis", redis_server.url], stdout=log, stderr=log)
        try:
            _wait_for_worker(url, worker, log_path)
            wait_for_limits(redis_server.url, DEFAULT_MODEL)
            yield url
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)


def _wait_for_worker(url: str, worker: subprocess.Popen[bytes], log: Path) -> None:
    headers = {"x-api-key": "sk-alpha"}
    for _ in range(900):
        if worker.poll() is not None:
            pytest.fail(f"the worker exited: {log.read_text()[-2000:]}")
        models = httpx.get(f"{url}/v1/models", headers=headers).json()
        if [m["id"] for m in models["data"]] == [DEFAULT_MODEL]:
            return
        time.sleep(0.2)
    pytest.fail("the worker did not register in 180s")


@pytest.fixture
def claude(gateway_url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway_url, api_key="sk-alpha", max_retries=0) as c:
        yield c


@pytest.fixture
def chat(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="sk-alpha", max_retries=0) as c:
        yield c


def _text(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_message_equals_the_chat_routes_answer(
    claude: anthropic.Anthropic, chat: openai.OpenAI
) -> None:
    message = claude.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=16,
        system=SYSTEM,
        messages=[{"role": "user", "content": QUESTION}],
        metadata={"user_id": "u-1"},
        extra_body=GREEDY,
    )
    reply = chat.chat.completions.create(
        model=DEFAULT_MODEL,
        max_tokens=16,
        temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
    )
    assert message.role == "assistant" and message.type == "message"
    assert _text(message) == reply.choices[0].message.content
    assert _text(message)
    assert reply.usage is not None
    assert message.usage.input_tokens == reply.usage.prompt_tokens
    assert message.usage.output_tokens == reply.usage.completion_tokens
    expected = "max_tokens" if reply.choices[0].finish_reason == "length" else "end_turn"
    assert message.stop_reason == expected


def test_stream_sends_anthropics_events(claude: anthropic.Anthropic, gateway_url: str) -> None:
    body: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "max_tokens": 5,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
    }
    whole = claude.messages.create(**body)
    events = list(claude.messages.create(**body, stream=True))
    kinds = [e.type for e in events]  # the SDK drops pings
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.text for d in deltas if d.type == "text_delta") == _text(whole)
    end = next(e for e in events if e.type == "message_delta")
    assert end.delta.stop_reason == whole.stop_reason == "max_tokens"
    assert end.usage.output_tokens == 5
    assert end.usage.input_tokens == whole.usage.input_tokens
    with claude.messages.stream(**body) as stream:  # the SDK's own accumulation
        assert _text(stream.get_final_message()) == _text(whole)
    raw = httpx.post(
        f"{gateway_url}/v1/messages",
        headers={"x-api-key": "sk-alpha", "anthropic-version": "2023-06-01"},
        json={**body.pop("extra_body"), **body, "stream": True},
    )
    names = [line[len("event: ") :] for line in raw.text.splitlines() if line.startswith("event:")]
    assert names == ["message_start", "ping", *kinds[1:]]


def test_a_stop_sequence_ends_the_message_and_is_named(claude: anthropic.Anthropic) -> None:
    question: list[Any] = [{"role": "user", "content": QUESTION}]
    free = claude.messages.create(
        model=DEFAULT_MODEL, max_tokens=12, messages=question, extra_body=GREEDY
    )
    word = _text(free).split()[2]  # a word the greedy answer holds
    stopped = claude.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=12,
        messages=question,
        stop_sequences=["never-seen", word],
        extra_body=GREEDY,
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert _text(stopped) == _text(free)[: _text(free).index(word)]


def test_a_client_that_leaves_a_stream_cancels_its_message(gateway_url: str) -> None:
    headers = {"x-api-key": "sk-alpha", "anthropic-version": "2023-06-01"}
    body = {
        "model": DEFAULT_MODEL,
        "max_tokens": 400,
        "temperature": 0,  # greedy: a sampled story could end before the client leaves
        "stream": True,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
    }
    with httpx.stream("POST", f"{gateway_url}/v1/messages", headers=headers, json=body) as reply:
        request_id = reply.headers["x-tokenq-request-id"]
        for line in reply.iter_lines():
            if line == "event: content_block_delta":
                break  # the message is being written: leave
    for _ in range(100):
        view = httpx.get(f"{gateway_url}/v1/requests/{request_id}", headers=headers).json()
        if view["state"] != "running":
            break
        time.sleep(0.2)
    assert view["state"] == "cancelled"
    assert view["num_generated"] < 400


def test_tool_round_trip(claude: anthropic.Anthropic) -> None:
    question: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = claude.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=64,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=question,
    )
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input, dict)
    assert isinstance(use.input["city"], str)
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}
    turn: Any = {"role": "user", "content": [result]}
    second = claude.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=16,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[*question, {"role": "assistant", "content": first.content}, turn],
    )
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in second.content] == ["text"] and _text(second)
    # The result is in the prompt: a longer one makes a longer prompt.
    longer = {**result, "content": "Sunny, 24 C, a light wind from the west, no rain today"}
    counts = [
        claude.messages.count_tokens(
            model=DEFAULT_MODEL,
            messages=[*question, {"role": "assistant", "content": first.content}, turn],  # type: ignore[list-item]
        ).input_tokens
        for turn in ({"role": "user", "content": [result]}, {"role": "user", "content": [longer]})
    ]
    assert second.usage.input_tokens == counts[0] < counts[1]


def test_count_tokens_equals_the_prompt_used(claude: anthropic.Anthropic) -> None:
    body: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "system": SYSTEM,
        "tools": [WEATHER],
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
    }
    counted = claude.messages.count_tokens(**body)
    used = claude.messages.create(**body, max_tokens=1)
    assert counted.input_tokens == used.usage.input_tokens > 0
    plain = claude.messages.count_tokens(model=DEFAULT_MODEL, messages=body["messages"])
    assert plain.input_tokens < counted.input_tokens  # the system and tools are counted


def test_errors_take_anthropics_shape(claude: anthropic.Anthropic, gateway_url: str) -> None:
    missing = httpx.post(
        f"{gateway_url}/v1/messages",
        headers={"x-api-key": "sk-alpha", "anthropic-version": "2023-06-01"},
        json={"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert missing.status_code == 400
    body = missing.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    bad = anthropic.Anthropic(base_url=gateway_url, api_key="sk-wrong", max_retries=0)
    with bad, pytest.raises(anthropic.AuthenticationError) as refused:
        bad.messages.create(
            model=DEFAULT_MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "unknown API key"},
    }
    beta = anthropic.Anthropic(base_url=gateway_url, api_key="sk-beta", max_retries=0)
    with beta, pytest.raises(anthropic.PermissionDeniedError) as above:
        beta.messages.create(
            model=DEFAULT_MODEL,
            max_tokens=4,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"priority": "critical"},  # as on the OpenAI routes
        )
    assert above.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        claude.messages.create(
            model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_a_tenant_sees_only_its_own_messages(claude: anthropic.Anthropic, gateway_url: str) -> None:
    raw = claude.messages.with_raw_response.create(
        model=DEFAULT_MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    request_id = raw.headers["x-tokenq-request-id"]
    assert raw.parse().id == f"msg_{request_id}"
    own = httpx.get(f"{gateway_url}/v1/requests/{request_id}", headers={"x-api-key": "sk-alpha"})
    other = httpx.get(f"{gateway_url}/v1/requests/{request_id}", headers={"x-api-key": "sk-beta"})
    assert own.status_code == 200 and own.json()["state"] == "finished"
    assert other.status_code == 404


def test_tokenize_and_detokenize_round_trip(gateway_url: str) -> None:
    headers = {"Authorization": "Bearer sk-alpha"}
    text = "Queues, tokens & émigrés: naïve café 😀!"
    tokenized = httpx.post(
        f"{gateway_url}/tokenize",
        headers=headers,
        json={"model": DEFAULT_MODEL, "prompt": text, "add_special_tokens": False},
    ).json()
    assert tokenized["count"] == len(tokenized["tokens"]) > 5
    assert tokenized["max_model_len"] > 0
    detokenized = httpx.post(
        f"{gateway_url}/detokenize",
        headers=headers,
        json={"model": DEFAULT_MODEL, "tokens": tokenized["tokens"]},
    )
    assert detokenized.json() == {"prompt": text}


def test_tokenize_counts_messages_as_the_chat_route(gateway_url: str, chat: openai.OpenAI) -> None:
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    counted = httpx.post(
        f"{gateway_url}/tokenize",
        headers={"Authorization": "Bearer sk-alpha"},
        json={"model": DEFAULT_MODEL, "messages": messages},
    ).json()
    reply = chat.chat.completions.create(model=DEFAULT_MODEL, messages=messages, max_tokens=1)
    assert reply.usage is not None
    assert counted["count"] == reply.usage.prompt_tokens


def test_tokenizer_errors_name_the_field(gateway_url: str) -> None:
    headers = {"Authorization": "Bearer sk-alpha"}
    out_of_vocab = httpx.post(
        f"{gateway_url}/detokenize",
        headers=headers,
        json={"model": DEFAULT_MODEL, "tokens": [1, 10**7]},
    )
    assert out_of_vocab.status_code == 400
    assert out_of_vocab.json()["error"]["param"] == "tokens"
    assert "outside the model's vocabulary" in out_of_vocab.json()["error"]["message"]
    both = httpx.post(
        f"{gateway_url}/tokenize",
        headers=headers,
        json={
            "model": DEFAULT_MODEL,
            "prompt": "a",
            "messages": [{"role": "user", "content": "b"}],
        },
    )
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
