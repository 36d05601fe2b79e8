"""The speculative parts that need no model: n-gram proposals, the config's JSON,
verification's count, and drafts' blocks taken and given back."""

from __future__ import annotations

import pytest

from tests.worker.engine.factories import make_request
from worker.engine.kv_cache import KVCacheManager
from worker.engine.outputs import ScheduledSeq
from worker.engine.request import Sequence
from worker.engine.speculative.config import SpeculativeConfig
from worker.engine.speculative.drafts import Draft, attach, max_draft_len, settle
from worker.engine.speculative.ngram import NgramProposer
from worker.engine.speculative.rejection import num_accepted
from worker.engine.speculative.stats import SpecStats


def test_ngram_proposes_what_followed_the_latest_match_of_the_longest_suffix() -> None:
    #         0  1  2  3  4  5  6  7  8  9  10
    tokens = [5, 6, 7, 8, 1, 6, 7, 9, 5, 6, 7]
    assert NgramProposer(2, 3).propose(tokens, 2) == [8, 1]  # "5 6 7" at 0, the longest
    assert NgramProposer(2, 2).propose(tokens, 2) == [9, 5]  # "6 7": its latest, at 5
    assert NgramProposer(2, 3).propose(tokens, 0) == []
    assert NgramProposer(2, 3).propose([1, 2, 3, 4], 3) == []  # no suffix occurs before
    assert NgramProposer(1, 1).propose([4, 4], 3) == [4]  # up to the end, no further


def test_the_config_reads_vllms_json_and_refuses_what_it_does_not_know() -> None:
    config = SpeculativeConfig.from_json(
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5,'
        ' "prompt_lookup_min": 1}'
    )
    assert (config.num_speculative_tokens, config.prompt_lookup_max) == (3, 5)
    with pytest.raises(ValueError, match=r"unknown key.*draft_tensor_parallel_size"):
        SpeculativeConfig.from_json('{"draft_tensor_parallel_size": 1}')
    with pytest.raises(ValueError, match="method 'eagle' is not served"):
        SpeculativeConfig.from_json('{"method": "eagle"}')
    with pytest.raises(ValueError, match="prompt_lookup_min 4 is above prompt_lookup_max 2"):
        SpeculativeConfig(prompt_lookup_min=4, prompt_lookup_max=2)
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer >= 1"):
        SpeculativeConfig(num_speculative_tokens=0)
    with pytest.raises(ValueError, match="not valid JSON"):
        SpeculativeConfig.from_json("{ngram}")


def test_verification_keeps_the_drafts_up_to_the_first_mismatch() -> None:
    assert num_accepted([4, 5, 6, 7], [4, 5, 6]) == 3  # all kept, 7 the bonus token
    assert num_accepted([4, 9, 6, 7], [4, 5, 6]) == 1  # 9 replaces the rejected 5
    assert num_accepted([9, 5, 6, 7], [4, 5, 6]) == 0


def _decoding(kv_cache: KVCacheManager, num_tokens: int) -> ScheduledSeq:
    """A sequence of ``num_tokens`` tokens, all computed but its last (a decode)."""
    seq = Sequence.from_request(make_request(list(range(100, 100 + num_tokens))), 0)
    assert kv_cache.allocate(seq, num_tokens - 1) is not None
    seq.num_computed_tokens = num_tokens - 1
    assert kv_cache.allocate(seq, 1) is not None
    return ScheduledSeq(seq, num_tokens - 1, 1, True)


def test_drafts_take_blocks_and_rejected_ones_give_them_back() -> None:
    kv_cache = KVCacheManager(num_blocks=8, block_size=4)
    item = _decoding(kv_cache, 7)  # 2 blocks
    draft = Draft(item, [1, 2, 3, 4, 5])
    assert attach(kv_cache, draft)
    assert item.num_tokens == 6 and item.seq.token_ids[-5:] == [1, 2, 3, 4, 5]
    assert len(item.seq.block_table) == 3  # 12 tokens
    settle(kv_cache, draft, 1)  # one kept: 8 tokens with their KV computed after the step
    assert item.seq.token_ids[-2:] == [106, 1] and item.num_tokens == 2
    assert len(item.seq.block_table) == 2 and kv_cache.num_free_blocks == 6


def test_drafts_never_take_blocks_the_pool_does_not_have() -> None:
    kv_cache = KVCacheManager(num_blocks=2, block_size=4)
    item = _decoding(kv_cache, 7)
    draft = Draft(item, [1, 2, 3])
    assert not attach(kv_cache, draft)
    assert item.num_tokens == 1 and item.seq.num_tokens == 7


def test_drafts_stay_within_max_tokens_and_the_context() -> None:
    kv_cache = KVCacheManager(num_blocks=8, block_size=4)
    item = _decoding(kv_cache, 7)
    item.seq.num_prompt_tokens = 5  # 2 output tokens so far
    item.seq.request.sampling = item.seq.request.sampling.model_copy(update={"max_tokens": 5})
    assert max_draft_len(item, 4, max_model_len=100) == 2  # 2 kept + the bonus = 5
    assert max_draft_len(item, 4, max_model_len=9) == 1


def test_stats_give_the_acceptance_rate_and_tokens_per_step() -> None:
    stats = SpecStats()
    stats.add(4, 3)
    stats.add(4, 1)
    figures = stats.figures()
    assert figures["spec_decode_acceptance_rate"] == 0.5
    assert figures["spec_decode_tokens_per_step"] == 3.0
