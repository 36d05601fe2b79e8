"""Next tokens for a batch of rows, each with its own sampling parameters.

Everything is batched tensor work over ``[rows, vocab]`` with per-row parameter
tensors built once per step: penalties, logit_bias, suppressed tokens, grammar
masks, temperature, top-k / top-p / min-p, then one draw for all rows, and one
device-to-host copy of the chosen ids and their logprobs together.

Greedy rows take the argmax. Random rows draw with the exponential race
(``argmax(p / E)``, ``E ~ Exp(1)``), which picks token ``i`` with probability
``p_i``. The noise is a hash of (row key, token id): a seeded row's key comes from
(seed, index of the token in the completion), so it samples the same tokens
whatever else shares its batch and after a resume; other rows get a fresh random key.
"""

from __future__ import annotations

import random
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from shared.models import SamplingParams
from worker.engine import sampling_ops as ops
from worker.engine.sampling_ops import token_seed
from worker.engine.step_inputs import on_device

if TYPE_CHECKING:
    from worker.engine.request import Sequence

__all__ = [
    "GREEDY",
    "Sampler",
    "SamplingRow",
    "TokenMask",
    "sampling_row",
    "token_seed",
    "unpack",
]

# A row that stands in for one whose own could not be built (its token is void).
GREEDY = SamplingParams(temperature=0.0)


class TokenMask(Protocol):
    """A grammar matcher's view for the sampler: which tokens may come next."""

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> Any: ...


@dataclass(slots=True)  # made per row per step
class SamplingRow:
    params: SamplingParams
    output_index: int
    history: Seq[int]  # prompt then generated tokens
    suppressed_ids: tuple[int, ...] = ()
    num_prompt_tokens: int = 0
    grammar: TokenMask | None = None

    @property
    def output_ids(self) -> Seq[int]:
        return self.history[self.num_prompt_tokens :]


