"""Drafts of a guided request, checked by its grammar before the step: each verified
position gets the mask of the tokens the grammar allows after the drafts before it, and
the drafts end before the first token the grammar refuses (or one that completes it: no
position after it is verified). The matcher is rolled back after, so that it follows only
the tokens the step keeps (the engine advances it over them as it reads them)."""

from __future__ import annotations

import logging

import torch

from worker.engine.grammar import GrammarState
from worker.engine.speculative.drafts import Draft, FixedMask

log = logging.getLogger(__name__)


def check_drafts(draft: Draft, grammar: GrammarState, vocab_size: int) -> None:
    """Cut ``draft`` to what the grammar allows and fill its masks; on a matcher's
    failure the draft is emptied (the row is verified without drafts)."""
    tokens = draft.token_ids
    masks = torch.full((len(tokens) + 1, (vocab_size + 31) // 32), -1, dtype=torch.int32)
    followed: list[int] = []  # the drafts the matcher has accepted so far
    try:
        _follow(grammar, tokens, masks, followed)
        num_kept = len(followed)
    except Exception as e:  # the matcher's own failure: this row runs without drafts
        log.warning("grammar check of draft tokens failed: %r", e)
        num_kept = 0
    grammar.rollback(len(followed))
    del tokens[num_kept:]
    draft.masks = [FixedMask(masks[j]) for j in range(len(tokens) + 1)]


def _follow(
    grammar: GrammarState, tokens: list[int], masks: torch.Tensor, followed: list[int]
) -> None:
    """Advance ``grammar`` over the leading tokens it allows (into ``followed``), filling
    each verified position's mask."""
    for j, token_id in enumerate(tokens):
        grammar.fill_next_token_bitmask(masks, j)
        if not grammar.accept(token_id):
            return
        if grammar.terminated:  # completed by this token: keep those before it
            grammar.rollback(1)
            return
        followed.append(token_id)
    grammar.fill_next_token_bitmask(masks, len(tokens))
