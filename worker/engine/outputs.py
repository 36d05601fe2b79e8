"""The plain dataclasses the engine's parts exchange."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.models import FinishReason
from shared.refusal import Refusal
from worker.engine.request import Sequence


@dataclass(slots=True)  # made per row per step
class ScheduledSeq:
    """``num_tokens`` tokens of ``seq`` to compute this step, from ``start_pos`` on.

    ``sample`` is set when the chunk reaches the sequence's end, so that the step
    yields its next token; an embed request's chunks never sample, they ``pool``.
    """

    seq: Sequence
    start_pos: int
    num_tokens: int
    sample: bool

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start_pos : self.start_pos + self.num_tokens]

    @property
    def block_table(self) -> list[int]:
        return self.seq.block_table

    @property
    def state_slot(self) -> int | None:
        return self.seq.state_slot

    @property
    def pool(self) -> bool:
        return self.seq.request.embed

    @property
    def num_prompt_scores(self) -> int:
        """Prompt tokens this chunk's logits score (``sampling.prompt_logprobs``): the
        logits at position ``p`` score token ``p + 1``; the last prompt token's are the
        sample's (``worker.engine.prompt_logprobs``)."""
        seq = self.seq
        if seq.request.sampling.prompt_logprobs is None:
            return 0
        return max(
            0, min(self.start_pos + self.num_tokens, seq.num_prompt_tokens - 1) - self.start_pos
        )

    @property
    def completes_prompt(self) -> bool:
        return self.start_pos + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def sampled(self) -> list[ScheduledSeq]:
        return [s for s in self.scheduled if s.sample]

    @property
    def pooled(self) -> list[ScheduledSeq]:
        return [s for s in self.scheduled if not s.sample and s.pool]  # a pooled one never samples


@dataclass
class RunnerOutput:
    """One new token per sampled sequence, in the order of ``SchedulerOutput.sampled``."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any] | None] = field(default_factory=list)
    # Per item of ``SchedulerOutput.pooled``: its chunk's share of the pooled vector.
    pooled: list[list[float]] = field(default_factory=list)
    # Per index into ``token_ids``: why that row's request failed (its token is void).
    errors: dict[int, str] = field(default_factory=dict)
    # Per scheduled item with ``num_prompt_scores``, in order: its prompt tokens' entries.
    prompt_logprobs: list[list[dict[str, Any]]] = field(default_factory=list)
    # Speculative decoding: per index into ``token_ids``, the logprob entries (None where
    # not asked for) of the draft tokens its row kept, which come before its token.
    accepted: dict[int, list[dict[str, Any] | None]] = field(default_factory=dict)


@dataclass(slots=True)  # made per row per step
class RequestOutput:
    """What one step produced for one request (see the engine's docs)."""

    request_id: str
    index: int
    new_token_ids: list[int]
    text: str
    finish_reason: FinishReason | None
    logprobs: list[dict[str, Any]] | None
    num_prompt_tokens: int
    num_output_tokens: int
    # What was wrong, for a request that ends with FinishReason.ERROR.
    error: str | None = None
    embedding: list[float] | None = None
    # With sampling.prompt_logprobs, on its last output: per prompt token, its entry
    # (the first token's logprob None).
    prompt_logprobs: list[dict[str, Any]] | None = None
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    # A request's last output: its prefix-cache lookups' tokens, queried and found cached.
    num_prefix_queried_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    refusal: Refusal | None = None  # set when ``error`` is the request's own mistake

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def ended(
        cls, request_id: str, reason: FinishReason, num_prompt_tokens: int, num_output_tokens: int
    ) -> RequestOutput:
        """A request's last output when it ends with no new token (cancelled, past its
        deadline, stopped by the engine): either engine's."""
        return cls(
            request_id,
            num_output_tokens,
            [],
            "",
            reason,
            None,
            num_prompt_tokens,
            num_output_tokens,
        )

    def with_prefix_figures(self, seq: Sequence) -> RequestOutput:
        """This output with ``seq``'s prefix-cache figures (it ends ``seq``)."""
        self.num_prefix_queried_tokens = seq.num_prefix_queried_tokens
        self.num_prefix_hit_tokens = seq.num_prefix_hit_tokens
        return self
