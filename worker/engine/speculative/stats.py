"""Speculative decoding's running totals, for the engine's ``stats()`` and the worker's
metrics (named after vLLM's ``spec_decode_*`` counters)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecStats:
    num_drafts: int = 0  # rows verified with at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def add(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted

    @property
    def acceptance_rate(self) -> float:
        """The share of proposed tokens kept, 0..1."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a verified row yields per step: its kept drafts and the one it samples
        (vLLM's mean acceptance length)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def figures(self) -> dict[str, float]:
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_acceptance_rate": self.acceptance_rate,
            "spec_decode_tokens_per_step": self.tokens_per_step,
        }
