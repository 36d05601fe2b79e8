"""What a worker on the default model refuses for one request answers 400 naming the
field on every API, streamed or not, and is never retried; the worker serves on.

A real gateway process and a real worker process (``openai_stack``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from producer.embedded import EmbeddedRedis
from shared.settings import DEFAULT_MODEL
from tests.integration.openai_stack import openai_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LONG = "hello " * 9000  # past the default model's 8192-token context
LONG_CHAT: list[Any] = [{"role": "user", "content": LONG}]
HI: list[Any] = [{"role": "user", "content": "hi"}]
LOOKBEHIND = {"guided_regex": "(?<=a)b"}  # xgrammar cannot compile a lookbehind
SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}


@pytest.fixture(scope="module")
def stack(
    redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[openai.OpenAI, str]]:
    with openai_stack(redis_server.url, tmp_path_factory.mktemp("mistakes")) as c:
        yield c, str(c.base_url).removesuffix("/").removesuffix("/v1")


@pytest.fixture
def retrying(stack: tuple[openai.OpenAI, str]) -> Iterator[openai.OpenAI]:
    """A client that retries what it may (500s, 429s...), as the openai package does."""
    with openai.OpenAI(base_url=f"{stack[1]}/v1", api_key="none", max_retries=2) as c:
        yield c


@pytest.fixture
def requests_made(redis_server: EmbeddedRedis) -> Iterator[Any]:
    connection = redis.Redis.from_url(redis_server.url)
    before = set(connection.scan_iter(match="*req:*"))
    yield lambda: len(set(connection.scan_iter(match="*req:*")) - before)
    connection.close()


def test_an_over_long_prompt_is_a_400_naming_messages_and_is_not_retried(
    retrying: openai.OpenAI, requests_made: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        retrying.chat.completions.create(model=DEFAULT_MODEL, messages=LONG_CHAT, max_tokens=4)
    error = caught.value
    assert (error.param, error.code) == ("messages", "context_length_exceeded")
    assert "prompt tokens" in error.message
    assert requests_made() == 1


def test_max_tokens_past_the_context_names_max_tokens(retrying: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        retrying.completions.create(model=DEFAULT_MODEL, prompt="hi", max_tokens=100_000)
    assert (caught.value.param, caught.value.code) == ("max_tokens", "context_length_exceeded")


def test_a_regex_that_does_not_compile_is_a_400_naming_it(
    retrying: openai.OpenAI, requests_made: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        retrying.chat.completions.create(
            model=DEFAULT_MODEL, messages=HI, max_tokens=4, extra_body=LOOKBEHIND
        )
    assert caught.value.param == "guided_regex"
    assert "constrained decoding" in caught.value.message
    assert requests_made() == 1


def test_a_schema_that_does_not_compile_is_a_400_naming_response_format(
    retrying: openai.OpenAI,
) -> None:
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    with pytest.raises(openai.BadRequestError) as caught:
        retrying.chat.completions.create(
            model=DEFAULT_MODEL, messages=HI, max_tokens=4, response_format=response_format
        )
    assert caught.value.param == "response_format"


def test_a_streamed_refusal_is_a_400_before_the_stream_starts(
    retrying: openai.OpenAI, requests_made: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        retrying.chat.completions.create(
            model=DEFAULT_MODEL, messages=LONG_CHAT, max_tokens=4, stream=True
        )
    assert (caught.value.param, caught.value.code) == ("messages", "context_length_exceeded")
    assert requests_made() == 1


def test_the_responses_api_answers_400_naming_input(retrying: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        retrying.responses.create(model=DEFAULT_MODEL, input=LONG, max_output_tokens=16)
    assert (caught.value.param, caught.value.code) == ("input", "context_length_exceeded")


def test_a_streamed_or_background_response_fails_with_invalid_prompt(
    stack: tuple[openai.OpenAI, str],
) -> None:
    client, _ = stack
    events = list(client.responses.create(model=DEFAULT_MODEL, input=LONG, stream=True))
    failed = events[-1]
    assert failed.type == "response.failed"
    error = failed.response.error
    assert error is not None and error.code == "invalid_prompt"
    assert error.message.startswith("input: ")
    queued = client.responses.create(model=DEFAULT_MODEL, input=LONG, background=True)
    deadline = time.monotonic() + 60
    while (found := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert found.status == "failed"
    assert found.error is not None and found.error.code == "invalid_prompt"


def test_the_native_view_names_the_sampling_field(stack: tuple[openai.OpenAI, str]) -> None:
    """A token id outside the vocabulary is refused at submit (the worker registered its
    vocabulary); a regex only the worker's grammar can judge fails the request, and its
    view names the field the same way."""
    _, url = stack
    body = {"prompt": "hi", "sampling": {"max_tokens": 4, "logit_bias": {"999999": 5}}}
    lookbehind = {"prompt": "hi", "sampling": {"max_tokens": 4, **LOOKBEHIND}}
    with httpx.Client(base_url=url, timeout=30) as http:
        refused = http.post("/v1/requests", json=body)
        request_id = http.post("/v1/requests", json=lookbehind).json()["id"]
        deadline = time.monotonic() + 60
        while (view := http.get(f"/v1/requests/{request_id}").json())["result"] is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert refused.json()["error"]["param"] == "sampling.logit_bias"
    assert "vocabulary" in refused.json()["error"]["message"]
    assert view["state"] == "failed"  # its own end: not dead-lettered, not retried
    assert view["error"]["type"] == "invalid_request_error"
    assert view["error"]["param"] == "sampling.guided_regex"
    assert "constrained decoding" in view["error"]["message"]


def test_the_worker_serves_on(stack: tuple[openai.OpenAI, str]) -> None:
    client, _ = stack
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, max_tokens=4)
    assert reply.choices[0].finish_reason in ("length", "stop")
