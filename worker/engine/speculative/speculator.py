"""Speculative decoding in the built-in engine: propose, verify in one forward, keep.

Each synchronous step, after the scheduler has decided, the rows that sample (decodes,
and prompts' last chunks) get up to ``num_speculative_tokens`` proposed tokens
(``worker.engine.speculative.ngram``), in KV blocks the pool has free. The step's forward
then computes every row's chunk over the paged cache as a chunked prefill does, and
the sampler draws a token at each of a drafted row's last ``k + 1`` positions, with the
row's own parameters, penalties and grammar mask at that position
(``worker.engine.speculative.rejection`` says why that keeps the target distribution).
The longest agreeing prefix of drafts is kept; the rest leave the sequence and the
blocks only they needed go back (``worker.engine.speculative.drafts``).

Rows not drafted: a request that opts out (``sampling.speculative``), one scoring its
prompt, an embed request, and every row of a step of more than
``disable_by_batch_size`` sampling rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from dataclasses import replace
from typing import Protocol

from worker.engine.config import EngineConfig
from worker.engine.errors import UnsupportedModel
from worker.engine.kv_cache import KVCacheManager
from worker.engine.model_runner import ModelRunner
from worker.engine.outputs import RunnerOutput, ScheduledSeq, SchedulerOutput
from worker.engine.request import Sequence
from worker.engine.sampler import GREEDY, SamplingRow, sampling_row
from worker.engine.speculative.config import SpeculativeConfig
from worker.engine.speculative.draft_model import DraftModelProposer
from worker.engine.speculative.drafts import Draft, attach, max_draft_len, settle
from worker.engine.speculative.grammar_check import check_drafts
from worker.engine.speculative.ngram import NgramProposer
from worker.engine.speculative.rejection import num_accepted
from worker.engine.speculative.stats import SpecStats
from worker.engine.step_inputs import StepInputs
from worker.model_store import resolve_model

log = logging.getLogger(__name__)


class Proposer(Protocol):
    """Where drafts come from: n-gram lookup, or a draft model."""

    def propose_many(self, wanted: dict[int, tuple[Sequence, int]]) -> dict[int, list[int]]:
        """Up to ``limit`` tokens for each ``(seq, limit)`` of ``wanted``, by its key."""
        ...

    def release_gone(self) -> None:
        """Let go of what is held for sequences no longer running."""
        ...


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        runner: ModelRunner,
        kv_cache: KVCacheManager,
        max_model_len: int,
        max_num_batched_tokens: int,
        proposer: Proposer | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.proposer: Proposer = proposer or NgramProposer(
            config.prompt_lookup_min, config.prompt_lookup_max
        )
        self.stats = SpecStats()

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        """The step's tokens, as ``ModelRunner.execute`` gives them; a drafted row's
        kept drafts are in its sequence's tokens (settled) and their logprob entries in
        ``RunnerOutput.accepted``."""
        drafts = self._draft(out)
        if not drafts:
            return self.runner.execute(out)
        try:
            return self._verify(out, drafts)
        except BaseException:
            for draft in drafts.values():
                settle(self.kv_cache, draft, 0)
            raise

    def _draft(self, out: SchedulerOutput) -> dict[int, Draft]:
        """Drafts attached to the step's sampling rows, by index among them."""
        self.proposer.release_gone()
        sampled = out.sampled
        if not sampled or len(sampled) > self.config.disable_by_batch_size:
            return {}
        limits = self._limits(out)
        proposals = self.proposer.propose_many(
            {at: (sampled[at].seq, limit) for at, limit in limits.items()}
        )
        drafts: dict[int, Draft] = {}
        for at, token_ids in proposals.items():
            draft = Draft(sampled[at], token_ids[: limits[at]])
            grammar = draft.item.seq.request.grammar
            if draft.token_ids and grammar is not None:
                check_drafts(draft, grammar, self.runner.vocab_size)
            if draft.token_ids and attach(self.kv_cache, draft):
                drafts[at] = draft
        return drafts

    def _limits(self, out: SchedulerOutput) -> dict[int, int]:
        """The most drafts each sampling row may carry, within the step's token budget
        (rows first come first)."""
        budget = self.max_num_batched_tokens - out.num_batched_tokens
        if self.runner.graphs is not None:  # a captured graph samples at most a row each
            budget = min(budget, self.runner.max_num_rows - len(out.sampled))
        limits = {}
        num_speculative = self.config.num_speculative_tokens
        for at, item in enumerate(out.sampled):
            limit = min(budget, max_draft_len(item, num_speculative, self.max_model_len))
            if limit > 0 and _may_draft(item):
                limits[at] = limit
                budget -= limit
        return limits

    def _verify(self, out: SchedulerOutput, drafts: dict[int, Draft]) -> RunnerOutput:
        sampled = out.sampled
        inputs = self.runner.prepare(out.scheduled)
        inputs.sample_index = _widened(inputs, drafts)
        rows, errors, first_rows = self._rows(sampled, drafts)
        step = self.runner.run_step(inputs, rows, errors=errors).runner_output(rows)
        result = RunnerOutput(pooled=step.pooled, prompt_logprobs=step.prompt_logprobs)
        for at, first in enumerate(first_rows):
            draft = drafts.get(at)
            num_positions = 1 if draft is None else draft.num_positions
            error = next(
                (step.errors[r] for r in range(first, first + num_positions) if r in step.errors),
                None,
            )
            num_kept = 0
            if draft is not None:
                targets = step.token_ids[first : first + num_positions]
                num_kept = 0 if error is not None else num_accepted(targets, draft.token_ids)
                settle(self.kv_cache, draft, num_kept)
                self.stats.add(len(draft.token_ids), num_kept)
                result.accepted[at] = step.logprobs[first : first + num_kept]
            if error is not None:
                result.errors[at] = error
            result.token_ids.append(step.token_ids[first + num_kept])
            result.logprobs.append(step.logprobs[first + num_kept])
        return result

    def _rows(
        self, sampled: list[ScheduledSeq], drafts: dict[int, Draft]
    ) -> tuple[list[SamplingRow], dict[int, str], list[int]]:
        """The sampler's rows (one per verified position), the rows that failed to
        build, and each sampled item's first row."""
        rows: list[SamplingRow] = []
        errors: dict[int, str] = {}
        first_rows: list[int] = []
        eos = self.runner.eos_token_ids
        for at, item in enumerate(sampled):
            first_rows.append(len(rows))
            draft = drafts.get(at)
            try:
                if draft is None:
                    rows.append(sampling_row(item.seq, eos))
                else:
                    rows.extend(_draft_rows(draft, eos))
            except Exception as e:
                message = f"internal error: its sampling parameters could not be applied: {e!r}"
                num_positions = 1 if draft is None else draft.num_positions
                for _ in range(num_positions):
                    errors[len(rows)] = message
                    rows.append(SamplingRow(GREEDY, 0, item.seq.token_ids))
        return rows, errors, first_rows


