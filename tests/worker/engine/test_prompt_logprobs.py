"""Prompt logprobs from the engine's prefill: equal to transformers' own log-softmax over
the prompt, whole or chunked, after a prefix-cache hit was there to take, on a resumed
request, and bounded."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shared.models import MAX_PROMPT_LOGPROBS_TOKENS, FinishReason, SamplingParams
from tests.prompt_reference import PromptScore, prompt_logprobs_reference
from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from worker.engine import Engine
from worker.engine.outputs import RequestOutput

NUM_TOP = 3
# 44 tokens: more than two KV blocks of 16, so a second run could take cached blocks.
PROMPT = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins "
    "with a single step, and every long road is walked one careful stride at a time."
)


def _ids(engine: Engine, text: str = PROMPT) -> list[int]:
    return list(engine.tokenizer(text)["input_ids"])


def _run(engine: Engine, ids: list[int], **kwargs: Any) -> list[RequestOutput]:
    req = make_request(ids, prompt_logprobs=kwargs.pop("prompt_logprobs", NUM_TOP), **kwargs)
    return engine.generate([req])[req.request_id]


def _assert_matches(got: list[dict[str, Any]] | None, want: list[PromptScore]) -> None:
    assert got is not None and got[0]["logprob"] is None and len(got) == len(want) + 1
    for entry, ref in zip(got[1:], want, strict=True):
        assert entry["logprob"] == pytest.approx(ref.logprob, abs=1e-4)
        assert entry["rank"] == ref.rank
        assert [t["token_id"] for t in entry["top"]] == ref.top_ids
        got_top = [t["logprob"] for t in entry["top"]]
        assert got_top == pytest.approx(ref.top_logprobs, abs=1e-4)
        assert isinstance(entry["token"], str)


def test_scoring_only_gives_the_prompts_logprobs_and_no_token(
    engine: Engine, model_path: str
) -> None:
    ids = _ids(engine)
    outputs = _run(engine, ids, max_tokens=0)
    assert [o.new_token_ids for o in outputs] == [[]]
    last = outputs[-1]
    assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == 0
    _assert_matches(last.prompt_logprobs, prompt_logprobs_reference(model_path, [ids], NUM_TOP)[0])
    assert last.prompt_logprobs is not None and last.prompt_logprobs[1]["token"] == (
        engine.tokenizer.decode([ids[1]])
    )


@pytest.mark.parametrize(
    "config", [{"prefill_chunk_tokens": 5}, {"prefill_chunk_tokens": 7, "async_scheduling": True}]
)
def test_chunked_prefill_scores_every_chunk(
    make_engine: EngineFactory, model_path: str, config: dict[str, Any]
) -> None:
    engine = make_engine(**config)
    ids = _ids(engine)
    plain = make_request(ids, max_tokens=4)
    tokens = engine.generate([plain])[plain.request_id]
    outputs = _run(engine, ids, max_tokens=4)
    # Generation is the same; the scores come with the last output only.
    assert [t for o in outputs for t in o.new_token_ids] == [
        t for o in tokens for t in o.new_token_ids
    ]
    assert all(o.prompt_logprobs is None for o in outputs[:-1])
    _assert_matches(
        outputs[-1].prompt_logprobs, prompt_logprobs_reference(model_path, [ids], NUM_TOP)[0]
    )


def test_cached_prefix_is_computed_again_for_its_scores(engine: Engine, model_path: str) -> None:
    ids = _ids(engine)
    engine.generate([make_request(ids, max_tokens=1)])  # caches the prompt's full blocks
    hits = engine.kv_cache.num_hit_tokens
    first = _run(engine, ids, max_tokens=0)[-1].prompt_logprobs
    second = _run(engine, ids, max_tokens=0)[-1].prompt_logprobs
    assert engine.kv_cache.num_hit_tokens == hits  # neither took the cached blocks
    _assert_matches(first, prompt_logprobs_reference(model_path, [ids], NUM_TOP)[0])
    assert second == first
    engine.generate([make_request(ids, max_tokens=1)])
    assert engine.kv_cache.num_hit_tokens > hits  # the cache still serves the others


def test_resumed_request_scores_its_whole_prompt(engine: Engine, model_path: str) -> None:
    ids = _ids(engine)
    want = prompt_logprobs_reference(model_path, [ids], NUM_TOP)[0]
    whole = _run(engine, ids, max_tokens=6)
    generated = [t for o in whole for t in o.new_token_ids]
    req = make_request(ids, prompt_logprobs=NUM_TOP, max_tokens=6, output_token_ids=generated[:3])
    resumed = engine.generate([req])[req.request_id]
    assert [t for o in resumed for t in o.new_token_ids] == generated[3:]
    _assert_matches(resumed[-1].prompt_logprobs, want)  # its prefill spans other tokens
    # Resumed with every token it may generate: the prompt is still scored.
    done = make_request(ids, prompt_logprobs=NUM_TOP, max_tokens=6, output_token_ids=generated)
    ended = engine.generate([done])[done.request_id]
    assert [o.new_token_ids for o in ended] == [[]]
    _assert_matches(ended[-1].prompt_logprobs, want)


def test_a_one_token_prompt_has_only_its_null(engine: Engine) -> None:
    outputs = _run(engine, _ids(engine, "Hi")[:1], max_tokens=1)
    only: list[dict[str, Any]] = [
        {"token_id": _ids(engine, "Hi")[0], "logprob": None, "top": [], "token": "Hi"}
    ]
    assert outputs[-1].prompt_logprobs == only
    assert len(outputs[-1].new_token_ids) == 1


def test_prompt_past_the_cap_is_refused_by_name(engine: Engine) -> None:
    req = make_request([1] * (MAX_PROMPT_LOGPROBS_TOKENS + 1), prompt_logprobs=0, max_tokens=1)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        engine.add_request(req)
    assert not engine.has_unfinished_requests()


def test_sampling_bounds() -> None:
    with pytest.raises(ValidationError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValidationError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    assert SamplingParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
