"""Tensor operations of the batched sampler: each takes the whole batch's logits
``[num_rows, vocab]`` and per-row parameters as tensors, never a loop over rows."""

from __future__ import annotations

import torch

from worker.engine.step_inputs import pinned

_MASK64 = (1 << 64) - 1
_NEG_INF = float("-inf")


def _signed(value: int) -> int:
    """A 64-bit constant as torch's int64 holds it (two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def token_seed(seed: int, output_index: int) -> int:
    """A well-mixed 63-bit key for one token of a seeded row (splitmix64 of both)."""
    z = (seed * 0x9E3779B97F4A7C15 + output_index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def exponential_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``Exp(1)`` noise ``[rows, vocab]`` that is a pure function of (row key, token id):
    splitmix64 over int64 (which wraps), so a row's noise does not depend on its batch."""
    z = keys[:, None] + (torch.arange(vocab_size, device=keys.device) + 1) * _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    uniform = (_shr(z, 11).double() + 0.5) / float(1 << 53)  # in (0, 1)
    return (-torch.log(uniform)).float()


def output_counts(
    output_ids: list[list[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """How often each token occurs in each row's generated tokens, ``[rows, vocab]``."""
    width = max((len(ids) for ids in output_ids), default=0)
    padded = torch.full((len(output_ids), width + 1), vocab_size, dtype=torch.long)
    for i, ids in enumerate(output_ids):
        padded[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    counts = torch.zeros(len(output_ids), vocab_size + 1, device=device)
    counts.scatter_add_(
        1,
        pinned(padded, device).to(device, non_blocking=True),
        torch.ones(padded.shape, dtype=counts.dtype, device=device),
    )
    return counts[:, :vocab_size]


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """As transformers does it: seen tokens' logits are divided by the penalty when
    positive and multiplied when negative. ``seen`` is ``[rows, vocab]`` bool."""
    p = penalty[:, None]
    penalized = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen, penalized, logits)


def apply_frequency_presence(
    logits: torch.Tensor, counts: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor
) -> torch.Tensor:
    """OpenAI's formula: ``logit - count * frequency_penalty - (count > 0) * presence_penalty``
    over generated tokens only."""
    return logits - counts * frequency[:, None] - (counts > 0).float() * presence[:, None]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose bit is 0 in a packed int32 bitmask ``[rows, ceil(vocab / 32)]``
    (bit ``t % 32`` of word ``t // 32`` allows token ``t``; -1 allows all)."""
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    bits = (bitmask.to(logits.device)[:, :, None] >> shifts) & 1
    allowed = bits.reshape(bitmask.shape[0], -1)[:, : logits.shape[-1]].bool()
    return logits.masked_fill(~allowed, _NEG_INF)


def apply_top_k_top_p_min_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Keep each row's top_k best (0: all), then the smallest prefix whose probability
    reaches top_p, then those at least min_p times the best one's probability."""
    vocab_size = logits.shape[-1]
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    ranks = torch.arange(vocab_size, device=logits.device)
    k = torch.where(top_k > 0, top_k, vocab_size)
    drop = ranks[None, :] >= k[:, None]
    probs = torch.softmax(sorted_logits, dim=-1)
    # The first token always stays: the mass before it is 0.
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    drop |= probs < (min_p[:, None] * probs[:, :1])
    sorted_logits = sorted_logits.masked_fill(drop, _NEG_INF)
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