def sampling_row(seq: Sequence, eos_token_ids: Seq[int]) -> SamplingRow:
    """The row for ``seq``'s next token (EOS and stop ids held back before min_tokens)."""
    request = seq.request
    params = request.sampling
    num_output_tokens = len(seq.token_ids) - seq.num_prompt_tokens
    suppressed: tuple[int, ...] = ()
    if num_output_tokens < params.min_tokens:
        suppressed = (*eos_token_ids, *params.stop_token_ids)
    return SamplingRow(
        params,
        num_output_tokens,
        seq.token_ids,
        suppressed,
        seq.num_prompt_tokens,
        request.grammar,
    )


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._rng = random.Random()

    def __call__(
        self, logits: torch.Tensor, rows: list[SamplingRow], errors: dict[int, str] | None = None
    ) -> tuple[list[int], list[dict[str, Any] | None]]:
        """The rows' next tokens and logprobs. A row whose own part fails (its grammar's
        mask) is sampled unmasked and named in ``errors``: its request ends, the
        others' tokens stand."""
        _, packed = self.sample(logits, rows, errors)
        return unpack(packed.double().cpu(), rows)  # the one device-to-host copy

    def sample(
        self, logits: torch.Tensor, rows: list[SamplingRow], errors: dict[int, str] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The chosen ids ``[rows]`` and what the host reads of them (``unpack``), both
        still on the device; rows that failed are named in ``errors`` as ``__call__``'s."""
        raw = logits.float()
        wants_logprobs = any(r.params.logprobs is not None for r in rows)
        # Processing works in place; logprobs are of the raw logits, so keep a copy then.
        errors = {} if errors is None else errors
        processed = self._process(raw.clone() if wants_logprobs else raw, rows, errors)
        token_ids = self._pick(processed, rows)
        num_top = max((r.params.logprobs or 0 for r in rows), default=0)
        packed = _pack(raw, token_ids, num_top) if wants_logprobs else token_ids[:, None]
        return token_ids, packed

    def _tensor(self, values: Seq[object], dtype: torch.dtype) -> torch.Tensor:
        return on_device(values, dtype, self.device)

    def _process(
        self, logits: torch.Tensor, rows: list[SamplingRow], errors: dict[int, str]
    ) -> torch.Tensor:
        """Penalties, biases and masks: what changes which tokens may come, and how likely."""
        params = [r.params for r in rows]
        if any(p.repetition_penalty != 1.0 for p in params):
            logits = self._repetition(logits, rows)
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            # Only the penalised rows' tokens: the others' last may still be on the device.
            output_ids = [
                list(r.output_ids)
                if r.params.presence_penalty or r.params.frequency_penalty
                else []
                for r in rows
            ]
            counts = ops.output_counts(output_ids, logits.shape[-1], logits.device)
            frequency = self._tensor([p.frequency_penalty for p in params], torch.float32)
            presence = self._tensor([p.presence_penalty for p in params], torch.float32)
            logits = ops.apply_frequency_presence(logits, counts, frequency, presence)
        logits = self._add_sparse(logits, rows)
        if any(r.grammar is not None for r in rows):
            logits = ops.apply_bitmask(logits, self._bitmask(rows, logits.shape[-1], errors))
        return logits

    def _repetition(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        history = [list(r.history) if r.params.repetition_penalty != 1.0 else [] for r in rows]
        seen = ops.output_counts(history, logits.shape[-1], logits.device) > 0
        penalty = self._tensor([r.params.repetition_penalty for r in rows], torch.float32)
        return ops.apply_repetition_penalty(logits, seen, penalty)

    def _add_sparse(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """logit_bias added and suppressed ids set to -inf, as one scatter each."""
        bias = [(i, t, b) for i, r in enumerate(rows) for t, b in r.params.logit_bias.items()]
        if bias:
            index = self._tensor([[i for i, _, _ in bias], [t for _, t, _ in bias]], torch.long)
            values = self._tensor([b for _, _, b in bias], torch.float32)
            logits.index_put_((index[0], index[1]), values, accumulate=True)
        banned = [(i, t) for i, r in enumerate(rows) for t in r.suppressed_ids]
        if banned:
            index = self._tensor([[i for i, _ in banned], [t for _, t in banned]], torch.long)
            logits[index[0], index[1]] = float("-inf")
        return logits

    def _bitmask(
        self, rows: list[SamplingRow], vocab_size: int, errors: dict[int, str]
    ) -> torch.Tensor:
        bitmask = torch.full((len(rows), (vocab_size + 31) // 32), -1, dtype=torch.int32)
        for i, row in enumerate(rows):
            if row.grammar is not None and i not in errors:
                try:
                    row.grammar.fill_next_token_bitmask(bitmask, i)
                except Exception as e:
                    errors[i] = f"internal error: its grammar could not give the next tokens: {e!r}"
                    bitmask[i] = -1
        return bitmask

    def _pick(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        greedy_ids = torch.argmax(logits, dim=-1)
        if all(r.params.greedy for r in rows):
            return greedy_ids
        params = [r.params for r in rows]
        temperature = self._tensor([p.temperature or 1.0 for p in params], torch.float32)
        scaled = logits / temperature[:, None]
        if any(p.top_k or p.top_p < 1.0 or p.min_p for p in params):
            top_k = self._tensor([p.top_k for p in params], torch.long)
            top_p = self._tensor([p.top_p for p in params], torch.float32)
            min_p = self._tensor([p.min_p for p in params], torch.float32)
            scaled = ops.apply_top_k_top_p_min_p(scaled, top_k, top_p, min_p)
        keys = self._tensor([self._noise_key(r) for r in rows], torch.long)
        noise = ops.exponential_noise(keys, scaled.shape[-1])
        sampled = torch.argmax(torch.softmax(scaled, dim=-1) / noise, dim=-1)
        greedy = self._tensor([p.greedy for p in params], torch.bool)
        return torch.where(greedy, greedy_ids, sampled)

    def _noise_key(self, row: SamplingRow) -> int:
        if row.params.seed is None:
            return self._rng.getrandbits(63)
        return token_seed(row.params.seed, row.output_index)


def unpack(
    packed: torch.Tensor, rows: list[SamplingRow]
) -> tuple[list[int], list[dict[str, Any] | None]]:
    """Each row's id and logprobs entry from ``Sampler.sample``'s packed tensor, on the host."""
    ids: list[int] = packed[:, 0].long().tolist()
    if packed.shape[1] == 1:  # no row asked for logprobs
        return ids, [None] * len(ids)
    host: list[list[float]] = packed.tolist()
    return ids, [_logprobs_entry(r, h) for r, h in zip(rows, host, strict=True)]


def _pack(raw: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> torch.Tensor:
    """``[rows, 2 + 2 * num_top]``: id, its logprob, then the top ids and logprobs. The
    logprobs are the model's own (before penalties and temperature)."""
    logprobs = torch.log_softmax(raw, dim=-1)
    chosen = logprobs.gather(1, token_ids[:, None])
    columns = [token_ids[:, None].double(), chosen.double()]
    if num_top:
        values, indices = torch.topk(logprobs, num_top, dim=-1)
        columns += [indices.double(), values.double()]
    return torch.cat(columns, dim=1)


def _logprobs_entry(row: SamplingRow, host: list[float]) -> dict[str, Any] | None:
    if row.params.logprobs is None:
        return None
    num_top = row.params.logprobs
    width = (len(host) - 2) // 2
    ids, values = host[2 : 2 + num_top], host[2 + width : 2 + width + num_top]
    top = [{"token_id": int(t), "logprob": v} for t, v in zip(ids, values, strict=True)]
    return {"token_id": int(host[0]), "logprob": host[1], "top": top}
