"""The registered limits refuse with a typed refusal (the code, the native field, a
message), the same on every submit path; a text prompt is bounded by its bytes."""

from __future__ import annotations

from typing import Any

import pytest

from producer.client import Client
from shared.keys import Keys, model_tag
from shared.limits import ModelLimits, check_limits, merged
from shared.models import GenerationRequest, SamplingParams
from shared.refusal import RefusalCode, RequestRefused
from shared.settings import DEFAULT_MODEL
from tests.shared.test_limits import LIMITS, register

KEYS = Keys()
SPELLED = LIMITS.model_copy(update={"max_bytes_per_token": 4})  # context 512


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        (
            {"prompt_token_ids": [1] * 500, "max_tokens": 20},
            "context_length_exceeded",
            "prompt_token_ids",
        ),
        ({"max_tokens": 512}, "context_length_exceeded", "max_tokens"),
        ({"logit_bias": {"1000": 5}}, "invalid_value", "logit_bias"),
        ({"stop_token_ids": [5000], "min_tokens": 1}, "invalid_value", "stop_token_ids"),
        ({"prompt": "word " * 600, "max_tokens": 4}, "context_length_exceeded", "prompt"),
        (
            {"messages": [{"role": "user", "content": "word " * 600}], "max_tokens": 4},
            "context_length_exceeded",
            "messages",
        ),
    ],
)
def test_a_refusal_at_submit_is_typed(
    client: Client, fields: dict[str, Any], code: str, param: str
) -> None:
    register(client, "w1", SPELLED)
    if not {"prompt_token_ids", "messages", "prompt"} & set(fields):
        fields = {"prompt": "hi", **fields}
    with pytest.raises(RequestRefused) as raised:
        client.submit(**fields)
    refusal = raised.value.refusal
    assert (refusal.code.value, refusal.param) == (code, param)
    assert refusal.message == str(raised.value)
    assert client.redis.zcard(KEYS.queue(model_tag(DEFAULT_MODEL))) == 0


@pytest.mark.parametrize(
    ("texts", "fields", "code", "param"),
    [
        ("word " * 600, {}, "context_length_exceeded", "prompt"),
        ("hi", {"dimensions": 65}, "invalid_value", "dimensions"),
    ],
)
def test_an_embed_refused_at_submit_is_typed(
    client: Client, texts: str, fields: dict[str, Any], code: str, param: str
) -> None:
    register(client, "w1", SPELLED)
    with pytest.raises(RequestRefused) as raised:
        client.embed(texts, timeout=1, **fields)
    assert (raised.value.refusal.code.value, raised.value.refusal.param) == (code, param)


def test_a_text_that_might_fit_is_left_to_the_worker() -> None:
    """Whitespace is not counted: a tokenizer may strip it or fold it into a word."""
    few = SamplingParams(max_tokens=4)
    fits = GenerationRequest(model="m", prompt="word " * 120 + " " * 10_000, sampling=few)
    check_limits(SPELLED, [fits])  # 480 bytes: at least 120 tokens, within 512
    check_limits(LIMITS, [GenerationRequest(model="m", prompt="word " * 10_000)])  # no bound
    with pytest.raises(RequestRefused) as raised:
        check_limits(SPELLED, [GenerationRequest(model="m", prompt="word " * 600, sampling=few)])
    assert raised.value.refusal.code is RefusalCode.CONTEXT_LENGTH_EXCEEDED
    assert "at least 600 prompt tokens" in raised.value.refusal.message


def test_a_chat_templates_dropped_turns_do_not_count() -> None:
    """An assistant turn's text may be left out of the prompt (earlier reasoning)."""
    messages = [
        {"role": "assistant", "content": "x" * 10_000},
        {"role": "user", "content": "hi"},
    ]
    check_limits(SPELLED, [GenerationRequest(model="m", messages=messages)])


def test_no_text_is_bounded_while_one_worker_has_not_said() -> None:
    older = ModelLimits(vocab_size=1000, max_model_len=512)
    assert merged([SPELLED, older]).max_bytes_per_token is None  # type: ignore[union-attr]
    wider = SPELLED.model_copy(update={"max_bytes_per_token": 9})
    assert merged([SPELLED, wider]).max_bytes_per_token == 9  # type: ignore[union-attr]


def test_prompt_scoring_is_refused_at_submit_while_no_worker_scores_prompts() -> None:
    unscoring = LIMITS.model_copy(update={"prompt_scores": False})  # vLLM's engine
    scoring = GenerationRequest(
        model=DEFAULT_MODEL, prompt="hi", sampling=SamplingParams(prompt_logprobs=1)
    )
    with pytest.raises(RequestRefused) as refused:
        check_limits(unscoring, [scoring])
    assert refused.value.refusal.param == "prompt_logprobs"
    check_limits(merged([unscoring, LIMITS]), [scoring])  # a built-in worker scores it
    check_limits(unscoring, [GenerationRequest(model=DEFAULT_MODEL, prompt="hi")])


GENERATING = LIMITS.model_copy(update={"embedding_size": None})  # vLLM's generating engine
POOLING = LIMITS.model_copy(update={"generates": False})  # vLLM's pooling runner
EMBED = GenerationRequest(model=DEFAULT_MODEL, prompt="hi", task="embed")
GENERATE = GenerationRequest(model=DEFAULT_MODEL, prompt="hi")


def test_an_embed_is_refused_at_submit_while_no_worker_computes_embeddings(
    client: Client,
) -> None:
    register(client, "w1", GENERATING)
    with pytest.raises(RequestRefused, match="computes embeddings") as refused:
        client.embed("hi", timeout=1)
    assert refused.value.refusal.param == "task"
    assert client.redis.zcard(KEYS.queue(model_tag(DEFAULT_MODEL))) == 0
    check_limits(GENERATING, [GENERATE])


def test_generation_is_refused_at_submit_while_every_worker_pools(client: Client) -> None:
    register(client, "w1", POOLING)
    with pytest.raises(RequestRefused, match="compute embeddings only") as refused:
        client.submit("hi")
    assert refused.value.refusal.param == "task"
    assert client.redis.zcard(KEYS.queue(model_tag(DEFAULT_MODEL))) == 0
    check_limits(POOLING, [EMBED])


def test_a_worker_of_each_kind_takes_both_tasks() -> None:
    both = merged([GENERATING, POOLING])
    assert both is not None and both.generates and both.embedding_size == 64
    check_limits(both, [EMBED, GENERATE])
    tokenize = GenerationRequest(model=DEFAULT_MODEL, prompt="hi", task="tokenize")
    check_limits(POOLING, [tokenize])  # answered by the tokenizer, not the model
    check_limits(GENERATING, [tokenize])
