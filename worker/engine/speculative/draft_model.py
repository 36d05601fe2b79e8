"""Draft-model proposals: a small model sharing the target's tokenizer proposes the
next tokens greedily, ``k`` forwards of its own per step.

The draft model runs through its own :class:`ModelRunner` over a KV pool of its own,
with a shadow sequence per target sequence. Each step a shadow first takes in what
its sequence gained since (the tokens kept last step, and the one sampled), computing
them as a chunk that also yields its first proposal, then decodes one token a forward.
A shadow's tokens past what its sequence kept are taken back at the next step (its
computed count ends at the tokens the two share), and a shadow whose sequence left
the batch is freed. A greedy proposal is a point mass on one token, so verification
is the n-gram's (``worker.engine.speculative.rejection``).
"""

from __future__ import annotations

from dataclasses import replace

from shared.models import SamplingParams
from worker.engine.kv_cache import KVCacheManager
from worker.engine.model_runner import ModelRunner
from worker.engine.outputs import ScheduledSeq, SchedulerOutput
from worker.engine.request import SeqStatus, Sequence
from worker.engine.speculative.drafts import release_tail

# A shadow samples greedily and never stops on its own: its sequence decides.
_SHADOW_SAMPLING = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


class DraftModelProposer:
    def __init__(self, runner: ModelRunner, num_blocks: int, block_size: int) -> None:
        self.runner = runner
        self.kv_cache = KVCacheManager(num_blocks, block_size, enable_prefix_caching=False)
        self.shadows: dict[str, tuple[Sequence, Sequence]] = {}  # request id: (seq, shadow)
        self._seq_numbers = 0

    def propose_many(self, wanted: dict[int, tuple[Sequence, int]]) -> dict[int, list[int]]:
        """Up to ``limit`` tokens for each ``(seq, limit)`` of ``wanted``, by its key."""
        max_len = self.runner.max_model_len
        rows = {
            at: self._synced(seq)
            for at, (seq, limit) in wanted.items()
            if limit > 0 and seq.num_tokens + limit < max_len
        }
        proposals: dict[int, list[int]] = {at: [] for at in rows}
        for round_ in range(max((wanted[at][1] for at in rows), default=0)):
            active = {
                at: shadow
                for at, shadow in rows.items()
                if len(proposals[at]) == round_ < wanted[at][1]
            }
            for at, token_id in self._step(active).items():
                proposals[at].append(token_id)
        return proposals

    def _step(self, shadows: dict[int, Sequence]) -> dict[int, int]:
        """One forward of the draft model over ``shadows``' uncomputed tokens; each
        gains its next token (those the pool has no room for sit it out)."""
        scheduled, keys = [], []
        for at, shadow in shadows.items():
            num_new = shadow.num_uncomputed_tokens
            if self.kv_cache.allocate(shadow, num_new) is None:
                continue
            scheduled.append(ScheduledSeq(shadow, shadow.num_computed_tokens, num_new, True))
            keys.append(at)
        if not scheduled:
            return {}
        out = self.runner.execute(SchedulerOutput(scheduled))
        for item, token_id in zip(scheduled, out.token_ids, strict=True):
            item.seq.num_computed_tokens = item.start_pos + item.num_tokens
            item.seq.token_ids.append(token_id)
        return dict(zip(keys, out.token_ids, strict=True))

    def _synced(self, seq: Sequence) -> Sequence:
        """``seq``'s shadow holding its tokens, computed as far as the two agree."""
        entry = self.shadows.get(seq.request_id)
        shadow = self._new_shadow(seq) if entry is None or entry[0] is not seq else entry[1]
        num_common = _common_prefix(shadow.token_ids, seq.token_ids)
        shadow.token_ids = list(seq.token_ids)
        if shadow.num_computed_tokens > num_common:
            shadow.num_computed_tokens = num_common
            release_tail(self.kv_cache, shadow, num_common)
        # The last token is computed this step, so that its logits give a proposal.
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, len(seq.token_ids) - 1)
        return shadow

    def _new_shadow(self, seq: Sequence) -> Sequence:
        self.forget(seq.request_id)
        request = replace(seq.request, sampling=_SHADOW_SAMPLING, grammar=None, lora=None)
        self._seq_numbers += 1
        shadow = Sequence(request, self._seq_numbers, list(seq.token_ids), seq.num_prompt_tokens)
        shadow.status = SeqStatus.RUNNING
        self.shadows[seq.request_id] = (seq, shadow)
        return shadow

    def forget(self, request_id: str) -> None:
        entry = self.shadows.pop(request_id, None)
        if entry is not None:
            self.kv_cache.free(entry[1])

    def release_gone(self) -> None:
        """Free the shadows of sequences that left the batch (finished, or preempted:
        a preempted one is computed again from its start, its shadow too)."""
        for request_id, (seq, _) in list(self.shadows.items()):
            if seq.status is not SeqStatus.RUNNING:
                self.forget(request_id)


def _common_prefix(a: list[int], b: list[int]) -> int:
    num = min(len(a), len(b))
    for i in range(num):
        if a[i] != b[i]:
            return i
    return num
