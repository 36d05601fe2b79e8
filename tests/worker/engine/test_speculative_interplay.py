"""Speculative decoding with the engine's other features: structured outputs (the
grammar checks every draft), LoRA adapters, prefix caching (only kept tokens are
cached), preemption and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lora_adapters import SPECS, make_adapter
from tests.worker.engine.conftest import EngineFactory, TinyModels
from tests.worker.engine.factories import make_request
from tests.worker.engine.speculative_helpers import (
    REPEATING,
    SPECULATIVE,
    accepted_since,
    chat,
    requests_for,
    speculative_engine,
    tokens_of,
)
from tests.worker.engine.tiny_models import SPECS_BY_NAME, prompts
from worker.engine import Engine, EngineConfig
from worker.engine.request import LoraRef, Sequence

FRUIT = "(apples|bananas|cherries|dates|elderberries|figs)"
FRUITS = rf"{FRUIT}(, {FRUIT}){{5}}\."
LIST_SCHEMA = {
    "type": "object",
    "properties": {"fruits": {"type": "array", "items": {"type": "string"}, "maxItems": 6}},
    "required": ["fruits"],
}


COPY_JSON = 'Print this JSON object exactly: {"fruits":["apples","bananas","cherries","dates"]}'


@pytest.mark.parametrize(
    ("text", "guide"),
    [(REPEATING[0], {"guided_regex": FRUITS}), (COPY_JSON, {"guided_json": LIST_SCHEMA})],
    ids=["regex", "json"],
)
def test_a_guided_request_gives_the_same_output_with_its_drafts_checked(
    make_engine: EngineFactory, text: str, guide: dict[str, object]
) -> None:
    plain, spec = make_engine(), speculative_engine(make_engine)
    prompt = chat(plain, text)
    kwargs = {"max_tokens": 48, "logprobs": 1, **guide}
    expected = plain.generate(requests_for([prompt], **kwargs))["p0"]
    before = spec.stats()
    got = spec.generate(requests_for([prompt], **kwargs))["p0"]
    assert tokens_of(got) == tokens_of(expected)
    assert got[-1].finish_reason == expected[-1].finish_reason
    if "guided_json" in guide:
        json.loads("".join(o.text for o in got))
    assert accepted_since(spec, before)[1] > 0


@pytest.fixture(scope="module")
def poet(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> LoraRef:
    spec = next(s for s in SPECS if s.name == "poet")
    return LoraRef(spec.name, str(make_adapter(model_path, spec, tmp_path_factory.mktemp("lora"))))


def test_a_lora_request_gives_its_adapters_output(
    make_engine: EngineFactory, poet: LoraRef
) -> None:
    plain, spec = make_engine(), speculative_engine(make_engine)
    prompts_ = [chat(plain, text) for text in REPEATING[:2]]
    kwargs = {"max_tokens": 24, "ignore_eos": True, "lora": poet}
    expected = plain.generate(requests_for(prompts_, **kwargs))
    before = spec.stats()
    got = spec.generate(requests_for(prompts_, **kwargs))
    for request_id, outputs in expected.items():
        assert tokens_of(got[request_id]) == tokens_of(outputs)
    assert accepted_since(spec, before)[0] > 0


def test_only_kept_tokens_are_cached(make_engine: EngineFactory) -> None:
    spec = speculative_engine(make_engine)
    prompt = chat(spec, REPEATING[2])
    cached_before = set(spec.kv_cache._cached)
    before = spec.stats()
    request = make_request(prompt, max_tokens=48, ignore_eos=True)
    outputs = spec.generate([request])[request.request_id]
    proposed, kept = accepted_since(spec, before)
    assert kept < proposed  # some drafts were rejected ...
    # ... and every block cached since holds the request's own tokens.
    whole = Sequence.from_request(make_request([*prompt, *tokens_of(outputs)]), 0)
    size = spec.kv_cache.block_size
    real = set(spec.kv_cache._digests(whole, whole.num_tokens // size))
    published = set(spec.kv_cache._cached) - cached_before
    assert published and published <= real
    # A request continuing from that answer reads those blocks and is unchanged.
    follow = make_request([*prompt, *tokens_of(outputs)[:40]], max_tokens=8)
    hits_before = spec.kv_cache.num_hit_tokens
    got = tokens_of(spec.generate([follow])[follow.request_id])
    assert spec.kv_cache.num_hit_tokens > hits_before
    assert got == tokens_of(outputs)[40:48]


def test_preempted_and_resumed_requests_keep_their_output(make_engine: EngineFactory) -> None:
    spec = make_engine(max_num_seqs=2, speculative_config=SPECULATIVE)
    prompts_ = [chat(spec, text) for text in REPEATING]
    alone = [
        tokens_of(spec.generate(requests_for([p], max_tokens=24, ignore_eos=True))["p0"])
        for p in prompts_
    ]
    low = [
        make_request(p, request_id=f"low{i}", max_tokens=24, ignore_eos=True, priority=25)
        for i, p in enumerate(prompts_[:2])
    ]
    for request in low:
        spec.add_request(request)
    outputs = spec.step() + spec.step()
    preemptions = spec.scheduler.num_preemptions
    critical = make_request(prompts_[2], request_id="critical", max_tokens=24, ignore_eos=True)
    critical.priority = 100
    spec.add_request(critical)
    while spec.has_unfinished_requests():
        outputs += spec.step()
    assert spec.scheduler.num_preemptions > preemptions
    for request, expected in zip([*low, critical], alone, strict=True):
        assert tokens_of([o for o in outputs if o.request_id == request.request_id]) == expected
    head = alone[0][:5]
    resumed = make_request(prompts_[0], max_tokens=24, ignore_eos=True, output_token_ids=head)
    assert head + tokens_of(spec.generate([resumed])[resumed.request_id]) == alone[0]


def test_a_full_kv_cache_preempts_and_drafts_only_where_blocks_are_free(
    tiny_models: TinyModels, one_thread: None
) -> None:
    path: Path = tiny_models(SPECS_BY_NAME["llama"])
    roomy = Engine(EngineConfig(model=str(path), kv_cache_mib=8, max_num_seqs=8))
    tight = Engine(
        EngineConfig(
            model=str(path), kv_cache_mib=1, max_num_seqs=8, speculative_config=SPECULATIVE
        )
    )
    base = prompts()
    long_prompts = [p[:20] * 3 for p in base] + [p[20:35] * 4 for p in base]
    kwargs = {"max_tokens": 80, "ignore_eos": True}
    expected = roomy.generate(requests_for(long_prompts, **kwargs))
    got = tight.generate(requests_for(long_prompts, **kwargs))
    assert tight.scheduler.num_preemptions > 0
    assert tight.stats()["spec_decode_num_draft_tokens"] > 0
    for request_id, outputs in expected.items():
        assert tokens_of(got[request_id]) == tokens_of(outputs)
    assert tight.kv_cache.usage == 0.0
