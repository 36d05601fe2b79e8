"""The official ``openai`` package, unmodified, against a gateway process, with a
scripted worker playing the model side through Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
import redis

from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.settings import Settings
from tests.producer.gateway.process import gateway_process
from tests.producer.gateway.scripted import MODEL, ScriptedWorker, expected_text

pytestmark = pytest.mark.integration
KEYS = "sk-test=tests:critical,sk-web=web:normal"
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    redis.Redis.from_url(redis_server.url).flushall()
    with gateway_process(redis_server.url, KEYS) as url:
        yield url


@pytest.fixture
def worker(redis_server: EmbeddedRedis, gateway_url: str) -> Iterator[ScriptedWorker]:
    w = ScriptedWorker(redis_server.url, Settings(redis_url=redis_server.url)).start()
    yield w
    w.stop()


@pytest.fixture
def client(gateway_url: str, worker: ScriptedWorker) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="sk-test", max_retries=0) as c:
        yield c


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert reply.choices[0].message.content == expected_text(3)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_chat_stream(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"priority": "high", "top_k": 4},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected_text(worker.num_tokens)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == worker.num_tokens


def test_completion(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4)
    assert reply.choices[0].text == expected_text(4)
    streamed = client.completions.create(model=MODEL, prompt="Once", max_tokens=4, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected_text(4)


def test_errors_raise_the_usual_exceptions(client: openai.OpenAI, gateway_url: str) -> None:
    with pytest.raises(openai.NotFoundError, match="not served by any worker"):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="from 1 to 16") as bad:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=17)
    assert bad.value.param == "n"
    web = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="sk-web", max_retries=0)
    with web, pytest.raises(openai.PermissionDeniedError, match="above this API key's maximum"):
        web.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"priority": "critical"}
        )
    bad_key = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="sk-wrong", max_retries=0)
    with bad_key, pytest.raises(openai.AuthenticationError):
        bad_key.models.list()


def test_models_lists_live_workers(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_a_client_that_drops_a_stream_half_way_cancels_the_request(
    client: openai.OpenAI, worker: ScriptedWorker, redis_server: EmbeddedRedis
) -> None:
    worker.num_tokens = 5_000
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5_000, stream=True
    )
    seen = [chunk for _, chunk in zip(range(10), stream, strict=False)]
    stream.close()
    request_id = seen[0].id.removeprefix("chatcmpl-")
    state, reason, generated = _wait_until_ended(redis_server.url, request_id)
    assert (state, reason) == ("cancelled", "cancelled")
    assert 9 <= generated < 5_000


def _wait_until_ended(url: str, request_id: str) -> tuple[str, str, int]:
    r = redis.Redis.from_url(url, decode_responses=True)
    key = Keys().request(request_id)
    for _ in range(500):
        state, reason, generated = r.hmget(key, ["state", "finish_reason", "num_generated"])
        if state not in (None, "queued", "running"):
            r.close()
            return str(state), str(reason), int(generated or 0)
        time.sleep(0.01)
    r.close()
    raise AssertionError(f"request {request_id} still {state!r} after 5s")
