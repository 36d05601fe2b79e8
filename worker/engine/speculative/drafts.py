"""Draft tokens attached to a scheduled step, and taken off again once verified.

A sampled row of a step (a decode, or the last chunk of a prompt) may carry draft tokens
after its own: they join the sequence's tokens and the row's chunk for that step only, in
KV blocks allocated for them (never by preempting anyone), and the row samples at each of
its last ``k + 1`` positions. After verification the sequence keeps the accepted drafts,
its computed count ends after them, and the blocks held only for rejected drafts go back
to the pool; the scheduler's own update then caches full blocks (accepted tokens only) and
appends the step's token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from worker.engine.kv_cache import KVCacheManager
from worker.engine.outputs import ScheduledSeq
from worker.engine.request import Sequence


@dataclass(slots=True)
class FixedMask:
    """A grammar's mask for one verified position, filled before the step (the matcher
    advanced over the drafts before it, then rolled back): the sampler's ``TokenMask``."""

    mask: torch.Tensor

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        bitmask[index] = self.mask


@dataclass(slots=True)
class Draft:
    """The drafts of one sampled row: its item, the tokens, and per verified position
    the grammar's mask (guided requests only)."""

    item: ScheduledSeq
    token_ids: list[int]
    masks: list[FixedMask] = field(default_factory=list)

    @property
    def num_positions(self) -> int:
        return len(self.token_ids) + 1


def max_draft_len(item: ScheduledSeq, num_speculative: int, max_model_len: int) -> int:
    """The drafts ``item`` may carry: within its max_tokens (every kept draft is an
    output token, and the bonus one more) and the context."""
    seq = item.seq
    params = seq.request.sampling
    left_in_budget = params.max_tokens - seq.num_output_tokens - 1
    left_in_context = max_model_len - seq.num_tokens - 1
    return max(0, min(num_speculative, left_in_budget, left_in_context))


def attach(kv_cache: KVCacheManager, draft: Draft) -> bool:
    """Give ``draft``'s row room for its tokens and make them part of its chunk; False
    (nothing changed) when the pool has no free blocks for them."""
    item, num_drafts = draft.item, len(draft.token_ids)
    if kv_cache.allocate(item.seq, item.num_tokens + num_drafts) is None:
        return False
    item.seq.token_ids.extend(draft.token_ids)
    item.num_tokens += num_drafts
    return True


def settle(kv_cache: KVCacheManager, draft: Draft, num_kept: int) -> None:
    """Keep ``num_kept`` of ``draft``'s tokens: the rest leave the sequence and its
    chunk, and the blocks only they needed go back to the pool."""
    item, seq = draft.item, draft.item.seq
    num_rejected = len(draft.token_ids) - num_kept
    if num_rejected:
        del seq.token_ids[-num_rejected:]
        item.num_tokens -= num_rejected
    release_tail(kv_cache, seq, item.start_pos + item.num_tokens)


def release_tail(kv_cache: KVCacheManager, seq: Sequence, num_tokens: int) -> None:
    """Free ``seq``'s trailing blocks past those its first ``num_tokens`` tokens fill
    (fresh blocks of its own: a sequence never writes a shared one)."""
    num_needed = -(-num_tokens // kv_cache.block_size)
    while len(seq.block_table) > num_needed:
        kv_cache.release_last_block(seq)
