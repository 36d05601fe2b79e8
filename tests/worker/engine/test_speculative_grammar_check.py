"""The grammar check of a guided request's drafts: they end before the first token
the grammar refuses, each verified position has the grammar's mask after the drafts
before it, and the matcher is left where it was."""

from __future__ import annotations

import torch

from shared.models import SamplingParams
from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from tests.worker.engine.speculative_helpers import speculative_engine
from worker.engine.outputs import ScheduledSeq
from worker.engine.request import Sequence
from worker.engine.speculative.drafts import Draft
from worker.engine.speculative.grammar_check import check_drafts


def _mask(state: object, vocab_size: int) -> torch.Tensor:
    bitmask = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)
    state.fill_next_token_bitmask(bitmask, 0)  # type: ignore[attr-defined]
    return bitmask[0]


def _allows(mask: torch.Tensor, token_id: int) -> bool:
    return bool((int(mask[token_id // 32]) >> (token_id % 32)) & 1)


def test_drafts_end_at_the_first_refused_token_and_the_matcher_is_unchanged(
    make_engine: EngineFactory,
) -> None:
    engine = speculative_engine(make_engine)
    tokenizer, vocab_size = engine.tokenizer, engine.runner.vocab_size
    params = SamplingParams(guided_regex=r"[0-9]{2}-[a-z]{2}")
    grammar = engine.grammars.follow(engine.grammars.compile(params).result(timeout=60))
    digits = tokenizer.convert_tokens_to_ids(list("12"))
    letter = tokenizer.convert_tokens_to_ids("x")
    seq = Sequence.from_request(make_request([1, 2, 3]), 0)
    draft = Draft(ScheduledSeq(seq, 2, 1, True), [*digits, letter, *digits])
    start_mask = _mask(grammar, vocab_size)
    check_drafts(draft, grammar, vocab_size)
    assert draft.token_ids == digits  # "x" cannot come third: "-" must
    assert len(draft.masks) == 3
    assert torch.equal(draft.masks[0].mask, start_mask)
    dash = tokenizer.convert_tokens_to_ids("-")
    assert _allows(draft.masks[2].mask, dash) and not _allows(draft.masks[2].mask, digits[0])
    assert _allows(start_mask, digits[0]) and not _allows(start_mask, dash)
    assert torch.equal(_mask(grammar, vocab_size), start_mask)  # rolled back
    assert grammar.accept(digits[0])
