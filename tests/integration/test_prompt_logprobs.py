"""Scoring a prompt with the unmodified ``openai`` package against a gateway process and a
worker on the default model: completions' echo with logprobs and max_tokens 0, vLLM's
prompt_logprobs on completions and chat, equal to transformers' own log-softmax over the
prompt (fp32, within 1e-4), after a prefix-cache hit was there to take, and bounded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from shared.models import MAX_PROMPT_LOGPROBS_TOKENS
from shared.settings import DEFAULT_MODEL
from tests.prompt_reference import PromptScore, prompt_logprobs_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROMPT = "The capital of France is Paris. The capital of Italy is Rome, and of Spain, Madrid."
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def client(openai_client: openai.OpenAI) -> openai.OpenAI:
    return openai_client


@pytest.fixture(scope="module")
def prompt_ids(default_model_dir: Path) -> list[int]:
    tokenizer: Any = AutoTokenizer.from_pretrained(default_model_dir)
    return list(tokenizer(PROMPT)["input_ids"])


@pytest.fixture(scope="module")
def want(default_model_dir: Path, prompt_ids: list[int]) -> list[PromptScore]:
    return prompt_logprobs_reference(default_model_dir, [prompt_ids], 2)[0]


def test_echo_with_logprobs_and_no_tokens_scores_the_prompt(
    client: openai.OpenAI, prompt_ids: list[int], want: list[PromptScore]
) -> None:
    reply = client.completions.create(
        model=DEFAULT_MODEL, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0
    )
    choice = reply.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 0
    assert reply.usage.prompt_tokens == len(prompt_ids)
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == PROMPT and len(logprobs.tokens) == len(prompt_ids)
    assert logprobs.token_logprobs is not None and logprobs.token_logprobs[0] is None
    assert logprobs.token_logprobs[1:] == pytest.approx([s.logprob for s in want], abs=TOLERANCE)
    assert logprobs.top_logprobs is not None and logprobs.top_logprobs[0] is None
    for top, score in zip(logprobs.top_logprobs[1:], want, strict=True):
        assert top is not None and list(top.values()) == pytest.approx(
            score.top_logprobs[:1], abs=TOLERANCE
        )
    assert logprobs.text_offset is not None
    offsets = zip(logprobs.text_offset, logprobs.tokens, strict=True)
    assert all(PROMPT.startswith(token, at) for at, token in offsets)


def test_echo_of_token_ids_spells_them_before_the_completion(
    client: openai.OpenAI, prompt_ids: list[int]
) -> None:
    plain = client.completions.create(
        model=DEFAULT_MODEL, prompt=prompt_ids, max_tokens=5, temperature=0
    )
    echoed = client.completions.create(
        model=DEFAULT_MODEL, prompt=prompt_ids, max_tokens=5, temperature=0, echo=True
    )
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    assert echoed.choices[0].logprobs is None


def test_echo_with_logprobs_puts_the_prompts_before_the_completions(
    client: openai.OpenAI, prompt_ids: list[int], want: list[PromptScore]
) -> None:
    reply = client.completions.create(
        model=DEFAULT_MODEL, prompt=PROMPT, echo=True, logprobs=2, max_tokens=3, temperature=0
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert len(logprobs.token_logprobs) == len(prompt_ids) + 3
    prompt_part = logprobs.token_logprobs[1 : len(prompt_ids)]
    assert prompt_part == pytest.approx([s.logprob for s in want], abs=TOLERANCE)
    assert reply.choices[0].text.startswith(PROMPT)
    assert logprobs.text_offset is not None and logprobs.text_offset[len(prompt_ids)] == len(PROMPT)


def _vllm_scores(raw: Any, prompt_ids: list[int], want: list[PromptScore], num_top: int) -> None:
    """vLLM's shape: [null, {token_id: {logprob, rank, decoded_token}}, ...]."""
    assert raw[0] is None and len(raw) == len(prompt_ids)
    for position, (entry, score) in enumerate(zip(raw[1:], want, strict=True), start=1):
        token = entry[str(prompt_ids[position])]
        assert token["logprob"] == pytest.approx(score.logprob, abs=TOLERANCE)
        assert token["rank"] == score.rank and isinstance(token["decoded_token"], str)
        for rank, (top_id, top_logprob) in enumerate(
            zip(score.top_ids[:num_top], score.top_logprobs, strict=False), start=1
        ):
            assert entry[str(top_id)]["rank"] == rank
            assert entry[str(top_id)]["logprob"] == pytest.approx(top_logprob, abs=TOLERANCE)
        assert set(entry) <= {str(prompt_ids[position]), *map(str, score.top_ids[:num_top])}


