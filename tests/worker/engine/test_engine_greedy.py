"""Greedy output through the engine equals transformers' ``generate`` on each
request alone, with all of mixed32 in flight together (fp32, CPU)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from tests.worker.engine.reference import Reference

NEAR_TIE = 1e-3

# The session's reference runs (transformers, one request at a time) take a few
# minutes on 2 cores and count against the first test that needs them.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def run_all(engine_factory: EngineFactory, refs: list[Reference], **config: Any) -> list[list[int]]:
    engine = engine_factory(**config)
    requests = [
        make_request(ref.prompt_token_ids, max_tokens=len(ref.token_ids), ignore_eos=True)
        for ref in refs
    ]
    results = engine.generate(requests)
    return [[t for out in results[r.request_id] for t in out.new_token_ids] for r in requests]


def assert_same_as_reference(tokens: list[int], ref: Reference) -> None:
    """Token-identical, except that at a near tie (top two logits within 1e-3) the
    engine may take the runner-up, after which the continuations differ."""
    assert len(tokens) == len(ref.token_ids)
    for step, (got, expected) in enumerate(zip(tokens, ref.token_ids, strict=True)):
        if got == expected:
            continue
        best, best_logit, second, second_logit = ref.top2[step]
        assert {got, expected} == {best, second}, f"step {step}: {got} is not a top-2 token"
        assert best_logit - second_logit < NEAR_TIE, (
            f"step {step}: took {got} over {expected}, but their logits differ by "
            f"{best_logit - second_logit:.2e}"
        )
        return


def test_mixed32_in_flight_together_matches_generate(
    make_engine: EngineFactory, mixed32_references: list[Reference]
) -> None:
    outputs = run_all(make_engine, mixed32_references)
    for tokens, ref in zip(outputs, mixed32_references, strict=True):
        assert_same_as_reference(tokens, ref)


def test_mixed32_with_preemption_matches_generate(
    make_engine: EngineFactory, mixed32_references: list[Reference]
) -> None:
    engine = make_engine(kv_cache_mib=40)
    before = engine.scheduler.num_preemptions
    outputs = run_all(make_engine, mixed32_references, kv_cache_mib=40)
    assert engine.scheduler.num_preemptions > before
    for tokens, ref in zip(outputs, mixed32_references, strict=True):
        assert_same_as_reference(tokens, ref)


def test_mixed32_with_prefill_chunked_at_16_matches_generate(
    make_engine: EngineFactory, mixed32_references: list[Reference]
) -> None:
    # Also the path through transformers' own forward (attention interface), unfused.
    outputs = run_all(make_engine, mixed32_references, prefill_chunk_tokens=16, fuse_layers=False)
    for tokens, ref in zip(outputs, mixed32_references, strict=True):
        assert_same_as_reference(tokens, ref)


def test_mixed32_twice_through_one_engine_hits_the_prefix_cache_and_matches_generate(
    make_engine: EngineFactory, mixed32_references: list[Reference]
) -> None:
    # An engine of its own, with room for every block of the first pass, so that
    # the second finds each prompt's full blocks still cached.
    engine = make_engine(kv_cache_mib=512)
    first = run_all(make_engine, mixed32_references, kv_cache_mib=512)
    hits_before = engine.kv_cache.num_hit_tokens
    second = run_all(make_engine, mixed32_references, kv_cache_mib=512)
    block_size = engine.kv_cache.block_size
    expected_hits = sum(
        (len(ref.prompt_token_ids) - 1) // block_size * block_size for ref in mixed32_references
    )
    assert engine.kv_cache.num_hit_tokens - hits_before == expected_hits
    assert second == first
    for tokens, ref in zip(second, mixed32_references, strict=True):
        assert_same_as_reference(tokens, ref)
