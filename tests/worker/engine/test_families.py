"""Every described family through the engine's fused forward on tiny random-weight
models: greedy tokens equal transformers' ``generate`` on each prompt alone, with the
chosen tokens' logprobs within 1e-4 (fp32), whether the prompts run batched together,
prefilled in chunks beside decodes, or from the prefix cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.models import SamplingParams
from tests.worker.engine.conftest import TinyModels
from tests.worker.engine.tiny_models import (
    SPECS,
    Greedy,
    TinySpec,
    feature_off,
    greedy,
    greedy_dropping_state,
    load_reference_model,
    prompts,
    without_sinks,
)
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.engine.models.decoder import DecoderModel

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

MAX_TOKENS = 10
LOGPROB_TOLERANCE = 1e-4


def references(path: Path, **config_changes: Any) -> list[Greedy]:
    model = load_reference_model(path, **config_changes)
    return [greedy(model, prompt, MAX_TOKENS) for prompt in prompts()]


def run(engine: Engine, num_prompts: int = 4) -> list[Greedy]:
    """Greedy tokens and their logprobs of the first ``num_prompts`` prompts, batched."""
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=0)
    requests = [EngineRequest(f"p{i}", p, sampling) for i, p in enumerate(prompts(num_prompts))]
    results = engine.generate(requests)
    runs = []
    for request in requests:
        outputs = results[request.request_id]
        tokens = [t for out in outputs for t in out.new_token_ids]
        logprobs = [entry["logprob"] for out in outputs for entry in out.logprobs or ()]
        runs.append(Greedy(tokens, logprobs))
    return runs


def assert_matches(
    got: list[Greedy], expected: list[Greedy], tolerance: float = LOGPROB_TOLERANCE
) -> None:
    for i, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine.token_ids == theirs.token_ids, f"prompt {i}"
        worst = max(abs(a - b) for a, b in zip(mine.logprobs, theirs.logprobs, strict=True))
        assert worst <= tolerance, f"prompt {i}: logprobs differ by {worst:.2e}"


def assert_features_matter(spec: TinySpec, path: Path, expected: list[Greedy]) -> None:
    """Each feature the spec names changes the reference's tokens (or, for the final
    soft-cap, which keeps the greedy order, their logprobs far beyond the tolerance):
    the comparison cannot pass with the engine ignoring it. A hybrid's "state": its
    state layers' state dropped before each decode step."""
    for feature in spec.features:
        if feature == "sinks":
            model = without_sinks(load_reference_model(path))
            off = [greedy(model, prompt, MAX_TOKENS) for prompt in prompts()]
        elif feature == "state":
            model = load_reference_model(path)
            off = [Greedy(greedy_dropping_state(model, p, MAX_TOKENS), []) for p in prompts()]
        else:
            off = references(path, **feature_off(spec, feature))
        changed = [_differ(a, b, feature) for a, b in zip(off, expected, strict=True)]
        assert any(changed), f"{spec.name}: switching {feature} off changes nothing"


def _differ(a: Greedy, b: Greedy, feature: str) -> bool:
    if feature != "final_softcap":
        return a.token_ids != b.token_ids
    return max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) > 1e-2


@pytest.mark.parametrize("spec", SPECS, ids=[spec.name for spec in SPECS])
def test_every_family_gives_generates_tokens_batched_chunked_and_cached(
    spec: TinySpec, tiny_models: TinyModels
) -> None:
    path = tiny_models(spec)
    expected = references(path)
    assert_features_matter(spec, path, expected)
    config = EngineConfig(
        model=str(path), device="cpu", kv_cache_mib=2, max_model_len=spec.max_model_len
    )
    engine = Engine(config)
    assert isinstance(engine.runner.forward_fn, DecoderModel)  # the fused forward, not a fallback
    assert_matches(run(engine), expected)  # every prompt in one batch
    hits = engine.kv_cache.num_hit_tokens
    assert_matches(run(engine), expected)  # again, from the prefix cache
    block = engine.kv_cache.block_size
    cached = sum((len(p) - 1) // block * block for p in prompts())
    if "rope" in spec.features:  # a length-dependent rotary serves without the prefix cache
        cached = 0
    assert engine.kv_cache.num_hit_tokens - hits == cached
    chunked = Engine(
        EngineConfig(
            model=str(path),
            device="cpu",
            kv_cache_mib=2,
            max_model_len=spec.max_model_len,
            prefill_chunk_tokens=16,
            max_num_batched_tokens=40,
            enable_prefix_caching=False,
        )
    )
    assert_matches(run(chunked), expected)