def _may_draft(item: ScheduledSeq) -> bool:
    seq = item.seq
    return (
        item.sample
        and not item.pool
        and not item.num_prompt_scores
        and seq.request.sampling.speculative
        and not seq.num_pending_tokens
        and seq.num_computed_tokens == item.start_pos
    )


def _draft_rows(draft: Draft, eos_token_ids: Seq[int]) -> list[SamplingRow]:
    """One row per verified position ``j``: as the row the engine would build once the
    first ``j`` drafts were its tokens."""
    seq = draft.item.seq
    params = seq.request.sampling
    num_before = len(seq.token_ids) - len(draft.token_ids)
    rows = []
    for j in range(draft.num_positions):
        output_index = num_before + j - seq.num_prompt_tokens
        suppressed: tuple[int, ...] = ()
        if output_index < params.min_tokens:
            suppressed = (*eos_token_ids, *params.stop_token_ids)
        grammar = draft.masks[j] if draft.masks else None
        history = seq.token_ids[: num_before + j]
        rows.append(
            SamplingRow(params, output_index, history, suppressed, seq.num_prompt_tokens, grammar)
        )
    return rows


def _widened(inputs: StepInputs, drafts: dict[int, Draft]) -> list[int]:
    """The step's sampled positions: a drafted row samples at its last ``k + 1``."""
    index: list[int] = []
    for at, last in enumerate(inputs.sample_index):
        draft = drafts.get(at)
        num_drafts = 0 if draft is None else len(draft.token_ids)
        index.extend(range(last - num_drafts, last + 1))
    return index


def speculator_for(
    config: EngineConfig, runner: ModelRunner, kv_cache: KVCacheManager, max_model_len: int
) -> Speculator | None:
    """The engine's speculator, or None where speculation is off or cannot be exact:
    a hybrid's recurrent state cannot take back rejected tokens, a rotary that changes
    with the sequence's length changes earlier tokens' keys, and the timed forward has
    no distribution to verify against."""
    spec = config.speculative_config
    if spec is None:
        return None
    reason = None
    if runner.state_bytes_per_seq:
        reason = "this hybrid model's recurrent state cannot take back rejected tokens"
    elif runner.rope_lens is not None:
        reason = "this model's rotary changes with the sequence's length"
    elif runner.timed_device is not None:
        reason = "the timed forward samples no distribution"
    if reason is not None:
        log.warning("speculative decoding off: %s", reason)
        return None
    proposer = None if spec.model is None else draft_model_proposer(config, runner, kv_cache)
    return Speculator(spec, runner, kv_cache, max_model_len, config.num_batched_tokens, proposer)


def draft_model_proposer(
    config: EngineConfig, runner: ModelRunner, kv_cache: KVCacheManager
) -> DraftModelProposer:
    """The draft model loaded beside the target, with a KV pool of as many blocks; a
    model with another vocabulary is refused (its ids would mean other tokens)."""
    spec = config.speculative_config
    assert spec is not None and spec.model is not None
    draft_config = replace(
        config,
        model=spec.model,
        speculative_config=None,
        max_loras=0,
        quantization=spec.quantization,
    )
    try:
        draft = ModelRunner(draft_config, resolve_model(spec.model), draft=True)
    except UnsupportedModel as e:
        if spec.quantization is None:
            raise
        raise UnsupportedModel(
            f"speculative_config: the draft model cannot load with quantization "
            f"{spec.quantization!r}: {e}"
        ) from e
    same_tokens = draft.tokenizer.get_vocab() == runner.tokenizer.get_vocab()
    if not same_tokens or draft.vocab_size != runner.vocab_size:
        raise ValueError(
            f"speculative_config: draft model {spec.model} does not share the target "
            f"model's tokenizer and vocabulary ({draft.vocab_size} ids against "
            f"{runner.vocab_size}); name a draft model of the same family"
        )
    draft.allocate_kv_cache(kv_cache.num_blocks)
    return DraftModelProposer(draft, kv_cache.num_blocks, kv_cache.block_size)