def test_prompt_logprobs_on_completions_and_chat(
    client: openai.OpenAI, prompt_ids: list[int], want: list[PromptScore], default_model_dir: Path
) -> None:
    reply = client.completions.create(
        model=DEFAULT_MODEL,
        prompt=PROMPT,
        max_tokens=2,
        temperature=0,
        extra_body={"prompt_logprobs": 2},
    )
    _vllm_scores(reply.choices[0].model_extra["prompt_logprobs"], prompt_ids, want, 2)  # type: ignore[index]
    assert reply.choices[0].logprobs is None and reply.choices[0].text
    messages: Any = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=messages,
        max_tokens=2,
        temperature=0,
        extra_body={"prompt_logprobs": 1},
    )
    tokenizer: Any = AutoTokenizer.from_pretrained(default_model_dir)
    chat_ids = list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == len(chat_ids)
    chat_want = prompt_logprobs_reference(default_model_dir, [chat_ids], 2)[0]
    _vllm_scores(chat.model_extra["prompt_logprobs"], chat_ids, chat_want, 1)  # type: ignore[index]


def test_a_prefix_cache_hit_still_gives_every_prompt_logprob(
    client: openai.OpenAI, prompt_ids: list[int], want: list[PromptScore]
) -> None:
    long_prompt = PROMPT * 3  # several KV blocks: a plain request caches them
    client.completions.create(model=DEFAULT_MODEL, prompt=long_prompt, max_tokens=1)
    replies = [
        client.completions.create(
            model=DEFAULT_MODEL, prompt=long_prompt, max_tokens=0, echo=True, logprobs=0
        )
        for _ in range(2)
    ]
    first, second = (r.choices[0].logprobs for r in replies)
    assert first is not None and second is not None and first.token_logprobs is not None
    assert second.tokens == first.tokens and "".join(first.tokens or []) == long_prompt
    assert None not in first.token_logprobs[1:]
    assert second.token_logprobs == pytest.approx(first.token_logprobs, abs=TOLERANCE)
    # The first prompt's scores are those of the same tokens at the start of the long one.
    assert first.token_logprobs[1 : len(prompt_ids)] == pytest.approx(
        [s.logprob for s in want], abs=TOLERANCE
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"prompt": PROMPT, "extra_body": {"prompt_logprobs": 21}}, "prompt_logprobs"),
        ({"prompt": PROMPT, "echo": True, "logprobs": 1, "stream": True}, "stream"),
        (
            {
                "prompt": [1] * (MAX_PROMPT_LOGPROBS_TOKENS + 1),
                "extra_body": {"prompt_logprobs": 0},
            },
            "prompt_logprobs",
        ),
    ],
)
def test_what_cannot_be_scored_is_a_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=DEFAULT_MODEL, **fields)
    assert raised.value.body["param"] == param  # type: ignore[index]
    assert param in raised.value.body["message"]  # type: ignore[index]


def test_chat_max_tokens_zero_without_scoring_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=0
        )
    assert raised.value.body["param"] == "max_tokens"  # type: ignore[index]


def test_the_python_clients_result_carries_them(
    client: openai.OpenAI, redis_server: Any, prompt_ids: list[int], want: list[PromptScore]
) -> None:
    from producer import Client

    with Client(redis_server.url) as tokenq:
        result = tokenq.submit(PROMPT, prompt_logprobs=2, max_tokens=0).result(timeout=120)
    scores = result.prompt_logprobs
    assert scores is not None and result.token_ids == () and result.finish_reason == "length"
    assert [s["token_id"] for s in scores] == prompt_ids
    assert scores[0]["logprob"] is None
    assert [s["logprob"] for s in scores[1:]] == pytest.approx(
        [s.logprob for s in want], abs=TOLERANCE
    )
    assert [[t["token_id"] for t in s["top"]] for s in scores[1:]] == [s.top_ids for s in want]
    assert "".join(s["token"] for s in scores) == PROMPT
