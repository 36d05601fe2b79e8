"""Next tokens for a batch of rows, each with its own sampling parameters.

Greedy rows take the argmax. Random rows draw with the exponential race
(``argmax(p / E)``, ``E ~ Exp(1)``), which picks token ``i`` with probability
``p_i``. A seeded row draws its noise from a generator seeded by (seed, index of
the token in the completion), so it samples the same tokens whatever else shares
its batch and after a resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shared.models import SamplingParams

_MASK64 = (1 << 64) - 1


@dataclass
class SamplingRow:
    params: SamplingParams
    output_index: int
    history: list[int]
    suppressed_ids: tuple[int, ...] = ()


def token_seed(seed: int, output_index: int) -> int:
    """A well-mixed 63-bit seed for one token (splitmix64 of seed and index)."""
    z = (seed * 0x9E3779B97F4A7C15 + output_index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.seed()

    def __call__(
        self, logits: torch.Tensor, rows: list[SamplingRow]
    ) -> tuple[list[int], list[dict[str, Any] | None]]:
        logits = logits.float()
        raw = logits
        logits = self._process(logits, rows)
        token_ids = torch.argmax(logits, dim=-1)
        random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
        if random_rows:
            index = torch.tensor(random_rows, device=logits.device)
            picked = self._sample(logits[index], [rows[i] for i in random_rows])
            token_ids[index] = picked
        ids: list[int] = token_ids.tolist()
        return ids, self._logprobs(raw, rows, ids)

    def _process(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        penalized = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
        suppressed = [i for i, r in enumerate(rows) if r.suppressed_ids]
        if not penalized and not suppressed:
            return logits
        logits = logits.clone()
        for i in penalized:
            _apply_repetition_penalty(logits[i], rows[i])
        for i in suppressed:
            logits[i, list(rows[i].suppressed_ids)] = float("-inf")
        return logits

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        temperatures = torch.tensor([r.params.temperature for r in rows], device=logits.device)
        logits = logits / temperatures[:, None]
        logits = _top_k_top_p(logits, rows)
        probs = torch.softmax(logits, dim=-1)
        noise = torch.stack([self._noise(r, probs.shape[-1]) for r in rows])
        return torch.argmax(probs / noise, dim=-1)

    def _noise(self, row: SamplingRow, vocab_size: int) -> torch.Tensor:
        generator = self.generator
        if row.params.seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(token_seed(row.params.seed, row.output_index))
        noise = torch.empty(vocab_size, device=self.device)
        return noise.exponential_(generator=generator).clamp_(min=1e-10)

    def _logprobs(
        self, raw: torch.Tensor, rows: list[SamplingRow], ids: list[int]
    ) -> list[dict[str, Any] | None]:
        """The model's own log-probabilities (before penalties and temperature)."""
        wanted = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        result: list[dict[str, Any] | None] = [None] * len(rows)
        if not wanted:
            return result
        logprobs = torch.log_softmax(raw[wanted], dim=-1)
        for j, i in enumerate(wanted):
            result[i] = _top_logprobs(logprobs[j], ids[i], rows[i].params.logprobs or 0)
        return result


def _apply_repetition_penalty(logits: torch.Tensor, row: SamplingRow) -> None:
    """As transformers does it: seen tokens' logits are divided by the penalty when
    positive and multiplied when negative."""
    seen = torch.tensor(sorted(set(row.history)), dtype=torch.long, device=logits.device)
    scores = logits[seen]
    penalty = row.params.repetition_penalty
    logits[seen] = torch.where(scores < 0, scores * penalty, scores / penalty)


def _top_k_top_p(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    if all(r.params.top_k == 0 and r.params.top_p >= 1.0 for r in rows):
        return logits
    vocab_size = logits.shape[-1]
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    top_k = torch.tensor([r.params.top_k or vocab_size for r in rows], device=logits.device)
    top_p = torch.tensor([r.params.top_p for r in rows], device=logits.device)
    ranks = torch.arange(vocab_size, device=logits.device)
    drop = ranks[None, :] >= top_k[:, None]
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    drop |= (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _top_logprobs(logprobs: torch.Tensor, token_id: int, num_top: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"token_id": token_id, "logprob": float(logprobs[token_id])}
    top: list[dict[str, Any]] = []
    if num_top:
        values, indices = torch.topk(logprobs, num_top)
        top = [
            {"token_id": int(t), "logprob": float(v)}
            for t, v in zip(indices.tolist(), values.tolist(), strict=True)
        ]
    entry["top"] = top
    return entry
